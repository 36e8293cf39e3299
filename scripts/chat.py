"""Chat with a Gemma 4 target and its MTP assistant: `python scripts/chat.py --help`.

- Every model flag is generate.py's (scripts/cli/options.py), with the same two rules: a flag changes
  only itself (defaults from the checkpoint's files), and a flag that would do nothing is refused.
  chat.py adds `--system`, `--think`, `--context` (the positions the conversation may hold) and `--json`.
  Its parser takes no abbreviations (`--image` is not `--image-tokens`), and generate.py's prompt flags get one
  line that says what chat takes instead. `--system` and `--think` need a chat template, as in generate.py.
- The conversation is mtp/extras/conversation.py's: each turn renders the whole conversation by token id
  and prefills only what the target's cache does not already hold. A reply is exactly what
  `generate.py --prompt-ids <that turn's prompt_ids>` writes with the same flags.
- On a terminal: the prompt `>>> `, replies streamed on stdout, the header and the figures on stderr.
  Ctrl-C stops a reply and keeps what was shown as the model's turn; Ctrl-C at the prompt drops the
  line and says how to leave, a second one in a row leaves, as does Ctrl-D or `/exit` (status 0).
  Without a terminal on stdin the same lines are read, without prompts.
- `/image PATH` and `/audio PATH` (a target that sees or hears) read the image or the WAV clip at once and send
  it with the next message, before its text (images, then clips: the order we give the release's chat template)
  (scripts/cli/media.py); the side is loaded at its first one. A file it cannot read is one line ("not attached:
  ...") and the conversation goes on. `/reset` drops them too, and says so. A video is generate.py's
  (`--video-frames`): the conversation holds images and clips only, and `/video` says so in one line.
- A message that cannot be sent (past the context, text that is not UTF-8) is one line ("not sent: ...") and
  the conversation goes on as it was. stdin is read with surrogateescape, so bytes that are not UTF-8 reach the
  tokenizer, which names them, rather than ending the session.
- `--json`: stdin lines are user turns, stdout one JSON object per turn on one line, nothing else
  (`{"error": ...}` in the place of a turn not sent, of an image or clip not attached, of /video); stderr stays quiet:
  a note line (`--context` or the drafts per round cut, a clip cut to 30 s) goes into the next object's "notes".
- A model without a chat template (the demo, a model of Python source) still chats: Gemma 4's
  turns are written by id, and its vocabulary holds the control tokens. The header says it never saw
  chat turns, so its replies are continuations of code, not answers.
"""

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from cli.flags import RULES, Parser, add_model_options, launched
from cli.startup import exit_now, quiet_interrupt

PROMPT, MORE = ">>> ", "... "  # the prompt, and the one inside a multi-line message
FENCE = '"""'  # a line holding only this opens and closes a multi-line message
COMPILED_CONTEXT = 8192  # --compile's default context: its static cache is read whole by every compiled step
HELP = f"""\
type a message and Enter; a line {FENCE} opens and closes a message of several lines
/image PATH or /audio PATH (a WAV file) adds an image or a clip to your next message, /reset starts over,
/stats shows the last turn's figures, /exit (or /bye, /quit) or Ctrl-D leaves; Ctrl-C stops a reply"""
LEAVE = ("/exit", "/bye", "/quit")  # ours, and ollama's and llama-cli's
ASK = ("exit", "quit", "bye")  # a bare word that may mean "leave": asked about, not sent
NO_VIDEO = ("chat takes no video (a conversation holds images and clips): send a video with generate.py "
            "--video-frames DIR --fps N, or attach single frames as images with /image PATH")


# ---------------------------------------------------------------- command line

