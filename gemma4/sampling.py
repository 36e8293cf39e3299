"""Sampling: the sampler's settings, the logit warpers, and keyed noise.

Facts a reader must know:
- The warpers run in fp32 in transformers' order: temperature, then top-k, then top-p, then softmax.
  top-k keeps every token whose logit is >= the k-th largest (ties at the k-th are all kept); top-p
  removes the tokens whose ascending cumulative probability is <= 1 - top_p and always keeps the most
  likely one (equal logits in id order, as a stable sort puts them: the higher ids are kept first).
- A row is warped into its *candidates*: the ids that can still be drawn, and their probabilities
  (a token removed by top-k/top-p, or -inf like the centroid head's filler, is not one). With top-k
  set, only the tokens at or above the k-th logit are ever touched (a row of the real vocabulary is
  never sorted or soft-maxed whole) and top-p runs on those alone; with top-k 0, top-p adds up the mass
  of value slices on the CPU instead of sorting the row, and sorts it on other devices (cheap there, and
  the same sums in the same order every time). `warp` scatters the candidates back into (N, V).
- The temperature divides logits minus the row's maximum: a positive T far below fp32's range then
  sends every other token to -inf (probability 0) instead of computing inf - inf, so T -> 0 behaves as
  its limit, the argmax.
- A token at absolute position n is `argmax_x p(x) / E_n(x)` over the candidates, E_n(x) ~ Exp(1) i.i.d.
  (the exponential form of the Gumbel-max trick): a draw from p. E_n(x) is a pure function of
  (seed, stream, n, x): splitmix64 counter-based hashing in int64 tensor ops on the logits' device, for
  the candidates only (the bits are the same on every device). It never depends on the other candidates,
  the global RNG, or how many numbers were drawn before: so a position's draw is the same in plain
  decoding and in every speculative round that reaches it, and argmax-drafted speculative sampling
  equals plain sampling token for token.
- Temperature 0 means greedy: callers take the plain argmax path, untouched; nothing here is used.

Shape legend: N rows (positions), V vocab, M candidates of one row.
"""

import math
from dataclasses import dataclass

import torch

# Independent noise streams: the committed tokens' draws, the drafts' draws (`sample` drafting), the
# acceptance uniforms (`sample` drafting). A position's numbers in one stream never depend on another's.
TOKEN_STREAM, DRAFT_STREAM, ACCEPT_STREAM = 0, 1, 2
MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment: 2^64 / golden ratio, odd
MIX = ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB), (31, 1))  # splitmix64's finaliser: (shift, multiplier)
CHUNK = 64  # top-k's first pass takes the maximum of every CHUNK consecutive logits
SMALL = 2048  # top-p sorts a working set this small; a larger one is first cut into value slices
BINS = 1024  # top-p's value slices per pass
UNDERFLOW = 104.0  # softmax gives 0 in fp32 below z = -104 (z <= 0): slices need not reach lower


@dataclass(frozen=True)
class SamplerConfig:
    temperature: float = 1.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    seed: int = 0

    def __post_init__(self) -> None:
        if not math.isfinite(self.temperature) or self.temperature < 0:  # NaN and inf included
            raise ValueError(f"temperature must be >= 0 and finite (0 is greedy), got {self.temperature}")
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


def top_k_ids(x: torch.Tensor, k: int) -> torch.Tensor:
    """x (V,) -> the ids (M,) ascending of every finite logit >= the k-th largest, ties included.

    In two passes, so that the whole row is only read, never sorted: the maxima of CHUNK-long chunks
    first. At least k chunks have a maximum >= the k-th largest maximum, so the k-th largest logit is
    >= it too: only the chunks whose maximum reaches it can hold a candidate."""
    v = x.shape[0]
    if v % CHUNK or v // CHUNK < 2 * k:  # too few chunks to gain anything: one pass
        ids = torch.arange(v, device=x.device)
    else:
        maxima = x.view(-1, CHUNK).amax(dim=1)  # (V/CHUNK,)
        chunks = (maxima >= maxima.topk(k).values[-1]).nonzero()  # (C, 1): at least k chunks
        ids = (chunks * CHUNK + torch.arange(CHUNK, device=x.device)).flatten()  # (C*CHUNK,) ascending
    vals = x[ids]
    kth = vals.topk(k).values[-1]
    return ids[(vals >= kth) & (vals > float("-inf"))]  # -inf: probability 0 anyway (the centroid filler)


