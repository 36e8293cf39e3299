"""Start-up of the command-line scripts: Ctrl-C in the second or two that torch takes to import
leaves with one line and status 130, as it does later, never with a traceback."""

import os
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


def exit_now(status: int) -> None:
    """End the command with `status` once its output is out, without the interpreter's teardown: freeing every
    module and tensor one by one takes a good part of a second after the last line (more on a busy machine), and
    nothing the commands hold needs it (no file is left open for writing; the tensor-parallel ranks end this way
    already, cli/parallel.py `leave`)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):  # a reader that went away, or a stream already closed
            pass
    os._exit(status)
