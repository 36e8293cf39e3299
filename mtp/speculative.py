"""The speculative decoding loop: draft K tokens with the drafter, verify K + 1 in one target forward, keep the matching
prefix and one target token, roll back. Design: mtp/README.md; the numbered steps are those of §7.

Greedy first. Why the output equals plain greedy decoding: the target's logits at verify row i depend only on the
committed prefix and d_1..d_i; a draft is kept only if it equals the target's own argmax there, so every committed
token is the target's argmax given the committed prefix, whatever the drafter proposed. The drafter changes how many
forwards the target runs, never what it commits.

Invariant at the start of every round: the target cache holds valid K/V for positions 0..t-1 (every committed token
except the newest, at t), and the loop holds h[t-1], the target's post-norm hidden at t-1. Anything stored at
positions >= t is stale and is overwritten by later writes.

Sampling (T > 0) changes only how drafts are made (step 2) and accepted (step 4): mtp/accept.py.
- `argmax` drafting (default): drafts stay the drafter's argmax; each verify row is sampled with the noise keyed to
  its position, the same noise plain sampling uses there: the output equals plain keyed sampling token for token.
- `sample` drafting: drafts are drawn from the drafter's warped q and kept by the rejection rule: exact in
  distribution, not token-equal to plain sampling.

Many prompts (§12): every row is its own run at its own positions (as in gemma4/generate.py), sharing only the
forwards: one drafter call drafts max_b K_b tokens (row b keeps its first K_b), one verify takes every row's block,
right-padded: the pads land in slots that are stale after the round.

Shape legend: B rows still running, K drafts, V vocab, E target hidden."""

import copy
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from gemma4.cache import KV, PREFILL_CHUNK, KVCache, ring_slack
from gemma4.config import FULL, SLIDING
from gemma4.generate import PAD, check_rows, choose, finish_reason, new_cache, prefill, row_positions
from gemma4.model import Gemma4Model
from gemma4.sampling import SamplerConfig
from mtp.accept import accept, cut_at_stop
from mtp.drafter import Drafter
from mtp.stats import SpecResult, SpecStats

if TYPE_CHECKING:  # the loop only calls a schedule: next(room), observe(k, accepted), start_call()
    from gemma4.vision.prompt import PromptImages  # only passed on to `prefill`
    from mtp.schedule import DraftLength

DRAFTING = ("argmax", "sample")


def speculative_generate(
    target: Gemma4Model, drafter: Drafter, prompt: list[int], max_new_tokens: int,
    draft_length: "DraftLength", stop_ids: list[int] | tuple[int, ...] = (),
    sampler: SamplerConfig | None = None, drafting: str = "argmax",
    on_commit: Callable[[list[int], list[bool]], None] | None = None,
    cache: KVCache | None = None, reuse: int = 0, prefill_chunk: int | None = None,
    images: "PromptImages | None" = None,
) -> SpecResult:
    """`speculative_rows` of one row: greedy with `sampler=None` or temperature 0, else sampling with `drafting`.
    `draft_length` learns across calls; `on_commit(tokens, from_drafter flags)` sees each committed block (for
    streaming); `cache`, `reuse`: a cache holding prompt[:reuse]; `prefill_chunk`, `images`: gemma4/generate.py."""
    draft_length.start_call()
    each = None if on_commit is None else lambda _, tokens, flags: on_commit(tokens, flags)
    return speculative_rows(target, drafter, [prompt], max_new_tokens, [draft_length], stop_ids, [sampler],
                            drafting, each, cache, reuse, prefill_chunk, images)[0]