def top_p_keep(z: torch.Tensor, top_p: float) -> torch.Tensor:
    """z (M,) scaled logits of candidates in ascending id order -> a mask (M,) of the ones top-p keeps.

    The rule as a stable ascending sort reads it: a token goes when the mass at or below it (equal
    values: lower ids below) is <= 1 - top_p; sums in float64. On the CPU a large set is never sorted: one pass
    adds up the mass of BINS equal value slices; the slices above the one where the mass below
    passes 1 - top_p are kept whole, those under it removed whole, and only that slice is looked at
    again (slices never split equal values)."""
    p = z.softmax(dim=-1)  # (M,)
    pos, w, wp = None, z, p  # the undecided tokens: positions (None: all), values, probabilities
    below = 0.0  # mass of the tokens under them, all removed
    while len(w) > SMALL and z.device.type == "cpu":  # elsewhere scatter_add_ sums in varying order: sort
        hi, lo = float(w.max()), max(float(w.min()), -UNDERFLOW)  # z <= 0: the maximum is 0
        if lo == hi:
            break  # all equal: the exact pass below orders them by id
        slices = w.mul(-(BINS - 1) / (hi - lo)).add_(hi * (BINS - 1) / (hi - lo)).long().clamp_(max=BINS - 1)
        mass = wp.new_zeros(BINS).scatter_add_(0, slices, wp).double()  # (BINS,) slice 0: the top
        under = mass.flip(0).cumsum(dim=0).flip(0) - mass + below  # (BINS,) mass under each slice
        b = int((under > 1 - top_p).sum())  # the top slice with <= 1 - top_p under it: the boundary
        below = float(under[b])  # slices above b are kept whole: more than 1 - top_p under any token
        inside = (slices == b).nonzero().flatten()  # slices under b go: at most under[b] at or below
        pos, w, wp = inside if pos is None else pos[inside], w[inside], wp[inside]
    if pos is None:
        pos = torch.arange(len(z), device=z.device)
    ranked = pos[w.sort(stable=True).indices]  # (W,) ascending value, ties by ascending id
    removed = p[ranked].double().cumsum(dim=0) + below <= 1 - top_p  # (W,)
    removed[-1] = False  # the most likely token always stays
    keep = z > w.max()  # (M,) everything above the last slice is kept
    keep[ranked[~removed]] = True
    return keep


def candidates(logits: torch.Tensor, cfg: SamplerConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """One row of logits (V,) -> its candidates: ids (M,) ascending and probabilities (M,) fp32.
    Temperature, top-k, top-p, softmax (the order of the docstring above). Every other token has
    probability 0; a candidate may have 0 too (underflow far below the maximum), and then never wins."""
    x, v = logits, logits.shape[0]  # in the model's dtype: only the candidates are cast to fp32
    if 0 < cfg.top_k < v:
        ids = top_k_ids(x, cfg.top_k)
    elif float(x.min()) > float("-inf"):
        ids = torch.arange(v, device=x.device)
    else:
        ids = (x > float("-inf")).nonzero().flatten()  # the centroid head's filler: probability 0
    vals = (x if len(ids) == v else x[ids]).float()  # (M,): every token needs no gather
    z = (vals - vals.max()) / cfg.temperature  # max subtracted first: a tiny T gives -inf, never NaN
    if cfg.top_p < 1:
        kept = top_p_keep(z, cfg.top_p).nonzero().flatten()  # (M',) positions, ascending
        ids, z = (kept if len(ids) == v else ids[kept]), z[kept]  # every token: ids[i] == i
    return ids, z.softmax(dim=-1)  # a tiny T underflows all but the maximum to probability 0


def warp(logits: torch.Tensor, cfg: SamplerConfig) -> torch.Tensor:
    """logits (N, V) -> probabilities (N, V) in fp32: the candidates of each row, 0 everywhere else
    (tokens removed by top-k/top-p, or already -inf like the centroid head's filler, get exactly 0)."""
    out = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)  # (N, V)
    for row, x in zip(out, logits):
        ids, probs = candidates(x, cfg)
        row[ids] = probs
    return out


