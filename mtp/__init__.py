"""Gemma 4 Multi-Token-Prediction drafter and the hand-written speculative decoding loop."""

from mtp.drafter import Drafter, DrafterConfig, check_pair, load_drafter
from mtp.speculative import SCHEDULES, DraftLength, SpecResult, SpecStats, speculative_generate

__all__ = [
    "SCHEDULES", "DraftLength", "Drafter", "DrafterConfig", "SpecResult", "SpecStats", "check_pair",
    "load_drafter", "speculative_generate",
]
