"""The vision encoder of E2B, E4B, 26B-A4B and 31B (a ViT over 16 px patches), and `embed_vision`, which carries
its vectors into the text width. One image at a time, without padding.

Facts a reader must know (transformers 5.22.2 `Gemma4VisionModel`, `Gemma4MultimodalEmbedder`):
- Pixels arrive in [0, 1] and the tower maps them to [-1, 1] itself (2x - 1); the processor does not normalise.
- Positions are learned, not sinusoidal: row x of one table plus row y of another, added to the patch projection.
  Inside attention a 2-D RoPE rotates the first half of each head by x and the second half by y.
- The layers are the text model's sandwich (a norm before and after attention and MLP, weight multiplies directly)
  with scale 1.0 (q_norm and k_norm normalise), a weightless v_norm, and every head seeing every patch.
- Clipped linears (`use_clipped_linears`, E2B/E4B): each projection clamps its input and its output to four
  stored scalars.
- The output averages each k x k block of patches (k = pooling_kernel_size, 3 in every release) into one vector,
  then scales it by sqrt(W) in fp32 (it can pass float16's range) and, where `standardize` says so, shifts and
  scales it by stored vectors before the cast back.
- `embed_vision` is a weightless RMSNorm and one projection to E; the 12B uses it too (gemma4/vision/unified.py).

Shape legend: N patches of one image, M = N / k² pooled vectors, C = 3·p² pixel values per patch, W tower width,
H heads, K kv heads, D head dim, I MLP width, P rows of a position table, E text width.
"""

from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

from gemma4.model import apply_rope, rope_cos_sin
from gemma4.norms import RMSNorm, gelu, rms_norm, wide
from gemma4.vision.config import VisionConfig

VISION_PREFIX = "model.vision_tower."  # + a key of weight_table: the checkpoint's name
EMBED_PREFIX = "model.embed_vision."  # + a key of embed_weight_table

CLIP_BOUNDS = ("input_min", "input_max", "output_min", "output_max")

AxialRope = tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]  # (cos, sin) for x, for y


# ---------------------------------------------------------------- the name table

def weight_table(c: VisionConfig) -> dict[str, tuple[int, ...]]:
    """Module key -> shape, for every tensor VisionTower owns (checkpoint name = VISION_PREFIX + key)."""
    w, i, d = c.hidden_size, c.intermediate_size, c.head_dim
    table: dict[str, tuple[int, ...]] = {
        "patch_embedder.input_proj.weight": (w, 3 * c.patch_size**2),
        "patch_embedder.position_embedding_table": (2, c.position_embedding_size, w),
    }
    for n in range(c.num_layers):
        pre = f"encoder.layers.{n}."
        projections = {"self_attn.q_proj": (c.num_heads * d, w), "self_attn.k_proj": (c.num_kv_heads * d, w),
                       "self_attn.v_proj": (c.num_kv_heads * d, w), "self_attn.o_proj": (w, c.num_heads * d),
                       "mlp.gate_proj": (i, w), "mlp.up_proj": (i, w), "mlp.down_proj": (w, i)}
        for name, shape in projections.items():
            table[pre + name + ".linear.weight"] = shape
            if c.use_clipped_linears:
                table.update({f"{pre}{name}.{bound}": () for bound in CLIP_BOUNDS})
        table[pre + "self_attn.q_norm.weight"] = (d,)
        table[pre + "self_attn.k_norm.weight"] = (d,)
        for norm in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            table[pre + norm + ".weight"] = (w,)
    if c.standardize:
        table["std_bias"] = (w,)
        table["std_scale"] = (w,)
    return table


def embed_weight_table(c: VisionConfig) -> dict[str, tuple[int, ...]]:
    """Module key -> shape for VisionEmbedder (checkpoint name = EMBED_PREFIX + key); its norm has no weight."""
    return {"embedding_projection.weight": (c.text_hidden_size, c.out_dim)}


# ---------------------------------------------------------------- pieces

