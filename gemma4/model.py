"""The Gemma 4 text model (the *target*): RoPE, masks, attention, MLP, decoder layer, model (norms in
gemma4/norms.py, the MoE block in gemma4/moe.py).

Design: gemma4/README.md (cited as §n). Facts a reader must know:
- RMSNorm multiplies by its weight directly (not 1 + w) and runs in fp32 (§4).
- Attention scale is 1.0: q_norm and k_norm already normalise the dot product (§7).
- Sliding and full layers differ in head size, kv heads, RoPE and mask (§2, §6, §8).
- KV-shared layers own no K/V: they attend to the K/V of the last non-shared layer of their type,
  computed earlier in the same forward (§3). The forward returns those two layers' K/V, which is
  exactly what the MTP drafter reads.
- Per-Layer Embeddings (E2B/E4B) add a small per-layer input to every layer (§12); the MoE block
  (26B-A4B) runs beside the dense MLP, not instead of it (§10).
- A batch of rows may sit at different positions (mtp/README.md §12): `start_pos` is then a (B,) tensor, and
  RoPE, masks and cache writes are per row. Batch 1 keeps its plain int path.

Shape legend: B batch, T new tokens, S key positions, H query heads, K kv heads, D head dim,
E hidden size, V vocab, L layers, P PLE width, X experts, I expert width, k experts per token.
"""

from functools import cache
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from gemma4.cache import KVCache, RowSlots
from gemma4.config import SLIDING, RopeConfig, TextConfig
from gemma4.moe import Experts, Router
from gemma4.norms import RMSNorm, gelu, rms_norm
from gemma4.packing import Choice, Linear, Prepared, Product, linear


@cache
def embed_scale(dim: int, dtype: torch.dtype) -> float:
    """sqrt(dim) rounded to the weight dtype first (§5): 39.25, not 39.19, for E2B in bf16."""
    return float(torch.tensor(dim**0.5, dtype=dtype))


# ---------------------------------------------------------------- RoPE (§6)

@cache  # once per (RoPE, head size, device), not per forward: read-only once made
def rope_frequencies(rope: RopeConfig, head_dim: int, device: torch.device) -> torch.Tensor:
    """(D/2,) angular frequencies. "proportional" rotates only the first n pairs, the rest get 0."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim  # (D/2,)
    freqs = rope.theta ** -exponent / rope.factor
    rotated = int(rope.partial_rotary_factor * head_dim / 2)  # 64 of 256 pairs on full layers
    freqs[rotated:] = 0.0  # zero frequency: cos 1, sin 0, the pair passes unchanged
    return freqs


def rope_cos_sin(positions: torch.Tensor, freqs: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """positions (T,) or per row (B, T) -> cos and *signed* sin (T, 1, D) or (B, T, 1, D), ready to
    broadcast over heads; see apply_rope for the sign."""
    angles = positions.float()[..., None] * freqs  # (T, D/2) or (B, T, D/2), fp32
    cos, sin = angles.cos(), angles.sin()
    cos = torch.cat([cos, cos], dim=-1)  # (T, D): dims i and i + D/2 share an angle
    sin = torch.cat([-sin, sin], dim=-1)  # (T, D): the minus of rot(x)'s first half, moved onto sin
    return cos[..., None, :].to(dtype), sin[..., None, :].to(dtype)  # (T, 1, D) or (B, T, 1, D)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, T, H, D); rotate-half layout: pair i is (i, i + D/2), not interleaved.
    x·cos + rot(x)·sin with rot(x) = (-x2, x1). The swap is one `roll` and the sign sits in `sin`
    (rope_cos_sin): (-x2)·s == x2·(-s) exactly, so this is the textbook formula with two fewer ops.
    """
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin  # (B, T, H, D) * ((B,) T, 1, D)


# ---------------------------------------------------------------- masks (§8)

