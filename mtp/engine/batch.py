"""Many prompts through the speculative engine with settings given once for all rows or one per row: the engine
itself runs any number of rows (mtp/engine/rows.py `speculative_rows`, mtp/README.md §12)."""

import copy
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from gemma4.engine import requests
from gemma4.engine.media import joined
from gemma4.model import Gemma4Model
from gemma4.sampling import SamplerConfig
from mtp.drafter import Drafter
from mtp.engine import speculative_rows
from mtp.schedule import Schedule
from mtp.stats import SpecResult

if TYPE_CHECKING:
    from gemma4.engine.media import Media


def speculative_generate_batch(
    target: Gemma4Model, drafter: Drafter, prompts: Sequence[list[int]], max_new_tokens: int | Sequence[int],
    draft_length: Schedule, stop_ids: Sequence[int] | Sequence[Sequence[int]] = (),
    samplers: Sequence[SamplerConfig] | None = None, drafting: str = "argmax", prefill_chunk: int | None = None,
    images: "Media | None" = None, on_commit: Callable[[int, list[int], list[bool]], None] | None = None,
    audio: "Media | None" = None,
) -> list[SpecResult]:
    """speculative_generate over B rows; row b's result equals its solo run's (with samplers[b] and `drafting`).
    Every row starts from a copy of draft_length and adapts it on its own rounds; draft_length is left as it is.
    `on_commit(b, tokens, from_drafter flags)` sees each row's committed blocks; `images`, `audio`: every row's
    (gemma4.vision.prompt.PromptImages, gemma4.audio.prompt.PromptAudio), rows without any holding none."""
    draft_length.start_call()
    schedules = [copy.deepcopy(draft_length) for _ in prompts]  # `auto`'s estimates included
    rows = requests(prompts, max_new_tokens, stop_ids, samplers)
    each = None if on_commit is None else lambda b, round: on_commit(b, round.block, round.from_drafter)
    return speculative_rows(target, drafter, rows, schedules, drafting, each, prefill_chunk=prefill_chunk,
                            media=joined(images, audio))
