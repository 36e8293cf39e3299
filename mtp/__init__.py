"""Gemma 4 Multi-Token-Prediction drafter and the hand-written speculative decoding loop."""

from mtp.drafter import Drafter, DrafterConfig
from mtp.extras.conversation import ContextFull, Conversation, Reply
from mtp.loading import check_pair, load_drafter
from mtp.schedule import SCHEDULES, DraftLength
from mtp.speculative import speculative_generate, speculative_generate_batch
from mtp.stats import SpecResult, SpecStats

__all__ = [
    "SCHEDULES", "ContextFull", "Conversation", "DraftLength", "Drafter", "DrafterConfig", "Reply", "SpecResult",
    "SpecStats", "check_pair", "load_drafter", "speculative_generate", "speculative_generate_batch",
]
