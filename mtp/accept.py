"""Step 4 of a round: which drafts the target keeps, and the token it commits after them.

Each rule gets the drafts d_1..d_K and the verify's logits rows 0..K (row i chooses the token at position n+1+i)
and returns g_0..g_a: the target's token at rows 0..a, where d_i == g_(i-1) for every i <= a. The round commits
d_1..d_a and g_a: the correction, or the bonus token when every draft was kept.
- greedy (§7): g_i is the argmax of row i. Token equality, never a probability.
- keyed (§11, argmax drafting): g_i is the keyed sample of row i at its position, exactly what plain sampling draws
  there. This is the rejection rule for a one-hot q.
- rejection (§11, sample drafting): keep d_i iff u_i · q_i(d_i) < p_i(d_i); the first rejection is replaced by a draw
  from max(0, p - q), the bonus drawn from the last row (Leviathan et al. 2023). Every draw is keyed by (seed,
  stream, position) alone (gemma4/sampling.py), never by how many came before.
The sampling rules draw with the target's own rule (`target.sampling`: `rule` here)."""

from collections.abc import Iterable

import torch

from gemma4.sampling import ACCEPT_STREAM, TOKEN_STREAM, SamplerConfig, Sampling, keyed_choice, keyed_uniform


def accept(rule: Sampling, drafts: list[int], logits: torch.Tensor, sampler: SamplerConfig | None,
           n: int, q: torch.Tensor | None) -> list[int]:
    """g_0..g_a by the rule of this run: greedy without a sampler, the rejection rule with the drafter's
    q (K, V) (sample drafting), keyed samples otherwise. logits (K+1, V) choose positions n+1..n+K+1, n the newest
    committed position."""
    if sampler is None:
        return agree(drafts, logits.argmax(dim=-1).tolist())
    if q is not None and drafts:
        return accept_rejection(rule, drafts, q, logits, sampler, n)
    positions = list(range(n + 1, n + len(drafts) + 2))
    return agree(drafts, rule.draws(logits, sampler, TOKEN_STREAM, positions))


def agree(drafts: list[int], tokens: Iterable[int]) -> list[int]:
    """The target's tokens g_0, g_1, ... taken while d_i == g_(i-1): the last one taken is the target's own."""
    taken = []
    for g in tokens:
        taken.append(g)
        if len(taken) > len(drafts) or drafts[len(taken) - 1] != g:
            return taken
    raise ValueError(f"{len(drafts)} drafts need {len(drafts) + 1} target tokens, got {len(taken)}")


def cut_at_stop(block: list[int], stop_ids: Iterable[int]) -> list[int]:
    """A committed block ends at its first stop id (kept): what would follow is never emitted."""
    for i, token in enumerate(block):
        if token in stop_ids:
            return block[:i + 1]
    return block


def accept_rejection(rule: Sampling, drafts: list[int], q: torch.Tensor, logits: torch.Tensor,
                     sampler: SamplerConfig, n: int) -> list[int]:
    """q (K, V) the drafter's warped rows, p the target's (its candidates only). Strict `<`: p = 0 is never
    kept. u_i is keyed to d_i's position. A rejection draws from max(0, p - q), 0 outside p's candidates. Every
    row's test and redraw are computed, then read at once: those past the first rejection are discarded."""
    tests, redraws = [], []  # (1,) each: is d_i kept; the token drawn if it is not
    for i, d in enumerate(drafts):
        position = n + 1 + i
        ids, p = rule.candidates(logits[i], sampler)  # (M,) each
        p_d = (p * (ids == d)).sum()  # p(d), 0 if d is not a candidate
        u = keyed_uniform(sampler.seed, ACCEPT_STREAM, position)
        # In float64, as the uniform.
        tests.append((q[i, d].double() * u < p_d.double()).long()[None])
        # Zero at d if rejected (then q(d) > p(d)); unnormalised: the draw is the same.
        residual = (p - q[i, ids]).clamp_(min=0)  # (M,)
        redraws.append(keyed_choice(ids, residual, sampler.seed, TOKEN_STREAM, position))
    last = n + 1 + len(drafts)  # the bonus's position
    bonus = keyed_choice(*rule.candidates(logits[len(drafts)], sampler), sampler.seed, TOKEN_STREAM, last)
    read = torch.cat([*tests, *redraws, bonus]).tolist()  # K tests (0 or 1), K redraws, the bonus
    a = read.index(0) if 0 in read[:len(drafts)] else len(drafts)
    # The bonus follows the last draft's redraw: read[K + a] is the redraw of d_(a+1), or the bonus.
    return drafts[:a] + [read[len(drafts) + a]]