class ClippableLinear(nn.Module):
    """A projection without bias; with `clipped`, its input and output are clamped to stored scalars (the bounds
    the model was quantization-trained with). The weight sits one level down (`q_proj.linear.weight`) either way."""

    def __init__(self, in_features: int, out_features: int, clipped: bool) -> None:
        super().__init__()
        self.clipped = clipped
        self.linear = nn.Linear(in_features, out_features, bias=False)
        if clipped:
            for bound in CLIP_BOUNDS:
                self.register_buffer(bound, torch.empty(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.clipped:
            return self.linear(x)
        x = torch.clamp(x, self.input_min, self.input_max)
        return torch.clamp(self.linear(x), self.output_min, self.output_max)


@lru_cache  # once per (theta, head size, device): read-only once made
def axial_frequencies(theta: float, head_dim: int, device: torch.device) -> torch.Tensor:
    """(D/4,) angular frequencies shared by the x and y halves of a head. Written 1/θ^(4i/D), on the CPU, as
    transformers computes them: θ^(-4i/D) differs in the last fp32 bit for 6 of the 16 at D = 64."""
    half = head_dim // 2  # each axis rotates D/2 channels: D/4 pairs
    return (1.0 / theta ** (torch.arange(0, half, 2, dtype=torch.float32) / half)).to(device)


def axial_rope(positions: torch.Tensor, freqs: torch.Tensor, dtype: torch.dtype) -> AxialRope:
    """positions (N, 2) as (x, y) -> (cos, signed sin) (N, 1, D/2) for each axis (gemma4/model.py's rope_cos_sin)."""
    x, y = positions.unbind(-1)  # (N,) each
    return rope_cos_sin(x, freqs, dtype), rope_cos_sin(y, freqs, dtype)


def apply_axial_rope(t: torch.Tensor, rope: AxialRope) -> torch.Tensor:
    """t (N, H, D): the first half of each head rotated by x, the second by y, each half rotate-half on its own."""
    half = t.shape[-1] // 2
    (cos_x, sin_x), (cos_y, sin_y) = rope
    return torch.cat([apply_rope(t[..., :half], cos_x, sin_x), apply_rope(t[..., half:], cos_y, sin_y)], dim=-1)


class PatchEmbedder(nn.Module):
    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        self.input_proj = nn.Linear(3 * c.patch_size**2, c.hidden_size, bias=False)
        self.position_embedding_table = nn.Parameter(torch.empty(2, c.position_embedding_size, c.hidden_size))

    def forward(self, patches: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """patches (N, C) in [0, 1], positions (N, 2) -> (N, W)."""
        w = self.input_proj.weight
        x = (2 * (patches - 0.5)).to(w.dtype)  # [0, 1] -> [-1, 1] in the pixels' dtype, then one cast
        table = self.position_embedding_table  # (2, P, W): the x table, the y table
        return self.input_proj(x) + (table[0][positions[:, 0]] + table[1][positions[:, 1]])  # (N, W)


# ---------------------------------------------------------------- the encoder layer

class VisionAttention(nn.Module):
    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        self.num_heads, self.kv_heads, self.head_dim, self.eps = c.num_heads, c.num_kv_heads, c.head_dim, c.rms_norm_eps
        w, d, clip = c.hidden_size, c.head_dim, c.use_clipped_linears
        self.q_proj = ClippableLinear(w, c.num_heads * d, clip)
        self.k_proj = ClippableLinear(w, c.num_kv_heads * d, clip)
        self.v_proj = ClippableLinear(w, c.num_kv_heads * d, clip)
        self.o_proj = ClippableLinear(c.num_heads * d, w, clip)
        self.q_norm = RMSNorm(d, self.eps)
        self.k_norm = RMSNorm(d, self.eps)

    def forward(self, x: torch.Tensor, rope: AxialRope) -> torch.Tensor:
        """x (N, W) -> (N, W): every patch sees every patch of its image, so there is no mask."""
        n = x.shape[0]
        q = apply_axial_rope(self.q_norm(self.q_proj(x).view(n, self.num_heads, self.head_dim)), rope)  # (N, H, D)
        k = apply_axial_rope(self.k_norm(self.k_proj(x).view(n, self.kv_heads, self.head_dim)), rope)  # (N, K, D)
        v = rms_norm(self.v_proj(x).view(n, self.kv_heads, self.head_dim), None, self.eps)  # (N, K, D), no weight
        # scale 1.0: q_norm and k_norm already normalise the dot product. A batch of one, (1, H, N, D), as
        # transformers calls it: on the CPU 3-D inputs take another kernel, one bf16 rounding apart.
        q, k, v = (t.transpose(0, 1)[None] for t in (q, k, v))  # (1, H or K, N, D)
        out = F.scaled_dot_product_attention(q, k, v, scale=1.0, enable_gqa=True)[0]  # (H, N, D)
        return self.o_proj(out.transpose(0, 1).flatten(1))  # (N, H, D) -> (N, H*D) -> (N, W)


class VisionMLP(nn.Module):
    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        w, i, clip = c.hidden_size, c.intermediate_size, c.use_clipped_linears
        self.gate_proj = ClippableLinear(w, i, clip)
        self.up_proj = ClippableLinear(w, i, clip)
        self.down_proj = ClippableLinear(i, w, clip)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(gelu(self.gate_proj(x)) * self.up_proj(x))  # (N, I) -> (N, W)


class VisionLayer(nn.Module):
    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        w, eps = c.hidden_size, c.rms_norm_eps
        self.self_attn = VisionAttention(c)
        self.mlp = VisionMLP(c)
        self.input_layernorm = RMSNorm(w, eps)
        self.post_attention_layernorm = RMSNorm(w, eps)
        self.pre_feedforward_layernorm = RMSNorm(w, eps)
        self.post_feedforward_layernorm = RMSNorm(w, eps)

    def forward(self, h: torch.Tensor, rope: AxialRope) -> torch.Tensor:
        """h (N, W) -> (N, W)."""
        h = h + self.post_attention_layernorm(self.self_attn(self.input_layernorm(h), rope))
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))


class VisionEncoder(nn.Module):
    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        self.theta, self.head_dim = c.rope_theta, c.head_dim
        self.layers = nn.ModuleList(VisionLayer(c) for _ in range(c.num_layers))

    def forward(self, h: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """h (N, W), positions (N, 2) -> (N, W). RoPE's angles in fp32, cos and sin then cast, as in the text model."""
        rope = axial_rope(positions, axial_frequencies(self.theta, self.head_dim, h.device), h.dtype)
        for layer in self.layers:
            h = layer(h, rope)
        return h


# ---------------------------------------------------------------- pooling and the tower

def average_blocks(h: torch.Tensor, positions: torch.Tensor, k: int) -> torch.Tensor:
    """h (N, W), positions (N, 2) -> (M, W) in the wide dtype: the mean of each k x k block of patches. Block
    x//k + (columns/k)·(y//k) is output row-major, whatever order the patches come in; the mean is one matmul
    with a (M, N) matrix of 1/k², as transformers' pooler takes it."""
    n = h.shape[0]
    if n % k**2:
        raise ValueError(f"{n} patches do not pool into {k} x {k} blocks")
    x, y = positions.unbind(-1)  # (N,) each
    block = x // k + (x.max() + 1) // k * (y // k)  # (N,) in 0..M-1
    average = F.one_hot(block, n // k**2).to(wide(h.dtype)).T / k**2  # (M, N)
    return average @ h.to(average.dtype)  # (M, N) @ (N, W) -> (M, W)


class VisionTower(nn.Module):
    """patches and positions of one image -> its M vectors of width W (checkpoint names: VISION_PREFIX + key)."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.config = config
        self.patch_embedder = PatchEmbedder(config)
        self.encoder = VisionEncoder(config)
        if config.standardize:
            self.register_buffer("std_bias", torch.empty(config.hidden_size))
            self.register_buffer("std_scale", torch.empty(config.hidden_size))

    def forward(self, patches: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """patches (N, C) in [0, 1], positions (N, 2) long as (x, y) -> (M, W) in the weights' dtype."""
        c = self.config
        h = self.encoder(self.patch_embedder(patches, positions), positions)  # (N, W)
        f = wide(h.dtype)
        # transformers' order and roundings: the mean rounded once to the weights' dtype, then sqrt(W) and the
        # standardisation in fp32 (the scaled values may pass float16's range; the bias subtraction cancels
        # large values), then one cast back.
        pooled = average_blocks(h, positions, c.pooling_kernel_size).to(h.dtype).to(f) * c.hidden_size**0.5  # (M, W)
        if c.standardize:
            pooled = (pooled - self.std_bias.to(f)) * self.std_scale.to(f)
        return pooled.to(h.dtype)


class VisionEmbedder(nn.Module):
    """`embed_vision`: image vectors (M, out_dim) -> (M, E), ready to replace the image's soft tokens
    (checkpoint names: EMBED_PREFIX + key)."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.eps = config.rms_norm_eps
        self.embedding_projection = nn.Linear(config.out_dim, config.text_hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.embedding_projection.weight.dtype)  # a no-op on one dtype; transformers' 12B path casts here
        return self.embedding_projection(rms_norm(x, None, self.eps))  # weightless norm, then (M, out_dim) -> (M, E)
