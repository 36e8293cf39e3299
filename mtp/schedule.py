"""Draft-length schedules (mtp/README.md §8): how many tokens to draft in the next round.

One small class per schedule, each behind the loop's `Schedule` protocol (mtp/speculative.py): the loop calls
`start_call()` at the start of a generate call, asks `k = s.next(room)` before a round and reports it with
`s.observe(k, accepted=a, draft_seconds=..., verify_seconds=...)` after it. `DraftLength(initial, schedule)` makes
the one named (transformers' `num_assistant_tokens` and `num_assistant_tokens_schedule`).
- `Constant`: K never changes. `Heuristic`: K + 2 after a round whose drafts were all accepted, else
  max(1, K - 1), carried from one generate call to the next; `HeuristicTransient` restarts from `initial` every
  call. These never return 0 unless the room is 0.
- `Auto` (mtp/auto_schedule.py): the K in 0..max_k that commits the most tokens per second by its estimates of
  acceptance and costs, learned online and kept across calls; K = 0 (plain decoding) is among the choices.
"""

from collections.abc import Callable, Sequence

from mtp.auto_schedule import MAX_K, PROBE_EVERY, Auto, check_initial, check_room, check_round

SCHEDULES = ("constant", "heuristic", "heuristic_transient", "auto")


class Constant:
    """K = `initial` every round, within the room. `current` and `update` are the former API's: K and the rule
    after a drafting round (here, none)."""

    schedule = "constant"

    def __init__(self, initial: int) -> None:
        check_initial(initial)
        self.initial = self.current = initial

    def start_call(self) -> None:
        pass  # nothing to restart

    def next(self, room: int) -> int:
        check_room(room)
        return min(self.current, room)

    def observe(self, k: int, accepted: int, draft_seconds: float, verify_seconds: float) -> None:
        check_round(k, accepted, draft_seconds, verify_seconds)

    def update(self, accepted: int, drafted: int) -> None:
        pass  # constant: no rule


class Heuristic:
    """transformers' heuristic: K + 2 after a drafting round whose drafts were all kept, else max(1, K - 1).
    K carries from one generate call to the next."""

    schedule = "heuristic"

    def __init__(self, initial: int) -> None:
        check_initial(initial)
        self.initial = self.current = initial

    def start_call(self) -> None:
        pass  # K carries over

    def next(self, room: int) -> int:
        check_room(room)
        return min(self.current, room)

    def observe(self, k: int, accepted: int, draft_seconds: float, verify_seconds: float) -> None:
        check_round(k, accepted, draft_seconds, verify_seconds)
        if k > 0:  # a K = 0 round (no room) says nothing about the drafter
            self.update(accepted, k)

    def update(self, accepted: int, drafted: int) -> None:
        self.current = self.current + 2 if accepted == drafted else max(1, self.current - 1)


class HeuristicTransient(Heuristic):
    """The heuristic rule, restarted from `initial` at every generate call."""

    schedule = "heuristic_transient"

    def start_call(self) -> None:
        self.current = self.initial


DraftSchedule = Constant | Heuristic | HeuristicTransient | Auto  # what DraftLength makes, for annotations


def DraftLength(  # noqa: N802 (the public name of what makes a schedule, as when it was one class)
    initial: int, schedule: str = "constant", max_k: int = MAX_K, costs: Callable[[int], float] | None = None,
    draft_cost: float | None = None, acceptance: Sequence[float] | None = None, probe_every: int = PROBE_EVERY,
) -> DraftSchedule:
    """The schedule named `schedule`, from `initial` drafts a round. Keep one per drafter: `heuristic` and `auto`
    carry what they learned from one generate call to the next. `max_k`, `costs` (seconds of a verify of n rows),
    `draft_cost` (seconds of one draft step), `acceptance` (α_1..α_max_k) and `probe_every` are `auto`'s only."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if schedule == "auto":
        return Auto(initial, max_k, costs, draft_cost, acceptance, probe_every)
    check_initial(initial)
    given = [name for name, value in (("costs", costs), ("draft_cost", draft_cost), ("acceptance", acceptance))
             if value is not None]
    given += ["max_k"] * (max_k != MAX_K) + ["probe_every"] * (probe_every != PROBE_EVERY)
    if given:
        raise ValueError(f"{', '.join(given)} only apply to the auto schedule, not {schedule!r}")
    if schedule == "constant":
        return Constant(initial)
    return Heuristic(initial) if schedule == "heuristic" else HeuristicTransient(initial)
