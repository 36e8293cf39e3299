"""The reduction of a tensor-parallel run, and the modules that make each partial sum whole.

Why not `all_reduce`: it sums the ranks' partial outputs in an order of its own choosing, and the choice may
depend on the message size. NCCL picks its channels, and so how it splits and adds a tensor, by size; gloo
behaves the same. At 3 or more ranks, row 0 of a 1-row and of a 9-row reduction can then differ in the last
bits. A decode step reduces 1 row and a verify K + 1 rows, so speculative decoding would part from plain
decoding at a near tie for no reason of its own (tests/parallel shows it).

`exact_sum` gathers every rank's partial (a copy: no arithmetic) and adds them in rank order, p0 + p1 + ...,
one element at a time. Each element's sum is then the same few additions whatever the row count, so every row
has the same bits in a decode step, a verify or a prefill. At decode sizes the gather costs about what the
all-reduce does.

`parallelize` makes, in a rank's model, each module whose output is a partial sum one that reduces it (its
class gains `Reduced`; its parameters and their names stay): every attention's `o_proj`, every MLP's
`down_proj`, every MoE's experts (gemma4/parallel/plan.py says why those). Applied after loading and after the
speed layer, as the speed layer is; the textbook's modules are unchanged, and a one-process model has none.
"""

import torch
import torch.distributed as dist
from torch import Tensor, nn


def exact_sum(partial: Tensor) -> Tensor:
    """Every rank's `partial` (the same shape on each) -> their sum in rank order, the same on every rank."""
    parts = [torch.empty_like(partial) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, partial.contiguous())
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total


class Reduced:
    """Mixed into the class of a module whose output is this rank's partial sum (`parallelize`): the output made
    whole, `exact_sum(forward(...))`. The module keeps its parameters under their names, so a rank's state dict
    is its part of the checkpoint's. Called directly, without hooks, as the speed layer's modules are."""

    def forward(self, *args: Tensor) -> Tensor:
        return exact_sum(super().forward(*args))  # type: ignore[misc]

    def __call__(self, *args: Tensor) -> Tensor:
        return self.forward(*args)


_REDUCED: dict[type, type] = {}


def reduced(cls: type) -> type:
    """`cls` with `Reduced` mixed in (one class per module class)."""
    if cls not in _REDUCED:
        _REDUCED[cls] = type(f"Reduced{cls.__name__}", (Reduced, cls), {})
    return _REDUCED[cls]


def is_split(model: nn.Module) -> bool:
    """Whether `model` is a rank's part (`parallelize` made its partial sums reduced), not a whole copy."""
    return any(isinstance(module, Reduced) for module in model.modules())


def parallelize(model: nn.Module) -> int:
    """Make each partial-sum module of a rank's model (target or drafter) a `Reduced` one; returns how many."""
    swapped = 0
    for module in list(model.modules()):
        for child in ("o_proj", "down_proj", "experts"):
            inner = getattr(module, child, None)  # the experts' own `down_proj` is a parameter: not this
            if isinstance(inner, nn.Module) and not isinstance(inner, Reduced):
                inner.__class__ = reduced(type(inner))
                swapped += 1
    return swapped
