"""scripts/generate.py with several prompts: one batch, every row its own run (mtp/README.md §12).

- `--prompt` and `--prompt-ids` may be given several times, one row each, and `--prompts-file FILE`
  (`-`: stdin) adds text prompts: one per line, or the blocks between lines holding only `---`, which
  may span lines. One prompt in all runs exactly as a single prompt; several run as one batch
  (gemma4/engine/decode.py `decode`, mtp/engine/batch.py) and each row's text is printed on stdout after a line `== row i: ...`;
  the totals go to stderr.
- With sampling, row i uses seed + i: `--seed` + i reproduces that row alone.
- `--json` prints {"rows": [the one-prompt object of each row], "stats": {batch totals}}. A row's
  `seconds` is the batch's wall time (its rows run together); the totals' `tokens_per_second` is all
  rows' new tokens over that time.
- `--compare` runs the same prompts one after another, each alone: identical tokens? how much faster?
  The totals then hold `sequential` ({seconds, tokens_per_second} of that run), `identical` (every
  row's tokens equal its run alone) and `speedup` (sequential seconds / batch seconds).
"""

import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cli.clock import RoundClock
from cli.options import UsageError
from gemma4.engine import decode
from gemma4.parallel.group import world_size
from gemma4.model import Gemma4Model
from gemma4.sampling import SamplerConfig
from gemma4.tokenizer import Gemma4Tokenizer
from mtp import Drafter
from mtp.schedule import Schedule
from mtp.engine.batch import speculative_generate_batch
from gemma4.engine import generate_one
from mtp.engine import speculative_one


SEPARATOR = "---"  # a line holding only this separates prompts that span lines


