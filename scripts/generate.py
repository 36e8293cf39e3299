"""Generate text with a Gemma 4 target and its MTP assistant: `python scripts/generate.py --help`.

- With no arguments it runs the bundled demo pair (`scripts/demo/`) offline, marks which tokens the
  drafter proposed, and compares with plain greedy decoding: the mechanism made visible.
- Decoding is greedy by default, so speculative output is the target's own greedy output (exactly so
  in float32; see README.md for bfloat16). `--temperature T` samples; with the default `argmax`
  drafting the output is then plain sampling's with the same `--seed`, token for token.
- Whatever the user can get wrong ends as one line `error: ...` on stderr and exit status 2, never a
  traceback; Ctrl-C prints what was generated so far and exits 130.
- `--json` prints one JSON object on stdout and nothing else there; progress goes to stderr.
"""

import argparse
import json
import sys
import time
from pathlib import Path
from typing import NoReturn

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # so that a checkout runs without `pip install -e .` too
sys.path.insert(0, str(REPO / "scripts"))  # its helper modules

import torch  # noqa: E402

from _batch import run_batch, split_prompts  # noqa: E402
from _stream import Stream  # noqa: E402
from gemma4.config import read_json  # noqa: E402
from gemma4.generate import check_prompt, sample_generate  # noqa: E402
from gemma4.sampling import SamplerConfig  # noqa: E402
from gemma4.tokenizer import Gemma4Tokenizer, stop_ids  # noqa: E402
from gemma4.weights import load_target, resolve_model_dir  # noqa: E402
from mtp import SCHEDULES, DraftLength, SpecStats, check_pair, load_drafter, speculative_generate  # noqa: E402
from mtp.speculative import DRAFTING  # noqa: E402

DEMO = REPO / "scripts" / "demo"  # holds target/ and assistant/
DEFAULT_PROMPT = "Tell me a story about a fox."
# The demo target is a model of Python source, not a chat model: it continues raw code.
DEMO_PROMPT = '    def __repr__(self):\n        return "'
# Greedy decoding of the demo prompt falls into a loop of repeated lines within 128 tokens (the tiny
# target's most likely continuation), so the no-argument demo samples instead, with a fixed seed.
DEMO_SAMPLING = dict(temperature=0.5, top_k=64, top_p=0.95, seed=0)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
USAGE_ERROR, INTERRUPTED = 2, 130


class UsageError(ValueError):
    """Something on the command line that cannot run; its message says what to change."""


# ---------------------------------------------------------------- decoding

def stats_json(stats: SpecStats | None, tokens: list[int], seconds: float) -> dict:
    """The `stats` object; plain decoding runs one target forward per token and drafts nothing."""
    forwards = stats.target_forwards if stats else len(tokens)
    return {
        "target_forwards": forwards,
        "drafted": stats.drafted if stats else 0,
        "accepted": stats.accepted if stats else 0,
        "acceptance_rate": stats.acceptance_rate if stats else 0.0,
        "tokens_per_forward": len(tokens) / forwards if forwards else 0.0,
        "seconds": seconds,
        "tokens_per_second": len(tokens) / seconds if seconds else 0.0,
        "rounds": [{"drafted": r.drafted, "accepted": r.accepted} for r in stats.rounds] if stats else [],
    }


def print_stats(result: dict, stats: SpecStats | None) -> None:
    s = result["stats"]
    plain_kind = "plain greedy" if result["sampling"]["temperature"] == 0 else "plain sampling"
    print(f"\n-- {'speculative' if stats else plain_kind} decoding: {len(result['tokens'])} tokens, "
          f"finished by {result['finish_reason']}")
    if stats:
        print(f"target forwards      {s['target_forwards']} (1 prefill + {s['target_forwards'] - 1} verifications; "
              f"plain decoding needs {len(result['tokens'])})")
        print(f"tokens per forward   {s['tokens_per_forward']:.2f}")
        print(f"drafted, accepted    {s['drafted']}, {s['accepted']}: acceptance rate {s['acceptance_rate']:.1%}")
        by_position = "  ".join(f"{i + 1}: {p:.0%}" for i, p in enumerate(stats.per_position_acceptance))
        print(f"accepted by position {by_position or '-'}")
    else:
        print(f"target forwards      {s['target_forwards']} (one per token)")
    print(f"time                 {s['seconds']:.2f} s, {s['tokens_per_second']:.1f} tokens/s")
    if "plain" in result:
        p = result["plain"]
        print(f"-- {plain_kind} decoding (--compare): {p['seconds']:.2f} s, {p['tokens_per_second']:.1f} tokens/s")
        same = "yes" if result["identical"] else f"no: first difference at new token {first_difference(result)}"
        if not result["identical_expected"]:
            same += " (sample drafting: exact in distribution, its draws differ from plain sampling's by design)"
        print(f"identical tokens     {same}")
        print(f"speedup              {result['speedup']:.2f}x")


