"""The `auto` draft-length schedule (mtp/README.md §8), and the argument checks every schedule shares.

`Auto` picks the K in 0..max_k that commits the most tokens per second, by the closed form of README.md
("closed form"): with α_j the chance draft j is kept given drafts 1..j-1 were, a round of K drafts commits
E(K) = 1 + Σ_{j≤K} Π_{i≤j} α_i tokens in time(K) = K·c_draft + c_verify(K+1), and K = 0 is a plain decode step
(E = 1, time = c_verify(1)). So it is never slower than plain decoding by its own estimates, which it learns
online from `observe` (α_j, c_draft, c_verify(n)) and keeps across calls. Any of them can be fixed instead
(`acceptance`, `draft_cost`, `costs`): a fixed quantity is never updated from observations.

Estimates:
- α_j: an exponentially weighted mean with weight WEIGHT = 0.1 per observation, so the last ~10 observations
  carry 65% of it (text changes from prose to code within tens of tokens), with a standard error of about 0.11
  at α = 0.5. Draft j of a round is tested iff drafts 1..j-1 were kept (j ≤ min(a + 1, k)); only tested drafts
  update α_j. Prior: ALPHA_PRIOR = 0.5, neither side favoured, counted as one observation: until 1/WEIGHT
  observations the estimate is the plain mean of the prior and them, so a new drafter's first rounds move it at
  once. A position never tested is taken to be as likely as the one before it (acceptance falls with depth: the
  hopeful guess, so deeper drafts get tried).
- c_draft = draft_seconds / k and c_verify(n) for n = k + 1 rows: the same weight, the first measurement
  replacing the prior. An unseen n is read off the least-squares line through the seen ones (slope ≥ 0), kept
  between the bounds that hold for real kernels: more rows never cost less, and never more per row. With one n
  seen the line is flat (prior slope 0); with none, a verify costs one plain step whatever n. A draft step is
  DRAFT_PRIOR = 0.1 plain steps until one is timed. Both priors are optimistic (on an accelerator a few rows
  cost what one does), so K > 0 gets tried and measured rather than ruled out by a guess.

Opening (acceptance not fixed): round one drafts one token, not `initial`, and so does every round until a draft
is kept (or none, once the estimates say K = 1 does not pay). One draft tests α_1, the only position a drafter
that is never right is ever tested at (deeper drafts are tested only behind kept ones), for
Δ = c_draft + c_verify(2) - c_verify(1) over a plain step, where a first round of `initial` = 4 drafts costs
4·c_draft + c_verify(5) - c_verify(1) (1.6 plain steps against 0.4 at the costs below). The round after the first
kept draft drafts `initial`, the user's or release's num_assistant_tokens: its guess of K once the drafter has
shown it can be right; from then on the estimates decide.

A drafter that is never right, in plain steps (c_verify(1) = 1), with r = Δ as the estimates give it: after n
rejections α_1 = 0.5/(n + 1) (n ≤ 9; then × 0.9 a rejection), and K = 1 pays iff α_1 > r. So the opening ends,
and K = 0 begins, after the first n ≥ 1 rounds with 0.5/(n + 1) ≤ r: 1 round when r ≥ 1/4, ⌈1/(2r)⌉ - 1 when
0.05 < r < 1/4. They cost n·Δ ≤ max(Δ, 1/2) over plain decoding. From then on only probes draft (below), Δ each,
one round in probe_every: over N rounds the overhead is n·Δ + ⌊(N - n)/probe_every⌋·Δ ≤ (n + N/probe_every)·Δ.
With draft_cost 0.3 and costs(n) = 1 + 0.1(n - 1) fixed, Δ = 0.4: K = 0 from round 2, 0.4 once and 0.025 a
round after (tests/test_schedule.py). With costs learned, r is c_draft/c_verify(2) until a plain step is timed
(the line is flat through one n), so the opening may run longer than the true Δ says, each round still costing Δ.

Probing: the estimates only test drafts the controller makes, so a stale low α_{K+1} would keep K where it is
for good (at K = 0 nothing tests α_1: no recovery when the text turns easy). One round in every `probe_every`
(PROBE_EVERY = 16) drafts one more than the estimates say (until a draft is kept, at most one): at K = 0 one draft
step plus a 2-row verify instead of a 1-row one, Δ/probe_every a round (2.5% of a plain step at the costs above).
A probe whose extra draft is kept is followed by another the next round (after the `initial` round, for the first
kept draft), so an easy stretch is found in about probe_every + 4 rounds. No probes when `acceptance` is fixed:
they would learn nothing.

Work per round: `observe` updates at most k + 1 estimates and refits the verify line (one pass over the n timed,
at most max_k + 1); `next` runs one loop over K, reading each verify cost off the line and its bounds; no
container is built. `estimates()` builds its table only when asked, for the statistics at the end of a run.
"""

