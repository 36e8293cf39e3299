"""Speed and memory, measured side by side with `transformers` and against the hardware, in one run.

    python scripts/benchmark.py                          # every section: 8-20 minutes on 2 cores
    python scripts/benchmark.py --only demo --tokens 64  # one section; --json prints one object instead

Sections (`--only a,b`):
- `demo`: the demo pair (or `--target/--assistant`). Our plain and speculative greedy decoding, our plain
  decoding of the pair loaded with `fast=False` (the textbook modules), and `transformers`' plain and assisted `generate` with the
  same assistant: tokens/s, the ratios, whether all produced the same tokens, acceptance rates; ATen calls
  of a decode step and of a draft step; the loaders' kernel
  decisions, one per (shape, dtype), and what they cost the load.
- `bench`: the same on a random mid-size pair (16 layers of width 512, MLP 2048), written once under
  `--e2b-dir`: weights of about a million elements, where whether packing pays depends most on the CPU.
- `e2b`: the same on a random pair at the real E2B dimensions (the vocabulary cut to 32768 so that
  float32 fits in memory; written once under `--e2b-dir`, memory-mapped by both implementations). A
  random drafter is almost never right: its speculative rows show the cost of drafting for nothing.
- `costs`: at E2B dimensions, a draft round of K steps and a (K+1)-token verify relative to a 1-token
  decode, K = 1..8, and the speedup they imply at acceptance rates 0.5 / 0.7 / 0.9 (i.i.d. acceptance
  α: a round of K drafts commits (1 - α^(K+1)) / (1 - α) tokens on average; Leviathan et al. 2023).
- `bandwidth`: decode tokens/s at E2B dimensions against the bound: weight bytes per decode step over the
  bandwidth of a large copy (read + written; the best of copies taken in turns with the decode steps: a
  copy slowed by a neighbour would flatter the ratio). Ours and transformers' plain generate against it
  (bound / transformers' tokens/s: the most any float32 decoder could gain here), and the largest
  product for 1, 2, 5, 9 rows, plain and packed: a verify's cost in the products alone.
- `bf16`: `costs` and `bandwidth` again in bfloat16, on a random pair with E2B's full 262144-token
  vocabulary (≈ 9.5 GB written once; memory-mapped, only the rows a step reads of its PLE table resident).
- `memory`: peak resident memory of `load_target` (packing included) in a fresh process, during loading
  and after a first forward: the bfloat16 E2B-sized checkpoint loaded as bfloat16 (memory-mapped) and as
  float32 (every weight cast), and the float32 one as float32.
- `batch`, `experts` (scripts/bench/batch.py): the demo pair decoding B = 1, 2, 4, 8 prompts as one
  batch against the same prompts one after another; unique MoE experts per forward against uniform routing.
- `sampling` (scripts/bench/sampling.py): one sampled row at V = 4,096 and 262,144, the fast sampler and the textbook one, and
  E2B-dimension bfloat16 decoding sampled against greedy (`--sampling-vocab`; `--e2b-tokens 0`: rows only).

Timing: a shared machine is noisy, so every number comes from this one run. Each repetition runs every
method once, the order reversed on every other repetition, after one untimed warm-up; tokens/s is taken
from the median time, and a ratio is the median of the per-repetition ratios (neighbours in time).
transformers runs as `scripts/bench/transformers_baseline.py` calls it; without it, its columns say why.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.batch import DEMO_PROMPTS, batch_goal, batch_section, batch_table, experts_section
from bench.schedule import schedule_goals, schedule_lines, schedule_section
from bench.memory import decode_bytes, memory_section
from bench.random_pair import bench_configs, e2b_configs, random_prompt, text_prompt, write_pair
from bench.report import goals, table
from bench.sampling import sampling_goals, sampling_section, sampling_table
from bench.transformers_baseline import load_transformers, tf_decode_step, tf_generate
from gemma4 import KVCache, greedy_generate, load_target
from gemma4.config_file import read_json
from gemma4.model import Gemma4Model, ModelOutput
from gemma4.fast import Product, kernels_of
from gemma4.fast.kernels import packable
from gemma4.fast.apply import groups
from mtp import DraftLength, Drafter, load_drafter, speculative_generate
from mtp.speculative import target_kv

SECTIONS = ("demo", "bench", "e2b", "costs", "bandwidth", "bf16", "memory", "batch", "experts", "sampling", "schedule")
DEMO = Path(__file__).resolve().parent / "demo"
DEMO_PROMPT = "import os\n\n\ndef read_config(path):\n    "
E2B_VOCAB = 32768
FULL_VOCAB = 262144  # the bf16 section's: in bfloat16 the real vocabulary fits
ALPHAS = (0.5, 0.7, 0.9)
MAX_K = 8


def say(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


def median_ratio(a: list[float], b: list[float]) -> float:
    """Median over repetitions of a[i] / b[i]: each ratio compares runs that were neighbours in time."""
    return statistics.median(x / y for x, y in zip(a, b))


def interleaved(runs: dict[str, Callable[[], Any]], reps: int, warm_up: dict[str, Callable[[], Any]]
                ) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Seconds of every run per repetition (order reversed every other repetition), and each one's output."""
    for run in warm_up.values():
        run()
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    outputs: dict[str, Any] = {}
    for rep in range(reps):
        for name in (list(runs) if rep % 2 == 0 else list(reversed(runs))):
            start = time.perf_counter()
            outputs.setdefault(name, []).append(runs[name]())
            seconds[name].append(time.perf_counter() - start)
    return seconds, outputs


