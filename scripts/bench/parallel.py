"""scripts/benchmark.py's `tp` section: tensor parallelism on gloo (gemma4/parallel/) on this machine's CPUs.

    python scripts/benchmark.py --only tp            # --tp-ranks N (2); --tp-small: tiny sizes, for the tests

- `speed`: the bench pair (bench/random_pair.py `bench_configs`, written under --e2b-dir), N ranks of one torch
  thread each against one process on N threads: plain greedy and speculative tokens/s. Each repetition starts the
  ranks (`python -m bench.parallel`, RANK / WORLD_SIZE / MASTER_* as torchrun sets them) and the one process, in
  turns, the order reversed every other repetition; each times a warm-up and then one run of each method; ratios
  are medians of the per-repetition ratios. float32: the ranks' tokens are the one process's, and speculative
  decoding gives the plain tokens on both.
- `memory`: a random bfloat16 file of the 31B's geometry with two layers, one sliding and one full (hidden 5376,
  32 query heads, MLP 21504, vocabulary 262144; ≈ 4.9 GB, written and deleted in the run), loaded with the speed
  layer by 1, 2 and 4 ranks, each a fresh process: every rank's resident memory after loading, private (RssAnon)
  and mapped file pages (RssFile). One process and 2 ranks give the replicated bytes R and the sharded bytes S of
  the file (resident = R + S / N); the 60 layers of the 31B scale S by the ratio of their split weights' bytes
  to these two layers' (gemma4/parallel/plan.py `slices`, counted on the name table): per rank at N ranks,
  R + S·ratio / N. The 4-rank load checks the fit.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bench.audio import cpu
from bench.memory import SCRIPTS, status_mib
from bench.random_pair import (
    assistant_config,
    bench_configs,
    random_prompt,
    target_config,
    write_pair,
)
from gemma4 import greedy_generate, load_target
from gemma4.config import FULL, SLIDING
from gemma4.config_file import text_config_from_dict
from gemma4.parallel import Shard, slices
from gemma4.weights import target_weight_table
from mtp import DraftLength, load_drafter, speculative_generate

BIG_LAYERS, BIG_FULL = 60, 10  # the 31B: 60 layers, every 6th full
PORT_BASE = 29600


def big_configs(small: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """The 31B's geometry with two layers [sliding, full] (tiny when `small`), K=V full layers with 4 kv heads."""
    if small:
        dims = dict(vocab=1024, hidden=64, intermediate=96, heads=4, kv_heads=4, head_dim=16)
    else:
        dims = dict(vocab=262144, hidden=5376, intermediate=21504, heads=32, kv_heads=16, head_dim=256)
    target = target_config(dims.pop("vocab"), layers=2, window=1024, shared=0, ple_dim=0, double_wide=False, **dims)
    target |= {"layer_types": [SLIDING, FULL], "attention_k_eq_v": True, "num_global_key_value_heads": 4}
    assistant = assistant_config(target, hidden=32, intermediate=64, heads=dims["heads"], num_centroids=16, top_k=4)
    assistant["text_config"] |= {"attention_k_eq_v": True, "num_global_key_value_heads": 4}
    return target, assistant


def split_bytes(config: dict[str, Any], world: int = 2) -> int:
    """The bytes (bfloat16) of the weights tensor parallelism splits, in a target of this config.json."""
    c = text_config_from_dict(config)
    table = target_weight_table(c)
    cut = slices(c, Shard(0, world))
    return sum(2 * torch.Size(table[key]).numel() for key in cut if key in table)


# ---------------------------------------------------------------- a run: one process, or one rank of N

