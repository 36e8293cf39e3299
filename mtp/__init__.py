"""Gemma 4 Multi-Token-Prediction drafter and the hand-written speculative decoding loop."""

from mtp.conversation import ContextFull, Conversation, Reply
from mtp.drafter import Drafter, DrafterConfig, check_pair, load_drafter
from mtp.speculative import SCHEDULES, DraftLength, SpecResult, SpecStats, speculative_generate

__all__ = [
    "SCHEDULES", "ContextFull", "Conversation", "DraftLength", "Drafter", "DrafterConfig", "Reply", "SpecResult",
    "SpecStats", "check_pair", "load_drafter", "speculative_generate",
]
