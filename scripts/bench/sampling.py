"""scripts/benchmark.py's `sampling` section: what a sampled token costs, alone and inside decoding.

- `rows`: warping and drawing one row of random logits (std 3) at V = 4,096 and 262,144, T = 1, with
  top-k 64 / top-p 0.95 (Gemma's generation_config), top-k 0 / top-p 0.95 and top-k 0 / top-p 1:
  ms per row of `gemma4.sampling.sample` ("fast": `candidates` warps only the k largest logits when top-k is
  set), and of the rule on the whole row (`reference_sample`: `warp_row` sorts and soft-maxes the whole row,
  then the keyed noise of every token), with reference / fast, and whether both drew the same tokens (they
  must); and `sample` with every row kept whole (`whole`: `gemma4.fast.sampling.WHOLE_ROWS`, the rule the speed
  layer gives a model on a GPU), with whether it drew the same tokens (the same probabilities to float32
  rounding: almost always).
- `decode`: a random pair at E2B's dimensions in bfloat16 (scripts/bench/random_pair.py; the vocabulary
  is `--sampling-vocab`, the real 262,144 by default, whose pair is the bf16 section's). Tokens/s of
  plain decoding, greedy against sampled (T 1, top-k 64, top-p 0.95); and speculative decoding with
  argmax drafting, as seconds per target forward, sampled / greedy. The random drafter is almost never
  right, so a sampled round draws the verify's rows up to the first mismatch, the first one mostly.
Ratios are medians of per-repetition ratios (neighbours in time), as everywhere in the benchmark.
"""

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.random_pair import random_prompt, write_pair
from gemma4 import greedy_generate, load_target, sample_generate
from gemma4.fast.sampling import WHOLE_ROWS
from gemma4.engine.sampling import TOKEN_STREAM, SamplerConfig, exponential_noise, sample, warp_row
from mtp import DraftLength, load_drafter, speculative_generate
from gemma4.engine.forward import forward_rows

VOCABS = (4096, 262144)
SETTINGS = {"top-k 64, top-p 0.95": (64, 0.95), "top-k 0, top-p 0.95": (0, 0.95), "top-k 0, top-p 1": (0, 1.0)}
GEMMA = SamplerConfig(temperature=1.0, top_k=64, top_p=0.95)  # the releases' generation_config
CALLS = 10  # rows per timed run: one row is too short for the timer

Interleaved = Callable[[dict[str, Callable[[], Any]], int, dict[str, Callable[[], Any]]],
                       tuple[dict[str, list[float]], dict[str, Any]]]


# ---------------------------------------------------------------- the textbook path, for reference / fast


def reference_sample(logits: torch.Tensor, cfg: SamplerConfig, position: int) -> int:
    """The rule on the whole row (`gemma4.engine.sampling.warp_row`: sorted and soft-maxed, top-k or not), the keyed
    noise of every token of the vocabulary."""
    probs = warp_row(logits[0], cfg)  # (V,)
    ids = torch.arange(probs.shape[0], device=probs.device)
    return int((probs.double() / exponential_noise(cfg.seed, TOKEN_STREAM, position, ids)).argmax())


# ---------------------------------------------------------------- the section


def row_costs(reps: int, interleaved: Interleaved, device: str = "cpu") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for v in VOCABS:
        logits = (torch.randn(1, v, generator=torch.Generator().manual_seed(v)) * 3).to(device)  # (1, V)
        for name, (top_k, top_p) in SETTINGS.items():
            cfg = SamplerConfig(1.0, top_k, top_p)
            runs = {"fast": lambda cfg=cfg: [sample(logits, cfg, TOKEN_STREAM, [n])
                                             for n in range(CALLS)],
                    "whole": lambda cfg=cfg: [WHOLE_ROWS.sample(logits, cfg, TOKEN_STREAM, [n])
                                              for n in range(CALLS)],
                    "reference": lambda cfg=cfg: [reference_sample(logits, cfg, n) for n in range(CALLS)]}
            s, outputs = interleaved(runs, reps, runs)
            out[f"V={v}, {name}"] = {
                "fast_ms": 1e3 * statistics.median(s["fast"]) / CALLS,
                "whole_ms": 1e3 * statistics.median(s["whole"]) / CALLS,
                "reference_ms": 1e3 * statistics.median(s["reference"]) / CALLS,
                "reference/fast": statistics.median(o / n for o, n in zip(s["reference"], s["fast"])),
                "same_tokens": outputs["fast"][0] == [[t] for t in outputs["reference"][0]],
                "whole_same_tokens": outputs["fast"][0] == outputs["whole"][0]}
    return out


