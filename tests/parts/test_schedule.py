"""Draft-length schedules (mtp/schedule.py, mtp/heuristic.py, mtp/auto_schedule.py), the controller alone: no
models, and no wall clock (`auto` times its rounds on a clock each test moves by hand).

- With fixed costs and acceptance, `auto` picks the K the closed form says (E(K)/time(K) by brute force
  here): α = 1 with cheap drafts -> max_k (or the room), α = 0 -> 0, a verify as dear as 3 decode
  steps -> the computed optimum; ties go to the smaller K.
- A drafter that is never right, with CPU-like round times, drives `auto` to K = 0 from round 2
  and keeps it there but for one probe in every probe_every rounds or more (as many as make Δ at most
  PROBE_SHARE of their plain steps); with costs fixed or timed, K = 0 comes after the rounds auto_schedule.py
  states, never K > 1, and the overhead over N plain steps is n·Δ plus Δ a probe. When the probes are kept
  again, the estimates choose K > 0 within that gap + 4 rounds, even after 200 rounds at K = 0, and K climbs
  to max_k. A probe drafts one more than the
  estimates say, when the room allows, again the next round if its extra draft was kept, never at
  max_k nor with acceptance fixed. The first kept draft is followed by a round of `initial`.
- A machine that turns twice as slow (or fast) mid-run changes no decision: only the probes draft, Δ/time(0)
  stays 0.4.
- Only tested drafts update α_j; a round's seconds are those from next() to observe(), learned per K and read
  off a line for an unseen K; one fixed cost makes the other learned; fixed quantities are never updated (and
  with both costs fixed the clock is never read); the estimates carry across calls.
- `constant`, `heuristic` and `heuristic_transient` give transformers' K sequences; `DraftLength(...)` is an
  instance of Schedule and of the named schedule's class; bad arguments raise ValueError.
"""

import copy
import itertools
import math

import pytest

from mtp.auto_schedule import ALPHA_PRIOR, PROBE_EVERY, PROBE_SHARE, WEIGHT, Auto
from mtp.heuristic import Heuristic, HeuristicTransient
from mtp.draft_length import SCHEDULES, DraftLength
from mtp.schedule import Constant, Schedule


def draft_s(k: int) -> float:
    return 0.3 * k  # a draft step: 0.3 plain steps (the demo pair on CPU: about a sixth)


def verify_s(n: int) -> float:
    return 1.0 + 0.1 * (n - 1)  # a verify of n rows: one plain step plus 0.1 a row


def round_s(k: int) -> float:
    return draft_s(k) + verify_s(k + 1)  # a round of k drafts: 1 + 0.4·k plain steps


