"""scripts/benchmark.py's `context` section: what a long context costs, in bytes, resident memory and speed.

    python scripts/benchmark.py --only context            # --context-small: tiny sizes, for the tests

- `cache_bytes`: the K/V bytes (`gemma4.extras.memory.cache_bytes`, bfloat16) of a cache holding 8k, 32k, 128k positions
  and the model's whole context, for the five released targets (`RELEASES`), *before*: every position of every
  layer (slack >= positions), and *after*: sliding layers a ring of W + slack slots (slack = ring_slack(512)).
  A full layer costs `full_bytes_per_position` a position; past W + slack the sliding layers' bytes stay flat.
- `prefill_rss`: peak resident memory of `greedy_generate(model, prompt, 4)` over the loaded weights, each
  measurement in a fresh process, on random targets with E2B's and 31B's attention geometry (layers, heads,
  kv heads, head sizes, window, KV sharing, K=V) at a hidden size of 256, bfloat16 (random_pair.py writes
  them once). *After*: the prefill in chunks of 512 on the default cache. *Before*, as a single forward over
  the prompt on a cache keeping every position: `prefill_chunk=len(prompt)`, `RingCache(slack=capacity)`; its
  attention is quadratic in the prompt, so it runs only up to `--context-before-max` positions.
  Peaks are /proc's VmHWM restarted after loading (ru_maxrss where the kernel does not allow the restart).
- `decode`: plain greedy and speculative tokens/s for 32 new tokens after prompts of 1k, 4k and 16k positions,
  on the demo pair with its context raised in a copy of its configs (its weights were trained at 1024
  positions: acceptance is reported beside). The prompt is prefilled once; every timed run reuses its K/V
  (the cache's length set to len(prompt) - 1), so a run times one 1-token prefill and its decoding, not the prompt.
Bytes are counted in GB = 1e9 bytes.
"""

import json
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.batch import DEMO_PROMPTS
from bench.memory import SCRIPTS, reset_peak, status_mib
from bench.random_pair import assistant_config, random_prompt, target_config, write_pair
from bench.timing import median_ratio, section_threads
from gemma4 import Gemma4Tokenizer, RingCache, load_config, load_target
from gemma4.engine.ring import PREFILL_CHUNK, ring_slack
from gemma4.extras.memory import cache_bytes
from gemma4.config import FULL, SLIDING, TextConfig
from gemma4.config_file import read_json, text_config_from_dict
from gemma4.engine import decode
from gemma4.engine.rows import prefill
from mtp import DraftLength, load_drafter
from mtp.engine import speculative_one

BF16 = torch.bfloat16
NEW_TOKENS = 4  # the prefill measurement's budget
LENGTHS = {"8k": 8192, "32k": 32768, "128k": 131072}  # and "max": the model's context
# The released text configs (gemma4/README.md §16) in the official form; `period`: every period-th layer is full.
RELEASES: dict[str, dict[str, Any]] = {
    "E2B": dict(hidden_size=1536, num_hidden_layers=35, period=5, num_attention_heads=8, num_key_value_heads=1,
                sliding_window=512, intermediate_size=6144, num_kv_shared_layers=20, use_double_wide_mlp=True,
                hidden_size_per_layer_input=256, vocab_size_per_layer_input=262144, max_position_embeddings=131072),
    "E4B": dict(hidden_size=2560, num_hidden_layers=42, period=6, num_attention_heads=8, num_key_value_heads=2,
                sliding_window=512, intermediate_size=10240, num_kv_shared_layers=18,
                hidden_size_per_layer_input=256, vocab_size_per_layer_input=262144, max_position_embeddings=131072),
    "12B": dict(model_type="gemma4_unified_text", hidden_size=3840, num_hidden_layers=48, period=6,
                num_attention_heads=16, num_key_value_heads=8, num_global_key_value_heads=1, attention_k_eq_v=True,
                sliding_window=1024, intermediate_size=15360, max_position_embeddings=262144),
    "26B-A4B": dict(hidden_size=2816, num_hidden_layers=30, period=6, num_attention_heads=16, num_key_value_heads=8,
                    num_global_key_value_heads=2, attention_k_eq_v=True, sliding_window=1024, intermediate_size=2112,
                    enable_moe_block=True, num_experts=128, top_k_experts=8, moe_intermediate_size=704,
                    max_position_embeddings=262144),
    "31B": dict(hidden_size=5376, num_hidden_layers=60, period=6, num_attention_heads=32, num_key_value_heads=16,
                num_global_key_value_heads=4, attention_k_eq_v=True, sliding_window=1024, intermediate_size=21504,
                max_position_embeddings=262144),
}
# Section sizes: prompt lengths of the prefill measurement per geometry, its prefill chunk, the decode contexts.
FULL_SIZES = {"prompts": {"e2b": (512, 2048, 8192), "31b": (2048, 4096)}, "chunk": PREFILL_CHUNK,
              "contexts": (1024, 4096, 16384), "tokens": 32, "reps": 3}
