"""The Gemma 4 text model (the *target*): RoPE, masks, attention, MLP, decoder layer, model (norms
in gemma4/norms.py, the MoE block in gemma4/moe.py).

Design: gemma4/README.md (cited as §n). Facts a reader must know:
- RMSNorm multiplies by its weight directly (not 1 + w) and runs in fp32 (§4).
- Attention scale is 1.0: q_norm and k_norm already normalise the dot product (§7).
- Sliding and full layers differ in head size, kv heads, RoPE and mask (§2, §6, §8).
- KV-shared layers own no K/V: they attend to the K/V of the last non-shared layer of their type,
  computed earlier in the same forward (§3). Those two source layers' K/V are what the MTP drafter
  reads.
- Per-Layer Embeddings (E2B/E4B) add a small per-layer input to every layer (§12); the MoE block
  (26B-A4B) runs beside the dense MLP, not instead of it (§10).
- The model's forward runs one row: the ids at positions start..start+T-1, written into the
  textbook's cache (gemma4/cache.py). The layers take a batch dimension B, which is 1 here; the
  engine runs many rows through the same layers (gemma4/engine/forward.py). Projections are
  `nn.Linear`, no bias.

Shape legend: B rows (1 in the textbook), T new tokens, S key positions, H query heads, G kv heads,
D head dim, E hidden size, V vocab, L layers, P PLE width."""

from functools import lru_cache
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gemma4.cache import KVCache, KVPair
from gemma4.config import SLIDING, RopeConfig, TextConfig
from gemma4.moe import Experts, Router
from gemma4.norms import RMSNorm, gelu, rms_norm


def linear(in_features: int, out_features: int) -> nn.Linear:
    # `attention_bias` is false in every release.
    return nn.Linear(in_features, out_features, bias=False)


@lru_cache
def embed_scale(dim: int, dtype: torch.dtype) -> float:
    """sqrt(dim) rounded to the weight dtype first (§5): 39.25, not 39.19, for E2B in bf16."""
    return float(torch.tensor(dim**0.5, dtype=dtype))


# ---------------------------------------------------------------- RoPE (§6)

# Once per (RoPE, head size, device), not per forward: read-only once made.
@lru_cache
def rope_frequencies(rope: RopeConfig, head_dim: int, device: torch.device) -> Tensor:
    """(D/2,) angular frequencies. "proportional" rotates only the first pairs, the rest get 0."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim  # (D/2,)
    freqs = rope.theta ** -exponent / rope.factor
    # 64 of 256 pairs rotate on full layers; frequency 0 is cos 1, sin 0: the pair passes unchanged.
    freqs[int(rope.partial_rotary_factor * head_dim / 2):] = 0.0
    return freqs


def rope_cos_sin(positions: Tensor, freqs: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """positions (B, T) -> cos and *signed* sin (B, T, 1, D), ready to broadcast over heads; see
    apply_rope for the sign."""
    angles = positions.float()[..., None] * freqs  # (B, T, D/2), fp32
    cos, sin = angles.cos(), angles.sin()
    # Dims i and i + D/2 share an angle; the minus of rot(x)'s first half is moved onto sin.
    cos = torch.cat([cos, cos], dim=-1)  # (B, T, D)
    sin = torch.cat([-sin, sin], dim=-1)  # (B, T, D)
    return cos[..., None, :].to(dtype), sin[..., None, :].to(dtype)  # (B, T, 1, D)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (B, T, H, D); rotate-half layout: pair i is (i, i + D/2), not interleaved. x·cos +
    rot(x)·sin with rot(x) = (-x2, x1): the swap is one `roll`, the sign sits in `sin`."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin  # (B, T, H, D) * (B, T, 1, D)


# ---------------------------------------------------------------- masks (§8)

def attention_mask(q_pos: Tensor, k_pos: Tensor, window: int | None) -> Tensor:
    """q_pos (B, T), k_pos (B or 1, S) -> (B, 1, T, S) bool, True = visible, one mask for all heads
    of a row: key j to query p iff j <= p (and p - window < j). Prefill, decode, verify and the
    drafter all use it. Keys are known by their positions, so the sliding layers' window is this
    comparison alone, whatever slots the cache holds."""
    p, k = q_pos[..., None], k_pos[:, None, :]  # (B, T, 1), (B, 1, S)
    visible = k <= p  # (B, T, S)
    if window is not None:
        visible &= k > p - window
    return visible[:, None]  # (B, 1, T, S)


def additive_mask(visible: Tensor, dtype: torch.dtype) -> Tensor:
    """bool -> 0 / -inf of the same shape, once per forward (SDPA would convert a bool mask in every
    layer)."""
    zeros = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return zeros.masked_fill_(~visible, -torch.inf)


class LayerInputs(NamedTuple):
    """What every layer of one type needs for one forward, computed once per type."""
    cos: Tensor  # (B, T, 1, D)
    sin: Tensor  # the same shape, signed: see apply_rope
    mask: Tensor  # (B, 1, T, S) additive over the keys read


def layer_inputs(c: TextConfig, positions: Tensor, key_positions: dict[str, Tensor],
                 dtype: torch.dtype, shift: int = 0) -> dict[str, LayerInputs]:
    """RoPE at `positions` (B, T) and masks over the keys each layer type reads, once per type:
    key_positions[type] holds the positions of the slots read, (1, S) or (B, S). The target's
    queries see keys up to their own position (shift 0). The drafter passes shift 1: its query at p
    sees the target's keys 0..p-1, and its sliding layers one key more than the target's
    (mtp §5)."""
    out = {}
    for kind in set(c.layer_types):
        window = c.sliding_window + shift if kind == SLIDING else None
        visible = attention_mask(positions - shift, key_positions[kind], window)  # (B, 1, T, S)
        head_dim = c.head_dims[c.layer_types.index(kind)]
        freqs = rope_frequencies(c.rope[kind], head_dim, positions.device)
        cos, sin = rope_cos_sin(positions, freqs, dtype)
        out[kind] = LayerInputs(cos, sin, additive_mask(visible, dtype))
    return out


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """q (B, T, H, D), k/v (B, G, S, D), mask (B, 1, T, S) -> (B, T, H*D). Scale 1.0; query head h
    reads kv head h // (H/G)."""
    q = q.transpose(1, 2)  # (B, H, T, D)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0, enable_gqa=True)
    return out.transpose(1, 2).flatten(2)  # (B, H, T, D) -> (B, T, H*D)


