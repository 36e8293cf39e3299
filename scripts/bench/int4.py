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
- `31b` (--int4-31b, disk and time in benchmark.md; bench/int4_31b.py): a random int4 file of 31B's geometry written directly in the
  release layout (random words, scales for weights of rms I^-1/2, a bf16 embedding; 60 layers, hidden 5376,
  ≈ 19 GB), loaded with fast=False and fast=True, each in a fresh process: resident memory after loading and
  after decoding a few tokens, the peak, seconds a forward; the files are deleted after. A thread stops a child
  whose load leaves less than 1.5 GiB available (`MIN_AVAILABLE`), and says so, rather than wait for the kernel.
The files in the release layout are written by bench/int4_files.py. Ratios are medians of per-repetition ratios (bench/timing.py `interleaved`), as everywhere in the benchmark.
"""

import contextlib
import gc
import io
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.audio import cpu
from bench.int4_31b import big_part
from bench.int4_files import BF16, FULL_VOCAB, config_31b, quantized_copy, small_e2b
from bench.memory import decode_bytes
from bench.random_pair import (
    e2b_configs,
    random_prompt,
    write_pair,
)
from bench.report import at_least, fmt
from bench.timing import median_ratio, our_decode_step, prefilled, section_threads
from bench.transformers_baseline import tf_generate
from gemma4 import greedy_generate, load_config, load_target
from gemma4.config_file import read_json
from gemma4.fast import kernels_of, products
from gemma4.fast.int4 import Int4Product
from mtp import DraftLength, load_drafter, speculative_generate
from gemma4.engine.forward import forward_rows

GOALS = (("e2b: int4 / bf16 plain tokens/s", ("e2b", "int4_over_bf16"), 2.0),
         ("e2b: int4 decode step / bandwidth bound", ("e2b", "int4_bound", "fraction_step"), 0.6),
         ("e2b: ours int4 / transformers int4 plain tokens/s", ("e2b", "ours_over_tf"), 3.0),
         ("demo float32: speculative/plain, int4 target over float", ("demo", "float32", "int4_speedup_over_float"),
          1.0),
         ("demo bfloat16: speculative/plain, int4 target over float", ("demo", "bfloat16", "int4_speedup_over_float"),
          1.0))
DEMO_DTYPES = ("float32", "bfloat16")
VERIFY = 4  # drafts a timed verify checks: K + 1 = 5 rows, the demo assistant's K


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
    return torch.inference_mode()(lambda: forward_rows(model, ids, cache, at))


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


def int4_goals(result: dict[str, Any]) -> list[dict[str, Any]]:
    r = result.get("int4")
    if not r:
        return []
    return at_least(r, GOALS, "int4: ")


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
                         f"{fmt(b['bytes_per_step'] / 1e9):>11}{b['bound_tokens_per_s']:>13.2f}{b['fraction_step']:>12.2f}"
                         f"{b['fraction_paired']:>8.2f}{m['verify_over_step']:>13.2f}")
        b = e["int4_bound"]
        lines += [f"   int4 / bf16: plain tokens/s {e['int4_over_bf16']:.2f}x, decode step {e['step_int4_over_bf16']:.2f}x",
                  f"   int4 bytes a step: {fmt(b['int4_bytes'] / 1e9)} GB packed words and scales (as the speed layer holds "
                  f"them) + {fmt(b['float_bytes'] / 1e9)} GB float (tied head, norms, a PLE row); copy "
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
                     f"{fmt(big['file_bytes'] / 1e9)} GB, this machine {big['mem_total_bytes'] / 2**30:.1f} GiB"
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
