"""Speed and memory, measured side by side with `transformers` and against the hardware, in one run.

    python scripts/benchmark.py                          # every section: 8-20 minutes on 2 cores, ≈ 23 GB written
    python scripts/benchmark.py --only demo --tokens 64  # one section; --json prints one object instead

Disk: a run of every section (no `--only`) writes about 23 GB of random checkpoints once, under `--e2b-dir` (the
temp directory's gemma4-mtp-benchmark), and reuses them in later runs; the run says how much it is about to write
before it writes. `--only demo` writes nothing.

Sections (`--only a,b`):
- `demo`: the demo pair (or `--target/--assistant`). Our plain and speculative greedy decoding, our plain
  decoding of the pair loaded with `fast=False` (the textbook modules), and `transformers`' plain and assisted
  `generate` with the same assistant: tokens/s, the ratios, whether all produced the same tokens, acceptance
  rates; ATen calls of a decode step and of a draft step; the loaders' kernel decisions, one per (shape, dtype),
  each with its reason.
- `bench`: the same on a random mid-size pair (16 layers of width 512, MLP 2048), written once under
  `--e2b-dir`: weights of about a million elements, around the size where the loaders' rule starts packing.
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
  product for 1, 2, 5, 9 rows, plain and packed: a verify's cost in the products alone. Also paired: each
  step against its own repetition's faster copy or read (bench/costs.py), where the bandwidth moves.
- `bf16`: `costs` and `bandwidth` again in bfloat16, on a random pair with E2B's full 262144-token
  vocabulary (≈ 9.5 GB written once; memory-mapped, only the rows a step reads of its PLE table resident).
- `memory`: peak resident memory of `load_target` (packing included) in a fresh process, during loading
  and after a first forward: the bfloat16 E2B-sized checkpoint loaded as bfloat16 (memory-mapped) and as
  float32 (every weight cast), and the float32 one as float32.
- `batch`, `experts` (scripts/bench/batch.py): the demo pair decoding B = 1, 2, 4, 8 prompts as one
  batch against the same prompts one after another; unique MoE experts per forward against uniform routing.
- `sampling` (scripts/bench/sampling.py): one sampled row at V = 4,096 and 262,144, the fast sampler and the
  textbook one, and E2B-dimension bfloat16 decoding sampled against greedy (`--sampling-vocab`; `--e2b-tokens 0`:
  rows only).
- `schedule` (scripts/bench/schedule.py): the demo pair and a never-right drafter, plain, `auto`, constant
  K = 1..8 and `heuristic`; `auto` against the best constant and against plain (those two run back to back at
  both ends of every repetition).
- `device` (scripts/bench/device.py), only when named: an accelerator checked end to end on random E2B,
  31B-layer, 26B-A4B-layer and 12B-layer pairs (`--device cuda`; `--device-small` shrinks it for a CPU). Not
  part of the default run.
- `context` (scripts/bench/context.py), only when named: K/V cache bytes of the released models at 8k-262k
  positions, every position kept against the sliding layers' rings; peak RSS of a prefill on random E2B- and
  31B-geometry targets, chunked against one forward; decode and speculative tokens/s after 1k-16k prompts
  (`--context-small` shrinks it for the tests; `--context-before-max` caps the one-forward prefills).
- `int4` (scripts/bench/int4.py), only when named: int4 targets in the layout of Google's w4a16 releases. At E2B's
  dimensions (the bf16 section's pair and its target rewritten once as a release stores it, ≈ 6.6 GB more), plain
  tokens/s int4 / bf16 and each decode step against its bandwidth bound, and ours against transformers +
  compressed-tensors on the int4 file; the demo pair quantized at load, speculative / plain against the float pair's;
  with `--int4-31b`, a random 31B-geometry int4 file (≈ 19 GB, written and deleted in the run) loaded with
  fast=False and fast=True in fresh processes: resident memory and seconds a forward (`--int4-small`: tiny sizes).
- `tp` (scripts/bench/parallel.py), only when named: tensor parallelism on gloo. The bench pair on `--tp-ranks` N
  ranks of one thread against one process of N threads, plain and speculative tokens/s; a random 31B-geometry
  bfloat16 file of two layers (≈ 4.9 GB, written and deleted in the run) loaded by 1, 2 and 4 ranks: resident
  memory a rank, and what it makes of the 60-layer 31B (`--tp-small`: tiny sizes).
- `peer` (scripts/bench/peer.py), only when named: llama.cpp, the CPU peer, against ours on the bf16 section's E2B
  pair: decode at 1 and 2 threads (llama.cpp's bf16, Q4_0 and Q4_0 with a bf16 head, converted by its own
  converter; ours bf16 and int4), a 4- and 5-token step against one, and ours int4 + MTP, in CPU time and wall
  time, alternating. llama.cpp comes from `--peer-llama DIR` or is downloaded (llama-cpp-python's source) and
  built once under `--e2b-dir` (bench/llama_cpp.py; about 20-30 minutes on 2 cores); without a compiler or the
  package the section is skipped in one line.
- `audio` (scripts/bench/audio.py), only when named: E2B's audio tower + embed_audio (random weights of the real
  geometry) encoding a 30 s clip (`--audio-seconds`), bfloat16 and float32: log-mel features and tower times,
  soft tokens per second and seconds of audio encoded per second, the peak resident memory of one encode in a
  fresh process beside the weights' bytes (`--audio-reps`; `--audio-small` shrinks it for the tests).
The demo section also counts host reads (scripts/bench/syncs.py) per plain decode step and speculative round.

Timing: a shared machine is noisy, so every number comes from this one run. Each repetition runs every
method once, the order reversed on every other repetition, after one untimed warm-up; tokens/s is taken
from the median time, and a ratio is the median of the per-repetition ratios (neighbours in time).
transformers runs as `scripts/bench/transformers_baseline.py` calls it; without it, its columns say why.

Threads: each section runs on the torch threads that the one thread rule of scripts/cli/threads.py gives the
model it measures, every method of it alike (ours and transformers'); `--threads N` sets every section's. The
table and the JSON (`threads`) say which count each section ran with.

Progress, on stderr: a line as each section starts; on a terminal (and not under --json) bars of its timed runs
and of the bytes of each checkpoint written (scripts/bench/show.py). stdout holds the table, or the JSON alone.

Goals: the project's targets for some figures (scripts/benchmark.md, Goals) come last in the table, for
developers, each figure beside its target; whether each is met is in the JSON's `goals` only.

`--device cuda`: the models load there and every time is read from CUDA events (scripts/bench/timing.py).
What cannot run there says so under "skipped": transformers (its baseline runs on the CPU), `memory` (the
host's resident memory; `device` measures CUDA memory) and oneDNN's packed products (CPU only).
"""