SMALL_SIZES = {"prompts": {"e2b": (160,), "31b": (80, 160)}, "chunk": 32,  # a ring of 8 + 64 slots: 160 wraps it
               "contexts": (100, 300), "tokens": 6, "reps": 1}
GOAL_GB = 0.6  # 31B geometry: the prefill of its longer prompt over its shorter one


def release_config(name: str) -> TextConfig:
    fields = dict(RELEASES[name])
    period = fields.pop("period")
    types = [FULL if (i + 1) % period == 0 else SLIDING for i in range(fields["num_hidden_layers"])]
    return text_config_from_dict({"vocab_size": 262144, "head_dim": 256, "global_head_dim": 512,
                                  "layer_types": types} | fields)


def per_position(config: TextConfig, kind: str, dtype: torch.dtype = BF16) -> int:
    """K/V bytes one position (a full layer) or one ring slot (a sliding layer) costs across the layers of `kind`."""
    return sum(2 * config.kv_heads[i] * config.head_dims[i] * dtype.itemsize  # K and V
               for i in range(config.first_shared_layer) if config.layer_types[i] == kind)


def cache_table() -> dict[str, Any]:
    slack = ring_slack(PREFILL_CHUNK)
    out: dict[str, Any] = {"dtype": "bfloat16", "slack": slack, "families": {}}
    for name in RELEASES:
        c = release_config(name)
        lengths = LENGTHS | {"max": c.max_position_embeddings}
        out["families"][name] = {
            "context": c.max_position_embeddings, "sliding_window": c.sliding_window,
            "ring_slots": c.sliding_window + slack, "full_bytes_per_position": per_position(c, FULL),
            "sliding_bytes_per_slot": per_position(c, SLIDING), "lengths": lengths,
            "before": {k: cache_bytes(c, n, slack=n) for k, n in lengths.items()},
            "after": {k: cache_bytes(c, n, slack=slack) for k, n in lengths.items()}}
    return out


# ---------------------------------------------------------------- peak RSS of a prefill


