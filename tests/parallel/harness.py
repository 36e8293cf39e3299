"""Starting tensor-parallel test runs as torchrun would: one `python -m tests.parallel.ranks` process a rank on
gloo, RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT in each one's environment, a free port a run."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SECONDS = 300  # a whole run at 4 ranks on two cores takes well under a minute


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(world: int, args: list[str], stdin: Path | None = None,
                per_rank: dict[int, list[str]] | None = None) -> list[subprocess.Popen]:
    """`python args...` once a rank, as torchrun starts them. stdin: rank 0's input (the others read none, as
    under torchrun where rank 0 alone reads); per_rank: arguments added to one rank's."""
    port, procs = free_port(), []
    for rank in range(world):
        e = os.environ | {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                          "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
                          "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'scripts'}"}
        source = stdin.open() if stdin is not None and rank == 0 else subprocess.DEVNULL
        procs.append(subprocess.Popen([sys.executable, *args, *(per_rank or {}).get(rank, [])], cwd=ROOT, env=e,
                                      stdin=source, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def finish(procs: list[subprocess.Popen]) -> list[tuple[int, str, str]]:
    """Each rank's (exit status, stdout, stderr), waiting at most SECONDS in all; ranks left running are killed."""
    out = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=SECONDS)
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, stderr = p.communicate()
        out.append((p.returncode, stdout, stderr))
    return out


def run_ranks(world: int, jobs: list[dict], tmp: Path) -> list[dict]:
    """Every job of `jobs` (tests/parallel/ranks.py) run on `world` ranks: what rank 0 returned for each."""
    job_file, out_file = tmp / f"jobs-{world}.json", tmp / f"out-{world}.json"
    job_file.write_text(json.dumps({"jobs": jobs, "out": str(out_file)}))
    results = finish(start_ranks(world, ["-m", "tests.parallel.ranks", str(job_file)]))
    for rank, (code, _, stderr) in enumerate(results):
        assert code == 0, f"rank {rank} of {world} exited {code}:\n{stderr[-3000:]}"
    return json.loads(out_file.read_text())
