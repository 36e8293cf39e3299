"""The `auto` draft-length schedule (mtp/README.md §8).

`Auto` picks the K in 0..max_k that commits the most tokens per second, by the closed form of README.md
("closed form"): with α_j the chance draft j is kept given drafts 1..j-1 were, a round of K drafts commits
E(K) = 1 + Σ_{j≤K} Π_{i≤j} α_i tokens in time(K) seconds, and K = 0 is a plain decode step (E = 1, time(0)).
So it is never slower than plain decoding by its own estimates, which it learns online and keeps across calls.

A round's seconds: Auto keeps its own clock (`clock`, time.perf_counter unless given; the loop keeps none for
it). It reads it at the end of `next` and at the start of `observe`, so time(K) is the whole round as the loop
runs it: K draft steps, the verify of K + 1 rows, the acceptance and the loop's host work between them. Two
fixed costs can replace what it measures, with c_draft the seconds of one draft step (`draft_cost`) and
c_verify(n) those of a verify of n rows (`costs`):
- both fixed: time(K) = K·c_draft + c_verify(K + 1); the clock is never read.
- neither: time(K) is learned per K (below).
- `draft_cost` fixed: time(K) = K·c_draft + R(K), with R(K) = the measured round less its K draft steps (the
  verify and the host work) learned per K as time(K) is when neither is fixed.
- `costs` fixed: time(K) = K·c_draft + c_verify(K + 1), with c_draft = (the measured round less
  c_verify(K + 1)) / K, learned from rounds with K > 0 (at least 0; the host work counts as drafting).
`acceptance` (α_1..α_max_k) fixes the acceptance. A fixed quantity is never updated from observations.

Estimates:
- α_j: an exponentially weighted mean with weight WEIGHT = 0.1 per observation, so the last ~10 observations
  carry 65% of it (text changes from prose to code within tens of tokens), with a standard error of about 0.11
  at α = 0.5. Draft j of a round is tested iff drafts 1..j-1 were kept (j ≤ min(a + 1, k)); only tested drafts
  update α_j. Prior: ALPHA_PRIOR = 0.5, neither side favoured, counted as one observation: until 1/WEIGHT
  observations the estimate is the plain mean of the prior and them, so a new drafter's first rounds move it at
  once. A position never tested is taken to be as likely as the one before it (acceptance falls with depth: the
  hopeful guess, so deeper drafts get tried).
- time(K) (or R(K)) for a K timed: the running mean with the same weight, the first measurement replacing the prior.
  A plain step (K = 0) that moves time(0) by a factor moves every other K timed by the same factor: a machine that
  slows down (another process, a lower clock) slows every round alike, and a K timed long ago (a probe's, one in 40
  rounds) must follow the plain steps timed since, or Δ = time(1) - time(0) shrinks as time(0) rises and probes (or
  K = 1 itself) look cheap when they are not. So the cost of a round of K drafts is learned as a multiple of a plain
  step: only rounds of K drafts change it. An unseen K is read off the least-squares line over the timed K
  (slope ≥ 0), held between the timed K next to it: more drafts never cost less. Before two K are timed the line is
  the prior's: a round of K drafts costs 1 + DRAFT_PRIOR·K plain steps (a draft step is 0.1 of a plain step, a
  verify one plain step whatever its rows; R alone: flat), in plain steps of 1 second with none timed, scaled
  through the one timed K. c_draft (`costs` fixed) is DRAFT_PRIOR·c_verify(1) until timed. The priors are optimistic
  (on an accelerator a few rows cost what one does), so K > 0 gets tried and measured rather than ruled out by a
  guess.

Opening (acceptance not fixed): round one drafts one token, not `initial`, and so does every round until a draft
is kept (or none, once the estimates say K = 1 does not pay). One draft tests α_1, the only position a drafter
that is never right is ever tested at (deeper drafts are tested only behind kept ones), for
Δ = time(1) - time(0) over a plain step, where a first round of `initial` = 4 drafts costs time(4) - time(0)
(1.6 plain steps against 0.4 at the costs below). The round after the first kept draft drafts `initial`, the
user's or release's num_assistant_tokens: its guess of K once the drafter has shown it can be right; from then
on the estimates decide. When time is learned (`costs` not fixed) and round one's draft was rejected, the next
round with no draft kept yet and no plain step timed is a plain step: it costs nothing over plain decoding and
times time(0), so from then on Δ is measured, not the prior's.

A drafter that is never right, in plain steps (time(0) = 1), with r = Δ as the estimates give it: after n
rejections α_1 = 0.5/(n + 1) (n ≤ 9; then × 0.9 a rejection), and K = 1 pays iff (1 + α_1)/(1 + r) > 1, i.e.
α_1 > r. So the opening ends, and K = 0 begins, after the first n ≥ 1 rounds of K = 1 with 0.5/(n + 1) ≤ r:
1 round when r ≥ 1/4, ⌈1/(2r)⌉ - 1 when 0.05 < r < 1/4 (time learned: with the free plain step after the
first). They cost n·Δ ≤ max(Δ, 1/2) over plain decoding. From then on only probes draft (below), Δ each, one
round in g = max(probe_every, ⌈Δ/PROBE_SHARE⌉) after the opening's last draft: over N rounds the overhead is at
most n·Δ + N·min(Δ/probe_every, PROBE_SHARE). With c_draft = 0.3 and c_verify(n) = 1 + 0.1(n - 1), so
time(K) = 1 + 0.4·K, fixed or timed: Δ = 0.4, K = 0 from round 2, 0.4 once and 0.01 a round after (a probe in
40 rounds; tests/parts/test_schedule.py). A first round of 4 drafts: 1.6.

Probing: the estimates only test drafts the controller makes, so a stale low α_{K+1} would keep K where it is
for good (at K = 0 nothing tests α_1: no recovery when the text turns easy). So a round drafts one more than the
estimates say (a probe; until a draft is kept, at most one) once both hold since the last probe: `probe_every`
rounds (PROBE_EVERY = 16), and enough rounds that its extra draft, time(K + 1) - time(K), is at most
PROBE_SHARE = 1% of their plain steps. At K = 0 a probe is a round of one draft instead of a plain step, Δ over
it. The share is what a never-right drafter costs over plain decoding once the opening is over, whatever Δ is on
the machine at hand: where drafts are dear (Δ = 0.4 on a CPU) a probe comes every 40 rounds, where a verify of a
few rows costs what one does, every 16. A probe whose extra draft is kept is followed by another the next round
(after the `initial` round, for the first kept draft), so an easy stretch is found in about g + 4 rounds. No
probes when `acceptance` is fixed: they would learn nothing.

Work per round: `observe` updates at most k + 1 estimates and refits the line (one pass over the K timed, at
most max_k + 1); `next` runs one loop over K, reading each time off the line and its bounds; no container is
built. `estimates()` builds its table only when asked, for the statistics at the end of a run.
"""

