"""Measure a target/assistant pair on held-out text: acceptance per temperature, both drafting modes, speed.

    python scripts/measure_pair.py                      # the demo pair: 6 held-out prompts x 2 seeds, K = 4
    python scripts/measure_pair.py --assistant /tmp/old-assistant --json /tmp/old.json

- Prompts are `<bos>` + 48 tokens taken at evenly spaced points of the held-out files (the same split
  as training, see `training/common.py`), so neither model saw them.
- Rows: greedy, then each `--temperatures` value with the product's sampler (top-k, top-p). Columns:
  argmax drafting (the drafter's argmax, kept while it equals the target's keyed sample: the output is
  plain sampling's, token for token) and sample drafting (drafts drawn from the drafter's warped q,
  rejection rule: exact in distribution, other tokens by design). Greedy has only the first.
- Each cell: acceptance (accepted / drafted drafts, `SpecStats`, summed over prompts and seeds, no stop
  ids so every run drafts the same number of rounds), tokens per target forward, and the speedup: the
  plain loop's seconds (greedy, or sampling with the same seed) over the speculative loop's, summed
  over the runs; the runs alternate plain, argmax, sample per prompt after one warm-up run.
  Wall-clock times on a shared machine are noisy: run it while nothing else runs.
- The argmax ceiling: argmax drafting keeps a draft with probability p(argmax q) <= max p, so even
  q = p reaches at most the target's mean max p over the warped rows of the plain sampled text; the
  acceptance rate that would give at K drafts (a draft after a rejection counts as drafted) is
  mean over positions n of (1/K) sum_j prod_{i<j} m[n+i], m the max p along the text.
"""

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer

from gemma4 import Gemma4Model, SamplerConfig, greedy_generate, load_target, sample_generate
from gemma4.engine.sampling import warp
from mtp import DraftLength, Drafter, SpecStats, load_drafter, speculative_generate
from gemma4.engine.forward import forward_rows
from training.common import corpus_files, held_out_prompts, read_texts, token_stream

PROMPT_TOKENS = 48


@dataclass
class Cell:
    """One drafting mode at one setting, summed over prompts and seeds."""
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    target_forwards: int = 0
    seconds: float = 0.0
    plain_seconds: float = 0.0
    identical: int = 0  # runs whose tokens equal the plain run's
    runs: int = 0

    def add(self, stats: SpecStats, seconds: float, plain_seconds: float, same: bool) -> None:
        self.drafted += stats.drafted
        self.accepted += stats.accepted
        self.emitted += stats.emitted
        self.target_forwards += stats.target_forwards
        self.seconds += seconds
        self.plain_seconds += plain_seconds
        self.identical += same
        self.runs += 1

    @property
    def acceptance(self) -> float:
        return self.accepted / max(1, self.drafted)

    @property
    def per_forward(self) -> float:
        return self.emitted / max(1, self.target_forwards)

    @property
    def speedup(self) -> float:
        return self.plain_seconds / max(1e-9, self.seconds)


@dataclass
class Row:
    setting: str  # "greedy" or "T 0.7"
    max_p: float  # the target's mean max p over the plain text's warped rows (1 for greedy)
    ceiling: float  # the argmax-drafting acceptance rate a drafter with q = p would reach at K
    argmax: Cell
    sample: Cell | None  # greedy has no sample drafting


@torch.inference_mode()
def max_p_along(target: Gemma4Model, prompt: list[int], new: list[int], sampler: SamplerConfig) -> list[float]:
    """The warped target's max p at each generated position of prompt + new (teacher-forced)."""
    logits = forward_rows(target, torch.tensor([prompt + new[:-1]])).logits[0, len(prompt) - 1:]  # (G, V): the rows that drew `new`
    return warp(logits, sampler).max(dim=-1).values.tolist()


def chain_rate(m: list[float], k: int) -> float:
    """Mean over start positions of (1/k) sum_{j=1..k} prod_{i<j} m[n+i]: the acceptance rate at k."""
    rates = []
    for n in range(len(m) - k + 1):
        product, total = 1.0, 0.0
        for i in range(k):
            product *= m[n + i]
            total += product
        rates.append(total / k)
    return sum(rates) / max(1, len(rates))


