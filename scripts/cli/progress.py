"""Progress for work that can take more than a few seconds (loading a large checkpoint, the compile warm-up, a
benchmark section, writing benchmark checkpoints), on stderr:
- on a terminal, tqdm's bars (huggingface-hub already brings tqdm), drawn over one line and gone when done;
- elsewhere (a pipe, a log file), plain lines: `Ticker` says how far the work has come every EVERY seconds while it
  runs, and that it is done, so a log never goes silent for longer; work that ends sooner prints nothing, so the
  output of a quick run stays as it was;
- nothing under --json (`quiet`), whose stderr stays quiet.
"""

import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from tqdm import tqdm

T = TypeVar("T")
EVERY = 8.0  # seconds between two lines off a terminal: a log is never silent for 10


def shown(quiet: bool = False) -> bool:
    """Whether progress is drawn as a bar: stderr is a terminal and nothing asked for quiet."""
    return not quiet and sys.stderr.isatty()


class Ticker:
    """tqdm's `update`, `close` and `with`, off a terminal: a background thread prints `what: n/total after S s`
    every EVERY seconds while it is open, and a last line on close if it printed any."""

    def __init__(self, what: str, total: int | None = None, unit: str = "it") -> None:
        self.what, self.total, self.unit, self.n = what, total, unit, 0
        self.start, self.said = time.perf_counter(), False
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.tick, daemon=True)
        self.thread.start()

    def count(self) -> str:
        scale = (lambda n: f"{n / 1e9:.2f} GB") if self.unit == "B" else str
        return scale(self.n) + (f"/{scale(self.total)}" if self.total else "")

    def tick(self) -> None:
        while not self.done.wait(EVERY):
            self.said = True
            print(f"{self.what}: {self.count()} after {time.perf_counter() - self.start:.0f} s", file=sys.stderr,
                  flush=True)

    def update(self, n: int = 1) -> None:
        self.n += n

    def close(self) -> None:
        if self.done.is_set():
            return
        self.done.set()
        self.thread.join()
        if self.said:
            print(f"{self.what}: done, {self.count()} in {time.perf_counter() - self.start:.0f} s", file=sys.stderr,
                  flush=True)

    def __enter__(self) -> "Ticker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def progress(items: Iterable[T], what: str, total: int | None = None, quiet: bool = False) -> Iterator[T]:
    """`items`, with a bar (or lines, off a terminal) on stderr saying `what` and how far it has come."""
    if shown(quiet) or quiet:
        return iter(tqdm(items, desc=what, total=total, file=sys.stderr, disable=quiet, leave=False,
                         dynamic_ncols=True))
    return ticked(items, Ticker(what, total))


def ticked(items: Iterable[T], ticker: Ticker) -> Iterator[T]:
    with ticker:
        for item in items:
            yield item
            ticker.update()


def bar(what: str, total: int | None = None, quiet: bool = False, unit: str = "it") -> tqdm | Ticker:
    """A bar (or lines) to `update` by hand (bytes written, steps compiled); closed by the caller or a `with`."""
    if shown(quiet) or quiet:
        return tqdm(desc=what, total=total, file=sys.stderr, disable=quiet, leave=False, dynamic_ncols=True,
                    unit=unit, unit_scale=unit == "B")
    return Ticker(what, total, unit)