class Clock:
    """A clock the test moves by hand: next() reads 0, observe() the round's seconds, exactly."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def never() -> float:
    raise AssertionError("the clock was read")


def auto(initial: int, **options) -> Schedule:  # noqa: ANN003 (Auto's own options)
    return DraftLength(initial, "auto", clock=Clock(), **options)


def feed(d: Schedule, k: int, accepted: int, seconds: float) -> None:
    """A round of k drafts that took `seconds`, whatever next() chose: the tests of the estimates pick their k."""
    d.clock.now = 0.0
    d.next(k)
    d.clock.now = seconds
    d.observe(k, accepted)


def closed_form(alpha: list[float], draft: float, costs, top: int) -> int:  # noqa: ANN001 (a cost function)
    """argmax over K in 0..top of E(K)/time(K), written straight from the formula; the first max wins."""
    def rate(k: int) -> float:
        expected = 1.0
        for j in range(1, k + 1):
            kept = 1.0
            for i in range(j):
                kept *= alpha[i]
            expected += kept
        return expected / (k * draft + costs(k + 1))
    rates = [rate(k) for k in range(top + 1)]
    return rates.index(max(rates))


def fixed(alpha: list[float], draft: float, costs) -> Schedule:  # noqa: ANN001
    return DraftLength(1, "auto", max_k=len(alpha), costs=costs, draft_cost=draft, acceptance=alpha)


# ---------------------------------------------------------------- the closed form
def test_all_kept_and_cheap_drafts_draft_the_most() -> None:
    d = fixed([1.0] * 8, 0.05, lambda n: 1.0)
    assert [d.next(room) for room in (100, 8, 3, 0)] == [8, 8, 3, 0]


def test_never_kept_means_plain_decoding() -> None:
    d = fixed([0.0] * 8, 0.05, lambda n: 1.0)
    assert d.next(100) == 0
    d = fixed([0.0] * 8, 0.0, lambda n: 1.0)  # free drafts: every K ties at 1 token a step; the smallest wins
    assert d.next(100) == 0


def test_equal_rates_go_to_the_smaller_k() -> None:
    # α = 1, verify(n) = n, no draft cost: every K commits K+1 tokens in K+1 steps
    d = fixed([1.0] * 4, 0.0, lambda n: float(n))
    assert d.next(4) == 0


def dear_verify(n: int) -> float:
    return 1.0 if n == 1 else 3.0  # a verify of 2 or more rows costs 3 decode steps


@pytest.mark.parametrize("alpha", [[0.9] * 8, [0.8] * 8, [0.6] * 8, [0.95, 0.9, 0.8, 0.7, 0.5, 0.3, 0.2, 0.1],
                                   [1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]])
@pytest.mark.parametrize("draft", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("costs", [dear_verify, verify_s, lambda n: 1.0])
def test_the_optimum_of_the_closed_form(alpha: list[float], draft: float, costs) -> None:  # noqa: ANN001
    d = fixed(alpha, draft, costs)
    for room in (0, 1, 2, 5, 8, 20):
        assert d.next(room) == closed_form(alpha, draft, costs, min(room, 8)), room


def test_a_dear_verify_by_hand() -> None:
    # α = 0.9, draft 0.1, verify(n > 1) = 3: E(K) = 1 + 0.9 + ... + 0.9^K = 10 - 9·0.9^K, time = 3 + 0.1·K.
    # K = 0: 1/1 = 1; K = 4: (10 - 9·0.6561)/3.4 = 4.0951/3.4 = 1.204; K = 8: (10 - 9·0.4305)/3.8
    # = 6.1258/3.8 = 1.612; rates rise with K up to 8, so max_k; with max_k 2: 2.71/3.2 = 0.85 < 1 -> 0.
    assert closed_form([0.9] * 8, 0.1, dear_verify, 8) == 8
    assert fixed([0.9] * 8, 0.1, dear_verify).next(100) == 8
    assert fixed([0.9] * 2, 0.1, dear_verify).next(100) == 0
    assert fixed([0.9] * 8, 0.1, dear_verify).next(4) == 4  # 1.204 > 1


# ---------------------------------------------------------------- learning online
def run(d: Schedule, rounds: int, keep: bool, room: int = 100) -> list[int]:
    """`rounds` rounds as the loop plays them, with the CPU-like round times above: every draft kept, or none."""
    ks = []
    for _ in range(rounds):
        d.clock.now = 0.0
        k = d.next(room)
        d.clock.now = round_s(k)
        d.observe(k, matched=k if keep else 0)
        ks.append(k)
    return ks


def probe_gap(d: Schedule, probe_every: int = PROBE_EVERY) -> int:
    """Rounds from a probe to the next at K = 0 (mtp/auto_schedule.py `probe_due`): at least probe_every, and enough
    that the probe's extra draft, Δ = time(1) - time(0), is at most PROBE_SHARE of their plain steps."""
    delta, plain = d.time(1) - d.time(0), d.time(0)
    return next(n for n in itertools.count(probe_every) if n * PROBE_SHARE * plain >= delta)