def read_prompts(path: str) -> list[str]:
    """The text prompts of a file (`-`: stdin): the whole file is one prompt, its lines joined by newlines; when
    some line holds only `---`, the blocks between such lines are one prompt each (a batch is asked for, never
    guessed from wrapped lines). Blank lines at the end are ignored; an empty prompt is a mistake, not a prompt."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = getattr(e, "strerror", None) or type(e).__name__
        raise UsageError(f"cannot read --prompts-file {path} ({reason}): give a readable UTF-8 text file") from None
    lines = text.splitlines()
    blocks_mode = SEPARATOR in (line.strip() for line in lines)
    while lines and lines[-1].strip() in ("", SEPARATOR):  # blank lines and a closing separator at the end
        lines.pop()
    if not "\n".join(lines).strip():
        raise UsageError(f"--prompts-file {path} is empty: write a prompt, or prompts separated by lines holding "
                         f"only {SEPARATOR}")
    if not blocks_mode:
        return ["\n".join(lines)]
    blocks, current, first = [], [], 1
    for i, line in enumerate([*lines, SEPARATOR], 1):
        if line.strip() != SEPARATOR:
            current.append(line)
            continue
        if i == 1:  # a file may open with a separator
            first = 2
            continue
        if not "\n".join(current).strip():
            raise UsageError(f"the prompt at line {first} of --prompts-file {path} is empty: write text "
                             f"between the {SEPARATOR} lines")
        blocks.append("\n".join(current))
        current, first = [], i + 1
    return blocks


def split_prompts(texts: list[str] | None, ids: list[list[int]] | None, file: str | None,
                  note: Callable[[str], None]) -> tuple[str | None, list[int] | None, list | None]:
    """(prompt, prompt_ids, batch): one prompt as text or ids, or several as a batch; `note` takes the line
    that says how many prompts a file held."""
    texts, ids = list(texts or []), list(ids or [])
    if file is not None:
        if ids:
            raise UsageError("--prompts-file holds text prompts: give --prompt with it, not --prompt-ids")
        if file == "-" and world_size() > 1:  # every rank inherits the one stdin: they would race for its bytes
            raise UsageError("--prompts-file - reads stdin, which every rank under torchrun shares: write the "
                             "prompts to a file and give its path")
        read = read_prompts(file)
        note(f"note: {len(read)} prompt{'s' if len(read) > 1 else ''} read from {file}"
             + ("" if len(read) > 1 else f" (the whole file; lines holding only {SEPARATOR} separate prompts)"))
        texts += read
    rows: list = texts or ids
    if len(rows) > 1:
        for row in rows:
            if (isinstance(row, str) and not row.strip()) or row == []:
                raise UsageError("one of the prompts is empty: give each --prompt some text, each --prompt-ids some ids")
        return None, None, rows
    return (texts[0] if texts else None), (ids[0] if ids else None), None


def run_batch(
    *, model: Gemma4Model, drafter: Drafter | None, draft_length: Schedule | None, rows: list[list[int]],
    budgets: list[int], stops: list[int], sampler: SamplerConfig, drafting: str,
    tokenizer: Gemma4Tokenizer | None, json_output: bool, compare: bool,
    row_stats: Callable[..., dict], sampling_json: Callable[[int], dict], prefill_chunk: int | None = None,
) -> tuple[dict, str, str]:
    """Decode the rows as one batch, row i with budgets[i] new tokens at most; returns the --json object, and
    otherwise the rows' text (stdout) and the totals (stderr). --show-drafts with several prompts is refused before (scripts/generate.py)."""
    samplers = [dataclasses.replace(sampler, seed=sampler.seed + i) for i in range(len(rows))]  # row i: seed + i
    clocks = [RoundClock() for _ in rows]  # row i's rounds' seconds

    def batch() -> list[tuple[list[int], Any, str]]:
        if drafter is not None:
            out = speculative_generate_batch(model, drafter, rows, budgets, draft_length, stops, samplers,
                                             drafting, prefill_chunk,
                                             on_commit=lambda b, tokens, flags: clocks[b](tokens, flags))
            return [(r.tokens, r.stats, r.finish_reason) for r in out]
        return [(row.tokens, None, row.finish_reason)
                for row in decode(model, rows, budgets, samplers, stops, prefill_chunk=prefill_chunk)]

    def one_after_another() -> list[list[int]]:
        if drafter is not None:
            return [speculative_one(model, drafter, ids, n, draft_length, stops, s, drafting,
                                         prefill_chunk=prefill_chunk).tokens for ids, n, s in zip(rows, budgets, samplers)]
        return [generate_one(model, ids, n, s, stops, prefill_chunk=prefill_chunk)
                for ids, n, s in zip(rows, budgets, samplers)]

    start = time.perf_counter()
    results = batch()
    seconds = time.perf_counter() - start
    text = (lambda tokens: None) if tokenizer is None else (lambda tokens: tokenizer.decode(tokens, skip_special_tokens=True))
    out_rows = [{"tokens": tokens, "text": text(tokens), "finish_reason": reason,
                 "stats": row_stats(stats, tokens, seconds, clock=clocks[i]),
                 "sampling": sampling_json(samplers[i].seed)}
                for i, (tokens, stats, reason) in enumerate(results)]
    new = sum(len(tokens) for tokens, _, _ in results)
    drafted = sum(r["stats"]["drafted"] for r in out_rows)
    accepted = sum(r["stats"]["accepted"] for r in out_rows)
    totals = {"rows": len(rows), "tokens": new,
              # every batched forward holds every row still going, so the last row to finish was in all of them
              "target_forwards": max(r["stats"]["target_forwards"] for r in out_rows),
              "drafted": drafted, "accepted": accepted, "acceptance_rate": accepted / drafted if drafted else 0.0,
              "seconds": seconds, "tokens_per_second": new / seconds if seconds else 0.0}
    if compare:
        if not json_output:  # progress goes to stderr, and --json keeps stderr quiet too
            print("running the same prompts one after another for --compare ...", file=sys.stderr)
        start = time.perf_counter()
        alone = one_after_another()
        solo_seconds = time.perf_counter() - start
        totals["sequential"] = {"seconds": solo_seconds, "tokens_per_second": new / solo_seconds if solo_seconds else 0.0}
        totals["identical"] = alone == [tokens for tokens, _, _ in results]
        totals["speedup"] = solo_seconds / seconds if seconds else 0.0
    return {"rows": out_rows, "stats": totals}, *report(out_rows, totals, drafter is not None)


def report(rows: list[dict], totals: dict, speculative: bool) -> tuple[str, str]:
    """Each row's text after a line naming it; the totals."""
    lines = []
    for i, r in enumerate(rows):
        s = r["stats"]
        rate = f", acceptance {s['acceptance_rate']:.1%}" if speculative else ""
        lines += [f"== row {i}: {len(r['tokens'])} tokens, finished by {r['finish_reason']}{rate}",
                  r["text"] if r["text"] is not None else " ".join(map(str, r["tokens"]))]
    t, kind = totals, "speculative" if speculative else "plain"
    stats = ["", f"-- batch of {t['rows']} rows, {kind} decoding: {t['tokens']} tokens, {t['target_forwards']} "
                 f"batched target forwards",
             f"time                 {t['seconds']:.2f} s, {t['tokens_per_second']:.1f} tokens/s (all rows)"]
    if "sequential" in t:
        q = t["sequential"]
        stats += [f"-- one after another (--compare): {q['seconds']:.2f} s, {q['tokens_per_second']:.1f} tokens/s",
                  f"identical tokens     {'yes' if t['identical'] else 'no'}",
                  f"speedup              {t['speedup']:.2f}x"]
    return "\n".join(lines), "\n".join(stats)
