"""The speculative decoding loop (greedy), its statistics and its draft-length schedules.

Spec: shared/spec/mtp.md §7-§8. The numbered steps below are the spec's.
Invariant at the start of every round: the target cache holds valid K/V for positions 0..t-1 (every
committed token except the newest, at t), and the loop holds h[t-1], the target's post-norm hidden
at t-1. Anything stored at positions >= t is stale and is overwritten by later writes.

Why the output equals plain greedy: the target's logits at verify index i depend only on the
committed prefix and d_1..d_i; a draft is kept only if it equals the target's own argmax, so every
committed token is the target's argmax given the committed prefix, whatever the drafter proposed.
"""

from dataclasses import dataclass, field

import torch

from gemma4.cache import KVCache
from gemma4.config import FULL, SLIDING
from gemma4.generate import check_prompt
from gemma4.model import Gemma4Model
from mtp.drafter import Drafter

SCHEDULES = ("constant", "heuristic", "heuristic_transient")


class DraftLength:
    """How many tokens to draft next (§8). Keep one per drafter: `heuristic` carries its value
    from one generate call to the next; `heuristic_transient` restarts from `initial` every call."""

    def __init__(self, initial: int, schedule: str = "constant") -> None:
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
        if initial < 1:
            raise ValueError(f"the number of assistant tokens must be at least 1, got {initial}")
        self.initial, self.schedule, self.current = initial, schedule, initial

    def start_call(self) -> None:
        if self.schedule == "heuristic_transient":
            self.current = self.initial

    def update(self, accepted: int, drafted: int) -> None:
        if self.schedule != "constant":
            self.current = self.current + 2 if accepted == drafted else max(1, self.current - 1)


@dataclass
class Round:
    drafted: list[int]  # d_1..d_K_eff as proposed
    accepted: int  # a: the length of the matching prefix (before any stop-id cut)


@dataclass
class SpecStats:
    target_forwards: int = 0  # prefill and verifications
    drafted: int = 0  # drafts proposed
    accepted: int = 0  # drafts committed (only tokens actually emitted)
    emitted: int = 0  # new tokens committed
    rounds: list[Round] = field(default_factory=list)
    drafted_at: list[int] = field(default_factory=list)  # [i]: rounds that drafted an i+1-th token
    accepted_at: list[int] = field(default_factory=list)  # [i]: rounds whose i+1-th draft was committed

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_forward(self) -> float:
        return self.emitted / self.target_forwards if self.target_forwards else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        return [a / d for a, d in zip(self.accepted_at, self.drafted_at)]


@dataclass
class SpecResult:
    tokens: list[int]
    stats: SpecStats
    finish_reason: str  # "stop" or "length"


def target_kv(cache: KVCache, model: Gemma4Model, t: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """K/V of positions 0..t-1 of the target's last non-shared sliding and full layers (§3)."""
    c = model.config
    return {kind: cache.read(c.kv_source(kind), t) for kind in (SLIDING, FULL)}


@torch.inference_mode()
def speculative_generate(
    target: Gemma4Model, drafter: Drafter, prompt: list[int], max_new_tokens: int,
    draft_length: DraftLength, stop_ids: list[int] | tuple[int, ...] = (),
    on_commit=None,  # noqa: ANN001 (optional callback(tokens, from_drafter flags) for streaming)
) -> SpecResult:
    check_prompt(target, prompt, max_new_tokens)
    device, dtype = target.embed_tokens.weight.device, target.embed_tokens.weight.dtype
    context = target.config.max_position_embeddings
    cache = KVCache(target.config, min(len(prompt) + max_new_tokens, context), dtype=dtype, device=device)
    stats = SpecStats()
    draft_length.start_call()

    # 0. Prefill: one forward over the prompt commits the first token.
    out = target.run(torch.tensor([prompt], device=device), cache, start_pos=0, num_logits=1)
    cache.length = len(prompt)
    stats.target_forwards += 1
    seq = list(prompt) + [int(out.logits[0, -1].argmax())]
    hidden = out.hidden[0, -1]  # (E,) h[t-1], with t = len(seq) - 1
    stats.emitted = 1
    if on_commit:
        on_commit(seq[-1:], [False])
    while True:
        new = len(seq) - len(prompt)
        if seq[-1] in stop_ids:
            return SpecResult(seq[len(prompt):], stats, "stop")
        if new == max_new_tokens or len(seq) >= context:
            return SpecResult(seq[len(prompt):], stats, "length")
        t = len(seq) - 1  # == cache.length

        # 1. Budget: never draft what could not be committed (a drafts + 1 target token <= R).
        #    The context bound works the same way: the block may not pass the last position.
        k_eff = min(draft_length.current, max_new_tokens - new - 1, context - len(seq) - 1)

        # 2. Draft d_1..d_K from (seq[t], h[t-1], position t) and the target's K/V of 0..t-1.
        drafts = drafter.draft(target, seq[t], hidden, t, target_kv(cache, target, t), k_eff) if k_eff else []

        # 3. Verify [seq[t], d_1..d_K] at positions t..t+K in one target forward.
        out = target.run(torch.tensor([[seq[t]] + drafts], device=device), cache, start_pos=t)
        stats.target_forwards += 1
        greedy = out.logits[0].argmax(dim=-1).tolist()  # g_0..g_K

        # 4. Accept the longest prefix of drafts equal to the target's argmax.
        a = 0
        while a < len(drafts) and drafts[a] == greedy[a]:
            a += 1

        # 5. Commit d_1..d_a and g_a (the correction, or the bonus if all were accepted);
        #    cut after the first stop id.
        block = drafts[:a] + [greedy[a]]
        for i, token in enumerate(block):
            if token in stop_ids:
                block = block[: i + 1]
                break
        seq += block

        # 6. Roll back: positions t..t+a hold committed tokens' K/V; the rest is stale.
        cache.length = t + a + 1
        hidden = out.hidden[0, a]  # h[t'-1] with t' = t + a + 1

        committed_drafts = min(a, len(block))  # drafts after a stop id are not emitted
        stats.emitted += len(block)
        if drafts:
            stats.rounds.append(Round(drafts, a))
            stats.drafted += len(drafts)
            stats.accepted += committed_drafts
            for i in range(len(drafts)):
                if i == len(stats.drafted_at):
                    stats.drafted_at.append(0)
                    stats.accepted_at.append(0)
                stats.drafted_at[i] += 1
                stats.accepted_at[i] += i < committed_drafts
            draft_length.update(a, len(drafts))
        if on_commit:
            on_commit(block, [i < committed_drafts for i in range(len(block))])
        # 7. Stop on a committed stop id or the budget: checked at the top of the loop.
