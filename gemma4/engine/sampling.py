"""The engine's sampling rule: the textbook's draws (gemma4/sampling.py), made fast on a 262k-token
vocabulary and on a device.

- A row is warped into its *candidates*: ids and their probabilities, every token that can still be
  drawn. With top-k, the warp runs on the k largest logits alone (a 262k-token row is sorted only
  without top-k), and only the ids with p > 0 are kept. The tokens are the textbook's: the others
  would add probability 0, and top-k keeps all of them again.
- The noise is the textbook's splitmix64, emulated in int64 tensor ops on the logits' device, for
  the candidates only (the bits are the same on every device): int64 arithmetic wraps like uint64,
  and a logical right shift is an arithmetic one with the sign-filled bits masked off.
- Each model may hold its own rule (`rule_of`). Picking ids out (`support`) reads the device: off
  the CPU the speed layer gives that model a rule that keeps every id, p = 0 never winning
  (gemma4/fast/sampling.py).

Shape legend: N rows (positions), V vocab, M candidates of one row."""

from collections.abc import Iterator

import torch
from torch import Tensor

from gemma4.sampling import (  # noqa: F401 (the streams and the hash: importable here, beside the rule)
    ACCEPT_STREAM, DRAFT_STREAM, GOLDEN, MASK64, MIX, TOKEN_STREAM, SamplerConfig, finalise, stream_key,
)
from gemma4.generate import NonFiniteLogits, choosable
from gemma4.sampling import warp as warp_row

# ---------------------------------------------------------------- warping


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
            # A row with a NaN is drawn from zeros (no read to ask which), its token then NOT_FINITE.
            finite = choosable(x)
            ids, probs = self.candidates(torch.where(finite, x, 0.0), cfg)
            token = keyed_choice(ids, probs, cfg.seed, stream, position)
            tokens.append(torch.where(finite, token, NOT_FINITE))
        return torch.cat(tokens).tolist()

    def draws(self, logits: Tensor, cfg: SamplerConfig, stream: int,
              positions: list[int]) -> Iterator[int]:
        """`sample`'s tokens one at a time, each drawn when asked for: no row past a verify's first
        mismatch."""
        return (self.sample(logits[i:i + 1], cfg, stream, [p])[0] for i, p in enumerate(positions))


# The token a row gets where its logits hold a NaN or +inf: computed on the device beside the
# token (no read of its own) and refused where the tokens are read (`refuse_marked`).
NOT_FINITE = -1


def finite_argmax(logits: Tensor) -> Tensor:
    """logits (..., V) -> (...,) the argmax, or NOT_FINITE in a row no token can be chosen from (a NaN or
    +inf: gemma4/generate.py `choosable`)."""
    return torch.where(choosable(logits), logits.argmax(dim=-1), NOT_FINITE)


def refuse_marked(tokens: list[int], what: str) -> None:
    """gemma4/generate.py's NonFiniteLogits where a token read is NOT_FINITE: `what` names the step."""
    if NOT_FINITE in tokens:
        raise NonFiniteLogits(what)


# A model's rule unless the speed layer gives it another; its methods are this module's functions
# too.
RULE = Sampling()
candidates, warp, sample = RULE.candidates, RULE.warp, RULE.sample


def rule_of(model: object) -> Sampling:
    """The rule a model's tokens are drawn by: its own (`model.sampling`, set by the speed layer off
    the CPU), else RULE."""
    return getattr(model, "sampling", RULE)


# ---------------------------------------------------------------- keyed noise


def signed(z: int) -> int:
    """A 64-bit pattern as the int64 that holds it (torch takes no Python int >= 2^63)."""
    return z - (1 << 64) if z >= 1 << 63 else z


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
