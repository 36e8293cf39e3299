"""Gemma 4 Multi-Token-Prediction drafter and the hand-written speculative decoding loop. Its names are imported
from their modules on first use (PEP 562): importing the loop loads no loader."""

from importlib import import_module

WHERE = {name: module for module, names in {
    "drafter": "Drafter DrafterConfig", "extras.conversation": "ContextFull Conversation Reply",
    "loading": "check_pair load_drafter", "draft_length": "SCHEDULES DraftLength", "schedule": "Constant Schedule",
    "stats": "Round SpecResult SpecStats",
    "speculative": "speculative_generate speculative_rounds", "engine.rows": "speculative_one speculative_rows",
    "engine.batch": "speculative_generate_batch",
}.items() for name in names.split()}
__all__ = sorted(WHERE)


def __getattr__(name: str) -> object:
    if name not in WHERE:
        raise AttributeError(f"module 'mtp' has no attribute {name!r}")
    return getattr(import_module(f"mtp.{WHERE[name]}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