import argparse
import functools
import json
import os
import sys
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench import audio, context
from bench.audio import audio_section, audio_table
from bench.batch import DEMO_PROMPTS, MOE_HIDDEN, batch_goal, batch_section, batch_table, experts_section
from bench.context import context_goals, context_section, context_table
from bench.costs import MAX_K, bandwidth_section, cost_section  # noqa: F401 (MAX_K: the tests read it here)
from bench.device import DEVICE_DIR, device_section, device_table, small_e2b_configs
from bench.int4 import int4_goals, int4_section, int4_table
from bench.int4_files import small_e2b
from bench.parallel import tp_section, tp_table
from bench.peer import peer_goals, peer_section, peer_table
from bench.memory import memory_section
from bench.random_pair import (bench_configs, e2b_configs, is_written, pair_bytes, random_prompt, text_prompt,
                               write_pair)
from bench.report import goals, goals_table, table
from bench.sampling import sampling_goals, sampling_section, sampling_table
from bench.schedule import schedule_goals, schedule_lines, schedule_section
from bench.show import NOW, say
from bench.syncs import per_step
from bench.timing import (HOST, TORCH_THREADS, Clock, aten_calls, draft_step_calls, interleaved, median_ratio,
                          our_decode_step, section_threads)
from bench.transformers_baseline import load_transformers, tf_decode_step, tf_generate
from gemma4 import greedy_generate, load_config, load_target
from gemma4.config_file import read_json
from gemma4.fast import kernels_of
from gemma4.model import Gemma4Model
from mtp import DraftLength, Drafter, load_drafter, speculative_generate

SECTIONS = ("demo", "bench", "e2b", "costs", "bandwidth", "bf16", "memory", "batch", "experts", "sampling", "schedule")
ON_REQUEST = ("device", "context", "audio", "int4", "tp", "peer")  # run only when --only names them
DEMO = Path(__file__).resolve().parent / "demo"
DEMO_PROMPT = "import os\n\n\ndef read_config(path):\n    "
E2B_VOCAB = 32768
FULL_VOCAB = 262144  # the bf16 section's: in bfloat16 the real vocabulary fits
ON_CPU_ONLY = "runs on the CPU only"


def sampling_root(e2b_dir: Path, vocab: int) -> Path:
    return e2b_dir / ("bfloat16-full" if vocab == FULL_VOCAB else f"bfloat16-v{vocab}")


Plan = dict[Path, tuple[tuple[dict[str, Any], dict[str, Any]], torch.dtype]]


