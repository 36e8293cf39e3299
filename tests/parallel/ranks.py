"""One rank of a tensor-parallel test run, started as torchrun starts a rank: `python -m tests.parallel.ranks JOBS`
with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in the environment. JOBS is a JSON file of jobs, each naming
the pair, the dtype and what to run; rank 0 writes what each returned to its `out` file (tests/parallel/harness.py).

What it runs, on the rank's part of the pair (load_target and load_drafter with `shard=`):
- "plain", "spec": greedy tokens, plain and speculative (K = 4);
- "sampled", "spec_sampled": keyed sampling, plain and speculative;
- "batch": the prompts as one speculative batch, each row's tokens;
- "parts": the shapes of layer 0's split weights in the rank's state dict (int4: packed words and scales);
- "logits": the prompt's last logits (float64 runs: the one-process model's, to the last bits it can tell).
A job of kind "reduce" loads nothing: it sums random partials both ways (`reductions`).
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from gemma4 import SamplerConfig, greedy_generate, load_target, sample_generate
from gemma4.parallel import Shard, exact_sum
from mtp import (
    DraftLength,
    load_drafter,
    speculative_generate,
    speculative_generate_batch,
)
from gemma4.engine.forward import forward_rows

SPLIT = ("q_proj.weight", "o_proj.weight", "gate_proj.weight", "down_proj.weight", "q_proj.weight_packed",
         "o_proj.weight_packed", "down_proj.weight_scale")
SAMPLER = SamplerConfig(temperature=0.8, top_k=20, top_p=0.9, seed=3)


def reductions(job: dict, rank: int) -> dict:
    """Row 0 of a 1-row and of an R-row sum of every rank's partials, by `all_reduce` and by `exact_sum`: are
    its bits the same? Each rank's partials are drawn from (seed, rank); row 0 is the same in both tensors."""
    gen = torch.Generator().manual_seed(job["seed"] * 100 + rank)
    many = torch.randn(job["rows"], job["width"], generator=gen)  # (R, W) this rank's partials
    one = many[:1].clone()  # (1, W) its row 0 alone
    out = {}
    for name, reduce in (("all_reduce", all_reduce), ("exact_sum", exact_sum)):
        row, rows = reduce(one)[0], reduce(many)[0]
        out[name] = {"equal": bool(torch.equal(row, rows)), "max_diff": (row - rows).abs().max().item()}
    return out


def all_reduce(partial: torch.Tensor) -> torch.Tensor:
    """torch.distributed's sum: the order of the additions is gloo's (or NCCL's) to choose."""
    total = partial.clone()
    dist.all_reduce(total)
    return total


def run(job: dict, shard: Shard | None) -> dict:
    """What `job` asks, on this rank's part of the pair (shard None: the one-process model)."""
    if job.get("kind") == "reduce":
        return reductions(job, shard.rank)
    dtype = getattr(torch, job["dtype"])
    target = load_target(Path(job["target"]), dtype=dtype, fast=job["fast"], shard=shard)
    drafter = load_drafter(Path(job["assistant"]), dtype=dtype, fast=job["fast"], target=target, shard=shard)
    prompts, new = job["prompts"], job["new_tokens"]
    out: dict = {}
    for what in job["runs"]:
        if what == "plain":
            out[what] = [greedy_generate(target, p, new) for p in prompts]
        elif what == "spec":
            out[what] = [speculative_generate(target, drafter, p, new, DraftLength(4)).tokens for p in prompts]
        elif what == "sampled":
            out[what] = [sample_generate(target, p, new, SAMPLER) for p in prompts]
        elif what == "spec_sampled":
            out[what] = [speculative_generate(target, drafter, p, new, DraftLength(4), sampler=SAMPLER).tokens
                         for p in prompts]
        elif what == "batch":
            out[what] = [r.tokens for r in speculative_generate_batch(target, drafter, prompts, new, DraftLength(4))]
        elif what == "parts":  # layer 0's split weights as this rank holds them
            out[what] = {name: list(t.shape) for name, t in target.state_dict().items()
                         if name.startswith("layers.0.") and name.endswith(SPLIT)}
        elif what == "logits":
            with torch.no_grad():
                out[what] = forward_rows(target, torch.tensor([prompts[0]])).logits[0, -1].double().tolist()
        else:
            raise ValueError(f"unknown run {what!r}")
    return out


def main(job_file: Path) -> None:
    torch.set_num_threads(1)
    spec = json.loads(job_file.read_text())
    dist.init_process_group("gloo")
    shard = Shard(dist.get_rank(), dist.get_world_size())
    out = [run(job, shard) for job in spec["jobs"]]
    if shard.rank == 0:
        Path(spec["out"]).write_text(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
