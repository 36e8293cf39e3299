"""Sample drafting (mtp/README.md §11): the drafter's drafts drawn from its warped distribution
q, and the rejection rule that keeps the committed tokens exactly in the target's distribution p.

- Draft j of a round at newest position n is drawn from q_j with DRAFT_STREAM noise keyed at n + j
  (`Drafter.propose` with a sampler).
- d_i is kept iff u_i · q_i(d_i) < p_i(d_i), u_i a uniform keyed to d_i's position. The first
  rejection is replaced by a draw from max(0, p - q); when every draft is kept, the bonus is drawn
  from the row after the last (Leviathan et al. 2023). Every draw is keyed by (seed, stream,
  position) alone (gemma4/sampling.py), so the run is exact in distribution and repeatable.

Shape legend: B rows, K drafts, V vocab, U drafter width."""

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from gemma4.sampling import (
    ACCEPT_STREAM, GOLDEN, MASK64, TOKEN_STREAM, SamplerConfig, draw, finalise, stream_key, warp,
)

if TYPE_CHECKING:  # it imports this file: its `propose` draws here when drafting samples
    from mtp.drafter import Drafter


def keyed_uniform(seed: int, stream: int, position: int) -> float:
    """One uniform in (0, 1] for the acceptance test at `position`: the bits of token 0 in `stream`,
    computed with Python ints (the same bits gemma4.sampling's `noise` gives token 0)."""
    bits = finalise((stream_key(seed, stream, position) + GOLDEN) & MASK64)
    return ((bits >> 11) + 1) * 2.0**-53


def draft_logits(drafter: "Drafter", hn: Tensor, filler: float | None = None) -> Tensor:
    """The drafter's normed state hn (B, U) -> its logits (B, V), no softcap (greedy drafting never
    makes them: `Drafter.greedy_token`). A centroid head (§6) scores only its candidates: every
    other token gets `filler`, by default min(score) - 1, as transformers (a small non-zero
    probability); sample drafting passes -inf, so they get exactly 0 (§11)."""
    head = drafter.model.embed_tokens.weight  # (V, U)
    if not drafter.config.use_ordered_embeddings:
        return drafter.head(hn, head)
    ids, scores = drafter.masked_embedding.scored_tokens(hn, head)  # (B, N*V/C) each
    fill = float(scores.min()) - 1.0 if filler is None else filler
    out = torch.full((hn.shape[0], head.shape[0]), fill, dtype=hn.dtype, device=hn.device)
    return out.scatter_(1, ids, scores)  # (B, V)


def accept_rejection(drafts: list[int], q: list[Tensor], logits: Tensor, sampler: SamplerConfig,
                     newest: int) -> list[int]:
    """g_0..g_a by the rejection rule: q the drafter's warped rows (V,) each, logits (K+1, V) the
    verify's, `newest` the newest committed position. Strict `<`: p = 0 is never kept."""
    for i, d in enumerate(drafts):
        position = newest + 1 + i
        p = warp(logits[i], sampler)  # (V,)
        u = keyed_uniform(sampler.seed, ACCEPT_STREAM, position)
        # In float64, as the uniform.
        if not q[i][d].double() * u < p[d].double():
            # Rejected: then q(d) > p(d), so the residual is 0 at d. Unnormalised, the draw is the
            # same.
            residual = (p - q[i]).clamp(min=0)  # (V,)
            return drafts[:i] + [draw(residual, sampler.seed, TOKEN_STREAM, position)]
    # Every draft kept: the bonus is drawn from the row after the last.
    last = len(drafts)
    bonus = draw(warp(logits[last], sampler), sampler.seed, TOKEN_STREAM, newest + 1 + last)
    return drafts + [bonus]
