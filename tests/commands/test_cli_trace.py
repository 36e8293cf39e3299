"""`scripts/generate.py --trace` on the demo pair: every round's numbered steps (mtp/README.md §7) on stderr as they
happen, read back line by line and held to the run itself: the budget and K of step 1, the drafts (those of the
`--json` statistics of the same run), what the drafter read (the target's source layers, positions 0..n-1, query
position n, the hidden of the last verify's row a), the committed blocks (the run's tokens), positions that follow
from the accept counts, and step 7's reason to go on or stop. It runs the textbook loop on the textbook's modules:
`--trace` alone is `--trace --reference`. Every combination it refuses is one line, exit status 2.
Most runs call the script's `cli(argv)` in this process; one runs it with stdout on a pseudo-terminal."""

import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

import generate  # scripts/generate.py (pyproject.toml puts scripts/ on pytest's path)
from gemma4.config import FULL, SLIDING
from gemma4.config_file import load_config, read_json
from gemma4.tokenizer import Gemma4Tokenizer
from mtp.loading import drafter_config_from_dict
from tests.commands.test_cli import assert_one_line_failure, run_inprocess
from tests.commands.test_cli_pipes import read_terminal

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "scripts" / "demo"
TOKENIZER = REPO / "scripts" / "demo" / "target" / "tokenizer.json"
# Greedy (rounds that keep every draft and rounds that do not), argmax-drafted sampling (more rejections, and K cut
# by the budget at the end), sample drafting.
SETTINGS = [[], ["--temperature", "0.7"], ["--temperature", "0.7", "--drafting", "sample"]]
NEW_TOKENS = ["--max-new-tokens", "40"]

TOKEN = re.compile(r"(\d+):('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")")  # id:'text' (the text as Python's repr)
PREFILL = re.compile(r"trace  0\. prefill   positions 0\.\.(\d+); the target chooses (.+) at (\d+)")
ROUND = re.compile(r"trace  round (\d+): newest position (\d+)")
BUDGET = re.compile(r"trace  1\. budget    (\d+) of (\d+) new tokens committed, room for (-?\d+) drafts: K=(\d+)")
DRAFTER = re.compile(r"trace     drafter   token at (\d+), hidden h\[(\d+)\] from (.+); reads the target's K/V of "
                     r"layer (\d+) \(sliding, positions? (\d+)(?:\.\.(\d+))?\) and layer (\d+) \(full, positions? "
                     r"(\d+)(?:\.\.(\d+))?\); query position (\d+) at all (\d+) steps")
STOP_OR_GO = re.compile(r"trace  7\. (go on     (\d+) of (\d+) new tokens, no stop id|stop      stop id (.+) committed"
                        r"|stop      the budget is spent: (\d+) of (\d+) new tokens)")
DRAFT = re.compile(r"trace  2\. draft     K=(\d+): (.+)")
VERIFY = re.compile(r"trace  3\. verify    positions (\d+)\.\.(\d+) in one target forward")
ACCEPT = re.compile(r"trace  4\. accept    target (.+): (\d+) of (\d+) drafts kept")
COMMIT = re.compile(r"trace  5\. commit    (.+) at (\d+)(?:\.\.(\d+))?( \(cut after a stop id\))?; "
                    r"the target adds (.+)")
ROLL_BACK = re.compile(r"trace  6\. roll back cache length (\d+); "
                       r"(?:nothing|position (\d+)|positions (\d+)\.\.(\d+)) stale; "
                       r"the next hidden h\[(\d+)\] is verify row (\d+)")
NO_DRAFTS = "nothing (K = 0: a plain decode step)"


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


@pytest.fixture(scope="module")
def tokenizer() -> Gemma4Tokenizer:
    return Gemma4Tokenizer(TOKENIZER)


