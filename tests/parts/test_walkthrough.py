"""The prose of mtp/walkthrough.md stays short and plain, and README.md has no run-on sentence.

A sentence ends at `.`, `!`, `?`, `:` or `;` followed by a space or the end of a line, and at the end
of a paragraph or list item. Fenced code blocks, headings (`#`) and table rows (`|`) are not prose. A
word is a whitespace-separated token; a list marker (`-`, `*`, `1.`) is not a word."""

import re
from pathlib import Path
from statistics import mean

ROOT = Path(__file__).resolve().parents[2]
SENTENCE_END = re.compile(r"[.!?:;](?=\s|$)")
LIST_MARKER = re.compile(r"^\s*(?:[-*+]|\d+\.)\s+")


def prose_blocks(text: str) -> list[str]:
    """The paragraphs and list items of a markdown text, each joined into one line."""
    blocks: list[list[str]] = [[]]
    fenced = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
        prose = stripped and not fenced and not stripped.startswith(("```", "#", "|"))
        if not prose or LIST_MARKER.match(line):
            blocks.append([])  # a new block starts
        if prose:
            blocks[-1].append(LIST_MARKER.sub("", line))
    return [" ".join(block) for block in blocks if block]


def sentence_lengths(text: str) -> list[int]:
    """Words in each sentence of the prose."""
    pieces = (piece for block in prose_blocks(text) for piece in SENTENCE_END.split(block))
    return [len(piece.split()) for piece in pieces if piece.split()]


def long_sentences(text: str, limit: int) -> list[str]:
    """The sentences of more than `limit` words, for the failure message."""
    pieces = (piece for block in prose_blocks(text) for piece in SENTENCE_END.split(block))
    return [piece.strip() for piece in pieces if len(piece.split()) > limit]


def test_walkthrough_is_short_and_plain() -> None:
    text = (ROOT / "mtp" / "walkthrough.md").read_text()
    assert len(text.splitlines()) <= 200
    lengths = sentence_lengths(text)
    assert mean(lengths) <= 15, f"{mean(lengths):.1f} words a sentence"
    assert max(lengths) <= 30, long_sentences(text, 30)


def test_readme_has_no_sentence_over_40_words() -> None:
    text = (ROOT / "README.md").read_text()
    assert max(sentence_lengths(text)) <= 40, long_sentences(text, 40)
