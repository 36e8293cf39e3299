"""scripts/benchmark.py's `schedule` section: the draft length's schedules against plain decoding.

On the demo pair and on a *random* pair (the demo target with a drafter of the demo's shapes and random weights,
which is never right), one process decodes the same prompt plainly, with `auto`, at constant K = 1..8, with the
heuristic schedule, then with `auto` and plainly again, timed in turns in that order (reversed every other
repetition, bench.timing's `interleaved`), tokens/s from the median of the repetitions. So plain decoding and `auto`
run twice a repetition, back to back at both ends of it (plain, auto, ..., auto, plain), and a repetition's time for
each is the mean of its two runs: on a machine whose pace moves by several percent within a second, the ratio `auto`
is judged by compares neighbours in time, and a steady drift across the pair cancels. Each schedule object lives
across the repetitions, as one kept per drafter does (`auto` and the heuristic carry what they learned from one call
to the next). It reports what `auto` chose (its K histogram and estimates at the end), and the two ratios the
schedule is judged by, each the median of the per-repetition ratios: auto against the best constant K of 1..8 (by
median tokens/s) on the demo, and auto against plain decoding on the random pair.
"""

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from bench.timing import median_ratio
from cli.clock import RoundClock
from gemma4 import greedy_generate, load_target
from mtp import DraftLength, load_drafter
from mtp.engine import speculative_one

CONSTANT = range(1, 9)
AGAIN = " again"  # plain's and auto's second run in a repetition


def random_assistant(assistant_dir: Path, out: Path, seed: int = 0) -> Path:
    """The demo assistant's config and shapes with random weights of each tensor's own scale: a drafter that
    belongs to the demo target and is (almost) never right. Its token ordering stays a permutation."""
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    for file in assistant_dir.iterdir():
        if file.suffix == ".safetensors":
            tensors = load_file(file)
            save_file({name: (torch.randn(t.shape, generator=g) * t.float().std()).to(t.dtype)
                       if t.is_floating_point() and t.numel() > 1 else t for name, t in tensors.items()},
                      out / file.name, metadata={"format": "pt"})
        elif file.is_file():
            (out / file.name).write_bytes(file.read_bytes())
    return out


def schedule_section(target_dir: Path, assistant_dir: Path, random_dir: Path, prompt: list[int], tokens: int,
                     reps: int, k: int, interleaved: Callable) -> dict[str, Any]:
    target = load_target(target_dir, fast=True)
    out: dict[str, Any] = {"tokens": tokens, "reps": reps, "k": k}
    for pair, drafter in (("demo", load_drafter(assistant_dir, fast=True)), ("random", load_drafter(random_assistant(
            assistant_dir, random_dir), fast=True))):
        # auto first: it runs next to plain (below)
        lengths = {"auto": DraftLength(k, "auto", max_k=max(8, k))} | {f"K={n}": DraftLength(n) for n in CONSTANT}
        lengths["heuristic"] = DraftLength(k, "heuristic")
        last: dict[str, Any] = {}  # name -> its last run's result and clock

        def spec(name: str) -> list[int]:
            clock = RoundClock()  # every schedule's rounds timed alike: one clock read a round
            last[name] = speculative_one(target, drafter, prompt, tokens, lengths[name], on_round=clock.round), clock
            return last[name][0].tokens

        plain = lambda: greedy_generate(target, prompt, tokens)  # noqa: E731
        # Plain and auto open and close every repetition, back to back (ABBA): their ratio compares neighbours.
        runs = {"plain": plain} | {name: lambda name=name: spec(name) for name in lengths}
        runs |= {"auto" + AGAIN: lambda: spec("auto"), "plain" + AGAIN: plain}
        seconds, outputs = interleaved(runs, reps, warm_up={n: r for n, r in runs.items() if AGAIN not in n})
        for name in ("plain", "auto"):  # a repetition's seconds: the mean of its two runs
            seconds[name] = [(a + b) / 2 for a, b in zip(seconds[name], seconds.pop(name + AGAIN))]
        rate = {name: tokens / statistics.median(s) for name, s in seconds.items()}
        best = max((f"K={n}" for n in CONSTANT), key=rate.get)
        auto, auto_clock = last["auto"][0].stats, last["auto"][1]
        out[pair] = {
            "tokens_per_s": rate,
            "seconds": {name: seconds[name] for name in ("plain", "auto")},  # every repetition's (two runs' mean)
            "identical": all(o == outputs["plain"][0] for runs_ in outputs.values() for o in runs_),
            "best_constant": best,
            # As every ratio of the benchmark: the median of the per-repetition ratios (runs neighbours in time).
            "auto_over_best_constant": median_ratio(seconds[best], seconds["auto"]),
            "auto_over_plain": median_ratio(seconds["plain"], seconds["auto"]),
            "auto_k_histogram": {str(n): c for n, c in auto.k_histogram.items()},
            "auto_seconds_at_k0": auto_clock.at_zero(auto),
            "auto_estimates": lengths["auto"].estimates(),
        }
    return out


def schedule_lines(r: dict[str, Any] | None) -> list[str]:
    if not r:
        return []
    lines = ["", f"== schedule: {r['tokens']} tokens, median of {r['reps']}, tokens/s (demo pair; random drafter)"]
    names = list(r["demo"]["tokens_per_s"])
    for name in names:
        lines.append(f"   {name:<12}{r['demo']['tokens_per_s'][name]:>10.1f}{r['random']['tokens_per_s'][name]:>10.1f}")
    for pair in ("demo", "random"):
        p = r[pair]
        hist = "  ".join(f"K={n}: {c}" for n, c in p["auto_k_histogram"].items())
        lines.append(f"   {pair}: auto / best constant ({p['best_constant']}) {p['auto_over_best_constant']:.2f}x, "
                     f"auto / plain {p['auto_over_plain']:.2f}x; auto's last run: {hist}; identical tokens "
                     f"{'yes' if p['identical'] else 'NO'}")
    return lines


def schedule_goals(result: dict[str, Any]) -> list[dict[str, Any]]:
    r = result.get("schedule")
    if not r:
        return []
    return [{"goal": "schedule: demo, auto / best constant K of 1..8", "value": r["demo"]["auto_over_best_constant"],
             "limit": 0.95, "at_least": True, "met": r["demo"]["auto_over_best_constant"] >= 0.95},
            {"goal": "schedule: random drafter, auto / plain", "value": r["random"]["auto_over_plain"],
             "limit": 0.97, "at_least": True, "met": r["random"]["auto_over_plain"] >= 0.97}]