def timed(fn, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN201 (any generate function)
    t0 = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - t0


def measure(target: Gemma4Model, drafter: Drafter, prompts: list[list[int]], temperature: float, seeds: int,
            k: int, new_tokens: int, top_k: int, top_p: float) -> Row:
    """One row of the table: temperature 0 is greedy (one run per prompt, seeds do not matter)."""
    greedy = temperature == 0
    argmax, sample = Cell(), None if greedy else Cell()
    max_ps, ceilings = [], []
    for prompt in prompts:
        for seed in range(1 if greedy else seeds):
            sampler = None if greedy else SamplerConfig(temperature, top_k, top_p, seed)
            if greedy:
                plain, plain_s = timed(greedy_generate, target, prompt, new_tokens)
            else:
                plain, plain_s = timed(sample_generate, target, prompt, new_tokens, sampler)
                m = max_p_along(target, prompt, plain, sampler)
                max_ps += m
                ceilings.append(chain_rate(m, k))
            spec, s = timed(speculative_generate, target, drafter, prompt, new_tokens, DraftLength(k), sampler=sampler)
            argmax.add(spec.stats, s, plain_s, spec.tokens == plain)
            if sample is not None:
                spec, s = timed(speculative_generate, target, drafter, prompt, new_tokens, DraftLength(k),
                                sampler=sampler, drafting="sample")
                sample.add(spec.stats, s, plain_s, spec.tokens == plain)
    if greedy:
        return Row("greedy", 1.0, 1.0, argmax, None)
    return Row(f"T {temperature:g}", sum(max_ps) / len(max_ps), sum(ceilings) / len(ceilings), argmax, sample)


def held_out(tokenizer: Tokenizer, count: int) -> list[list[int]]:
    _, held_files = corpus_files()
    return held_out_prompts(token_stream(tokenizer, read_texts(held_files)), count, PROMPT_TOKENS)


def table(rows: list[Row]) -> str:
    lines = ["| setting | argmax ceiling: mean max p, rate | argmax: acceptance, tokens/forward, speedup, "
             "identical | sample: acceptance, tokens/forward, speedup |", "|---|---|---|---|"]
    for r in rows:
        a = f"{r.argmax.acceptance:.2f}, {r.argmax.per_forward:.2f}, {r.argmax.speedup:.2f}x, " \
            f"{r.argmax.identical}/{r.argmax.runs}"
        s = "-" if r.sample is None else \
            f"{r.sample.acceptance:.2f}, {r.sample.per_forward:.2f}, {r.sample.speedup:.2f}x"
        lines.append(f"| {r.setting} | {r.max_p:.2f}, {r.ceiling:.2f} | {a} | {s} |")
    return "\n".join(lines)


def main(*, target_dir: Path, assistant_dir: Path, prompts: int, seeds: int, temperatures: list[float], k: int,
         new_tokens: int, top_k: int, top_p: float, threads: int, json_path: Path | None) -> None:
    torch.set_num_threads(threads)
    tokenizer = Tokenizer.from_file(str(target_dir / "tokenizer.json"))
    held = held_out(tokenizer, prompts)
    target, drafter = load_target(target_dir, fast=True), load_drafter(assistant_dir, fast=True)
    greedy_generate(target, held[0], 8)  # warm-up: the first calls of a process are slower
    speculative_generate(target, drafter, held[0], 8, DraftLength(k))
    rows = []
    for temperature in [0.0] + temperatures:
        rows.append(measure(target, drafter, held, temperature, seeds=seeds, k=k, new_tokens=new_tokens, top_k=top_k,
                            top_p=top_p))
        print(f"  {rows[-1].setting}: done", file=sys.stderr, flush=True)
    print(f"{assistant_dir} on {target_dir}: K = {k}, {prompts} held-out prompts x {seeds} seeds (greedy: x 1), "
          f"{new_tokens} new tokens, top-k {top_k}, top-p {top_p}, {threads} thread(s)")
    print(table(rows))
    if json_path:
        json_path.write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")


if __name__ == "__main__":
    demo = Path(__file__).parent / "demo"
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--target", type=Path, default=demo / "target", help="target checkpoint directory")
    p.add_argument("--assistant", type=Path, default=demo / "assistant", help="assistant checkpoint directory")
    p.add_argument("--prompts", type=int, default=6, help="held-out prompts")
    p.add_argument("--seeds", type=int, default=2, help="sampling seeds per prompt")
    p.add_argument("--temperatures", default="0.5,0.7,1.0", help="sampled rows (a greedy row always comes first)")
    p.add_argument("-k", type=int, default=4, help="draft length")
    p.add_argument("--new-tokens", type=int, default=96)
    p.add_argument("--top-k", type=int, default=64)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--threads", type=int, default=1, help="1 is fastest for a model this small")
    p.add_argument("--json", type=Path, default=None, help="also write the rows to this file")
    a = p.parse_args()
    main(target_dir=a.target, assistant_dir=a.assistant, prompts=a.prompts, seeds=a.seeds,
         temperatures=[float(t) for t in a.temperatures.split(",")], k=a.k, new_tokens=a.new_tokens, top_k=a.top_k,
         top_p=a.top_p, threads=a.threads, json_path=a.json)
