"""Where a prompt's images sit: their soft tokens, placed as the spans of soft embeddings the loops take.

Facts a reader must know (gemma4/README.md §19):
- An image in a prompt is boi, n soft tokens, eoi: the soft tokens are the run of n image ids, replaced by
  the image's n vectors (the tower's output after `embed_vision`). boi and eoi stay ordinary tokens.
- The loops know nothing of images: they take `Media` (gemma4/engine/media.py), spans of vectors at positions, and
  `PromptImages` is the `Media` of a batch's images. Speculative decoding is unchanged: the drafter sees an image
  only through the target's K/V and its last hidden state.
- Where the config asks for it (`both_ways`), an image's soft tokens see each other both ways on sliding
  layers: every span of an image is marked so.
- Everything is by absolute position, per row: rows of a batch hold different images at different places.

Shape legend: n soft tokens, E hidden.
"""

from collections.abc import Sequence

import torch

from gemma4.engine import media
from gemma4.engine.media import Media, placed
from gemma4.vision.config import ImageTokens


class ImageError(ValueError):
    """An image this implementation cannot take; the one-line message says what to change."""


def expand(ids: Sequence[int], sizes: Sequence[int], tokens: ImageTokens) -> list[int]:
    """Ids where each boi marks an image's place (one boi per image, in order) -> boi, its n soft tokens, eoi."""
    places = sum(i == tokens.boi for i in ids)
    if places != len(sizes):
        raise ImageError(f"the prompt marks {places} image place(s) (boi id {tokens.boi}) for {len(sizes)} "
                         f"image(s): give one boi id per image")
    return media.expand(ids, tokens.boi, sizes, tokens.soft, tokens.eoi)


def place(ids: Sequence[int], vectors: Sequence[torch.Tensor], tokens: ImageTokens) -> tuple[list[int], "PromptImages"]:
    """One prompt whose boi ids mark its images' places -> the prompt with their soft tokens, and its images."""
    full = expand(ids, [len(v) for v in vectors], tokens)
    return full, PromptImages([full], [vectors], tokens)


class PromptImages(Media):
    """Every row's images, placed on its soft-token runs: row b's i-th run takes its i-th image."""

    def __init__(self, prompts: Sequence[Sequence[int]], vectors: Sequence[Sequence[torch.Tensor]],
                 tokens: ImageTokens) -> None:
        super().__init__(placed(prompts, vectors, tokens.soft, tokens.both_ways, "image", ImageError))
        self.tokens = tokens
