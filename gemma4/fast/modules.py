"""The fast modules the loaders swap in after loading: each computes what the textbook module it replaces
computes (gemma4/model.py), through prepared products (gemma4/fast/kernels.py).

- `FastLinear` replaces an `nn.Linear`: its product, and no hook dispatch (`nn.Module.__call__` costs about
  2 µs a call; a decode step makes ~150 projections).
- `StackedAttention` multiplies q, k and v (q and k on K=V layers) by one stacked product and normalises all
  heads with one (H+2K, D) table: q_norm's weight on the query heads, k_norm's on the key heads, 1 on the
  value heads (v_norm has no weight). One call each instead of three; each head's numbers as if done apart.
- `QueryAttention` attends query by query within a step (gemma4/fast/attention.py); every attention layer of a
  fast model is one.
- `StackedMLP` multiplies gate and up by one product.
- `GateLinear` is the PLE gate's `FastLinear`, its rows returned apart so the gelu after it runs row by row.
- `RowCentroidHead` scores a drafter's candidate tokens row by row.
- `FastHead` replaces the tied head: a product of the embedding's weight.
Each keeps the parameters and submodules of the module it replaces, so the state dict is the checkpoint's.
They are for inference: products are copies or views made once, which autograd does not reach, so a forward
that would train raises (load with `fast=False` to train).

Shape legend: B batch, T new tokens, H query heads, K kv heads, D head dim, E hidden, W MLP width.
"""

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gemma4.fast.attention import attend_by_query, step_starts
from gemma4.fast.int4 import Int4Product
from gemma4.fast.kernels import Product
from gemma4.model import MLP, Attention, LayerInputs, apply_rope
from gemma4.fast.norms import fast_rms_norm
from gemma4.norms import gelu

FOR_INFERENCE = "this model's products are prepared for inference: load it with fast=False to train it"


def check_inference(weight: torch.Tensor) -> None:
    if weight.requires_grad and torch.is_grad_enabled():
        raise RuntimeError(FOR_INFERENCE)


def check_layer(linear: nn.Module) -> None:
    """`check_inference` for a projection the stacked product replaced: an `nn.Linear`'s weight, or an int4
    layer's scales. Looked up only where autograd is on: a decode step (inference mode) pays one call."""
    if torch.is_grad_enabled():
        check_inference(linear.weight if isinstance(linear, nn.Linear) else linear.weight_scale)


class FastLinear(nn.Module):
    def __init__(self, plain: nn.Linear, product: Product) -> None:
        super().__init__()
        self.weight = plain.weight  # the same parameter: the state dict is unchanged
        self.in_features, self.out_features = plain.in_features, plain.out_features
        self.product = product

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_inference(self.weight)
        return self.product(x)  # (..., I) -> (..., O)

    __call__ = forward  # no hook dispatch, see above


class GateLinear(FastLinear):
    """The PLE gate (`per_layer_input_gate`), whose output goes through gelu: returned as a view whose rows sit
    apart in memory, so gelu runs row by row. Torch's CPU loops finish a contiguous run that is not a whole number
    of vectors with scalar code, and float32 gelu's scalar code rounds otherwise than its vector code: on a narrow
    gate (width under 32) a decode step's single row takes the scalar path and a verify's rows the vector one.
    Row by row, every row takes the same path in any step. A gate whose width is a multiple of 64 is returned as
    it is (every real release's: 256)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)  # (..., P)
        width = out.shape[-1]
        if width % 64 == 0:
            return out
        return F.pad(out, (0, 64 - width % 64))[..., :width]  # (..., P), rows 64k apart

    __call__ = forward


class RowCentroidHead:
    """Mixed into the drafter's centroid head by the speed layer (mtp/drafter.py `CentroidHead`): the scores of
    each row's candidate tokens by a product of its own. One batched product over B rows (`bmm`) gives a row
    other bits in float32 than the same row alone, so a batch row would draft otherwise than its solo run."""

    def scored_tokens(self, hn: torch.Tensor, head: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """hn (B, U), head (V, U) -> token ids (B, N*V/C) and their scores, row by row."""
        alone = super().scored_tokens
        rows = [alone(hn[b:b + 1], head) for b in range(hn.shape[0])]
        return torch.cat([ids for ids, _ in rows]), torch.cat([scores for _, scores in rows])


def row_by_row(head: nn.Module) -> nn.Module:
    """A drafter's centroid head (gemma4 never imports mtp: its class is taken from the instance) with
    `RowCentroidHead`'s scores: the same parameters and buffers."""
    return adopt(type("RowCentroidHead", (RowCentroidHead, type(head)), {}), head)


