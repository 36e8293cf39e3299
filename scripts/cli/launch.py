"""`--tensor-parallel N`: generate.py and chat.py start their own N ranks on this machine, as vLLM's
`--tensor-parallel-size` does, and the run reads like a one-process run. torchrun stays the way to span machines.

The parent process loads no model: it starts the command once a rank, as torchrun would (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR and a free MASTER_PORT in each one's environment, and LAUNCHED, which says who started
them), waits, and exits with rank 0's status.
- Rank 0 has the terminal: stdin, stdout and stderr. The others print nothing (cli/parallel.py mutes them) and read
  nothing, so a refusal, the header and the text come once.
- Each rank runs in a session of its own, so Ctrl-C at the terminal reaches the parent alone, which passes it to
  rank 0 only. Rank 0 stops as a one-process run does (`interrupted after N new tokens`, exit status 130); the
  others' next collective then fails, and they end without a word. Ranks that have not ended GRACE seconds after
  rank 0 are killed.
- CPU threads: each rank gets its share of the cores (OMP_NUM_THREADS), unless --threads or OMP_NUM_THREADS says.
"""

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

LAUNCHED = "GEMMA4_MTP_LAUNCHED"  # set in a rank's environment by `launch`: cli/parallel.py keeps Ctrl-C its own
GRACE = 10.0  # seconds the other ranks get to end after rank 0 has


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def without_flag(argv: list[str]) -> list[str]:
    """argv less --tensor-parallel and its value (`--tensor-parallel N` or `--tensor-parallel=N`)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--tensor-parallel":
            skip = True
        elif not arg.startswith("--tensor-parallel="):
            out.append(arg)
    return out


def launch(script: Path, argv: list[str], ranks: int) -> int:
    """Run `python script argv` (less --tensor-parallel) on `ranks` processes; rank 0's exit status."""
    port, args = free_port(), without_flag(argv)
    threads = {} if "OMP_NUM_THREADS" in os.environ or "--threads" in args else {
        "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // ranks))}
    procs = []
    for rank in range(ranks):
        env = os.environ | threads | {"RANK": str(rank), "WORLD_SIZE": str(ranks), "LOCAL_RANK": str(rank),
                                      "LOCAL_WORLD_SIZE": str(ranks), "MASTER_ADDR": "127.0.0.1",
                                      "MASTER_PORT": str(port), LAUNCHED: "1"}
        quiet = {} if rank == 0 else {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL,
                                      "stderr": subprocess.DEVNULL}
        procs.append(subprocess.Popen([sys.executable, str(script), *args], env=env, start_new_session=True,
                                      **quiet))
    # Ctrl-C: to rank 0 alone (its sessions keep the terminal's own from the ranks).
    signal.signal(signal.SIGINT, lambda signum, frame: procs[0].send_signal(signal.SIGINT))
    status = procs[0].wait()
    for p in procs[1:]:
        try:
            p.wait(timeout=GRACE)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return status
