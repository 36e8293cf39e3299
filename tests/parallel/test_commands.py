"""The commands under ranks as torchrun starts them (scripts/cli/parallel.py), on the demo pair (4 query heads,
1 kv head, MLP 256: 2 and 4 ranks split it, 3 do not):
- generate.py on 2 ranks prints what one process prints, from rank 0 alone;
- chat.py on 2 ranks: rank 0 reads the lines and every rank answers them;
- what cannot run is refused on every rank in one line before any weight is read: a rank count that does not
  divide the heads, --compile, another checkpoint on one rank;
- a rank that dies: the others stop with one line, within gemma4.parallel.group's TIMEOUT, not a hang;
- Ctrl-C (SIGINT to every rank, as a terminal sends it) ends every rank at once.
"""

import json
import shutil
import signal
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from gemma4.parallel.group import TIMEOUT
from tests.parallel.harness import ROOT, finish, start_ranks

DEMO = ROOT / "scripts" / "demo"
GENERATE = ["scripts/generate.py", "--target", str(DEMO / "target"), "--assistant", str(DEMO / "assistant"),
            "--prompt", "def read_config(path):", "--temperature", "0"]


def one_line(err: str, expected: str) -> None:
    """stderr ends in one error line holding `expected` (after the run's header, where it got that far)."""
    lines = err.strip().splitlines()
    assert "Traceback" not in err and [line for line in lines if line.startswith("error:")] == lines[-1:], err
    assert expected in lines[-1], lines[-1]


def test_generate_on_two_ranks_prints_what_one_process_prints() -> None:
    args = [*GENERATE, "--max-new-tokens", "24", "--json", "--compare"]
    (code0, out0, err0), (code1, out1, err1) = finish(start_ranks(2, args))
    assert code0 == code1 == 0, err0 + err1
    assert out1 == err1 == ""  # rank 1 is muted
    ranks = json.loads(out0)
    (code, out, err), = finish(start_ranks(1, args))
    alone = json.loads(out)
    assert ranks["tokens"] == alone["tokens"] and ranks["identical"] is True and len(ranks["tokens"]) == 24


@pytest.mark.parallel
def test_chat_on_two_ranks_answers_rank_0s_lines(tmp_path: Path) -> None:
    lines = tmp_path / "lines.txt"
    lines.write_text("Hello\nWrite a function\n")
    args = ["scripts/chat.py", "--target", str(DEMO / "target"), "--assistant", str(DEMO / "assistant"),
            "--max-new-tokens", "12", "--temperature", "0", "--json"]
    procs = start_ranks(2, args, stdin=lines)
    (code0, out0, err0), (code1, out1, _) = finish(procs)
    assert code0 == code1 == 0, err0
    turns = [json.loads(line) for line in out0.splitlines()]
    assert [t["turn"] for t in turns] == [1, 2] and all(t["tokens"] for t in turns) and out1 == ""


@pytest.mark.parametrize(("world", "extra", "expected"), [
    (3, [], "3 ranks cannot split the target: 4 query heads"),
    (2, ["--prompts-file", "-"], "--prompts-file - reads stdin, which every rank under torchrun shares: write "
                                 "the prompts to a file and give its path"),
    pytest.param(2, ["--compile"], "--compile cannot run tensor-parallel", marks=pytest.mark.parallel),
])
def test_what_ranks_cannot_run_is_one_line_on_every_rank(world: int, extra: list[str], expected: str) -> None:
    """Every rank refuses (exit status 2); rank 0 alone prints the line, once."""
    results = finish(start_ranks(world, [*GENERATE, "--max-new-tokens", "4", *extra]))
    code, out, err = results[0]
    assert code == 2 and out == "", err
    one_line(err, expected)
    assert all(c == 2 for c, _, _ in results)
    assert all(out == err == "" for _, out, err in results[1:])


@pytest.mark.parallel  # rank 0 waits gemma4.parallel.group's TIMEOUT (60 s) for the rank that never joins
def test_a_rank_that_stops_before_joining_is_one_line() -> None:
    procs = start_ranks(2, [*GENERATE, "--max-new-tokens", "4"], per_rank={1: ["--top-k", "-1"]})
    (code0, out0, err0), (code1, _, err1) = finish(procs)
    assert code1 == 2 and err1 == ""  # refused before it joined: muted, as every rank but 0
    assert code0 == 2 and out0 == ""
    one_line(err0, "rank 0 could not join the tensor-parallel run: not every rank joined within 60 s")


def test_another_checkpoint_on_one_rank_is_one_line(tmp_path: Path) -> None:
    """A checkpoint of the same geometry with other weights (a fine-tune: the same config and headers) on rank 1:
    every rank refuses in one line before the first forward."""
    other = shutil.copytree(DEMO / "target", tmp_path / "target")
    tensors = load_file(other / "model.safetensors")
    save_file({name: t * 1.01 if name.endswith("mlp.up_proj.weight") else t for name, t in tensors.items()},
              other / "model.safetensors", metadata={"format": "pt"})
    procs = start_ranks(2, [*GENERATE, "--max-new-tokens", "4"], per_rank={1: ["--target", str(other)]})
    (code0, out0, err0), (code1, out1, err1) = finish(procs)
    assert code0 == code1 == 2 and out0 == out1 == err1 == ""  # refused on every rank, said once by rank 0
    one_line(err0, "rank 1 was given another target checkpoint than rank 0")


def test_a_rank_that_dies_stops_the_others_with_one_line() -> None:
    procs = start_ranks(2, [*GENERATE, "--max-new-tokens", "400"])
    first = procs[0].stdout.read(1)  # rank 0 streams: both ranks have loaded and are decoding
    assert first
    procs[1].send_signal(signal.SIGKILL)
    start = time.monotonic()
    code, _, err = finish(procs[:1])[0]
    assert time.monotonic() - start < TIMEOUT.total_seconds() + 10
    assert code not in (0, 2)
    one_line(err, "lost the other ranks")
    finish(procs[1:])


def test_ctrl_c_ends_every_rank_at_once() -> None:
    """Ctrl-C on a terminal signals torchrun and every rank: each ends there (rank 0 at its prompt or mid-reply
    would otherwise go on while the others block in a collective)."""
    procs = start_ranks(2, [*GENERATE, "--max-new-tokens", "400"])
    assert procs[0].stdout.read(1)  # decoding
    for p in procs:
        p.send_signal(signal.SIGINT)
    start = time.monotonic()
    codes = [code for code, _, _ in finish(procs)]
    assert codes == [-signal.SIGINT] * 2 and time.monotonic() - start < 10