def first_difference(result: dict) -> int:
    a, b = result["tokens"], result["plain"]["tokens"]
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


# ---------------------------------------------------------------- checks before any work

def pick_device(name: str | None) -> torch.device:
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    hint = "use --device cpu" + (" or cuda" if torch.cuda.is_available() else "")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f"{name!r} is not a device name like cpu, cuda or cuda:1: {hint}") from None
    if device.type == "meta":
        raise UsageError(f"device {name!r} holds no data: {hint}")
    try:
        torch.empty(1, device=device)  # the cheapest proof that the device is there
    except (RuntimeError, AssertionError, NotImplementedError) as e:  # torch's ways of saying "not here"
        reason = str(e).splitlines()[0][:100] if str(e) else type(e).__name__
        raise UsageError(f"device {name!r} is not available here ({reason}): {hint}") from None
    return device


def check_options(prompt: str | None, prompt_ids: list[int] | None, raw: bool, max_new_tokens: int,
                  num_assistant_tokens: int | None, schedule: str, dtype: str | None,
                  temperature: float, top_k: int | None, top_p: float | None, drafting: str | None,
                  no_assistant: bool) -> None:
    if prompt is not None and prompt_ids is not None:
        raise UsageError("give --prompt or --prompt-ids, not both")
    if raw and prompt is None:
        raise UsageError("--raw applies to --prompt text; --prompt-ids are always sent as they are")
    if (prompt is not None and not prompt.strip()) or prompt_ids == []:
        raise UsageError("the prompt is empty: give some text with --prompt or token ids with --prompt-ids")
    if max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
    if num_assistant_tokens is not None and num_assistant_tokens < 1:
        raise UsageError(f"--num-assistant-tokens must be at least 1, got {num_assistant_tokens}; "
                         f"for plain decoding use --no-assistant")
    if schedule not in SCHEDULES:
        raise UsageError(f"--schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if dtype is not None and dtype not in DTYPES:
        raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if not temperature >= 0:
        raise UsageError(f"--temperature must be at least 0 (0 is greedy), got {temperature}")
    if top_k is not None and top_k < 0:
        raise UsageError(f"--top-k must be at least 0 (0 turns it off), got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise UsageError(f"--top-p must be in (0, 1] (1 turns it off), got {top_p}")
    if drafting is not None and drafting not in DRAFTING:
        raise UsageError(f"--drafting must be one of {', '.join(DRAFTING)}, got {drafting!r}")
    if drafting == "sample" and temperature == 0:
        raise UsageError("--drafting sample draws drafts from the drafter's distribution: give a --temperature above 0")
    if drafting is not None and no_assistant:
        raise UsageError("--drafting applies to speculative decoding: drop it, or drop --no-assistant")


def sampler_settings(target_dir: Path, temperature: float, top_k: int | None, top_p: float | None,
                     seed: int) -> tuple[SamplerConfig, str]:
    """The sampler, and where its top-k/top-p came from: the flags, or else (with T > 0) the target's
    generation_config.json, as the releases ship them (T 1.0, top_k 64, top_p 0.95)."""
    if temperature == 0:
        return SamplerConfig(0.0, 0, 1.0, seed), ""
    gen = target_dir / "generation_config.json"
    release = read_json(gen) if gen.is_file() else {}
    taken = [name for name, flag in (("top_k", top_k), ("top_p", top_p)) if flag is None and name in release]
    top_k = int(release.get("top_k", 0)) if top_k is None else top_k
    top_p = float(release.get("top_p", 1.0)) if top_p is None else top_p
    return SamplerConfig(temperature, top_k, top_p, seed), " (" + ", ".join(taken) + " from generation_config.json)" if taken else ""


def say(quiet: bool, text: str) -> None:
    if not quiet:
        print(text, file=sys.stderr)


# ---------------------------------------------------------------- main

def main(
    target: str | None = None, assistant: str | None = None, no_assistant: bool = False,
    prompt: str | None = None, prompt_ids: list[int] | None = None, raw: bool = False,
    max_new_tokens: int = 128, num_assistant_tokens: int | None = None, schedule: str = "constant",
    ignore_eos: bool = False, dtype: str | None = None, device: str | None = None, seed: int = 0,
    temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None, drafting: str | None = None,
    threads: int | None = None,
    show_drafts: bool = False, compare: bool = False, json_output: bool = False, demo: Path = DEMO,
    batch: list[str] | list[list[int]] | None = None,
) -> int:
    """Run one generation and print it; returns the exit status (0, or 130 after Ctrl-C).
    `batch`: several prompts (texts or id lists), decoded as one batch (scripts/_batch.py)."""
    if batch:  # the first row goes through every check of a single prompt
        prompt, prompt_ids = (batch[0], None) if isinstance(batch[0], str) else (None, batch[0])
    check_options(prompt, prompt_ids, raw, max_new_tokens, num_assistant_tokens, schedule, dtype,
                  temperature, top_k, top_p, drafting, no_assistant)
    if threads is not None and threads < 1:
        raise UsageError(f"--threads must be at least 1, got {threads}")
    if seed < 0:
        raise UsageError(f"--seed must be at least 0, got {seed}")
    drafting = drafting or "argmax"
    dev = pick_device(device)
    dtype = dtype or ("bfloat16" if dev.type == "cuda" else "float32")
    if target is None:  # the bundled demo pair
        if not (demo / "target").is_dir():
            raise UsageError(f"the demo pair is missing from {demo}: restore it from git, or pass --target")
        target, assistant = str(demo / "target"), assistant or str(demo / "assistant")
        if prompt is None and prompt_ids is None:
            prompt, raw = DEMO_PROMPT, True
        # Its matrices are 64 wide: a second thread only adds synchronisation, and on a busy machine
        # it makes every step wait for the slower core.
        threads = threads or 1
    if prompt is None and prompt_ids is None:
        prompt = DEFAULT_PROMPT
    if threads is not None:
        torch.set_num_threads(threads)

    # Target, tokenizer and prompt first: a bad prompt fails before the assistant is fetched.
    say(json_output, f"target     {target} ({dtype} on {dev})")
    target_dir = resolve_model_dir(target)  # a Hub id is downloaded here
    model = load_target(target_dir, DTYPES[dtype], dev)
    tokenizer = Gemma4Tokenizer(target_dir / "tokenizer.json") if (target_dir / "tokenizer.json").is_file() else None
    # 26B-A4B and 31B render an empty thought block after the model turn, E2B and E4B do not
    # (spec gemma4.md §5). Only E2B/E4B have Per-Layer Embeddings, and their hidden size is at
    # most 2560; the larger two have no PLE and hidden 2816 / 5376.
    empty_thought = not model.config.ple_dim and model.config.hidden_size > 2560

    def encode(text: str) -> list[int]:
        if tokenizer is None:
            raise UsageError(f"{target_dir} has no tokenizer.json to encode --prompt: add it, or give --prompt-ids")
        return tokenizer.encode_raw(text) if raw else tokenizer.encode_chat(text, empty_thought)

    if prompt_ids is None:
        prompt_ids = encode(prompt)
    check_prompt(model, prompt_ids, max_new_tokens)
    stops = [] if ignore_eos else stop_ids(target_dir)
    how = "raw" if raw else "as given" if prompt is None else "chat template"
    say(json_output, f"prompt     {len(prompt_ids)} tokens ({how})" + (f", the first of {len(batch)} rows" if batch else ""))
    sampler, source = sampler_settings(target_dir, temperature, top_k, top_p, seed)
    if not sampler.greedy:
        say(json_output, f"sampling   temperature {sampler.temperature:g}, top-k {sampler.top_k}, top-p {sampler.top_p:g}"
                         f"{source}, seed {seed}" + ("" if no_assistant else f", {drafting} drafting"))

    drafter, draft_length = None, None
    if not no_assistant:
        named = assistant is not None
        assistant = assistant or target.rstrip("/") + "-assistant"  # official pairs: google/gemma-4-E2B-it(-assistant)
        try:
            assistant_dir = resolve_model_dir(assistant)
        except ValueError as e:
            if named:
                raise
            raise UsageError(f"{e} (the assistant defaults to the target's id + '-assistant': "
                             f"pass --assistant, or --no-assistant for plain decoding)") from None
        drafter = load_drafter(assistant_dir, DTYPES[dtype], dev)
        check_pair(model.config, drafter.config, target, assistant)
        if num_assistant_tokens is None:  # the release's own choice, as transformers reads it
            gen = assistant_dir / "generation_config.json"
            num_assistant_tokens = int(read_json(gen).get("num_assistant_tokens", 4)) if gen.is_file() else 4
        draft_length = DraftLength(num_assistant_tokens, schedule)
        say(json_output, f"assistant  {assistant} ({num_assistant_tokens} drafts per round, {schedule} schedule)")
    if batch:
        sampling = lambda row_seed: {"temperature": sampler.temperature, "top_k": sampler.top_k,  # noqa: E731
                                     "top_p": sampler.top_p, "seed": row_seed, "drafting": drafter and drafting}
        rows = [encode(p) if isinstance(p, str) else p for p in batch]
        result, text = run_batch(model, drafter, draft_length, rows, max_new_tokens, stops, sampler, drafting,
                                 tokenizer, json_output, compare, show_drafts, stats_json, sampling)
        print(json.dumps(result) if json_output else text)
        return 0
    if show_drafts and not json_output:
        style = "green" if sys.stdout.isatty() else "[bracketed]"
        say(False, f"{style} text was proposed by the drafter and accepted; the rest the target supplied\n")

    # One tiny forward first, so one-time start-up costs are not timed (nor charged to either side of --compare).
    with torch.inference_mode():
        model.run(torch.tensor([prompt_ids[:1]], device=dev))
    stream = Stream(tokenizer, echo=not json_output, mark=show_drafts, colour=sys.stdout.isatty())
    start = time.perf_counter()
    try:
        if drafter is not None:
            spec = speculative_generate(model, drafter, prompt_ids, max_new_tokens, draft_length, stops,
                                        sampler, drafting, on_commit=stream.commit)
            tokens, stats, finish_reason = spec.tokens, spec.stats, spec.finish_reason
        else:
            tokens = sample_generate(model, prompt_ids, max_new_tokens, sampler, stops,
                                     on_token=lambda t: stream.commit([t], [False]))
            stats, finish_reason = None, "stop" if tokens[-1] in stops else "length"
    except KeyboardInterrupt:
        stream.finish()
        if json_output:
            partial = {"tokens": stream.tokens, "text": stream.text(), "finish_reason": "interrupted", "stats": None}
            print(json.dumps(partial))
        print(f"interrupted after {len(stream.tokens)} new tokens", file=sys.stderr)
        return INTERRUPTED
    seconds = time.perf_counter() - start
    stream.finish()
    result = {"tokens": tokens, "text": stream.text(), "finish_reason": finish_reason,
              "stats": stats_json(stats, tokens, seconds),
              "sampling": {"temperature": sampler.temperature, "top_k": sampler.top_k, "top_p": sampler.top_p,
                           "seed": seed, "drafting": None if drafter is None else drafting}}

    status = 0
    if compare:
        say(json_output, f"running plain {'greedy decoding' if sampler.greedy else 'sampling, same seed,'} for --compare ...")
        start = time.perf_counter()
        try:
            plain = sample_generate(model, prompt_ids, max_new_tokens, sampler, stops)
            plain_seconds = time.perf_counter() - start
            plain_rate = len(plain) / plain_seconds if plain_seconds else 0.0
            result["plain"] = {"tokens": plain, "seconds": plain_seconds, "tokens_per_second": plain_rate}
            result["identical"] = plain == tokens
            # Greedy and argmax drafting reproduce plain decoding exactly; sample drafting draws otherwise.
            result["identical_expected"] = sampler.greedy or drafter is None or drafting == "argmax"
            result["speedup"] = result["stats"]["tokens_per_second"] / plain_rate if plain_rate else 0.0
        except KeyboardInterrupt:
            print("interrupted: --compare skipped", file=sys.stderr)
            status = INTERRUPTED

    if json_output:
        print(json.dumps(result))
    else:
        print_stats(result, stats)
    return status


# ---------------------------------------------------------------- command line

class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not argparse's usage block
        print(f"error: {message} (see --help)", file=sys.stderr)
        sys.exit(USAGE_ERROR)


def token_ids(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 2,105,2364, got {text!r}") from None


def parser() -> Parser:
    p = Parser(prog="generate.py", description="Generation with a Gemma 4 target and its MTP assistant, greedy "
               "or sampled. With no arguments: the bundled demo pair, sampled at a fixed seed, with --show-drafts "
               "and --compare.")
    p.add_argument("--target", metavar="PATH_OR_HUB_ID",
                   help="checkpoint directory or Hub id like google/gemma-4-E2B-it (default: the demo)")
    p.add_argument("--assistant", metavar="PATH_OR_HUB_ID",
                   help="checkpoint directory or Hub id (default: the target's id + '-assistant')")
    p.add_argument("--no-assistant", action="store_true", help="plain greedy decoding, no drafter")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--prompt", metavar="TEXT", action="append",
                        help="user text, rendered with the chat template (default: a short story request); "
                             "several: one batch, a row each")
    source.add_argument("--prompt-ids", metavar="IDS", type=token_ids, action="append",
                        help="exact token ids, e.g. 2,105,2364; nothing is added; several: a row each")
    p.add_argument("--prompts-file", metavar="FILE", help="one text prompt per line, a row each (with --prompt: after it)")
    p.add_argument("--raw", action="store_true", help="send --prompt as it is, after one <bos>, without the template")
    p.add_argument("--max-new-tokens", metavar="N", type=int, default=128)
    p.add_argument("--num-assistant-tokens", metavar="K", type=int,
                   help="drafts per round (default: the assistant's generation_config.json, else 4)")
    p.add_argument("--schedule", choices=SCHEDULES, default="constant", help="how the number of drafts adapts")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop on the end-of-turn ids")
    p.add_argument("--dtype", choices=list(DTYPES), help="default: float32 on CPU, bfloat16 on CUDA")
    p.add_argument("--device", metavar="DEVICE", help="cpu, cuda, cuda:1, ... (default: cuda if there is one)")
    p.add_argument("--temperature", metavar="T", type=float, default=0.0,
                   help="0 (default): greedy; above 0: sample, exactly from the target's distribution")
    p.add_argument("--top-k", metavar="K", type=int,
                   help="sample among the K most likely tokens, 0: off (default with --temperature: the target's "
                        "generation_config.json, else off)")
    p.add_argument("--top-p", metavar="P", type=float,
                   help="sample among the most likely tokens that hold probability P, 1: off (default as --top-k)")
    p.add_argument("--seed", metavar="N", type=int, default=0,
                   help="sampling seed: the token at position n draws noise keyed by (seed, n) (default 0)")
    p.add_argument("--drafting", choices=DRAFTING,
                   help="argmax (default): drafts are the drafter's argmax, output equals plain sampling token for "
                        "token; sample: drafts drawn from the drafter, Leviathan's rejection rule, exact in distribution")
    p.add_argument("--threads", metavar="N", type=int,
                   help="CPU threads for torch (default: torch's own; 1 for the demo pair, whose tiny matrices gain nothing from more)")
    p.add_argument("--show-drafts", action="store_true", help="mark the tokens the drafter proposed")
    p.add_argument("--compare", action="store_true",
                   help="also run plain decoding (sampling: the same seed): identical? how much faster?")
    p.add_argument("--json", dest="json_output", action="store_true", help="print one JSON object and nothing else")
    return p


def cli(argv: list[str] | None = None, demo: Path = DEMO) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = vars(parser().parse_args(argv))
    if not argv:  # the demo: show the mechanism
        args.update(show_drafts=True, compare=True, **DEMO_SAMPLING)
    try:
        return main(**split_prompts(args), demo=demo)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return INTERRUPTED
    except torch.OutOfMemoryError:
        print("error: out of memory: try --dtype bfloat16, a smaller model, or another --device", file=sys.stderr)
        return USAGE_ERROR
    except (ValueError, OSError) as e:  # the library's CheckpointError / ConfigError are ValueErrors
        print("error: " + " ".join(str(e).split()), file=sys.stderr)  # one line, whatever the message holds
        return USAGE_ERROR


if __name__ == "__main__":
    sys.exit(cli())