import math
from collections.abc import Callable, Sequence

WEIGHT = 0.1  # EWMA weight of one observation (α_j and costs)
ALPHA_PRIOR = 0.5  # α_j before any test of draft j
DRAFT_PRIOR = 0.1  # a draft step, in plain steps, before one is timed
PROBE_EVERY = 16  # one round in this many drafts one more than the estimates say
MAX_K = 8


class Auto:
    """K in 0..max_k by the closed form and the estimates above. `costs` (seconds of a verify of n rows),
    `draft_cost` (seconds of one draft step) and `acceptance` (α_1..α_max_k) fix what they name."""

    schedule = "auto"

    def __init__(self, initial: int, max_k: int = MAX_K, costs: Callable[[int], float] | None = None,
                 draft_cost: float | None = None, acceptance: Sequence[float] | None = None,
                 probe_every: int = PROBE_EVERY) -> None:
        check_initial(initial)
        if max_k < 1:
            raise ValueError(f"max_k (the most drafts per round) must be at least 1, got {max_k}")
        if probe_every < 1:
            raise ValueError(f"probe_every must be at least 1, got {probe_every}")
        if initial > max_k:
            raise ValueError(f"auto drafts at most max_k={max_k} tokens a round; initial={initial} is above it "
                             f"(pass max_k={initial} or more)")
        if acceptance is not None:
            if len(acceptance) != max_k or not all(0.0 <= x <= 1.0 for x in acceptance):
                raise ValueError(f"acceptance must hold max_k={max_k} probabilities in [0, 1], got {list(acceptance)}")
        if draft_cost is not None and draft_cost < 0:
            raise ValueError(f"draft_cost must be at least 0 seconds, got {draft_cost}")
        self.initial, self.max_k, self.probe_every = initial, max_k, probe_every
        self.costs, self.draft_cost = costs, draft_cost
        self.acceptance = list(acceptance) if acceptance is not None else None
        # the estimates: α_j at alpha[j-1], seconds per draft step, seconds per verify of n rows
        self.alpha = list(self.acceptance) if self.acceptance is not None else [ALPHA_PRIOR] * max_k
        self.tested = [0] * max_k  # observations behind alpha[j-1]
        self.draft_s: float | None = draft_cost
        self.verify_s: dict[int, float] = {}  # n -> EWMA of measured seconds (costs fixed: unused)
        self.line = (0.0, 0.0, 0.0)  # the least-squares line through verify_s: mean n, mean seconds, slope
        self.kept_any = False  # a draft has been kept: the opening is over
        self.initial_due = False  # the next round with room drafts `initial` (the first kept draft was just seen)
        self.since_probe = 0  # rounds since the last probe
        self.probing = False  # the K handed out by next() is a probe

    # ------------------------------------------------------------------ the loop's calls
    def start_call(self) -> None:
        pass  # the estimates carry across calls

    def next(self, room: int) -> int:
        """K for this round, 0..room, where room is how many drafts the budget allows."""
        check_room(room)
        self.probing = False
        if self.acceptance is not None:  # nothing to learn: the closed form alone, no opening, no probes
            return self.best(min(self.max_k, room))
        if self.initial_due and room > 0:  # the round after the first kept draft: the user's guess, no probe
            self.initial_due = False
            return min(self.initial, room)
        deepest = self.max_k if self.kept_any else 1  # until a draft is kept, deeper ones would go untested
        top = min(deepest, room)
        k = top if self.tested[0] == 0 else self.best(top)  # round one tests α_1 whatever the priors say
        if room > 0:
            self.since_probe += 1
            if k == deepest:
                self.since_probe = 0  # nothing deeper to test
            elif self.since_probe >= self.probe_every and k < top:
                k, self.since_probe, self.probing = k + 1, 0, True
        return k

    def observe(self, k: int, accepted: int, draft_seconds: float, verify_seconds: float) -> None:
        """One round: k drafts (draft_seconds), a verify of k + 1 rows (verify_seconds), `accepted` kept."""
        check_round(k, accepted, draft_seconds, verify_seconds)
        if k > self.max_k:
            raise ValueError(f"k={k} is above max_k={self.max_k}")
        if self.acceptance is None:
            for j in range(min(accepted + 1, k)):  # drafts 1..a kept, draft a+1 (if any) rejected
                self.tested[j] += 1
                # The mean of the prior and the first observations, then the running mean: a new estimate
                # moves at once, a settled one by WEIGHT.
                weight = max(WEIGHT, 1.0 / (self.tested[j] + 1))
                self.alpha[j] += weight * (float(j < accepted) - self.alpha[j])
            if accepted and not self.kept_any:
                self.kept_any = self.initial_due = True
        if self.draft_cost is None and k > 0:
            self.draft_s = ewma(self.draft_s, draft_seconds / k)
        if self.costs is None:
            self.verify_s[k + 1] = ewma(self.verify_s.get(k + 1), verify_seconds)
            self.line = fit(self.verify_s)  # once a round, not once per n read off it
        if self.probing and accepted == k:
            self.since_probe = self.probe_every - 1  # the text may have turned easy: probe again next round

    def update(self, accepted: int, drafted: int) -> None:
        """The former API's rule after a round: auto has none."""
        raise ValueError("the auto schedule learns from observe(k, accepted, draft_seconds, verify_seconds)")

    # ------------------------------------------------------------------ the model
    def best(self, top: int) -> int:
        """argmax over K in 0..top of E(K) / time(K); ties go to the smaller K (fewer wasted drafts)."""
        draft = self.draft_step()
        best_k, best_rate = 0, 1.0 / max(self.verify(1), 1e-12)  # a zero-time verify would divide by 0
        expected, kept, alpha = 1.0, 1.0, ALPHA_PRIOR  # E(K), Π_{i≤K} α_i, α_K
        for k in range(1, top + 1):
            # A position never tested is taken as likely as the one before it: acceptance falls with depth,
            # so this is the hopeful guess, and it gets deeper drafts tried; a wrong one costs a round.
            alpha = self.alpha[k - 1] if self.tested[k - 1] or self.acceptance is not None or k == 1 else alpha
            kept *= alpha
            expected += kept
            rate = expected / max(k * draft + self.verify(k + 1), 1e-12)
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k

    def draft_step(self) -> float:
        """Seconds of one draft step: fixed, measured, or DRAFT_PRIOR plain steps."""
        return self.draft_s if self.draft_s is not None else DRAFT_PRIOR * self.verify(1)

    def verify(self, n: int) -> float:
        """Seconds of a verify of n rows (n = 1: a plain decode step)."""
        if self.costs is not None:
            return self.costs(n)
        seen = self.verify_s
        if n in seen:
            return seen[n]
        if not seen:  # no timing: one plain step, or the plain step the fixed draft cost implies
            return self.draft_cost / DRAFT_PRIOR if self.draft_cost else 1.0
        mean_n, mean_v, slope = self.line
        line = mean_v + slope * (n - mean_n)
        lo, hi = 0.0, math.inf  # more rows never cost less, nor more per row
        for m, v in seen.items():
            if m < n:
                lo, hi = max(lo, v), min(hi, v * n / m)
            else:
                lo, hi = max(lo, v * n / m), min(hi, v)
        return min(max(line, lo), max(lo, hi))

    def estimates(self) -> dict:
        """What `auto` decides on, for statistics: "alpha" (α_1..α_max_k), "tested" (observations per
        α_j), "draft_s", "verify_s" (n -> seconds for n = 1..max_k+1, measured or read off the line),
        "measured" (the n timed), "plain_s". Before any timing the unit is one plain step."""
        return {
            "alpha": list(self.alpha), "tested": list(self.tested), "draft_s": self.draft_step(),
            "verify_s": {n: self.verify(n) for n in range(1, self.max_k + 2)},
            "measured": sorted(self.verify_s), "plain_s": self.verify(1),
        }


