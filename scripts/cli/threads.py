"""The one thread rule of the commands and the benchmark: a target of hidden size below 256 (the demo's is
64) runs on one torch thread, a larger one (every release: E2B's is 1536) on torch's default, and
`--threads N` overrides both.

Why: below that size a matmul is too small for a second thread to pay for its synchronisation, and on a
machine that other work keeps busy a second thread waits for a core: the demo then runs several times
slower on two threads than on one."""

import torch

SMALL_HIDDEN = 256


def threads_for(hidden_size: int, asked: int | None = None) -> int | None:
    """The torch threads for a model of this hidden size: `asked`, else 1 below SMALL_HIDDEN, else None
    (torch's default)."""
    if asked is not None:
        return asked
    return 1 if hidden_size < SMALL_HIDDEN else None


def use_threads(hidden_size: int, asked: int | None = None) -> int:
    """Apply the rule to this process; returns the threads torch now uses."""
    threads = threads_for(hidden_size, asked)
    if threads is not None:
        torch.set_num_threads(threads)
    return torch.get_num_threads()
