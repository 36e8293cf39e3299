"""Sampling: the sampler's settings, the logit warpers, and keyed noise.

Facts a reader must know:
- The warpers run in fp32 in transformers' order: temperature, then top-k, then top-p, then softmax.
  top-k keeps every token whose logit is >= the k-th largest (ties at the k-th are all kept); top-p
  removes the tokens whose ascending cumulative probability is <= 1 - top_p and always keeps the
  most likely one (equal logits in id order, as a stable sort puts them: the higher ids are kept
  first).
- A row is warped into its *candidates*: ids and their probabilities, every token that can still be
  drawn among them. `warp_row` is the rule on the whole row; `candidates` runs it on the k largest
  logits alone when top-k is set (a 262k-token row is sorted only without top-k) and keeps the ids
  with p > 0. `warp` scatters into (N, V).
- Each model holds its rule, a `Sampling` (`model.sampling`). Picking ids out (`support`) reads the
  device: off the CPU the speed layer gives that model a rule that keeps every id, p = 0 never
  winning (gemma4/fast/sampling.py).
- The temperature divides logits minus the row's maximum: a positive T far below fp32's range then
  sends every other token to -inf (probability 0) instead of computing inf - inf, so T -> 0 behaves
  as its limit, the argmax. T = 0 itself is greedy: callers take the plain argmax path, and nothing
  here is used.
- A token at absolute position n is `argmax_x p(x) / E_n(x)` over the candidates, E_n(x) ~ Exp(1)
  i.i.d. (the exponential form of the Gumbel-max trick): a draw from p. E_n(x) is a pure function of
  (seed, stream, n, x): splitmix64 counter-based hashing in int64 tensor ops on the logits' device,
  for the candidates only (the bits are the same on every device). It never depends on the other
  candidates, the global RNG, or how many numbers were drawn before: so a position's draw is the
  same in plain decoding and in every speculative round that reaches it, and argmax-drafted
  speculative sampling equals plain sampling token for token.

Shape legend: N rows (positions), V vocab, M candidates of one row."""

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

# Independent noise streams: the committed tokens' draws, the drafts' draws (`sample` drafting), the
# acceptance uniforms (`sample` drafting). A position's numbers in one stream never depend on
# another's.
TOKEN_STREAM, DRAFT_STREAM, ACCEPT_STREAM = 0, 1, 2
MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment: 2^64 / golden ratio, odd
# Splitmix64's finaliser: (shift, multiplier)
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


# ---------------------------------------------------------------- warping


def warp_row(x: Tensor, cfg: SamplerConfig) -> Tensor:
    """One row of logits (V,) -> probabilities (V,) fp32 over the whole row, in transformers' order.
    """
    z = x.float()
    # The maximum first: a tiny T gives -inf, never NaN.
    z = (z - z.max()) / cfg.temperature
    if 0 < cfg.top_k < z.shape[0]:
        # Ties at the k-th logit stay.
        z = z.masked_fill(z < z.topk(cfg.top_k).values[-1], float("-inf"))
    if cfg.top_p < 1:
        # Equal logits in id order: the higher ids come later.
        ascending, order = z.sort(stable=True)
        cumulative = ascending.softmax(dim=-1).double().cumsum(dim=-1)  # (V,)
        removed = cumulative <= 1 - cfg.top_p  # (V,) a prefix
        # The most likely token always stays; then back to id order.
        removed[-1] = False
        z = z.masked_fill(removed.scatter(0, order, removed), float("-inf"))
    return z.softmax(dim=-1)