@dataclass
class Traced:
    """One round as its trace lines state it."""
    position: int  # the newest committed position before the round
    committed: int  # new tokens committed before it (step 1)
    budget: int
    room: int
    drafted: list[int]
    drafter: tuple | None  # the drafter line's numbers (None at K = 0)
    targets: list[int]
    matched: int
    block: list[int]
    added: int  # the target's own token, g_a
    length: int  # the cache's length after the rollback
    stale: range
    next_hidden: tuple[int, int]  # (the position h is at, the verify row it is)
    verdict: str  # step 7


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


def read_trace(err: str, tokenizer: Gemma4Tokenizer) -> tuple[int, int, str, list[Traced]]:
    """stderr -> (the prompt's length, the prefill's token, the prefill's step 7, every round): the lines in step
    order, each round's in a block numbered 1, 2, ..., the drafter's line after step 2 when K > 0."""
    lines = iter([line for line in err.splitlines() if line.startswith("trace")])
    last, first, at = match(PREFILL, next(lines)).groups()
    assert int(at) == int(last) + 1
    [prefill_token] = tokens(first, tokenizer)
    after_prefill = match(STOP_OR_GO, next(lines)).group(1)
    rounds = []
    for line in lines:
        number, position = map(int, match(ROUND, line).groups())
        assert number == len(rounds) + 1
        committed, budget, room, k = map(int, match(BUDGET, next(lines)).groups())
        shown_k, shown = match(DRAFT, next(lines)).groups()
        drafted = [] if shown == NO_DRAFTS else tokens(shown, tokenizer)
        assert len(drafted) == int(shown_k) == k
        line = next(lines)
        drafter = None
        if k:
            found = match(DRAFTER, line)
            drafter = tuple(g if i == 2 else None if g is None else int(g) for i, g in enumerate(found.groups()))
            line = next(lines)
        assert tuple(map(int, match(VERIFY, line).groups())) == (position, position + len(drafted))
        targets, accepted, of = match(ACCEPT, next(lines)).groups()
        assert int(of) == len(drafted)
        committed_now, start, end, cut, added = match(COMMIT, next(lines)).groups()
        block = tokens(committed_now, tokenizer)
        assert (int(start), int(end or start)) == (position + 1, position + len(block))
        length, one, low, high, hidden_at, row = match(ROLL_BACK, next(lines)).groups()
        stale = range(int(one), int(one) + 1) if one else range(int(low), int(high) + 1) if low else range(0)
        verdict = match(STOP_OR_GO, next(lines)).group(1)
        round = Traced(position, committed, budget, room, drafted, drafter, tokens(targets, tokenizer),
                       int(accepted), block, *tokens(added, tokenizer), int(length), stale,
                       (int(hidden_at), int(row)), verdict)
        assert (len(round.block) < round.matched + 1) == bool(cut)  # only a stop id shortens a block
        rounds.append(round)
    return int(at), prefill_token, after_prefill, rounds


