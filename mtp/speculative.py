"""The speculative decoding loop (greedy and sampling), its statistics and its draft-length schedules.

Design: mtp/README.md §7-§8, §11. The numbered steps below are those of §7.
Invariant at the start of every round: the target cache holds valid K/V for positions 0..t-1 (every
committed token except the newest, at t), and the loop holds h[t-1], the target's post-norm hidden
at t-1. Anything stored at positions >= t is stale and is overwritten by later writes.

Why the output equals plain greedy: the target's logits at verify index i depend only on the
committed prefix and d_1..d_i; a draft is kept only if it equals the target's own argmax, so every
committed token is the target's argmax given the committed prefix, whatever the drafter proposed.

Sampling (T > 0) changes only how drafts are made (step 2) and accepted (step 4), in two modes:
- `argmax` drafting (default): drafts stay the drafter's argmax; each verify row is sampled with the
  noise keyed to its position, and a draft is kept while it equals that sample. A position's noise is
  the same in every round and in plain decoding, so the output equals plain keyed sampling token
  for token. This is the rejection rule for a one-hot q: d is kept with probability p(d), and on
  rejection the token is a draw from p with d removed. A row is warped into its candidates only
  (gemma4/sampling.py), so a verify row costs about as much as a plain sampled one.
- `sample` drafting: drafts are drawn from the drafter's warped q, kept iff u·q(d) < p(d), the first
  rejection replaced by a draw from normalize(max(0, p - q)), the bonus drawn from the last row
  (Leviathan et al. 2023). Exact in distribution, but not token-equal to plain sampling.
"""

from dataclasses import dataclass, field

import torch

from gemma4.cache import KVCache
from gemma4.config import FULL, SLIDING
from gemma4.generate import check_prompt, prefill
from gemma4.model import Gemma4Model
from gemma4.sampling import TARGET, UNIFORM, SamplerConfig, candidates, keyed_choice, keyed_uniform, sample
from mtp.drafter import Drafter

SCHEDULES = ("constant", "heuristic", "heuristic_transient")
DRAFTING = ("argmax", "sample")


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

    def record(self, drafts: list[int], a: int, block: list[int]) -> None:
        """One round: drafts d_1..d_K, a of them matched, `block` committed (cut after a stop id)."""
        committed_drafts = min(a, len(block))  # drafts after a stop id are not emitted
        self.emitted += len(block)
        if not drafts:
            return
        self.rounds.append(Round(drafts, a))
        self.drafted += len(drafts)
        self.accepted += committed_drafts
        for i in range(len(drafts)):
            if i == len(self.drafted_at):
                self.drafted_at.append(0)
                self.accepted_at.append(0)
            self.drafted_at[i] += 1
            self.accepted_at[i] += i < committed_drafts

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


# ---------------------------------------------------------------- step 4: accept
# Each rule gets the drafts d_1..d_K and the verify's logits rows 0..K (row i: the token at position
# t+1+i) and returns (a, the token committed after the a accepted drafts).

def accept_greedy(drafts: list[int], logits: torch.Tensor) -> tuple[int, int]:
    """§7: g_i = argmax of row i; keep d_i while d_i == g_{i-1}."""
    greedy = logits.argmax(dim=-1).tolist()  # g_0..g_K
    a = 0
    while a < len(drafts) and drafts[a] == greedy[a]:
        a += 1
    return a, greedy[a]  # the correction, or the bonus if all were accepted


def accept_keyed(drafts: list[int], logits: torch.Tensor, sampler: SamplerConfig, t: int) -> tuple[int, int]:
    """§11 argmax drafting: g_i is the keyed sample of warped row i at position t+1+i, exactly what
    plain sampling draws there; keep d_i while d_i == g_{i-1}. Rows past the first mismatch are
    never warped or drawn: their tokens would be discarded."""
    for i in range(len(drafts) + 1):
        g = sample(logits[i:i + 1], sampler, TARGET, [t + 1 + i])[0]
        if i == len(drafts) or drafts[i] != g:
            return i, g  # the correction, or the bonus if all were accepted


