"""Where a prompt's images sit and what each forward of the prefill takes of them.

Facts a reader must know (gemma4/README.md §19):
- An image in a prompt is boi, n soft tokens, eoi: the soft tokens are the run of n image ids, replaced by
  the image's n vectors (the tower's output after `embed_vision`). boi and eoi stay ordinary tokens.
- The loops know nothing of images: `prefill` asks a `PromptImages` which chunk ends where (`chunk`) and
  what each forward replaces (`soft`); every later forward is text. Speculative decoding is unchanged: the
  drafter sees an image only through the target's K/V and its last hidden state.
- Where the config asks for it (`both_ways`), an image's soft tokens see each other both ways on sliding
  layers. A prefill chunk must then hold the whole image (the keys ahead of a query are written in the same
  forward), so a chunk never ends inside an image: it stops before it, or runs to its end when the image
  starts the chunk. The cache's slack is sized for the longest image, or images of several rows that overlap
  (`longest`).
- Everything is by absolute position, per row: rows of a batch hold different images at different places.

Shape legend: B rows, T positions of one forward, n soft tokens, E hidden.
"""

import itertools
from collections.abc import Sequence
from typing import NamedTuple

import torch

from gemma4.model import Soft
from gemma4.vision.config import ImageTokens


class ImageError(ValueError):
    """An image this implementation cannot take; the one-line message says what to change."""


class ImageAt(NamedTuple):
    start: int  # the absolute position of the image's first soft token
    vectors: torch.Tensor  # (n, E): one per soft token

    @property
    def end(self) -> int:
        return self.start + len(self.vectors)


def expand(ids: Sequence[int], sizes: Sequence[int], tokens: ImageTokens) -> list[int]:
    """Ids where each boi marks an image's place (one boi per image, in order) -> boi, its n soft tokens, eoi."""
    places = [j for j, i in enumerate(ids) if i == tokens.boi]
    if len(places) != len(sizes):
        raise ImageError(f"the prompt marks {len(places)} image place(s) (boi id {tokens.boi}) for {len(sizes)} "
                         f"image(s): give one boi id per image")
    out, last = [], 0
    for j, n in zip(places, sizes):
        out += list(ids[last:j]) + [tokens.boi] + [tokens.soft] * n + [tokens.eoi]
        last = j + 1
    return out + list(ids[last:])


def place(ids: Sequence[int], vectors: Sequence[torch.Tensor], tokens: ImageTokens) -> tuple[list[int], "PromptImages"]:
    """One prompt whose boi ids mark its images' places -> the prompt with their soft tokens, and its images."""
    full = expand(ids, [len(v) for v in vectors], tokens)
    return full, PromptImages([full], [vectors], tokens)


def runs(ids: Sequence[int], soft: int) -> list[tuple[int, int]]:
    """(start, end) of every run of soft tokens in ids, in order: one per image."""
    out = []
    for j, i in enumerate(ids):
        if i == soft:
            if out and out[-1][1] == j:
                out[-1] = (out[-1][0], j + 1)
            else:
                out.append((j, j + 1))
    return out


class PromptImages:
    """Every row's images, placed on its soft-token runs: row b's i-th run takes its i-th image."""

    def __init__(self, prompts: Sequence[Sequence[int]], vectors: Sequence[Sequence[torch.Tensor]],
                 tokens: ImageTokens) -> None:
        if len(prompts) != len(vectors):
            raise ImageError(f"{len(prompts)} prompts need {len(prompts)} image lists, got {len(vectors)}")
        self.tokens, self.rows = tokens, []
        for b, (ids, images) in enumerate(zip(prompts, vectors)):
            spans = runs(ids, tokens.soft)
            if len(spans) != len(images):
                raise ImageError(f"prompt {b} holds {len(spans)} images' soft tokens but {len(images)} images "
                                 f"were given")
            for (start, end), v in zip(spans, images):
                if end - start != len(v):
                    raise ImageError(f"an image of {len(v)} vectors sits on {end - start} soft tokens at position "
                                     f"{start} of prompt {b}: the prompt was made for another image size")
            self.rows.append([ImageAt(start, v) for (start, _), v in zip(spans, images)])

    @property
    def longest(self) -> int:
        """The most positions one prefill forward must hold: 0 unless images see themselves both ways; else the
        longest stretch that no chunk may end inside (images of different rows that overlap form one)."""
        if not self.tokens.both_ways:
            return 0
        spans = sorted((im.start, im.end) for row in self.rows for im in row)
        most, lo, hi = 0, None, None
        for a, z in spans:
            if hi is None or a >= hi:  # a new stretch: a chunk may end at its start
                lo, hi = a, z
            hi = max(hi, z)
            most = max(most, hi - lo)
        return most

    def text_ids(self, b: int, ids: Sequence[int]) -> list[int]:
        """Row b's ids with its images' soft tokens as the pad token (0): what is left to check as text."""
        out = list(ids)
        for im in self.rows[b]:
            out[im.start:im.end] = [0] * (im.end - im.start)
        return out

    def chunk(self, first: int, t: int) -> int:
        """The positions of the prefill forward from `first`: t, unless that would end inside an image that
        must see itself both ways; then the longest that ends outside every image, else the shortest."""
        if not self.tokens.both_ways:
            return t

        def cuts(end: int) -> bool:
            return any(im.start < end < im.end for row in self.rows for im in row)

        shorter = next((e for e in range(first + t, first, -1) if not cuts(e)), None)
        return (shorter if shorter is not None else next(e for e in itertools.count(first + t) if not cuts(e))) - first

    def soft(self, starts: Sequence[int], t: int, device: torch.device) -> Soft | None:
        """What the forward of T positions from starts[b] (per row) replaces: None when it holds no image."""
        where = torch.zeros(len(starts), t, dtype=torch.bool)  # (B, T)
        lo, hi = torch.zeros(len(starts), t, dtype=torch.long), torch.zeros(len(starts), t, dtype=torch.long)
        pieces = []
        for b, (s, row) in enumerate(zip(starts, self.rows)):
            for im in row:
                a, z = max(im.start, s), min(im.end, s + t)  # the part of the image inside this forward
                if a < z:
                    where[b, a - s:z - s] = True
                    lo[b, a - s:z - s], hi[b, a - s:z - s] = im.start, im.end
                    pieces.append(im.vectors[a - im.start:z - im.start])
        if not pieces:
            return None
        # Row-major order of `where` is row by row, each row's images in order: the order of `pieces`.
        image = (lo.to(device), hi.to(device)) if self.tokens.both_ways else None
        return Soft(where.to(device), torch.cat(pieces), image)

    def whole(self, reuse: int) -> int:
        """`reuse` moved back to the start of the image it cuts, if any: a reused prefix holds whole images, so
        the rest of an image is never run in a forward apart from its first part."""
        for row in self.rows:
            for im in row:
                if im.start < reuse < im.end:
                    reuse = im.start
        return reuse