def geometry(name: str, small: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """A random target with E2B's or 31B's attention geometry at hidden 256 (tiny when `small`), and an assistant
    of the least width that fits it (write_pair writes one; the prefill never reads it)."""
    e2b = name == "e2b"
    if small:
        dims = dict(layers=7 if e2b else 6, hidden=32, heads=2 if e2b else 4, kv_heads=1 if e2b else 2, head_dim=16,
                    window=8, intermediate=64)
    else:
        dims = dict(layers=35 if e2b else 60, hidden=256, heads=8 if e2b else 32, kv_heads=1 if e2b else 16,
                    head_dim=256, window=512 if e2b else 1024, intermediate=512)
    shared = (2 if small else 20) if e2b else 0
    target = target_config(1024, shared=shared, ple_dim=0, double_wide=False, **dims)  # E2B's 4:1 pattern
    k_eq_v: dict[str, Any] = {}
    if not e2b:  # 31B: 5:1, K=V full layers with 4 kv heads (1 when small)
        target["layer_types"] = [FULL if (i + 1) % 6 == 0 else SLIDING for i in range(dims["layers"])]
        k_eq_v = {"attention_k_eq_v": True, "num_global_key_value_heads": 1 if small else 4}
        target |= k_eq_v | {"max_position_embeddings": 262_144}
    assistant = assistant_config(target, hidden=32, intermediate=64, heads=dims["heads"], num_centroids=16, top_k=4)
    assistant["text_config"] |= k_eq_v
    return target, assistant


def rss_child(model_dir: Path, length: int, mode: str, chunk: int, threads: int) -> dict[str, Any]:
    """Runs in a fresh process: the peak resident bytes of one prefill + NEW_TOKENS over the loaded, warmed model."""
    torch.set_num_threads(threads)
    model = load_target(model_dir, dtype=BF16, fast=True)
    prompt = random_prompt(model_dir, length)
    decode(model, [prompt[:8]], 1)  # pages the weights in, warms the allocator
    base = status_mib()
    separate = reset_peak()
    capacity = length + NEW_TOKENS
    start = time.perf_counter()
    if mode == "after":
        slack = ring_slack(chunk)
        tokens = decode(model, [prompt], NEW_TOKENS, prefill_chunk=chunk)[0].tokens
    else:  # the single forward over a cache keeping every position
        slack = capacity
        cache = RingCache(model.config, capacity, dtype=BF16, slack=slack)
        tokens = decode(model, [prompt], NEW_TOKENS, cache=cache, prefill_chunk=length)[0].tokens
    seconds = time.perf_counter() - start
    peak_kib = status_mib()["VmHWM"] * 1024 if separate else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_over_loaded_bytes": int(peak_kib * 1024 - base["VmRSS"] * 2**20),
            "loaded_rss_bytes": int(base["VmRSS"] * 2**20), "cache_bytes": cache_bytes(model.config, capacity, slack),
            "seconds": seconds, "tokens": tokens, "peak_restarted": separate}


def rss_run(model_dir: Path, length: int, mode: str, chunk: int, threads: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "bench.context", str(model_dir.resolve()), str(length), mode,
                          str(chunk), str(threads)], capture_output=True, text=True, cwd=SCRIPTS)
    if out.returncode:
        raise RuntimeError(f"the prefill measurement failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def rss_section(root: Path, sizes: dict[str, Any], small: bool, before_max: int, threads: int,
                say: Callable[..., None]) -> dict[str, Any]:
    out: dict[str, Any] = {"new_tokens": NEW_TOKENS, "prefill_chunk": sizes["chunk"], "hidden": 32 if small else 256,
                           "before_max": before_max, "geometries": {}}
    for name, lengths in sizes["prompts"].items():
        t_dir, _ = write_pair(root / name, *geometry(name, small), BF16)
        runs: dict[str, Any] = {}
        for n in lengths:
            say(f"context: {name} geometry, prefill of {n} positions")
            runs[str(n)] = {"after": rss_run(t_dir, n, "after", sizes["chunk"], threads),
                            "before": rss_run(t_dir, n, "before", sizes["chunk"], threads) if n <= before_max else None}
        out["geometries"][name] = {"target": str(t_dir), "runs": runs}
    short, long = sizes["prompts"]["31b"][0], sizes["prompts"]["31b"][-1]
    runs = out["geometries"]["31b"]["runs"]
    growth = {}  # mode -> the longer prompt's peak minus the shorter one's (None: `before` not measured)
    for mode in ("after", "before"):
        a, b = runs[str(short)][mode], runs[str(long)][mode]
        growth[mode] = None if a is None or b is None else b["peak_over_loaded_bytes"] - a["peak_over_loaded_bytes"]
    out["goal"] = {"short": short, "long": long, "growth_bytes": growth}
    return out


# ---------------------------------------------------------------- decode speed as the context grows


def lifted(src: Path, dst: Path, context: int) -> Path:
    """A copy of a checkpoint directory whose config allows `context` positions (the drafter's text config too)."""
    dst.mkdir(parents=True, exist_ok=True)
    for file in src.iterdir():
        if file.is_file() and file.name != "config.json" and not (dst / file.name).is_file():
            shutil.copyfile(file, dst / file.name)
    raw = read_json(src / "config.json")
    fields = raw.get("text_config", raw)  # an assistant's (and a multimodal file's) text fields sit there
    fields["max_position_embeddings"] = max(context, int(fields.get("max_position_embeddings", 0)))
    (dst / "config.json").write_text(json.dumps(raw, indent=2))
    return dst


