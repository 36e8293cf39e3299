"""scripts/generate.py over a long prompt: `--prefill-chunk` changes how the prompt runs, never the tokens, and a
run whose KV cache cannot fit the memory left is refused before any work, in one line."""

import json
from pathlib import Path

import pytest

import cli.options
from tests.commands.test_cli import assert_one_line_failure, run_inprocess  # the `pair` fixture is in conftest.py

PROMPT = ",".join(str(7 + (i * 37) % 400) for i in range(45))  # 45 ids: several of the target's 8-key windows


def run_json(capsys: pytest.CaptureFixture, args: list[str]) -> dict:
    status, out, err = run_inprocess(capsys, [*args, "--json"])
    assert status == 0, err
    return json.loads(out)


@pytest.mark.parametrize("no_assistant", [False, True])
def test_prefill_chunk_changes_no_token(no_assistant: bool, pair: tuple[Path, Path],
                                        capsys: pytest.CaptureFixture) -> None:
    """Chunks of 1, 7 and 64 (which does not divide the prompt; one pass) give the same tokens, speculative and plain,
    and the speculative run reproduces the plain one."""
    args = ["--target", str(pair[0]), "--prompt-ids", PROMPT, "--max-new-tokens", "24", "--ignore-eos"]
    args += ["--no-assistant"] if no_assistant else ["--assistant", str(pair[1]), "--compare"]
    runs = [run_json(capsys, [*args, "--prefill-chunk", str(c)]) for c in (1, 7, 64)]
    assert runs[0]["tokens"] == runs[1]["tokens"] == runs[2]["tokens"]
    if not no_assistant:
        assert all(r["identical"] for r in runs)


def test_a_cache_that_cannot_fit_is_refused(pair: tuple[Path, Path], capsys: pytest.CaptureFixture,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The needed bytes against what the machine says is available (made small here: the test's cache is a few KB)."""
    monkeypatch.setattr(cli.options, "available_bytes", lambda device: 1000)
    status, out, err = run_inprocess(capsys, ["--target", str(pair[0]), "--prompt-ids", PROMPT])
    assert_one_line_failure(status, out, err, "GB are available: shorten the prompt or --max-new-tokens")
    assert "the KV cache of 173 positions needs" in err  # 45 prompt ids + 128 new tokens
