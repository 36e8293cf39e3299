"""Progress bars for work that can take more than a few seconds (loading a large checkpoint, the compile
warm-up, a benchmark section, writing benchmark checkpoints): tqdm's, which huggingface-hub already
brings, on stderr, and only when stderr is a terminal and the command is not asked for --json, so that
logs, pipes and JSON stay as they were."""

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")


def shown(quiet: bool = False) -> bool:
    """Whether progress is drawn: stderr is a terminal and nothing asked for quiet."""
    return not quiet and sys.stderr.isatty()


def progress(items: Iterable[T], what: str, total: int | None = None, quiet: bool = False) -> Iterator[T]:
    """`items`, with a bar on stderr saying `what` and how far it has come (nothing when not `shown`)."""
    return iter(tqdm(items, desc=what, total=total, file=sys.stderr, disable=not shown(quiet), leave=False,
                     dynamic_ncols=True))


def bar(what: str, total: int | None = None, quiet: bool = False, unit: str = "it") -> tqdm:
    """A bar to `update` by hand (bytes written, steps compiled); closed by the caller or a `with`."""
    return tqdm(desc=what, total=total, file=sys.stderr, disable=not shown(quiet), leave=False,
                dynamic_ncols=True, unit=unit, unit_scale=unit == "B")