class FastHead(nn.Module):
    def __init__(self, product: Product) -> None:
        super().__init__()
        self.product = product  # made from the embedding weight the caller passes

    def forward(self, hidden: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        check_inference(embedding)
        return self.product(hidden)  # (..., E) -> (..., V)


def adopt(cls: type, plain: nn.Module) -> nn.Module:
    """An instance of `cls` holding exactly `plain`'s parameters, submodules and settings: a new forward."""
    fast = cls.__new__(cls)
    fast.__dict__.update(plain.__dict__)
    return fast


class QueryAttention(Attention):
    """An attention layer whose queries of one step attend one by one (gemma4/fast/attention.py), so a verify
    row or a batch row has the bits of the decode step at its position."""

    def forward(self, x: torch.Tensor, inp: LayerInputs, cache: Any = None, at: Any = None,
                shared_kv: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """As Attention.forward: x (B, T, E) -> (B, T, E), and the K/V it read (B, G, S, D)."""
        q, k, v = self.project(x, inp)
        if self.shared:
            k, v = shared_kv
        elif cache is not None:
            k, v = cache.write(self.layer, at, k, v)
        return self.o_proj(attend_by_query(q, k, v, inp.mask, step_starts(at))), (k, v)


class StackedAttention(QueryAttention):
    @classmethod
    def replacing(cls, plain: Attention, qkv: Product | Int4Product) -> "StackedAttention":
        fast = adopt(cls, plain)
        h, k, d = plain.num_heads, plain.kv_heads, plain.head_dim
        ones = torch.ones(k, d, dtype=plain.q_norm.weight.dtype, device=plain.q_norm.weight.device)
        fast.qkv = qkv
        fast.norms = torch.cat([plain.q_norm.weight.expand(h, d), plain.k_norm.weight.expand(k, d), ones])  # (H+2K, D)
        return fast

    def project(self, x: torch.Tensor, inp: LayerInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """As Attention.project: q (B, T, H, D), k, v (B, K, T, D), with one product, one norm, one rotation."""
        check_layer(self.q_proj)
        b, t, _ = x.shape
        h, kv = self.num_heads, self.kv_heads
        qkv = self.qkv(x).view(b, t, -1, self.head_dim)  # (B, T, H+2K, D), or (B, T, H+K, D) on K=V layers
        if not self.has_v_proj:  # K=V layers: V is the raw key projection, before k_norm
            qkv = torch.cat([qkv, qkv[:, :, h:]], dim=2)  # (B, T, H+2K, D)
        qkv = fast_rms_norm(qkv, self.norms, self.eps)  # q_norm, k_norm and the weightless v_norm at once
        qk = apply_rope(qkv[:, :, :h + kv], inp.cos, inp.sin)  # (B, T, H+K, D); V gets no RoPE
        return qk[:, :, :h], qk[:, :, h:].transpose(1, 2), qkv[:, :, h + kv:].transpose(1, 2)


class StackedMLP(MLP):
    @classmethod
    def replacing(cls, plain: MLP, gate_up: Product | Int4Product) -> "StackedMLP":
        fast = adopt(cls, plain)
        fast.gate_up, fast.width = gate_up, plain.gate_proj.out_features
        return fast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_layer(self.gate_proj)
        gate_up = self.gate_up(x)  # (B, T, 2W): gate's columns, then up's
        return self.down_proj(gelu(gate_up[..., :self.width]) * gate_up[..., self.width:])
