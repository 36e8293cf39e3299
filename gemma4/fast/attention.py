"""Attention query by query: each query of a step attends with the bits a decode step at its position has.

`scaled_dot_product_attention` splits its work by the number of queries and keys it is given: on one CPU, row
i of a 9-query call over 49 keys differs in the last bits from the 1-query call over the 41 keys that a decode
step at that position reads, in float32 at every length tried and in bfloat16 at some. A verify of K + 1 rows
and a batch of rows at their own positions would then compute other logits than plain decoding does.

So the speed layer gives a step of several queries (a verify, a batch) one call per query, over exactly the
keys a one-row decode step at that query's position reads: the slots 0..p on a full layer, the ring's slots
in use, min(p + 1, ring), on a sliding one. The mask's slice says which of them the query sees, as it does in
the decode step. The call is then the decode step's own, so its bits are too, on any device and kernel. A
single query and a prefill (more than STEP_ROWS queries: no step is that long) run as one call, as before.

Cost: K + 1 attention calls a layer in a verify instead of one (gemma4/fast/README.md, "Rows with the same bits").

Shape legend: B rows, T queries a row, H query heads, G kv heads, S key slots, D head dim.
"""

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from gemma4.engine.ring import Slots
from gemma4.fast.rows import STEP_ROWS
from gemma4.model import attend


def step_starts(at: Any) -> tuple[int, ...] | None:
    """Each row's first position on the host: the engine's `Slots` carry them, the textbook cache's start is an
    int; None where only the device knows them (a compiled step)."""
    if isinstance(at, Slots):
        return at.starts
    return (at,) if isinstance(at, int) else None


def attend_by_query(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, starts: tuple[int, ...] | None) -> Tensor:
    """q (B, T, H, D), k/v (B, G, S, D), mask (B, 1, T, S), starts (B,) on the host -> (B, T, H*D), as
    gemma4/model.py `attend`, each query of a step in a call of its own over the keys its decode step reads."""
    b, t = q.shape[:2]
    if starts is None or b * t == 1 or b * t > STEP_ROWS:
        return attend(q, k, v, mask)
    s = k.shape[2]
    q = q.transpose(1, 2)  # (B, H, T, D): a query's slice (1, H, 1, D) is the view `attend` gives a decode step
    out = []
    for row in range(b):
        one = slice(row, row + 1)
        for j in range(t):
            n = min(starts[row] + j + 1, s)  # a decode step at position p reads min(p + 1, S) slots
            out.append(F.scaled_dot_product_attention(q[one, :, j:j + 1], k[one, :, :n], v[one, :, :n],
                                                      attn_mask=mask[one, :, j:j + 1, :n], scale=1.0,
                                                      enable_gqa=True))  # (1, H, 1, D): `attend`'s own call
    return torch.cat(out).view(b, t, -1)  # (B*T, H, 1, D) -> (B, T, H*D)