def test_a_drafter_never_right_reaches_plain_decoding() -> None:
    d = auto(4)
    ks = run(d, 100, keep=False)
    # Round one drafts one token, not `initial`; α_1, the mean of the prior and the observation, falls 0.5 -> 0.25.
    # Round two is a plain step, timed (no draft kept yet, no plain step timed). From then on time(K) is the line
    # through K = 0 and 1, 1 + 0.4·K: K = 1 pays iff (1 + α_1)/1.4 > 1, i.e. α_1 > 0.4. So K = 0 from round 2.
    assert ks[:4] == [1, 0, 0, 0]
    # From then on only the probes draft, K = 1 each: Δ = 0.4 plain steps, so one round in 40 (not PROBE_EVERY: that
    # many rounds' plain steps pay for a probe at PROBE_SHARE), counted from round 1.
    gap = probe_gap(d)
    assert gap in (40, 41)  # 40 · 0.01 · 1.0 against 1.4 - 1.0, within a rounding of either
    assert [(i, k) for i, k in enumerate(ks) if i >= 1 and k] == [(gap * m, 1) for m in (1, 2)]
    e = d.estimates()
    assert e["plain_s"] == pytest.approx(1.0) and e["round_s"][1] == pytest.approx(1.4)
    assert e["round_s"][8] == pytest.approx(4.2)  # 8 drafts: the line
    assert e["measured"] == [0, 1]
    assert e["alpha"][1:] == [ALPHA_PRIOR] * 7 and e["tested"][1:] == [0] * 7  # a = 0 tests draft 1 only


def rounds_to_plain(r: float) -> int:
    """mtp/auto_schedule.py: the opening ends after the first n ≥ 1 rounds with 0.5/(n + 1) ≤ r."""
    return 1 if r >= 0.25 else math.ceil(1 / (2 * r)) - 1


# (draft step, verify slope per row, plain step, probe_every): r = (draft + slope)/1 in plain steps
ROADS = [(0.3, 0.1, 1.0, PROBE_EVERY), (0.15, 0.05, 1.0, PROBE_EVERY), (0.08, 0.02, 2.0, PROBE_EVERY),
         (0.05, 0.02, 0.5, 4), (0.01, 0.01, 1.0, PROBE_EVERY)]