def checkpoints(sections: list[str] | tuple[str, ...], e2b_dir: Path, sampling_vocab: int = FULL_VOCAB,
                e2b_tokens: int = 1, context_small: bool = False, int4_small: bool = False) -> Plan:
    """The random pairs these sections write under --e2b-dir (each once: a later run reuses it): root -> (configs,
    dtype). The device section writes its own under --device-dir and says so; the schedule section's drafter is
    a copy of the demo's, small."""
    pairs: Plan = {}
    if "bench" in sections:
        pairs[e2b_dir / "bench"] = bench_configs(), torch.float32
    if {"e2b", "costs", "bandwidth", "memory"} & set(sections):
        pairs[e2b_dir / "float32"] = e2b_configs(E2B_VOCAB), torch.float32
    if "memory" in sections:
        pairs[e2b_dir / "bfloat16"] = e2b_configs(E2B_VOCAB), torch.bfloat16
    if "bf16" in sections or ("int4" in sections and not int4_small):
        pairs[e2b_dir / "bfloat16-full"] = e2b_configs(FULL_VOCAB), torch.bfloat16
    if "int4" in sections and int4_small:
        pairs[e2b_dir / "int4-small-bf16"] = small_e2b(), torch.bfloat16
    if "sampling" in sections and e2b_tokens:
        pairs[sampling_root(e2b_dir, sampling_vocab)] = e2b_configs(sampling_vocab), torch.bfloat16
    if "context" in sections:
        for name in context.SMALL_SIZES["prompts"]:
            root = e2b_dir / ("context-small" if context_small else "context") / name
            pairs[root] = context.geometry(name, context_small), torch.bfloat16
    return pairs


def plan_bytes(plan: Plan) -> int:
    return sum(pair_bytes(*configs, dtype) for configs, dtype in plan.values())


def disk_note(plan: Plan, e2b_dir: Path) -> str | None:
    """What the run is about to write, said before it writes: None when every pair is there already."""
    missing = {root: pair for root, pair in plan.items() if not is_written(root, *pair[0], pair[1])}
    if not missing:
        return None
    free = shutil.disk_usage(next(p for p in (e2b_dir, *e2b_dir.parents) if p.exists())).free
    size = plan_bytes(missing)
    return (f"disk: this run writes {size / 1e9:.1f} GB of random checkpoints under {e2b_dir} "
            f"({', '.join(root.relative_to(e2b_dir).as_posix() for root in missing)}; {free / 1e9:.0f} GB free "
            f"there), once: later runs reuse them. --e2b-dir puts them elsewhere"
            + (", --only leaves sections out: there is not room for them there." if size > free else "."))


# ---------------------------------------------------------------- sections

def loaded(target_dir: Path, assistant_dir: Path, fast: bool = True, device: str = "cpu"
           ) -> tuple[Gemma4Model, Drafter, float]:
    """The pair as the loaders give it, and the seconds loading took (packing included)."""
    start = time.perf_counter()
    target = load_target(target_dir, fast=fast, device=device)
    drafter = load_drafter(assistant_dir, fast=fast, device=device)
    return target, drafter, time.perf_counter() - start


def packing_report(target: Gemma4Model, drafter: Drafter, load_s: float, unpacked_load_s: float | None
                   ) -> dict[str, Any]:
    """The loaders' kernel decisions (gemma4/fast/kernels.py's rule), one per (shape, dtype), and the load's time."""
    return {"target": [c.as_dict() for c in kernels_of(target)],
            "assistant": [c.as_dict() for c in kernels_of(drafter)], "load_s": load_s,
            "load_s_pack_false": unpacked_load_s}


def pair_section(target_dir: Path, assistant_dir: Path, prompt: list[int], tokens: int, reps: int, k: int,
                 use_transformers: bool, warm_tokens: int, against_unpacked: bool, device: str = "cpu",
                 clock: Clock = HOST, count_reads: bool = False) -> tuple[dict[str, Any], Gemma4Model, Drafter]:
    """Our plain and speculative decoding against transformers' plain and assisted generate; with
    `against_unpacked`, our plain decoding of the pair loaded with `fast=False` too; with `count_reads`, the
    host reads per plain step and per speculative round (scripts/bench/syncs.py)."""
    theirs = use_transformers and device == "cpu"
    say(f"{NOW.section}: loading the pair{', and as transformers loads it' if theirs else ''}")
    target, drafter, load_s = loaded(target_dir, assistant_dir, device=device)
    acceptance: dict[str, float] = {}
    threads: set[int] = set()  # what torch uses in each timed run: every method alike

    def seen(run: Callable[[int], list[int]], n: int) -> list[int]:
        threads.add(torch.get_num_threads())
        return run(n)

    def ours_spec(n: int) -> list[int]:
        result = speculative_generate(target, drafter, prompt, n, DraftLength(k))
        acceptance["ours_spec"] = result.stats.acceptance_rate
        return result.tokens

    runs: dict[str, Callable[[int], list[int]]] = {
        "ours_plain": lambda n: greedy_generate(target, prompt, n), "ours_spec": ours_spec}
    unpacked_load_s = None
    if against_unpacked:
        unpacked, _, unpacked_load_s = loaded(target_dir, assistant_dir, fast=False, device=device)
        runs["ours_plain_pack_false"] = lambda n: greedy_generate(unpacked, prompt, n)
    tf = ("skipped (--no-transformers)" if not use_transformers else load_transformers(target_dir, assistant_dir)
          if device == "cpu" else f"skipped: the baseline {ON_CPU_ONLY} (--device {device})")
    if not isinstance(tf, str):
        tf_target, tf_assistant, _ = tf

        def tf_assisted(n: int) -> list[int]:
            out, acceptance["tf_assisted"] = tf_generate(tf_target, tf_assistant, prompt, n, k)
            return out

        runs |= {"tf_plain": lambda n: tf_generate(tf_target, None, prompt, n, k)[0], "tf_assisted": tf_assisted}
    say(f"{NOW.section}: timing {', '.join(runs)}: {reps} reps of {tokens} tokens")
    seconds, outputs = interleaved({name: (lambda r=r: seen(r, tokens)) for name, r in runs.items()}, reps,
                                   warm_up={name: (lambda r=r: r(warm_tokens)) for name, r in runs.items()},
                                   clock=clock)
    say(f"{NOW.section}: counting ATen calls{' and host reads' if count_reads else ''} of a step")
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
        "threads": threads.pop() if len(threads) == 1 else sorted(threads),
        "methods": methods, "ratios": ratios, "identical": len(set(every)) == 1, "aten_calls_per_decode_step": calls,
        "packing": packing_report(target, drafter, load_s, unpacked_load_s),
    } | ({"host_reads": per_step(target, drafter, prompt, tokens, k, device)["host_reads"]} if count_reads else {}
         ), target, drafter


