"""The ranks of a tensor-parallel run as torchrun starts them: one process a rank, `RANK`, `WORLD_SIZE` and
`LOCAL_RANK` in the environment, NCCL between GPUs (each rank its `LOCAL_RANK`'th), gloo between CPU processes.

- A collective waits at most `TIMEOUT` for the other ranks. A rank that dies closes its connections, so the
  others usually fail at once; a rank that hangs is given up on after `TIMEOUT`. Either way the survivors raise,
  and the commands print one line and exit.
- `check_same` compares something every rank computed (a checkpoint's fingerprint: its config, headers and a
  sample of every tensor's bytes) before any weight is read: ranks given different files would otherwise sum
  parts of different models.
"""

import hashlib
import json
import os
from collections.abc import Collection
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from gemma4.config import ConfigError, TextConfig
from gemma4.parallel.plan import (
    Shard,
    Slice,
    check_world,
    local_config,
    slices,
    table_cuts,
)

TIMEOUT = timedelta(seconds=60)
SAMPLE = 4096  # bytes of each tensor the fingerprint reads at its start, middle and end


def world_size() -> int:
    """How many ranks torchrun started (1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def start(device: torch.device) -> Shard:
    """Join the run torchrun started: NCCL on CUDA (this rank's GPU is `LOCAL_RANK`), gloo on the CPU."""
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=TIMEOUT)
    return Shard(dist.get_rank(), dist.get_world_size())


def fingerprint(model_dir: Path) -> str:
    """A digest of config.json and of every tensor, in name order: its name, dtype, shape and a sample of its
    bytes, the first, middle and last SAMPLE of them. Two checkpoints of one geometry (a base model and its
    -it, a fine-tune) have the same headers, and differ in nearly every weight, so in the samples. The sample
    reads at most 12 KiB a tensor, however large the tensor, where hashing whole files would read every byte
    on every rank. How the tensors are sharded into files, and the files' metadata, count
    for nothing."""
    digest = hashlib.sha256((model_dir / "config.json").read_bytes())
    with ExitStack() as files:
        entries = []  # (name, the open file, where its data begins, its header entry)
        for path in sorted(model_dir.glob("*.safetensors")):
            f = files.enter_context(open(path, "rb"))
            # safetensors: 8 bytes little-endian header length, a JSON header, then the tensors' bytes.
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
            header.pop("__metadata__", None)
            entries += [(name, f, 8 + size, entry) for name, entry in header.items()]
        for name, f, base, entry in sorted(entries, key=lambda e: e[0]):
            digest.update(json.dumps([name, entry["dtype"], entry["shape"]]).encode())
            start, end = entry["data_offsets"]
            for at in sorted({start, (start + end) // 2, max(start, end - SAMPLE)}):
                f.seek(base + at)
                digest.update(f.read(min(SAMPLE, end - at)))
    return digest.hexdigest()[:16]


def check_same(value: str, what: str) -> None:
    """Every rank's `value` of `what` must be rank 0's: else each rank raises the same one line."""
    values: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    differ = [r for r, v in enumerate(values) if v != values[0]]
    if differ:
        raise ConfigError(f"rank {differ[0]} was given another {what} than rank 0 ({values[differ[0]]} against "
                          f"{values[0]}): give every rank the same files")


def rank_part(c: TextConfig, table: dict[str, tuple[int, ...]], shard: Shard, model_dir: Path, what: str,
              layer_prefix: str = "layers.", int4: Collection[str] = ()) -> tuple[dict[str, Slice], TextConfig]:
    """What a loader asks before it reads a byte: the split refused if `c` cannot take it (`check_world`), the
    files refused if they are not rank 0's (`check_same`); then this rank's cuts of the name table and its
    local config (plan.py)."""
    check_world(c, shard.world, what, int4)
    check_same(fingerprint(model_dir), f"{what} checkpoint")
    return table_cuts(slices(c, shard, layer_prefix), table), local_config(c, shard)
