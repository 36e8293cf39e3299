"""The speculative engine: the loop of mtp/speculative.py for many prompts at once, and for one prompt with what the
textbook loop leaves out: media, chunked prefill, a held cache prefix, and the device's reads batched.

Every row is its own run at its own positions (mtp/README.md §12), sharing only the forwards: one drafter call
drafts max_b K_b tokens (row b keeps its first K_b), one verify takes every row's block, right-padded: the pads land
in slots that are stale after the round. A row that commits a stop id or spends its budget leaves (`keep`).
Each row's rounds are the textbook loop's on the same prompt, so are its tokens: the tests hold them equal.

Every committed round is reported to `on_round(b, round)`, the streaming callback (a `Round`, mtp/stats.py).

Shape legend: B rows still running, K drafts, V vocab, E target hidden."""

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from gemma4.engine.ring import RingCache
from gemma4.engine.media import joined
from gemma4.model import Gemma4Model
from gemma4.engine.rows import PAD, Request, check_rows, choose, finish_reason, keep, new_cache, prefill
from gemma4.sampling import SamplerConfig
from gemma4.engine.forward import forward_rows
from gemma4.engine.sampling import finite_argmax, refuse_marked, rule_of
from mtp.accept import agree, cut_at_stop
from mtp.drafter import Drafter
from mtp.engine.accept import accept_by_rule
from mtp.engine.drafts import propose_rows, ring_kv
from mtp.schedule import Schedule
from mtp.speculative import check_sampling
from mtp.stats import Round, SpecResult, SpecStats

if TYPE_CHECKING:
    from gemma4.engine.media import Media

OnRound = Callable[[int, Round], None]