# ---------------------------------------------------------------- attention (§7)

class Attention(nn.Module):
    def __init__(self, config: TextConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.head_dim = d = config.head_dims[layer]
        self.num_heads, self.kv_heads = config.num_heads, config.kv_heads[layer]
        self.shared = config.is_shared(layer)
        # K=V layers have no v_proj (§7).
        self.has_v_proj = not self.shared and config.has_v_proj(layer)
        e = config.hidden_size
        self.eps = config.rms_norm_eps
        self.q_proj = linear(e, config.num_heads * d)
        self.q_norm = RMSNorm(d, self.eps)
        self.o_proj = linear(config.num_heads * d, e)
        # Shared layers hold no k/v weights at all.
        if not self.shared:
            self.k_proj = linear(e, self.kv_heads * d)
            self.k_norm = RMSNorm(d, self.eps)
            if self.has_v_proj:
                self.v_proj = linear(e, self.kv_heads * d)

    def project(self, x: Tensor, inp: LayerInputs) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """x (B, T, E) -> q (B, T, H, D) and this layer's new k, v (B, G, T, D) (None on a shared
        layer): projected, normed, q and k rotated."""
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, self.num_heads, self.head_dim))  # (B, T, H, D)
        q = apply_rope(q, inp.cos, inp.sin)
        if self.shared:
            return q, None, None
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim)  # (B, T, G, D)
        # K=V layers: V is the *raw* key projection, taken before k_norm and RoPE.
        # (B, T, G, D)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim) if self.has_v_proj else k
        k = apply_rope(self.k_norm(k), inp.cos, inp.sin)
        # v_norm has no weight.
        v = rms_norm(v, None, self.eps)
        return q, k.transpose(1, 2), v.transpose(1, 2)  # (B, T, H, D), (B, G, T, D) x 2

    def forward(self, x: Tensor, inp: LayerInputs, cache: KVCache | None = None, at: Any = None,
                shared_kv: KVPair | None = None) -> tuple[Tensor, KVPair]:
        """x (B, T, E) -> (B, T, E), and the K/V this layer read. `cache.write(layer, at, k, v)`
        stores this forward's K/V and returns every key its queries read: `at` is the start
        position for the textbook's cache (the engine's ring takes its own `Slots`). Without a
        cache, the queries read this forward's keys; a shared layer reads `shared_kv`."""
        q, k, v = self.project(x, inp)
        if self.shared:
            k, v = shared_kv  # (B, G, S, D) of the source layer, this forward's positions included
        elif cache is not None:
            k, v = cache.write(self.layer, at, k, v)  # (B, G, S, D)
        out = attend(q, k, v, inp.mask)  # (B, T, H*D)
        return self.o_proj(out), (k, v)


