"""scripts/benchmark.py's `peer` section: llama.cpp, the CPU peer people pick, and this project on one E2B geometry.

    python scripts/benchmark.py --only peer                     # --peer-llama DIR: your own llama.cpp checkout

The bf16 section's random pair at E2B's dimensions (vocabulary 262,144), and llama.cpp's own conversion of its target
(bench/llama_cpp.py): bf16, Q4_0, and Q4_0 with the tied head kept in bfloat16 (what a w4a16 release keeps). Ours:
the same file with the speed layer, in bfloat16, quantized to int4 at load (Google's w4a16 recipe), and that with
its head in int4 too (`int4_head`, --quantize-head int4: the counterpart of Q4_0's quantized head).

- `decode`: one token a step, at 1 and 2 threads: llama.cpp's `llama-bench -p 0 -n N`, ours a decode step at the
  same depth. Seconds a token in wall time and in process CPU time: on a shared machine only CPU time is stable.
- `batch`: a step of 4 and of 5 tokens against one, 1 thread: llama.cpp's `-p 1` / `-p 4` / `-p 5` (logits of
  the last row only), ours a verify of 4 or 5 rows (logits of every row: a verify needs them all). llama.cpp
  repacks its weights for the CPU by default; where a prompt run with them crashes (this llama.cpp's Q4_0 on a
  CPU with AMX), that file's three steps run without (`--repack 0`, `llama_repacked_in_batches`).
- `mtp`: ours int4 (and int4_head) + the E2B-geometry assistant (random: its drafts are almost never kept, the
  acceptance is stated), speculative against plain tokens/s; and the same at the demo pair's acceptance, projected
  from the E2B step costs measured here (bench/costs.py) for every K: tokens a round / (a draft round + a verify,
  in decode steps), and the best K.
- `head_agreement`: how often the int4 head's argmax is the bf16 head's, on the same hidden states.
Every measurement alternates between the two programs, rep by rep, and each figure is a median over reps.

A llama.cpp run's CPU time is read from /proc while it runs, from the start of its first timed run to its report
(`llama_bench`): loading and repacking its weights cost seconds of CPU time that vary from run to run.
"""

import gc
import json
import os
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.costs import cost_section
from bench.llama_cpp import LlamaCpp, find, gguf_files
from bench.random_pair import e2b_configs, random_prompt, write_pair
from bench.report import at_least, fmt
from bench.timing import prefilled
from gemma4 import greedy_generate, load_target
from gemma4.fast.apply import int4_head
from gemma4.engine.forward import forward_rows
from mtp import DraftLength, load_drafter, speculative_generate

BF16 = torch.bfloat16
FULL_VOCAB = 262144
THREADS = (1, 2)
BATCHES = (4, 5)  # the rows of a verify of 3 and of 4 drafts
DEPTH = 16  # positions in the cache before each timed step: the prompt
BATCH_REPS = 8  # timed repetitions of a step of 1, 4 or 5 tokens
DEMO_TOKENS = 64  # new tokens of the demo pair's run that gives the acceptance projected at
HEAD_TOKENS = 512  # the demo's greedy tokens over which the int4 head's argmax is compared with the bf16 head's
E2B_HEAD_TOKENS = 128  # at least these greedy tokens of the E2B int4 target for the same comparison
GOALS = (("peer: int4 decode, ours / llama.cpp Q4_0, 1 thread, CPU time", ("int4_over_q4_0", "cpu"), 1.0),
         ("peer: int4 decode, the head int4 too, ours / llama.cpp Q4_0, 1 thread, CPU time",
          ("int4_head_over_q4_0", "cpu"), 1.0),
         ("peer: bf16 decode, ours / llama.cpp BF16, 1 thread, CPU time", ("bf16_over_bf16", "cpu"), 1.0),
         ("peer: ours int4 + MTP at the demo's acceptance, best K / llama.cpp Q4_0 plain",
          ("mtp", "int4", "best_over_q4_0"), 1.5))


# ---------------------------------------------------------------- llama.cpp's side

