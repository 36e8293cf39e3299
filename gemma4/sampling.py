"""Sampling: the sampler's settings, the warp of a row of logits, and noise keyed by position.

Facts a reader must know:
- The warp runs in fp32 in transformers' order: temperature, then top-k, then top-p, then softmax.
  top-k keeps every token whose logit is >= the k-th largest (ties at the k-th all stay). top-p
  removes the tokens whose ascending cumulative probability is <= 1 - top_p. It always keeps the
  most likely one; equal logits count in id order, so the higher ids are kept first.
- Temperature 0 is greedy: the loops turn such a sampler into None once, when they start, and
  take the argmax. A tiny positive temperature sends every other token to probability 0.
- The token at position n is argmax_x p(x) / E_n(x) over the vocabulary, where the noise
  E_n(x) ~ Exp(1) is independent for every token: a draw from p (the Gumbel-max trick, in its
  exponential form). A token with p = 0 scores 0 and never wins.
- E_n(x) is a pure function of (seed, stream, n, x): the splitmix64 hash of those numbers. It never
  depends on the global RNG or on how many numbers were drawn before. So plain decoding and every
  speculative round that reaches position n draw the same token there, and speculative sampling
  with argmax drafts equals plain sampling token for token.

The engine draws the same tokens with its own rule (gemma4/engine/sampling.py): it warps only a
row's top-k candidates, and hashes on the logits' device.

Shape legend: V vocab."""

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

# Independent noise streams: the committed tokens' draws, the drafts' draws (sample drafting), the
# acceptance uniforms (sample drafting).
TOKEN_STREAM, DRAFT_STREAM, ACCEPT_STREAM = 0, 1, 2
MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment: 2^64 / golden ratio, odd
# splitmix64's finaliser: (shift, multiplier) three times
MIX = ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB), (31, 1))


@dataclass(frozen=True)
class SamplerConfig:
    temperature: float = 1.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    seed: int = 0

    def __post_init__(self) -> None:
        # NaN and inf are refused too.
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 and finite (0 is greedy), "
                             f"got {self.temperature}")
        if not (isinstance(self.top_k, int) and self.top_k >= 0):
            raise ValueError(f"top_k must be an integer >= 0 (0 turns it off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1 turns it off), got {self.top_p}")
        if not (isinstance(self.seed, int) and 0 <= self.seed < 1 << 63):
            raise ValueError(f"seed must be an integer in 0..2^63-1, got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def sampling_or_greedy(sampler: SamplerConfig | None) -> SamplerConfig | None:
    """The one place greedy is decided: None (greedy) for no sampler or temperature 0."""
    return None if sampler is None or sampler.greedy else sampler


def warp(logits: Tensor, cfg: SamplerConfig) -> Tensor:
    """One row of logits (V,) -> probabilities (V,) in fp32, in transformers' order."""
    z = logits.float()
    # Subtract the maximum first: a tiny temperature then gives -inf, never NaN.
    z = (z - z.max()) / cfg.temperature
    if 0 < cfg.top_k < z.shape[0]:
        z = z.masked_fill(z < z.topk(cfg.top_k).values[-1], float("-inf"))
    if cfg.top_p < 1:
        # A stable sort: equal logits in id order.
        ascending, order = z.sort(stable=True)
        cumulative = ascending.softmax(dim=-1).double().cumsum(dim=-1)  # (V,)
        removed = cumulative <= 1 - cfg.top_p  # (V,) a prefix of the ascending order
        removed[-1] = False  # the most likely token always stays
        z = z.masked_fill(removed.scatter(0, order, removed), float("-inf"))
    return z.softmax(dim=-1)


def finalise(z: int) -> int:
    """splitmix64's finaliser on a 64-bit Python int."""
    for shift, multiplier in MIX:
        z = ((z ^ (z >> shift)) * multiplier) & MASK64
    return z


def stream_key(seed: int, stream: int, position: int) -> int:
    """A 64-bit key from (seed, stream, position) alone: the finaliser over a sum with odd
    multipliers, so neighbouring positions and seeds get unrelated keys."""
    mixed = seed * GOLDEN + stream * 0xD1B54A32D192ED03 + position * 0xBF58476D1CE4E5B9
    return finalise(mixed & MASK64)


def noise(seed: int, stream: int, position: int, vocab: int) -> Tensor:
    """E_position(x) for every token x: (V,) float64, Exp(1) each. Token x takes the (x+1)-th output
    of a splitmix64 generator started at the position's key. numpy's uint64 wraps mod 2^64, as
    splitmix64 does."""
    z = np.uint64(stream_key(seed, stream, position))
    z = z + np.arange(1, vocab + 1, dtype=np.uint64) * np.uint64(GOLDEN)  # (V,)
    for shift, multiplier in MIX:
        z = (z ^ (z >> np.uint64(shift))) * np.uint64(multiplier)
    # The top 53 bits, plus one, times 2^-53: a uniform in (0, 1], never 0.
    uniform = ((z >> np.uint64(11)) + np.uint64(1)).astype(np.float64) * 2.0**-53
    return -torch.from_numpy(uniform).log()


def draw(weights: Tensor, seed: int, stream: int, position: int) -> int:
    """The token argmax_x weights(x) / E_position(x): a draw from weights (V,) >= 0, normalised or
    not. An exact tie goes to the lowest id."""
    scores = weights.cpu().double() / noise(seed, stream, position, weights.shape[0])
    return int(scores.argmax())


def sample(logits: Tensor, cfg: SamplerConfig, position: int, stream: int = TOKEN_STREAM) -> int:
    """The token at `position` drawn from the warped logits (V,) of the position before."""
    return draw(warp(logits, cfg), cfg.seed, stream, position)
