"""The commands under torchrun: `torchrun --nproc-per-node N scripts/generate.py ...` runs one process a rank,
each loading its part of the target and the drafter (gemma4/parallel/).

- Every rank runs the whole command: the same flags, checks, prompt and tokens (every rank computes the same
  logits and draws the same tokens), so a bad input is refused on every rank alike, before any collective.
  Rank 0 alone prints: the others' stdout and stderr go to /dev/null.
- chat.py: rank 0 reads each line and sends it to the others (`shared_line`), on a group of its own that waits as
  long as a person may.
- Ctrl-C on a terminal reaches torchrun and every rank: under torchrun it ends the run, every rank at once.
- What cannot run tensor-parallel is refused in one line: `--compile` (a collective in a compiled graph), and
  `--schedule auto` (it times rounds, and ranks that time differently would draft differently).
- A rank that stops or hangs: the others' next collective fails (at once, or after gemma4.parallel.group's
  TIMEOUT) and each prints one line (`lost_ranks`).
- Every rank ends through `leave`: its exit status, not an abort of gloo's threads at exit.
- torchrun itself then reports the failed rank's exit status in a summary of its own and exits 1: a refusal is
  rank 0's one line (exit status 2 in that summary), then torchrun's report.
"""

import os
import signal
import sys
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from cli.launch import LAUNCHED
from gemma4.parallel.group import TIMEOUT, start, world_size
from gemma4.parallel.plan import Shard

# The group chat.py's lines are sent on: gloo (on the CPU whatever the model's device), and a day to wait, since
# a person may think at the prompt far longer than gemma4.parallel.group's TIMEOUT. A rank that dies still ends
# the wait at once: its connections close.
LINES: list[dist.ProcessGroup] = []
PROMPT_WAIT = timedelta(days=1)


def mute_other_ranks() -> None:
    """Under torchrun, from a rank's first line: every rank but 0 writes to /dev/null, so that a refusal every
    rank reaches alike prints once. (A line that only a surviving rank can say goes to `sys.__stderr__`.)"""
    if world_size() > 1 and os.environ.get("RANK", "0") != "0":
        quiet = open(os.devnull, "w")
        sys.stdout = sys.stderr = quiet


def ranks(device: torch.device) -> Shard | None:
    """Under torchrun with 2 or more ranks: join them (the command muted every rank but 0 at its first line,
    `mute_other_ranks`); else None (one process)."""
    if world_size() < 2:
        return None
    shard = start(device)
    LINES.append(dist.new_group(backend="gloo", timeout=PROMPT_WAIT))
    # Every rank past joining before any goes on: rank 0 holds the rendezvous store, and a refusal that ends
    # it at once would otherwise reset a rank still waiting in new_group's store barrier ("lost the others").
    dist.barrier()
    # Ctrl-C reaches torchrun and every rank, and torchrun ends the run: each rank ends at once (the default
    # action), not in a handler that a rank blocked in a collective would only reach when the others answer.
    # Ranks the command started itself (--tensor-parallel, cli/launch.py) keep Python's: Ctrl-C reaches rank 0
    # alone, which stops as one process does, and the others' next collective fails.
    if not os.environ.get(LAUNCHED):
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    return shard


def refusal(compile_steps: bool, schedule: str | None) -> str | None:
    """What of these flags a tensor-parallel run refuses, as one line's reason; None when all can run."""
    if world_size() < 2:
        return None
    if compile_steps:
        return "--compile cannot run tensor-parallel (a compiled graph holds no collective): drop it under torchrun"
    if schedule == "auto":
        return ("--schedule auto times the rounds, and ranks that time differently would draft differently: use "
                "constant or heuristic under torchrun")
    return None


def shared_line(read: Callable[[], str]) -> str:
    """chat.py's next line: rank 0 reads it (EOFError at the end) and every rank gets the same."""
    if not dist.is_initialized():
        return read()
    box: list[str | None] = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = read()
        except EOFError:
            box[0] = None
    dist.broadcast_object_list(box, src=0, group=LINES[0] if LINES else None)
    if box[0] is None:
        raise EOFError
    return box[0]


def others_wait(seconds: float = 2.0) -> None:
    """Before a rank other than 0 exits with an error: a moment for rank 0 to print it. torchrun stops every rank
    once one exits with an error, rank 0 too, maybe before its line is out."""
    if dist.is_initialized() and dist.get_rank() != 0:
        time.sleep(seconds)


def not_joined(e: BaseException) -> str | None:
    """The one line for a rank that could not join the run (another stopped before it joined, and the
    rendezvous timed out); None for any other error."""
    if world_size() < 2 or dist.is_initialized() or not isinstance(e, dist.DistError):
        return None
    return (f"error: rank {os.environ.get('RANK', '?')} could not join the tensor-parallel run: not every rank "
            f"joined within {int(TIMEOUT.total_seconds())} s (one that stopped first says why in its own output)")


def lost_ranks(e: BaseException) -> str | None:
    """The one line for an error that says this rank lost the others; None for any other error."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return None
    if not (isinstance(e, dist.DistError) or (isinstance(e, RuntimeError) and "gloo" in str(e))):
        return None
    return (f"error: rank {dist.get_rank()} lost the other ranks of the tensor-parallel run (one stopped, or did "
            f"not answer within {int(TIMEOUT.total_seconds())} s): {str(e).splitlines()[0][:160]}")


def leave(status: int) -> int:
    """Under torchrun: end this rank now, with `status`, once its output is out. Python's own exit would destroy
    gloo's threads while a peer may still be talking to them, and the C++ runtime aborts the process (SIGABRT)
    in place of the status. One process: `status`, for the caller to exit with."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status