def accept_rejection(
    drafts: list[int], q: torch.Tensor, logits: torch.Tensor, sampler: SamplerConfig, t: int,
) -> tuple[int, int]:
    """§11 sample drafting: q (K, V) the drafter's warped rows, p the target's (its candidates only).
    Keep d_i iff u_i · q_i(d_i) < p_i(d_i) (strict: p = 0 is never kept), with u_i keyed to d_i's
    position. A rejection draws from max(0, p - q), which is 0 outside p's candidates."""
    for i, d in enumerate(drafts):
        position = t + 1 + i
        ids, p = candidates(logits[i], sampler)  # (M,) each
        p_d = p[ids == d].sum()  # p(d), 0 if d is not a candidate
        if not keyed_uniform(sampler.seed, UNIFORM, position) * float(q[i, d]) < float(p_d):
            residual = (p - q[i, ids]).clamp_(min=0)  # (M,) zero at d: rejected, so q(d) > p(d)
            return i, keyed_choice(ids, residual, sampler.seed, TARGET, position)  # unnormalised: same argmax
    bonus = len(drafts)  # the row after the last draft
    return bonus, sample(logits[bonus:bonus + 1], sampler, TARGET, [t + 1 + bonus])[0]


def check_sampling(sampler: SamplerConfig | None, drafting: str) -> None:
    if drafting not in DRAFTING:
        raise ValueError(f"drafting must be one of {', '.join(DRAFTING)}, got {drafting!r}")
    if drafting == "sample" and (sampler is None or sampler.greedy):
        raise ValueError("sample drafting draws from the drafter's distribution: it needs a temperature > 0")


@torch.inference_mode()
def speculative_generate(
    target: Gemma4Model, drafter: Drafter, prompt: list[int], max_new_tokens: int,
    draft_length: DraftLength, stop_ids: list[int] | tuple[int, ...] = (),
    sampler: SamplerConfig | None = None, drafting: str = "argmax",
    on_commit=None,  # noqa: ANN001 (optional callback(tokens, from_drafter flags) for streaming)
    cache: KVCache | None = None, reuse: int = 0,
) -> SpecResult:
    """Greedy with `sampler=None` or temperature 0; otherwise sampling with `drafting` (see above).
    `cache`, `reuse`: a cache already holding prompt[:reuse] (gemma4/generate.py `prefill`)."""
    check_prompt(target, prompt, max_new_tokens)
    check_sampling(sampler, drafting)
    if sampler is not None and sampler.greedy:
        sampler = None  # temperature 0 is the greedy loop itself
    sampled_drafts = sampler is not None and drafting == "sample"
    device = target.embed_tokens.weight.device
    context = target.config.max_position_embeddings
    stats = SpecStats()
    draft_length.start_call()

    # 0. Prefill: one forward over the prompt (past a reused prefix) commits the first token, sampled
    #    like every other. The drafter needs nothing for a reused prefix: it keeps no cache, and reads
    #    the target's K/V and the hidden of the prompt's last position, both the prefill's.
    cache, out = prefill(target, prompt, max_new_tokens, cache, reuse)
    stats.target_forwards += 1
    logits = out.logits[0, -1:]  # (1, V): the token at position len(prompt)
    _, first = accept_greedy([], logits) if sampler is None else accept_keyed([], logits, sampler, len(prompt) - 1)
    seq = list(prompt) + [first]
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

        # 2. Draft d_1..d_K from (seq[t], h[t-1], position t) and the target's K/V of 0..t-1:
        #    the drafter's argmax, or (sample drafting) draws from its warped q.
        drafts, q = drafter.propose(target, seq[t], hidden, t, target_kv(cache, target, t), k_eff,
                                    sampler if sampled_drafts else None) if k_eff else ([], None)

        # 3. Verify [seq[t], d_1..d_K] at positions t..t+K in one target forward.
        out = target.run(torch.tensor([[seq[t]] + drafts], device=device), cache, start_pos=t)
        stats.target_forwards += 1

        # 4. Accept a prefix of the drafts (§7 greedy, §11 sampling).
        if sampler is None:
            a, last = accept_greedy(drafts, out.logits[0])
        elif sampled_drafts and drafts:
            a, last = accept_rejection(drafts, q, out.logits[0], sampler, t)
        else:
            a, last = accept_keyed(drafts, out.logits[0], sampler, t)

        # 5. Commit d_1..d_a and the target's token after them (the correction, or the bonus if all
        #    were accepted); cut after the first stop id.
        block = drafts[:a] + [last]
        for i, token in enumerate(block):
            if token in stop_ids:
                block = block[: i + 1]
                break
        seq += block

        # 6. Roll back: positions t..t+a hold committed tokens' K/V; the rest is stale.
        cache.length = t + a + 1
        hidden = out.hidden[0, a]  # h[t'-1] with t' = t + a + 1

        stats.record(drafts, a, block)
        if drafts:
            draft_length.update(a, len(drafts))
        if on_commit:
            on_commit(block, [i < min(a, len(block)) for i in range(len(block))])
        # 7. Stop on a committed stop id or the budget: checked at the top of the loop.