def aten_calls(prepare: Callable[[], Callable[[], Any]]) -> int:
    """ATen operator calls, nested ones included, in one decode step. `prepare()` prefills a new cache and
    returns the step; one step runs unprofiled first. A small model's decode step is bound by the cost
    per call, not by arithmetic: its time follows this count."""
    from torch.profiler import ProfilerActivity, profile

    os.environ.setdefault("KINETO_LOG_LEVEL", "99")  # the profiler would print its own start/stop lines
    prepare()()
    step = prepare()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    return sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))


def prefilled(target: Gemma4Model, prompt: list[int], room: int) -> tuple[KVCache, ModelOutput]:
    """A new cache holding the prompt's K/V with `room` more positions, and the prefill's output."""
    cache = KVCache(target.config, len(prompt) + room, dtype=target.embed_tokens.weight.dtype)
    with torch.inference_mode():
        out = target.run(torch.tensor([prompt]), cache, 0, num_logits=1)
    cache.length = len(prompt)  # every timed forward writes at len(prompt).. and leaves the length there
    return cache, out


def our_decode_step(target: Gemma4Model, prompt: list[int]) -> Callable[[], Any]:
    """The prompt prefilled into a new cache, and the cached 1-token forward that follows it, as every
    step of greedy_generate runs it."""
    cache, _ = prefilled(target, prompt, 1)
    return torch.inference_mode()(lambda: target.run(torch.tensor([prompt[-1:]]), cache, len(prompt)))


# ---------------------------------------------------------------- sections

def loaded(target_dir: Path, assistant_dir: Path, fast: bool = True) -> tuple[Gemma4Model, Drafter, float]:
    """The pair as the loaders give it, and the seconds loading took (the packing decisions included)."""
    start = time.perf_counter()
    target, drafter = load_target(target_dir, fast=fast), load_drafter(assistant_dir, fast=fast)
    return target, drafter, time.perf_counter() - start


def packing_report(target: Gemma4Model, drafter: Drafter, load_s: float, unpacked_load_s: float | None
                   ) -> dict[str, Any]:
    """The loaders' kernel decisions (gemma4/fast/), one per (shape, dtype), and what they cost the load."""
    mine, theirs = kernels_of(target), kernels_of(drafter)
    return {"target": [c._asdict() for c in mine], "assistant": [c._asdict() for c in theirs],
            "decision_s": sum(c.cost_s for c in mine + theirs), "load_s": load_s,
            "load_s_pack_false": unpacked_load_s}