DESCRIPTION = """\
A conversation with a Gemma 4 target and its MTP assistant on one KV cache: each turn reuses the
cached positions it shares with the previous ones and prefills only the rest. With no arguments: the
bundled demo pair (scripts/demo), a model of Python source that never saw chat turns."""
COMMANDS = f"""\
in the conversation:
{HELP}
Ctrl-C at the prompt drops the line; a second Ctrl-C in a row leaves. --max-new-tokens counts per turn.
/reset also drops the images and clips attached for the next message, and says so. A video is generate.py's
--video-frames: /video says so. A message that cannot be sent (past --context, text that is not UTF-8) is one
line and the conversation goes on. --system and --think need a chat template (the demo has none).
--json: stdin lines are user turns (a line /reset resets, /image PATH adds an image, /audio PATH a clip, /exit,
/bye or /quit leaves); stdout gets one JSON object per turn on one line: turn, prompt_ids, reused, prefilled, tokens, text,
finish_reason, stats (a turn not sent, an image or clip not attached: {{"error": ...}}); stderr stays quiet:
a note line goes into the next object, as "notes": [...]."""
GENERATE_ONLY = {  # generate.py's prompt flags, which chat takes at its prompt instead: flag -> what to do
    "--prompt": "type the message at the >>> prompt, or pipe it into stdin",
    "--image": "attach an image at the >>> prompt with /image PATH",
    "--audio": "attach a WAV clip at the >>> prompt with /audio PATH",
    "--video-frames": "a video is generate.py's alone: use generate.py --video-frames DIR",
}


def parser() -> Parser:
    # No abbreviations: `--image` (generate.py's) would otherwise be taken for --image-tokens.
    p = Parser(prog="chat.py", formatter_class=argparse.RawDescriptionHelpFormatter,
               description=DESCRIPTION, epilog=RULES + "\n" + COMMANDS, allow_abbrev=False)
    add_model_options(p)
    p.add_argument("--system", metavar="TEXT", help="a system message that opens the conversation")
    p.add_argument("--think", action="store_true",
                   help="thinking on: the model may think before it answers; the thought is shown dimmed (on a "
                        "colour terminal) and left out of the history")
    p.add_argument("--context", type=int, metavar="N",
                   help="positions the conversation may hold (default: the model's context; with --compile "
                        f"{COMPILED_CONTEXT}, the static cache every compiled step reads whole)")
    p.add_argument("--json", dest="json_output", action="store_true",
                   help="for scripts: stdin lines are user turns, stdout one JSON object per turn and nothing else")
    return p


def parse(argv: list[str]) -> argparse.Namespace:
    """The arguments; an unknown one is one line (Parser.error), which for generate.py's prompt flags says what chat
    takes instead."""
    p = parser()
    args, unknown = p.parse_known_intermixed_args(argv)
    if unknown:
        flag = next((a.split("=", 1)[0] for a in unknown if a.split("=", 1)[0] in GENERATE_ONLY), None)
        if flag is None and not unknown[0].startswith("-"):  # ollama's `run MODEL "prompt"`, generate.py's words
            p.error(f"unrecognized arguments: {' '.join(unknown)}: chat.py reads its messages at the >>> prompt "
                    f"(or stdin); for one prompt on the command line, use generate.py")
        p.error(f"{flag} is generate.py's, not chat.py's: {GENERATE_ONLY[flag]}" if flag else p.unknown(unknown))
    return args


if __name__ == "__main__" and os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 alone says it
    # --help and a mistyped flag answered before torch loads (seconds); --tensor-parallel N starts its ranks here
    if (status := launched(parse(sys.argv[1:]), __file__, sys.argv[1:])) is not None:
        sys.exit(status)

with quiet_interrupt():  # Ctrl-C while torch imports: one line, no traceback
    import torch

    from cli.clock import RoundClock
    from cli.parallel import mute_other_ranks
    from cli.options import (
        DEFAULT_MAX_NEW_TOKENS, DEMO_TARGET, INTERRUPTED, USER_ERRORS, Assistant, ModelFlags, Target,
        UsageError, check_cache_fits, check_values, compile_steps, guarded, load_assistant_from,
        load_target_from, refuse, sampling_line, warm_up, draft_room, cut_drafts_note,
    )
    from cli.report import stats_json, stats_text
    from cli.stream import Sink, Stream, text_sinks
    from cli.media import read_clip
    from cli.launch import LAUNCHED
    from cli.parallel import leave, shared_line
    from gemma4.audio.config import AudioTokens, audio_config, audio_tokens
    from gemma4.audio.loading import Audio, load_audio
    from gemma4.audio.wav import AudioError
    from gemma4.config_file import read_json
    from gemma4.engine.rows import PromptError
    from gemma4.tokenizer import BOS_ID, THINK_ID, TURN_END_ID, TURN_START_ID, Gemma4Tokenizer
    from gemma4.vision.config import ImageTokens, image_tokens, vision_config
    from gemma4.vision.loading import Vision, load_vision
    from gemma4.vision.prompt import ImageError
    from mtp import ContextFull, Conversation, Reply
    from mtp.schedule import Schedule