@torch.inference_mode()
def speculative_rows(
    target: Gemma4Model, drafter: Drafter, rows: Sequence[Request], schedules: Sequence[Schedule],
    drafting: str = "argmax", on_round: OnRound | None = None, cache: RingCache | None = None,
    prefill_chunk: int | None = None, media: "Media | None" = None,
) -> list[SpecResult]:
    """Every request with its own budget, stop ids, sampler and schedule (`schedules[b]`), all in each forward.
    `cache`: one row's, holding its first cache.length ids; `prefill_chunk`, `media`: see `prefill`."""
    check_rows(target, rows, media)
    samplers = [check_sampling(r.sampler, drafting) for r in rows]
    context, rule = target.config.max_position_embeddings, rule_of(target)
    if cache is None:
        # Several rows: room for a verify's pads past a row's last position.
        cache = new_cache(target, rows, prefill_chunk, media, verify=True)

    # 0. Prefill: one forward over each prompt (past a prefix the cache holds) commits its first token. The drafter
    #    needs nothing for a held prefix: it keeps no cache, and reads the target's K/V and the hidden of the
    #    prompt's last position, both the prefill's.
    logits, hidden = prefill(target, cache, [r.prompt for r in rows], prefill_chunk, media)  # (B, V), (B, E)
    firsts = choose(target, logits, samplers, [len(r.prompt) for r in rows])
    seqs = [r.prompt + [f] for r, f in zip(rows, firsts)]
    stats = [SpecStats() for _ in rows]
    for b, seq in enumerate(seqs):
        report(b, Round(len(rows[b].prompt) - 1, [], seq[-1:], seq[-1:], prefill=True), stats, on_round)
    results: list[SpecResult | None] = [None] * len(rows)
    going = list(range(len(rows)))  # cache row i holds request going[i]
    while True:
        # 7. Stop: a row that committed a stop id or spent its budget or the context leaves; the others go on.
        still = []
        for i, b in enumerate(going):
            if reason := finish_reason(seqs[b], rows[b], context):
                results[b] = SpecResult(seqs[b][len(rows[b].prompt):], stats[b], reason)
            else:
                still.append(i)
        if not still:
            return results
        if len(still) < len(going):
            keep(cache, still)
            going, hidden = [going[i] for i in still], hidden[still]
        newest = [len(seqs[b]) - 1 for b in going]  # each row's newest committed position: its cache.length

        # 1. Budget: as the textbook loop's, row by row.
        ks = [schedules[b].next(min(budget_left(seqs[b], rows[b], context) - 1, cache.slack - 1)) for b in going]
        k = max(ks)

        # 2. Draft max K_b tokens for every row in one drafter call; row b keeps its first K_b.
        drafts, q = [[] for _ in going], None
        if k:
            row_samplers = [samplers[b] for b in going] if drafting == "sample" else None  # None: the argmax
            drafted, q = propose_rows(drafter, target, [seqs[b][-1] for b in going], hidden, newest,
                                      ring_kv(cache, target, max(newest)), k, row_samplers)  # (B, k)
            drafts = [d[:n] for d, n in zip(drafted.tolist(), ks)]
            for d, n in zip(drafts, newest):
                refuse_marked(d, f"the drafter's states at position {n}")

        # 3. Verify [seq_b[newest_b], d_1..d_K_b] at positions newest_b.., all rows in one target forward.
        ids = torch.tensor([seqs[b][-1:] + d + [PAD] * (k - len(d)) for b, d in zip(going, drafts)])  # (B, k+1)
        out = forward_rows(target, ids, cache, start_pos=cache.length)  # logits (B, k+1, V)

        # 4. Accept each row's prefix. The greedy rows' argmaxes come in one read of the device, before any
        #    schedule reads its clock; a row's pads are not read.
        greedy = finite_argmax(out.logits).tolist() if None in [samplers[b] for b in going] else None
        accepted = []
        for i, (b, d) in enumerate(zip(going, drafts)):
            if samplers[b] is None:
                targets = agree(d, greedy[i])
            else:
                targets = accept_by_rule(rule, d, out.logits[i, :len(d) + 1], samplers[b], newest[i],
                                 None if q is None else q[i, :len(d)])
            refuse_marked(targets[-1:], f"the target's logits of the verify at positions {newest[i]}.."
                                        f"{newest[i] + len(d)}")
            a = len(targets) - 1
            schedules[b].observe(len(d), a)

            # 5. Commit d_1..d_a and g_a; cut after the first stop id.
            block = cut_at_stop(d[:a] + targets[-1:], rows[b].stop_ids)
            seqs[b] += block
            report(b, Round(newest[i], d, targets, block), stats, on_round)
            accepted.append(a)

        # 6. Roll back: positions newest_b..newest_b+a_b hold committed tokens' K/V; the rest is stale.
        cache.length = cache.length + torch.tensor(accepted) + 1
        column = torch.tensor(accepted).to(hidden.device, non_blocking=True)  # (B,) the verify row of h
        hidden = out.hidden[torch.arange(len(going), device=hidden.device), column]  # (B, E)


def budget_left(seq: list[int], row: Request, context: int) -> int:
    """The tokens row's run may still commit: its budget and the context, whichever ends first."""
    return min(row.max_new_tokens - (len(seq) - len(row.prompt)), context - len(seq))


def report(b: int, round: Round, stats: list[SpecStats], on_round: OnRound | None) -> None:
    stats[b].record(round)
    if on_round:
        on_round(b, round)


def speculative_one(
    target: Gemma4Model, drafter: Drafter, prompt: list[int], max_new_tokens: int, draft_length: Schedule,
    stop_ids: Sequence[int] = (), sampler: SamplerConfig | None = None, drafting: str = "argmax",
    on_round: Callable[[Round], None] | None = None, cache: RingCache | None = None,
    prefill_chunk: int | None = None, images: "Media | None" = None, audio: "Media | None" = None,
) -> SpecResult:
    """One prompt through the engine: the result of mtp.speculative's `speculative_generate`, with `on_round(round)`
    called as each round commits (streaming), `cache` holding the prompt's first cache.length ids,
    `prefill_chunk`, `images` and `audio` (see `prefill`). `draft_length` learns across calls."""
    draft_length.start_call()
    each = None if on_round is None else lambda _, round: on_round(round)
    row = Request(list(prompt), max_new_tokens, tuple(stop_ids), sampler)
    return speculative_rows(target, drafter, [row], [draft_length], drafting, each, cache, prefill_chunk,
                            joined(images, audio))[0]
