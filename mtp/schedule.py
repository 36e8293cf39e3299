"""How many tokens to draft next (mtp/README.md §8): a constant, or the heuristic of transformers."""

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

    def next(self, room: int) -> int:
        """K for the next round, at most `room` (what the budget can still commit after the target's token)."""
        return min(self.current, room)

    def observe(self, drafted: int, accepted: int, draft_seconds: float, verify_seconds: float) -> None:
        """A round's outcome and what its two phases cost."""
        if drafted:
            self.update(accepted, drafted)
