"""The statistics of a run, as scripts/generate.py and scripts/chat.py print them: the `stats` object
of `--json` and the block of text on stderr (and chat's `/stats`)."""

import sys
from itertools import chain

import torch

from cli.clock import RoundClock
from mtp import SpecStats
from mtp.schedule import Schedule


def run_json(target: str, assistant: str | None, dtype: torch.dtype, device: torch.device, prompt_tokens: int,
             new_tokens: int, models: list[torch.nn.Module]) -> dict:
    """What ran, as --json's top-level fields (ollama's `model`, `prompt_eval_count`, `eval_count`), and its
    memory (`memory_json`)."""
    return {"target": target, "assistant": assistant, "dtype": str(dtype).removeprefix("torch."),
            "device": str(device), "threads": torch.get_num_threads(), "prompt_tokens": prompt_tokens,
            "new_tokens": new_tokens, "memory": memory_json(models, device)}


def memory_json(models: list[torch.nn.Module], device: torch.device) -> dict:
    """`weights_bytes`: the models' parameters and buffers as loaded (an int4 layer: its packed words and scales,
    about 0.28 of bfloat16's bytes), each tensor once; the speed layer's own prepared copies are not counted.
    `peak_bytes`: the most memory the process held, where the system says it (the CPU's peak resident set;
    on CUDA the device's peak allocation), else None."""
    seen, weights = set(), 0
    for tensor in chain.from_iterable(chain(m.parameters(), m.buffers()) for m in models):
        key = (tensor.data_ptr(), tensor.numel(), tensor.dtype)
        if key not in seen:
            seen.add(key)
            weights += tensor.numel() * tensor.element_size()
    return {"weights_bytes": weights, "peak_bytes": peak_bytes(device)}


def peak_bytes(device: torch.device) -> int | None:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # macOS counts bytes, Linux KiB


def stats_json(stats: SpecStats | None, tokens: list[int], seconds: float,
               draft_length: Schedule | None = None, eager_rounds: int | None = None,
               clock: RoundClock | None = None) -> dict:
    """The `stats` object; plain decoding runs one target forward per token and drafts nothing. With the
    schedule, what it learned (`auto`: its estimates of acceptance and of a round's seconds). `eager_rounds`
    (--compile): the rounds (plain decoding: the tokens) whose step ran uncompiled; None without --compile.
    `clock`: the speculative run's, passed as its on_commit: each round's seconds (the statistics keep none)."""
    if stats and clock is None:
        raise ValueError("a speculative run's statistics need its RoundClock for the rounds' seconds")
    forwards = stats.target_forwards if stats else len(tokens)
    out = {
        "target_forwards": forwards,
        "drafted": stats.drafted if stats else 0,
        "accepted": stats.accepted if stats else 0,
        "acceptance_rate": stats.acceptance_rate if stats else 0.0,
        "tokens_per_forward": len(tokens) / forwards if forwards else 0.0,
        "seconds": seconds,
        "tokens_per_second": len(tokens) / seconds if seconds else 0.0,
        "rounds": [{"drafted": r.drafted, "accepted": r.matched, "seconds": s}
                   for r, s in zip(stats.rounds, clock.seconds(), strict=True)] if stats else [],
        "draft_lengths": {str(k): n for k, n in stats.k_histogram.items()} if stats else {},
        "seconds_at_k0": clock.at_zero(stats) if stats else 0.0,
        "eager_rounds": eager_rounds,
    }
    if draft_length is not None:
        out["schedule"] = {"name": draft_length.schedule,
                           "estimates": draft_length.estimates() if draft_length.schedule == "auto" else None}
    return out