def pair_section(target_dir: Path, assistant_dir: Path, prompt: list[int], tokens: int, reps: int, k: int,
                 use_transformers: bool, warm_tokens: int, against_unpacked: bool
                 ) -> tuple[dict[str, Any], Gemma4Model, Drafter]:
    """Our plain and speculative decoding against transformers' plain and assisted generate; with
    `against_unpacked`, our plain decoding of the pair loaded with `fast=False` too."""
    target, drafter, load_s = loaded(target_dir, assistant_dir)
    acceptance: dict[str, float] = {}

    def ours_spec(n: int) -> list[int]:
        result = speculative_generate(target, drafter, prompt, n, DraftLength(k))
        acceptance["ours_spec"] = result.stats.acceptance_rate
        return result.tokens

    runs: dict[str, Callable[[int], list[int]]] = {
        "ours_plain": lambda n: greedy_generate(target, prompt, n), "ours_spec": ours_spec}
    unpacked_load_s = None
    if against_unpacked:
        unpacked, _, unpacked_load_s = loaded(target_dir, assistant_dir, fast=False)
        runs["ours_plain_pack_false"] = lambda n: greedy_generate(unpacked, prompt, n)
    tf = load_transformers(target_dir, assistant_dir) if use_transformers else "skipped (--no-transformers)"
    if not isinstance(tf, str):
        tf_target, tf_assistant, _ = tf

        def tf_assisted(n: int) -> list[int]:
            out, acceptance["tf_assisted"] = tf_generate(tf_target, tf_assistant, prompt, n, k)
            return out

        runs |= {"tf_plain": lambda n: tf_generate(tf_target, None, prompt, n, k)[0], "tf_assisted": tf_assisted}
    seconds, outputs = interleaved({name: (lambda r=r: r(tokens)) for name, r in runs.items()}, reps,
                                   warm_up={name: (lambda r=r: r(warm_tokens)) for name, r in runs.items()})
    methods = {name: {"tokens_per_s": tokens / statistics.median(s), "seconds": s,
                      "acceptance_rate": acceptance.get(name)} for name, s in seconds.items()}
    pairs = [("ours_plain", "tf_plain"), ("ours_spec", "tf_assisted"), ("ours_spec", "ours_plain"),
             ("tf_assisted", "tf_plain"), ("ours_plain", "ours_plain_pack_false")]
    speed = {name: [tokens / s for s in secs] for name, secs in seconds.items()}
    ratios = {f"{a}/{b}": median_ratio(speed[a], speed[b]) for a, b in pairs if a in speed and b in speed}
    every = [tuple(out) for outs in outputs.values() for out in outs]
    calls = {"ours": aten_calls(lambda: our_decode_step(target, prompt)),
             "ours_draft_step": draft_step_calls(target, drafter, prompt)}
    if not isinstance(tf, str):
        calls["tf"] = aten_calls(lambda: tf_decode_step(tf[0], prompt))
    return {
        "target": str(target_dir), "assistant": str(assistant_dir), "prompt_tokens": len(prompt),
        "new_tokens": tokens, "reps": reps, "k": k, "transformers": tf if isinstance(tf, str) else tf[2],
        "methods": methods, "ratios": ratios, "identical": len(set(every)) == 1, "aten_calls_per_decode_step": calls,
        "packing": packing_report(target, drafter, load_s, unpacked_load_s),
    }, target, drafter


def draft_step_calls(target: Gemma4Model, drafter: Drafter, prompt: list[int]) -> float:
    """ATen calls of one draft step: a round of 3 steps less a round of 1, halved (a round's own setup,
    its RoPE tables and masks, cancels out)."""
    p = len(prompt)
    cache, out = prefilled(target, prompt, 1)
    token, hidden, kv = int(out.logits[0, -1].argmax()), out.hidden[0, -1], target_kv(cache, target, p)
    rounds = {k: aten_calls(lambda k=k: lambda: drafter.draft(target, token, hidden, p, kv, k)) for k in (1, 3)}
    return (rounds[3] - rounds[1]) / 2


@torch.inference_mode()
def cost_section(target: Gemma4Model, drafter: Drafter, prompt: list[int], reps: int) -> dict[str, Any]:
    """Seconds of a 1-token decode, (K+1)-token verifies and K-step draft rounds at the same position."""
    p = len(prompt)
    cache, out = prefilled(target, prompt, MAX_K + 1)
    token, hidden, kv = int(out.logits[0, -1].argmax()), out.hidden[0, -1], target_kv(cache, target, p)
    runs: dict[str, Callable[[], Any]] = {"decode": lambda: target.run(torch.tensor([[token]]), cache, p)}
    for k in range(1, MAX_K + 1):
        runs[f"verify{k + 1}"] = lambda k=k: target.run(torch.tensor([[token] * (k + 1)]), cache, p)
        runs[f"draft{k}"] = lambda k=k: drafter.draft(target, token, hidden, p, kv, k)
    s, _ = interleaved(runs, reps, warm_up=runs)
    verify = {k: median_ratio(s[f"verify{k + 1}"], s["decode"]) for k in range(1, MAX_K + 1)}  # K drafts: K+1 rows
    draft = {k: median_ratio(s[f"draft{k}"], s["decode"]) for k in range(1, MAX_K + 1)}
    implied = {}
    for alpha in ALPHAS:
        speedup = {k: (1 - alpha ** (k + 1)) / (1 - alpha) / (draft[k] + verify[k]) for k in verify}
        best = max(speedup, key=speedup.get)
        implied[str(alpha)] = {"best_k": best, "speedup": speedup[best], "by_k": speedup}
    return {"context": p, "decode_s": statistics.median(s["decode"]), "draft_step_over_decode": draft[1],
            "draft_round_over_decode": draft, "verify_over_decode": verify, "implied_speedup": implied}