# ---------------------------------------------------------------- command line

def main(*, sections: list[str], target_dir: Path, assistant_dir: Path, tokens: int, e2b_tokens: int, reps: int,
         e2b_reps: int, k: int | None, e2b_dir: Path, threads: int | None = None, copy_mib: int,
         use_transformers: bool, sampling_vocab: int = FULL_VOCAB, device: str = "cpu", device_dir: Path = DEVICE_DIR,
         device_small: bool = False, device_compile: bool = False, context_small: bool = False,
         context_before_max: int | None = None, out_dir: Path | None = None, audio_seconds: float = 30.0,
         audio_reps: int = 3, audio_small: bool = False, int4_small: bool = False, int4_31b: bool = False,
         int4_31b_tokens: int = 2, tp_ranks: int = 2, tp_small: bool = False, peer_llama: Path | None = None,
         quiet: bool = False) -> dict:
    """The run's result object (what --json prints). `threads`: --threads, else each section's by the one thread
    rule (bench/timing.py `section_threads`); `quiet`: no progress bars (--json). torch's thread count is given
    back as it was."""
    before, was_quiet = torch.get_num_threads(), NOW.quiet
    NOW.quiet = quiet
    try:
        return run_sections(
            sections, target_dir, assistant_dir, tokens, e2b_tokens, reps, e2b_reps, k, e2b_dir, threads, copy_mib,
            use_transformers, sampling_vocab, device, device_dir, device_small, device_compile, context_small,
            context_before_max, out_dir, audio_seconds, audio_reps, audio_small, int4_small, int4_31b, int4_31b_tokens,
            tp_ranks, tp_small, peer_llama)
    finally:
        torch.set_num_threads(before)
        NOW.section, NOW.quiet = "", was_quiet


