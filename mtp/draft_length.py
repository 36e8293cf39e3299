"""`DraftLength(initial, schedule)`: the draft-length schedule named, as transformers names them
(`num_assistant_tokens`, `num_assistant_tokens_schedule`). `constant` is mtp/schedule.py's `Constant`; the
heuristics (mtp/heuristic.py) and `auto` (mtp/auto_schedule.py) are imported only when named."""

from mtp.schedule import Constant, Schedule

SCHEDULES = ("constant", "heuristic", "heuristic_transient", "auto")


def DraftLength(initial: int = 1, schedule: str | None = None, **auto_options: object) -> Schedule:  # noqa: N802
    """The schedule named (`constant` when None), drafting `initial` tokens in its first round. `auto_options`
    are `auto`'s own (mtp/auto_schedule.py `Auto`); another schedule refuses them. (Capitalised: it is called
    like the class it makes.)"""
    name = schedule or "constant"
    if name not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {name!r}")
    if name == "auto":
        from mtp.auto_schedule import Auto
        return Auto(initial, **auto_options)  # type: ignore[arg-type]
    if given := [option for option, value in auto_options.items() if value is not None]:
        raise ValueError(f"{', '.join(given)} only apply to the auto schedule, not {name!r}")
    if name == "constant":
        return Constant(initial)
    from mtp import heuristic
    return heuristic.Heuristic(initial) if name == "heuristic" else heuristic.HeuristicTransient(initial)
