"""The speculative decoding loop, for one prompt: draft K tokens with the drafter, verify K + 1 in
one target forward, keep the matching prefix and one target token, roll back. Design: mtp/README.md;
the numbered steps are those of its §7.

Greedy first. Why the output equals plain greedy decoding: the target's logits at verify row i
depend only on the committed prefix and d_1..d_i; a draft is kept only if it equals the target's own
argmax there, so every committed token is the target's argmax given the committed prefix, whatever
the drafter proposed. The drafter changes how many forwards the target runs, never what it commits.

Invariant at the start of every round: the target cache holds valid K/V for positions 0..newest-1
(every committed token except the newest, at `newest`), and the loop holds h[newest-1], the target's
post-norm hidden there. The cache keeps every position (gemma4/cache.py): anything stored at
positions >= newest is stale, and the next forward overwrites it before any query reads it.

Sampling (temperature > 0) changes only how drafts are made (step 2) and accepted (step 4): `argmax`
drafting (the default) equals plain keyed sampling token for token, `sample` drafting is exact in
distribution (mtp/accept.py).

The loop reports every round it runs (`Round`, mtp/stats.py) by yielding it: whoever iterates it
observes, streams or prints the rounds; the loop prints nothing. Many prompts at once, media,
chunked prefill and a held cache are the engine's (mtp/engine.py), held token-equal to this loop by
the tests.

Shape legend: K drafts, V vocab, E target hidden."""

from collections.abc import Iterator, Sequence

import torch

from gemma4.generate import budget_of, check_prompt, finished, new_cache, next_token
from gemma4.model import Gemma4Model
from gemma4.sampling import SamplerConfig, sampling_or_greedy
from mtp.accept import accept, cut_at_stop
from mtp.drafter import Drafter, target_kv
from mtp.schedule import Constant, Schedule
from mtp.stats import Round, SpecResult, result_of

DRAFTING = ("argmax", "sample")


@torch.inference_mode()
def speculative_rounds(
    target: Gemma4Model, drafter: Drafter, prompt: list[int], max_new_tokens: int,
    draft_length: Schedule | int, stop_ids: Sequence[int] = (),
    sampler: SamplerConfig | None = None, drafting: str = "argmax",
) -> Iterator[Round]:
    """Every round of one run, as it commits: the prefill first, then one per verify. Greedy with
    `sampler=None` or temperature 0, else sampling with `drafting`. `draft_length`: K drafts a
    round (an int), or a schedule that chooses each round's K and learns across calls."""
    sampler = check_sampling(sampler, drafting)
    check_prompt(target, prompt, max_new_tokens)
    schedule = Constant(draft_length) if type(draft_length) is int else draft_length
    schedule.start_call()
    cache = new_cache(target, prompt, max_new_tokens)
    budget = budget_of(target, prompt, max_new_tokens)

    # 0. Prefill: one forward over the prompt (positions 0..P-1) commits the token at P; the loop
    #    keeps h[P-1].
    out = target(prompt, start=0, cache=cache, last=1)
    newest = len(prompt)
    cache.length = newest
    tokens = [next_token(out.logits[-1], sampler, newest)]
    hidden = out.hidden[-1]  # (E,)
    yield Round(newest - 1, [], tokens.copy(), tokens.copy(), prefill=True)
    done = finished(tokens, stop_ids, budget)
    while not done:
        # 1. Budget: never draft what could not be committed (the drafts and one target token
        #    within the budget).
        k = schedule.next(budget - len(tokens) - 1)

        # 2. Draft d_1..d_K from (the newest token, h[newest-1], position newest) and the target's
        #    K/V of 0..newest-1: the drafter's argmax, or (sample drafting) draws from its q.
        drafts, q = drafter.propose(
            target, token=tokens[-1], hidden=hidden, position=newest,
            kv=target_kv(cache, target), k=k, sampler=sampler if drafting == "sample" else None)

        # 3. Verify [newest token, d_1..d_K] at positions newest..newest+K in one target forward:
        #    K/V written there, logits rows 0..K choosing positions newest+1..newest+K+1.
        out = target([tokens[-1], *drafts], start=newest, cache=cache)  # logits (K+1, V)

        # 4. Accept: g_0..g_a, the target's tokens while d_i == g_(i-1) (greedy: its argmax;
        #    sampling: the rules of mtp/accept.py). The schedule learns how many it kept.
        targets = accept(drafts, out.logits, sampler, newest, q)
        matched = len(targets) - 1
        schedule.observe(k, matched)

        # 5. Commit d_1..d_a and g_a, the target's own token, cut after the first stop id.
        block = cut_at_stop(drafts[:matched] + targets[-1:], stop_ids)
        tokens += block
        yield Round(newest, drafts, targets, block)

        # 6. Roll back: positions newest..newest+a hold the committed tokens' K/V, the rest of
        #    the verify's are stale. The next hidden, h[newest+a], is the verify's row a.
        newest += matched + 1
        cache.length = newest
        hidden = out.hidden[matched]  # (E,)

        # 7. Stop after a committed stop id or once the budget is spent; else the next round.
        done = finished(tokens, stop_ids, budget)


def speculative_generate(
    target: Gemma4Model, drafter: Drafter, prompt: list[int], max_new_tokens: int,
    draft_length: Schedule | int, stop_ids: Sequence[int] = (),
    sampler: SamplerConfig | None = None, drafting: str = "argmax",
) -> SpecResult:
    """The new tokens of `speculative_rounds`, their statistics and why the run ended."""
    rounds = speculative_rounds(target, drafter, prompt, max_new_tokens, draft_length, stop_ids,
                                sampler, drafting)
    return result_of(rounds, stop_ids)


def check_sampling(sampler: SamplerConfig | None, drafting: str) -> SamplerConfig | None:
    """The sampler a run uses, refused where it cannot run with `drafting`: None (greedy) for
    temperature 0."""
    if drafting not in DRAFTING:
        raise ValueError(f"drafting must be one of {', '.join(DRAFTING)}, got {drafting!r}")
    if drafting == "sample" and sampling_or_greedy(sampler) is None:
        raise ValueError("sample drafting draws from the drafter's distribution: it needs a "
                         "temperature > 0")
    return sampling_or_greedy(sampler)
