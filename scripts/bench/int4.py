"""scripts/benchmark.py's `int4` section: int4 targets in the layout of Google's w4a16 releases (gemma4/int4.py)
against bfloat16, `transformers`, the memory-bandwidth bound and this machine's memory.

    python scripts/benchmark.py --only int4             # --int4-31b adds the 31B part; --int4-small: tiny sizes

- `e2b`: the bf16 section's random pair at E2B's dimensions, full vocabulary (262,144), and its target rewritten
  once as a release stores it (`quantized_copy`: the release's recipe, gemma4/int4.py `quantize`, on every
  projection it quantizes; embeddings and norms bf16). Both loaded with the speed layer in bfloat16: plain greedy
  tokens/s, int4 / bf16; a decode step of each against the bound of the bytes it reads (int4: the packed words
  and scales as the speed layer holds them, `Int4Product.nbytes`, plus every float weight a step reads,
  bench/memory.py `decode_bytes`: the whole tied head, one PLE row) over the best copy taken in turns with the
  steps (bench/costs.py's bound); then ours against `transformers` on the same int4 files.
  `from_pretrained` as a user calls it: compressed-tensors decompresses the weights to bfloat16 at the first
  forward (the untimed warm-up), so it decodes dense.
- `demo`: the demo pair, the target quantized at load (`load_target(quantize="int4")`) and as it is (float32),
  speculative / plain greedy tokens/s for each: does drafting pay on an int4 target as on the float one.
- `31b` (--int4-31b, disk and time in benchmark.md): a random int4 file of 31B's geometry written directly in the
  release layout (random words, scales for weights of rms I^-1/2, a bf16 embedding; 60 layers, hidden 5376,
  ≈ 19 GB), loaded with fast=False and fast=True, each in a fresh process: resident memory after loading and
  after decoding a few tokens, the peak, seconds a forward; the files are deleted after. A thread stops a child
  whose load leaves less than 1.5 GiB available (`MIN_AVAILABLE`), and says so, rather than wait for the kernel.
Ratios are medians of per-repetition ratios (bench/timing.py `interleaved`), as everywhere in the benchmark.
"""

import contextlib
import ctypes
import gc
import io
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from bench.audio import cpu
from bench.memory import SCRIPTS, decode_bytes, reset_peak, status_mib
from bench.random_pair import (DTYPE_CODES, assistant_config, e2b_configs, random_prompt, random_tensor,
                               target_config, write_pair)
from bench.show import written
from bench.timing import median_ratio, our_decode_step, prefilled, section_threads
from bench.transformers_baseline import tf_generate
from gemma4 import greedy_generate, load_config, load_target
from gemma4.config import FULL, SLIDING
from gemma4.config_file import read_json, text_config_from_dict
from gemma4.fast import kernels_of, products
from gemma4.fast.int4 import Int4Product
from gemma4.generate import new_cache
from gemma4.int4 import GROUP, is_quantized, quantize
from gemma4.weights import int4_table as int4_names  # the name table with each int4 key's triple
from gemma4.weights import target_weight_table
from mtp import DraftLength, load_drafter, speculative_generate

BF16 = torch.bfloat16
FULL_VOCAB = 262144
CODES = DTYPE_CODES | {torch.int32: "I32"}
MIN_AVAILABLE = 1.5 * 2**30  # bytes of MemAvailable below which a 31B child stops itself
Q_RMS = (sum(q * q for q in range(-8, 8)) / 16) ** 0.5  # rms of a uniform nibble's q in -8..7: 4.64
GOALS = (("e2b: int4 / bf16 plain tokens/s", ("e2b", "int4_over_bf16"), 2.0),
         ("e2b: int4 decode step / bandwidth bound", ("e2b", "int4_bound", "fraction_step"), 0.6),
         ("e2b: ours int4 / transformers int4 plain tokens/s", ("e2b", "ours_over_tf"), 3.0),
         ("demo float32: speculative/plain, int4 target over float", ("demo", "float32", "int4_speedup_over_float"),
          1.0),
         ("demo bfloat16: speculative/plain, int4 target over float", ("demo", "bfloat16", "int4_speedup_over_float"),
          1.0))
