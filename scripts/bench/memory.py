"""scripts/benchmark.py's `memory` section: peak resident memory of `load_target` in a fresh process; and the
weight bytes one decode step reads (the `bandwidth` section's bound).

The weights as loaded are the reference: the E2B-dimension checkpoint in bfloat16 loaded as bfloat16
(memory-mapped), the same file as float32 (every weight cast), and a float32 file as float32. Peaks are
read from /proc (Linux): VmHWM, restarted between loading and the first forward where the kernel allows.
"""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from gemma4 import load_target
from gemma4.model import Gemma4Model
from gemma4.engine.forward import forward_rows

SCRIPTS = Path(__file__).resolve().parent.parent


def status_mib() -> dict[str, float]:
    """VmRSS (resident now), VmHWM (peak resident), RssAnon (private memory), RssFile (mapped file pages)."""
    keys = ("VmRSS", "VmHWM", "RssAnon", "RssFile")
    lines = Path("/proc/self/status").read_text().splitlines()
    return {line.split(":")[0]: int(line.split()[1]) / 1024 for line in lines if line.startswith(keys)}


def reset_peak() -> bool:
    """Restart VmHWM from the current RSS (Linux: `echo 5 > /proc/self/clear_refs`)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def memory_child(model_dir: Path, dtype: str, threads: int | None = None) -> dict[str, Any]:
    """Runs in a fresh process (on `threads` torch threads, else torch's default): resident memory before, at the
    peak of loading, and after one forward."""
    if threads is not None:
        torch.set_num_threads(threads)
    base = status_mib()
    separate = reset_peak()
    model = load_target(model_dir, dtype=getattr(torch, dtype), fast=True)  # the speed layer as loaded (gemma4/fast/)
    loaded = status_mib()
    # The weights as loaded: in the model's dtype, but the PLE table in the file's (weights.py). A packed
    # weight's parameter may be the file's view in the file's dtype: its packed copy is what is held.
    ple = getattr(model, "embed_tokens_per_layer", None)
    text_mib = sum(p.numel() * (p.element_size() if ple is not None and p is ple.weight
                                else getattr(torch, dtype).itemsize) for p in model.parameters()) / 2**20
    if separate:
        reset_peak()
    with torch.inference_mode():
        forward_rows(model, torch.tensor([[2, 107, 108, 109]]), num_logits=1)  # pages every weight in but the PLE rows
    ran = status_mib()
    return {"dtype": dtype, "text_weights_mib": text_mib, "baseline": base, "after_load": loaded,
            "after_forward": ran, "load_peak_over_text": (loaded["VmHWM"] - base["VmRSS"]) / text_mib,
            "forward_peak_over_text": (ran["VmHWM"] - base["VmRSS"]) / text_mib, "peaks_separate": separate}


def memory_section(model_dir: Path, dtype: str, threads: int | None = None) -> dict[str, Any]:
    """memory_child in a fresh interpreter: nothing loaded before can hide in the peak."""
    # `-m` puts the working directory first on the child's path: run in scripts/, it finds bench.memory.
    out = subprocess.run([sys.executable, "-m", "bench.memory", str(model_dir.resolve()), dtype,
                          *([] if threads is None else [str(threads)])], capture_output=True, text=True, cwd=SCRIPTS)
    if out.returncode:
        raise RuntimeError(f"the memory measurement failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def decode_bytes(model: Gemma4Model) -> int:
    """Bytes of weights one decode step reads: every parameter, the whole tied embedding (the head scores
    every token), but of the PLE table only the token's own row, and of a MoE layer's experts only the top-k
    the token is routed to (8 of 26B-A4B's 128)."""
    c = model.config
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    if c.ple_dim:
        table = model.embed_tokens_per_layer.weight  # (V, L*P)
        total -= (table.shape[0] - 1) * table.shape[1] * table.element_size()
    for layer in model.layers:
        if layer.moe:  # (X, 2I, E) and (X, E, I): X - k experts stay unread
            for w in (layer.experts.gate_up_proj, layer.experts.down_proj):
                total -= (c.num_experts - c.top_k_experts) * w[0].numel() * w.element_size()
    return total


if __name__ == "__main__":  # memory_section's child: python -m bench.memory MODEL_DIR DTYPE [THREADS]
    print(json.dumps(memory_child(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else None)))
