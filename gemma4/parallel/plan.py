"""Which part of each weight a rank of a tensor-parallel run holds, as gpt-fast's `tp.py` splits a model.

- A rank r of N holds the query heads [r·H/N, (r+1)·H/N) and the kv heads they read: with K ≥ N kv heads its
  K/N of them, with fewer (E2B has one) the one its query heads share, so K/V are then replicated. q, k, v, gate
  and up are split by output (rows), o and down by input (columns): each rank's attention and MLP output is a
  partial sum, and one reduction after each (gemma4/parallel/reduce.py) makes it whole.
- The MoE splits each expert's width; the router stays whole. Embeddings, per-layer embeddings and their
  projections, norms and the tied head are replicated: every rank computes the same logits and so draws the
  same tokens, and the loop runs unchanged on every rank.
- A rank's model is the textbook's model of a *local* config (`local_config`: H/N heads, its kv heads, W/N
  width), loaded from its slices of the file (`slices`): its KV cache holds its heads alone.
- `check_world` refuses, before any file is read, a rank count the geometry cannot split: heads or a width it
  does not divide, kv heads neither a multiple nor a divisor of it, an int4 layer whose input slice would cut a
  group of 32.

Shape legend: H query heads, K kv heads, D head dim, E hidden, W MLP width, I expert width, X experts.
"""

from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from gemma4.config import ConfigError, TextConfig

GROUP = 32  # an int4 scale's inputs (gemma4/int4.py): an input slice must not cut one


@dataclass(frozen=True)
class Shard:
    rank: int
    world: int

    def part(self, n: int) -> range:
        """Its 1/N of n things (heads, width): the r-th block."""
        size = n // self.world
        return range(self.rank * size, (self.rank + 1) * size)

    def kv_part(self, heads: int, kv_heads: int) -> range:
        """The kv heads its query heads read: query head h reads kv head h // (H/K)."""
        q = self.part(heads)
        group = heads // kv_heads
        return range(q.start // group, (q.stop - 1) // group + 1)


def check_world(c: TextConfig, world: int, what: str, int4: Collection[str] = ()) -> None:
    """One line if `world` ranks cannot split this model (see the module docstring). `int4`: the weight keys of
    its int4 layers (`layers.3.self_attn.o_proj.weight`); an o or down projection among them is split by input,
    so each rank's slice must hold whole groups of 32. Each layer is checked on its own: a file may leave one
    of the two in floating point."""
    def refuse(why: str) -> None:
        raise ConfigError(f"{world} ranks cannot split the {what}: {why}; run with a rank count that divides it")

    if c.num_heads % world:
        refuse(f"{c.num_heads} query heads")
    for kv in sorted(set(c.kv_heads)):
        if kv % world and world % kv:
            refuse(f"{kv} kv heads (neither a multiple nor a divisor of {world})")
    for width in sorted({c.mlp_width(i) for i in range(c.num_layers)}):
        if width % world:
            refuse(f"an MLP width of {width}")
    if c.enable_moe and c.moe_intermediate_size % world:
        refuse(f"an expert width of {c.moe_intermediate_size}")
    for i in range(c.num_layers):
        inputs = c.num_heads * c.head_dims[i]
        if f"layers.{i}.self_attn.o_proj.weight" in int4 and (inputs // world) % GROUP:
            refuse(f"int4 o_proj inputs of {inputs} in slices that cut groups of {GROUP}")
        if f"layers.{i}.mlp.down_proj.weight" in int4 and (c.mlp_width(i) // world) % GROUP:
            refuse(f"int4 down_proj inputs of {c.mlp_width(i)} in slices that cut groups of {GROUP}")


def local_config(c: TextConfig, shard: Shard) -> TextConfig:
    """The config of one rank's model: its heads, kv heads and widths (the MLP's double width stays double)."""
    kv = tuple(len(shard.kv_part(c.num_heads, k)) for k in c.kv_heads)
    return replace(c, num_heads=c.num_heads // shard.world, kv_heads=kv,
                   intermediate_size=c.intermediate_size // shard.world,
                   moe_intermediate_size=c.moe_intermediate_size // shard.world if c.enable_moe else
                   c.moe_intermediate_size)


# A slice: along `dim`, the ranges kept, concatenated in order (an expert's gate rows, then its up rows).
Slice = tuple[int, tuple[range, ...]]


def slices(c: TextConfig, shard: Shard, layer_prefix: str = "layers.") -> dict[str, Slice]:
    """Weight key (as the name table has it, for the layers under `layer_prefix`) -> the slice this rank reads;
    a key not listed is read whole. int4 triples take their weight's slice (packed words hold 8 inputs a column,
    scales 32): `int4_slice`."""
    out: dict[str, Slice] = {}
    heads = shard.part(c.num_heads)
    for i in range(c.num_layers):
        d, pre = c.head_dims[i], f"{layer_prefix}{i}."
        kv = shard.kv_part(c.num_heads, c.kv_heads[i])
        q_rows = range(heads.start * d, heads.stop * d)
        out[pre + "self_attn.q_proj.weight"] = (0, (q_rows,))
        out[pre + "self_attn.o_proj.weight"] = (1, (q_rows,))
        for name in ("k_proj", "v_proj"):
            out[pre + f"self_attn.{name}.weight"] = (0, (range(kv.start * d, kv.stop * d),))
        width = shard.part(c.mlp_width(i))
        out[pre + "mlp.gate_proj.weight"] = out[pre + "mlp.up_proj.weight"] = (0, (width,))
        out[pre + "mlp.down_proj.weight"] = (1, (width,))
        if c.enable_moe:
            w = shard.part(c.moe_intermediate_size)
            up = range(c.moe_intermediate_size + w.start, c.moe_intermediate_size + w.stop)
            out[pre + "experts.gate_up_proj"] = (1, (w, up))  # (X, 2I, E): gate rows, then up rows
            out[pre + "experts.down_proj"] = (2, (w,))  # (X, E, I)
    return out


def int4_slice(weight: Slice, part: str) -> Slice:
    """A weight's slice as it falls on its int4 `weight_packed` (8 inputs a word) or `weight_scale` (32 inputs a
    scale): rows as they are, input columns divided."""
    dim, ranges = weight
    if dim == 0:
        return weight
    per = 8 if part == "weight_packed" else GROUP
    return dim, tuple(range(r.start // per, r.stop // per) for r in ranges)


def part(whole: Any, cut: Slice) -> Tensor:
    """The ranges of `cut` of a tensor in a file (safetensors' `get_slice`, indexed lazily): those bytes alone
    are read, concatenated along the cut's dimension into one tensor."""
    dim, ranges = cut
    pieces = [whole[(slice(None),) * dim + (slice(r.start, r.stop),)] for r in ranges]
    return torch.cat(pieces, dim) if len(pieces) > 1 else pieces[0]


def table_cuts(weights: dict[str, Slice], table: dict[str, tuple[int, ...]]) -> dict[str, Slice]:
    """The slices of `slices` for the keys of a name table, int4 triples included (an int4 `weight_shape` is
    read whole: it states the whole weight's shape)."""
    cuts = {}
    for key in table:
        base, _, part = key.rpartition(".")
        if key in weights:
            cuts[key] = weights[key]
        elif part in ("weight_packed", "weight_scale") and base + ".weight" in weights:
            cuts[key] = int4_slice(weights[base + ".weight"], part)
    return cuts