def run_sections(sections: list[str], target_dir: Path, assistant_dir: Path, tokens: int, e2b_tokens: int,
                 reps: int, e2b_reps: int, k: int | None, e2b_dir: Path, asked: int | None, copy_mib: int,
                 use_transformers: bool, sampling_vocab: int, device: str, device_dir: Path, device_small: bool,
                 device_compile: bool, context_small: bool, context_before_max: int | None, out_dir: Path | None,
                 audio_seconds: float, audio_reps: int, audio_small: bool, int4_small: bool, int4_31b: bool,
                 int4_31b_tokens: int, tp_ranks: int, tp_small: bool, peer_llama: Path | None = None) -> dict:
    result: dict[str, Any] = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, torch's default "
                                         f"{TORCH_THREADS} threads, torch {torch.__version__}, float32 unless stated"}
    ran: dict[str, int] = {}  # section -> the torch threads it ran with
    result["threads"] = ran

    def begin(section: str, hidden_size: int, line: str) -> int:
        """A section starts: its threads set by the rule for its model's hidden size (or --threads), a line said,
        its bars named after it."""
        NOW.section = section
        ran[section] = section_threads(hidden_size, asked)
        say(f"{section}: {line} ({ran[section]} torch thread{'s' if ran[section] != 1 else ''})")
        return ran[section]

    clock = Clock(device)
    if clock.cuda:
        result["machine"] += f"; models on {device}: {torch.cuda.get_device_name(clock.device)}, CUDA-event timing"
    timed = functools.partial(interleaved, clock=clock)  # the sections that take `interleaved` time on this clock
    skipped: dict[str, str] = {}
    note = disk_note(checkpoints(sections, e2b_dir, sampling_vocab, e2b_tokens, context_small, int4_small), e2b_dir)
    if note:
        say(note)
    demo = (target_dir / "config.json").is_file()
    demo_hidden = load_config(target_dir).hidden_size if demo else 0
    e2b_hidden = e2b_configs(E2B_VOCAB)[0]["hidden_size"]
    if "demo" in sections:
        if demo:
            begin("demo", demo_hidden, f"{target_dir} + {assistant_dir}")
            prompt = text_prompt(target_dir, DEMO_PROMPT, 24)
            result["demo"], *_ = pair_section(target_dir, assistant_dir, prompt, tokens, reps,
                                              k or assistant_k(assistant_dir), use_transformers, warm_tokens=tokens,
                                              against_unpacked=True, device=device, clock=clock, count_reads=True)
        else:
            say(f"demo: skipped, {target_dir} has no checkpoint (train it, or pass --target/--assistant)")
    if "bench" in sections:
        configs = bench_configs()
        begin("bench", configs[0]["hidden_size"], f"the random mid-size pair under {e2b_dir / 'bench'}")
        t_dir, a_dir = write_pair(e2b_dir / "bench", *configs, torch.float32)
        result["bench"], *_ = pair_section(t_dir, a_dir, random_prompt(t_dir, 24), tokens, reps,
                                           k or assistant_k(a_dir), use_transformers, warm_tokens=4,
                                           against_unpacked=True, device=device, clock=clock)
        result["bench"]["note"] = "random weights, 16 layers of width 512, MLP 2048, vocabulary 16384"
    e2b_target = e2b_drafter = None
    e2b_sections = [s for s in ("e2b", "costs", "bandwidth") if s in sections]
    if e2b_sections:
        begin(e2b_sections[0], e2b_hidden, f"the random E2B-dimension pair under {e2b_dir / 'float32'}")
        t_dir, a_dir = write_pair(e2b_dir / "float32", *e2b_configs(E2B_VOCAB), torch.float32)
        prompt = random_prompt(t_dir, 16)
        if "e2b" in sections:
            result["e2b"], e2b_target, e2b_drafter = pair_section(  # a short warm-up: it pages the weights in
                t_dir, a_dir, prompt, e2b_tokens, e2b_reps, k or assistant_k(a_dir), use_transformers, warm_tokens=2,
                against_unpacked=False, device=device, clock=clock)  # a second float32 E2B (≈ 9 GB) would not fit
            result["e2b"]["note"] = f"random weights, vocabulary cut from 262144 to {E2B_VOCAB}"
        else:
            say(f"{e2b_sections[0]}: loading the pair")
            e2b_target = load_target(t_dir, device=device, fast=True)
            e2b_drafter = load_drafter(a_dir, device=device, fast=True)
        if "costs" in sections:
            begin("costs", e2b_hidden, "decode, verify and draft at E2B dimensions")
            result["costs"] = cost_section(e2b_target, e2b_drafter, prompt, e2b_reps, clock)
        if "bandwidth" in sections:
            begin("bandwidth", e2b_hidden, "decode steps and tensor copies in turns")
            methods = result.get("e2b", {}).get("methods", {})
            plain = {name: methods.get(name, {}).get("tokens_per_s") for name in ("ours_plain", "tf_plain")}
            result["bandwidth"] = bandwidth_section(e2b_target, prompt, reps, copy_mib, plain, clock)  # a step: ≈ 0.4 s
        del e2b_target, e2b_drafter
    if "bf16" in sections:
        configs = e2b_configs(FULL_VOCAB)
        begin("bf16", configs[0]["hidden_size"], f"the full-vocabulary bfloat16 pair under {e2b_dir / 'bfloat16-full'}")
        t_dir, a_dir = write_pair(e2b_dir / "bfloat16-full", *configs, torch.bfloat16)
        say("bf16: loading the pair")
        target = load_target(t_dir, dtype=torch.bfloat16, device=device, fast=True)
        drafter = load_drafter(a_dir, dtype=torch.bfloat16, device=device, fast=True)
        prompt = random_prompt(t_dir, 16)
        result["bf16"] = {"costs": cost_section(target, drafter, prompt, e2b_reps, clock),
                          "bandwidth": bandwidth_section(target, prompt, e2b_reps, copy_mib, {}, clock)}
        del target, drafter
    if "memory" in sections and clock.cuda:
        skipped["memory"] = f"the host's resident memory of a CPU load: {ON_CPU_ONLY} (`device` measures CUDA memory)"
    elif "memory" in sections:
        n = begin("memory", e2b_hidden, f"the E2B-dimension checkpoints under {e2b_dir}, loaded in fresh processes")
        t_dir, _ = write_pair(e2b_dir / "bfloat16", *e2b_configs(E2B_VOCAB), torch.bfloat16)
        f32_dir, _ = write_pair(e2b_dir / "float32", *e2b_configs(E2B_VOCAB), torch.float32)
        loads = (("memory", t_dir, "bfloat16"),  # the target: loaded as stored
                 ("memory_float32", t_dir, "float32"),  # every weight cast, then packed
                 ("memory_float32_file", f32_dir, "float32"))  # views, then packed
        for key, model_dir, dtype in loads:
            say(f"memory: load_target({model_dir.parent.name}, dtype={dtype}) in a fresh process")
            result[key] = memory_section(model_dir, dtype, n)
    if "batch" in sections and demo:  # scripts/bench/batch.py
        begin("batch", demo_hidden, "B = 1, 2, 4, 8 prompts as one batch and one after another")
        prompts = [text_prompt(target_dir, p, 8 + 3 * i) for i, p in enumerate(DEMO_PROMPTS)]
        result["batch"] = batch_section(load_target(target_dir, device=device, fast=True),
                                        load_drafter(assistant_dir, device=device, fast=True),
                                        prompts, tokens, min(reps, 3), k or assistant_k(assistant_dir), timed)
    if "experts" in sections:
        begin("experts", MOE_HIDDEN, "unique experts per MoE layer, decode, verify and batches")
        result["experts"] = experts_section()  # counts, times nothing: on the CPU whatever --device
    if "sampling" in sections:  # scripts/bench/sampling.py
        configs = e2b_configs(sampling_vocab)
        begin("sampling", configs[0]["hidden_size"],
              f"sampled rows, and E2B-dimension bfloat16 decoding at V = {sampling_vocab}")
        result["sampling"] = sampling_section(sampling_root(e2b_dir, sampling_vocab), configs, e2b_tokens, e2b_reps,
                                              reps, timed, device)
    if "device" in sections:  # scripts/bench/device.py
        configs = small_e2b_configs(512) if device_small else e2b_configs(FULL_VOCAB)
        begin("device", configs[0]["hidden_size"], f"end-to-end checks on {device}{' (small)' if device_small else ''}")
        result["device"] = device_section(device, device_dir, device_small, tokens, reps,
                                          4 if device_small else copy_mib, device_compile, say, out_dir, asked)
    if "context" in sections:  # scripts/bench/context.py: a prefill geometry's threads, then the demo pair's
        NOW.section = "context"
        say(f"context: cache bytes, prefill peaks and decode speed{' (small)' if context_small else ''}")
        result["context"] = context_section(e2b_dir, target_dir, assistant_dir, k or assistant_k(assistant_dir),
                                            context_small, context_before_max, asked, timed, say)
        ran |= {f"context {part}": n for part, n in result["context"]["threads"].items()}
    if "audio" in sections:  # scripts/bench/audio.py
        n = begin("audio", audio.geometry(audio_small).hidden_size,
                  f"the {'small' if audio_small else 'E2B'} audio tower")
        result["audio"] = audio_section(audio_seconds, audio_reps, audio_small, n, clock, say)
        if clock.cuda:
            skipped["audio memory"] = f"the host's resident memory of an encode: {ON_CPU_ONLY}"
    if "int4" in sections and clock.cuda:
        skipped["int4"] = f"int4 against bf16, transformers and host memory: {ON_CPU_ONLY}"
    elif "int4" in sections:  # scripts/bench/int4.py: each part's threads by the rule for its model
        NOW.section = "int4"
        say(f"int4: int4 targets against bfloat16, transformers and memory{' (small)' if int4_small else ''}")
        result["int4"] = int4_section(e2b_dir, target_dir, assistant_dir,
                                      text_prompt(target_dir, DEMO_PROMPT, 24) if demo else [],
                                      k or assistant_k(assistant_dir), tokens, reps, e2b_tokens, e2b_reps, copy_mib,
                                      use_transformers, int4_small, int4_31b, int4_31b_tokens, asked, timed, say)
        ran |= {f"int4 {part}": n for part, n in result["int4"]["threads"].items()}
    if "tp" in sections and clock.cuda:
        skipped["tp"] = f"gloo ranks on the CPU against one process: {ON_CPU_ONLY}"
    elif "tp" in sections:  # scripts/bench/parallel.py: its processes set their own threads
        NOW.section = "tp"
        say(f"tp: {tp_ranks} gloo ranks against one process{' (small)' if tp_small else ''}")
        result["tp"] = tp_section(e2b_dir, tp_ranks, tokens, max(reps, 3), k or 4, tp_small, say)
    if "peer" in sections and clock.cuda:
        skipped["peer"] = f"llama.cpp on the CPU against ours: {ON_CPU_ONLY}"
    elif "peer" in sections:  # scripts/bench/peer.py: its parts set their own threads
        NOW.section = "peer"
        say("peer: llama.cpp and ours on one E2B geometry, side by side")
        result["peer"] = peer_section(e2b_dir, (target_dir, assistant_dir) if demo else None,
                                      text_prompt(target_dir, DEMO_PROMPT, 24) if demo else [],
                                      k or assistant_k(assistant_dir), e2b_tokens, max(e2b_reps, 3), peer_llama, say)
        if "skipped" in result["peer"]:
            say(f"peer: skipped: {result['peer']['skipped']}")
    if clock.cuda and {"demo", "bench", "e2b", "bandwidth", "bf16"} & set(sections):
        skipped["packed products"] = f"oneDNN's packed weights: {ON_CPU_ONLY}"
    if skipped:
        result["skipped"] = skipped
    if "schedule" in sections and demo:  # scripts/bench/schedule.py
        begin("schedule", demo_hidden, "plain, constant K = 1..8, heuristic and auto, on the demo pair and a random "
              "drafter")
        result["schedule"] = schedule_section(target_dir, assistant_dir, e2b_dir / "random_assistant",
                                              text_prompt(target_dir, DEMO_PROMPT, 24), tokens, max(reps, 3),
                                              k or assistant_k(assistant_dir), interleaved)
    result["goals"] = (goals(result) + batch_goal(result) + sampling_goals(result) + schedule_goals(result)
                       + context_goals(result) + int4_goals(result) + peer_goals(result))
    return result


