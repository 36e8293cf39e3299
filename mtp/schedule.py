"""Draft-length schedules (mtp/README.md §8): how many tokens to draft in the next round.

`DraftLength` is the protocol the loop calls, and the base class of every schedule: `start_call()`
at the start of a generate call, `k = s.next(room)` at the start of a round and `s.observe(k,
accepted)` after its verify and accept. The loop keeps no clock for it: a schedule that needs the
round's seconds reads its own. `DraftLength(initial, schedule)` makes the one named (transformers'
`num_assistant_tokens_schedule`): `Constant` (here: K never changes), the heuristics
(mtp/heuristic.py) and `auto` (mtp/auto_schedule.py), imported when named.
"""

SCHEDULES = ("constant", "heuristic", "heuristic_transient", "auto")


class DraftLength:
    """`DraftLength(initial, schedule="constant", **auto_only)`: the schedule named, from `initial`
    drafts a round (the other arguments are `auto`'s). Keep one per drafter: `heuristic` and `auto`
    carry what they learn across calls."""

    schedule = "constant"  # the name each subclass answers to

    def __new__(cls, initial: int = 1, schedule: str | None = None, *auto_args: object,
                **auto_kwargs: object) -> "DraftLength":
        # Every argument reaches __new__, then __init__. A subclass named directly (or copied) is
        # made as it is.
        if cls is not DraftLength:
            return super().__new__(cls)
        return super().__new__(named(schedule or "constant"))

    def __init__(self, initial: int, schedule: str | None = None, **auto_only: object) -> None:
        check_name(self, schedule)
        check_initial(initial)
        if given := [name for name, value in auto_only.items() if value is not None]:
            raise ValueError(f"{', '.join(given)} only apply to the auto schedule, "
                             f"not {self.schedule!r}")
        # k: the K this schedule drafts next, within the room.
        self.initial = self.k = initial

    def start_call(self) -> None:
        """A generate call begins."""

    def next(self, room: int) -> int:
        """K for this round, in 0..room (how many drafts the budget allows); K = 0 is a plain decode
        step."""
        raise NotImplementedError

    def observe(self, k: int, accepted: int) -> None:
        """The round that drafted k tokens kept `accepted` of them."""
        raise NotImplementedError


class Constant(DraftLength):
    """K = `initial` every round, within the room."""

    schedule = "constant"

    def next(self, room: int) -> int:
        check_room(room)
        return min(self.k, room)

    def observe(self, k: int, accepted: int) -> None:
        check_round(k, accepted)


def named(name: str) -> type[DraftLength]:
    """The schedule class of a name; the others' modules are imported only when named (they import
    this file)."""
    if name == "constant":
        return Constant
    if name == "auto":
        from mtp.auto_schedule import Auto
        return Auto
    if name in SCHEDULES:
        from mtp import heuristic
        return heuristic.Heuristic if name == "heuristic" else heuristic.HeuristicTransient
    raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {name!r}")


def check_name(schedule: DraftLength, name: str | None) -> None:
    if name not in (None, schedule.schedule):
        raise ValueError(f"{type(schedule).__name__} is the {schedule.schedule!r} schedule, "
                         f"not {name!r}")


def check_initial(initial: int) -> None:
    if initial < 1:
        raise ValueError(f"the number of assistant tokens must be at least 1, got {initial}")


def check_room(room: int) -> None:
    if room < 0:
        raise ValueError(f"room must be at least 0, got {room}")


def check_round(k: int, accepted: int) -> None:
    if k < 0 or not 0 <= accepted <= k:
        raise ValueError(f"accepted must be in 0..k={k}, got {accepted}")
