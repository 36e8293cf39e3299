"""Generate text with a Gemma 4 target and its MTP assistant: `python scripts/generate.py --help`.

- With no arguments it runs the bundled demo pair (`scripts/demo/`) offline. The demo is only the
  default `--target`: its own files set its defaults (greedy, no chat template), as a release's files
  set a release's; every flag means the same for every model (scripts/cli/options.py states the rules).
- Decoding follows the target's generation_config.json unless told otherwise: greedy gives the
  target's own greedy output (exactly so in float32; see README.md for bfloat16); sampling with the
  default `argmax` drafting gives plain sampling's output with the same `--seed`, token for token.
- `--image PATH` and `--audio PATH` (repeatable) and `--video-frames DIR` (with `--fps`) put media in the prompt
  of a multimodal target: a chat turn holds its images, video and clips before its text; with `--prompt-ids` one
  boi id marks each image's place, one video id the video's, one boa id each clip's (scripts/cli/media.py).
- stdout carries the generated text and nothing else; the header, the statistics and (when stdout is
  not a terminal) the text with its draft marks go to stderr. `--json` prints one JSON object on
  stdout instead, and keeps stderr quiet.
- Whatever the user can get wrong ends as one line `error: ...` on stderr and exit status 2, never a
  traceback; a bug in the code prints its traceback, exit status 1; Ctrl-C keeps what was generated so
  far and exits 130.
"""

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from cli.flags import RULES, Parser, add_model_options, launched
from cli.startup import exit_now, quiet_interrupt

# ---------------------------------------------------------------- command line