def child(job: dict[str, Any]) -> dict[str, Any] | None:
    """Runs in a fresh process (a rank when WORLD_SIZE > 1): what `job` asks; rank 0's result, else None."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(job["threads"])
    shard = None
    if world > 1:
        dist.init_process_group("gloo")
        shard = Shard(dist.get_rank(), world)
    dtype = getattr(torch, job["dtype"])
    start = time.perf_counter()
    target = load_target(Path(job["target"]), dtype, fast=True, shard=shard)
    out: dict[str, Any] = {"load_s": time.perf_counter() - start, "after_load": status_mib()}
    if job["kind"] == "speed":
        drafter = load_drafter(Path(job["assistant"]), dtype, fast=True, target=target, shard=shard)
        prompt, n, k = job["prompt"], job["tokens"], job["k"]
        runs = {"plain": lambda: greedy_generate(target, prompt, n),
                "spec": lambda: speculative_generate(target, drafter, prompt, n, DraftLength(k)).tokens}
        for run in runs.values():  # the warm-up: every shape once
            run()
        for name, run in runs.items():
            start = time.perf_counter()
            out[name] = {"tokens": run(), "seconds": time.perf_counter() - start}
    if world > 1:
        rss = [None] * world
        dist.all_gather_object(rss, out["after_load"])
        out["ranks_after_load"] = rss
        dist.destroy_process_group()
        return out if shard.rank == 0 else None
    return out


def launch(world: int, job: dict[str, Any], port: int) -> dict[str, Any]:
    """`job` in one process (world 1, on job's threads) or on `world` ranks of one thread each: rank 0's result."""
    procs = []
    for rank in range(world):
        env = os.environ | {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen([sys.executable, "-m", "bench.parallel", json.dumps(job)], cwd=SCRIPTS,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate() for p in procs]
    for rank, (p, (_, err)) in enumerate(zip(procs, outs)):
        if p.returncode:
            raise RuntimeError(f"rank {rank} of {world} exited {p.returncode}: {err.strip().splitlines()[-1:]}")
    return json.loads(outs[0][0].strip().splitlines()[-1])


# ---------------------------------------------------------------- the parts

def speed_part(root: Path, world: int, tokens: int, reps: int, k: int, small: bool,
               say: Callable[..., None]) -> dict[str, Any]:
    target_cfg, assistant_cfg = bench_configs()
    if small:
        target_cfg = target_config(512, layers=4, hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16,
                                   window=16, shared=0, ple_dim=0, double_wide=False)
        assistant_cfg = assistant_config(target_cfg, hidden=32, intermediate=64, heads=4, num_centroids=16, top_k=4)
    where = root / ("tp-small" if small else "bench")
    write_pair(where, target_cfg, assistant_cfg, torch.float32)
    job = {"kind": "speed", "target": str(where / "target"), "assistant": str(where / "assistant"),
           "dtype": "float32", "prompt": random_prompt(where / "target", 24), "tokens": tokens, "k": k}
    runs: dict[str, list[dict[str, Any]]] = {"ranks": [], "one": []}
    for rep in range(reps):
        order = [("ranks", world, 1), ("one", 1, world)]
        for name, n, threads in order if rep % 2 == 0 else order[::-1]:
            say(f"tp: repetition {rep + 1} of {reps}, {'one process' if n == 1 else f'{n} ranks'}")
            runs[name].append(launch(n, job | {"threads": threads}, PORT_BASE + rep))
    speed = {f"{name} {m}": [tokens / r[m]["seconds"] for r in rs]
             for name, rs in runs.items() for m in ("plain", "spec")}
    first = runs["one"][0]
    return {"target": job["target"], "ranks": world, "new_tokens": tokens, "reps": reps, "k": k,
            **{name: statistics.median(v) for name, v in speed.items()},
            "plain_ranks_over_one": statistics.median(a / b for a, b in zip(speed["ranks plain"], speed["one plain"])),
            "spec_ranks_over_one": statistics.median(a / b for a, b in zip(speed["ranks spec"], speed["one spec"])),
            "ranks_equal_one": all(r[m]["tokens"] == first["plain"]["tokens"] for rs in runs.values() for r in rs
                                   for m in ("plain", "spec"))}


def memory_part(root: Path, small: bool, say: Callable[..., None]) -> dict[str, Any]:
    target_cfg, assistant_cfg = big_configs(small)
    where = root / ("tp-31b-small" if small else "tp-31b")
    say(f"tp: writing a random 31B-geometry bfloat16 file with two layers under {where} (deleted after)")
    out: dict[str, Any] = {"small": small, "runs": {}}
    try:
        write_pair(where, target_cfg, assistant_cfg, torch.bfloat16)
        out["file_bytes"] = sum(f.stat().st_size for f in (where / "target").glob("*.safetensors"))
        for n in (1, 2, 4):
            say(f"tp: loading it on {n} rank{'s' if n > 1 else ''}")
            r = launch(n, {"kind": "memory", "target": str(where / "target"), "dtype": "bfloat16", "threads": 1},
                       PORT_BASE + 50 + n)
            out["runs"][str(n)] = r.get("ranks_after_load", [r["after_load"]])
    finally:
        shutil.rmtree(where, ignore_errors=True)
    gib = {n: max(rank["VmRSS"] for rank in ranks) / 1024 for n, ranks in out["runs"].items()}  # the largest rank
    sharded = 2 * (gib["1"] - gib["2"])  # resident = R + S / N: two loads give S and R
    replicated = gib["1"] - sharded
    full = dict(target_cfg, num_hidden_layers=BIG_LAYERS,  # the same geometry with the 31B's 60 layers
                layer_types=[FULL if (i + 1) % 6 == 0 else SLIDING for i in range(BIG_LAYERS)])
    ratio = split_bytes(full) / split_bytes(target_cfg)
    out |= {"resident_gib": gib, "replicated_gib": replicated, "sharded_gib": sharded, "ratio_60_layers": ratio,
            "fit_4_gib": replicated + sharded / 4,
            "projected_31b_gib": {str(n): replicated + sharded * ratio / n for n in (1, 2, 4, 8)}}
    return out


def tp_section(root: Path, world: int, tokens: int, reps: int, k: int, small: bool,
               say: Callable[..., None]) -> dict[str, Any]:
    out: dict[str, Any] = {"small": small, "cpu": cpu(), "seconds": {}}
    for name, run in (("memory", lambda: memory_part(root, small, say)),
                      ("speed", lambda: speed_part(root, world, tokens, reps, k, small, say))):
        start = time.perf_counter()
        out[name] = run()
        out["seconds"][name] = time.perf_counter() - start
    return out


def tp_table(result: dict[str, Any]) -> str:
    r = result.get("tp")
    if not r:
        return ""
    c, s, m = r["cpu"], r["speed"], r["memory"]
    lines = ["", f"== tp: tensor parallelism on gloo, this machine's CPUs{' (small)' if r['small'] else ''}",
             f"   cpu: {c['model'] or 'n/a'}; flags {' '.join(c['flags']) or 'none of those listed'}",
             f"   bench pair, float32, {s['new_tokens']} new tokens, K = {s['k']}, {s['reps']} reps: {s['ranks']} ranks of "
             f"1 thread against one process of {s['ranks']} threads",
             f"   {'':<22}{'plain tok/s':>13}{'spec tok/s':>12}",
             f"   {'one process':<22}{s['one plain']:>13.1f}{s['one spec']:>12.1f}",
             f"   {str(s['ranks']) + ' ranks':<22}{s['ranks plain']:>13.1f}{s['ranks spec']:>12.1f}",
             f"   ranks / one process: plain {s['plain_ranks_over_one']:.2f}x, speculative {s['spec_ranks_over_one']:.2f}x; "
             f"the same tokens everywhere: {'yes' if s['ranks_equal_one'] else 'NO'}",
             f"   31B geometry, 2 layers, bfloat16 file {m['file_bytes'] / 1e9:.2f} GB: resident GiB a rank after loading "
             + ", ".join(f"N={n} {g:.2f}" for n, g in m["resident_gib"].items())
             + f" (R + S/N: R {m['replicated_gib']:.2f}, S {m['sharded_gib']:.2f}; at N=4 the fit says "
               f"{m['fit_4_gib']:.2f})",
             f"   60 layers (split bytes x{m['ratio_60_layers']:.1f}): per rank "
             + ", ".join(f"N={n} {g:.1f} GiB" for n, g in m["projected_31b_gib"].items())]
    return "\n".join(lines)


if __name__ == "__main__":  # a run of `launch`: python -m bench.parallel JOB (JSON)
    result = child(json.loads(sys.argv[1]))
    if result is not None:
        print(json.dumps(result))
