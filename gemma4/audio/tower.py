"""The audio tower of E2B and E4B: a conformer over log-mel frames (transformers' `Gemma4AudioModel`, after the
Universal Speech Model). One clip at a time, its valid frames only.

Facts a reader must know (transformers 5.22.2 `Gemma4AudioModel` and its parts):
- Subsampling: two 3x3 stride-2 Conv2d (padding 1, no bias) over (frames, mel bins), each followed by a LayerNorm
  over channels (weight, no bias) and ReLU; then the (mel/4 x channels) grid of each position is flattened and
  projected to W. Four frames become one position: 100 frames a second become 25.
- Each conformer layer: half-step feed-forward (x + 0.5·FFN), attention (gemma4/audio/attention.py), light conv
  (GLU, causal depthwise conv of kernel 5, SiLU), another half-step feed-forward, RMSNorm. Every RMSNorm multiplies
  by its weight directly; the feed-forward and layer norms use eps 1e-6 whatever `rms_norm_eps` says (transformers
  builds them without it), the light conv's use `rms_norm_eps`.
- Clipped linears (`use_clipped_linears`, every release): q/k/v/post, both feed-forward projections and the light
  conv's two clamp their input and output to four stored scalars. The released bounds are finite: ignoring them
  changes the output. relative_k_proj, the subsampler's projection and output_proj are plain.
- transformers clamps to +-`gradient_clipping` (1e10) before some norms: no real activation comes near; kept as
  `bounded` so float16 runs stay finite as there.
- Padding: transformers runs a batch with a frame mask. A clip's masked frames all lie at its end and every step
  here looks back only, except the 3x3 convolutions, which read one frame ahead and treat a masked frame as zero,
  as they treat the edge: so the valid frames alone give the valid positions' values, and every position is a soft
  token. Input: the valid frames of one clip (gemma4/audio/features.py `log_mel(...).features[mask]`).
- Then `output_proj` (with bias) to `output_proj_dims`; `embed_audio` (gemma4/audio/embedder.py) takes it to E.
- Size: 24W² + (9 + k)·W + W/H + 40 values per layer (k = 5 the conv kernel, 40 clip bounds), 10·c0 +
  c1·(9·c0 + 1) + W·c0/4·c1 in the subsampler, (W + 1)·O in output_proj. transformers' defaults (W 1024, 12 layers,
  8 heads, c 128 and 32, O 1536): 304,825,088 values, 480 of them bounds; then E·O in embed_audio.

Shape legend: F valid frames, M = 128 mel bins, T = ceil(ceil(F/2)/2) positions (soft tokens), W width,
c0, c1 the subsampler's channels, O = output_proj_dims.
"""

import torch
import torch.nn.functional as F
from torch import nn

from gemma4.audio.attention import AudioAttention, relative_table
from gemma4.audio.config import AudioConfig
from gemma4.norms import RMSNorm
from gemma4.vision.tower import CLIP_BOUNDS, ClippableLinear

AUDIO_PREFIX = "model.audio_tower."  # + a key of weight_table: the checkpoint's name

BLOCK_EPS = 1e-6  # the feed-forward and layer norms: transformers' Gemma4RMSNorm default, not rms_norm_eps
CLIPPED = ("feed_forward1.ffw_layer_1", "feed_forward1.ffw_layer_2", "feed_forward2.ffw_layer_1",
           "feed_forward2.ffw_layer_2", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.post",
           "lconv1d.linear_start", "lconv1d.linear_end")


# ---------------------------------------------------------------- the name table