import time
from collections.abc import Callable, Sequence

from mtp.schedule import Schedule, check_initial, check_room, check_round

WEIGHT = 0.1  # EWMA weight of one observation (α_j and seconds)
ALPHA_PRIOR = 0.5  # α_j before any test of draft j
DRAFT_PRIOR = 0.1  # a draft step, in plain steps, before one is timed
PROBE_EVERY = 16  # at most one round in this many drafts one more than the estimates say
PROBE_SHARE = 0.01  # and the probes cost at most this share of the plain steps between them
MAX_K = 8


class Auto(Schedule):
    """K in 0..max_k by the closed form and the estimates above. `costs` (seconds of a verify of n rows),
    `draft_cost` (seconds of one draft step) and `acceptance` (α_1..α_max_k) fix what they name; `clock` (seconds,
    time.perf_counter unless given) times the rounds."""

    schedule = "auto"

    def __init__(self, initial: int, max_k: int = MAX_K,
                 costs: Callable[[int], float] | None = None, draft_cost: float | None = None,
                 acceptance: Sequence[float] | None = None, probe_every: int = PROBE_EVERY,
                 clock: Callable[[], float] = time.perf_counter) -> None:
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
        self.costs, self.draft_cost, self.clock = costs, draft_cost, clock
        self.acceptance = list(acceptance) if acceptance is not None else None
        # the estimates: α_j at alpha[j-1]; R(K) per K timed (time(K) less any fixed draft steps); c_draft
        self.alpha = list(self.acceptance) if self.acceptance is not None else [ALPHA_PRIOR] * max_k
        self.tested = [0] * max_k  # observations behind alpha[j-1]
        self.rest_s: dict[int, float] = {}  # K -> EWMA of R(K) in seconds (`costs` fixed: unused)
        self.line = (0.0, 0.0, 0.0)  # the least-squares line through rest_s: mean K, mean seconds, slope
        self.draft_s: float | None = None  # c_draft learned when only `costs` is fixed
        self.started: float | None = None  # the clock at the end of next(): the round's start
        self.kept_any = False  # a draft has been kept: the opening is over
        self.initial_due = False  # the next round with room drafts `initial` (the first kept draft was just seen)
        self.since_probe = 0  # rounds since the last probe
        self.probing = False  # the K handed out by next() is a probe
        self.probe_again = False  # the last probe's extra draft was kept: the next round is a probe

    # ------------------------------------------------------------------ the loop's calls
    def start_call(self) -> None:
        pass  # the estimates carry across calls

    def next(self, room: int) -> int:
        check_room(room)
        k = self.choose(room)
        self.started = self.clock() if self.timed() else None  # last: the round starts when K is known
        return k

    def observe(self, k: int, matched: int) -> None:
        """The round since the last next(): k drafts, the first `matched` matched, its seconds off the clock."""
        now = self.clock() if self.started is not None else None  # first: the round ends when its outcome is in
        check_round(k, matched)
        if k > self.max_k:
            raise ValueError(f"k={k} is above max_k={self.max_k}")
        if self.acceptance is None:
            for j in range(min(matched + 1, k)):  # drafts 1..a kept, draft a+1 (if any) rejected
                self.tested[j] += 1
                # The mean of the prior and the first observations, then the running mean: a new estimate
                # moves at once, a settled one by WEIGHT.
                weight = max(WEIGHT, 1.0 / (self.tested[j] + 1))
                self.alpha[j] += weight * (float(j < matched) - self.alpha[j])
            if matched and not self.kept_any:
                self.kept_any = self.initial_due = True
        if now is not None:
            self.learn(k, max(0.0, now - self.started))
        self.started = None  # a round is timed once
        if self.probing:
            self.probe_again = matched == k  # the text may have turned easy: probe again next round

    def choose(self, room: int) -> int:
        """K for this round: the opening, the `initial` round, the estimates' choice or a probe (docstring)."""
        self.probing = False
        if self.acceptance is not None:  # nothing to learn: the closed form alone, no opening, no probes
            return self.best(min(self.max_k, room))
        if self.initial_due and room > 0:  # the round after the first kept draft: the user's guess, no probe
            self.initial_due = False
            return min(self.initial, room)
        deepest = self.max_k if self.kept_any else 1  # until a draft is kept, deeper ones would go untested
        top = min(deepest, room)
        if self.tested[0] == 0:
            k = top  # round one tests α_1 whatever the priors say
        elif not self.kept_any and self.costs is None and 0 not in self.rest_s:
            k = 0  # time a plain step, free over plain decoding: Δ measured from now on
        else:
            k = self.best(top)
        if room > 0:
            self.since_probe += 1
            if k == deepest:
                self.since_probe, self.probe_again = 0, False  # nothing deeper to test
            elif k < top and (self.probe_again or self.probe_due(k)):
                k, self.since_probe, self.probing, self.probe_again = k + 1, 0, True, False
        return k

    def probe_due(self, k: int) -> bool:
        """Whether this round (k drafts by the estimates) is a probe: probe_every rounds since the last one, and
        enough of them that its extra draft, time(k + 1) - time(k), is at most PROBE_SHARE of their plain steps."""
        return (self.since_probe >= self.probe_every
                and self.since_probe * PROBE_SHARE * self.time(0) >= self.time(k + 1) - self.time(k))

    # ------------------------------------------------------------------ the model
    def timed(self) -> bool:
        """Whether rounds are timed: something about time(K) is learned."""
        return self.costs is None or self.draft_cost is None

    def learn(self, k: int, seconds: float) -> None:
        """A round of k drafts took `seconds`: update what is not fixed."""
        if self.costs is None:
            rest = max(0.0, seconds - k * (self.draft_cost or 0.0))
            before = self.rest_s.get(k)
            self.rest_s[k] = ewma(before, rest)
            if k == 0 and before:  # the plain step moved, so the machine's pace did: every K timed moves with it
                pace = self.rest_s[0] / before
                self.rest_s = {j: s * pace if j else s for j, s in self.rest_s.items()}
            self.line = fit(self.rest_s)  # once a round, not once per K read off it
        elif k > 0:  # only the draft step is learned
            self.draft_s = ewma(self.draft_s, max(0.0, (seconds - self.costs(k + 1)) / k))

    def best(self, top: int) -> int:
        """argmax over K in 0..top of E(K) / time(K); ties go to the smaller K (fewer wasted drafts)."""
        best_k, best_rate = 0, 1.0 / max(self.time(0), 1e-12)  # a zero-time round would divide by 0
        expected, kept, alpha = 1.0, 1.0, ALPHA_PRIOR  # E(K), Π_{i≤K} α_i, α_K
        for k in range(1, top + 1):
            # A position never tested is taken as likely as the one before it: acceptance falls with depth,
            # so this is the hopeful guess, and it gets deeper drafts tried; a wrong one costs a round.
            alpha = self.alpha[k - 1] if self.tested[k - 1] or self.acceptance is not None or k == 1 else alpha
            kept *= alpha
            expected += kept
            rate = expected / max(self.time(k), 1e-12)
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k

    def time(self, k: int) -> float:
        """Seconds of a round of k drafts (k = 0: a plain decode step)."""
        if self.costs is not None:
            return k * self.draft_step() + self.costs(k + 1)
        return k * (self.draft_cost or 0.0) + self.rest(k)

    def draft_step(self) -> float:
        """Seconds of one draft step when `costs` is fixed: fixed, measured, or DRAFT_PRIOR plain steps."""
        if self.draft_cost is not None:
            return self.draft_cost
        return self.draft_s if self.draft_s is not None else DRAFT_PRIOR * self.costs(1)

    def rest(self, k: int) -> float:
        """R(k): the seconds of a round of k drafts less its fixed draft steps, if any."""
        seen = self.rest_s
        if k in seen:
            return seen[k]
        slope = DRAFT_PRIOR if self.draft_cost is None else 0.0  # the prior's, per plain step
        if len(seen) < 2:  # the prior's line, in plain steps: of 1 second, or scaled through the one K timed
            if seen:
                (j, r), = seen.items()
                plain = r / (1 + slope * j)
            else:
                plain = self.draft_cost / DRAFT_PRIOR if self.draft_cost else 1.0
            return plain * (1 + slope * k)
        mean_k, mean_s, slope = self.line
        line = mean_s + slope * (k - mean_k)
        lo = max((s for j, s in seen.items() if j < k), default=0.0)  # more drafts never cost less
        hi = min((s for j, s in seen.items() if j > k), default=float("inf"))
        return min(max(line, lo), max(lo, hi))

    def estimates(self) -> dict:
        """What `auto` decides on, for statistics: "alpha" (α_1..α_max_k), "tested" (observations per α_j),
        "round_s" (K -> seconds of a round of K drafts, K = 0..max_k: measured, read off the line or fixed),
        "measured" (the K timed) and "plain_s" (time(0)). Before any timing the unit is one plain step."""
        return {
            "alpha": list(self.alpha), "tested": list(self.tested),
            "round_s": {k: self.time(k) for k in range(self.max_k + 1)},
            "measured": sorted(self.rest_s), "plain_s": self.time(0),
        }


def ewma(old: float | None, x: float) -> float:
    """The running mean with weight WEIGHT; the first measurement replaces the prior outright."""
    return x if old is None else old + WEIGHT * (x - old)


def fit(seen: dict[int, float]) -> tuple[float, float, float]:
    """The least-squares line through the timed (K, seconds): mean K, mean seconds and slope (at least 0; flat
    through a single K)."""
    mean_k, mean_s = sum(seen) / len(seen), sum(seen.values()) / len(seen)
    spread = sum((j - mean_k) ** 2 for j in seen)
    slope = max(0.0, sum((j - mean_k) * (s - mean_s) for j, s in seen.items()) / spread) if spread else 0.0
    return mean_k, mean_s, slope
