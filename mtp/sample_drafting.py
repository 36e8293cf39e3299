"""Sample drafting (mtp/README.md §11): the drafter's drafts drawn from its warped distribution q, and
the rejection rule that keeps them exactly in the target's distribution p.

- Draft j of a row at newest position n is drawn from q_j with DRAFT_STREAM noise keyed at n + j.
- d_i is kept iff u_i · q_i(d_i) < p_i(d_i), u_i a uniform keyed to d_i's position; the first
  rejection is replaced by a draw from max(0, p - q), and when every draft is kept the bonus is drawn
  from the row after the last (Leviathan et al. 2023). Every draw is keyed by (seed, stream, position)
  alone (gemma4/sampling.py), so the run is exact in distribution and repeatable.

Shape legend: B rows, K drafts, V vocab, M candidates of one row."""

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from gemma4.sampling import (
    ACCEPT_STREAM, DRAFT_STREAM, GOLDEN, MASK64, TOKEN_STREAM, SamplerConfig, Sampling, finalise,
    keyed_choice, stream_key,
)

if TYPE_CHECKING:  # it imports this file: its `propose` draws here when drafting samples
    from mtp.drafter import Drafter


def keyed_sample(rule: Sampling, probs: Tensor, seed: int, stream: int,
                 positions: list[int]) -> Tensor:
    """probs (N, V), row i the token at positions[i]'s -> (N,) tokens, not read: the keyed draws of
    `rule.sample` from probabilities already warped (the drafter's q)."""
    ids = [rule.support(row) for row in probs]  # (M_i,) each
    rows = zip(ids, probs, positions)
    return torch.cat([keyed_choice(i, row[i], seed, stream, p) for i, row, p in rows])  # (N,)


def keyed_uniform(seed: int, stream: int, position: int) -> float:
    """One uniform in (0, 1] for the acceptance test at `position`: the bits of token 0 in `stream`,
    computed on the CPU with Python ints (the same bits gemma4.sampling's keyed_bits gives)."""
    bits = finalise((stream_key(seed, stream, position) + GOLDEN) & MASK64)
    return ((bits >> 11) + 1) * 2.0**-53


def draft_logits(drafter: "Drafter", hn: Tensor, filler: float | None = None) -> Tensor:
    """The drafter's normed state hn (B, D) -> its logits (B, V), no softcap (greedy drafting never
    makes them: `Drafter.greedy_token`). A centroid head (§6) scores only its candidates: every other
    token gets `filler`, by default min(score) - 1, as transformers (a small non-zero probability);
    sample drafting passes -inf, so they get exactly 0 (§11)."""
    head = drafter.model.embed_tokens.weight  # (V, D)
    if not drafter.config.use_ordered_embeddings:
        return drafter.head(hn, head)
    ids, scores = drafter.masked_embedding.candidates(hn, head)  # (B, k*V/C) each
    fill = float(scores.min()) - 1.0 if filler is None else filler
    out = torch.full((hn.shape[0], head.shape[0]), fill, dtype=hn.dtype, device=hn.device)
    return out.scatter_(1, ids, scores)  # (B, V)


def draw_drafts(drafter: "Drafter", rule: Sampling, hn: Tensor, samplers: list[SamplerConfig],
                positions: list[int], j: int) -> tuple[Tensor, Tensor]:
    """Draft j of every row from the drafter's normed state hn (B, D): its logits warped by row b's
    sampler into q (B, V), 0 outside a centroid head's tokens, drawn with DRAFT_STREAM noise keyed at
    positions[b] + j. -> ids (B, 1), q (B, V)."""
    logits = draft_logits(drafter, hn, filler=float("-inf"))  # (B, V)
    q = torch.cat([rule.warp(logits[b:b + 1], s) for b, s in enumerate(samplers)])  # (B, V)
    rows = enumerate(zip(samplers, positions))
    ids = [keyed_sample(rule, q[b:b + 1], s.seed, DRAFT_STREAM, [p + j]) for b, (s, p) in rows]
    return torch.cat(ids)[:, None], q


def accept_rejection(rule: Sampling, drafts: list[int], q: Tensor, logits: Tensor,
                     sampler: SamplerConfig, newest: int) -> list[int]:
    """g_0..g_a by the rejection rule: q (K, V) the drafter's warped rows, p the target's (its
    candidates only), `newest` the newest committed position. Strict `<`: p = 0
    is never kept. u_i is keyed to d_i's position. A rejection draws from max(0, p - q), 0 outside
    p's candidates. Every row's test and redraw are computed, then read at once: those past the
    first rejection are discarded."""
    tests, redraws = [], []  # (1,) each: is d_i kept; the token drawn if it is not
    for i, d in enumerate(drafts):
        position = newest + 1 + i
        ids, p = rule.candidates(logits[i], sampler)  # (M,) each
        p_d = (p * (ids == d)).sum()  # p(d), 0 if d is not a candidate
        u = keyed_uniform(sampler.seed, ACCEPT_STREAM, position)
        # In float64, as the uniform.
        tests.append((q[i, d].double() * u < p_d.double()).long()[None])
        # Zero at d if rejected (then q(d) > p(d)); unnormalised: the draw is the same.
        residual = (p - q[i, ids]).clamp_(min=0)  # (M,)
        redraws.append(keyed_choice(ids, residual, sampler.seed, TOKEN_STREAM, position))
    last = newest + 1 + len(drafts)  # the bonus's position
    ids, p = rule.candidates(logits[len(drafts)], sampler)
    bonus = keyed_choice(ids, p, sampler.seed, TOKEN_STREAM, last)
    read = torch.cat([*tests, *redraws, bonus]).tolist()  # K tests (0 or 1), K redraws, the bonus
    a = read.index(0) if 0 in read[:len(drafts)] else len(drafts)
    # The bonus follows the last draft's redraw: read[K + a] is the redraw of d_(a+1), or the bonus.
    return drafts[:a] + [read[len(drafts) + a]]
