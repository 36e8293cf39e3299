"""Measure a target/assistant pair on held-out text: acceptance (dense and centroid head) and speed.

    python scripts/measure_pair.py                      # the demo pair, 10 held-out prompts, K = 4

- Prompts are `<bos>` + 48 tokens taken at evenly spaced points of the held-out files (the same split
  as training, see `_training.py`), so neither model saw them.
- Acceptance is `SpecStats.acceptance_rate` of `mtp.speculative_generate` (accepted / drafted drafts),
  summed over the prompts, with no stop ids so every run drafts the same number of rounds.
- Speed: plain `greedy_generate` against `speculative_generate` on the first `--timed` prompts, each
  timed once after a warm-up run; the reported speedup is the median of the per-prompt ratios. The two
  outputs are checked to be the same tokens. Wall-clock times on a shared machine are noisy: run it
  while nothing else runs.
"""

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # so that a checkout runs without `pip install -e .`

import torch  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from _training import corpus_files, held_out_prompts, read_texts, token_stream  # noqa: E402
from gemma4.generate import greedy_generate  # noqa: E402
from gemma4.weights import load_target  # noqa: E402
from mtp import DraftLength, Drafter, SpecStats, load_drafter, speculative_generate  # noqa: E402

PROMPT_TOKENS = 48


def dense_copy(drafter: Drafter) -> Drafter:
    """The same drafter with the dense head: `Drafter` uses the centroid head only if it has one."""
    dense = copy.deepcopy(drafter)
    if hasattr(dense, "masked_embedding"):
        del dense.masked_embedding
    return dense


def acceptance(target_dir: Path, assistant_dir: Path, prompts: list[list[int]], k: int, new_tokens: int,
               device: str = "cpu") -> list[tuple[str, float, float]]:
    """(head, acceptance rate, tokens per target forward) for the centroid head (if any) and the dense head."""
    target = load_target(target_dir, device=device)
    drafter = load_drafter(assistant_dir, device=device)
    heads = [("centroid", drafter)] if hasattr(drafter, "masked_embedding") else []
    results = []
    for name, d in heads + [("dense", dense_copy(drafter))]:
        total = SpecStats()
        for prompt in prompts:
            stats = speculative_generate(target, d, prompt, new_tokens, DraftLength(k)).stats
            total.drafted += stats.drafted
            total.accepted += stats.accepted
            total.emitted += stats.emitted
            total.target_forwards += stats.target_forwards
        results.append((name, total.acceptance_rate, total.tokens_per_forward))
    return results


def speedup(target_dir: Path, assistant_dir: Path, prompts: list[list[int]], k: int, new_tokens: int) -> list[float]:
    """Per prompt: plain seconds / speculative seconds (after one warm-up run of each)."""
    target, drafter = load_target(target_dir), load_drafter(assistant_dir)
    greedy_generate(target, prompts[0], 8)
    speculative_generate(target, drafter, prompts[0], 8, DraftLength(k))
    ratios = []
    for prompt in prompts:
        t0 = time.perf_counter()
        plain = greedy_generate(target, prompt, new_tokens)
        t1 = time.perf_counter()
        spec = speculative_generate(target, drafter, prompt, new_tokens, DraftLength(k)).tokens
        t2 = time.perf_counter()
        if spec != plain:
            raise AssertionError("speculative output differs from plain greedy output")
        ratios.append((t1 - t0) / (t2 - t1))
        print(f"  plain {t1 - t0:.2f}s  speculative {t2 - t1:.2f}s  speedup {ratios[-1]:.2f}x", flush=True)
    return ratios


def main(target_dir: Path, assistant_dir: Path, prompts: int, timed: int, k: int, new_tokens: int,
         threads: int) -> None:
    torch.set_num_threads(threads)
    tokenizer = Tokenizer.from_file(str(target_dir / "tokenizer.json"))
    _, held_files = corpus_files()
    held = held_out_prompts(token_stream(tokenizer, read_texts(held_files)), prompts, PROMPT_TOKENS)
    for head, rate, per_forward in acceptance(target_dir, assistant_dir, held, k, new_tokens):
        print(f"acceptance at K={k}, {head} head: {rate:.3f} ({per_forward:.2f} tokens per target forward)")
    if timed:
        ratios = speedup(target_dir, assistant_dir, held[:timed], k, new_tokens)
        print(f"speculative vs plain: median speedup {statistics.median(ratios):.2f}x over {timed} prompts "
              f"({new_tokens} new tokens, {threads} threads)")


if __name__ == "__main__":
    demo = Path(__file__).parent / "demo"
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", type=Path, default=demo / "target")
    p.add_argument("--assistant", type=Path, default=demo / "assistant")
    p.add_argument("--prompts", type=int, default=10, help="held-out prompts for the acceptance rate")
    p.add_argument("--timed", type=int, default=5, help="prompts timed plain vs speculative (0: skip)")
    p.add_argument("-k", type=int, default=4, help="draft length")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    main(a.target, a.assistant, a.prompts, a.timed, a.k, a.new_tokens, a.threads)