def attention_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """q_pos (T,), k_pos (S,) -> (T, S) bool, True = visible: key j to query p iff j <= p (and
    p - window < j). The one mask helper: prefill, one-token decode, (K+1)-token verification and the
    drafter. Per-row query positions (B, T) give (B, 1, T, S), one mask for all heads of a row; a key
    past a row's own positions is a stale slot, and j <= p hides it."""
    p = q_pos[..., None]  # (T, 1) or (B, T, 1)
    visible = k_pos <= p  # (T, S) or (B, T, S)
    if window is not None:
        visible &= k_pos > p - window
    return visible if q_pos.dim() == 1 else visible[:, None]


class LayerInputs(NamedTuple):
    """What every layer of one type needs for one forward, computed once per type."""
    cos: torch.Tensor  # (T, 1, D), per row (B, T, 1, D)
    sin: torch.Tensor  # the same shape, signed: see apply_rope
    mask: torch.Tensor | None  # (T, S') or (B, 1, T, S') additive (0 visible, -inf hidden), keys key_start..
    key_start: int  # sliding layers skip keys that left the window


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """(T, S) bool -> (T, S) 0 / -inf, built once per forward (SDPA would convert a bool mask in every
    layer); None when every key is visible, as in a one-token decode step once key_start cut the window."""
    if bool(visible.all()):
        return None  # adding zeros changes nothing: SDPA without a mask gives the same numbers, faster
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, float("-inf"))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """q (B, T, H, D), k/v (B, K, S, D), mask (T, S) or (B, 1, T, S) -> (B, T, H*D). Scale 1.0, GQA h -> h // (H/K)."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask, scale=1.0, enable_gqa=True)
    return out.transpose(1, 2).flatten(2)  # (B, H, T, D) -> (B, T, H*D)


# ---------------------------------------------------------------- attention (§7)

class Attention(nn.Module):
    def __init__(self, config: TextConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.head_dim = d = config.head_dims[layer]
        self.num_heads, self.kv_heads = config.num_heads, config.kv_heads[layer]
        self.shared = config.is_shared(layer)
        self.has_v_proj = not self.shared and config.has_v_proj(layer)  # K=V layers have none (§7)
        e = config.hidden_size
        self.eps = config.rms_norm_eps
        self.q_proj = Linear(e, config.num_heads * d)
        self.q_norm = RMSNorm(d, self.eps)
        self.o_proj = Linear(config.num_heads * d, e)
        if not self.shared:  # shared layers hold no k/v weights at all
            self.k_proj = Linear(e, self.kv_heads * d)
            self.k_norm = RMSNorm(d, self.eps)
            if self.has_v_proj:
                self.v_proj = Linear(e, self.kv_heads * d)
        # Set by the loader (weights.prepare_weights), not parameters: q/k(/v) stacked into one product, and
        # their norms' weights stacked into one table (`norm_weights`).
        self.qkv: Product | None = None
        self.norms: Prepared | None = None

    def qkv_weights(self) -> tuple[torch.Tensor, ...]:
        """The projections one product stacks: q, k, v rows ((H+2K)*D, E), or q, k on K=V layers."""
        v = (self.v_proj.weight,) if self.has_v_proj else ()
        return (self.q_proj.weight, self.k_proj.weight, *v)

    def norm_weights(self) -> torch.Tensor:
        """(H+2K, D): q_norm's weight on every query head, k_norm's on every key head, 1 on the value heads
        (v_norm has no weight): the three norms as one. The loader's table while the weights are unchanged."""
        sources = (self.q_norm.weight, self.k_norm.weight)
        if self.norms is not None and self.norms.serves(sources):
            return self.norms.value
        h, k, d = self.num_heads, self.kv_heads, self.head_dim
        ones = torch.ones(k, d, dtype=self.q_norm.weight.dtype, device=self.q_norm.weight.device)
        return torch.cat([self.q_norm.weight.expand(h, d), self.k_norm.weight.expand(k, d), ones])  # (H+2K, D)

    def project_qkv(self, x: torch.Tensor, inp: LayerInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, E) -> q (B, T, H, D) and k, v (B, K, T, D): projected, normed, q and k rotated; one product,
        one norm and one rotation for all heads (each head's numbers as if done apart)."""
        b, t, _ = x.shape
        h, kv = self.num_heads, self.kv_heads
        qkv = linear(x, self.qkv_weights(), self.qkv).view(b, t, -1, self.head_dim)  # (B, T, H+2K, D) or (B, T, H+K, D)
        if not self.has_v_proj:  # K=V layers: V is the *raw* key projection, taken before k_norm (§7)
            qkv = torch.cat([qkv, qkv[:, :, h:]], dim=2)  # (B, T, H+2K, D)
        qkv = rms_norm(qkv, self.norm_weights(), self.eps)  # q_norm, k_norm and the weightless v_norm
        qk = apply_rope(qkv[:, :, :h + kv], inp.cos, inp.sin)  # (B, T, H+K, D); V gets no RoPE
        return qk[:, :, :h], qk[:, :, h:].transpose(1, 2), qkv[:, :, h + kv:].transpose(1, 2)

    def forward(
        self, x: torch.Tensor, inp: LayerInputs, cache: KVCache | None, start: int | RowSlots,
        shared_kv: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """x (B, T, E) -> (B, T, E), and this layer's K/V over positions 0..start+T-1 (0..end-1 per row)."""
        b, t, _ = x.shape
        if self.shared:
            q = self.q_norm(self.q_proj(x).view(b, t, -1, self.head_dim))  # (B, T, H, D), head-major columns
            q = apply_rope(q, inp.cos, inp.sin)
            k, v = shared_kv  # (B, K, S, D) of the source layer, this forward's positions included
        else:
            q, k, v = self.project_qkv(x, inp)  # (B, T, H, D), (B, K, T, D) x 2
            if cache is not None:
                k, v = cache.write(self.layer, start, k, v)  # (B, K, start+T, D) views
        s = inp.key_start  # a sliding layer past its window: older keys are not even multiplied
        keys, values = (k[:, :, s:], v[:, :, s:]) if s else (k, v)  # (B, K, S', D); no slicing ops when 0
        out = attend(q, keys, values, inp.mask)  # (B, T, H*D)
        return self.o_proj(out), (k, v)


# ---------------------------------------------------------------- feed-forward (§9; MoE in gemma4/moe.py)

class MLP(nn.Module):
    def __init__(self, hidden: int, width: int) -> None:
        super().__init__()
        self.width = width
        self.gate_proj = Linear(hidden, width)
        self.up_proj = Linear(hidden, width)
        self.down_proj = Linear(width, hidden)
        self.gate_up: Product | None = None  # gate and up stacked into one product by the loader

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = linear(x, (self.gate_proj.weight, self.up_proj.weight), self.gate_up)  # (B, T, 2W)
        return self.down_proj(gelu(gate_up[..., :self.width]) * gate_up[..., self.width:])


# ---------------------------------------------------------------- decoder layer (§11)

class DecoderLayer(nn.Module):
    def __init__(self, config: TextConfig, layer: int) -> None:
        super().__init__()
        e, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = Attention(config, layer)
        self.mlp = MLP(e, config.mlp_width(layer))
        self.input_layernorm = RMSNorm(e, eps)
        self.post_attention_layernorm = RMSNorm(e, eps)
        self.pre_feedforward_layernorm = RMSNorm(e, eps)
        self.post_feedforward_layernorm = RMSNorm(e, eps)
        self.layer_scalar = nn.Parameter(torch.empty(1))
        self.kind, self.shared, self.moe = config.layer_types[layer], config.is_shared(layer), config.enable_moe
        if config.ple_dim:
            self.per_layer_input_gate = Linear(e, config.ple_dim)
            self.per_layer_projection = Linear(config.ple_dim, e)
            self.post_per_layer_input_norm = RMSNorm(e, eps)
        if config.enable_moe:
            self.router = Router(config)
            self.experts = Experts(config)
            self.pre_feedforward_layernorm_2 = RMSNorm(e, eps)
            self.post_feedforward_layernorm_1 = RMSNorm(e, eps)
            self.post_feedforward_layernorm_2 = RMSNorm(e, eps)

    def forward(
        self, h: torch.Tensor, inp: LayerInputs, ple: torch.Tensor | None, cache: KVCache | None,
        start: int | RowSlots, shared_kv: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """h (B, T, E) -> (B, T, E); ple (B, T, P) or None."""
        a, kv = self.self_attn(self.input_layernorm(h), inp, cache, start, shared_kv)
        h = h + self.post_attention_layernorm(a)
        m = self.mlp(self.pre_feedforward_layernorm(h))
        if self.moe:  # MoE beside the dense MLP, both fed from the same residual h
            flat = h.flatten(0, 1)  # (B*T, E)
            weights, experts = self.router(flat)
            moe = self.experts(self.pre_feedforward_layernorm_2(flat), weights, experts).view_as(h)
            m = self.post_feedforward_layernorm_1(m) + self.post_feedforward_layernorm_2(moe)
        h = h + self.post_feedforward_layernorm(m)
        if ple is not None:
            g = gelu(self.per_layer_input_gate(h)) * ple  # (B, T, P)
            h = h + self.post_per_layer_input_norm(self.per_layer_projection(g))
        return h * self.layer_scalar, kv  # the scalar scales the whole stream, residual included


# ---------------------------------------------------------------- model

class ModelOutput(NamedTuple):
    logits: torch.Tensor  # (B, n, V) for the last n positions, softcapped
    hidden: torch.Tensor  # (B, T, E) after the final norm: the drafter's "hidden" input
    shared_kv: dict[str, tuple[torch.Tensor, torch.Tensor]]  # type -> K, V (B, K, S, D) of kv_source(type)


class Gemma4Model(nn.Module):
    def __init__(self, config: TextConfig) -> None:
        super().__init__()
        self.config = config
        e = config.hidden_size
        # `_weight`: no N(0, 1) init, the file supplies it (on the meta device normal_ imports dynamo, ~2 s)
        self.embed_tokens = nn.Embedding(config.vocab_size, e, _weight=torch.empty(config.vocab_size, e))
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(e, config.rms_norm_eps)
        if config.ple_dim:
            vp, lp = config.ple_vocab_size, config.num_layers * config.ple_dim
            self.embed_tokens_per_layer = nn.Embedding(vp, lp, _weight=torch.empty(vp, lp))
            self.per_layer_model_projection = Linear(e, lp)
            self.per_layer_projection_norm = RMSNorm(config.ple_dim, config.rms_norm_eps)
        self.head_product: Product | None = None  # the tied head's own product (weights.prepare_weights)
        self.packing: list[Choice] = []  # the loader's packing decisions, one per (shape, dtype)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (B, T) -> (B, T, E): the scaled embedding, also the drafter's token input (mtp/README.md §4)."""
        w = self.embed_tokens.weight
        return F.embedding(ids, w) * embed_scale(self.config.hidden_size, w.dtype)

    def per_layer_inputs(self, ids: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
        """§12: ids (B, T), scaled embedding x0 (B, T, E) -> (B, T, L, P)."""
        c = self.config
        # The table may be in the file's dtype (weights.py keeps it memory-mapped): cast the rows read.
        rows = F.embedding(ids, self.embed_tokens_per_layer.weight).to(x0.dtype)  # (B, T, L*P)
        tok = rows * embed_scale(c.ple_dim, x0.dtype)
        ctx = self.per_layer_model_projection(x0) * c.hidden_size**-0.5  # (B, T, L*P)
        ctx = self.per_layer_projection_norm(ctx.unflatten(-1, (c.num_layers, c.ple_dim)))  # (B, T, L, P)
        return (ctx + tok.unflatten(-1, (c.num_layers, c.ple_dim))) * 2**-0.5

    def layer_inputs(self, start: int | torch.Tensor, t: int, dtype: torch.dtype, device: torch.device
                     ) -> dict[str, LayerInputs]:
        """RoPE tables and masks for T queries at start.., once per layer type (not per layer); per row
        when start is a (B,) tensor: row b's queries at start_b..start_b+T-1 over keys 0..max end-1."""
        c = self.config
        if isinstance(start, int):
            q_pos, first, end = torch.arange(start, start + t, device=device), start, start + t  # (T,)
        else:
            q_pos = start[:, None] + torch.arange(t, device=device)  # (B, T)
            first, end = int(start.min()), int(start.max()) + t
        out = {}
        for kind in set(c.layer_types):
            window = c.sliding_window if kind == SLIDING else None
            # Keys that left every query's window are not even multiplied (sliding layers only).
            key_start = max(0, first - window + 1) if window else 0
            mask = attention_mask(q_pos, torch.arange(key_start, end, device=device), window)  # (T, S') or (B, 1, T, S')
            mask = additive_mask(mask, dtype)
            head_dim = c.head_dims[c.layer_types.index(kind)]
            cos, sin = rope_cos_sin(q_pos, rope_frequencies(c.rope[kind], head_dim, device), dtype)
            out[kind] = LayerInputs(cos, sin, mask, key_start)
        return out

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids (B, T) -> softcapped logits (B, T, V), no cache: the plain public call."""
        return self.run(input_ids).logits

    def run(
        self, input_ids: torch.Tensor, cache: KVCache | None = None, start_pos: int | torch.Tensor = 0,
        num_logits: int | None = None,
    ) -> ModelOutput:
        """input_ids (B, T) at positions start_pos..start_pos+T-1; per row when start_pos is a (B,) tensor.

        With a cache, K/V are written at those positions and queries attend to 0..start_pos+T-1;
        the caller moves `cache.length` afterwards. Without one, the forward is self-contained and
        starts at position 0. `num_logits` limits the head to the last n positions (prefill needs 1;
        0 computes none: a ragged batch takes each row's own with `logits`).
        """
        c = self.config
        if cache is None and (not isinstance(start_pos, int) or start_pos != 0):
            raise ValueError("a forward without a cache starts at position 0")
        b, t = input_ids.shape
        x = self.embed(input_ids)  # (B, T, E)
        ple = self.per_layer_inputs(input_ids, x) if c.ple_dim else None  # (B, T, L, P)
        inputs = self.layer_inputs(start_pos, t, x.dtype, x.device)
        # Where each row's K/V go: one int for all rows, or per-row slots computed once per forward.
        slots = start_pos if isinstance(start_pos, int) else cache.row_slots(start_pos, t)
        ples = [None] * c.num_layers if ple is None else ple.unbind(dim=2)  # L x (B, T, P)
        source_kv: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # type -> newest non-shared K/V
        h = x
        for layer, layer_ple in zip(self.layers, ples):
            shared = source_kv[layer.kind] if layer.shared else None
            h, kv = layer(h, inputs[layer.kind], layer_ple, cache, slots, shared)
            if not layer.shared:
                source_kv[layer.kind] = kv  # after the loop: exactly kv_source(kind)'s K/V
        hidden = self.norm(h)  # (B, T, E)
        n = t if num_logits is None else num_logits
        return ModelOutput(self.logits(hidden[:, t - n:]), hidden, source_kv)  # (B, n, V)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Post-norm hidden (..., E) -> softcapped logits (..., V) through the tied head, unscaled."""
        logits = linear(hidden, self.embed_tokens.weight, self.head_product)
        if cap := self.config.final_logit_softcapping:
            logits = torch.tanh(logits / cap) * cap
        return logits
