"""The fast modules the loaders swap in after loading: each computes what the textbook module it replaces
computes (gemma4/model.py), through prepared products (gemma4/fast/kernels.py).

- `FastLinear` replaces an `nn.Linear`: its product, and no hook dispatch (`nn.Module.__call__` costs about
  2 µs a call; a decode step makes ~150 projections).
- `StackedAttention` multiplies q, k and v (q and k on K=V layers) by one stacked product and normalises all
  heads with one (H+2K, D) table: q_norm's weight on the query heads, k_norm's on the key heads, 1 on the
  value heads (v_norm has no weight). One call each instead of three; each head's numbers as if done apart.
- `StackedMLP` multiplies gate and up by one product.
- `FastHead` replaces the tied head: a product of the embedding's weight.
Each keeps the parameters and submodules of the module it replaces, so the state dict is the checkpoint's.
They are for inference: products are copies or views made once, which autograd does not reach, so a forward
that would train raises (load with `fast=False` to train).

Shape legend: B batch, T new tokens, H query heads, K kv heads, D head dim, E hidden, W MLP width.
"""

import torch
from torch import nn

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


class StackedAttention(Attention):
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
