"""The speculative loop over a batch of prompts: every row is its own run (mtp/README.md §7, §12).

The batch-1 loop in mtp/speculative.py is the textbook; this is the same loop over B rows beside it, its numbered steps those of §7, and the tests hold every row against the solo run.
Per-row state: the committed sequence (so t_b), the hidden h[t_b-1], a draft length and statistics;
the cache holds a (B,) length, one per row. Facts a reader must know:
- Row b drafts at its own position t_b over its own keys 0..t_b-1, verifies at t_b..t_b+K_b and rolls
  back by setting its own length to t_b + a_b + 1. Nothing is shared but the forward.
- One drafter call drafts max_b K_b tokens for every row; row b keeps its first K_b. One verify
  forward takes every row's block, right-padded to the longest: pads land at positions past the row's
  block, in slots that are stale after the round (the causal mask hides them; later writes overwrite).
- A row that commits a stop id or spends its budget leaves the batch; it never stops another.
- With a sampler per row (temperature > 0, §11), every draw of row b (the target's tokens, and with
  `sample` drafting its drafts and acceptance uniforms) is keyed by that row's seed and the absolute
  position alone, as in its solo run: so row b equals its solo run with the same seed token for token
  (`argmax` drafting: plain sampling; `sample` drafting: solo sample drafting).

Shape legend: B rows still in the batch, K drafts, V vocab, E target hidden, D drafter hidden.
"""

import copy
from collections.abc import Sequence

import torch

from gemma4.extras.batch import PAD, check_prompts, new_cache, per_row, prefill_rows
from gemma4.generate import finish_reason
from gemma4.model import Gemma4Model
from gemma4.sampling import SamplerConfig
from mtp.accept import accept, cut_at_stop, first_token
from mtp.drafter import Drafter
from mtp.schedule import DraftLength
from mtp.speculative import check_sampling, check_windows, target_kv
from mtp.stats import SpecResult, SpecStats


@torch.inference_mode()
def speculative_generate_batch(
    target: Gemma4Model, drafter: Drafter, prompts: Sequence[list[int]], max_new_tokens: int | Sequence[int],
    draft_length: DraftLength, stop_ids: Sequence[int] | Sequence[Sequence[int]] = (),
    samplers: Sequence[SamplerConfig] | None = None, drafting: str = "argmax", prefill_chunk: int | None = None,
) -> list[SpecResult]:
    """speculative_generate over B rows; row b's result equals its solo run's (with samplers[b] and
    `drafting`). Every row starts from draft_length's value and adapts it on its own acceptances;
    draft_length itself is left as it is."""
    budgets, stops = per_row(max_new_tokens, stop_ids, len(prompts))
    check_prompts(target, prompts, budgets)
    for s in samplers or [None]:
        check_sampling(s, drafting)
    check_windows(target, drafter)
    samplers = [None if s is None or s.greedy else s for s in (samplers or [None] * len(prompts))]  # T 0: greedy
    sampled_drafts = drafting == "sample"
    context = target.config.max_position_embeddings
    # Room for the pads of a verify block: row b writes at most max_b K_b + 1 positions from t_b.
    longest = max(min(len(p) + n, context) for p, n in zip(prompts, budgets))
    cache = new_cache(target, len(prompts), longest + min(max(budgets), context), prefill_chunk)
    draft_length.start_call()
    lengths = [copy.deepcopy(draft_length) for _ in prompts]  # each row adapts its own, `auto`'s estimates included
    stats = [SpecStats(target_forwards=1, emitted=1) for _ in prompts]
    results: list[SpecResult | None] = [None] * len(prompts)

    # 0. Prefill every row in one forward; each commits its first token.
    logits, hidden = prefill_rows(target, cache, prompts, prefill_chunk)  # (B, V), (B, E) h[t_b-1]
    device = hidden.device
    warper = target.sampler_candidates
    seqs = [list(p) + [first_token(logits[b:b + 1], samplers[b], len(p), warper)] for b, p in enumerate(prompts)]
    rows = list(range(len(prompts)))  # cache row i holds prompt rows[i]
    while True:
        # 7. Stop (checked first, as in the solo loop): a row with a stop id or a spent budget leaves.
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
        t = [len(seqs[b]) - 1 for b in rows]  # == cache.length, row by row

        # 1. Budget, per row: never draft what could not be committed, nor past the sliding layers' slack.
        k_eff = [lengths[b].next(min(budgets[b] - (len(seqs[b]) - len(prompts[b])) - 1, context - len(seqs[b]) - 1,
                                     cache.slack - 1)) for b in rows]

        # 2. Draft d_1..d_K for every row from (seq_b[t_b], h[t_b-1], position t_b); row b keeps K_b:
        #    the drafter's argmax, or (sample drafting) draws from its warped q.
        k = max(k_eff)
        kv = target_kv(cache, target, max(t))  # (B, K, max t, D): row b's keys past t_b - 1 are stale
        q = None
        if k:
            drafted, q = drafter.propose_rows(target, [seqs[b][-1] for b in rows], hidden, t, kv, k,
                                              [samplers[b] for b in rows] if sampled_drafts else None)  # (B, k), (B, k, V)
            drafted = drafted.tolist()
        else:
            drafted = [[]] * len(rows)
        drafts = [d[:n] for d, n in zip(drafted, k_eff)]

        # 3. Verify [seq_b[t_b], d_1..d_K_b] at positions t_b..t_b+K_b, all rows in one target forward.
        ids = torch.tensor([[seqs[b][-1]] + d + [PAD] * (k - len(d)) for b, d in zip(rows, drafts)], device=device)
        out = target.run(ids, cache, start_pos=cache.length)  # logits (B, k+1, V)

        accepted = []
        for i, b in enumerate(rows):
            # 4. Accept the longest prefix of row b's drafts equal to the target's own tokens.
            d = drafts[i]
            a, last = accept(d, out.logits[i, :len(d) + 1], samplers[b], t[i],  # the row's pads are not read
                             None if q is None else q[i, :len(d)], warper)
            # 5. Commit d_1..d_a and the target's token after them; cut after the first stop id.
            block = cut_at_stop(d[:a] + [last], stops[b])
            seqs[b] += block
            stats[b].record(d, a, block)  # as the solo loop keeps them
            stats[b].target_forwards += 1
            lengths[b].observe(len(d), a)  # one forward serves every row: each row's round is the batch's
            accepted.append(a)

        # 6. Roll back, row by row: positions t_b..t_b+a_b hold committed K/V; the rest is stale.
        a = torch.tensor(accepted, device=device)  # (B,)
        cache.length = cache.length + a + 1
        hidden = out.hidden[torch.arange(len(rows), device=device), a]  # (B, E) h[t'_b - 1]