def speculative_generate_batch(
    target: Gemma4Model, drafter: Drafter, prompts: Sequence[list[int]], max_new_tokens: int | Sequence[int],
    draft_length: "DraftLength", stop_ids: Sequence[int] | Sequence[Sequence[int]] = (),
    samplers: Sequence[SamplerConfig] | None = None, drafting: str = "argmax", prefill_chunk: int | None = None,
    images: "PromptImages | None" = None,
) -> list[SpecResult]:
    """speculative_generate over B rows; row b's result equals its solo run's (with samplers[b] and `drafting`).
    Every row starts from a copy of draft_length and adapts it on its own rounds; draft_length is left as it is."""
    draft_length.start_call()
    lengths = [copy.deepcopy(draft_length) for _ in prompts]  # `auto`'s estimates included
    return speculative_rows(target, drafter, prompts, max_new_tokens, lengths, stop_ids, samplers, drafting,
                            prefill_chunk=prefill_chunk, images=images)


@torch.inference_mode()
def speculative_rows(
    target: Gemma4Model, drafter: Drafter, prompts: Sequence[list[int]], max_new_tokens: int | Sequence[int],
    lengths: list["DraftLength"], stop_ids: Sequence[int] | Sequence[Sequence[int]] = (),
    samplers: Sequence[SamplerConfig | None] | None = None, drafting: str = "argmax",
    on_commit: Callable[[int, list[int], list[bool]], None] | None = None,
    cache: KVCache | None = None, reuse: int = 0, prefill_chunk: int | None = None,
    images: "PromptImages | None" = None,
) -> list[SpecResult]:
    """The loop: row b runs prompts[b] with its own budget, stop ids, sampler and schedule lengths[b];
    `on_commit(b, tokens, from_drafter flags)`; `cache`, `reuse`: one row's cache holding prompt[:reuse]."""
    budgets, stops = check_rows(target, prompts, max_new_tokens, stop_ids, images)
    samplers = [check_sampling(s, drafting) for s in samplers or [None] * len(prompts)]
    check_windows(target, drafter)
    context = target.config.max_position_embeddings
    if cache is None:  # several rows: room for a verify's pads past a row's last position, fewer than the slack
        pads = min(max(budgets), ring_slack(PREFILL_CHUNK if prefill_chunk is None else prefill_chunk))
        cache = new_cache(target, prompts, budgets, prefill_chunk, pads if len(prompts) > 1 else 0, images)

    # 0. Prefill: one forward over each prompt (past a reused prefix) commits its first token. The drafter needs
    #    nothing for a reused prefix: it keeps no cache, and reads the target's K/V and the hidden of the
    #    prompt's last position, both the prefill's.
    logits, hidden = prefill(target, cache, prompts, reuse, prefill_chunk, images)  # (B, V), (B, E) h[t_b-1]
    seqs = [list(p) + [first] for p, first in zip(prompts, choose(logits, samplers, [len(p) for p in prompts]))]
    stats = [SpecStats(target_forwards=1, emitted=1) for _ in prompts]  # their clocks start now
    results: list[SpecResult | None] = [None] * len(prompts)
    for b, seq in enumerate(seqs if on_commit else []):
        on_commit(b, seq[-1:], [False])
    rows = list(range(len(prompts)))  # cache row i holds prompt rows[i]
    while True:
        # 7. Stop (checked first): a row that committed a stop id or spent its budget or the context leaves.
        going = []
        for i, b in enumerate(rows):
            if reason := finish_reason(seqs[b], len(prompts[b]), budgets[b], stops[b], context):
                results[b] = SpecResult(seqs[b][len(prompts[b]):], stats[b], reason)
            else:
                going.append(i)
        if not going:
            return results
        if len(going) < len(rows):
            cache.keep(going)
            rows, hidden = [rows[i] for i in going], hidden[going]
        t = [len(seqs[b]) - 1 for b in rows]  # row by row == cache.length

        # 1. Budget: never draft what could not be committed (the drafts + 1 target token within the budget and
        #    the context), nor more than the sliding layers' slack can verify in one forward.
        ks = [lengths[b].next(min(budgets[b] - (len(seqs[b]) - len(prompts[b])) - 1, context - len(seqs[b]) - 1,
                                  cache.slack - 1)) for b in rows]
        k = max(ks)

        # 2. Draft d_1..d_K for every row from (seq_b[t_b], h[t_b-1], position t_b) and the target's K/V of
        #    0..t_b-1: the drafter's argmax, or (sample drafting) draws from its warped q. Row b keeps K_b.
        drafts, q = [[] for _ in rows], None
        if k:
            row_samplers = [samplers[b] for b in rows] if drafting == "sample" else None  # None: the argmax
            drafted, q = drafter.propose(target, [seqs[b][-1] for b in rows], hidden, t,
                                         target_kv(cache, target, max(t)), k, row_samplers)  # (B, k), (B, k, V)
            drafts = [d[:n] for d, n in zip(drafted.tolist(), ks)]

        # 3. Verify [seq_b[t_b], d_1..d_K_b] at positions t_b..t_b+K_b, all rows in one target forward.
        ids = torch.tensor([seqs[b][-1:] + d + [PAD] * (k - len(d)) for b, d in zip(rows, drafts)])  # (B, k+1)
        out = target.run(ids, cache, start_pos=cache.length)  # logits (B, k+1, V)

        # 4. Accept a prefix of the drafts: greedy token equality, or the sampling rules (mtp/accept.py). A row's pads
        #    are not read. One read of the device gives every row's argmax, before any schedule reads its clock.
        greedy = out.logits.argmax(dim=-1).tolist() if None in [samplers[b] for b in rows] else [None] * len(rows)
        accepted = []
        for i, (b, d) in enumerate(zip(rows, drafts)):
            a, last = accept(d, out.logits[i, :len(d) + 1], samplers[b], t[i], None if q is None else q[i, :len(d)],
                             greedy[i])
            lengths[b].observe(len(d), a)

            # 5. Commit d_1..d_a and the target's token after them; cut after the first stop id.
            block = cut_at_stop(d[:a] + [last], stops[b])
            seqs[b] += block
            stats[b].record(d, a, block)
            if on_commit:
                on_commit(b, block, [j < min(a, len(block)) for j in range(len(block))])
            accepted.append(a)

        # 6. Roll back: positions t_b..t_b+a_b hold committed tokens' K/V; the rest is stale.
        cache.length = row_positions([n + a + 1 for n, a in zip(t, accepted)], hidden.device)
        newest = torch.tensor(accepted).to(hidden.device, non_blocking=True)  # (B,) the verify row of t'_b - 1
        hidden = out.hidden[torch.arange(len(rows), device=hidden.device), newest]  # (B, E) h[t'_b-1]