# ---------------------------------------------------------------- feed-forward (§9)

class MLP(nn.Module):
    def __init__(self, hidden: int, width: int) -> None:
        super().__init__()
        self.gate_proj = linear(hidden, width)
        self.up_proj = linear(hidden, width)
        self.down_proj = linear(width, hidden)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(gelu(self.gate_proj(x)) * self.up_proj(x))  # (B, T, W) -> (B, T, E)


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
        # Which inputs (RoPE, mask) it takes; a shared layer reads its source layer's K/V (§3).
        self.kind = config.layer_types[layer]
        self.shared = config.is_shared(layer)
        self.moe = config.enable_moe
        if config.ple_dim:
            self.per_layer_input_gate = linear(e, config.ple_dim)
            self.per_layer_projection = linear(config.ple_dim, e)
            self.post_per_layer_input_norm = RMSNorm(e, eps)
        if config.enable_moe:
            self.router = Router(config)
            self.experts = Experts(config)
            self.pre_feedforward_layernorm_2 = RMSNorm(e, eps)
            self.post_feedforward_layernorm_1 = RMSNorm(e, eps)
            self.post_feedforward_layernorm_2 = RMSNorm(e, eps)

    def forward(self, h: Tensor, inp: LayerInputs, ple: Tensor | None = None,
                cache: KVCache | None = None, at: Any = None,
                shared_kv: KVPair | None = None) -> tuple[Tensor, KVPair]:
        """h (B, T, E) -> (B, T, E); ple (B, T, P) or None. `cache`, `at`, `shared_kv`: see
        Attention.forward."""
        a, kv = self.self_attn(self.input_layernorm(h), inp, cache, at, shared_kv)
        h = h + self.post_attention_layernorm(a)
        m = self.mlp(self.pre_feedforward_layernorm(h))
        # MoE beside the dense MLP, both fed from the same residual h.
        if self.moe:
            flat = h.flatten(0, 1)  # (B*T, E)
            weights, experts = self.router(flat)
            moe = self.experts(self.pre_feedforward_layernorm_2(flat), weights, experts).view_as(h)
            m = self.post_feedforward_layernorm_1(m) + self.post_feedforward_layernorm_2(moe)
        h = h + self.post_feedforward_layernorm(m)
        if ple is not None:
            g = gelu(self.per_layer_input_gate(h)) * ple  # (B, T, P)
            h = h + self.post_per_layer_input_norm(self.per_layer_projection(g))
        # The scalar scales the whole stream, residual included.
        return h * self.layer_scalar, kv


# ---------------------------------------------------------------- model

class TiedHead(nn.Module):
    """The output head is the token embedding (V, E) itself (§5): no parameter, the weight is stored
    once."""

    def forward(self, hidden: Tensor, embedding: Tensor) -> Tensor:
        return F.linear(hidden, embedding)  # (..., E) @ (V, E).T -> (..., V)


class ModelOutput(NamedTuple):
    logits: Tensor  # (n, V) for the last n positions, softcapped, at least float32
    hidden: Tensor  # (T, E) after the final norm: the drafter's "hidden" input