ROWS = (1, 2, 5, 9)  # a decode step multiplies 1 row, a verify of K drafts K + 1


@torch.inference_mode()
def bandwidth_section(target: Gemma4Model, prompt: list[int], reps: int, mib: int,
                      plain: dict[str, float | None]) -> dict[str, Any]:
    """A decode step against `dst.copy_(src)` on `mib` MiB (bytes read + written), measured in turns;
    and how fast the largest product (a stack of q/k/v or gate/up weights, or one weight) streams its weight
    when it multiplies 1, 2, 5 or 9 rows, plain and packed (where oneDNN can), whichever the loader chose.

    `plain` holds the plain-generate tokens/s of the e2b section, ours and transformers': set against
    the bound, transformers' figure caps the speedup any float32 implementation can have over it here.
    """
    p = len(prompt)
    cache, _ = prefilled(target, prompt, 1)
    src = torch.ones(mib * 2**20 // 4)
    dst = torch.empty_like(src)
    dtype = target.embed_tokens.weight.dtype
    keys = max((keys for _, keys in groups(target)), key=lambda ks: sum(target.get_parameter(k).numel() for k in ks))
    weight = torch.cat([target.get_parameter(k).to(dtype) for k in keys])  # (O, I), as the product multiplies it
    runs: dict[str, Callable[[], Any]] = {
        "decode": lambda: target.run(torch.tensor([[prompt[-1]]]), cache, p), "copy": lambda: dst.copy_(src)}
    ways = {"plain": Product(weight, False)} | ({"packed": Product(weight, True)} if packable(weight) else {})
    x = {m: torch.ones(1, m, weight.shape[1], dtype=dtype) for m in ROWS}
    for way, product in ways.items():
        runs |= {f"{way}{m}": lambda m=m, product=product: product(x[m]) for m in ROWS}
    s, _ = interleaved(runs, reps, warm_up=runs)
    per_token = decode_bytes(target)
    # The bound's bandwidth is the best copy: a copy that a neighbour slowed down would flatter the ratio.
    bandwidth = 2 * src.nbytes / min(s["copy"])
    bound = bandwidth / per_token
    weight_bytes = weight.numel() * weight.element_size()
    out = {"dtype": str(x[1].dtype).removeprefix("torch."), "copy_bytes_per_s": bandwidth, "copy_mib": mib,
           "bytes_per_token": per_token, "bound_tokens_per_s": bound,
           "decode_step_tokens_per_s": 1 / statistics.median(s["decode"]),
           "fraction_decode_step": 1 / statistics.median(s["decode"]) / bound,
           "fraction_best_decode_step": 1 / min(s["decode"]) / bound,
           "linear_weight_shape": list(weight.shape),
           "linear_bytes_per_s_by_rows": {way: {m: weight_bytes / statistics.median(s[f"{way}{m}"]) for m in ROWS}
                                          for way in ways},
           "linear_rows_slowdown": {way: {m: median_ratio(s[f"{way}{m}"], s[f"{way}1"]) for m in ROWS}
                                    for way in ways}}
    for name in ("ours_plain", "tf_plain"):
        tokens_per_s = plain.get(name)
        out[f"{name}_tokens_per_s"] = tokens_per_s
        out[f"fraction_{name}"] = None if tokens_per_s is None else tokens_per_s / bound
    # The bound is every implementation's: no float32 decoder here is faster than bound / transformers'.
    out["ceiling_over_tf_plain"] = None if plain.get("tf_plain") is None else bound / plain["tf_plain"]
    return out


# ---------------------------------------------------------------- command line

def main(*, sections: list[str], target_dir: Path, assistant_dir: Path, tokens: int, e2b_tokens: int, reps: int,
         e2b_reps: int, k: int | None, e2b_dir: Path, threads: int, copy_mib: int, use_transformers: bool,
         sampling_vocab: int = FULL_VOCAB) -> dict:
    torch.set_num_threads(threads)
    result: dict[str, Any] = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, {threads} torch threads, "
                                         f"torch {torch.__version__}, float32 unless stated"}
    if "demo" in sections:
        if (target_dir / "config.json").is_file():
            say(f"demo: {target_dir}")
            prompt = text_prompt(target_dir, DEMO_PROMPT, 24)
            result["demo"], *_ = pair_section(target_dir, assistant_dir, prompt, tokens, reps,
                                              k or assistant_k(assistant_dir), use_transformers, warm_tokens=tokens,
                                              against_unpacked=True)
        else:
            say(f"demo: skipped, {target_dir} has no checkpoint (train it, or pass --target/--assistant)")
    if "bench" in sections:
        say(f"bench: writing or reusing the random mid-size pair under {e2b_dir / 'bench'}")
        t_dir, a_dir = write_pair(e2b_dir / "bench", *bench_configs(), torch.float32)
        result["bench"], *_ = pair_section(t_dir, a_dir, random_prompt(t_dir, 24), tokens, reps,
                                           k or assistant_k(a_dir), use_transformers, warm_tokens=4,
                                           against_unpacked=True)
        result["bench"]["note"] = "random weights, 16 layers of width 512, MLP 2048, vocabulary 16384"
    e2b_target = e2b_drafter = None
    if {"e2b", "costs", "bandwidth"} & set(sections):
        say(f"e2b: writing or reusing the random E2B-dimension pair under {e2b_dir / 'float32'}")
        t_dir, a_dir = write_pair(e2b_dir / "float32", *e2b_configs(E2B_VOCAB), torch.float32)
        prompt = random_prompt(t_dir, 16)
        if "e2b" in sections:
            result["e2b"], e2b_target, e2b_drafter = pair_section(  # a short warm-up: it pages the weights in
                t_dir, a_dir, prompt, e2b_tokens, e2b_reps, k or assistant_k(a_dir), use_transformers, warm_tokens=2,
                against_unpacked=False)  # a second float32 E2B (≈ 9 GB) would not fit beside the first
            result["e2b"]["note"] = f"random weights, vocabulary cut from 262144 to {E2B_VOCAB}"
        else:
            e2b_target, e2b_drafter = load_target(t_dir), load_drafter(a_dir)
        if "costs" in sections:
            say("costs: decode, verify and draft at E2B dimensions")
            result["costs"] = cost_section(e2b_target, e2b_drafter, prompt, e2b_reps)
        if "bandwidth" in sections:
            say("bandwidth: decode steps and tensor copies in turns")
            methods = result.get("e2b", {}).get("methods", {})
            plain = {name: methods.get(name, {}).get("tokens_per_s") for name in ("ours_plain", "tf_plain")}
            result["bandwidth"] = bandwidth_section(e2b_target, prompt, reps, copy_mib, plain)  # a step: ≈ 0.4 s
        del e2b_target, e2b_drafter
    if "bf16" in sections:
        say(f"bf16: writing or reusing the full-vocabulary bfloat16 pair under {e2b_dir / 'bfloat16-full'}")
        t_dir, a_dir = write_pair(e2b_dir / "bfloat16-full", *e2b_configs(FULL_VOCAB), torch.bfloat16)
        target, drafter = load_target(t_dir, dtype=torch.bfloat16), load_drafter(a_dir, dtype=torch.bfloat16)
        prompt = random_prompt(t_dir, 16)
        result["bf16"] = {"costs": cost_section(target, drafter, prompt, e2b_reps),
                          "bandwidth": bandwidth_section(target, prompt, e2b_reps, copy_mib, {})}
        del target, drafter
    if "memory" in sections:
        say(f"memory: writing or reusing the E2B-dimension checkpoints under {e2b_dir}")
        t_dir, _ = write_pair(e2b_dir / "bfloat16", *e2b_configs(E2B_VOCAB), torch.bfloat16)
        result["memory"] = memory_section(t_dir, "bfloat16")  # the target: loaded as stored
        result["memory_float32"] = memory_section(t_dir, "float32")  # every weight cast, then packed
        t_dir, _ = write_pair(e2b_dir / "float32", *e2b_configs(E2B_VOCAB), torch.float32)
        result["memory_float32_file"] = memory_section(t_dir, "float32")  # views, then packed
    if "batch" in sections and (target_dir / "config.json").is_file():  # scripts/bench/batch.py
        say("batch: B = 1, 2, 4, 8 prompts as one batch and one after another")
        prompts = [text_prompt(target_dir, p, 8 + 3 * i) for i, p in enumerate(DEMO_PROMPTS)]
        result["batch"] = batch_section(load_target(target_dir), load_drafter(assistant_dir), prompts, tokens,
                                        min(reps, 3), k or assistant_k(assistant_dir), interleaved)
    if "experts" in sections:
        say("experts: unique experts per MoE layer, decode, verify and batches")
        result["experts"] = experts_section()
    if "sampling" in sections:  # scripts/bench/sampling.py
        say(f"sampling: sampled rows, and E2B-dimension bfloat16 decoding at V = {sampling_vocab}")
        pair_root = e2b_dir / ("bfloat16-full" if sampling_vocab == FULL_VOCAB else f"bfloat16-v{sampling_vocab}")
        result["sampling"] = sampling_section(pair_root, e2b_configs(sampling_vocab), e2b_tokens, e2b_reps, reps,
                                              interleaved)
    if "schedule" in sections and (target_dir / "config.json").is_file():  # scripts/bench/schedule.py
        say("schedule: plain, constant K = 1..8, heuristic and auto, on the demo pair and a random drafter")
        result["schedule"] = schedule_section(target_dir, assistant_dir, e2b_dir / "random_assistant",
                                              text_prompt(target_dir, DEMO_PROMPT, 24), tokens, max(reps, 3),
                                              k or assistant_k(assistant_dir), interleaved)
    result["goals"] = goals(result) + batch_goal(result) + sampling_goals(result) + schedule_goals(result)
    return result


