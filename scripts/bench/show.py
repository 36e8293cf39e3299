"""What scripts/benchmark.py shows while it runs, all on stderr (stdout holds the table, or --json's object alone):

- `say`: one plain line, as each section and each long step starts, so that a log that is not a terminal shows
  how far the run has come too.
- `steps` and `written`: tqdm bars (scripts/cli/progress.py) for the timed runs of a section (bench/timing.py
  `interleaved`) and the bytes of a random checkpoint being written (bench/random_pair.py), named after the
  section running; drawn only when stderr is a terminal and the run was not asked for --json (`NOW.quiet`).

`NOW` is the run's state: benchmark.main sets the section as each one starts, and `quiet` once.
"""

import sys
from dataclasses import dataclass

from tqdm import tqdm

from cli.progress import bar


@dataclass
class Now:
    section: str = ""
    quiet: bool = False


NOW = Now()


def say(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


def named(what: str) -> str:
    return f"{NOW.section}: {what}" if NOW.section else what


def steps(what: str, total: int) -> tqdm:
    """A bar of `total` steps (timed runs, measurements), closed by the caller or a `with`."""
    return bar(named(what), total, NOW.quiet)


def written(what: str, total: int) -> tqdm:
    """A bar of `total` bytes written."""
    return bar(named(what), total, NOW.quiet, unit="B")
