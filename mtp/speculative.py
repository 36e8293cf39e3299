"""The speculative decoding loop: draft K tokens with the drafter, verify K + 1 in one target forward, keep the matching
prefix and one target token, roll back. Design: mtp/README.md; the numbered steps are those of §7.

Greedy first. Why the output equals plain greedy decoding: the target's logits at verify row i depend only on the
committed prefix and d_1..d_i; a draft is kept only if it equals the target's own argmax there, so every committed
token is the target's argmax given the committed prefix, whatever the drafter proposed. The drafter changes how many
forwards the target runs, never what it commits.

Invariant at the start of every round: the target cache holds valid K/V for positions 0..n-1 (every committed token
except the newest, at n), and the loop holds h[n-1], the target's post-norm hidden at n-1. Anything stored at
positions >= n is stale and is overwritten by later writes.

Sampling (T > 0) changes only how drafts are made (step 2) and accepted (step 4): `argmax` drafting (the default)
equals plain keyed sampling token for token, `sample` drafting is exact in distribution (mtp/accept.py).

Many prompts (§12): every row is its own run at its own positions (as in gemma4/generate.py), sharing only the
forwards: one drafter call drafts max_b K_b tokens (row b keeps its first K_b), one verify takes every row's block,
right-padded: the pads land in slots that are stale after the round.

Shape legend: B rows still running, K drafts, V vocab, E target hidden."""

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from gemma4.cache import KV, KVCache
from gemma4.config import FULL, SLIDING
from gemma4.rows import PAD, Request, check_rows, choose, finish_reason, new_cache, prefill
from gemma4.model import Gemma4Model
from gemma4.sampling import SamplerConfig
from mtp.accept import accept, cut_at_stop
from mtp.drafter import Drafter
from mtp.schedule import DraftLength
from mtp.stats import SpecResult, SpecStats

if TYPE_CHECKING:
    from gemma4.media import Media  # only passed on to `prefill`

DRAFTING = ("argmax", "sample")


def speculative_generate(
    target: Gemma4Model, drafter: Drafter, prompt: list[int], max_new_tokens: int, draft_length: DraftLength,
    stop_ids: Sequence[int] = (), sampler: SamplerConfig | None = None, drafting: str = "argmax",
    on_commit: Callable[[list[int], list[bool]], None] | None = None, cache: KVCache | None = None,
    prefill_chunk: int | None = None, images: "Media | None" = None, audio: "Media | None" = None,
) -> SpecResult:
    """`speculative_rows` of one row: greedy with `sampler=None` or temperature 0, else sampling with `drafting`.
    `draft_length` learns across calls; `on_commit(tokens, from_drafter flags)` sees each committed block (for
    streaming); `cache`: one holding the prompt's first cache.length ids; `prefill_chunk`, `images`, `audio`: see
    `prefill`."""
    draft_length.start_call()
    each = None if on_commit is None else lambda _, tokens, flags: on_commit(tokens, flags)
    row = Request(list(prompt), max_new_tokens, tuple(stop_ids), sampler, draft_length)
    media = images + audio if images and audio else images or audio  # gemma4.media.joined, not loaded here
    return speculative_rows(target, drafter, [row], drafting, each, cache, prefill_chunk, media)[0]


