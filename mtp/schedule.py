"""Draft-length schedules (mtp/README.md §8): how many tokens the drafter proposes next round.

The loop calls a `Schedule` three times: `start_call()` when a generate call begins,
`k = s.next(room)` at the start of a round, and `s.observe(k, matched)` after its verify, with
`matched` the drafts that equalled the target's tokens. The loop keeps no clock for it: a schedule
that needs a round's seconds reads its own. `Constant` drafts the same K every round. The schedules
that learn (mtp/heuristic.py, mtp/auto_schedule.py) and `DraftLength(initial, name)`, which makes a
schedule by name, are beside it (mtp/draft_length.py)."""


class Schedule:
    """What the loop calls; every schedule derives from it. Keep one per drafter: a schedule that
    learns carries what it learned into the next call."""

    schedule: str  # the name DraftLength makes it by

    def start_call(self) -> None:
        """A generate call begins."""

    def next(self, room: int) -> int:
        """K for this round, in 0..room (the drafts the budget allows); K = 0 is a plain decode
        step."""
        raise NotImplementedError

    def observe(self, k: int, matched: int) -> None:
        """The round that drafted k tokens matched the target on the first `matched` of them."""
        raise NotImplementedError


class Constant(Schedule):
    """K = `initial` every round, within the room."""

    schedule = "constant"

    def __init__(self, initial: int) -> None:
        check_initial(initial)
        # The K drafted next: constant here, learned by the heuristics that derive from this.
        self.initial = self.k = initial

    def next(self, room: int) -> int:
        check_room(room)
        return min(self.k, room)

    def observe(self, k: int, matched: int) -> None:
        check_round(k, matched)


def check_initial(initial: int) -> None:
    if initial < 1:
        raise ValueError(f"the number of assistant tokens must be at least 1, got {initial}")


def check_room(room: int) -> None:
    if room < 0:
        raise ValueError(f"room must be at least 0, got {room}")


def check_round(k: int, matched: int) -> None:
    if k < 0 or not 0 <= matched <= k:
        raise ValueError(f"matched must be in 0..k={k}, got {matched}")