DEMO_DTYPES = ("float32", "bfloat16")
VERIFY = 4  # drafts a timed verify checks: K + 1 = 5 rows, the demo assistant's K
# config.json's quantization_config as the w4a16 releases write it (gemma4/int4.py `check_scheme` reads it).
QUANTIZATION_CONFIG = {
    "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
    "config_groups": {"group_0": {"targets": ["Linear"], "format": "pack-quantized",
                                  "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                                              "group_size": GROUP, "dynamic": False, "actorder": None,
                                              "observer": "minmax"},
                                  "input_activations": None, "output_activations": None}},
    "ignore": ["lm_head"], "kv_cache_scheme": None}


# ---------------------------------------------------------------- configs and files

def small_e2b() -> tuple[dict[str, Any], dict[str, Any]]:
    """E2B's structure (KV sharing, PLE, double-wide MLP) at tiny widths that fill groups of 32 (the tests')."""
    target = target_config(512, layers=7, hidden=64, intermediate=128, heads=2, kv_heads=1, head_dim=32, window=8,
                           shared=2, ple_dim=32, double_wide=True)
    return target, assistant_config(target, hidden=32, intermediate=64, heads=2, num_centroids=16, top_k=4)


def config_31b(small: bool) -> dict[str, Any]:
    """31B's text config (spec §4: 60 layers, every 6th full with 4 K=V heads of 512); tiny widths when `small`."""
    dims = (dict(layers=6, hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=32, window=8) if small else
            dict(layers=60, hidden=5376, intermediate=21504, heads=32, kv_heads=16, head_dim=256, window=1024))
    target = target_config(512 if small else FULL_VOCAB, shared=0, ple_dim=0, double_wide=False, **dims)
    target["layer_types"] = [FULL if (i + 1) % 6 == 0 else SLIDING for i in range(dims["layers"])]
    return target | {"attention_k_eq_v": True, "num_global_key_value_heads": 1 if small else 4,
                     "max_position_embeddings": 262_144}


def release_layout(config: dict[str, Any]) -> tuple[dict[str, tuple[int, ...]], list[str], dict[str, Any]]:
    """The float name table, its keys a release stores as int4, and the file's tensors: name -> (dtype, shape)."""
    table = target_weight_table(text_config_from_dict(config))
    int4 = [k for k in table if is_quantized(k) and table[k][1] % GROUP == 0]
    kinds = {"weight_packed": torch.int32, "weight_shape": torch.int64}
    specs = {"model." + k: (kinds.get(k.rpartition(".")[2], BF16), s) for k, s in int4_names(table, int4).items()}
    return table, int4, specs


def file_bytes(specs: dict[str, Any]) -> int:
    return sum(torch.Size(shape).numel() * dtype.itemsize for dtype, shape in specs.values())


