"""Where a prompt's audio clips sit: their soft tokens, placed as the spans of soft embeddings the loops take.

Facts a reader must know (gemma4/README.md §20):
- A clip in a prompt is boa, n soft tokens, eoa (the release's processor writes `<|audio|>` so): the soft tokens
  are a run of n audio ids, replaced by the clip's n vectors (the tower's output after `embed_audio`, one per
  40 ms). boa and eoa stay ordinary tokens.
- Audio is causal in the language model: a clip's soft tokens see what comes before them, as text does, never
  each other both ways (the both-ways rule is for images and video). So a prefill chunk may end inside a clip.
- `PromptAudio` is a `Media` (gemma4/engine/media.py), as `PromptImages` is: the loops take it as they take images, and
  `images + audio` is one prompt's both kinds.

Shape legend: n soft tokens, E hidden.
"""

from collections.abc import Sequence

import torch

from gemma4.engine import media
from gemma4.audio.config import AudioTokens
from gemma4.audio.wav import AudioError
from gemma4.engine.media import Media, placed


def expand(ids: Sequence[int], sizes: Sequence[int], tokens: AudioTokens) -> list[int]:
    """Ids where each boa marks a clip's place (one boa per clip, in order) -> boa, its n soft tokens, eoa."""
    if tokens.soft in ids:
        raise AudioError(f"the prompt already holds audio soft tokens (id {tokens.soft}): mark each clip's place with "
                         f"one boa id ({tokens.boa}) alone, and the clip fills it")
    places = sum(i == tokens.boa for i in ids)
    if places != len(sizes):
        raise AudioError(f"the prompt marks {places} audio place(s) (boa id {tokens.boa}) for {len(sizes)} "
                         f"clip(s): give one boa id per clip")
    return media.expand(ids, tokens.boa, sizes, tokens.soft, tokens.eoa)


def place(ids: Sequence[int], vectors: Sequence[torch.Tensor], tokens: AudioTokens) -> tuple[list[int], "PromptAudio"]:
    """One prompt whose boa ids mark its clips' places -> the prompt with their soft tokens, and its clips. A prompt
    with images too: `Vision.prompt`, then this on its ids, when every clip comes after every image (a chat turn's
    order); else expand both kinds first and build PromptImages and PromptAudio on the final ids, as
    Conversation.prompt does (expanding a clip before an image moves the image)."""
    full = expand(ids, [len(v) for v in vectors], tokens)
    return full, PromptAudio([full], [vectors], tokens)


class PromptAudio(Media):
    """Every row's clips, placed on its runs of audio ids: row b's i-th run takes its i-th clip, causal."""

    def __init__(self, prompts: Sequence[Sequence[int]], vectors: Sequence[Sequence[torch.Tensor]],
                 tokens: AudioTokens) -> None:
        super().__init__(placed(prompts, vectors, tokens.soft, False, "clip", AudioError))  # causal: never both ways
        self.tokens = tokens
