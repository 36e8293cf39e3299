"""`scripts/generate.py --trace` on the demo pair: every round's numbered steps (mtp/README.md §7) on stderr as they
happen, read back line by line and held to the run itself: the drafts are those of the `--json` statistics of the
same run, the committed blocks are its tokens, the positions follow from the accept counts, `--reference` (the
textbook loop) prints the same trace as the engine, and every combination it refuses is one line, exit status 2.
Most runs call the script's `cli(argv)` in this process; one runs it with stdout on a pseudo-terminal."""

import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import generate  # scripts/generate.py (pyproject.toml puts scripts/ on pytest's path)
from gemma4.tokenizer import Gemma4Tokenizer
from tests.commands.test_cli import assert_one_line_failure, run_inprocess
from tests.commands.test_cli_pipes import read_terminal

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "scripts" / "demo" / "target" / "tokenizer.json"
# Greedy (rounds that keep every draft and rounds that do not), argmax-drafted sampling (more rejections, and K cut
# by the budget at the end), sample drafting.
SETTINGS = [[], ["--temperature", "0.7"], ["--temperature", "0.7", "--drafting", "sample"]]
NEW_TOKENS = ["--max-new-tokens", "40"]

TOKEN = re.compile(r"(\d+):('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")")  # id:'text' (the text as Python's repr)
PREFILL = re.compile(r"trace  0\. prefill   positions 0\.\.(\d+); the target chooses (.+) at (\d+)")
ROUND = re.compile(r"trace  round (\d+): newest position (\d+)")
DRAFT = re.compile(r"trace  2\. draft     K=(\d+): (.+)")
VERIFY = re.compile(r"trace  3\. verify    positions (\d+)\.\.(\d+) in one target forward")
ACCEPT = re.compile(r"trace  4\. accept    target (.+): (\d+) of (\d+) drafts kept")
COMMIT = re.compile(r"trace  5\. commit    (.+) at (\d+)(?:\.\.(\d+))?( \(cut after a stop id\))?; "
                    r"the target adds (.+)")
ROLL_BACK = re.compile(r"trace  6\. roll back cache length (\d+); "
                       r"(?:nothing|position (\d+)|positions (\d+)\.\.(\d+)) stale")
NO_DRAFTS = "nothing (K = 0: a plain decode step)"


@pytest.fixture(scope="module", autouse=True)
def one_thread():  # the demo's tiny matrices: a second thread only adds contention
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tokenizer() -> Gemma4Tokenizer:
    return Gemma4Tokenizer(TOKENIZER)


@dataclass
class Traced:
    """One round as its trace lines state it."""
    position: int  # the newest committed position before the round
    drafted: list[int]
    targets: list[int]
    matched: int
    block: list[int]
    added: int  # the target's own token, g_a
    length: int  # the cache's length after the rollback
    stale: range


def tokens(text: str, tokenizer: Gemma4Tokenizer) -> list[int]:
    """`id:'text' id:'text' ...` -> the ids, each shown with its own text."""
    found = list(TOKEN.finditer(text))
    assert " ".join(m.group(0) for m in found) == text, text  # nothing else on the line
    for m in found:
        assert ast.literal_eval(m.group(2)) == tokenizer.decode([int(m.group(1))]), m.group(0)
    return [int(m.group(1)) for m in found]


def match(pattern: re.Pattern, line: str) -> re.Match:
    found = pattern.fullmatch(line)
    assert found, f"{line!r} is not {pattern.pattern!r}"
    return found


def read_trace(err: str, tokenizer: Gemma4Tokenizer) -> tuple[int, int, list[Traced]]:
    """stderr -> (the prompt's length, the prefill's token, every round): the lines in step order, each round's six
    in a block numbered 1, 2, ..."""
    lines = [line for line in err.splitlines() if line.startswith("trace")]
    last, first, at = match(PREFILL, lines[0]).groups()
    assert int(at) == int(last) + 1
    [prefill_token] = tokens(first, tokenizer)
    rounds = []
    assert (len(lines) - 1) % 6 == 0, lines
    for i in range(1, len(lines), 6):
        block = lines[i:i + 6]
        number, position = map(int, match(ROUND, block[0]).groups())
        assert number == len(rounds) + 1
        k, shown = match(DRAFT, block[1]).groups()
        drafted = [] if shown == NO_DRAFTS else tokens(shown, tokenizer)
        assert len(drafted) == int(k)
        assert tuple(map(int, match(VERIFY, block[2]).groups())) == (position, position + len(drafted))
        targets, accepted, of = match(ACCEPT, block[3]).groups()
        assert int(of) == len(drafted)
        committed, start, end, cut, added = match(COMMIT, block[4]).groups()
        committed = tokens(committed, tokenizer)
        assert (int(start), int(end or start)) == (position + 1, position + len(committed))
        length, one, low, high = match(ROLL_BACK, block[5]).groups()
        stale = range(int(one), int(one) + 1) if one else range(int(low), int(high) + 1) if low else range(0)
        round = Traced(position, drafted, tokens(targets, tokenizer), int(accepted), committed,
                       *tokens(added, tokenizer), int(length), stale)
        assert (len(round.block) < round.matched + 1) == bool(cut)  # only a stop id shortens a block
        rounds.append(round)
    return int(at), prefill_token, rounds


