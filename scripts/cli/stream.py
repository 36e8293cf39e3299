"""The streamed text of scripts/generate.py: committed tokens printed as they come, drafts marked.

A `Sink` is one place the text goes: stdout, and (with --show-drafts when stdout is not a terminal)
stderr with the marks, so that stdout stays the generated text alone. Accepted drafts are green on a
terminal; without colour they sit between ⟦ and ⟧, which Python source (the demo's text) never holds,
while square brackets are everywhere in it.

A thought (what a thinking model writes between `<|channel>` and `<channel|>`) is dimmed on a colour
sink, and plain elsewhere.
"""

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from gemma4.tokenizer import CHANNEL_END_ID, CHANNEL_START_ID, Gemma4Tokenizer

GREEN, DIM, RESET = "\x1b[32m", "\x1b[2m", "\x1b[0m"
OPEN, CLOSE = "⟦", "⟧"  # U+27E6, U+27E7: marks that code and prose do not use


def colour_on(file: TextIO) -> bool:
    """Colour only on a terminal, and not when NO_COLOR is set (no-color.org) or TERM is dumb."""
    return file.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


@dataclass(frozen=True)
class Sink:
    file: TextIO
    mark: bool  # mark the accepted drafts
    colour: bool  # ...in green, else between OPEN and CLOSE


class Stream:
    """Keeps every committed token and prints the text as it grows, with work per commit proportional
    to what it added.

    Decoding token by token would split characters spelled over several tokens and lose the
    tokenizer's spacing, so each commit decodes a window: the tokens printed last time (their text is
    known) and the tokens after them, and prints what the window's text adds past the known part (the
    incremental detokenizer of transformers' TextStreamer and vLLM). Only text that is final is printed:
    - Byte tokens (`<0xNN>`) turn into UTF-8 only when their run ends, and a run that is not valid
      UTF-8 becomes one U+FFFD per byte, even bytes that looked fine so far; special tokens, dropped
      from the text, do not end a run. So the window ends at the last other token.
    - A byte-level vocabulary (the demo's) spells a character over several ordinary tokens, and its
      first bytes decode to U+FFFD: a window that ends in U+FFFD waits for the next commit.
    What is still held back is printed by `finish`, or at a thought's edge, as the whole decode has it.
    """

    def __init__(self, tokenizer: Gemma4Tokenizer | None, sinks: list[Sink]) -> None:
        self.tokenizer, self.sinks = tokenizer, sinks
        self.tokens: list[int] = []
        # The window is tokens[prefix:]; the text of tokens[:read] is printed, tokens[prefix:read] the last
        # piece of it, decoded again for its context (spacing, a character's first bytes).
        self.prefix = self.read = 0
        self.open_run: set[int] = set()  # ids that do not close a run of byte tokens
        self.thinking = False  # inside a thought: dimmed
        if tokenizer is not None:
            t = tokenizer.tokenizer
            self.open_run = {i for i, tok in t.get_added_tokens_decoder().items() if tok.special}
            self.open_run |= {i for b in range(256) if (i := t.token_to_id(f"<0x{b:02X}>")) is not None}

    def text(self, tokens: list[int] | None = None) -> str | None:
        tokens = self.tokens if tokens is None else tokens
        return None if self.tokenizer is None else self.tokenizer.decode(tokens, skip_special_tokens=True)

    def commit(self, tokens: list[int], from_drafter: list[bool]) -> None:
        """One committed block: accepted drafts first, then the target's own token."""
        start = 0
        while start < len(tokens):  # print runs of the same origin, so one mark holds one round's drafts
            end = start + 1
            while (end < len(tokens) and from_drafter[end] == from_drafter[start]
                   and not self.switches_thought(tokens[end - 1])):
                end += 1
            self.tokens += tokens[start:end]
            if self.switches_thought(tokens[end - 1]):  # print the text so far in the style it had
                self.show(tokens[start:end], from_drafter[start], final=True)
                self.thinking = tokens[end - 1] == CHANNEL_START_ID
            else:
                self.show(tokens[start:end], from_drafter[start])
            start = end

    @staticmethod
    def switches_thought(token: int) -> bool:
        return token in (CHANNEL_START_ID, CHANNEL_END_ID)

    def show(self, run: list[int], drafted: bool, final: bool = False) -> None:
        if not self.sinks:
            return
        if self.tokenizer is None:  # --prompt-ids on a checkpoint without tokenizer.json: show ids
            piece = "".join(f"{t} " for t in run)
        else:
            piece = self.final_piece(final)
        for sink in self.sinks:
            out = piece
            if drafted and sink.mark and piece:
                out = f"{GREEN}{piece}{RESET}" if sink.colour else f"{OPEN}{piece}{CLOSE}"
            if self.thinking and sink.colour and piece:
                out = f"{DIM}{out}{RESET}"
            sink.file.write(out)
            sink.file.flush()

    def final_piece(self, final: bool) -> str:
        """The text the tokens after `read` add that no later token can change; moves the window past it."""
        done = len(self.tokens)
        while not final and done > self.read and self.tokens[done - 1] in self.open_run:
            done -= 1
        if done <= self.read:
            return ""
        known = self.text(self.tokens[self.prefix:self.read])  # printed already
        text = self.text(self.tokens[self.prefix:done])
        if not final and text.endswith("\ufffd"):  # a character's first bytes: its last ones are still to come
            return ""
        self.prefix, self.read = self.read, done
        return text[len(known):]

    def finish(self) -> None:
        self.show([], drafted=False, final=True)
        for sink in self.sinks:
            sink.file.write("\n")
            sink.file.flush()


def text_sinks(show_drafts: bool, json_output: bool, say: Callable[[str], None]) -> list[Sink]:
    """Where the streamed text goes. On a terminal the marked text is the text; otherwise stdout gets it
    plain and stderr the marked copy. With --show-drafts, `say` gets the legend of the marks."""
    sinks = [] if json_output else [Sink(sys.stdout, show_drafts and sys.stdout.isatty(), colour_on(sys.stdout))]
    if show_drafts and not sys.stdout.isatty():
        sinks.append(Sink(sys.stderr, True, colour_on(sys.stderr)))
    if show_drafts:
        style = "green" if any(s.mark and s.colour for s in sinks) else "⟦between these⟧"
        say(f"{style}: proposed by the drafter and accepted; the rest the target supplied")
    return sinks