def write_release(dst: Path, config: dict[str, Any], tensors: Iterator[torch.Tensor], generation: dict) -> Path:
    """config.json with the release's quantization_config, and model.safetensors streamed tensor by tensor in the
    order of `release_layout` (as bench/random_pair.py writes: nothing sits in memory but the tensor at hand)."""
    _, _, specs = release_layout(config)
    dst.mkdir(parents=True, exist_ok=True)
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in specs.items():
        size = torch.Size(shape).numel() * dtype.itemsize
        header[name] = {"dtype": CODES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # the data 8-byte aligned: every tensor can be a view of it
    with open(dst / "model.safetensors", "wb") as f, written(f"writing {dst.parent.name}/{dst.name}", offset) as done:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for (name, (dtype, shape)), t in zip(specs.items(), tensors, strict=True):
            if t.dtype != dtype or tuple(t.shape) != tuple(shape):
                raise ValueError(f"{name}: {t.dtype} {list(t.shape)}, the layout says {dtype} {list(shape)}")
            t = t.contiguous()
            f.write((ctypes.c_ubyte * (t.numel() * t.itemsize)).from_address(t.data_ptr()))  # the bytes, no copy
            done.update(t.numel() * t.itemsize)
    (dst / "config.json").write_text(json.dumps(config | {"dtype": "bfloat16",
                                                          "quantization_config": QUANTIZATION_CONFIG}, indent=2))
    (dst / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return dst


def quantized_copy(src: Path, dst: Path) -> Path:
    """The bf16 target in `src` rewritten once into `dst` as a release stores it (reused while src is the same)."""
    stamp = {"source": read_json(src.parent / "pair.json"), "format": 1}
    if (dst / "int4.json").is_file() and read_json(dst / "int4.json") == stamp:
        return dst
    config = read_json(src / "config.json")
    config.pop("dtype", None)
    table, int4, _ = release_layout(config)
    handle = safe_open(str(src / "model.safetensors"), framework="pt")

    def tensors() -> Iterator[torch.Tensor]:
        for key, shape in table.items():
            w = handle.get_tensor("model." + key)
            if key in int4:
                yield from (*quantize(w), torch.tensor(list(shape)))  # words, scales, [O, I]
            else:
                yield w.to(BF16)

    write_release(dst, config, tensors(), read_json(src / "generation_config.json"))
    (dst / "int4.json").write_text(json.dumps(stamp, indent=2))
    return dst


def random_tensors(config: dict[str, Any], seed: int = 0) -> Iterator[torch.Tensor]:
    """Random int4 words (every nibble uniform in 0..15) with scales giving weights of rms I^-1/2, as random_pair's
    N(0, 1/I), and random_pair's values elsewhere, drawn 4096 rows at a time: a 31B file never sits in memory."""
    table, int4, _ = release_layout(config)
    gen = torch.Generator().manual_seed(seed)
    for key, shape in table.items():
        if key in int4:
            o, i = shape
            yield torch.randint(-2**31, 2**31, (o, i // 8), dtype=torch.int32, generator=gen)  # (O, I/8)
            yield torch.full((o, i // GROUP), 1 / (Q_RMS * i**0.5), dtype=BF16)  # (O, G)
            yield torch.tensor(list(shape))
            continue
        out = torch.empty(shape, dtype=BF16)
        for rows in out.split(4096):
            rows.copy_(random_tensor("model." + key, tuple(rows.shape), 0, gen))
        yield out


# ---------------------------------------------------------------- E2B: int4 against bf16, the bound, transformers

def e2b_part(root: Path, small: bool, tokens: int, reps: int, copy_mib: int, use_transformers: bool,
             interleaved: Callable, say: Callable[..., None]) -> dict[str, Any]:
    configs = small_e2b() if small else e2b_configs(FULL_VOCAB)
    bf16_dir, _ = write_pair(root / ("int4-small-bf16" if small else "bfloat16-full"), *configs, BF16)
    int4_dir = quantized_copy(bf16_dir, root / ("int4-small" if small else "int4-full") / "target")
    prompt = random_prompt(bf16_dir, 16)
    say("int4: loading the E2B-dimension target in bfloat16 and in int4 (speed layer)")
    models = {"int4": load_target(int4_dir, BF16, fast=True), "bf16": load_target(bf16_dir, BF16, fast=True)}
    src = torch.ones(copy_mib * 2**20 // 4)
    dst = torch.empty_like(src)
    runs: dict[str, Callable[[], Any]] = {"copy": lambda: dst.copy_(src), "read": lambda: src.sum()}
    for name, model in models.items():
        runs[name] = lambda model=model: greedy_generate(model, prompt, tokens)
        runs[f"{name}_step"] = our_decode_step(model, prompt)
        runs[f"{name}_verify"] = verify_step(model, prompt)
    say(f"int4: timing int4 and bf16 ({reps} reps of {tokens} tokens), decode steps and copies")
    s, outputs = interleaved(runs, reps, warm_up=runs)
    copy_bw = 2 * src.nbytes / min(s["copy"])  # read + written, the best copy (bench/costs.py's bound)
    rep_bw = [max(2 * src.nbytes / c, src.nbytes / r) for c, r in zip(s["copy"], s["read"])]
    out: dict[str, Any] = {"target": str(bf16_dir), "int4_target": str(int4_dir), "prompt_tokens": len(prompt),
                           "new_tokens": tokens, "reps": reps, "copy_mib": copy_mib,
                           "copy_bytes_per_s": copy_bw, "read_bytes_per_s": src.nbytes / min(s["read"]),
                           "int4_kernels": int4_kernels(models["int4"])}
    speed = {name: [tokens / x for x in s[name]] for name in models}
    for name, model in models.items():
        held = sum(p.nbytes() for p in products(model) if isinstance(p, Int4Product))
        per_step = held + decode_bytes(model)  # int4: the packed words and scales; the float weights a step reads
        out[name] = {"tokens_per_s": statistics.median(speed[name]), "step_s": statistics.median(s[f"{name}_step"]),
                     "verify_over_step": median_ratio(s[f"{name}_verify"], s[f"{name}_step"])}
        out[f"{name}_bound"] = {
            "int4_bytes": held, "float_bytes": per_step - held, "bytes_per_step": per_step,
            "bound_tokens_per_s": copy_bw / per_step,
            "fraction_step": per_step / statistics.median(s[f"{name}_step"]) / copy_bw,
            "fraction_generate": out[name]["tokens_per_s"] * per_step / copy_bw,
            "fraction_paired": statistics.median(per_step / x / bw for x, bw in zip(s[f"{name}_step"], rep_bw))}
    out["int4_over_bf16"] = median_ratio(speed["int4"], speed["bf16"])
    out["step_int4_over_bf16"] = median_ratio(s["bf16_step"], s["int4_step"])
    del models["bf16"], runs  # freed before transformers loads
    out |= transformers_part(int4_dir, models["int4"], prompt, tokens, reps, use_transformers, interleaved, say)
    return out


def int4_kernels(model: Any) -> list[str]:
    """The speed layer's decisions for the int4 layers: "int4" (torch's kernel) or "dequantize" (none fits)."""
    return sorted({c.kernels[0] for c in kernels_of(model) if c.dtype.startswith("int4")})


def verify_step(model: Any, prompt: list[int]) -> Callable[[], Any]:
    """A verify of VERIFY drafts (VERIFY + 1 rows) after the prompt, at a fixed position, as our_decode_step's."""
    cache, _ = prefilled(model, prompt, VERIFY + 1)
    ids, at = torch.tensor([prompt[-1:] * (VERIFY + 1)]), torch.tensor([len(prompt)])  # (1, K+1), (1,)
    return torch.inference_mode()(lambda: model.run(ids, cache, at))


def load_tf_int4(int4_dir: Path) -> Any:
    """transformers' model of an int4 file as `from_pretrained` gives it, after the first forward that decompresses
    it (compressed-tensors' bars and warnings on stderr are dropped), or why there is none."""
    try:
        import compressed_tensors  # noqa: F401 (transformers reads the file's scheme with it)
        import transformers
        from transformers import Gemma4ForCausalLM
    except ImportError as e:
        return f"not installed ({e})"
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    with contextlib.redirect_stderr(io.StringIO()), torch.inference_mode():
        model = Gemma4ForCausalLM.from_pretrained(int4_dir, dtype=BF16).eval()
        model(torch.tensor([[2]]))
    return model


def transformers_part(int4_dir: Path, ours: Any, prompt: list[int], tokens: int, reps: int, use_transformers: bool,
                      interleaved: Callable, say: Callable[..., None]) -> dict[str, Any]:
    tf = load_tf_int4(int4_dir) if use_transformers else "skipped (--no-transformers)"
    if isinstance(tf, str):
        return {"transformers": tf, "ours_over_tf": None}
    import transformers
    say(f"int4: timing ours and transformers {transformers.__version__} on the int4 file ({reps} reps)")
    runs = {"ours": lambda: greedy_generate(ours, prompt, tokens),
            "tf": lambda: tf_generate(tf, None, prompt, tokens, 1)[0]}
    s, outputs = interleaved(runs, reps, warm_up=runs)
    speed = {name: [tokens / x for x in s[name]] for name in runs}
    return {"transformers": f"{transformers.__version__}, compressed-tensors, decompressed to bfloat16",
            "tf_tokens_per_s": statistics.median(speed["tf"]), "ours_tf_run_tokens_per_s":
            statistics.median(speed["ours"]), "ours_over_tf": median_ratio(speed["ours"], speed["tf"]),
            "ours_equal_tf": outputs["ours"][0] == outputs["tf"][0], "ours_tf_common_prefix": next(
                (i for i, (a, b) in enumerate(zip(outputs["ours"][0], outputs["tf"][0])) if a != b), tokens)}


# ---------------------------------------------------------------- the demo pair: speculative on int4

def demo_part(target_dir: Path, assistant_dir: Path, prompt: list[int], tokens: int, reps: int, k: int,
              interleaved: Callable) -> dict[str, Any]:
    """In float32 (the commands' dtype on a CPU) and bfloat16 (the releases'), the target as it is ("float") and
    quantized at load ("int4"), each with its own drafter, all eight runs in turns."""
    acceptance: dict[str, float] = {}
    runs: dict[str, Callable[[], list[int]]] = {}
    kernels: dict[str, list[str]] = {}
    for dtype in DEMO_DTYPES:
        for name, quantize_as in (("float", None), ("int4", "int4")):
            key = f"{dtype} {name}"
            target = load_target(target_dir, getattr(torch, dtype), fast=True, quantize=quantize_as)
            drafter = load_drafter(assistant_dir, getattr(torch, dtype), fast=True, target=target)
            if quantize_as:
                kernels[dtype] = int4_kernels(target)

            def spec(key: str = key, target: Any = target, drafter: Any = drafter) -> list[int]:
                result = speculative_generate(target, drafter, prompt, tokens, DraftLength(k))
                acceptance[key] = result.stats.acceptance_rate
                return result.tokens

            runs |= {f"{key} plain": lambda target=target: greedy_generate(target, prompt, tokens), f"{key} spec": spec}
    s, outputs = interleaved(runs, reps, warm_up=runs)
    speed = {name: [tokens / x for x in secs] for name, secs in s.items()}
    out: dict[str, Any] = {"target": str(target_dir), "assistant": str(assistant_dir), "prompt_tokens": len(prompt),
                           "new_tokens": tokens, "reps": reps, "k": k}
    for dtype in DEMO_DTYPES:
        up = {n: [a / b for a, b in zip(speed[f"{dtype} {n} spec"], speed[f"{dtype} {n} plain"])] for n in ("float", "int4")}
        out[dtype] = {
            "int4_kernels": kernels[dtype], "speedup": {n: statistics.median(v) for n, v in up.items()},
            "int4_speedup_over_float": median_ratio(up["int4"], up["float"]),
            **{n: {"plain_tokens_per_s": statistics.median(speed[f"{dtype} {n} plain"]),
                   "spec_tokens_per_s": statistics.median(speed[f"{dtype} {n} spec"]),
                   "acceptance_rate": acceptance[f"{dtype} {n}"],
                   "identical": all(o == outputs[f"{dtype} {n} plain"][0] for o in
                                    outputs[f"{dtype} {n} plain"] + outputs[f"{dtype} {n} spec"])}
               for n in ("float", "int4")}}
    return out


# ---------------------------------------------------------------- 31B: resident memory, a fresh process each

def meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes."""
    lines = Path("/proc/meminfo").read_text().splitlines()
    return {line.split(":")[0]: int(line.split()[1]) * 1024 for line in lines if line.split()[-1] == "kB"}


@torch.inference_mode()
def timed_greedy(model: Any, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """greedy_generate's loop (gemma4/generate.py) with the seconds of every forward: the prefill, then the steps."""
    cache = new_cache(model, prompt, n)
    ids, position, tokens, seconds = prompt, 0, [], []
    while len(tokens) < n:
        start = time.perf_counter()
        out = model.run(torch.tensor([ids]), cache, start_pos=torch.tensor([position]), num_logits=1)
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
            child = subprocess.run([sys.executable, "-m", "bench.int4", str(model_dir.resolve()), str(int(fast)),
                                    str(tokens), str(threads)], capture_output=True, text=True, cwd=SCRIPTS)
            lines = child.stdout.strip().splitlines()
            out["runs"][name] = json.loads(lines[-1]) if lines else {
                "stopped": f"exit status {child.returncode}: {(child.stderr.strip().splitlines() or [''])[-1]}"}
    finally:
        shutil.rmtree(where, ignore_errors=True)
    return out


# ---------------------------------------------------------------- the section, its goals and its table

def int4_section(root: Path, target_dir: Path, assistant_dir: Path, demo_prompt: list[int], k: int, tokens: int,
                 reps: int, e2b_tokens: int, e2b_reps: int, copy_mib: int, use_transformers: bool, small: bool,
                 with_31b: bool, big_tokens: int, asked: int | None, interleaved: Callable,
                 say: Callable[..., None]) -> dict[str, Any]:
    """Each part on the threads of the one thread rule for the model it measures (`threads` says which). The 31B
    part runs first, while this process holds nothing: its children need all the memory there is."""
    out: dict[str, Any] = {"small": small, "cpu": cpu(), "threads": {}, "seconds": {}}
    parts: list[tuple[str, int, Callable[[], dict[str, Any]]]] = []
    if with_31b or small:
        parts.append(("31b", config_31b(small)["hidden_size"],
                      lambda: big_part(root, small, big_tokens, out["threads"]["31b"], say)))
    parts.append(("e2b", (small_e2b() if small else e2b_configs(FULL_VOCAB))[0]["hidden_size"],
                  lambda: e2b_part(root, small, e2b_tokens, e2b_reps, copy_mib, use_transformers, interleaved, say)))
    if (target_dir / "config.json").is_file():
        parts.append(("demo", load_config(target_dir).hidden_size,
                      lambda: demo_part(target_dir, assistant_dir, demo_prompt, tokens, reps, k, interleaved)))
    for name, hidden, run in parts:
        n = out["threads"][name] = section_threads(hidden, asked)
        say(f"int4: {name} ({n} torch thread{'s' if n != 1 else ''})")
        start = time.perf_counter()
        out[name] = run()
        out["seconds"][name] = time.perf_counter() - start
        gc.collect()  # the part's models: transformers' hold reference cycles, which would live on into the next
    return out


def dig(r: dict[str, Any], path: tuple[str, ...]) -> float | None:
    for key in path:
        r = r.get(key) if isinstance(r, dict) else None
    return r


def int4_goals(result: dict[str, Any]) -> list[dict[str, Any]]:
    r = result.get("int4")
    if not r:
        return []
    out = []
    for name, path, limit in GOALS:
        value = dig(r, path)
        out.append({"goal": f"int4: {name}", "value": value, "limit": limit, "at_least": True,
                    "met": None if value is None else value >= limit})
    return out


def gb(x: float | None) -> str:
    return "n/a" if x is None else f"{x / 1e9:.2f}"


def int4_table(result: dict[str, Any]) -> str:
    r = result.get("int4")
    if not r:
        return ""
    c = r["cpu"]
    lines = ["", f"== int4: w4a16 targets (the release layout), bfloat16 activations{' (small)' if r['small'] else ''}",
             f"   cpu: {c['model'] or 'n/a'}; flags {' '.join(c['flags']) or 'none of those listed'}; torch threads "
             + ", ".join(f"{name} {n}" for name, n in r["threads"].items())]
    e = r.get("e2b")
    if e:
        lines += [f"   E2B dimensions, vocabulary {read_vocab(e['target'])}: {e['new_tokens']} new tokens, {e['reps']} "
                  f"timed reps; int4 kernels: {', '.join(e['int4_kernels'])}",
                  f"   {'':<30}{'tokens/s':>10}{'step ms':>9}{'GB a step':>11}{'bound tok/s':>13}{'step/bound':>12}"
                  f"{'paired':>8}{'verify/step':>13}"]
        for name in ("int4", "bf16"):
            m, b = e[name], e[f"{name}_bound"]
            lines.append(f"   {'ours, plain greedy, ' + name:<30}{m['tokens_per_s']:>10.2f}{m['step_s'] * 1e3:>9.1f}"
                         f"{gb(b['bytes_per_step']):>11}{b['bound_tokens_per_s']:>13.2f}{b['fraction_step']:>12.2f}"
                         f"{b['fraction_paired']:>8.2f}{m['verify_over_step']:>13.2f}")
        b = e["int4_bound"]
        lines += [f"   int4 / bf16: plain tokens/s {e['int4_over_bf16']:.2f}x, decode step {e['step_int4_over_bf16']:.2f}x",
                  f"   int4 bytes a step: {gb(b['int4_bytes'])} GB packed words and scales (as the speed layer holds "
                  f"them) + {gb(b['float_bytes'])} GB float (tied head, norms, a PLE row); copy "
                  f"{e['copy_bytes_per_s'] / 1e9:.1f} GB/s (read + write, {e['copy_mib']} MiB, best), read "
                  f"{e['read_bytes_per_s'] / 1e9:.1f} GB/s; generate / bound {b['fraction_generate']:.2f}"]
        if e["ours_over_tf"] is None:
            lines.append(f"   transformers: {e['transformers']}")
        else:
            lines.append(f"   transformers ({e['transformers']}) on the int4 file: {e['tf_tokens_per_s']:.2f} tokens/s, "
                         f"ours {e['ours_tf_run_tokens_per_s']:.2f}: ours / transformers {e['ours_over_tf']:.2f}x; "
                         f"the same tokens: {'yes' if e['ours_equal_tf'] else 'the first ' + str(e['ours_tf_common_prefix'])}")
    d = r.get("demo")
    if d:
        lines += [f"   demo pair, {d['new_tokens']} new tokens, K = {d['k']}, {d['reps']} reps; int4: the target quantized "
                  f"at load", f"   {'target':<19}{'kernels':>9}{'plain tok/s':>13}{'spec tok/s':>12}{'spec/plain':>12}"
                  f"{'acceptance':>12}{'spec == plain':>15}"]
        for dtype in DEMO_DTYPES:
            for n in ("float", "int4"):
                x = d[dtype][n]
                kernels = ",".join(d[dtype]["int4_kernels"]) if n == "int4" else "-"
                lines.append(f"   {dtype + ' ' + n:<19}{kernels:>9}{x['plain_tokens_per_s']:>13.1f}"
                             f"{x['spec_tokens_per_s']:>12.1f}{d[dtype]['speedup'][n]:>11.2f}x"
                             f"{x['acceptance_rate']:>12.3f}{'yes' if x['identical'] else 'NO':>15}")
            lines.append(f"   {dtype}: int4 speedup / float speedup {d[dtype]['int4_speedup_over_float']:.2f}")
    big = r.get("31b")
    if big:
        lines.append(f"   31B geometry ({big['layers']} layers, hidden {big['hidden']}), random int4 file "
                     f"{gb(big['file_bytes'])} GB, this machine {big['mem_total_bytes'] / 2**30:.1f} GiB"
                     + (f": skipped, {big['skipped']}" if big.get("skipped") else f", written in "
                        f"{big.get('write_s', 0):.0f} s, deleted after"))
        for name, run in big["runs"].items():
            if run.get("stopped"):
                at = run.get("at_stop") or {}
                lines.append(f"   {name:<9} stopped: {run['stopped']}"
                             + (f" (resident {at['VmRSS'] / 1024:.1f} GiB)" if at else ""))
                continue
            steps = run["forward_s"][1:]
            rate = f"{len(steps) / sum(steps):.3f} tokens/s" if steps else "no step"
            lines.append(f"   {name:<9} resident after load {run['after_load']['VmRSS'] / 1024:.1f} GiB (private "
                         f"{run['after_load']['RssAnon'] / 1024:.1f}), after decoding {run['after_decode']['VmRSS'] / 1024:.1f} "
                         f"GiB, peak {run['after_decode']['VmHWM'] / 1024:.1f} GiB; load {run['load_s']:.0f} s, prefill "
                         f"{run['forward_s'][0]:.1f} s, decode {rate}")
    return "\n".join(lines)


def read_vocab(target: str) -> int:
    return int(read_json(Path(target) / "config.json")["vocab_size"])


if __name__ == "__main__":  # big_part's child: python -m bench.int4 MODEL_DIR FAST TOKENS THREADS
    print(json.dumps(big_child(Path(sys.argv[1]), bool(int(sys.argv[2])), int(sys.argv[3]), int(sys.argv[4]))))
