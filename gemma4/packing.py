"""Gemma 4's projections, `Linear` and `linear`, and the packed copies that let a CPU stream their weights.

Facts a reader must know:
- A decode step multiplies every weight by 1 row, a verify of K drafts by K + 1. On a CPU both are bound
  by reading the weight from memory, but `F.linear` (MKL, or oneDNN fed a dense weight) re-lays the
  weight out on every call and takes a slower kernel for 2-9 rows: on the 2-core development machine a
  (12288, 1536) float32 weight streams at ~14.5 GB/s for 1 row and ~6.5 GB/s for 5.
- oneDNN can lay a weight out once, in its own blocked layout (`_reorder_linear_weight`), and multiply
  by it with `_linear_pointwise`: the pair torch.compile's CPU backend emits for a linear layer. The
  same weight then streams at ~22 GB/s for 1 row and ~14 GB/s for 5 (scripts/benchmark.py prints both).
  Same sums in another order: ~1e-6 relative in float32.
- A packed copy is an opaque oneDNN tensor: no views, no autograd, no state_dict. So it lives beside
  the parameter as a plain attribute (`Linear.packed`, and the models' tied heads), and the parameter
  stays what training, `state_dict` and other devices use. `linear` reads the copy only in inference
  (no autograd), for a CPU input of the copy's dtype, and only while the parameter is the one it was
  made from and unchanged since (same object, same version counter: an optimizer step or a `copy_`
  retires it). Everything else takes `F.linear`, the plain fallback.
- Which weights get a copy is decided in one place, `packable`. Copies are made once, after loading
  (gemma4/weights.py `pack_weights`), never behind a caller's back.

Shape legend: N rows (tokens), I in features, O out features.
"""

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# Below a million elements (4 MiB in float32) a weight sits in the caches: a packed product saves nothing
# there and costs oneDNN's larger per-call overhead, which dominates a small model's decode step.
MIN_ELEMENTS = 1 << 20
ROWS_HINT = 8  # the row count oneDNN picks its layout for: verifies multiply 2-9 rows, a decode step 1
ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def packable(weight: torch.Tensor, min_elements: int = MIN_ELEMENTS) -> bool:
    """The one decision: does this weight get a packed copy? CPU, a build with oneDNN, float32 (or bfloat16
    on a CPU with oneDNN's bfloat16 kernels: AVX-512 or AVX-NE-CONVERT; AVX2 has none), large enough."""
    if not (ONEDNN and weight.device.type == "cpu" and weight.dim() == 2 and weight.numel() >= min_elements):
        return False
    if weight.dtype == torch.bfloat16:
        return torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return weight.dtype == torch.float32


class Packed:
    """oneDNN's copy of `source` (O, I), valid while `source` is unchanged."""

    def __init__(self, blocked: torch.Tensor, source: torch.Tensor) -> None:
        self.blocked = blocked  # opaque (layout torch._mkldnn), the same numbers as source
        self.source = source
        self.version = source._version  # bumped by every in-place change to source

    def serves(self, x: torch.Tensor, weight: torch.Tensor) -> bool:
        return (weight is self.source and weight._version == self.version and not torch.is_grad_enabled()
                and x.dtype == self.blocked.dtype and x.device.type == "cpu")

    def __deepcopy__(self, memo: dict[int, Any]) -> "Packed":
        # The opaque tensor cannot be copied (it has no storage) and need not be: it is never written.
        # The copy serves the copied parameter, which deepcopy makes once and finds in `memo`.
        return Packed(self.blocked, copy.deepcopy(self.source, memo))


def pack(weight: torch.Tensor, values: torch.Tensor | None = None) -> Packed:
    """A packed copy serving `weight`, laid out from `values` (the same numbers, read elsewhere: see
    gemma4/weights.py `pack_weights` for why), or from `weight` itself."""
    src = weight if values is None else values
    return Packed(torch.ops.mkldnn._reorder_linear_weight(src.detach(), ROWS_HINT), weight)


def linear(x: torch.Tensor, weight: torch.Tensor, packed: Packed | None = None) -> torch.Tensor:
    """x (..., I) @ weight (O, I).T -> (..., O), through the packed copy when it serves (see above)."""
    if packed is not None and packed.serves(x, weight):
        return torch.ops.mkldnn._linear_pointwise(x, packed.blocked, None, "none", [], "")  # (..., O)
    # A weight kept in its file's dtype beside a packed copy (weights.py) is cast per call, as PLE rows are.
    return F.linear(x, weight if weight.dtype == x.dtype else weight.to(x.dtype))


class Linear(nn.Linear):
    """All of Gemma 4's projections: no bias (`attention_bias` is false in every release).

    Called ~400 times per decoded token, so directly: nn.Module.__call__ (hook dispatch) costs ≈ 2 µs a
    call. Hooks on it would not run; on layers and larger modules they do.
    """

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__(in_features, out_features, bias=False)
        self.packed: Packed | None = None  # set by weights.pack_weights; not a parameter, not in state_dict

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.packed)

    __call__ = forward  # no hook dispatch, see above