def assistant_k(assistant_dir: Path) -> int:
    """`num_assistant_tokens` of the assistant's generation_config.json, else 4."""
    file = assistant_dir / "generation_config.json"
    return int(read_json(file).get("num_assistant_tokens", 4)) if file.is_file() else 4


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections, of: %(default)s")
    p.add_argument("--target", type=Path, default=DEMO / "target", help="the demo section's target")
    p.add_argument("--assistant", type=Path, default=DEMO / "assistant", help="the demo section's assistant")
    p.add_argument("--tokens", type=int, default=64, help="new tokens per run: demo, bench, batch")
    p.add_argument("--e2b-tokens", type=int, default=16, help="new tokens per run in the e2b section")
    p.add_argument("--reps", type=int, default=7, help="timed repetitions: demo, bench, bandwidth")
    p.add_argument("--e2b-reps", type=int, default=3, help="timed repetitions: e2b, costs, bf16")
    p.add_argument("-k", type=int, default=None, help="drafts per round; None: the assistant's "
                   "num_assistant_tokens, else 4")
    p.add_argument("--e2b-dir", type=Path, default=Path(tempfile.gettempdir()) / "gemma4-mtp-benchmark",
                   help="where the random E2B-dimension checkpoints are written once (≈ 9 + 4.5 + 9.5 GB)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads, for every method alike")
    p.add_argument("--copy-mib", type=int, default=1024, help="size of the bandwidth probe")
    p.add_argument("--no-transformers", action="store_true", help="leave the transformers columns empty")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--sampling-vocab", type=int, default=FULL_VOCAB,
                   help="the sampling section's E2B pair's vocabulary (writing the full one takes ≈ 20 GB of memory)")
    a = p.parse_args()
    only = [s.strip() for s in a.only.split(",") if s.strip()]
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown:
        p.error(f"unknown section {unknown[0]!r}; choose from {', '.join(SECTIONS)}")
    out = main(sections=only, target_dir=a.target, assistant_dir=a.assistant, tokens=a.tokens, e2b_tokens=a.e2b_tokens,
               reps=a.reps, e2b_reps=a.e2b_reps, k=a.k, e2b_dir=a.e2b_dir, threads=a.threads, copy_mib=a.copy_mib,
               use_transformers=not a.no_transformers, sampling_vocab=a.sampling_vocab)
    print(json.dumps(out, indent=1) if a.json else table(out) + batch_table(out) + sampling_table(out)
          + "\n".join(schedule_lines(out.get("schedule"))))
