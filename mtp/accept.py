"""Step 4 of a round: which drafts the target keeps, and the token it commits after them.

Each rule gets the drafts d_1..d_K and the verify's logits rows 0..K (row i: the token at position t+1+i) and returns
(a, the token committed after the a accepted drafts: the correction, or the bonus if all were kept).
- greedy (§7): g_i = argmax of row i; keep d_i while d_i == g_{i-1}. Token equality, never a probability.
- keyed (§11, argmax drafting): g_i is the keyed sample of row i at its position, exactly what plain sampling draws
  there; keep d_i while d_i == g_{i-1}. This is the rejection rule for a one-hot q.
- rejection (§11, sample drafting): keep d_i iff u_i · q_i(d_i) < p_i(d_i); the first rejection is replaced by a draw
  from max(0, p - q), the bonus drawn from the last row (Leviathan et al. 2023). Every draw is keyed by (seed,
  stream, position) alone (gemma4/sampling.py), never by how many came before."""

import torch

from gemma4.sampling import TOKEN_STREAM, ACCEPT_STREAM, SamplerConfig, candidates, keyed_choice, keyed_uniform, sample


def accept(drafts: list[int], logits: torch.Tensor, sampler: SamplerConfig | None, t: int, q: torch.Tensor | None
           ) -> tuple[int, int]:
    """The rule of this run: greedy without a sampler; the rejection rule with the drafter's q (K, V) (sample
    drafting); keyed samples otherwise. logits (K+1, V) of positions t+1..t+K+1."""
    if sampler is None:
        return accept_greedy(drafts, logits)
    if q is not None and drafts:
        return accept_rejection(drafts, q, logits, sampler, t)
    return accept_keyed(drafts, logits, sampler, t)


def cut_at_stop(block: list[int], stop_ids: list[int] | tuple[int, ...]) -> list[int]:
    """A committed block ends at its first stop id (kept): what would follow is never emitted."""
    for i, token in enumerate(block):
        if token in stop_ids:
            return block[:i + 1]
    return block


def accept_greedy(drafts: list[int], logits: torch.Tensor) -> tuple[int, int]:
    greedy = logits.argmax(dim=-1).tolist()  # g_0..g_K
    a = 0
    while a < len(drafts) and drafts[a] == greedy[a]:
        a += 1
    return a, greedy[a]


def accept_keyed(drafts: list[int], logits: torch.Tensor, sampler: SamplerConfig, t: int) -> tuple[int, int]:
    """Rows past the first mismatch are never warped or drawn: their tokens would be discarded."""
    for i in range(len(drafts) + 1):
        g = sample(logits[i:i + 1], sampler, TOKEN_STREAM, [t + 1 + i])[0]
        if i == len(drafts) or drafts[i] != g:
            return i, g


def accept_rejection(drafts: list[int], q: torch.Tensor, logits: torch.Tensor, sampler: SamplerConfig, t: int
                     ) -> tuple[int, int]:
    """q (K, V) the drafter's warped rows, p the target's (its candidates only). Strict `<`: p = 0 is never
    kept. u_i is keyed to d_i's position. A rejection draws from max(0, p - q), 0 outside p's candidates."""
    for i, d in enumerate(drafts):
        position = t + 1 + i
        ids, p = candidates(logits[i], sampler)  # (M,) each
        p_d = p[ids == d].sum()  # p(d), 0 if d is not a candidate
        if not keyed_uniform(sampler.seed, ACCEPT_STREAM, position) * float(q[i, d]) < float(p_d):
            residual = (p - q[i, ids]).clamp_(min=0)  # (M,) zero at d: rejected, so q(d) > p(d)
            return i, keyed_choice(ids, residual, sampler.seed, TOKEN_STREAM, position)  # unnormalised: same argmax
    bonus = len(drafts)  # the row after the last draft
    return bonus, sample(logits[bonus:bonus + 1], sampler, TOKEN_STREAM, [t + 1 + bonus])[0]