# ---------------------------------------------------------------- input

class Lines:
    """What the user sends: a line, or the lines between two lines holding only `\"\"\"`."""

    def __init__(self, source: TextIO, prompt: bool) -> None:
        self.source, self.prompt = source, prompt
        self.fenced = False  # the last message was a block between two fence lines: text, whatever it says
        if prompt:
            try:  # line editing and history for input(), where the platform has them
                import readline  # noqa: F401
            except ImportError:
                pass

    def line(self, prompt: str) -> str:
        """One line without its end; EOFError at the end of the input (Ctrl-D on a terminal). Under torchrun rank 0
        reads it and every rank gets it (cli/parallel.py)."""
        return shared_line(lambda: self.read(prompt))

    def read(self, prompt: str) -> str:
        if self.prompt:
            return input(prompt)
        line = self.source.readline()
        if not line:
            raise EOFError
        return line.rstrip("\r\n")

    def message(self) -> str:
        first = self.line(PROMPT)
        self.fenced = first.strip() == FENCE
        if not self.fenced:
            return first
        block = []
        while (line := self.line(MORE)).strip() != FENCE:
            block.append(line)
        return "\n".join(block)


# ---------------------------------------------------------------- output

def reply_json(reply: Reply, clock: RoundClock, draft_length: Schedule | None = None,
               eager_rounds: int | None = None) -> dict:
    """One turn for --json (`clock`: the turn's on_commit). An interrupted turn has no statistics (the loop did not
    finish them)."""
    stats = (None if reply.finish_reason == "interrupted"
             else stats_json(reply.stats, reply.tokens, reply.seconds, reply.stats and draft_length, eager_rounds,
                             clock))
    return {"turn": reply.turn, "prompt_ids": reply.prompt_ids, "reused": reply.reused, "prefilled": reply.prefilled,
            "tokens": reply.tokens, "text": reply.text, "finish_reason": reply.finish_reason, "stats": stats}


def reply_report(reply: Reply, clock: RoundClock, temperature: float, draft_length: Schedule | None = None,
                 eager_rounds: int | None = None) -> str:
    """What /stats prints: the cache's part in the turn, then generate.py's statistics block (`clock`: the turn's
    on_commit)."""
    first = "" if reply.first_token_seconds is None else f"; first token after {reply.first_token_seconds:.2f} s"
    head = (f"-- turn {reply.turn}: the prompt has {len(reply.prompt_ids)} tokens: {reply.reused} reused from the "
            f"cache, {reply.prefilled} prefilled{first}")
    if reply.finish_reason == "interrupted":
        return f"{head}\n-- interrupted after {len(reply.tokens)} new tokens (no statistics)"
    result = {"tokens": reply.tokens, "finish_reason": reply.finish_reason,
              "stats": stats_json(reply.stats, reply.tokens, reply.seconds, reply.stats and draft_length,
                                  eager_rounds, clock),
              "sampling": {"temperature": temperature}}
    return f"{head}\n{stats_text(result, reply.stats)}"


def chat_line(target: Target, system: str | None, think: bool, max_new_tokens: int, context: int) -> str:
    line = f"chat       {context} positions of context, at most {max_new_tokens} new tokens a turn"
    line += ", thinking on" if think else ""
    line += f", system {json.dumps(system.strip())}" if system is not None else ""
    if not target.chat:
        more = " " * len("chat       ")
        line += (f"\n{more}no chat template: this model never saw chat turns (the demo is a model of Python source);"
                 f"\n{more}its turns are written in Gemma 4's format all the same, so expect code, not answers")
    return line


def chat_tokenizer(target: Target, think: bool) -> Gemma4Tokenizer:
    """The target's tokenizer, which must spell the control tokens the turns are written with."""
    if target.tokenizer is None:
        raise UsageError(f"{target.dir} has no tokenizer.json, which chat needs to read what you type: add it, "
                         f"or use generate.py --prompt-ids")
    needed = {"<bos>": BOS_ID, "<|turn>": TURN_START_ID, "<turn|>": TURN_END_ID}
    if think:
        needed["<|think|>"] = THINK_ID
    wrong = [f"{name} {i}" for name, i in needed.items() if target.tokenizer.tokenizer.token_to_id(name) != i]
    if wrong:
        raise UsageError(f"{target.dir}/tokenizer.json lacks Gemma 4's control tokens ({', '.join(wrong)}), so chat "
                         f"cannot write turns: use generate.py")
    return target.tokenizer


