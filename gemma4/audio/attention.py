"""The audio tower's self-attention: each position sees itself and the C - 1 before it (C = 12 positions, 480 ms),
with relative-position logits and a tanh cap; computed in blocks of C queries, as transformers computes it.

Facts a reader must know (transformers 5.22.2 `Gemma4AudioAttention`, `Gemma4AudioRelPositionalEncoding`, and the
mask `Gemma4AudioModel.forward` builds):
- Blocks: queries go in blocks of C; block b holds positions bC .. bC + C - 1 and its keys are the 2C positions
  bC - C .. bC + C - 1 (the block before and its own). Query i of a block sees key slot j when the key lies 0 to
  C - 1 positions back (i < j <= i + C) and is a real position (not before 0). Keys ahead are never seen: a
  position's output does not depend on later audio.
- Logit of query q and key k at distance d = q - k: (q . k) + (q . r_d), r_d = relative_k_proj of a sinusoidal
  table row for d ([sin | cos] of d / 10000^(i / (W/2 - 1))). The table has rows d = C .. 0; row C is never seen.
- Scales: q times D^-1/2 / ln 2 times softplus(per_dim_scale), a learned factor per head channel (softplus(0) =
  ln 2 gives plain D^-1/2); k times ln(1 + e) / ln 2 = 1.89. No other 1/sqrt(D).
- Then the cap 50·tanh(x / 50); keys not seen get -1e9 (after the cap); softmax over the 2C slots; no dropout.
- From the q/k/v projections' outputs to the output projection's input the math runs in fp32 whatever the weights'
  dtype (float64 for float64 models), as transformers'.
- The sinusoidal table: inverse timescales in fp32, rounded to the weights' dtype; distance x timescale, sin and cos
  in the weights' dtype (transformers' buffer is cast with the model: in bf16 the angles are rounded).

Shape legend: T positions (after subsampling), W width, H heads, D = W / H, C block size, B = ceil(T / C) blocks,
R = C + 1 table rows.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from gemma4.audio.config import AudioConfig
from gemma4.norms import wide
from gemma4.vision.tower import ClippableLinear  # transformers shares one clipped linear between the towers

MAX_TIMESCALE = 10_000.0


def relative_table(c: AudioConfig, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(R, W) sinusoids of the distances C, C - 1, .. 0, in this order (transformers' row order)."""
    half = c.hidden_size // 2
    increment = math.log(MAX_TIMESCALE) / max(half - 1, 1)
    inverse = torch.exp(torch.arange(half, dtype=torch.float32) * -increment).to(device, dtype)  # (W/2,)
    distance = torch.arange(c.chunk_size, -1, -1, device=device)  # (R,) C .. 0
    angle = distance[:, None] * inverse  # (R, 1) * (W/2,) -> (R, W/2) in dtype
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1)  # (R, W)


def visible(chunk: int, blocks: int, device: torch.device) -> torch.Tensor:
    """(B, C, 2C) bool: query i of block b sees key slot j (position bC - C + j)."""
    i = torch.arange(chunk, device=device)[:, None]  # (C, 1) query slot
    j = torch.arange(2 * chunk, device=device)  # (2C,) key slot
    back = i + chunk - j  # (C, 2C) how far back the key lies
    window = (back >= 0) & (back < chunk)  # (C, 2C) itself and the C - 1 before it
    first = torch.arange(blocks, device=device)[:, None, None] * chunk - chunk  # (B, 1, 1) position of slot 0
    return window & (first + j >= 0)  # (B, C, 2C): keys before position 0 are padding


class AudioAttention(nn.Module):
    def __init__(self, c: AudioConfig) -> None:
        super().__init__()
        w, clip = c.hidden_size, c.use_clipped_linears
        self.heads, self.head_dim, self.chunk = c.num_heads, c.head_dim, c.chunk_size
        self.cap, self.invalid = c.logit_cap, c.invalid_logit
        self.q_proj = ClippableLinear(w, w, clip)
        self.k_proj = ClippableLinear(w, w, clip)
        self.v_proj = ClippableLinear(w, w, clip)
        self.post = ClippableLinear(w, w, clip)
        self.relative_k_proj = nn.Linear(w, w, bias=False)
        self.per_dim_scale = nn.Parameter(torch.empty(c.head_dim))

    def forward(self, x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """x (T, W), table (R, W) from relative_table -> (T, W)."""
        t, h, d, c = x.shape[0], self.heads, self.head_dim, self.chunk
        f = wide(x.dtype)
        q = self.q_proj(x).to(f).view(t, h, d)  # (T, H, D)
        k = self.k_proj(x).to(f).view(t, h, d)  # (T, H, D)
        v = self.v_proj(x).to(f).view(t, h, d)  # (T, H, D)
        q = q * (d**-0.5 / math.log(2)) * F.softplus(self.per_dim_scale)  # softplus in the weights' dtype, as TF
        k = k * (math.log(1 + math.e) / math.log(2))

        blocks = -(-t // c)
        end = blocks * c - t  # zero positions that fill the last block
        q = F.pad(q, (0, 0, 0, 0, 0, end)).view(blocks, c, h, d)  # (B, C, H, D)

        def keys(y: torch.Tensor) -> torch.Tensor:
            """(T, H, D) -> (B, 2C, H, D): C zero positions before 0, then windows of 2C every C."""
            y = F.pad(y, (0, 0, 0, 0, c, end)).unfold(0, 2 * c, c)  # (T + C + end, H, D) -> (B, H, D, 2C)
            return torch.movedim(y, -1, 1).contiguous()  # (B, 2C, H, D), as transformers lays it out

        k, v = keys(k), keys(v)
        q = q.permute(2, 0, 1, 3)  # (H, B, C, D)
        content = q @ k.permute(2, 0, 3, 1)  # (H, B, C, D) @ (H, B, D, 2C) -> (H, B, C, 2C)

        relative = self.relative_k_proj(table).view(-1, h, d).to(f)  # (R, W) -> (R, H, D)
        by_distance = q.reshape(h, blocks * c, d) @ relative.permute(1, 2, 0)  # (H, B*C, D) @ (H, D, R) -> (H, B*C, R)
        by_distance = by_distance.view(h, blocks, c, c + 1)  # (H, B, C, R)
        # Slot j of query i lies d = i + C - j back: table row C - d = j - i. Slots outside 0..C are never seen
        # (any row serves; the mask below replaces them).
        row = (torch.arange(2 * c, device=x.device) - torch.arange(c, device=x.device)[:, None]).clamp(0, c)  # (C, 2C)
        position = torch.gather(by_distance, -1, row.expand(h, blocks, c, 2 * c))  # (H, B, C, 2C)

        logits = content + position  # (H, B, C, 2C)
        logits = torch.tanh(logits / self.cap) * self.cap
        logits = logits.masked_fill(~visible(c, blocks, x.device), self.invalid)  # (B, C, 2C) broadcast over H
        probs = torch.softmax(logits, dim=-1)  # (H, B, C, 2C) in f
        out = probs @ v.permute(2, 0, 1, 3)  # (H, B, C, 2C) @ (H, B, 2C, D) -> (H, B, C, D)
        out = out.permute(1, 2, 0, 3).reshape(blocks * c, h * d)[:t]  # (B, C, H, D) -> (B*C, W) -> (T, W)
        return self.post(out.to(x.dtype))