def stats_text(result: dict, stats: SpecStats | None) -> str:
    s = result["stats"]
    plain_kind = "plain greedy" if result["sampling"]["temperature"] == 0 else "plain sampling"
    lines = [f"-- {'speculative' if stats else plain_kind} decoding: {len(result['tokens'])} tokens, "
             f"finished by {result['finish_reason']}"]
    if stats:
        by_position = "  ".join(f"{i + 1}: {p:.0%}" for i, p in enumerate(stats.per_position_acceptance))
        verifies = s["target_forwards"] - 1
        rate = (f"acceptance rate {s['acceptance_rate']:.1%}" if s["drafted"] else
                "nothing drafted (the budget left no room for a draft and the target's own token)")
        lines += [f"target forwards      {s['target_forwards']} (1 prefill + {verifies} verification"
                  f"{'' if verifies == 1 else 's'}; plain decoding needs {len(result['tokens'])})",
                  f"tokens per forward   {s['tokens_per_forward']:.2f}",
                  f"drafted, accepted    {s['drafted']}, {s['accepted']}: {rate}",
                  f"accepted by position {by_position or '-'}",
                  f"draft lengths        {k_line(s)}"]
        if (s.get("schedule") or {}).get("estimates"):
            lines.append(f"auto's estimates     {estimates_line(s['schedule']['estimates'])}")
        if hint := drafting_hint(result):
            lines.append(hint)
    else:
        lines.append(f"target forwards      {s['target_forwards']} (one per token)")
    if s.get("eager_rounds") is not None:
        lines.append(f"eager rounds         {s['eager_rounds']} (--compile: steps of a row count not compiled)")
    lines.append(f"time                 {s['seconds']:.2f} s, {s['tokens_per_second']:.1f} tokens/s")
    if memory := result.get("memory"):
        peak = memory["peak_bytes"]
        where = "" if peak is None else f", peak {gb(peak)} ({'device' if result['device'].startswith('cuda') else 'resident'})"
        lines.append(f"memory               weights {gb(memory['weights_bytes'])}{where}")
    if "plain" in result:
        p = result["plain"]
        same = "yes" if result["identical"] else f"no: first difference at new token {first_difference(result)}"
        if not result["identical_expected"]:
            same += " (sample drafting: exact in distribution, its draws differ from plain sampling's by design)"
        elif not result["identical"] and result.get("low_precision"):
            same += (" (below float32 a verify of several rows and a one-token step can round a near tie either "
                     "way: --dtype float32 gives plain decoding's tokens)")
        lines += [f"-- {plain_kind} decoding (--compare): {p['seconds']:.2f} s, {p['tokens_per_second']:.1f} tokens/s",
                  f"identical tokens     {same}",
                  f"speedup              {result['speedup']:.2f}x"]
    return "\n".join(lines)


# Below this share of drafts kept, sampling with argmax drafts is likely slower than plain sampling.
ARGMAX_KEPT_HINT = 0.3


def drafting_hint(result: dict) -> str | None:
    """Sampling with argmax drafts that are rarely kept: the line that points at --drafting sample."""
    sampling, s = result["sampling"], result["stats"]
    if sampling["temperature"] == 0 or sampling.get("drafting") != "argmax" or not s["drafted"]:
        return None
    if s["acceptance_rate"] >= ARGMAX_KEPT_HINT:
        return None
    return (f"hint                 argmax drafts were kept {s['acceptance_rate']:.0%} of the time: a sampled token "
            f"equals the drafter's argmax only so often. --drafting sample draws the drafts and keeps them by the "
            f"rejection rule: exact in distribution too, and kept more often (its draws differ from plain sampling's)")


def gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def first_difference(result: dict) -> int:
    a, b = result["tokens"], result["plain"]["tokens"]
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def k_line(s: dict) -> str:
    """The K of every round, as a histogram, and the time spent at K = 0 (plain decode steps)."""
    histogram = "  ".join(f"K={k}: {n}" for k, n in s["draft_lengths"].items()) or "-"
    at_zero = s["seconds_at_k0"] / s["seconds"] if s["seconds"] else 0.0
    rounds = sum(s["draft_lengths"].values())
    return f"{histogram} round{'' if rounds == 1 else 's'}; {at_zero:.0%} of the time at K = 0"


def estimates_line(e: dict) -> str:
    alpha = " ".join(f"{a:.2f}" for a in e["alpha"])
    rounds = "/".join(f"{e['round_s'][k] * 1e3:.1f}" for k in sorted(e["round_s"]))
    return f"acceptance by position {alpha}; ms a round of K = 0..{len(e['round_s']) - 1} drafts {rounds}"