# ---------------------------------------------------------------- main

@dataclass
class Session:
    """The conversation and how its turns are shown: streamed text on a terminal, objects with --json."""
    conversation: Conversation
    target: Target
    assistant: Assistant | None
    max_new_tokens: int
    sinks: list[Sink]  # where a reply streams (none with --json)
    json_output: bool
    say: Callable[[str], None]  # a line on stderr (nowhere with --json)
    read: dict[str, Callable[[str], torch.Tensor]]  # /image, /audio: a path -> its vectors, or an Image/AudioError
    last: Reply | None = None
    clock: RoundClock | None = None  # the last turn's: its rounds' seconds
    pending: dict[str, list[torch.Tensor]] = field(default_factory=lambda: {"/image": [], "/audio": []})
    eager: int | None = None  # --compile: the last turn's rounds whose step ran uncompiled
    notes: list[str] = field(default_factory=list)  # --json: note lines, carried by the next object printed

    def write(self, obj: dict) -> None:
        """--json: one object on one line, with the notes said since the last one ("notes", only when there are
        some: an object with none is as before)."""
        if self.notes:
            obj = {**obj, "notes": list(self.notes)}
            self.notes.clear()
        print(json.dumps(obj), flush=True)

    def turn(self, text: str) -> None:
        stream = Stream(self.conversation.tokenizer, self.sinks)
        clock = RoundClock(stream.commit)  # each round's seconds, for the statistics
        a = self.assistant
        before = getattr(self.conversation.target, "eager_steps", None)  # a StaticTarget's (--compile) count
        try:
            reply = self.conversation.say(text, self.max_new_tokens, self.target.sampler, a and a.draft_length,
                                          a.drafting if a else "argmax", on_commit=clock,
                                          images=self.pending["/image"], audio=self.pending["/audio"])
        except (ContextFull, PromptError) as e:  # past the context, text not UTF-8: unchanged, and it goes on
            if self.json_output:  # an object in the turn's place: a script reading a line per turn stays in step
                self.write({"error": str(e)})
            self.say(f"not sent: {e}\n")
            return
        except KeyboardInterrupt:  # in the instant before its loop began: the turn did not happen
            stream.finish()
            self.say("(interrupted)\n")
            return
        self.last, self.clock, self.pending = reply, clock, {"/image": [], "/audio": []}
        self.eager = None if before is None else self.conversation.target.eager_steps - before
        if self.json_output:
            self.write(reply_json(reply, clock, a and a.draft_length, self.eager))
            return
        stream.finish()
        if reply.finish_reason == "interrupted" and self.target.shard is not None:
            # The other ranks are mid-step, waiting on this one: the conversation cannot go on in step.
            self.say(f"interrupted after {len(reply.tokens)} new tokens (on several ranks Ctrl-C during a reply ends "
                     f"the conversation)")
            raise SystemExit(leave(INTERRUPTED))
        if reply.finish_reason == "interrupted":
            self.say(f"(stopped after {len(reply.tokens)} tokens: the text above is kept as the model's turn)")
        self.say("")

    def attach(self, command: str, path: str) -> None:
        """/image PATH, /audio PATH: read the file now (a bad one is said at once), send it with the next message."""
        kind = "image" if command == "/image" else "clip"
        pending = self.pending[command]
        try:
            if not path:
                example = "photo.jpg" if kind == "image" else "speech.wav"
                raise UsageError(f"{command} needs a path: {command} {example}")
            pending.append(self.read[command](path))
        except USER_ERRORS as e:  # a bad file, or a side whose files are broken: said, and the chat goes on
            if self.json_output:  # an object in the place of what did not happen
                self.write({"error": str(e)})
            self.say(f"not attached: {e}\n")
            return
        n = len(pending)
        self.say(f"-- {Path(path).name}: {len(pending[-1])} {'image' if kind == 'image' else 'audio'} tokens; {n} "
                 f"{kind}{'s go' if n > 1 else ' goes'} with your next message\n")

    def command(self, line: str) -> bool:
        """Run `line` if it is a command (/exit is the caller's); False if it is a message."""
        if line == "/reset":  # the attachments of the next message go too: they belonged to this conversation
            self.conversation.reset()
            dropped = [f"{len(self.pending[c])} {kind}{'s' if len(self.pending[c]) > 1 else ''}"
                       for c, kind in (("/image", "image"), ("/audio", "clip")) if self.pending[c]]
            self.pending = {"/image": [], "/audio": []}
            self.say("-- the conversation starts over" + (
                f"; dropped too: {' and '.join(dropped)} attached for your next message" if dropped else "") + "\n")
            return True
        word, rest = (line.split(maxsplit=1) + [""])[:2]
        if word in ("/image", "/audio"):
            self.attach(word, rest.strip())
            return True
        if word == "/video":  # one line, not a message that would send "/video DIR" to the model as text
            if self.json_output:
                self.write({"error": NO_VIDEO})
            self.say(f"not attached: {NO_VIDEO}\n")
            return True
        if self.json_output or not line.startswith("/") or len(line.split()) > 1:
            return False
        if line == "/stats":
            length = self.assistant and self.assistant.draft_length
            self.say(reply_report(self.last, self.clock, self.target.sampler.temperature, length, self.eager)
                     if self.last else "-- no turn yet")
        elif line in ("/help", "/?"):
            self.say(HELP)
        else:
            self.say(f"unknown command {line} (/help lists them); to send it as text, put it between two lines "
                     f"{FENCE}")
        self.say("")
        return True