@pytest.mark.parametrize("settings", SETTINGS, ids=["greedy", "sampled", "sample-drafted"])
def test_the_trace_is_the_run(settings: list[str], tokenizer: Gemma4Tokenizer,
                              capsys: pytest.CaptureFixture) -> None:
    status, out, err = run_inprocess(capsys, ["--trace", *NEW_TOKENS, *settings])
    assert status == 0, err
    status, json_out, json_err = run_inprocess(capsys, ["--json", *NEW_TOKENS, *settings])
    assert status == 0, json_err
    run = json.loads(json_out)
    assert out == run["text"] + "\n"  # stdout: the text alone, after the rounds

    prompt, first, after_prefill, rounds = read_trace(err, tokenizer)
    assert prompt == len(tokenizer.encode_raw(generate.CODE_PROMPT))
    assert "--reference: the textbook modules" in err  # --trace runs the textbook on its own modules
    # The trace comes before the statistics block, on stderr, as the rounds happen.
    assert err.rindex("trace  ") < err.index("-- speculative decoding")
    # The rounds and their drafts are those of the same run's statistics.
    assert [(r.drafted, r.matched) for r in rounds] == [(r["drafted"], r["accepted"]) for r in run["stats"]["rounds"]]
    # The committed blocks, the prefill's token first, are the run's tokens.
    assert [first] + [t for r in rounds for t in r.block] == run["tokens"]
    target = load_config(DEMO / "target")
    window = drafter_config_from_dict(read_json(DEMO / "assistant" / "config.json")).text.sliding_window
    sources = (target.kv_source(SLIDING), target.kv_source(FULL))
    budget = int(NEW_TOKENS[1])
    verdicts = [after_prefill] + [r.verdict for r in rounds]
    # Step 7: go on until the last round, which stops for the reason the run finished.
    assert all(v.startswith("go on") for v in verdicts[:-1]) and verdicts[-1].startswith("stop")
    assert ("stop id" in verdicts[-1]) == (run["finish_reason"] == "stop")
    newest, committed, hidden_from = prompt, 1, "the prefill's last row"
    for number, r in enumerate(rounds, 1):
        a, k = r.matched, len(r.drafted)
        assert r.position == newest  # each round starts where the previous one's rollback left it
        # Step 1: the budget left, the room it gives (the drafts and one target token), and the K chosen in it.
        assert (r.committed, r.budget, r.room) == (committed, budget, budget - committed - 1) and k <= r.room
        if k:  # the drafter's line: what its K steps read (mtp/README.md §3-§5)
            token_at, hidden_at, source, sliding, s_first, s_last, full, f_first, f_last, query, steps = r.drafter
            assert (token_at, hidden_at, source, query, steps) == (newest, newest - 1, hidden_from, newest, k)
            assert (sliding, full) == sources
            assert (s_first, s_last or s_first) == (max(0, newest - 1 - window), newest - 1)
            assert (f_first, f_last or f_first) == (0, newest - 1)
        else:
            assert r.drafter is None
        assert r.next_hidden == (newest + a, a)  # h[newest + a]: the verify's row a
        hidden_from = f"verify row {a} of round {number}"
        committed += len(r.block)
        assert r.drafted[:a] == r.targets[:a] and len(r.targets) == a + 1  # d_i == g_(i-1) for i <= a
        assert a == k or r.drafted[a] != r.targets[a]  # the first draft not kept is not the target's token
        assert r.added == r.targets[-1] and r.block == (r.drafted[:a] + [r.added])[:len(r.block)]
        assert r.length == r.position + a + 1
        assert r.stale == range(r.position + a + 1, r.position + k + 1)  # written by the verify, holding no token
        newest = r.length
    assert any(r.stale for r in rounds) and any(not r.stale for r in rounds)  # both kinds of rollback shown


def test_trace_implies_reference(capsys: pytest.CaptureFixture) -> None:
    """--trace alone is --trace --reference: the same header, the same lines, the same text."""
    alone = run_inprocess(capsys, ["--trace", *NEW_TOKENS])
    both = run_inprocess(capsys, ["--trace", "--reference", *NEW_TOKENS])
    assert alone[0] == both[0] == 0, alone[2]
    traced = [[line for line in err.splitlines() if line.startswith(("target", "trace"))] for _, _, err in (alone, both)]
    assert alone[1] == both[1] and traced[0] == traced[1] and "trace  7. stop" in alone[2]


@pytest.mark.parametrize(("flags", "expected"), [
    (["--json"], "error: --trace has no effect here: --json keeps stderr quiet: drop one of the two"),
    (["--show-drafts"], "error: --trace has no effect here: it shows the drafts itself: drop --show-drafts"),
    (["--no-assistant"], "error: --trace has no effect here: --no-assistant runs no rounds to show: drop one of "
                         "the two"),
    (["--compile"], "error: --trace has no effect here: it follows the textbook loop, which runs one text prompt "
                    "eagerly in one prefill, and --compile needs the engine: drop one of the two"),
    (["--prefill-chunk", "4"], "error: --trace has no effect here: it follows the textbook loop, which runs one "
                               "text prompt eagerly in one prefill, and --prefill-chunk needs the engine: drop one "
                               "of the two"),
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