def weight_table(c: AudioConfig) -> dict[str, tuple[int, ...]]:
    """Module key -> shape, for every tensor AudioTower owns (checkpoint name = AUDIO_PREFIX + key)."""
    w, (c0, c1), k = c.hidden_size, c.subsampling_channels, c.conv_kernel_size
    pre = "subsample_conv_projection."
    table: dict[str, tuple[int, ...]] = {
        pre + "layer0.conv.weight": (c0, 1, 3, 3), pre + "layer0.norm.weight": (c0,),
        pre + "layer1.conv.weight": (c1, c0, 3, 3), pre + "layer1.norm.weight": (c1,),
        pre + "input_proj_linear.weight": (w, c0 // 4 * c1),
        "output_proj.weight": (c.output_proj_dims, w), "output_proj.bias": (c.output_proj_dims,),
    }
    shapes = {"ffw_layer_1": (4 * w, w), "ffw_layer_2": (w, 4 * w), "linear_start": (2 * w, w)}
    for n in range(c.num_layers):
        layer = f"layers.{n}."
        for name in CLIPPED:
            table[f"{layer}{name}.linear.weight"] = shapes.get(name.rsplit(".", 1)[1], (w, w))
            if c.use_clipped_linears:
                table.update({f"{layer}{name}.{bound}": () for bound in CLIP_BOUNDS})
        table[layer + "self_attn.relative_k_proj.weight"] = (w, w)
        table[layer + "self_attn.per_dim_scale"] = (c.head_dim,)
        table[layer + "lconv1d.depthwise_conv1d.weight"] = (w, 1, k)
        for norm in ("feed_forward1.pre_layer_norm", "feed_forward1.post_layer_norm", "feed_forward2.pre_layer_norm",
                     "feed_forward2.post_layer_norm", "lconv1d.pre_layer_norm", "lconv1d.conv_norm",
                     "norm_pre_attn", "norm_post_attn", "norm_out"):
            table[f"{layer}{norm}.weight"] = (w,)
    return table


# ---------------------------------------------------------------- pieces

def bounded(x: torch.Tensor, limit: float) -> torch.Tensor:
    """transformers' clamp to +-gradient_clipping, at most the dtype's largest value."""
    bound = min(limit, torch.finfo(x.dtype).max)
    return torch.clamp(x, -bound, bound)


class SubsampleLayer(nn.Module):
    def __init__(self, channels_in: int, channels_out: int, eps: float) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels_in, channels_out, kernel_size=3, stride=2, padding=1, bias=False)
        self.norm = nn.LayerNorm(channels_out, eps=eps, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (1, channels_in, frames, bins) -> (1, channels_out, ceil(frames/2), ceil(bins/2))."""
        x = self.conv(x.to(self.conv.weight.dtype))  # (1, C_out, F', M')
        # The norm runs over the channels: (1, C_out, F', M') -> (1, F', M', C_out), normed, and back.
        x = self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        # .contiguous(): the permuted tensor is channels-last, which the next conv would take with another kernel.
        return F.relu(x).contiguous()


class Subsampler(nn.Module):
    def __init__(self, c: AudioConfig) -> None:
        super().__init__()
        c0, c1 = c.subsampling_channels
        self.layer0 = SubsampleLayer(1, c0, c.rms_norm_eps)
        self.layer1 = SubsampleLayer(c0, c1, c.rms_norm_eps)
        self.input_proj_linear = nn.Linear(c0 // 4 * c1, c.hidden_size, bias=False)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """features (F, M) -> (T, W)."""
        x = self.layer1(self.layer0(features[None, None]))  # (1, 1, F, M) -> (1, c1, T, M/4)
        x = x[0].permute(1, 2, 0).reshape(x.shape[2], -1)  # (T, M/4, c1) -> (T, M/4 * c1): channels vary fastest
        return self.input_proj_linear(x)  # (T, W)


class FeedForward(nn.Module):
    def __init__(self, c: AudioConfig) -> None:
        super().__init__()
        w, clip = c.hidden_size, c.use_clipped_linears
        self.limit, self.residual_weight = c.gradient_clipping, c.residual_weight
        self.pre_layer_norm = RMSNorm(w, BLOCK_EPS)
        self.ffw_layer_1 = ClippableLinear(w, 4 * w, clip)
        self.ffw_layer_2 = ClippableLinear(4 * w, w, clip)
        self.post_layer_norm = RMSNorm(w, BLOCK_EPS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (T, W) -> x + 0.5 * FFN(x), (T, W)."""
        h = self.ffw_layer_2(F.silu(self.ffw_layer_1(self.pre_layer_norm(bounded(x, self.limit)))))  # (T, 4W) -> (T, W)
        return x + self.post_layer_norm(bounded(h, self.limit)) * self.residual_weight


class LightConv(nn.Module):
    def __init__(self, c: AudioConfig) -> None:
        super().__init__()
        w, clip = c.hidden_size, c.use_clipped_linears
        self.limit = c.gradient_clipping
        self.pre_layer_norm = RMSNorm(w, c.rms_norm_eps)
        self.linear_start = ClippableLinear(w, 2 * w, clip)
        self.depthwise_conv1d = nn.Conv1d(w, w, c.conv_kernel_size, groups=w, bias=False)  # one filter per channel
        self.conv_norm = RMSNorm(w, c.rms_norm_eps)
        self.linear_end = ClippableLinear(w, w, clip)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (T, W) -> (T, W)."""
        h = F.glu(self.linear_start(self.pre_layer_norm(x)), dim=-1)  # (T, 2W) -> (T, W): a * sigmoid(b)
        k = self.depthwise_conv1d.kernel_size[0]
        h = F.pad(h.T[None], (k - 1, 0))  # (1, W, k - 1 + T): causal, k - 1 zero positions before the first
        h = self.depthwise_conv1d(h)[0].T  # (1, W, T) -> (T, W)
        return x + self.linear_end(F.silu(self.conv_norm(bounded(h, self.limit))))


class ConformerLayer(nn.Module):
    def __init__(self, c: AudioConfig) -> None:
        super().__init__()
        w = c.hidden_size
        self.limit = c.gradient_clipping
        self.feed_forward1 = FeedForward(c)
        self.norm_pre_attn = RMSNorm(w, BLOCK_EPS)
        self.self_attn = AudioAttention(c)
        self.norm_post_attn = RMSNorm(w, BLOCK_EPS)
        self.lconv1d = LightConv(c)
        self.feed_forward2 = FeedForward(c)
        self.norm_out = RMSNorm(w, BLOCK_EPS)

    def forward(self, h: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """h (T, W), table (R, W) -> (T, W)."""
        h = self.feed_forward1(h)
        attended = self.self_attn(self.norm_pre_attn(bounded(h, self.limit)), table)
        h = h + self.norm_post_attn(bounded(attended, self.limit))
        h = self.feed_forward2(self.lconv1d(h))
        return self.norm_out(bounded(h, self.limit))


# ---------------------------------------------------------------- the tower

class AudioTower(nn.Module):
    """The valid log-mel frames of one clip -> its T vectors of width O (checkpoint names: AUDIO_PREFIX + key)."""

    def __init__(self, config: AudioConfig) -> None:
        super().__init__()
        self.config = config
        self.subsample_conv_projection = Subsampler(config)
        self.layers = nn.ModuleList(ConformerLayer(config) for _ in range(config.num_layers))
        self.output_proj = nn.Linear(config.hidden_size, config.output_proj_dims)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """features (F, M) float, F >= 1 valid frames -> (T, O) in the weights' dtype."""
        h = self.subsample_conv_projection(features)  # (T, W)
        table = relative_table(self.config, h.dtype, h.device)  # (R, W), the same for every layer
        for layer in self.layers:
            h = layer(h, table)
        return self.output_proj(h)  # (T, O)