@torch.inference_mode()
def speculative_rows(
    target: Gemma4Model, drafter: Drafter, rows: Sequence[Request], drafting: str = "argmax",
    on_commit: Callable[[int, list[int], list[bool]], None] | None = None, cache: KVCache | None = None,
    prefill_chunk: int | None = None, media: "Media | None" = None,
) -> list[SpecResult]:
    """The loop: every request runs with its own budget, stop ids, sampler and schedule, all in each forward;
    `on_commit(b, tokens, from_drafter flags)`; `cache`: one row's, holding its first cache.length ids."""
    check_rows(target, rows, media)
    samplers = [check_sampling(r.sampler, drafting) for r in rows]
    context, rule = target.config.max_position_embeddings, target.sampling
    if cache is None:  # several rows: room for a verify's pads past a row's last position
        cache = new_cache(target, rows, prefill_chunk, media, verify=True)

    # 0. Prefill: one forward over each prompt (past a prefix the cache holds) commits its first token. The drafter
    #    needs nothing for a held prefix: it keeps no cache, and reads the target's K/V and the hidden of the
    #    prompt's last position, both the prefill's.
    logits, hidden = prefill(target, cache, [r.prompt for r in rows], prefill_chunk, media)  # (B, V), (B, E)
    seqs = [r.prompt + [f] for r, f in zip(rows, choose(target, logits, samplers, [len(r.prompt) for r in rows]))]
    stats = [SpecStats(target_forwards=1, emitted=1) for _ in rows]
    results: list[SpecResult | None] = [None] * len(rows)
    for b, seq in enumerate(seqs if on_commit else []):
        on_commit(b, seq[-1:], [False])
    going = list(range(len(rows)))  # cache row i holds request going[i]
    while True:
        # 7. Stop (checked first): a row that committed a stop id or spent its budget or the context leaves.
        still = []
        for i, b in enumerate(going):
            if reason := finish_reason(seqs[b], rows[b], context):
                results[b] = SpecResult(seqs[b][len(rows[b].prompt):], stats[b], reason)
            else:
                still.append(i)
        if not still:
            return results
        if len(still) < len(going):
            cache.keep(still)
            going, hidden = [going[i] for i in still], hidden[still]
        newest = [len(seqs[b]) - 1 for b in going]  # the newest committed token's position: == cache.length

        # 1. Budget: never draft what could not be committed (the drafts + 1 target token within the budget and
        #    the context), nor more than the sliding layers' slack can verify in one forward.
        ks = [rows[b].schedule.next(min(rows[b].max_new_tokens - (len(seqs[b]) - len(rows[b].prompt)) - 1,
                                        context - len(seqs[b]) - 1, cache.slack - 1)) for b in going]
        k = max(ks)

        # 2. Draft d_1..d_K for every row from (seq_b[n_b], h[n_b-1], position n_b) and the target's K/V of
        #    0..n_b-1: the drafter's argmax, or (sample drafting) draws from its warped q. Row b keeps K_b.
        drafts, q = [[] for _ in going], None
        if k:
            row_samplers = [samplers[b] for b in going] if drafting == "sample" else None  # None: the argmax
            drafted, q = drafter.propose(target, [seqs[b][-1] for b in going], hidden, newest,
                                         target_kv(cache, target, max(newest)), k, row_samplers)  # (B, k), (B, k, V)
            drafts = [d[:n] for d, n in zip(drafted.tolist(), ks)]

        # 3. Verify [seq_b[n_b], d_1..d_K_b] at positions n_b..n_b+K_b, all rows in one target forward.
        ids = torch.tensor([seqs[b][-1:] + d + [PAD] * (k - len(d)) for b, d in zip(going, drafts)])  # (B, k+1)
        out = target.run(ids, cache, start_pos=cache.length)  # logits (B, k+1, V)

        # 4. Accept a prefix of the drafts: greedy token equality, or the sampling rules (mtp/accept.py). A row's pads
        #    are not read. One read of the device gives every row's argmax, before any schedule reads its clock.
        greedy = out.logits.argmax(dim=-1).tolist() if None in [samplers[b] for b in going] else [None] * len(going)
        accepted = []
        for i, (b, d) in enumerate(zip(going, drafts)):
            a, last = accept(rule, d, out.logits[i, :len(d) + 1], samplers[b], newest[i],
                             None if q is None else q[i, :len(d)], greedy[i])
            rows[b].schedule.observe(len(d), a)

            # 5. Commit d_1..d_a and the target's token after them; cut after the first stop id.
            block = cut_at_stop(d[:a] + [last], rows[b].stop_ids)
            seqs[b] += block
            stats[b].record(d, a, block)
            if on_commit:
                on_commit(b, block, [j < min(a, len(block)) for j in range(len(block))])
            accepted.append(a)

        # 6. Roll back: positions n_b..n_b+a_b hold committed tokens' K/V; the rest is stale.
        cache.length = cache.length + torch.tensor(accepted) + 1
        column = torch.tensor(accepted).to(hidden.device, non_blocking=True)  # (B,) the verify column of n'_b - 1
        hidden = out.hidden[torch.arange(len(going), device=hidden.device), column]  # (B, E) h[n'_b-1]


def target_kv(cache: KVCache, model: Gemma4Model, end: int) -> dict[str, KV]:
    """K/V of positions 0..end-1 of the target's last non-shared sliding and full layers, with their slots' positions:
    what the drafter reads (§3). A ring's stale slots past a row's newest position are hidden by the mask."""
    c = model.config
    return {kind: cache.read(c.kv_source(kind), end) for kind in (SLIDING, FULL)}


def check_sampling(sampler: SamplerConfig | None, drafting: str) -> SamplerConfig | None:
    """The sampler a row runs, refused where it cannot run with `drafting`: None (greedy) for temperature 0."""
    if drafting not in DRAFTING:
        raise ValueError(f"drafting must be one of {', '.join(DRAFTING)}, got {drafting!r}")
    if drafting == "sample" and (sampler is None or sampler.greedy):
        raise ValueError("sample drafting draws from the drafter's distribution: it needs a temperature > 0")
    return None if sampler is None or sampler.greedy else sampler  # temperature 0 is the greedy loop itself
