"""Start-up of the command-line scripts: Ctrl-C in the second or two that torch takes to import
leaves with one line and status 130, as it does later, never with a traceback."""

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager


def leave(signum: int, frame: object) -> None:
    print("\ninterrupted", file=sys.stderr)
    sys.exit(128 + signum)


@contextmanager
def quiet_interrupt() -> Iterator[None]:
    """Within the block Ctrl-C leaves at once; afterwards the usual KeyboardInterrupt is back."""
    usual = signal.signal(signal.SIGINT, leave)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, usual)