class Gemma4Model(nn.Module):
    def __init__(self, config: TextConfig) -> None:
        super().__init__()
        self.config = config
        e = config.hidden_size
        # `_weight`: no N(0, 1) init, the file supplies it (on the meta device normal_ imports
        # dynamo, ~2 s).
        v = config.vocab_size
        self.embed_tokens = nn.Embedding(v, e, _weight=torch.empty(v, e))
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(e, config.rms_norm_eps)
        self.head = TiedHead()
        if config.ple_dim:
            vp, lp = config.ple_vocab_size, config.num_layers * config.ple_dim
            self.embed_tokens_per_layer = nn.Embedding(vp, lp, _weight=torch.empty(vp, lp))
            self.per_layer_model_projection = linear(e, lp)
            self.per_layer_projection_norm = RMSNorm(config.ple_dim, config.rms_norm_eps)

    def embed(self, ids: Tensor) -> Tensor:
        """ids (B, T) -> (B, T, E): the scaled embedding, also the drafter's token input
        (mtp/README.md §4)."""
        w = self.embed_tokens.weight
        return F.embedding(ids, w) * embed_scale(self.config.hidden_size, w.dtype)

    def per_layer_rows(self, ids: Tensor, like: Tensor) -> Tensor:
        """§12's token part: ids (B, T) -> the PLE table's rows, scaled, (B, T, L*P) on `like`'s
        device, in its dtype. The table stays where the loader put it, in the file's dtype
        (weights.py): rows are looked up there, then moved and cast."""
        table = self.embed_tokens_per_layer.weight
        rows = F.embedding(ids.to(table.device), table).to(like)
        return rows * embed_scale(self.config.ple_dim, like.dtype)

    def per_layer_inputs(self, tok: Tensor, x0: Tensor) -> Tensor:
        """§12: the scaled table rows (B, T, L*P) and the scaled embedding x0 (B, T, E) -> (B, T, L,
        P)."""
        c = self.config
        ctx = self.per_layer_model_projection(x0) * c.hidden_size**-0.5  # (B, T, L*P)
        # (B, T, L, P)
        ctx = self.per_layer_projection_norm(ctx.unflatten(-1, (c.num_layers, c.ple_dim)))
        return (ctx + tok.unflatten(-1, (c.num_layers, c.ple_dim))) * 2**-0.5

    def forward(self, ids: list[int], start: int = 0, cache: KVCache | None = None,
                last: int | None = None) -> ModelOutput:
        """One row: `ids` at positions start..start+T-1. Their K/V are written into `cache` at those
        positions, and the queries read positions 0..start+T-1. The caller moves `cache.length`.
        Without a cache, start is 0 and the queries read this forward's keys. `last`: logits for the
        last n positions only (None: all T)."""
        c = self.config
        end = start + len(ids)
        # A media id the model generates embeds as the pad token (id 0), its PLE rows too, as in
        # transformers. (Prompts with media run in the engine: gemma4/engine/forward.py.)
        ids = [0 if i in c.media_token_ids else i for i in ids]
        tokens = torch.tensor([ids], device=self.embed_tokens.weight.device)  # (1, T)
        x = self.embed(tokens)  # (1, T, E)
        ple = self.per_layer_inputs(self.per_layer_rows(tokens, x), x) if c.ple_dim else None
        positions = torch.arange(start, end, device=x.device)[None]  # (1, T)
        # Every layer reads keys 0..end-1; a sliding layer's mask hides those outside its window.
        keys = torch.arange(end, device=x.device)[None]  # (1, S)
        inputs = layer_inputs(c, positions, {kind: keys for kind in c.layer_types}, x.dtype)
        hidden, _ = self.stack(x, ple, inputs, cache, start)  # (1, T, E)
        shown = len(ids) if last is None else last
        return ModelOutput(self.logits(hidden[0, len(ids) - shown:]), hidden[0])

    def stack(self, x: Tensor, ple: Tensor | None, inputs: dict[str, LayerInputs],
              cache: Any, at: Any) -> tuple[Tensor, dict[str, KVPair]]:
        """The layers and the final norm: x (B, T, E), ple (B, T, L, P) or None -> hidden (B, T, E)
        and type -> the K/V of kv_source(type). `cache` and `at`: see Attention.forward."""
        # L x (B, T, P)
        ples = [None] * self.config.num_layers if ple is None else ple.unbind(dim=2)
        # type -> the newest non-shared layer's K/V: after the loop, exactly kv_source(type)'s.
        source_kv: dict[str, KVPair] = {}
        h = x
        for layer, layer_ple in zip(self.layers, ples):
            shared = source_kv[layer.kind] if layer.shared else None
            h, kv = layer(h, inputs[layer.kind], layer_ple, cache, at, shared)
            if not layer.shared:
                source_kv[layer.kind] = kv
        return self.norm(h), source_kv

    def logits(self, hidden: Tensor) -> Tensor:
        """Post-norm hidden (..., E) -> softcapped logits (..., V), at least float32, through the
        tied head."""
        logits = self.head(hidden, self.embed_tokens.weight)
        # A bf16 cap would round logits into ties.
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        if cap := self.config.final_logit_softcapping:
            logits = torch.tanh(logits / cap) * cap
        return logits