# ---------------------------------------------------------------- keyed noise


def signed(z: int) -> int:
    """A 64-bit pattern as the int64 that holds it (torch takes no Python int >= 2^63)."""
    return z - (1 << 64) if z >= 1 << 63 else z


def finalise(z: int) -> int:
    """splitmix64's finaliser on a Python int: the reference the tensor version is tested against."""
    for shift, multiplier in MIX:
        z = ((z ^ (z >> shift)) * multiplier) & MASK64
    return z


def stream_key(seed: int, stream: int, position: int) -> int:
    """A 64-bit key from (seed, stream, position) alone: splitmix64's finaliser over a sum with odd
    multipliers, so neighbouring positions and seeds get unrelated keys."""
    return finalise((seed * GOLDEN + stream * 0xD1B54A32D192ED03 + position * 0xBF58476D1CE4E5B9) & MASK64)


def keyed_bits(seed: int, stream: int, position: int, ids: torch.Tensor) -> torch.Tensor:
    """ids (M,) -> (M,) int64 holding the 64 random bits of each token: the (x+1)-th output of a
    splitmix64 generator started at the position's key, i.e. finalise(key + (x+1) * GOLDEN).
    int64 arithmetic wraps like uint64 (the bits are the same); a logical right shift is an
    arithmetic one with the sign-filled bits masked off."""
    z = ids.long() * signed(GOLDEN)  # (M,) wraps mod 2^64
    z.add_(signed((stream_key(seed, stream, position) + GOLDEN) & MASK64))
    shifted = torch.empty_like(z)
    for shift, multiplier in MIX:
        torch.bitwise_right_shift(z, shift, out=shifted).bitwise_and_((1 << (64 - shift)) - 1)
        z.bitwise_xor_(shifted)
        if multiplier != 1:
            z.mul_(signed(multiplier))
    return z


def uniform_from_bits(z: torch.Tensor) -> torch.Tensor:
    """(M,) int64 bits, overwritten -> (M,) float64 in (0, 1]: the top 53 bits plus one, times 2^-53
    (never 0)."""
    return z.bitwise_right_shift_(11).bitwise_and_((1 << 53) - 1).add_(1).double().mul_(2.0**-53)


def exponential_noise(seed: int, stream: int, position: int, ids: torch.Tensor) -> torch.Tensor:
    """(M,) float64 Exp(1) noise E_position(x) of the tokens ids (M,), on their device: -log(u)."""
    return uniform_from_bits(keyed_bits(seed, stream, position, ids)).log_().neg_()


def keyed_choice(ids: torch.Tensor, weights: torch.Tensor, seed: int, stream: int, position: int) -> int:
    """argmax over the candidates ids (M,), ascending, of weight / E: a draw from weights (M,) >= 0,
    normalised or not. An exact tie goes to the first maximum: the lowest id."""
    score = weights / exponential_noise(seed, stream, position, ids)  # (M,) float64: the noise's dtype wins
    return int(ids[score.max(dim=0).indices])


def sample(logits: torch.Tensor, cfg: SamplerConfig, stream: int, positions: list[int]) -> list[int]:
    """logits (N, V), row i the token at positions[i] -> N tokens: warp and draw, candidates only."""
    return [keyed_choice(*candidates(x, cfg), cfg.seed, stream, n) for x, n in zip(logits, positions)]


def keyed_sample(probs: torch.Tensor, seed: int, stream: int, positions: list[int]) -> list[int]:
    """probs (N, V), row i the distribution of the token at positions[i] -> N tokens, each
    argmax p / E over the tokens with p > 0. The same token `sample` draws from warped logits."""
    out = []
    for row, n in zip(probs, positions):
        ids = row.nonzero().flatten()  # (M,)
        out.append(keyed_choice(ids, row[ids], seed, stream, n))
    return out


def keyed_uniform(seed: int, stream: int, position: int) -> float:
    """One uniform in (0, 1] for the acceptance test at `position`: the bits of token 0 in `stream`,
    computed on the CPU with Python ints (the same bits keyed_bits gives)."""
    bits = finalise((stream_key(seed, stream, position) + GOLDEN) & MASK64)
    return ((bits >> 11) + 1) * 2.0**-53