def token_ids(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 2,105,2364, got {text!r}") from None


DESCRIPTION = """\
Generation with a Gemma 4 target and its MTP assistant, greedy or sampled. With no arguments: the
bundled demo pair (scripts/demo) on its default prompt. stdout carries the generated text alone; the
header, the statistics and, when stdout is not a terminal, the text with --show-drafts' marks go to
stderr."""
PROMPTS = """\
prompts: a chat model's (its directory holds chat_template.jinja or tokenizer_config.json, as every
release's does) go into one user turn; a model without them, like the demo, continues the text as it is."""


def parser() -> Parser:
    p = Parser(prog="generate.py", formatter_class=argparse.RawDescriptionHelpFormatter,
               description=DESCRIPTION, epilog=RULES + "\n" + PROMPTS)
    add_model_options(p)
    source = p.add_mutually_exclusive_group()
    source.add_argument("--prompt", metavar="TEXT", action="append",
                        help="the prompt, also given as plain words after the flags (default: 'Tell me a story "
                             "about a fox.' for a chat model, the start of a Python function for one without a chat "
                             "template); several: one batch, a row each")
    source.add_argument("-p", dest="prompt", action="append", help=argparse.SUPPRESS)  # llama-cli's, mlx-lm's
    p.add_argument("words", nargs="*", help=argparse.SUPPRESS)  # ollama's habit: the prompt as plain words
    source.add_argument("--prompt-ids", metavar="IDS", type=token_ids, action="append",
                        help="exact token ids, e.g. 2,105,2364; nothing is added; several: a row each")
    p.add_argument("--prompts-file", metavar="FILE",
                   help="text prompts (after any --prompt): the whole file is one prompt; when some line holds "
                        "only ---, the blocks between such lines are a row each; - reads stdin")
    p.add_argument("--image", metavar="PATH", action="append",
                   help="an image for the prompt (PNG, JPEG, WebP, GIF, BMP; needs a multimodal target and "
                        "pip install -e \".[images]\"); several: in order. A chat turn holds them before its text; "
                        "with --prompt-ids one boi id marks each image's place")
    p.add_argument("--audio", metavar="PATH", action="append",
                   help="an audio clip for the prompt (WAV, PCM; another rate is resampled to 16 kHz; E2B, E4B and "
                        "the 12B hear, E2B/E4B the first 30 s); several: in order. A chat turn holds them after its "
                        "images, before its text; with --prompt-ids one boa id marks each clip's place")
    p.add_argument("--video-frames", metavar="DIR",
                   help="a video as its frames: the image files in DIR, in name order (extract them first, e.g. "
                        "ffmpeg -i clip.mp4 -vf fps=1 DIR/%%04d.png); at most 32 kept, uniformly, each with its "
                        "mm:ss; with --prompt-ids one video id marks its place")
    p.add_argument("--fps", type=float, metavar="RATE",
                   help="the rate --video-frames' frames were extracted at, for their timestamps (default: 1)")
    p.add_argument("--system", metavar="TEXT",
                   help="a system message before the prompt's user turn (a chat model's template writes it)")
    p.add_argument("--think", action="store_true",
                   help="thinking on: the model may think before it answers (the template's <|think|>)")
    p.add_argument("--raw", action="store_true",
                   help="send --prompt to a chat model as it is, after one <bos>, without the chat template")
    p.add_argument("--compare", action="store_true",
                   help="also run plain decoding (sampling: the same seed): identical? how much faster? "
                        "With several prompts: each prompt alone, one after another, against the batch")
    p.add_argument("--trace", action="store_true",
                   help="run the textbook loop on the textbook's modules (implies --reference) and print every "
                        "round's steps 0-7 on stderr as they happen: the budget and K, the drafts and what the "
                        "drafter read, the target's choice at each verify row, what is kept, committed and left "
                        "stale, the next hidden's row, and why the run goes on or stops")
    p.add_argument("--json", dest="json_output", action="store_true",
                   help="print one JSON object on stdout and nothing else; stderr stays quiet")
    return p


if __name__ == "__main__" and os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 alone says it
    # --help and a mistyped flag answered before torch loads (seconds); --tensor-parallel N starts its ranks here
    if (status := launched(parser().parse_args(), __file__, sys.argv[1:])) is not None:
        sys.exit(status)

with quiet_interrupt():  # Ctrl-C while torch imports: one line, no traceback
    import torch

    from cli.batch import run_batch, split_prompts
    from cli.clock import RoundClock
    from cli.media import Given, place, read_media
    from cli.options import (
        DEFAULT_MAX_NEW_TOKENS, DEMO_TARGET, INTERRUPTED, ModelFlags, UsageError, check_cache_fits, check_values, compile_steps, guarded, load_assistant_from,
        load_target_from, refuse, sampling_line, warm_up, draft_room, cut_drafts_note,
    )
    from cli.report import run_json, stats_json, stats_text
    from cli.stream import Stream, text_sinks
    from cli.parallel import mute_other_ranks
    from cli.trace import Trace, each, observed, piece
    from gemma4.engine import decode, generate_one
    from gemma4.generate import budget_of, sample_generate
    from gemma4.engine.rows import check_prompt
    from gemma4.tokenizer import BOS_ID, THINK_ID
    from mtp.engine import speculative_one
    from mtp.speculative import speculative_rounds
    from mtp.stats import result_of

CHAT_PROMPT = "Tell me a story about a fox."  # the default prompt of a chat model
# The default prompt of a model without a chat template, like the demo (a model of Python source):
# the start of a function, whose greedy continuation by the demo target does not fall into a loop.
CODE_PROMPT = "    def __getitem__(self, key):\n"


# ---------------------------------------------------------------- output

def shorten(text: str, width: int = 60) -> str:
    """The prompt's first line, cut to `width` characters, for the header."""
    lines = text.strip("\n").splitlines() or [""]
    first, more = lines[0], len(lines) > 1
    if len(first) > width:
        first, more = first[:width - 1], True
    return json.dumps(first, ensure_ascii=False)[:-1] + ("…" if more else "") + '"'


# ---------------------------------------------------------------- main

def main(*, flags: ModelFlags, prompt: str | None = None, prompt_ids: list[int] | None = None, raw: bool = False,
         compare: bool = False, json_output: bool = False, batch: list[str] | list[list[int]] | None = None,
         demo_target: Path = DEMO_TARGET, images: list[str] | None = None, system: str | None = None,
         think: bool = False, audio: list[str] | None = None, video_frames: str | None = None,
         fps: float | None = None, trace: bool = False, notes: list[str] | None = None) -> int:
    """Run one generation (or one batch) and print it; returns the exit status (0, or 130 after Ctrl-C)."""
    check_values(flags)
    images, audio = images or [], audio or []
    if flags.image_tokens is not None and not images:
        refuse("--image-tokens", "it sizes the images of --image, and none is given")
    if fps is not None and video_frames is None:
        refuse("--fps", "it times the frames of --video-frames, and none are given")
    if fps is not None and not fps > 0:
        raise UsageError(f"--fps must be above 0 (the rate the frames were extracted at), got {fps:g}")
    kinds = [flag for flag, on in (("--image", images), ("--video-frames", video_frames), ("--audio", audio)) if on]
    if kinds and raw:
        raise UsageError(f"{kinds[0]} with --raw: raw text has no place for media; drop --raw (the chat template "
                         f"places them), or give --prompt-ids with one boi, video or boa id where each goes")
    if kinds and batch:
        raise UsageError(f"{kinds[0]} goes with one prompt: give one --prompt (a batch with media per row is "
                         f"speculative_generate_batch(images=..., audio=...) from Python)")
    if kinds and flags.compile:
        raise UsageError(f"{kinds[0]} runs eagerly: --compile's static steps take text only; drop one of the two")
    if batch:  # the first row goes through every check of a single prompt
        prompt, prompt_ids = (batch[0], None) if isinstance(batch[0], str) else (None, batch[0])
    if (prompt is not None and not prompt.strip()) or prompt_ids == []:
        raise UsageError("the prompt is empty: give some text with --prompt or token ids with --prompt-ids")
    if raw and prompt is None and prompt_ids is not None:
        raise UsageError("--raw applies to --prompt text; --prompt-ids are always sent as they are")
    if flags.no_assistant and compare and not batch:  # (a batch compares with its rows run one after another)
        refuse("--compare", "it compares speculative with plain decoding, and --no-assistant is plain already")
    if flags.show_drafts and json_output:
        refuse("--show-drafts", "--json streams no text to mark: drop one of the two")
    if flags.show_drafts and batch:
        refuse("--show-drafts", "it marks the streamed text of one prompt, and several are printed after the run: "
                                "give one prompt, or drop it")
    if trace and (json_output or batch or flags.no_assistant or flags.show_drafts):
        refuse("--trace", "--json keeps stderr quiet: drop one of the two" if json_output else
               "it shows the drafts itself: drop --show-drafts" if flags.show_drafts else
               "it shows the rounds of one speculative run: give one prompt, or drop it" if batch else
               "--no-assistant runs no rounds to show: drop one of the two")
    if trace and (kinds or flags.compile or flags.prefill_chunk is not None):
        # --trace shows the textbook loop on the textbook's modules (it implies --reference): one text prompt,
        # prefilled in one forward, eagerly.
        flag = kinds[0] if kinds else "--compile" if flags.compile else "--prefill-chunk"
        refuse("--trace", f"it follows the textbook loop, which runs one text prompt eagerly in one prefill, and "
                          f"{flag} needs the engine: drop one of the two")
    if trace:
        flags = replace(flags, reference=True)
    if flags.compile and batch:
        raise UsageError("--compile runs one prompt (its steps are static-shape graphs of one row): give one prompt, "
                         "or drop --compile for a batch")
    # Header and note lines are held until every check has passed (the prompt, the budget, the assistant, the
    # cache's memory): a refusal then comes alone, one line. Under --json stderr stays quiet: the notes go into
    # the JSON document ("notes"), the headers nowhere.
    held: list[tuple[str, bool]] | None = [(line, True) for line in notes or []]
    noted: list[str] = []

    def say(line: str, note: bool = False) -> None:
        if held is not None:
            held.append((line, note))
        elif note and json_output:
            noted.append(line.removeprefix("note: "))
        elif not json_output:
            print(line, file=sys.stderr)

    def checked() -> None:
        nonlocal held
        lines, held = held or [], None
        for line, note in lines:
            say(line, note)

    # Target, tokenizer and prompt first: a bad prompt fails before the assistant is fetched.
    # --raw without a template is refused first.
    target, dev, dtype = load_target_from(flags, say, demo_target, raw, quiet=json_output)
    as_is = raw or not target.chat  # no chat template: the text is continued as it is
    for flag, given in (("--system", system is not None), ("--think", think)):
        if given and (as_is or (prompt is None and prompt_ids is not None)):
            refuse(flag, "the chat template writes it into a user turn, and " + (
                "--raw sends the text as it is" if raw else "the prompt is --prompt-ids, sent as they are"
                if prompt is None and prompt_ids is not None else f"{target.name} has no chat template"))
    if think and target.tokenizer is not None and target.tokenizer.tokenizer.token_to_id("<|think|>") != THINK_ID:
        refuse("--think", f"{target.dir}/tokenizer.json has no <|think|> token {THINK_ID}")

    def turn(text: str, media: Given | None = None) -> list[int]:
        """One user turn, as the template writes it: the system message, thinking, the media first."""
        media = media or Given()
        return target.tokenizer.render([media.message(text)], system, think, target.empty_thought, **media.marks())

    def encode(text: str) -> list[int]:
        if target.tokenizer is None:
            raise UsageError(f"{target.dir} has no tokenizer.json to encode --prompt: add it, or give --prompt-ids")
        return target.tokenizer.encode_raw(text) if as_is else turn(text)

    if prompt is None and prompt_ids is None:
        prompt = CHAT_PROMPT if target.chat else CODE_PROMPT
    context = target.model.config.max_position_embeddings
    pictures = None  # the prompt's media, placed on its soft tokens
    if kinds:  # a side is read only now: a text-only run never loads one
        if video_frames and target.tokenizer is None:
            raise UsageError(f"--video-frames writes each frame's time as text: {target.dir} needs its tokenizer.json")
        media = read_media(target.dir, images, audio, video_frames, fps or 1.0, flags.image_tokens, dev, dtype, say,
                           lambda line: say(line, note=True))
        if prompt_ids is None:  # the media first: a chat turn's (the template's place), else right after <bos>
            prompt_ids = [BOS_ID] + media.after_bos() + encode(prompt)[1:] if as_is else turn(prompt, media)
        prompt_ids, pictures = place(media, prompt_ids, target.tokenizer, context)
    if prompt_ids is None:
        prompt_ids = encode(prompt)
    max_new_tokens = DEFAULT_MAX_NEW_TOKENS if flags.max_new_tokens is None else flags.max_new_tokens
    check_prompt(target.model, pictures.text_ids(0, prompt_ids) if pictures else prompt_ids, max_new_tokens)
    rows = [prompt_ids] + [encode(p) if isinstance(p, str) else p for p in batch[1:]] if batch else [prompt_ids]
    for row in rows[1:]:  # every row checked before anything is printed
        check_prompt(target.model, row, max_new_tokens)
    budgets = [min(max_new_tokens, context - len(row)) for row in rows]  # each row's own: its prompt and the context
    for i, (row, budget) in enumerate(zip(rows, budgets)):
        if budget < max_new_tokens:  # said even with --json: the run is shorter than asked
            say(f"note: --max-new-tokens {max_new_tokens} is cut to {budget}{f' for row {i}' if batch else ''}: "
                f"the context holds {context} positions and the prompt takes {len(row)}", note=True)
    max_new_tokens = budgets[0]
    how = "as given" if prompt is None else "raw" if as_is else "chat template"
    shown = f"{shorten(prompt)}, " if prompt is not None else ""
    counts = [f"{n} {kind}{'s' if n > 1 else ''}" for n, kind in ((len(images), "image"), (int(bool(video_frames)), "video"),
                                                                   (len(audio), "clip")) if n]
    with_images = f", {' and '.join(counts)} included" if counts else ""
    say(f"prompt     {shown}{len(prompt_ids)} tokens ({how}{with_images})"
        + (f", the first of {len(batch)} rows" if batch else ""))
    assistant = load_assistant_from(flags, target, dev, dtype, say, quiet=json_output)
    say(sampling_line(target, assistant))
    drafter = assistant and assistant.drafter
    draft_length = assistant and assistant.draft_length
    room = draft_room(max(budgets), flags.prefill_chunk)  # the most drafts a round of this run can hold
    if note := cut_drafts_note(draft_length, room, max(budgets)):  # said even with --json, as the budget's note
        say(note, note=True)
    drafting = assistant.drafting if assistant else None
    sampler, stops = target.sampler, target.stops

    if batch:
        sampling = lambda row_seed: {"temperature": sampler.temperature, "top_k": sampler.top_k,  # noqa: E731
                                     "top_p": sampler.top_p, "seed": row_seed, "drafting": drafting}
        check_cache_fits(target.model, max(len(r) + n for r, n in zip(rows, budgets)), flags.prefill_chunk, len(rows))
        checked()
        result, text, totals = run_batch(
            model=target.model, drafter=drafter, draft_length=draft_length, rows=rows, budgets=budgets,
            stops=stops, sampler=sampler, drafting=drafting or "argmax", tokenizer=target.tokenizer,
            json_output=json_output, compare=compare, row_stats=stats_json,
            sampling_json=sampling, prefill_chunk=flags.prefill_chunk)
        print(json.dumps(result | {"notes": noted}) if json_output else text)
        say(totals)
        return 0

    check_cache_fits(target.model, len(prompt_ids) + max_new_tokens, flags.prefill_chunk)  # before any work
    checked()
    # --compile: the same loops on the compiled static-shape steps and a cache of the prompt and the budget.
    compiled = compile_steps(target, assistant, len(prompt_ids) + max_new_tokens, say,
                             flags.prefill_chunk, room, quiet=json_output) if flags.compile else None
    model = compiled.target if compiled else target.model
    drafter, cache = (compiled.drafter, compiled.cache) if compiled else (drafter, None)
    # --trace: the rounds on stderr as they happen, the text on stdout after them (not mixed into their lines).
    sinks = [] if trace else text_sinks(flags.show_drafts, json_output, say)
    if flags.show_drafts:
        say("")

    # Every step's shapes once first, so one-time costs are not timed (nor charged to either side of --compare).
    warm_up(target.model, assistant, room)
    stream = Stream(target.tokenizer, sinks)
    clock = RoundClock(stream.commit)  # each round's seconds, for the statistics
    observers: list = [clock.round]
    if trace:
        observers.append(Trace(piece(target.tokenizer), say, budget_of(target.model, prompt_ids, max_new_tokens),
                               stops, target.model.config, drafter.config.text.sliding_window))
    # --reference on a text prompt: the textbook loop itself (mtp/speculative.py); with media or prefill
    # chunks, the engine on the textbook's modules.
    textbook = flags.reference and pictures is None and flags.prefill_chunk is None
    if flags.reference and not textbook:
        why = "takes text only" if pictures is not None else "prefills in one forward"
        say(f"note: --reference with {'media' if pictures is not None else '--prefill-chunk'} runs the engine "
            f"(mtp/engine/rows.py) on the textbook's modules: the textbook loop {why}", note=True)
    start = time.perf_counter()
    try:
        if drafter is not None and textbook:
            rounds = speculative_rounds(model, drafter, prompt_ids, max_new_tokens, draft_length, stops, sampler,
                                        drafting)
            spec = result_of(observed(rounds, observers), stops)
            tokens, stats, finish_reason = spec.tokens, spec.stats, spec.finish_reason
        elif drafter is not None:
            spec = speculative_one(model, drafter, prompt_ids, max_new_tokens, draft_length, stops,
                                   sampler, drafting, on_round=each(observers),
                                   cache=cache, prefill_chunk=flags.prefill_chunk, images=pictures)
            tokens, stats, finish_reason = spec.tokens, spec.stats, spec.finish_reason
        elif textbook:
            tokens = sample_generate(model, prompt_ids, max_new_tokens, sampler, stops)
            stream.commit(tokens, [False] * len(tokens))
            finish_reason, stats = "stop" if tokens[-1] in stops else "length", None
        else:
            tokens, finish_reason = decode(model, [prompt_ids], max_new_tokens, [sampler], stops,
                                           on_token=lambda _, t: stream.commit([t], [False]), cache=cache,
                                           prefill_chunk=flags.prefill_chunk, images=pictures)[0]
            stats = None
    except KeyboardInterrupt:
        stream.finish()
        if trace:  # the text so far, after the rounds that made it
            print(stream.text() if target.tokenizer else " ".join(map(str, stream.tokens)))
        if json_output:
            partial = {"tokens": stream.tokens, "text": stream.text(), "finish_reason": "interrupted", "stats": None,
                       "notes": noted}
            print(json.dumps(partial))  # and nothing on stderr: the document says it
        else:
            print(f"interrupted after {len(stream.tokens)} new tokens", file=sys.stderr)
        return INTERRUPTED
    seconds = time.perf_counter() - start
    stream.finish()
    if trace:
        print(stream.text() if target.tokenizer else " ".join(map(str, tokens)))
    result = {"tokens": tokens, "text": stream.text(), "finish_reason": finish_reason,
              "stats": stats_json(stats, tokens, seconds, draft_length if drafter is not None else None,
                                  compiled.target.eager_steps if compiled else None, clock),
              "sampling": {"temperature": sampler.temperature, "top_k": sampler.top_k, "top_p": sampler.top_p,
                           "seed": sampler.seed, "drafting": drafting},
              **run_json(target.name, assistant and assistant.name, dtype, dev, len(prompt_ids), len(tokens),
                         [target.model] + ([assistant.drafter] if assistant else []))}
    if compiled:
        result["compile"] = {"warm_up_seconds": compiled.seconds}
    if images:  # each medium's soft tokens
        result["images"] = [{"path": p, "tokens": len(v)} for p, v in zip(images, media.images)]
    if video_frames:
        result["video"] = {"path": video_frames, "frames": media.video.timestamps,
                           "tokens": sum(len(v) for v in media.video.vectors)}
    if audio:
        result["audio"] = [{"path": p, "tokens": len(v)} for p, v in zip(audio, media.clips)]

    status = 0
    if compare:
        say(f"running plain {'greedy decoding' if sampler.greedy else 'sampling, same seed,'} for --compare ...")
        if cache is not None:  # --compile's cache: the loop prefills from its length, so the prompt anew from 0
            cache.length = torch.tensor([0])
        start = time.perf_counter()
        try:
            plain = sample_generate(model, prompt_ids, max_new_tokens, sampler, stops) if textbook else (
                generate_one(model, prompt_ids, max_new_tokens, sampler, stops, cache=cache,
                             prefill_chunk=flags.prefill_chunk, images=pictures))
            plain_seconds = time.perf_counter() - start
            plain_rate = len(plain) / plain_seconds if plain_seconds else 0.0
            result["plain"] = {"tokens": plain, "seconds": plain_seconds, "tokens_per_second": plain_rate}
            result["identical"] = plain == tokens
            # Greedy and argmax drafting reproduce plain decoding exactly; sample drafting draws otherwise.
            result["identical_expected"] = sampler.greedy or drafting == "argmax"
            # Below float32 a verify of K + 1 rows and a one-token step may round a near tie either way.
            result["low_precision"] = dtype != torch.float32
            result["speedup"] = result["stats"]["tokens_per_second"] / plain_rate if plain_rate else 0.0
        except KeyboardInterrupt:
            say("note: interrupted: --compare skipped", note=True)
            status = INTERRUPTED

    if json_output:
        print(json.dumps(result | {"notes": noted}))
    else:
        say("\n" + stats_text(result, stats))
    return status


def given_prompts(args: argparse.Namespace) -> list[str] | None:
    """--prompt's texts, or the plain words of the command line as one prompt (`generate.py Tell me a story`)."""
    if not args.words:
        return args.prompt
    words = " ".join(args.words)
    if args.prompt:  # `--prompt Tell me a story` takes "Tell" alone: the rest would be a second prompt
        raise UsageError(f"--prompt takes one argument, and {words!r} followed it: quote a prompt of several words "
                         f"(--prompt \"{args.prompt[-1]} {words}\")")
    if args.prompt_ids:
        raise UsageError(f"{words!r} is a text prompt and --prompt-ids gives the ids: give one of the two")
    return [words]


def cli(argv: list[str] | None = None, demo_target: Path = DEMO_TARGET) -> int:
    mute_other_ranks()  # under torchrun: rank 0 alone prints, a refusal of the flags included
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    if (status := launched(args, __file__, argv)) is not None:  # --tensor-parallel N: its own ranks ran it
        return status

    def run() -> int:
        notes: list[str] = []  # said with the header, or under --json in the JSON document
        prompt, prompt_ids, batch = split_prompts(given_prompts(args), args.prompt_ids, args.prompts_file,
                                                  notes.append)
        return main(flags=ModelFlags.parsed(args), prompt=prompt, prompt_ids=prompt_ids, raw=args.raw,
                    compare=args.compare, json_output=args.json_output, batch=batch, demo_target=demo_target,
                    images=args.image, system=args.system, think=args.think, audio=args.audio,
                    video_frames=args.video_frames, fps=args.fps, trace=args.trace, notes=notes)
    return guarded(run, quiet=args.json_output)


if __name__ == "__main__":
    exit_now(cli())
