"""The speculative decoding loop: draft K tokens with the drafter, verify K + 1 in one target forward, keep the
matching prefix and one target token, roll back. Design: mtp/README.md; the numbered steps are those of §7.

Greedy first. Why the output equals plain greedy decoding: the target's logits at verify row i depend only on
the committed prefix and d_1..d_i; a draft is kept only if it equals the target's own argmax there, so every
committed token is the target's argmax given the committed prefix, whatever the drafter proposed. The drafter
changes how many forwards the target runs, never what it commits.

Invariant at the start of every round: the target cache holds valid K/V for positions 0..t-1 (every committed
token except the newest, at t), and the loop holds h[t-1], the target's post-norm hidden at t-1. Anything
stored at positions >= t is stale and is overwritten by later writes.

Sampling (T > 0) changes only how drafts are made (step 2) and accepted (step 4): mtp/accept.py.
- `argmax` drafting (default): drafts stay the drafter's argmax; each verify row is sampled with the noise keyed
  to its position, the same noise plain sampling uses there: the output equals plain keyed sampling token for
  token.
- `sample` drafting: drafts are drawn from the drafter's warped q and kept by the rejection rule: exact in
  distribution, not token-equal to plain sampling.
"""

from typing import TYPE_CHECKING

import torch

from gemma4.cache import KV, KVCache
from gemma4.config import FULL, SLIDING
from gemma4.generate import check_prompt, finish_reason, prefill
from gemma4.model import Gemma4Model
from gemma4.sampling import SamplerConfig
from mtp.accept import accept, cut_at_stop, first_token
from mtp.drafter import Drafter
from mtp.stats import SpecResult, SpecStats

if TYPE_CHECKING:  # the loop only calls a schedule: next(room), observe(k, accepted), start_call()
    from mtp.schedule import DraftLength

DRAFTING = ("argmax", "sample")


@torch.inference_mode()
def speculative_generate(
    target: Gemma4Model, drafter: Drafter, prompt: list[int], max_new_tokens: int,
    draft_length: "DraftLength", stop_ids: list[int] | tuple[int, ...] = (),
    sampler: SamplerConfig | None = None, drafting: str = "argmax",
    on_commit=None,  # noqa: ANN001 (optional callback(tokens, from_drafter flags) for streaming)
    cache: KVCache | None = None, reuse: int = 0, prefill_chunk: int | None = None,
) -> SpecResult:
    """Greedy with `sampler=None` or temperature 0; otherwise sampling with `drafting` (see above).
    `cache`, `reuse`: a cache already holding prompt[:reuse]; `prefill_chunk`: the most prompt positions one
    forward runs (gemma4/generate.py `prefill`)."""
    check_prompt(target, prompt, max_new_tokens)
    check_sampling(sampler, drafting)
    check_windows(target, drafter)
    if sampler is not None and sampler.greedy:
        sampler = None  # temperature 0 is the greedy loop itself
    draft_sampler = sampler if drafting == "sample" else None  # None: the drafter proposes its argmax
    context = target.config.max_position_embeddings
    stats = SpecStats()
    draft_length.start_call()

    # 0. Prefill: one forward over the prompt (past a reused prefix) commits the first token. The drafter needs
    #    nothing for a reused prefix: it keeps no cache, and reads the target's K/V and the hidden of the
    #    prompt's last position, both the prefill's.
    cache, out = prefill(target, prompt, max_new_tokens, cache, reuse, prefill_chunk)
    stats.target_forwards += 1
    seq = list(prompt) + [first_token(out.logits[0, -1:], sampler, len(prompt), target.sampler_candidates)]
    hidden = out.hidden[0, -1]  # (E,) h[t-1], with t = len(seq) - 1
    stats.emitted = 1
    if on_commit:
        on_commit(seq[-1:], [False])
    while (reason := finish_reason(seq, len(prompt), max_new_tokens, stop_ids, context)) is None:
        t = len(seq) - 1  # == cache.length

        # 1. Budget: never draft what could not be committed (a drafts + 1 target token within the budget and
        #    the context), nor more than the sliding layers' slack can verify in one forward.
        k = draft_length.next(min(max_new_tokens - (len(seq) - len(prompt)) - 1, context - len(seq) - 1,
                                  cache.slack - 1))

        # 2. Draft d_1..d_K from (seq[t], h[t-1], position t) and the target's K/V of 0..t-1.
        drafts, q = drafter.propose(target, seq[t], hidden, t, target_kv(cache, target, t), k,
                                    draft_sampler) if k else ([], None)

        # 3. Verify [seq[t], d_1..d_K] at positions t..t+K in one target forward.
        out = target.run(torch.tensor([[seq[t]] + drafts]), cache, start_pos=t)
        stats.target_forwards += 1

        # 4. Accept a prefix of the drafts: greedy token equality, or the sampling rules (mtp/accept.py).
        a, last = accept(drafts, out.logits[0], sampler, t, q, target.sampler_candidates)
        draft_length.observe(k, a)

        # 5. Commit d_1..d_a and the target's token after them; cut after the first stop id.
        block = cut_at_stop(drafts[:a] + [last], stop_ids)
        seq += block

        # 6. Roll back: positions t..t+a hold committed tokens' K/V; the rest is stale.
        cache.length = t + a + 1
        hidden = out.hidden[0, a]  # h[t'-1] with t' = t + a + 1

        stats.record(drafts, a, block)
        if on_commit:
            on_commit(block, [i < min(a, len(block)) for i in range(len(block))])
        # 7. Stop on a committed stop id, the budget or the context: `finish_reason`.
    return SpecResult(seq[len(prompt):], stats, reason)


def target_kv(cache: KVCache, model: Gemma4Model, t: int) -> dict[str, KV]:
    """K/V of positions 0..t-1 of the target's last non-shared sliding and full layers, with the positions of
    their slots: what the drafter reads (§3). A sliding layer's ring may also hold stale slots past t-1: the mask
    hides them."""
    c = model.config
    return {kind: cache.read(c.kv_source(kind), t) for kind in (SLIDING, FULL)}


def check_windows(target: Gemma4Model, drafter: Drafter) -> None:
    """The target's sliding layers keep W + slack slots (gemma4/cache.py), which hold the W_d + 1 keys the
    drafter reads only if W_d <= W (gemma4/README.md §15)."""
    w, w_d = target.config.sliding_window, drafter.config.text.sliding_window
    if w_d > w:
        raise ValueError(f"the assistant's sliding window ({w_d}) is wider than the target's ({w}): the target's "
                         f"cache keeps only its own window, so this pair cannot run")


def check_sampling(sampler: SamplerConfig | None, drafting: str) -> None:
    if drafting not in DRAFTING:
        raise ValueError(f"drafting must be one of {', '.join(DRAFTING)}, got {drafting!r}")
    if drafting == "sample" and (sampler is None or sampler.greedy):
        raise ValueError("sample drafting draws from the drafter's distribution: it needs a temperature > 0")
