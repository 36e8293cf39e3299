"""Sampling: the sampler's settings, the logit warpers, and keyed noise.

Spec: shared/spec/mtp.md §11. Facts a reader must know:
- The warpers run in fp32 in transformers' order: temperature, then top-k, then top-p, then softmax.
  top-k keeps every token whose logit is >= the k-th largest (ties at the k-th are all kept); top-p
  removes the tokens whose ascending cumulative probability is <= 1 - top_p and always keeps the most
  likely one.
- A token at absolute position n is `argmax_x p(x) / E_n(x)` with E_n ~ Exp(1) i.i.d. (the
  exponential form of the Gumbel-max trick): a draw from p. The noise E_n comes from a generator
  seeded by (seed, stream, n) alone, never from the global RNG and never from a stream whose state
  depends on how many numbers were drawn before. So a position's draw is the same in plain decoding
  and in every speculative round that reaches it: that is what makes argmax-drafted speculative
  sampling equal plain sampling token for token.
- Temperature 0 means greedy: callers take the plain argmax path, untouched; nothing here is used.

Shape legend: N rows (positions), V vocab.
"""

from dataclasses import dataclass

import torch

# Independent keyed streams: the target's draws, the drafter's draws (`sample` drafting), the
# acceptance uniforms (`sample` drafting). A position's numbers in one stream never depend on another's.
TARGET, DRAFT, UNIFORM = 0, 1, 2
MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class SamplerConfig:
    temperature: float = 1.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.temperature >= 0:  # also rejects NaN
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if not (isinstance(self.top_k, int) and self.top_k >= 0):
            raise ValueError(f"top_k must be an integer >= 0 (0 turns it off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1 turns it off), got {self.top_p}")
        if not (isinstance(self.seed, int) and 0 <= self.seed < 1 << 63):
            raise ValueError(f"seed must be an integer in 0..2^63-1, got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def warp(logits: torch.Tensor, cfg: SamplerConfig) -> torch.Tensor:
    """logits (N, V) -> probabilities (N, V) in fp32: temperature, top-k, top-p, softmax (§11).
    Tokens removed by top-k/top-p (or already -inf, like the centroid head's filler) get exactly 0."""
    x = logits.float() / cfg.temperature  # (N, V)
    if 0 < cfg.top_k < x.shape[-1]:
        kth = x.topk(cfg.top_k, dim=-1).values[:, -1:]  # (N, 1): the k-th largest logit
        x = x.masked_fill(x < kth, float("-inf"))  # ties at the k-th logit stay
    if cfg.top_p < 1:
        # Ascending order, so the removed tokens are a prefix; `stable` gives ties one fixed order.
        sorted_x, order = x.sort(dim=-1, stable=True)  # (N, V) each
        cumulative = sorted_x.softmax(dim=-1).cumsum(dim=-1)  # (N, V)
        remove = cumulative <= 1 - cfg.top_p
        remove[:, -1] = False  # the most likely token always stays
        x = x.masked_fill(remove.scatter(1, order, remove), float("-inf"))  # back to vocabulary order
    return x.softmax(dim=-1)


def stream_key(seed: int, stream: int, position: int) -> int:
    """A 64-bit generator seed from (seed, stream, position) alone: splitmix64's finaliser over a
    sum with odd multipliers, so neighbouring positions and seeds get unrelated generators."""
    z = (seed * 0x9E3779B97F4A7C15 + stream * 0xD1B54A32D192ED03 + position * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return (z ^ (z >> 31)) >> 1  # 63 bits: manual_seed takes any int, but keep it non-negative


def keyed_generator(seed: int, stream: int, position: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(stream_key(seed, stream, position))


def exponential_noise(seed: int, stream: int, positions: list[int], vocab: int) -> torch.Tensor:
    """(N, V) float64 Exp(1) noise, row i keyed by positions[i]. Drawn on the CPU, so a draw does not
    depend on the device; float64 so that no noise value rounds to 0."""
    return torch.stack([
        torch.empty(vocab, dtype=torch.float64).exponential_(generator=keyed_generator(seed, stream, n))
        for n in positions
    ])


def keyed_sample(probs: torch.Tensor, seed: int, stream: int, positions: list[int]) -> list[int]:
    """probs (N, V), row i the distribution of the token at positions[i] -> N tokens, each
    argmax p / E: a draw from p (tokens with p = 0 can never win)."""
    noise = exponential_noise(seed, stream, positions, probs.shape[-1]).to(probs.device)  # (N, V)
    return (probs.double() / noise).argmax(dim=-1).tolist()


def keyed_uniform(seed: int, stream: int, position: int) -> float:
    """One U[0, 1) float64 draw for the acceptance test at `position`."""
    return float(torch.rand((), dtype=torch.float64, generator=keyed_generator(seed, stream, position)))