@pytest.mark.parametrize("settings", SETTINGS, ids=["greedy", "sampled", "sample-drafted"])
def test_the_trace_is_the_run(settings: list[str], tokenizer: Gemma4Tokenizer,
                              capsys: pytest.CaptureFixture) -> None:
    status, out, err = run_inprocess(capsys, ["--trace", *NEW_TOKENS, *settings])
    assert status == 0, err
    status, json_out, json_err = run_inprocess(capsys, ["--json", *NEW_TOKENS, *settings])
    assert status == 0, json_err
    run = json.loads(json_out)
    assert out == run["text"] + "\n"  # stdout: the text alone, after the rounds

    prompt, first, rounds = read_trace(err, tokenizer)
    assert prompt == len(tokenizer.encode_raw(generate.CODE_PROMPT))
    # The trace comes before the statistics block, on stderr, as the rounds happen.
    assert err.rindex("trace  ") < err.index("-- speculative decoding")
    # The rounds and their drafts are those of the same run's statistics.
    assert [(r.drafted, r.matched) for r in rounds] == [(r["drafted"], r["accepted"]) for r in run["stats"]["rounds"]]
    # The committed blocks, the prefill's token first, are the run's tokens.
    assert [first] + [t for r in rounds for t in r.block] == run["tokens"]
    newest = prompt
    for r in rounds:
        a, k = r.matched, len(r.drafted)
        assert r.position == newest  # each round starts where the previous one's rollback left it
        assert r.drafted[:a] == r.targets[:a] and len(r.targets) == a + 1  # d_i == g_(i-1) for i <= a
        assert a == k or r.drafted[a] != r.targets[a]  # the first draft not kept is not the target's token
        assert r.added == r.targets[-1] and r.block == (r.drafted[:a] + [r.added])[:len(r.block)]
        assert r.length == r.position + a + 1
        assert r.stale == range(r.position + a + 1, r.position + k + 1)  # written by the verify, holding no token
        newest = r.length
    assert any(r.stale for r in rounds) and any(not r.stale for r in rounds)  # both kinds of rollback shown


@pytest.mark.parametrize("settings", SETTINGS[:2], ids=["greedy", "sampled"])
def test_reference_traces_the_textbook_loop_alike(settings: list[str], capsys: pytest.CaptureFixture) -> None:
    """--reference runs the textbook loop itself (mtp/speculative.py) on the textbook's modules: the same lines."""
    engine = run_inprocess(capsys, ["--trace", *NEW_TOKENS, *settings])
    textbook = run_inprocess(capsys, ["--trace", "--reference", *NEW_TOKENS, *settings])
    assert engine[0] == textbook[0] == 0, textbook[2]
    assert "--reference: the textbook modules" in textbook[2]
    traced = [[line for line in err.splitlines() if line.startswith("trace")] for _, _, err in (engine, textbook)]
    assert traced[0] == traced[1] and len(traced[0]) > 1
    assert engine[1] == textbook[1]


@pytest.mark.parametrize(("flags", "expected"), [
    (["--json"], "error: --trace has no effect here: --json keeps stderr quiet: drop one of the two"),
    (["--show-drafts"], "error: --trace has no effect here: it shows the drafts itself: drop --show-drafts"),
    (["--no-assistant"], "error: --trace has no effect here: --no-assistant runs no rounds to show: drop one of "
                         "the two"),
    (["--prompt", "def f():", "--prompt", "class A:"],
     "error: --trace has no effect here: it shows the rounds of one speculative run: give one prompt, or drop it"),
])
def test_refusals_are_one_line(flags: list[str], expected: str, capsys: pytest.CaptureFixture) -> None:
    status, out, err = run_inprocess(capsys, ["--trace", *flags, "--max-new-tokens", "4"])
    assert_one_line_failure(status, out, err, expected)
    assert err.strip() == expected and out == ""  # before any work: no header, no trace


def test_on_a_terminal(capsys: pytest.CaptureFixture) -> None:
    """stdout on a terminal gets the text after the rounds, without marks; stderr (a pipe) the trace."""
    out, err = read_terminal(["--trace", "--max-new-tokens", "12"], {"TERM": "xterm", "NO_COLOR": ""})
    text = json.loads(run_inprocess(capsys, ["--json", "--max-new-tokens", "12"])[1])["text"]
    assert out == text + "\n"  # no colour, no trace line
    assert "Traceback" not in err and "trace  0. prefill" in err and "trace  6. roll back" in err