def printed(result: dict[str, Any]) -> str:
    """The table of a run's result: every section's block, the developers' goals block last."""
    blocks = (table(result), batch_table(result), sampling_table(result), device_table(result), context_table(result),
              "\n".join(schedule_lines(result.get("schedule"))), audio_table(result), int4_table(result),
              tp_table(result), peer_table(result), goals_table(result))
    return "\n".join(block for block in blocks if block)  # each block after the first opens with its blank line


def assistant_k(assistant_dir: Path) -> int:
    """`num_assistant_tokens` of the assistant's generation_config.json, else 4."""
    file = assistant_dir / "generation_config.json"
    return int(read_json(file).get("num_assistant_tokens", 4)) if file.is_file() else 4


class Defaults(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's default in --help, where it has one worth saying: not None, not a list the help already gives."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or action.dest == "only":
            return action.help
        return super()._get_help_string(action)


if __name__ == "__main__":
    full_run = plan_bytes(checkpoints(SECTIONS, Path("."))) / 1e9  # what a run of every section writes
    p = argparse.ArgumentParser(description=f"{__doc__.split(chr(10))[0]} A run of every section (no --only) writes "
                                f"≈ {full_run:.0f} GB of random checkpoints once, under --e2b-dir, and reuses them "
                                f"later; --only demo writes nothing.", formatter_class=Defaults)
    p.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections, of: {', '.join(SECTIONS)} "
                   f"(all of them by default); and {', '.join(ON_REQUEST)}, run only when named")
    p.add_argument("--target", type=Path, default=DEMO / "target", help="the demo section's target")
    p.add_argument("--assistant", type=Path, default=DEMO / "assistant", help="the demo section's assistant")
    p.add_argument("--tokens", type=int, default=64, help="new tokens per run: demo, bench, batch")
    p.add_argument("--e2b-tokens", type=int, default=16, help="new tokens per run in the e2b section")
    p.add_argument("--reps", type=int, default=7, help="timed repetitions: demo, bench, bandwidth")
    p.add_argument("--e2b-reps", type=int, default=3, help="timed repetitions: e2b, costs, bf16")
    p.add_argument("-k", type=int, default=None, help="drafts per round; None: the assistant's "
                   "num_assistant_tokens, else 4")
    p.add_argument("--e2b-dir", type=Path, default=Path(tempfile.gettempdir()) / "gemma4-mtp-benchmark",
                   help=f"where the random checkpoints are written once and reused: ≈ {full_run:.0f} GB for a run of "
                   f"every section (bench, float32, bfloat16, bfloat16-full)")
    p.add_argument("--threads", type=int, help="torch threads, for every section and method alike (default: each "
                   "section on the threads the one thread rule of scripts/cli/threads.py gives the model it measures)")
    p.add_argument("--copy-mib", type=int, default=1024, help="size of the bandwidth probe")
    p.add_argument("--no-transformers", action="store_true", help="leave the transformers columns empty")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--sampling-vocab", type=int, default=FULL_VOCAB,
                   help="the sampling section's E2B pair's vocabulary (writing the full one takes ≈ 20 GB of memory)")
    p.add_argument("--device", help="where the models run: cpu, cuda or cuda:N; on CUDA every time is read from CUDA "
                   "events, and what cannot run there says so under `skipped` (default: cuda for the device section "
                   "when there is one, else cpu)")
    p.add_argument("--out", type=Path, metavar="DIR", help="the device section writes DIR/device.json after every "
                   "check, so a run cut off keeps each finished one")
    p.add_argument("--device-dir", type=Path, default=DEVICE_DIR, help="where the device section writes its four "
                   "random bfloat16 pairs once (≈ 30.8 GB: e2b 9.4, 31b_layers 7.7, 26b_layers 8.9, 12b_layers 4.8, "
                   "bench.device.pair_bytes; in the temp directory instead when this one's file system lacks it)")
    p.add_argument("--device-small", action="store_true", help="the device section at tiny sizes, for a CPU")
    p.add_argument("--device-compile", action="store_true", help="the device section also tries torch.compile "
                   "of a decode step (fails soft)")
    p.add_argument("--context-small", action="store_true", help="the context section at tiny sizes, for the tests")
    p.add_argument("--context-before-max", type=int, default=2048, help="the context section runs the one-forward "
                   "prefill (quadratic in the prompt) only for prompts up to this many positions")
    p.add_argument("--audio-seconds", type=float, default=30.0, help="the audio section's clip (at most 30: the "
                   "most the tower reads)")
    p.add_argument("--audio-reps", type=int, default=3, help="timed repetitions in the audio section")
    p.add_argument("--audio-small", action="store_true", help="the audio section at a tiny geometry, for the tests")
    p.add_argument("--int4-small", action="store_true", help="the int4 section at tiny sizes, for the tests (its "
                   "31b part included)")
    p.add_argument("--int4-31b", action="store_true", help="the int4 section also writes a random 31B-geometry int4 "
                   "file (≈ 19 GB under --e2b-dir, deleted after; minutes to write) and loads it in fresh processes, "
                   "fast=False and fast=True: resident memory, and whether it decodes")
    p.add_argument("--int4-31b-tokens", type=int, default=2, help="tokens each 31B load decodes (a prefill and "
                   "N - 1 steps; fast=False dequantizes every weight each forward)")
    p.add_argument("--tp-ranks", type=int, default=2, help="ranks of the tp section's speed part (one torch thread "
                   "each, against one process of that many threads)")
    p.add_argument("--peer-llama", type=Path, metavar="DIR", help="the peer section's llama.cpp: a source tree, its "
                   "tools built in DIR/build (built there if missing); default: llama-cpp-python's source, downloaded "
                   "and built once under --e2b-dir")
    p.add_argument("--tp-small", action="store_true", help="the tp section at tiny sizes, for the tests")
    a = p.parse_args()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # under torchrun: every rank would run the whole benchmark
        if os.environ.get("RANK", "0") == "0":
            print(f"error: benchmark.py starts its own ranks: run `python scripts/benchmark.py --only tp --tp-ranks "
                  f"{os.environ['WORLD_SIZE']}` without torchrun", file=sys.stderr)
        sys.exit(2)
    only = [s.strip() for s in a.only.split(",") if s.strip()]
    unknown = sorted(set(only) - set(SECTIONS + ON_REQUEST))
    if unknown:
        p.error(f"unknown section {unknown[0]!r}; choose from {', '.join(SECTIONS + ON_REQUEST)}")
    if not 0 < a.audio_seconds <= 30:
        p.error(f"--audio-seconds {a.audio_seconds:g}: a clip of more than 0 and at most 30 s (the tower's cut)")
    if a.tp_ranks < 2:
        p.error(f"--tp-ranks {a.tp_ranks}: at least 2")
    if a.int4_31b_tokens < 1:
        p.error(f"--int4-31b-tokens {a.int4_31b_tokens}: at least 1")
    if a.audio_reps < 1:
        p.error(f"--audio-reps {a.audio_reps}: at least 1")
    if a.threads is not None and a.threads < 1:
        p.error(f"--threads {a.threads}: at least 1")
    if a.device is None:
        a.device = "cuda" if only == ["device"] and torch.cuda.is_available() else "cpu"
    if a.device != "cpu" and not (a.device.startswith("cuda") and torch.cuda.is_available()):
        p.error(f"--device {a.device}: {'no CUDA device here' if a.device.startswith('cuda') else 'cpu or cuda[:N]'}")
    out = main(sections=only, target_dir=a.target, assistant_dir=a.assistant, tokens=a.tokens, e2b_tokens=a.e2b_tokens,
               reps=a.reps, e2b_reps=a.e2b_reps, k=a.k, e2b_dir=a.e2b_dir, threads=a.threads, copy_mib=a.copy_mib,
               use_transformers=not a.no_transformers, sampling_vocab=a.sampling_vocab, device=a.device,
               device_dir=a.device_dir, device_small=a.device_small, device_compile=a.device_compile,
               context_small=a.context_small, context_before_max=a.context_before_max, out_dir=a.out,
               audio_seconds=a.audio_seconds, audio_reps=a.audio_reps, audio_small=a.audio_small,
               int4_small=a.int4_small, int4_31b=a.int4_31b, int4_31b_tokens=a.int4_31b_tokens,
               tp_ranks=a.tp_ranks, tp_small=a.tp_small, peer_llama=a.peer_llama, quiet=a.json)
    print(json.dumps(out, indent=1) if a.json else printed(out))
