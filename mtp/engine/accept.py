"""The engine's step 4: the textbook's acceptance rules (mtp/accept.py, mtp/sample_drafting.py) by a
model's sampling rule (gemma4/engine/sampling.py), with the device read once where the textbook reads
row by row: every row's test and redraw are computed, then read at once, and those past the first
rejection are discarded.

Shape legend: K drafts, V vocab, M candidates of one row."""

import torch
from torch import Tensor

from gemma4.engine.sampling import NOT_FINITE, Sampling, finite_argmax, keyed_choice
from gemma4.generate import choosable
from gemma4.sampling import ACCEPT_STREAM, TOKEN_STREAM, SamplerConfig
from mtp.accept import agree
from mtp.sample_drafting import keyed_uniform


def accept_by_rule(rule: Sampling, drafts: list[int], logits: Tensor, sampler: SamplerConfig | None,
                   newest: int, q: Tensor | None) -> list[int]:
    """mtp/accept.py `accept`, drawing by `rule`: greedy without a sampler, the rejection rule with
    the drafter's q (K, V), keyed samples otherwise. logits (K+1, V) choose positions
    newest+1..newest+K+1."""
    if sampler is None:
        return agree(drafts, finite_argmax(logits).tolist())
    if q is not None and drafts:
        return reject_by_rule(rule, drafts, q, logits, sampler, newest)
    positions = list(range(newest + 1, newest + len(drafts) + 2))
    return agree(drafts, rule.draws(logits, sampler, TOKEN_STREAM, positions))


def reject_by_rule(rule: Sampling, drafts: list[int], q: Tensor, logits: Tensor,
                   sampler: SamplerConfig, newest: int) -> list[int]:
    """g_0..g_a by the rejection rule (mtp/sample_drafting.py `accept_rejection`) over the rule's
    candidates: p is 0 outside them."""
    # Rows with a NaN are tested and drawn on zeros (no read to ask which); every token read is then NOT_FINITE.
    finite = choosable(logits[:len(drafts) + 1]).all()  # () over rows 0..K
    logits = torch.where(finite, logits, 0.0)
    tests, redraws = [], []  # (1,) each: is d_i kept; the token drawn if it is not
    for i, d in enumerate(drafts):
        position = newest + 1 + i
        ids, p = rule.candidates(logits[i], sampler)  # (M,) each
        p_d = (p * (ids == d)).sum()  # p(d), 0 if d is not a candidate
        u = keyed_uniform(sampler.seed, ACCEPT_STREAM, position)
        tests.append((q[i, d].double() * u < p_d.double()).long()[None])
        residual = (p - q[i, ids]).clamp_(min=0)  # (M,)
        redraws.append(keyed_choice(ids, residual, sampler.seed, TOKEN_STREAM, position))
    last = newest + 1 + len(drafts)  # the bonus's position
    ids, p = rule.candidates(logits[len(drafts)], sampler)
    bonus = keyed_choice(ids, p, sampler.seed, TOKEN_STREAM, last)
    # K tests (0 or 1), K redraws, the bonus; all NOT_FINITE where the logits hold a NaN or +inf.
    read = torch.where(finite, torch.cat([*tests, *redraws, bonus]), NOT_FINITE).tolist()
    a = read.index(0) if 0 in read[:len(drafts)] else len(drafts)
    # The bonus follows the last draft's redraw: read[K + a] is the redraw of d_(a+1), or the bonus.
    return drafts[:a] + [read[len(drafts) + a]]
