"""Soft embeddings in the prompts (images; audio the same way): where they sit and what each prefill forward takes.

Facts a reader must know (gemma4/README.md §19):
- A span is a run of placeholder ids whose embeddings are replaced by given vectors (an image's or a video frame's,
  from the vision tower; a clip's, from the audio side). The ids around it stay ordinary tokens. The textbook sees
  plain tensors and positions: the vision and audio packages build the spans (gemma4/vision/prompt.py,
  gemma4/audio/prompt.py), and nothing here knows what made the vectors.
- `prefill` asks `Media` where a chunk may end (`chunk`) and what each forward replaces (`soft`); every later
  forward is text. The drafter sees media only through the target's K/V and its last hidden state.
- A span marked `both_ways` sees itself both ways on sliding layers (images, where the config says so). A prefill
  chunk must then hold it whole (the keys ahead of a query are written in the same forward): a chunk never ends
  inside one, and the cache's slack fits the longest stretch of them (`longest`; spans of rows that overlap form
  one). Other spans are causal, as text.

Shape legend: B rows, T positions of one forward, n vectors of a span, E hidden."""

import itertools
from collections.abc import Sequence
from typing import NamedTuple

import torch



class Soft(NamedTuple):
    """One forward's soft embeddings (§19), as `forward_rows` (gemma4/engine/forward.py) takes them: plain tensors."""
    where: torch.Tensor  # (B, T) bool: the positions whose embedding a vector replaces
    vectors: torch.Tensor  # (n, E): those vectors, in row-major order of `where`
    both_ways: tuple[torch.Tensor, torch.Tensor] | None  # (lo, hi) (B, T) for `attention_mask`; None: causal


class Span(NamedTuple):
    start: int  # the absolute position of the first replaced id
    vectors: torch.Tensor  # (n, E): one per position
    both_ways: bool  # its positions see each other both ways on sliding layers

    @property
    def end(self) -> int:
        return self.start + len(self.vectors)


class Media:
    """Every row's spans: rows[b] lists row b's, in order."""

    def __init__(self, rows: Sequence[Sequence[Span]]) -> None:
        self.rows = [list(row) for row in rows]

    @property
    def longest(self) -> int:
        """The most positions one prefill forward must hold: the longest stretch of both-ways spans no chunk may end
        inside (spans of different rows that overlap form one); 0 without such spans."""
        most, hi = 0, None
        for a, z in sorted((s.start, s.end) for row in self.rows for s in row if s.both_ways):
            lo, hi = (a, z) if hi is None or a >= hi else (lo, max(hi, z))  # a new stretch, or the same one longer
            most = max(most, hi - lo)
        return most

    def __add__(self, other: "Media") -> "Media":
        """Two kinds of media of the same prompts (images and audio) as one: each row's spans in position order."""
        if len(self.rows) != len(other.rows):
            raise ValueError(f"media of {len(self.rows)} and of {len(other.rows)} prompts cannot be joined")
        return Media([sorted(a + b, key=lambda s: s.start) for a, b in zip(self.rows, other.rows)])

    def text_ids(self, b: int, ids: Sequence[int]) -> list[int]:
        """Row b's ids with its spans' placeholders as the pad token (0): what is left to check as text."""
        out = list(ids)
        for s in self.rows[b]:
            out[s.start:s.end] = [0] * (s.end - s.start)
        return out

    def chunk(self, first: int, t: int) -> int:
        """The positions of the prefill forward from `first`: t, unless that would end inside a both-ways span; then
        the longest that ends outside every one, else the shortest."""
        def cuts(end: int) -> bool:
            return any(s.both_ways and s.start < end < s.end for row in self.rows for s in row)

        shorter = next((e for e in range(first + t, first, -1) if not cuts(e)), None)
        return (shorter if shorter is not None else next(e for e in itertools.count(first + t) if not cuts(e))) - first

    def soft(self, starts: Sequence[int], t: int, device: torch.device) -> Soft | None:
        """What the forward of T positions from starts[b] (per row) replaces: None when it holds no span."""
        where = torch.zeros(len(starts), t, dtype=torch.bool)  # (B, T)
        lo, hi = torch.zeros(len(starts), t, dtype=torch.long), torch.zeros(len(starts), t, dtype=torch.long)
        pieces = []
        for b, (first, row) in enumerate(zip(starts, self.rows)):
            for s in row:
                a, z = max(s.start, first), min(s.end, first + t)  # the part of the span inside this forward
                if a < z:
                    where[b, a - first:z - first] = True
                    if s.both_ways:
                        lo[b, a - first:z - first], hi[b, a - first:z - first] = s.start, s.end
                    pieces.append(s.vectors[a - s.start:z - s.start])
        if not pieces:
            return None
        # Row-major order of `where` is row by row, each row's spans in order: the order of `pieces`.
        both = (lo.to(device), hi.to(device)) if bool((hi > lo).any()) else None
        return Soft(where.to(device), torch.cat(pieces), both)


def joined(images: Media | None, audio: Media | None) -> Media | None:
    """A loop's `images=` and `audio=` as the one Media it runs (None without either)."""
    return images + audio if images and audio else images or audio


def expand(ids: Sequence[int], begin: int, sizes: Sequence[int], soft: int, end: int) -> list[int]:
    """Ids where each `begin` id marks a span's place (one per span, in order: the caller checks the count) -> the
    ids with begin, n soft ids and end for each: an image's boi..eoi, a clip's boa..eoa."""
    places = [j for j, i in enumerate(ids) if i == begin]
    out, last = [], 0
    for j, n in zip(places, sizes, strict=True):
        out += list(ids[last:j]) + [begin] + [soft] * n + [end]
        last = j + 1
    return out + list(ids[last:])


def placed(prompts: Sequence[Sequence[int]], vectors: Sequence[Sequence[torch.Tensor]], soft: int, both_ways: bool,
           kind: str, error: type[ValueError]) -> list[list[Span]]:
    """Every row's spans: row b's i-th run of `soft` ids takes its i-th (n, E) vectors. A count or a length that does
    not match raises `error`, naming the `kind` of medium (image, clip)."""
    if len(prompts) != len(vectors):
        raise error(f"{len(prompts)} prompts need {len(prompts)} {kind} lists, got {len(vectors)}")
    rows = []
    for b, (ids, given) in enumerate(zip(prompts, vectors)):
        spans = runs(ids, soft)
        if len(spans) != len(given):
            raise error(f"prompt {b} holds {len(spans)} {kind}s' soft tokens but {len(given)} {kind}s were given")
        for i, ((start, end), v) in enumerate(zip(spans, given)):
            if end - start != len(v):
                raise error(f"{kind} {i} of prompt {b} has {len(v)} vectors and sits on {end - start} soft tokens at "
                            f"position {start}: the prompt was made for another {kind}")
        rows.append([Span(start, v, both_ways) for (start, _), v in zip(spans, given)])
    return rows


def runs(ids: Sequence[int], soft: int) -> list[tuple[int, int]]:
    """(start, end) of every run of `soft` ids in ids, in order: one per image or clip."""
    out = []
    for j, i in enumerate(ids):
        if i == soft:
            if out and out[-1][1] == j:
                out[-1] = (out[-1][0], j + 1)
            else:
                out.append((j, j + 1))
    return out