@pytest.mark.parametrize("timed", [False, True])
@pytest.mark.parametrize("draft, slope, plain, probe_every", ROADS)
def test_the_road_to_plain_decoding_and_its_overhead(draft: float, slope: float, plain: float,
                                                     probe_every: int, timed: bool) -> None:
    """A drafter never right, its costs fixed (the clock never read) or timed off the clock: K = 0 after the
    rounds the docstring states (timed: with a plain step after the first), never K > 1, and the overhead over
    N plain steps is n·Δ plus one Δ a probe, Δ = time(1) - time(0)."""
    costs = lambda n: plain * (1 + slope * (n - 1))  # noqa: E731
    seconds = lambda k: k * (plain * draft) + costs(k + 1)  # noqa: E731 (as auto sums the fixed costs)
    if timed:
        d = auto(4, probe_every=probe_every)
    else:
        d = DraftLength(4, "auto", costs=costs, draft_cost=plain * draft, probe_every=probe_every, clock=never)
        d.clock = Clock()  # read by nobody: run() only sets it
    N, ks = 400, []
    for _ in range(N):
        d.clock.now = 0.0
        k = d.next(100)
        d.clock.now = seconds(k)
        d.observe(k, matched=0)
        ks.append(k)
    if not timed:
        assert d.estimates()["measured"] == []
    delta = seconds(1) - seconds(0)
    r = delta / costs(1)
    end = next(i for i in range(N) if ks[i:i + 2] == [0, 0])  # the opening: rounds 1..end
    n = sum(ks[:end])
    if r > 0.05:
        assert n == rounds_to_plain(r)
    assert ks[:end] == ([1, 0] + [1] * (n - 1) if timed and n > 1 else [1] * n)  # timed: a plain step after one
    assert max(ks) == 1  # until a draft is kept, at most one a round, probes included
    assert n * delta <= max(delta, costs(1) / 2)  # the opening: at most half a plain step, or one K = 1 round
    probes = [i for i in range(end, N) if ks[i]]
    gap = probe_gap(d, probe_every)
    assert probes == [end - 1 + gap * m for m in range(1, (N - end) // gap + 1)]  # after round end
    overhead = sum(seconds(k) for k in ks) - N * costs(1)  # a round commits 1 token
    assert overhead == pytest.approx((n + len(probes)) * delta)
    # The probes: Δ/probe_every a round at most, and at most PROBE_SHARE of a plain step.
    assert overhead <= n * delta + N * min(delta / probe_every, PROBE_SHARE * costs(1)) + 1e-9


@pytest.mark.parametrize("pace", [2.0, 0.5])
def test_a_machine_that_changes_pace_changes_no_decision(pace: float) -> None:
    """A never-right drafter on a machine that turns `pace` times slower (2: another process starts) or faster
    after 200 rounds: every round's seconds scale alike, so Δ/time(0) and the decisions stay as they were. Only
    the probes draft, one in probe_gap rounds (40 here), before and after. Were time(1), timed only at probes,
    left behind while time(0) follows the plain steps, Δ would shrink (pace 2: to nothing, and K = 1 would look
    cheaper than a plain step) or grow (pace 0.5)."""
    d = auto(4)
    run(d, 200, keep=False)
    gap = probe_gap(d)
    ks = []
    for _ in range(400):
        d.clock.now = 0.0
        k = d.next(100)
        d.clock.now = pace * round_s(k)
        d.observe(k, matched=0)
        ks.append(k)
    # Within the EWMA's lag: a probe timed while time(0) still climbs to the new pace sees Δ a little off.
    assert (d.time(1) - d.time(0)) / d.time(0) == pytest.approx(0.4, rel=0.1)
    assert max(ks) == 1 and sum(ks) <= 400 // gap + 2  # 9 to 11 here; 21 when only K = 0 followed the pace
    assert d.time(0) == pytest.approx(pace, rel=1e-6)


def test_the_first_kept_draft_is_followed_by_initial() -> None:
    d = auto(4)
    assert run(d, 2, keep=True) == [1, 4]  # one draft, kept: then `initial`, whatever the estimates say
    d = auto(4)
    run(d, 4, keep=False)  # K = 0 from round 2
    gap = probe_gap(d)
    run(d, gap + 4, keep=False)  # and a probe at round gap + 1
    assert d.next(0) == 0  # no room: `initial` waits for a round that has some
    assert run(d, gap - 8, keep=False) == [0] * (gap - 8)
    assert run(d, 1, keep=True) == [1]  # the next probe, kept
    assert d.next(3) == 3  # `initial`, within the room
    assert d.next(100) == 1 and d.probing  # then the probe the kept one asked for (the estimates still say 0)


@pytest.mark.parametrize("idle", [0, 200])
def test_the_estimates_recover_when_drafts_are_kept_again(idle: int) -> None:
    d = auto(4)
    run(d, 4 + idle, keep=False)
    assert d.best(8) == 0
    # Now every draft is kept. The first probe comes within probe_gap rounds; the first kept draft is followed
    # by a round of `initial` drafts and a kept probe by another, so α_1 is tested every round from then on.
    # After 200 rounds at K = 0 (round one and four rejected probes, one in 41 rounds) α_1 = 0.5/6 = 0.083, and
    # the kept probe, the `initial` round and two more kept probes lift it above 0.4 (= r, time(K) = 1 + 0.4·K):
    # 0.21, 0.31, 0.39, 0.45. So the estimates choose K > 0 within probe_gap + 4 rounds.
    ks, best = [], []
    for _ in range(probe_gap(d) + 4):
        ks += run(d, 1, keep=True)
        best.append(d.best(8))
    assert best[-1] > 0
    first = next(i for i, k in enumerate(ks) if k)
    assert all(ks[first:])  # once a probe is kept, every round drafts
    # Deeper positions are probed the same way, one more draft at a time: K climbs to max_k (20 rounds after the
    # first kept probe with idle 0, 26 with idle 200).
    assert 8 in run(d, 40, keep=True)


def test_only_tested_drafts_update_alpha() -> None:
    d = auto(4)
    d.observe(4, matched=1)  # no next() before it: a round whose start is unknown, so nothing is timed
    # Draft 1 kept, draft 2 tested and rejected, drafts 3 and 4 never tested.
    # A first observation moves an estimate halfway (the mean of the prior and it); later ones by WEIGHT.
    assert d.alpha[:4] == [(ALPHA_PRIOR + 1) / 2, ALPHA_PRIOR / 2, ALPHA_PRIOR, ALPHA_PRIOR]
    assert d.tested[:4] == [1, 1, 0, 0]
    assert d.estimates()["measured"] == []
    feed(d, 3, 3, 1.3)  # all kept: 1..3 tested, none rejected
    assert d.tested[:4] == [2, 2, 1, 0]
    assert d.alpha[2] == pytest.approx((ALPHA_PRIOR + 1) / 2)
    assert d.alpha[0] == pytest.approx(0.75 + 1 / 3 * 0.25)  # the mean of the prior and two observations
    assert WEIGHT == 0.1  # the docstring's weight


def test_a_round_lasts_from_next_to_observe() -> None:
    d = auto(1)
    d.clock.now = 5.0
    k = d.next(100)
    d.clock.now = 5.7
    d.observe(k, matched=0)
    d.clock.now = 100.0  # the loop's work after observe() (commit, streaming) is not the round's
    d.next(100)
    d.clock.now = 100.3
    d.observe(0, matched=0)
    assert (k, d.rest_s) == (1, {1: pytest.approx(0.7), 0: pytest.approx(0.3)})


def test_round_times_are_learned_per_k_and_read_off_a_line() -> None:
    d = auto(1)
    e = d.estimates()  # priors: a round of K drafts costs 1 + 0.1·K plain steps of 1 second
    assert e["plain_s"] == 1.0 and e["round_s"][8] == pytest.approx(1.8) and e["measured"] == []
    feed(d, 4, 0, 0.7)
    assert d.time(0) == pytest.approx(0.5) and d.time(8) == pytest.approx(0.9)  # one K: the prior's line, 0.7/1.4
    feed(d, 0, 0, 0.3)
    assert d.time(2) == pytest.approx(0.5) and d.time(8) == pytest.approx(1.1)  # the line 0.3 + 0.1·K
    feed(d, 0, 0, 0.4)
    assert d.time(0) == pytest.approx(0.31)  # EWMA: 0.3 + 0.1·(0.4 - 0.3)
    d = auto(1)
    for k, s in ((1, 2.0), (2, 1.0), (3, 2.0)):  # noisy rounds: the line is flat at their mean, 5/3
        feed(d, k, 0, s)
    # Held between the timed K next to it: no more than a round of 2 drafts (1.0) at K = 0, no less than one of
    # 3 drafts (2.0) at K = 4: more drafts never cost less.
    assert d.time(0) == pytest.approx(1.0) and d.time(4) == pytest.approx(2.0)
    d = auto(1)
    feed(d, 1, 0, 1.0)
    feed(d, 2, 0, 1.8)
    assert d.time(0) == pytest.approx(0.2) and d.time(5) == pytest.approx(4.2)  # the line 1 + 0.8(K - 1)


def test_one_fixed_cost_makes_the_other_learned() -> None:
    d = auto(1, draft_cost=0.2)  # the round less its draft steps is learned per K
    assert d.time(0) == pytest.approx(2.0) and d.time(3) == pytest.approx(2.6)  # prior: a plain step is 0.2/0.1
    feed(d, 3, 0, 1.9)  # R(3) = 1.9 - 3·0.2 = 1.3, flat through it while one K is timed
    assert d.time(0) == pytest.approx(1.3) and d.time(8) == pytest.approx(2.9)
    costs = lambda n: 1.0 + 0.1 * (n - 1)  # noqa: E731
    d = auto(1, costs=costs)  # the draft step is learned: (round - c_verify(K + 1))/K
    assert d.draft_step() == pytest.approx(0.1)  # prior: 0.1 of a plain step
    feed(d, 2, 0, 1.8)  # (1.8 - c_verify(3) = 1.2)/2
    assert d.draft_step() == pytest.approx(0.3) and d.time(4) == pytest.approx(4 * 0.3 + 1.4)
    feed(d, 0, 0, 5.0)  # a plain step: no draft to learn from
    assert d.draft_step() == pytest.approx(0.3) and d.estimates()["measured"] == []


def test_fixed_quantities_are_not_updated() -> None:
    costs = [0.0, 1.0, 1.1, 1.2, 1.3, 1.4]  # [n]: a verify of n rows
    d = DraftLength(1, "auto", max_k=4, costs=costs.__getitem__, draft_cost=0.2, acceptance=[0.7] * 4, clock=never)
    before = d.estimates()
    for k in (4, 0, 2):
        d.next(4)  # both costs fixed: the clock is never read
        d.observe(k, matched=k // 2)
    assert d.estimates() == before
    d = auto(1, max_k=4, acceptance=[0.7] * 4)  # acceptance fixed, round times learned
    feed(d, 2, 0, 1.0)
    assert d.alpha == [0.7] * 4 and d.time(2) == pytest.approx(1.0)


def test_estimates_and_probing_carry_across_calls() -> None:
    d = auto(4)
    run(d, 10, keep=False)
    e = d.estimates()
    d.start_call()
    assert d.estimates() == e and d.next(100) == 0
    twin = copy.deepcopy(d)  # as the batch loop gives each row its own
    assert isinstance(twin, Auto) and twin.estimates() == e


def test_probes_draft_one_more_when_there_is_room() -> None:
    # Flat verify, draft step 0.6 (both fixed: no clock): K = 1 pays iff (1 + α_1)/1.6 > 1, i.e. α_1 > 0.6.
    d = DraftLength(1, "auto", max_k=4, costs=lambda n: 1.0, draft_cost=0.6, probe_every=3, clock=never)
    d.observe(1, matched=0)  # α_1 = 0.25: K = 0 is best
    assert [d.next(0) for _ in range(6)] == [0] * 6  # no room: nothing to probe, and no round counted
    gap = probe_gap(d, 3)  # Δ = 0.6: 60 rounds' plain steps pay for a probe, not 3
    assert [d.next(1) for _ in range(2 * gap)] == ([0] * (gap - 1) + [1]) * 2
    d.observe(1, matched=1)  # the probe kept: the first kept draft
    assert d.alpha[0] == pytest.approx(0.5) and d.best(4) == 0  # (0.5 + 0 + 1) / 3
    assert d.next(4) == 1 and not d.probing  # `initial` (1 here) drafts: its own round, not a probe
    assert d.next(4) == 1 and d.probing  # then the probe the kept one asked for
    d.observe(1, matched=1)  # kept again: α_1 = 0.625 > 0.6
    assert d.best(4) == 1 and d.next(4) == 2 and d.probing  # the estimates draft one; the kept probe asks one more
    d = DraftLength(1, "auto", max_k=2, costs=lambda n: 1.0, draft_cost=0.01, probe_every=2, clock=never)
    d.observe(1, matched=1)
    assert d.next(2) == 1  # the first kept draft: a round of `initial`
    assert [d.next(2) for _ in range(4)] == [2, 2, 2, 2]  # at max_k: nothing deeper to probe
    assert [d.next(1) for _ in range(3)] == [1, 1, 1]  # room 1: a probe of 2 drafts does not fit
    d = DraftLength(1, "auto", max_k=2, costs=lambda n: 1.0, draft_cost=0.5, acceptance=[0.0, 0.0], probe_every=1,
                    clock=never)
    assert [d.next(2) for _ in range(3)] == [0, 0, 0]  # acceptance fixed: a probe would learn nothing


# ---------------------------------------------------------------- constant and heuristic
ROUNDS = [(100, 9), (100, 9), (100, 0), (3, 9), (100, 1), (0, 0), (100, 0), (100, 0), (100, 0), (100, 9)]


@pytest.mark.parametrize("schedule", ["constant", "heuristic", "heuristic_transient"])
def test_constant_and_heuristic_sequences(schedule: str) -> None:
    """K within the room; heuristic: K + 2 after a round with every draft kept, else max(1, K - 1), and no
    change after a K = 0 round (transformers' rule)."""
    d, ks = DraftLength(3, schedule), []
    for room, a in ROUNDS:
        k = d.next(room)
        d.observe(k, matched=min(a, k))
        ks.append(k)
    expected = {"constant": [3, 3, 3, 3, 3, 0, 3, 3, 3, 3], "heuristic": [3, 5, 7, 3, 8, 0, 7, 6, 5, 4],
                "heuristic_transient": [3, 5, 7, 3, 8, 0, 7, 6, 5, 4]}
    assert ks == expected[schedule]
    assert d.k == {"constant": 3, "heuristic": 6, "heuristic_transient": 6}[schedule]  # the K drafted next


def test_heuristic_carries_across_calls_and_transient_restarts() -> None:
    for schedule, grown, next_call in (("heuristic", 6, 6), ("heuristic_transient", 6, 2), ("constant", 2, 2)):
        d = DraftLength(2, schedule)
        d.start_call()
        for _ in range(2):  # two rounds with every draft kept: 2 -> 4 -> 6
            k = d.next(100)
            d.observe(k, matched=k)
        assert d.k == grown, schedule
        d.start_call()
        assert d.next(100) == next_call, schedule


def test_draft_length_makes_the_named_schedule() -> None:
    kinds = {"constant": Constant, "heuristic": Heuristic, "heuristic_transient": HeuristicTransient, "auto": Auto}
    assert SCHEDULES == tuple(kinds)
    for name, kind in kinds.items():
        d = DraftLength(4, name)
        assert type(d) is kind and isinstance(d, Schedule) and d.schedule == name
        assert type(copy.deepcopy(d)) is kind
    assert type(DraftLength(4)) is Constant
    assert type(Heuristic(2)) is Heuristic and Heuristic(2).k == 2  # a subclass named directly
    assert type(Auto(2, max_k=4)) is Auto


def test_bad_arguments() -> None:
    for args, kwargs, message in [
        ((4, "fast"), {}, "schedule must be one of constant, heuristic, heuristic_transient, auto, got 'fast'"),
        ((0,), {}, "at least 1"), ((0, "auto"), {}, "at least 1"),
        ((4, "auto"), {"max_k": 0}, "max_k"), ((9, "auto"), {}, "initial=9 is above it"),
        ((4, "constant"), {"max_k": 4}, "only apply to the auto schedule"),
        ((4, "heuristic"), {"acceptance": [0.5] * 8}, "only apply to the auto schedule"),
        ((4, "constant"), {"clock": never}, "clock only apply to the auto schedule"),
        ((2, "auto"), {"max_k": 2, "acceptance": [0.5]}, "acceptance must hold max_k=2"),
        ((2, "auto"), {"max_k": 2, "acceptance": [0.5, 1.5]}, "acceptance must hold"),
        ((2, "auto"), {"probe_every": 0}, "probe_every"), ((2, "auto"), {"draft_cost": -1.0}, "draft_cost"),
    ]:
        with pytest.raises(ValueError, match=message):
            DraftLength(*args, **kwargs)
    with pytest.raises(TypeError):
        Heuristic(2, "auto")  # a class takes no schedule name: DraftLength does
    d = auto(2, max_k=2)
    with pytest.raises(ValueError, match="room"):
        d.next(-1)
    with pytest.raises(ValueError, match="matched"):
        d.observe(1, matched=2)
    with pytest.raises(ValueError, match="above max_k"):
        d.observe(3, matched=0)
    with pytest.raises(ValueError, match="matched"):
        DraftLength(2).observe(1, matched=-1)