def main(*, flags: ModelFlags, system: str | None = None, think: bool = False, json_output: bool = False,
         source: TextIO, demo_target: Path = DEMO_TARGET, context: int | None = None) -> int:
    """Hold a conversation until /exit or the end of the input; returns the exit status."""
    check_values(flags)
    if context is not None and context < 2:
        refuse("--context", f"{context} positions hold no turn: give at least 2 (a prompt token and a reply)")
    if flags.show_drafts and json_output:
        refuse("--show-drafts", "--json streams no text to mark: drop one of the two")
    # Header and note lines are held until every check has passed (as generate.py holds them): a refusal then comes
    # alone, one line. With --json the header is not said and a note goes into the next object printed.
    held: list[str] | None = []
    notes: list[str] = []

    def say(line: str) -> None:
        if json_output:
            return
        if held is not None:
            held.append(line)
        else:
            print(line, file=sys.stderr)

    def note(line: str) -> None:
        if json_output:  # as generate.py's "notes": the line without its "note: "
            notes.append(line.removeprefix("note: "))
        else:
            say(line)

    target, dev, dtype = load_target_from(flags, say, demo_target, quiet=json_output)  # --json: no progress bars
    for flag, given in (("--system", system is not None), ("--think", think)):  # generate.py's rule
        if given and not target.chat:
            refuse(flag, f"the chat template writes it, and {target.name} has no chat template (it never saw a "
                         f"system turn or a thought): drop {flag}")
    tokenizer = chat_tokenizer(target, think)
    if system is not None:  # at the start, not as every turn's refusal
        try:
            tokenizer.encode_text(system)
        except PromptError as e:
            raise UsageError(f"--system: {e}") from None
    raw = read_json(target.dir / "config.json")
    tokens: ImageTokens | None = image_tokens(raw) if vision_config(raw) else None  # None: text only
    hears: AudioTokens | None = audio_tokens(raw) if audio_config(raw) else None  # None: no audio side
    if flags.image_tokens is not None and (tokens is None or flags.compile):
        refuse("--image-tokens", f"it sizes /image's images, and {target.name} takes none"
                                 f"{' with --compile' if tokens else ' (no vision tower)'}")
    assistant = load_assistant_from(flags, target, dev, dtype, say, quiet=json_output)
    say(sampling_line(target, assistant))
    max_new_tokens = DEFAULT_MAX_NEW_TOKENS if flags.max_new_tokens is None else flags.max_new_tokens
    # The positions the conversation may hold: --context, else the model's; with --compile at most COMPILED_CONTEXT
    # unless asked, as every compiled step reads its static cache whole (gemma4/fast/README.md).
    model_context = target.model.config.max_position_embeddings
    if context and context > model_context:  # said even with --json (in its first object)
        note(f"note: --context {context} is cut to {model_context}: the model holds {model_context} positions")
    context = min(model_context, context or (COMPILED_CONTEXT if flags.compile else model_context))
    say(chat_line(target, system, think, max_new_tokens, context))
    if flags.compile:  # a static cache holds every position from the start
        check_cache_fits(target.model, context, flags.prefill_chunk)
    room = draft_room(max_new_tokens, flags.prefill_chunk)  # the most drafts a round of a turn can hold
    if cut := cut_drafts_note(assistant and assistant.draft_length, room, max_new_tokens):
        note(cut)
    for line in held:  # every check has passed
        print(line, file=sys.stderr)
    held = None
    compiled = (compile_steps(target, assistant, context, say, flags.prefill_chunk, room, quiet=json_output)
                if flags.compile else None)
    prompt = not json_output and source.isatty()
    if prompt:
        ended = "Ctrl-C during a reply ends the conversation" if os.environ.get(LAUNCHED) else (
            "Ctrl-C ends the run (torchrun)")
        say(HELP if target.shard is None else HELP.replace("Ctrl-C stops a reply", ended))
    sinks = text_sinks(flags.show_drafts, json_output, say)
    say("")

    model, drafter = ((compiled.target, compiled.drafter) if compiled else
                      (target.model, assistant and assistant.drafter))
    conversation = Conversation(model, tokenizer, drafter, system, think, target.stops, context, flags.prefill_chunk,
                                tokens, hears)
    if compiled:
        conversation.cache = compiled.cache
    vision: list[Vision] = []  # the image side, read at the first /image: a text-only chat never loads it

    def read(path: str) -> torch.Tensor:
        if compiled:
            raise ImageError("--compile's static steps take text only: drop --compile to attach images")
        if tokens is None:
            raise ImageError(f"{target.name} takes no image: its config.json has no vision_config (a text-only model, "
                             f"like the demo)")
        if not vision:
            vision.append(load_vision(target.dir, dtype, dev))
        return vision[0].read(path, flags.image_tokens)

    audio: list[Audio] = []  # the audio side, read at the first /audio

    def hear(path: str) -> torch.Tensor:
        if compiled:
            raise AudioError("--compile's static steps take text only: drop --compile to attach clips")
        if hears is None:
            raise AudioError(f"{target.name} takes no audio: its config.json has no audio_config (audio needs E2B, "
                             f"E4B or the 12B)")
        if not audio:
            audio.append(load_audio(target.dir, dtype, dev))
        return read_clip(audio[0], path, note)  # a clip cut to 30 s: a note, --json or not

    session = Session(conversation, target, assistant, max_new_tokens, sinks, json_output, say,
                      {"/image": read, "/audio": hear}, notes=notes)
    warm_up(target.model, assistant, room)  # every step's shapes once, so one-time costs are not charged to turn 1
    lines = Lines(source, prompt)
    interrupted = False  # the last thing at the prompt was a Ctrl-C
    asked = False  # the last line was a bare `exit`, and whether to leave was asked
    while True:
        try:
            text = lines.message()
        except EOFError:
            if prompt:
                print()  # end the prompt's line
            return 0
        except KeyboardInterrupt:
            if not prompt:
                return INTERRUPTED
            print()
            if interrupted:
                return 0
            interrupted = True
            say("(Ctrl-C again, Ctrl-D or /exit leaves)")
            continue
        interrupted = False
        line = text.strip()
        word = None if lines.fenced else line.lower()  # a fenced block is a message, whatever it says
        if word in LEAVE or (asked and word in ("y", "yes")):
            return 0
        if asked and word in ("n", "no"):
            asked = False
            continue
        asked = word in ASK and not json_output
        if asked:  # the model would get the word as a message: likely not what was meant
            say(f"-- leave the conversation? y leaves, n stays; to send {line!r} as a message, put it between two "
                f"lines {FENCE}\n")
            continue
        if line and (lines.fenced or not session.command(line)):
            session.turn(text)


def cli(argv: list[str] | None = None, source: TextIO | None = None, demo_target: Path = DEMO_TARGET) -> int:
    mute_other_ranks()  # under torchrun: rank 0 alone prints, a refusal of the flags included
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if (status := launched(args, __file__, argv)) is not None:  # --tensor-parallel N: its own ranks ran it
        return status
    if source is None:
        source = sys.stdin
        if hasattr(source, "reconfigure"):  # bytes that are not UTF-8 reach the tokenizer, which names them
            source.reconfigure(errors="surrogateescape")
    return guarded(lambda: main(flags=ModelFlags.parsed(args), system=args.system, think=args.think,
                                json_output=args.json_output, source=source, demo_target=demo_target,
                                context=args.context))


if __name__ == "__main__":
    exit_now(cli())