def llama_bench(llama: LlamaCpp, file: Path, threads: int, prompt: int, gen: int, reps: int,
                repack: bool = True) -> dict[str, float] | None:
    """One `llama-bench` test, timed `reps` times: seconds a test in wall time (llama-bench's mean) and in the
    process's CPU time over its timed runs alone; None where it crashed (killed by a signal). `repack`: llama.cpp's
    default, its weights repacked for this CPU.

    The CPU time is read from /proc as llama-bench says (`--progress`) that its first timed run starts and as it
    prints the test's line: loading, repacking, the warm-up and freeing, whose CPU time varies by seconds, stay
    out."""
    process = subprocess.Popen([str(llama.tool("llama-bench")), "-m", str(file), "-t", str(threads), "-p", str(prompt),
                                "-n", str(gen), "-r", str(reps), "-o", "jsonl", "--repack", str(int(repack)),
                                "--progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    marks: dict[str, float] = {}
    reports: list[str] = []

    def report() -> None:  # stdout: the test's line, printed as its timed runs end, before memory is freed
        for line in process.stdout:
            if line.startswith("{") and "end" not in marks:
                marks["end"] = cpu_seconds(process.pid)
                reports.append(line)
    reader = threading.Thread(target=report)
    reader.start()
    tail: list[str] = []
    for line in process.stderr:  # llama.cpp's log and its progress lines, as they come
        tail = (tail + [line.strip()])[-5:]
        if "start" not in marks and " run 1/" in line and "warmup" not in line:
            marks["start"] = cpu_seconds(process.pid)
    reader.join()
    code = process.wait()
    if code < 0:
        return None
    if code or len(marks) < 2:
        raise RuntimeError(f"llama-bench failed on {file.name}: {' | '.join(tail)[-300:]}")
    return {"cpu": (marks["end"] - marks["start"]) / reps, "wall": json.loads(reports[0])["avg_ns"] / 1e9}


def cpu_seconds(pid: int) -> float:
    """A running process's CPU time so far, user and system, every thread (/proc/PID/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def llama_decode(llama: LlamaCpp, file: Path, threads: int, tokens: int) -> dict[str, float]:
    """Seconds a decoded token: a test of `tokens` tokens after one (llama-bench's warm-up)."""
    test = llama_bench(llama, file, threads, 0, tokens, 1)
    if test is None:
        raise RuntimeError(f"llama-bench crashed decoding {file.name}")
    return {clock: seconds / tokens for clock, seconds in test.items()}


def llama_batches(llama: LlamaCpp, file: Path, reps: int) -> tuple[bool, dict[int, dict[str, float]]]:
    """Seconds a step of 1 and of BATCHES tokens (a prompt of that many: logits of its last row), 1 thread, over
    `reps` timed runs each; with weights repacked as llama.cpp's default, or without where a run with them crashed
    (this llama.cpp on an AMX CPU: Q4_0 prompts of 4 tokens). Returns (repacked, rows -> seconds)."""
    for repack in (True, False):
        steps = {rows: llama_bench(llama, file, 1, rows, 0, reps, repack) for rows in (1, *BATCHES)}
        if None not in steps.values():
            return repack, steps
    raise RuntimeError(f"llama-bench crashed on prompts of {file.name}, repacked or not")


# ---------------------------------------------------------------- ours

@torch.inference_mode()
def our_step(target: Any, prompt: list[int], rows: int, steps: int) -> dict[str, float]:
    """Seconds a forward of `rows` new tokens after the prompt (a decode step, or a verify of rows - 1 drafts with
    every row's logits), over `steps` forwards after one untimed: wall, and this process's CPU time."""
    cache, _ = prefilled(target, prompt, rows)
    ids, at = torch.tensor([prompt[-1:] * rows]), torch.tensor([len(prompt)])  # (1, rows), (1,) on the host
    forward_rows(target, ids, cache, at, rows)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        forward_rows(target, ids, cache, at, rows)
    return {"cpu": (time.process_time() - cpu) / steps, "wall": (time.perf_counter() - wall) / steps}


# ---------------------------------------------------------------- the section

def peer_section(e2b_dir: Path, demo: tuple[Path, Path] | None, demo_prompt: list[int], k: int, tokens: int,
                 reps: int, llama_dir: Path | None, say: Callable[[str], None]) -> dict[str, Any]:
    """The section's result, or {"skipped": the one-line reason} where llama.cpp cannot be had here."""
    llama = find(llama_dir, e2b_dir / "llama.cpp", max(THREADS), say)
    if isinstance(llama, str):
        return {"skipped": llama}
    target_dir, assistant_dir = write_pair(e2b_dir / "bfloat16-full", *e2b_configs(FULL_VOCAB), BF16)
    files = gguf_files(llama, target_dir, e2b_dir / "peer", say)
    prompt = random_prompt(target_dir, DEPTH)
    samples: dict[str, list[dict[str, float]]] = {}
    repacked: dict[str, list[bool]] = {name: [] for name in files}  # llama.cpp's prompts, rep by rep

    def batches(name: str) -> None:  # llama.cpp's three prompt steps of a rep, each kept as if timed alone
        repack, steps = llama_batches(llama, files[name], BATCH_REPS)
        repacked[name].append(repack)
        for rows, seconds in steps.items():
            samples.setdefault(f"batch {rows} llama {name}", []).append(seconds)
    # Two phases, each with only its own weights in memory (24 GB does not hold both of ours beside llama.cpp's
    # files: pages read again would show in every time): bf16, then int4 with the two Q4_0 files.
    mtp: dict[str, Any] = {}
    for phase, names in (("bf16", ("bf16",)), ("int4", ("q4_0", "q4_0_bf16_head"))):
        say(f"peer: loading ours in {phase}{' (quantized at load)' if phase == 'int4' else ''}, with the speed layer")
        # int4: also the head quantized (--quantize-head int4), Q4_0's counterpart; the two share the file's pages
        models = {phase: load_target(target_dir, BF16, fast=True, quantize="int4" if phase == "int4" else None)}
        if phase == "int4":
            models["int4_head"] = load_target(target_dir, BF16, fast=True, quantize="int4", quantize_head="int4")
        runs: dict[str, Callable[[], Any]] = {}
        for threads in THREADS:
            for name in names:
                runs[f"decode {threads} llama {name}"] = lambda f=files[name], t=threads: llama_decode(llama, f, t,
                                                                                                      tokens)
            for mine, model in models.items():
                runs[f"decode {threads} ours {mine}"] = lambda t=threads, m=model: threaded(
                    t, lambda: our_step(m, prompt, 1, tokens))
        for name in names:
            runs[f"batches llama {name}"] = lambda name=name: batches(name)
        for rows in (1, *BATCHES):
            for mine, model in models.items():
                runs[f"batch {rows} ours {mine}"] = lambda rows=rows, m=model: threaded(
                    1, lambda: our_step(m, prompt, rows, BATCH_REPS))
        for rep in range(reps):
            for i, (name, run) in enumerate(runs.items()):
                say(f"peer: {phase}, rep {rep + 1}/{reps}, {i + 1}/{len(runs)}: {name}")
                seconds = run()
                if seconds is not None:  # llama.cpp's prompt steps keep their own
                    samples.setdefault(name, []).append(seconds)
        if phase == "int4":
            torch.set_num_threads(1)
            q4_0 = statistics.median(s["wall"] for s in samples["decode 1 llama q4_0"])
            for mine, model in models.items():
                mtp[mine] = mtp_part(model, assistant_dir, prompt, demo, demo_prompt, k, tokens, reps, q4_0, say)
            agreement = head_agreement(models["int4"], prompt, tokens, demo, demo_prompt)
        del models, runs
        gc.collect()
    ours = ("bf16", "int4", "int4_head")
    median = {name: {clock: statistics.median(s[clock] for s in got) for clock in ("cpu", "wall")}
              for name, got in samples.items()}
    out: dict[str, Any] = {"llama_cpp": str(llama.source), "files": {n: str(f) for n, f in files.items()},
                           "target": str(target_dir), "depth": DEPTH, "tokens": tokens, "reps": reps,
                           "seconds": median}
    one = {name: median[f"decode 1 {name}"] for name in ("llama bf16", "llama q4_0", "llama q4_0_bf16_head",
                                                            "ours bf16", "ours int4", "ours int4_head")}
    for key, theirs, mine in (("int4_over_q4_0", "llama q4_0", "ours int4"),
                              ("int4_over_q4_0_bf16_head", "llama q4_0_bf16_head", "ours int4"),
                              ("int4_head_over_q4_0", "llama q4_0", "ours int4_head"),
                              ("bf16_over_bf16", "llama bf16", "ours bf16")):  # our speed over theirs
        out[key] = {clock: one[theirs][clock] / one[mine][clock] for clock in ("cpu", "wall")}
    out["batch_over_decode"] = {f"{who} {name}": {rows: median[f"batch {rows} {who} {name}"]["cpu"]
                                                  / median[f"batch 1 {who} {name}"]["cpu"] for rows in BATCHES}
                                for who, names in (("llama", files), ("ours", ours)) for name in names}
    out["llama_repacked_in_batches"] = {name: all(flags) for name, flags in repacked.items()}
    out["mtp"] = mtp
    out["head_agreement"] = agreement
    return out


def threaded(threads: int, run: Callable[[], dict[str, float]]) -> dict[str, float]:
    torch.set_num_threads(threads)
    return run()


def mtp_part(target: Any, assistant_dir: Path, prompt: list[int], demo: tuple[Path, Path] | None,
             demo_prompt: list[int], k: int, tokens: int, reps: int, q4_0: float,
             say: Callable[[str], None]) -> dict[str, Any]:
    """Ours int4 + MTP at E2B's geometry (1 thread): measured with the random assistant at K = k, and projected at
    the demo pair's acceptance (its target quantized at load like this one, the demo run at each K in 1..MAX_K)
    from the E2B step costs: tokens a round / (a draft round + a verify, in decode steps), and the best K."""
    drafter = load_drafter(assistant_dir, BF16, fast=True, target=target)
    say(f"peer: ours int4 + MTP, K = {k}, and the E2B step costs")
    costs = cost_section(target, drafter, prompt, reps)
    start = time.perf_counter()
    measured = speculative_generate(target, drafter, prompt, tokens, DraftLength(k))
    spec_s = time.perf_counter() - start
    out: dict[str, Any] = {"k": k, "random_assistant": {"acceptance_rate": measured.stats.acceptance_rate,
                                                        "tokens_per_s": len(measured.tokens) / spec_s},
                           "draft_round_over_decode": costs["draft_round_over_decode"],
                           "verify_over_decode": costs["verify_over_decode"], "decode_s": costs["decode_s"]}
    if demo is None:
        return out | {"projected": None}
    demo_target = load_target(demo[0], BF16, fast=True, quantize="int4")
    demo_drafter = load_drafter(demo[1], BF16, fast=True, target=demo_target)
    out["demo"], speedup = {}, {}
    for n in costs["verify_over_decode"]:  # K = 1..MAX_K
        run = speculative_generate(demo_target, demo_drafter, demo_prompt, DEMO_TOKENS, DraftLength(n))
        per_round = run.stats.emitted / max(1, run.stats.target_forwards - 1)  # new tokens a verify, prefill aside
        out["demo"][n] = {"acceptance_rate": run.stats.acceptance_rate, "tokens_per_round": per_round}
        speedup[n] = per_round / (costs["draft_round_over_decode"][n] + costs["verify_over_decode"][n])
    best = max(speedup, key=speedup.get)
    out["projected_speedup"], out["best_k"] = speedup, best
    # Ours int4 + MTP tokens/s at the demo's acceptance against llama.cpp's plain Q4_0, wall clock, at K = k and
    # at the best K (the one `auto`, the int4 default, would learn at these costs):
    out["projected_over_q4_0"] = {n: speedup[n] * q4_0 / out["decode_s"] for n in (k, best)}
    out["best_over_q4_0"] = out["projected_over_q4_0"][best]
    return out


@torch.inference_mode()
def head_agreement(target: Any, prompt: list[int], tokens: int, demo: tuple[Path, Path] | None,
                   demo_prompt: list[int], demo_tokens: int = HEAD_TOKENS) -> dict[str, Any]:
    """How often the int4 head (--quantize-head int4) picks the bf16 head's argmax, on the same final hidden
    states: the E2B int4 target's (random weights) over its prompt and `tokens` greedy tokens, and the demo
    target's (bf16, quantized at load) over its prompt and `demo_tokens` greedy tokens, every position."""
    out: dict[str, Any] = {}
    sets = [("e2b_random", target, prompt, max(tokens, E2B_HEAD_TOKENS))]
    if demo is not None:
        sets.append(("demo", load_target(demo[0], BF16, fast=True, quantize="int4"), demo_prompt, demo_tokens))
    for name, model, ids, n in sets:
        text = ids + greedy_generate(model, ids, n)
        hidden = model(text).hidden  # (T, E) after the final norm, every position
        plain = model.head(hidden, model.embed_tokens.weight).argmax(-1)  # (T,)
        quantized = int4_head(model.embed_tokens.weight, BF16)[0](hidden).argmax(-1)  # (T,)
        out[name] = {"positions": len(text), "agreement": (plain == quantized).float().mean().item()}
    return out


def peer_goals(result: dict[str, Any]) -> list[dict[str, Any]]:
    p = result.get("peer")
    if not p or "skipped" in p:
        return []
    return at_least(p, GOALS)


def peer_table(result: dict[str, Any]) -> str:
    p = result.get("peer")
    if not p:
        return ""
    if "skipped" in p:
        return f"\n== peer: skipped: {p['skipped']}"
    s = p["seconds"]
    lines = ["", f"== peer: llama.cpp ({p['llama_cpp']}) and ours on one E2B geometry, vocabulary {FULL_VOCAB}, depth "
                 f"{p['depth']}; medians of {p['reps']} alternating reps; seconds a step, CPU time / wall"]
    names = ("llama bf16", "ours bf16", "llama q4_0", "llama q4_0_bf16_head", "ours int4", "ours int4_head")
    for threads in THREADS:
        row = ", ".join(f"{name} {fmt(s[f'decode {threads} {name}']['cpu'], '.3f')} / "
                        f"{fmt(s[f'decode {threads} {name}']['wall'], '.3f')}" for name in names)
        lines.append(f"   decode, {threads} thread{'s' if threads > 1 else ''}: {row}")
    lines.append("   ours / llama.cpp speed, 1 thread (CPU; wall): " + "; ".join(
        f"{label} {fmt(p[key]['cpu'])}; {fmt(p[key]['wall'])}" for label, key in (
            ("bf16/BF16", "bf16_over_bf16"), ("int4/Q4_0", "int4_over_q4_0"),
            ("int4/Q4_0 bf16 head", "int4_over_q4_0_bf16_head"), ("int4 head int4/Q4_0", "int4_head_over_q4_0"))))
    for who, ratios in p["batch_over_decode"].items():
        plain = who.startswith("llama") and not p["llama_repacked_in_batches"][who.removeprefix("llama ")]
        why = ", weights not repacked: repacked, it crashed" if plain else ""
        lines.append(f"   {who}: " + ", ".join(f"{rows} tokens {fmt(r)} steps" for rows, r in ratios.items())
                     + f" (CPU time over one token{why})")
    for mine, m in p["mtp"].items():
        k, drafted = m["k"], m["random_assistant"]
        lines.append(f"   ours {mine} + MTP, K = {k}: random assistant acceptance {fmt(drafted['acceptance_rate'])}, "
                     f"{fmt(drafted['tokens_per_s'])} tokens/s; a draft round {fmt(m['draft_round_over_decode'][k])} "
                     f"and a verify {fmt(m['verify_over_decode'][k])} decode steps")
        if m.get("demo"):
            best = m["best_k"]
            lines.append(f"     at the demo's acceptance: " + ", ".join(
                f"K = {n} {fmt(m['demo'][n]['tokens_per_round'])} tokens a round, {fmt(m['projected_speedup'][n])}x"
                for n in m["demo"]) + " plain")
            lines.append(f"     K = {k}: {fmt(m['projected_over_q4_0'][k])}x llama.cpp's plain Q4_0 (wall); the best, "
                         f"K = {best}: {fmt(m['best_over_q4_0'])}x")
    for name, a in p.get("head_agreement", {}).items():
        lines.append(f"   the int4 head's argmax = the bf16 head's, {name}: {fmt(a['agreement'], '.4f')} of "
                     f"{a['positions']} positions")
    return "\n".join(lines)