def long_prompt(target_dir: Path, length: int) -> list[int]:
    """The demo prompts' text, repeated to `length` ids after <bos>; seeded ids without a tokenizer."""
    tok = target_dir / "tokenizer.json"
    if not tok.is_file():
        return random_prompt(target_dir, length)
    ids = Gemma4Tokenizer(tok).encode_raw("\n".join(DEMO_PROMPTS))[1:]
    return [2] + (ids * (length // len(ids) + 1))[:length - 1]


def decode_section(root: Path, target_dir: Path, assistant_dir: Path, k: int, sizes: dict[str, Any],
                   interleaved: Callable) -> dict[str, Any]:
    tokens, reps = sizes["tokens"], sizes["reps"]
    context = 2 * max(sizes["contexts"])
    target = load_target(lifted(target_dir, root / "demo" / "target", context), fast=True)
    drafter = load_drafter(lifted(assistant_dir, root / "demo" / "assistant", context), fast=True)
    trained = load_config(target_dir).max_position_embeddings
    out: dict[str, Any] = {"target": str(target_dir), "assistant": str(assistant_dir), "tokens": tokens,
                           "reps": reps, "k": k, "trained_context": trained, "contexts": {}}
    for n in sizes["contexts"]:
        prompt = long_prompt(target_dir, n)
        cache = RingCache(target.config, n + tokens)  # (B, K, n + tokens, D) full layers; rings of W + 512
        start = time.perf_counter()
        prefill(target, cache, [prompt])
        prefill_s = time.perf_counter() - start
        stats: dict[str, Any] = {}

        def held() -> RingCache:
            """The cache holding the prompt's first n - 1 ids: the loops prefill from its length."""
            cache.length = torch.tensor([n - 1])
            return cache

        def spec() -> list[int]:
            result = speculative_one(target, drafter, prompt, tokens, DraftLength(k), cache=held())
            stats["acceptance_rate"] = result.stats.acceptance_rate
            return result.tokens

        runs = {"plain": lambda: decode(target, [prompt], tokens, cache=held())[0].tokens,
                "spec": spec}  # each run: prompt[n-1] prefilled over the K/V of the rest, then `tokens` decoded
        seconds, outputs = interleaved(runs, reps, warm_up=runs)
        speed = {name: [tokens / s for s in secs] for name, secs in seconds.items()}
        out["contexts"][str(n)] = {
            "prefill_s": prefill_s, "plain_tokens_per_s": statistics.median(speed["plain"]),
            "spec_tokens_per_s": statistics.median(speed["spec"]),
            "speedup": median_ratio(speed["spec"], speed["plain"]), "acceptance_rate": stats["acceptance_rate"],
            "identical": all(o == outputs["plain"][0] for outs in outputs.values() for o in outs)}
    return out


# ---------------------------------------------------------------- the section, its goal and its table


def context_section(root: Path, target_dir: Path, assistant_dir: Path, k: int, small: bool, before_max: int | None,
                    asked: int | None, interleaved: Callable, say: Callable[..., None]) -> dict[str, Any]:
    """`asked`: --threads; else each part on the threads of the one thread rule for the model it measures
    (bench/timing.py `section_threads`): the prefill geometries', then the demo pair's (`threads` says which)."""
    sizes = SMALL_SIZES if small else FULL_SIZES
    root = root / ("context-small" if small else "context")
    before_max = max(max(p) for p in sizes["prompts"].values()) if before_max is None else before_max
    out: dict[str, Any] = {"small": small, "cache_bytes": cache_table(), "seconds": {}, "threads": {}}
    start = time.perf_counter()
    n = out["threads"]["prefill"] = section_threads(geometry("e2b", small)[0]["hidden_size"], asked)
    say(f"context: peak RSS of prefills, a fresh process each ({n} torch thread{'s' if n != 1 else ''})")
    out["prefill_rss"] = rss_section(root, sizes, small, before_max, out["threads"]["prefill"], say)
    out["seconds"]["prefill_rss"] = time.perf_counter() - start
    if (target_dir / "config.json").is_file():
        out["threads"]["decode"] = section_threads(load_config(target_dir).hidden_size, asked)
        say(f"context: decode tokens/s as the context grows, plain and speculative ({out['threads']['decode']} "
            f"torch thread{'s' if out['threads']['decode'] != 1 else ''})")
        start = time.perf_counter()
        out["decode"] = decode_section(root, target_dir, assistant_dir, k, sizes, interleaved)
        out["seconds"]["decode"] = time.perf_counter() - start
    else:
        out["decode"] = {"skipped": f"{target_dir} has no checkpoint"}
    return out


def context_goals(result: dict[str, Any]) -> list[dict[str, Any]]:
    r = result.get("context")
    if not r:
        return []
    g = r["prefill_rss"]["goal"]
    value = g["growth_bytes"]["after"] / 1e9
    return [{"goal": f"context: 31b prefill peak, {g['long']} minus {g['short']} (GB)",
             "value": value, "limit": GOAL_GB, "at_least": False, "met": value <= GOAL_GB}]


def gb(x: int | None) -> str:
    return "-" if x is None else f"{x / 1e9:.3f}"


def context_table(result: dict[str, Any]) -> str:
    r = result.get("context")
    if not r:
        return ""
    c = r["cache_bytes"]
    lines = ["", f"== context: K/V cache bytes (GB, {c['dtype']}), before (every position of every layer) / after "
                 f"(sliding layers a ring of W + {c['slack']})",
             f"   {'family':<9}{'context':>8}{'full/pos':>10}{'ring/slot':>10}" + "".join(f"{k:>18}" for k in
                                                                                      (*LENGTHS, "max"))]
    for name, f in c["families"].items():
        lines.append(f"   {name:<9}{f['context']:>8}{f['full_bytes_per_position']:>10}{f['sliding_bytes_per_slot']:>10}"
                     + "".join(f"{gb(f['before'][k]) + ' / ' + gb(f['after'][k]):>18}" for k in f["lengths"]))
    p = r["prefill_rss"]
    lines += ["", f"== context: peak RSS of greedy_generate(prompt, {p['new_tokens']}) over the loaded weights (GB), "
                  f"hidden {p['hidden']}, bfloat16, a fresh process each; after: chunks of {p['prefill_chunk']}; "
                  f"before: one forward, every position kept (up to {p['before_max']} positions)",
              f"   {'geometry':<10}{'prompt':>8}{'after':>10}{'cache':>10}{'s':>8}{'before':>10}{'cache':>10}{'s':>8}"]
    for name, g in p["geometries"].items():
        for n, run in g["runs"].items():
            a, b = run["after"], run["before"] or {}
            lines.append(f"   {name:<10}{n:>8}{gb(a['peak_over_loaded_bytes']):>10}{gb(a['cache_bytes']):>10}"
                         f"{a['seconds']:>8.1f}{gb(b.get('peak_over_loaded_bytes')):>10}{gb(b.get('cache_bytes')):>10}"
                         f"{format(b['seconds'], '.1f') if b else '-':>8}")
    growth = p["goal"]["growth_bytes"]
    lines.append(f"   31b: {p['goal']['long']} minus {p['goal']['short']} positions: after {gb(growth['after'])}, "
                 f"before {gb(growth['before'])} GB")
    d = r["decode"]
    if "skipped" in d:
        return "\n".join(lines + [f"   decode: skipped, {d['skipped']}"])
    lines += ["", f"== context: decode after a long prompt, {d['tokens']} new tokens, K = {d['k']}, median of "
                  f"{d['reps']} (demo pair, trained at {d['trained_context']} positions)",
              f"   {'prompt':>8}{'prefill s':>11}{'plain tok/s':>13}{'spec tok/s':>12}{'spec/plain':>12}"
              f"{'acceptance':>12}{'identical':>11}"]
    for n, x in d["contexts"].items():
        lines.append(f"   {n:>8}{x['prefill_s']:>11.2f}{x['plain_tokens_per_s']:>13.1f}{x['spec_tokens_per_s']:>12.1f}"
                     f"{x['speedup']:>11.2f}x{x['acceptance_rate']:>12.3f}{'yes' if x['identical'] else 'NO':>11}")
    return "\n".join(lines)


if __name__ == "__main__":  # rss_run's child: python -m bench.context MODEL_DIR LENGTH MODE CHUNK THREADS
    print(json.dumps(rss_child(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))))
