"""The 31B part of scripts/bench/int4.py: a random 31B-geometry int4 file (bench/int4_files.py) loaded with fast=False
and fast=True, each in a fresh process (`python -m bench.int4_31b`): resident memory after loading and after a few
tokens, the peak, seconds a forward; the file is deleted after."""

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.int4_files import (
    BF16,
    config_31b,
    file_bytes,
    random_tensors,
    release_layout,
    write_release,
)
from bench.memory import SCRIPTS, reset_peak, status_mib
from bench.random_pair import random_prompt
from gemma4 import load_target
from gemma4.fast import products
from gemma4.fast.int4 import Int4Product
from gemma4.engine.rows import Request, new_cache
from gemma4.int4 import GROUP
from gemma4.engine.forward import forward_rows

MIN_AVAILABLE = 1.5 * 2**30  # bytes of MemAvailable below which a 31B child stops itself


def meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes."""
    lines = Path("/proc/meminfo").read_text().splitlines()
    return {line.split(":")[0]: int(line.split()[1]) * 1024 for line in lines if line.split()[-1] == "kB"}


@torch.inference_mode()
def timed_greedy(model: Any, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """greedy_generate's loop (gemma4/generate.py) with the seconds of every forward: the prefill, then the steps."""
    cache = new_cache(model, [Request(prompt, n)], None)  # the engine's ring, as forward_rows takes
    ids, position, tokens, seconds = prompt, 0, [], []
    while len(tokens) < n:
        start = time.perf_counter()
        out = forward_rows(model, torch.tensor([ids]), cache, start_pos=torch.tensor([position]), num_logits=1)
        tokens.append(int(out.logits[0, -1].argmax()))
        seconds.append(time.perf_counter() - start)
        position += len(ids)
        cache.length[0] = position
        ids = tokens[-1:]
    return tokens, seconds


def big_child(model_dir: Path, fast: bool, tokens: int, threads: int) -> dict[str, Any]:
    """Runs in a fresh process: load, then `tokens` greedy tokens, with the resident memory at each stage. A thread
    watches MemAvailable and ends the process (its stage said on stdout) before the machine runs out."""
    torch.set_num_threads(threads)
    stage = {"now": "loading"}

    def watch() -> None:
        while True:
            available = meminfo()["MemAvailable"]
            if available < MIN_AVAILABLE:
                print(json.dumps({"stopped": f"{available / 2**30:.1f} GiB available while {stage['now']}",
                                  "at_stop": status_mib()}), flush=True)
                os._exit(3)
            time.sleep(0.05)

    base, total = status_mib(), meminfo()["MemTotal"]
    reset_peak()
    threading.Thread(target=watch, daemon=True).start()
    start = time.perf_counter()
    model = load_target(model_dir, BF16, fast=fast)
    load_s, loaded = time.perf_counter() - start, status_mib()
    stage["now"] = f"decoding {tokens} tokens"
    ids, seconds = timed_greedy(model, random_prompt(model_dir, 4), tokens)
    return {"fast": fast, "mem_total_bytes": total, "baseline": base, "load_s": load_s, "after_load": loaded,
            "after_decode": status_mib(), "forward_s": seconds, "tokens": ids, "stopped": None,
            "int4_product_bytes": sum(p.nbytes() for p in products(model) if isinstance(p, Int4Product))}


def big_part(root: Path, small: bool, tokens: int, threads: int, say: Callable[..., None]) -> dict[str, Any]:
    config = config_31b(small)
    size = file_bytes(release_layout(config)[2])
    where = root / ("31b-int4-small" if small else "31b-int4")
    free = shutil.disk_usage(next(p for p in (root, *root.parents) if p.exists())).free
    table, int4, _ = release_layout(config)
    # What the speed layer holds for the int4 layers in bfloat16 (gemma4/fast/int4.py): half a byte a weight, and a
    # (scale, zero) pair of bfloat16 a group of 32; the embedding (the tied head) is bfloat16.
    held = sum(table[key][0] * table[key][1] * (0.5 + 4 / GROUP) for key in int4)
    embedding = torch.Size(table["embed_tokens.weight"]).numel() * BF16.itemsize
    out: dict[str, Any] = {"small": small, "file_bytes": size, "new_tokens": tokens, "layers": config[
        "num_hidden_layers"], "hidden": config["hidden_size"], "mem_total_bytes": meminfo()["MemTotal"],
        "int4_layers": len(int4), "int4_product_bytes_expected": int(held), "embedding_bytes": embedding, "runs": {}}
    if size + 2**30 > free:
        return out | {"skipped": f"{size / 1e9:.1f} GB to write, {free / 1e9:.1f} GB free under {root}"}
    say(f"int4: writing a random 31B-geometry int4 file, {size / 1e9:.1f} GB under {where} (deleted after)")
    start = time.perf_counter()
    try:
        generation = {"bos_token_id": 2, "pad_token_id": 0, "eos_token_id": [1, 106, 50], "do_sample": False}
        model_dir = write_release(where / "target", config, random_tensors(config), generation)
        out["write_s"] = time.perf_counter() - start
        for name, fast in (("textbook", False), ("fast", True)):
            say(f"int4: 31B geometry, load_target(fast={fast}) and {tokens} tokens in a fresh process")
            child = subprocess.run([sys.executable, "-m", "bench.int4_31b", str(model_dir.resolve()), str(int(fast)),
                                    str(tokens), str(threads)], capture_output=True, text=True, cwd=SCRIPTS)
            lines = child.stdout.strip().splitlines()
            out["runs"][name] = json.loads(lines[-1]) if lines else {
                "stopped": f"exit status {child.returncode}: {(child.stderr.strip().splitlines() or [''])[-1]}"}
    finally:
        shutil.rmtree(where, ignore_errors=True)
    return out


if __name__ == "__main__":  # big_part's child: python -m bench.int4_31b MODEL_DIR FAST TOKENS THREADS
    print(json.dumps(big_child(Path(sys.argv[1]), bool(int(sys.argv[2])), int(sys.argv[3]), int(sys.argv[4]))))