def decode_costs(pair_root: Path, configs: tuple[dict, dict], tokens: int, reps: int, interleaved: Interleaved,
                 device: str = "cpu") -> dict[str, Any]:
    """configs: the pair's config.json objects (target, assistant), written once under pair_root."""
    t_dir, a_dir = write_pair(pair_root, *configs, torch.bfloat16)
    target = load_target(t_dir, dtype=torch.bfloat16, device=device, fast=True)
    drafter = load_drafter(a_dir, dtype=torch.bfloat16, device=device, fast=True)
    prompt = random_prompt(t_dir, 16)
    forwards: dict[str, int] = {}

    def spec(name: str, sampler: SamplerConfig | None) -> list[int]:
        result = speculative_generate(target, drafter, prompt, tokens, DraftLength(2), sampler=sampler)
        forwards[name] = result.stats.target_forwards
        return result.tokens

    runs: dict[str, Callable[[], Any]] = {
        "plain_greedy": lambda: greedy_generate(target, prompt, tokens),
        "plain_sampled": lambda: sample_generate(target, prompt, tokens, GEMMA),
        "spec_greedy": lambda: spec("spec_greedy", None), "spec_sampled": lambda: spec("spec_sampled", GEMMA)}
    s, _ = interleaved(runs, reps, {name: runs[name] for name in ("plain_greedy", "spec_greedy")})  # pages weights in
    per_forward = {name: [x / forwards[name] for x in s[name]] for name in ("spec_greedy", "spec_sampled")}
    # The choice alone on the model's own logits, against the greedy argmax: on a busy machine the
    # decode ratios above move by more than this difference, which bounds what sampling can cost.
    with torch.inference_mode():
        logits = forward_rows(target, torch.tensor([prompt]), num_logits=1).logits[0]  # (1, V) in the model's dtype
    choice, _ = interleaved({"sampled": lambda: [sample(logits, GEMMA, TOKEN_STREAM, [n]) for n in range(CALLS)],
                             "greedy": lambda: [int(logits[0].argmax()) for _ in range(CALLS)]}, 9, {})
    extra = (statistics.median(choice["sampled"]) - statistics.median(choice["greedy"])) / CALLS  # s per token
    step = statistics.median(s["plain_greedy"]) / tokens
    return {"vocab": configs[0]["vocab_size"], "new_tokens": tokens, "reps": reps, "k": 2,
            "sampler": "T 1, top-k 64, top-p 0.95",
            "tokens_per_s": {name: tokens / statistics.median(x) for name, x in s.items() if name.startswith("plain")},
            "seconds_per_target_forward": {name: statistics.median(x) for name, x in per_forward.items()},
            "target_forwards": forwards, "choice_ms_sampled_minus_greedy": 1e3 * extra,
            "implied plain sampled/greedy tokens/s": step / (step + extra),
            "plain sampled/greedy tokens/s": statistics.median(
                g / p for g, p in zip(s["plain_greedy"], s["plain_sampled"])),
            "spec sampled/greedy s per forward": statistics.median(
                a / b for a, b in zip(per_forward["spec_sampled"], per_forward["spec_greedy"]))}


def sampling_section(pair_root: Path, configs: tuple[dict, dict], tokens: int, decode_reps: int, row_reps: int,
                     interleaved: Interleaved, device: str = "cpu") -> dict[str, Any]:
    return {"rows": row_costs(row_reps, interleaved, device),
            "decode": decode_costs(pair_root, configs, tokens, decode_reps, interleaved, device) if tokens else None}


def sampling_goals(result: dict[str, Any]) -> list[dict[str, Any]]:
    r = result.get("sampling")
    if not r:
        return []
    rows = r["rows"]
    out = [(f"sampling: ms per row, V=262144, {name}", rows[f"V=262144, {name}"]["fast_ms"], limit, False)
           for name, limit in (("top-k 64, top-p 0.95", 0.5), ("top-k 0, top-p 0.95", 3.0), ("top-k 0, top-p 1", 3.0))]
    d = r["decode"]
    if d:
        out += [(f"sampling: e2b bf16 V={d['vocab']} plain, sampled / greedy tokens/s",
                 d["plain sampled/greedy tokens/s"], 0.97, True),
                (f"sampling: e2b bf16 V={d['vocab']} speculative argmax drafting, s per forward sampled / greedy",
                 d["spec sampled/greedy s per forward"], 1.03, False)]
    return [{"goal": g, "value": v, "limit": limit, "at_least": at_least, "met": v >= limit if at_least else v <= limit}
            for g, v, limit, at_least in out]


def sampling_table(result: dict[str, Any]) -> str:
    r = result.get("sampling")
    if not r:
        return ""
    lines = ["", f"== one sampled row (warp + keyed draw), T 1, ms per row, {CALLS} rows per timed run",
             f"   {'row':<34}{'fast':>9}{'whole':>9}{'reference':>11}{'ref/fast':>9}  same tokens (whole)"]
    for name, row in r["rows"].items():
        lines.append(f"   {name:<34}{row['fast_ms']:>9.3f}{row['whole_ms']:>9.3f}{row['reference_ms']:>11.2f}"
                     f"{row['reference/fast']:>8.1f}x  {'yes' if row['same_tokens'] else 'NO'} "
                     f"({'yes' if row['whole_same_tokens'] else 'no'})")
    d = r["decode"]
    if d:
        t, f = d["tokens_per_s"], d["seconds_per_target_forward"]
        lines += ["", f"== E2B dimensions, bfloat16, V = {d['vocab']}: {d['new_tokens']} new tokens, {d['reps']} reps, "
                      f"sampled = {d['sampler']}",
                  f"   plain decode tokens/s       greedy {t['plain_greedy']:.2f}  sampled {t['plain_sampled']:.2f}  "
                  f"sampled/greedy {d['plain sampled/greedy tokens/s']:.3f}",
                  f"   speculative (argmax drafting, K = {d['k']}) s per target forward  "
                  f"greedy {f['spec_greedy']:.3f}  "
                  f"sampled {f['spec_sampled']:.3f}  sampled/greedy {d['spec sampled/greedy s per forward']:.3f}",
                  f"   the choice alone, on the model's logits: sampled - argmax "
                  f"{d['choice_ms_sampled_minus_greedy']:.3f} ms per token, so plain sampled/greedy "
                  f"≈ {d['implied plain sampled/greedy tokens/s']:.4f}"]
    return "\n".join(lines)