class Sampling:
    """How a model's logits become tokens: candidates picked out (`support`), warped, drawn with
    keyed noise. Each `support` is a read of the device (the speed layer's rule for a GPU reads
    none)."""

    def support(self, x: Tensor) -> Tensor:
        """x (M,), bool or probabilities -> the indices where x is nonzero."""
        return x.nonzero().flatten()

    def candidates(self, logits: Tensor, cfg: SamplerConfig) -> tuple[Tensor, Tensor]:
        """One row of logits (V,) -> ids (M,) ascending and their probabilities (M,). With top-k,
        `warp_row` runs on the logits >= the k-th largest alone (their maximum, order and top-p sums
        are the whole row's: the others would add probability 0, and top-k again keeps all of them).
        """
        ids = torch.arange(logits.shape[0], device=logits.device)  # (V,)
        if 0 < cfg.top_k < logits.shape[0]:
            # (M,) ties at the k-th stay
            ids = self.support(logits >= logits.topk(cfg.top_k).values[-1])
        probs = warp_row(logits[ids], cfg)  # (M,)
        kept = self.support(probs)
        return ids[kept], probs[kept]

    def warp(self, logits: Tensor, cfg: SamplerConfig) -> Tensor:
        """logits (N, V) -> probabilities (N, V) in fp32: each row's candidates, 0 everywhere else.
        """
        out = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)  # (N, V)
        for row, x in zip(out, logits):
            ids, probs = self.candidates(x, cfg)
            row[ids] = probs
        return out

    def sample(self, logits: Tensor, cfg: SamplerConfig, stream: int,
               positions: list[int]) -> list[int]:
        """logits (N, V), row i the token at positions[i] -> N tokens: warp and draw, candidates
        only, all read at once."""
        tokens = []  # (1,) each until the read
        for x, position in zip(logits, positions):
            ids, probs = self.candidates(x, cfg)
            tokens.append(keyed_choice(ids, probs, cfg.seed, stream, position))
        return torch.cat(tokens).tolist()

    def draws(self, logits: Tensor, cfg: SamplerConfig, stream: int,
              positions: list[int]) -> Iterator[int]:
        """`sample`'s tokens one at a time, each drawn when asked for: no row past a verify's first
        mismatch."""
        return (self.sample(logits[i:i + 1], cfg, stream, [p])[0] for i, p in enumerate(positions))


# A model's rule unless the speed layer gives it another; its methods are this module's functions
# too.
TEXTBOOK = Sampling()
candidates, warp, sample = TEXTBOOK.candidates, TEXTBOOK.warp, TEXTBOOK.sample


# ---------------------------------------------------------------- keyed noise


def signed(z: int) -> int:
    """A 64-bit pattern as the int64 that holds it (torch takes no Python int >= 2^63)."""
    return z - (1 << 64) if z >= 1 << 63 else z


def finalise(z: int) -> int:
    """splitmix64's finaliser on a Python int: the reference the tensor version is tested against.
    """
    for shift, multiplier in MIX:
        z = ((z ^ (z >> shift)) * multiplier) & MASK64
    return z


def stream_key(seed: int, stream: int, position: int) -> int:
    """A 64-bit key from (seed, stream, position) alone: splitmix64's finaliser over a sum with odd
    multipliers, so neighbouring positions and seeds get unrelated keys."""
    mixed = seed * GOLDEN + stream * 0xD1B54A32D192ED03 + position * 0xBF58476D1CE4E5B9
    return finalise(mixed & MASK64)


def keyed_bits(seed: int, stream: int, position: int, ids: Tensor) -> Tensor:
    """ids (M,) -> (M,) int64 holding the 64 random bits of each token: the (x+1)-th output of a
    splitmix64 generator started at the position's key, i.e. finalise(key + (x+1) * GOLDEN). int64
    arithmetic wraps like uint64 (the bits are the same); a logical right shift is an arithmetic one
    with the sign-filled bits masked off."""
    z = ids.long() * signed(GOLDEN)  # (M,) wraps mod 2^64
    z.add_(signed((stream_key(seed, stream, position) + GOLDEN) & MASK64))
    shifted = torch.empty_like(z)
    for shift, multiplier in MIX:
        torch.bitwise_right_shift(z, shift, out=shifted).bitwise_and_((1 << (64 - shift)) - 1)
        z.bitwise_xor_(shifted)
        if multiplier != 1:
            z.mul_(signed(multiplier))
    return z


def uniform_from_bits(z: Tensor) -> Tensor:
    """(M,) int64 bits, overwritten -> (M,) float64 in (0, 1]: the top 53 bits plus one, times 2^-53
    (never 0)."""
    return z.bitwise_right_shift_(11).bitwise_and_((1 << 53) - 1).add_(1).double().mul_(2.0**-53)


def exponential_noise(seed: int, stream: int, position: int, ids: Tensor) -> Tensor:
    """(M,) float64 Exp(1) noise E_position(x) of the tokens ids (M,), on their device: -log(u)."""
    return uniform_from_bits(keyed_bits(seed, stream, position, ids)).log_().neg_()


def keyed_choice(ids: Tensor, weights: Tensor, seed: int, stream: int, position: int) -> Tensor:
    """argmax over the candidates ids (M,), ascending, of weight / E: a draw from weights (M,) >= 0,
    normalised or not. An exact tie goes to the first maximum: the lowest id. -> (1,) on their
    device, not read (a read waits)."""
    # (M,) float64: the noise's dtype wins
    score = weights / exponential_noise(seed, stream, position, ids)
    return ids[score.argmax(dim=0, keepdim=True)]  # (1,)