def target_kv(cache: KVCache, model: Gemma4Model, t: int) -> dict[str, KV]:
    """K/V of positions 0..t-1 of the target's last non-shared sliding and full layers, with their slots' positions:
    what the drafter reads (§3). A ring's stale slots past t-1 are hidden by the mask."""
    c = model.config
    return {kind: cache.read(c.kv_source(kind), t) for kind in (SLIDING, FULL)}


def check_windows(target: Gemma4Model, drafter: Drafter) -> None:
    """The target's sliding layers keep W + slack slots (gemma4/cache.py), which hold the W_d + 1 keys the
    drafter reads only if W_d <= W (gemma4/README.md §15)."""
    w, w_d = target.config.sliding_window, drafter.config.text.sliding_window
    if w_d > w:
        raise ValueError(f"the assistant's sliding window ({w_d}) is wider than the target's ({w}): the target's "
                         f"cache keeps only its own window, so this pair cannot run")


def check_sampling(sampler: SamplerConfig | None, drafting: str) -> SamplerConfig | None:
    """The sampler a row runs, refused where it cannot run with `drafting`: None (greedy) for temperature 0."""
    if drafting not in DRAFTING:
        raise ValueError(f"drafting must be one of {', '.join(DRAFTING)}, got {drafting!r}")
    if drafting == "sample" and (sampler is None or sampler.greedy):
        raise ValueError("sample drafting draws from the drafter's distribution: it needs a temperature > 0")
    return None if sampler is None or sampler.greedy else sampler  # temperature 0 is the greedy loop itself
