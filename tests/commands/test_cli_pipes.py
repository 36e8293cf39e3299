"""scripts/generate.py in a pipe, as a real subprocess on the demo pair: stdout holds the generated
text and nothing else; prompts come from a file or stdin, one per line or in blocks between `---` lines."""

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from tests.commands.test_cli import run_inprocess  # the `pair` fixture is in conftest.py

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "generate.py"


def run(args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], input=stdin, capture_output=True, text=True,
                          env=env, timeout=120)


def test_stdout_is_the_text_alone() -> None:
    args = ["--max-new-tokens", "16", "--show-drafts", "--compare"]
    piped = run(args)
    assert piped.returncode == 0, piped.stderr
    result = json.loads(run(["--max-new-tokens", "16", "--compare", "--json"]).stdout)
    assert piped.stdout == result["text"] + "\n"  # no header, no marks, no statistics
    err = piped.stderr
    assert 'prompt     "    def __getitem__(self, key):"' in err  # the header shows the prompt
    assert "⟦" in err and "-- speculative decoding" in err and "identical tokens     yes" in err


def test_prompts_from_stdin_in_blocks(capsys: pytest.CaptureFixture) -> None:
    prompts = ["def f(x):\n    return", "class A:\n\n    pass"]  # the second holds a blank line
    text = "---\n" + "\n---\n".join(prompts) + "\n---\n\n"  # opening and closing separators, a blank line after
    proc = run(["--prompts-file", "-", "--max-new-tokens", "6", "--json"], stdin=text)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["rows"]
    for prompt, row in zip(prompts, rows, strict=True):
        alone = json.loads(run_inprocess(capsys, ["--prompt", prompt, "--max-new-tokens", "6", "--json"])[1])
        assert row["tokens"] == alone["tokens"]


def test_prompts_file_lines(pair, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:  # noqa: ANN001
    """A file is one prompt, however many lines it wraps over; `---` lines ask for a batch. A note says how many
    prompts were read."""
    common = ["--target", str(pair[0]), "--assistant", str(pair[1]), "--max-new-tokens", "4", "--json"]
    file = tmp_path / "prompts.txt"
    wrapped = "\n".join(f"line {i}" for i in range(30))
    file.write_text(wrapped + "\n\n\n")  # blank lines at the end are no part of it
    status, out, err = run_inprocess(capsys, [*common, "--prompts-file", str(file)])
    assert status == 0, err
    assert "rows" not in json.loads(out)  # one prompt: the one-prompt object
    assert json.loads(out)["tokens"] == json.loads(run_inprocess(capsys, [*common, "--prompt", wrapped])[1])["tokens"]
    assert err == "" and json.loads(out)["notes"][0].startswith(f"1 prompt read from {file} (the whole file")
    file.write_text("hi\n---\nthere\n\n\n")
    status, out, err = run_inprocess(capsys, [*common, "--prompts-file", str(file)])
    assert status == 0, err
    assert len(json.loads(out)["rows"]) == 2 and json.loads(out)["notes"][0] == f"2 prompts read from {file}"
    assert err == ""  # --json keeps stderr quiet
    file.write_text("hi\n---\n   \n---\nthere\n")
    status, out, err = run_inprocess(capsys, [*common, "--prompts-file", str(file)])
    assert status == 2 and "the prompt at line 3 of --prompts-file" in err


def test_max_new_tokens_beyond_the_context(pair, capsys: pytest.CaptureFixture) -> None:  # noqa: ANN001
    ids = ",".join(["7"] * 1000)  # the test target's context is 1024
    status, out, err = run_inprocess(capsys, ["--target", str(pair[0]), "--assistant", str(pair[1]), "--prompt-ids",
                                              ids, "--max-new-tokens", "5000", "--ignore-eos", "--json"])
    assert status == 0, err
    assert err == ""  # --json: the note is in the document
    assert json.loads(out)["notes"] == ["--max-new-tokens 5000 is cut to 24: the context holds 1024 positions and "
                                        "the prompt takes 1000"]
    assert len(json.loads(out)["tokens"]) == 24


def read_terminal(args: list[str], env: dict[str, str]) -> tuple[str, str]:
    """Run with stdout on a pseudo-terminal and stderr on a pipe; returns what each received."""
    main, child = pty.openpty()
    proc = subprocess.Popen([sys.executable, str(SCRIPT), *args], stdout=child, stderr=subprocess.PIPE,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **env})
    os.close(child)
    chunks = []
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    os.close(main)
    return b"".join(chunks).decode().replace("\r\n", "\n"), err


@pytest.mark.parametrize("no_color", [False, True])
def test_terminal_shows_the_marks_inline(no_color: bool, capsys: pytest.CaptureFixture) -> None:
    env = {"TERM": "xterm", "NO_COLOR": "1" if no_color else ""}  # an empty NO_COLOR counts as unset
    out, err = read_terminal(["--max-new-tokens", "16", "--show-drafts"], env)
    text = json.loads(run_inprocess(capsys, ["--max-new-tokens", "16", "--json"])[1])["text"]
    opened, closed = ("⟦", "⟧") if no_color else ("\x1b[32m", "\x1b[0m")
    assert opened in out and out.replace(opened, "").replace(closed, "") == text + "\n"
    legend, _, rest = err.partition("the rest the target supplied")
    assert "-- speculative decoding" in rest and opened not in rest  # stderr: no copy of the text