def ewma(old: float | None, x: float) -> float:
    """The running mean with weight WEIGHT; the first measurement replaces the prior outright."""
    return x if old is None else old + WEIGHT * (x - old)


def fit(seen: dict[int, float]) -> tuple[float, float, float]:
    """The least-squares line through the timed (n, seconds): mean n, mean seconds and slope (at least 0; flat
    through a single n)."""
    mean_n, mean_v = sum(seen) / len(seen), sum(seen.values()) / len(seen)
    spread = sum((m - mean_n) ** 2 for m in seen)
    slope = max(0.0, sum((m - mean_n) * (v - mean_v) for m, v in seen.items()) / spread) if spread else 0.0
    return mean_n, mean_v, slope


# ---------------------------------------------------------------------- the checks every schedule shares
def check_initial(initial: int) -> None:
    if initial < 1:
        raise ValueError(f"the number of assistant tokens must be at least 1, got {initial}")


def check_room(room: int) -> None:
    if room < 0:
        raise ValueError(f"room must be at least 0, got {room}")


def check_round(k: int, accepted: int, draft_seconds: float, verify_seconds: float) -> None:
    if not 0 <= accepted <= k:
        raise ValueError(f"accepted must be in 0..k={k}, got {accepted}")
    if draft_seconds < 0 or verify_seconds < 0:
        raise ValueError(f"times must be at least 0 seconds, got {draft_seconds}, {verify_seconds}")
