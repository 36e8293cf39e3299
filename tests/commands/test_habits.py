"""What a user of llama-cli, vLLM, mlx-lm or ollama types, and what the commands answer (scripts/README.md):
- the arguments are parsed before torch is imported: `--help` and a mistyped flag never load it;
- a foreign or mistyped flag names ours ("did you mean"), and the names that mean the same are aliases
  (`--model`/`-m`, `-p`, `-n`/`--max-tokens`, the prompt as plain words), hidden from `--help`;
- `--seed` with greedy decoding runs and says it does nothing; `--dtype auto` is the default, float16 refused;
- `--json` names what ran (target, assistant, dtype, device, threads, prompt and new tokens, memory);
- chat leaves on /bye and /quit, and asks about a bare `exit`;
- the installed commands (`pip install -e .`) run the scripts;
- an int4 release folder finds its assistant as its Hub id does, and the no-Hub error names both repos;
- a failure inside torch.compile is one line naming its cache folder, and an interrupted warm-up removes it;
- progress off a terminal is a line every few seconds, nothing for quick work;
- sampling with argmax drafts that are rarely kept points at --drafting sample.
Tiny models run in this process (tests/commands/test_cli.py's helpers); where the point is a fresh process (no
torch imported, the installed command), a subprocess."""

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import chat
import generate
from cli import progress
from cli.flags import DRAFTING, PREFILL_CHUNK, SCHEDULES, SOFT_TOKEN_CHOICES
from cli.options import default_assistant, offline_pair
from gemma4 import greedy_generate, load_target
from gemma4.engine.ring import PREFILL_CHUNK as RING_CHUNK
from gemma4.vision.processor import SOFT_TOKEN_CHOICES as PROCESSOR_CHOICES
from gemma4.weights import HubUnreachable
from mtp.draft_length import SCHEDULES as LIBRARY_SCHEDULES
from mtp.speculative import DRAFTING as LIBRARY_DRAFTING
from tests.commands.test_cli import assert_one_line_failure, run_inprocess

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
DEMO = SCRIPTS / "demo"
IDS = "2,17,300,45,99"


def test_the_torch_free_parser_offers_the_librarys_choices() -> None:
    assert SCHEDULES == LIBRARY_SCHEDULES and DRAFTING == LIBRARY_DRAFTING
    assert PREFILL_CHUNK == RING_CHUNK and SOFT_TOKEN_CHOICES == PROCESSOR_CHOICES


@pytest.mark.parametrize("script", ("generate.py", "chat.py"))
@pytest.mark.parametrize("args, status", ((["--help"], 0), (["--max_tokens", "3"], 2)))
def test_help_and_a_bad_flag_answer_without_importing_torch(script: str, args: list[str], status: int) -> None:
    """The script run as a command (`__main__`): it exits from the parser before its heavy imports."""
    code = (f"import runpy, sys; sys.argv = [{script!r}, *{args!r}]; sys.path.insert(0, {str(SCRIPTS)!r})\n"
            f"try:\n    runpy.run_path({str(SCRIPTS / script)!r}, run_name='__main__')\n"
            f"except SystemExit as e:\n    print('exit', e.code, 'torch' in sys.modules, file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.stderr.strip().splitlines()[-1] == f"exit {status} False", proc.stderr
    if status:
        assert "did you mean --max-new-tokens?" in proc.stderr


@pytest.mark.parametrize("given, hint", (
    (["--max_new_tokens", "3"], "did you mean --max-new-tokens?"),  # transformers' spelling
    (["--temp", "0.5"], "did you mean --temperature?"),  # llama-cli
    (["--tempreture", "0.5"], "did you mean --temperature?"),  # a typo
    (["--model-draft", "x"], "did you mean --assistant?"),  # llama-cli
    (["-ngl", "99"], "did you mean --device cuda?"),  # llama-cli
    (["-i"], "did you mean chat.py?"),  # llama-cli's interactive mode
    (["--num-speculative-tokens", "4"], "did you mean --num-assistant-tokens?"),  # vLLM
    (["--tensor-parallel-size", "2"], "did you mean --tensor-parallel?"),  # vLLM
))
def test_a_foreign_flag_names_ours(capsys: pytest.CaptureFixture, given: list[str], hint: str) -> None:
    status, out, err = run_inprocess(capsys, given)
    assert_one_line_failure(status, out, err, f"unrecognized argument {given[0]}: {hint}")


def test_chat_names_its_own_flags(capsys: pytest.CaptureFixture) -> None:
    for given, expected in ((["--ctx-size", "100"], "did you mean --context?"),
                            (["hello"], "chat.py reads its messages at the >>> prompt")):
        with pytest.raises(SystemExit) as e:
            chat.cli(given, source=io.StringIO(""))
        out, err = capsys.readouterr()
        assert_one_line_failure(e.value.code, out, err, expected)


def test_aliases_run_as_our_flags_and_help_shows_one_name(capsys: pytest.CaptureFixture) -> None:
    ours = ["--target", str(DEMO / "target"), "--max-new-tokens", "6", "--prompt", "def f(x):", "--json"]
    status, out, err = run_inprocess(capsys, ours)
    assert status == 0, err
    expected = json.loads(out)["tokens"]
    for theirs in (["--model", str(DEMO / "target"), "-n", "6", "-p", "def f(x):", "--json"],
                   ["-m", str(DEMO / "target"), "--max-tokens", "6", "--json", "def", "f(x):"],  # ollama's words
                   ["def", "f(x):", "-n", "6", "--json"]):
        status, out, err = run_inprocess(capsys, theirs)
        assert status == 0, err
        assert json.loads(out)["tokens"] == expected, theirs
    with pytest.raises(SystemExit):
        generate.cli(["--help"])
    options = capsys.readouterr().out.split("\ndefaults:")[0]  # usage and options; the epilog names the aliases
    assert "--target" in options and "--max-new-tokens" in options
    assert not re.findall(r"(?<![\w-])(--model|-m|--max-tokens|-n|-p)(?![\w-])", options)
    assert "[words ...]" not in options  # the positional prompt is not listed either


@pytest.mark.parametrize("args, expected", (
    (["--prompt", "Tell", "me", "more"], "--prompt takes one argument, and 'me more' followed it: quote"),
    (["--prompt-ids", IDS, "hello"], "'hello' is a text prompt and --prompt-ids gives the ids"),
    (["--dtype", "float16"], "--dtype float16: Gemma 4 is trained and released in bfloat16"),
    (["--tensor-parallel", "0"], "--tensor-parallel must be at least 1"),
))
def test_what_the_aliases_cannot_mean_is_refused(capsys: pytest.CaptureFixture, args: list[str],
                                                 expected: str) -> None:
    status, out, err = run_inprocess(capsys, [*args, "--max-new-tokens", "2"])
    assert_one_line_failure(status, out, err, expected)


def test_seed_with_greedy_runs_and_says_it_does_nothing(capsys: pytest.CaptureFixture) -> None:
    args = ["--prompt-ids", IDS, "--max-new-tokens", "8", "--temperature", "0"]
    status, plain, _ = run_inprocess(capsys, [*args, "--json"])
    assert status == 0
    status, seeded, _ = run_inprocess(capsys, [*args, "--seed", "3", "--json"])
    assert status == 0 and json.loads(seeded)["tokens"] == json.loads(plain)["tokens"]
    status, _, err = run_inprocess(capsys, [*args, "--seed", "0", "--dtype", "auto"])
    assert status == 0 and "decoding   greedy, --seed 0 has no effect" in err, err
    assert "(float32 on cpu" in err  # auto: the default, float32 for a float target on the CPU


def test_json_says_what_ran(capsys: pytest.CaptureFixture) -> None:
    status, out, err = run_inprocess(capsys, ["--prompt-ids", IDS, "--max-new-tokens", "7", "--json"])
    assert status == 0 and err == ""
    run = json.loads(out)
    assert run["target"] == "scripts/demo/target" and run["assistant"] == "scripts/demo/assistant"
    assert (run["dtype"], run["device"], run["threads"]) == ("float32", "cpu", torch.get_num_threads())
    assert (run["prompt_tokens"], run["new_tokens"]) == (5, len(run["tokens"])) and run["new_tokens"] == 7
    target = load_target(DEMO / "target")
    held = sum(t.numel() * t.element_size() for t in [*target.parameters(), *target.buffers()])
    assert held < run["memory"]["weights_bytes"] < 2 * held  # the target's bytes and the drafter's
    assert run["memory"]["peak_bytes"] > run["memory"]["weights_bytes"]  # Linux says it


def test_chat_leaves_on_bye_and_asks_about_a_bare_exit(capsys: pytest.CaptureFixture) -> None:
    flags = ["--max-new-tokens", "3", "--temperature", "0"]
    for lines, turns in (("/bye\nhello\n", 0), ("/quit\n", 0), ("exit\ny\nhello\n", 0), ("quit\nn\nhi\n/exit\n", 1),
                         ('"""\nexit\n"""\n/exit\n', 1)):  # a fenced block is a message, whatever it says
        status = chat.cli(flags, source=io.StringIO(lines))
        out, err = capsys.readouterr()
        assert status == 0, err
        assert bool(out.strip()) == bool(turns), (lines, out, err)  # a reply's text, or none
        assert ("leave the conversation? y leaves, n stays" in err) == lines.startswith(("exit", "quit")), err


def test_the_installed_commands_run_the_scripts() -> None:
    """`pip install -e .` (the README's commands) puts gemma4-generate, gemma4-chat and gemma4-benchmark beside
    the interpreter."""
    for name in ("gemma4-generate", "gemma4-chat", "gemma4-benchmark"):
        command = Path(sys.executable).parent / name
        proc = subprocess.run([str(command), "--help"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and proc.stdout.startswith("usage: "), (name, proc.stderr)


def test_an_int4_release_folder_finds_its_assistant(tmp_path: Path) -> None:
    target = tmp_path / "gemma-4-E2B-it-qat-w4a16-ct"
    assistant = tmp_path / "gemma-4-E2B-it-qat-q4_0-unquantized-assistant"
    target.mkdir()
    assert default_assistant(str(target))[0] == str(assistant)  # none there yet: the one the error will name
    assistant.mkdir()
    found, rule = default_assistant(str(target))
    assert found == str(assistant) and "directory pairs with" in rule
    plain = tmp_path / "gemma-4-E2B-it"
    plain.mkdir()
    (tmp_path / "gemma-4-E2B-it-assistant").mkdir()
    assert default_assistant(str(plain))[0] == str(tmp_path / "gemma-4-E2B-it-assistant")


def test_the_offline_error_names_both_repos() -> None:
    from cli.flags import ModelFlags

    flags = ModelFlags(**{f: None for f in ModelFlags.__dataclass_fields__} | {
        "no_assistant": False, "ignore_eos": False, "show_drafts": False, "compile": False, "reference": False})
    e = HubUnreachable("google/gemma-4-E2B-it-qat-w4a16-ct is not on this machine", "google/gemma-4-E2B-it-qat-w4a16-ct")
    line = str(offline_pair(e, "google/gemma-4-E2B-it-qat-w4a16-ct", flags))
    assert "hf download google/gemma-4-E2B-it-qat-w4a16-ct --local-dir gemma-4-E2B-it-qat-w4a16-ct" in line
    assert "hf download google/gemma-4-E2B-it-qat-q4_0-unquantized-assistant" in line
    assert offline_pair(e, "google/gemma-4-E2B-it-qat-w4a16-ct", flags.__class__(
        **{**flags.__dict__, "no_assistant": True})) is e  # no assistant runs: the target's own line


@pytest.mark.parametrize("raised", (RuntimeError("InductorError: ImportError: model.so: file too short\n  more"),
                                    KeyboardInterrupt()))
def test_a_compile_failure_is_one_line_and_an_interrupted_warm_up_leaves_no_cache(
        capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, raised: BaseException) -> None:
    """The failure is injected in the warm-up's place (a real damaged cache takes minutes of compiling to hit)."""
    from gemma4.fast.static import StaticTarget

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    folder = tmp_path / "gemma4-mtp" / "torch-compile"

    def warm_up(self: StaticTarget, *args: object) -> None:
        (folder / "half-written.so").parent.mkdir(parents=True, exist_ok=True)
        (folder / "half-written.so").write_bytes(b"")
        raise raised

    monkeypatch.setattr(StaticTarget, "warm_up", warm_up)
    status, out, err = run_inprocess(capsys, ["--prompt-ids", IDS, "--max-new-tokens", "4", "--compile"])
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)  # compiling() set it for the process
    if isinstance(raised, KeyboardInterrupt):
        assert status == 130 and "Traceback" not in err and not folder.exists()
    else:
        assert_one_line_failure(status, out, err, f"Its cache at {folder} may be damaged")
        assert "file too short" in err and "run without --compile" in err


def test_progress_off_a_terminal_is_a_line_every_few_seconds(capsys: pytest.CaptureFixture,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "EVERY", 0.05)
    assert list(progress.progress(range(3), "quick", 3)) == [0, 1, 2]
    assert capsys.readouterr().err == ""  # quicker than a line: nothing
    for _ in progress.progress(range(2), "slow", 2):
        time.sleep(0.2)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) >= 3 and lines[0].startswith("slow: 0/2 after") and lines[-1].startswith("slow: done, 2/2 in")
    for _ in progress.progress(range(2), "quiet", 2, quiet=True):
        time.sleep(0.1)
    assert capsys.readouterr().err == ""  # --json


def test_rarely_kept_argmax_drafts_point_at_sample_drafting(capsys: pytest.CaptureFixture) -> None:
    seen = []
    for t in ("0.7", "1.5"):
        status, out, err = run_inprocess(capsys, ["--prompt-ids", IDS, "--max-new-tokens", "40", "--temperature", t])
        assert status == 0, err
        rate = float(err.split("acceptance rate ")[1].split("%")[0]) / 100
        seen.append(rate < 0.3)
        assert ("--drafting sample draws the drafts" in err) == (rate < 0.3), err
    status, out, err = run_inprocess(capsys, ["--prompt-ids", IDS, "--max-new-tokens", "40", "--temperature", "1.5",
                                              "--drafting", "sample"])
    assert status == 0 and "hint" not in err
    assert any(seen)  # the demo at T 1.5 keeps few argmax drafts: the hint was shown


def test_video_frames_given_a_file_says_so(capsys: pytest.CaptureFixture) -> None:
    status, out, err = run_inprocess(capsys, ["--target", str(DEMO / "media" / "target"), "--video-frames",
                                              str(DEMO / "media" / "picture.png"), "--prompt", "x"])
    assert_one_line_failure(status, out, err, "picture.png is a file, and a video is given as the directory")


def test_tensor_parallel_starts_its_own_ranks_and_reads_like_one_process() -> None:
    args = ["--prompt", "def read_config(path):", "--temperature", "0", "--max-new-tokens", "16", "--json"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runs = [subprocess.run([sys.executable, str(SCRIPTS / "generate.py"), *args, *extra], capture_output=True,
                           text=True, timeout=300, env=env, cwd=REPO) for extra in ([], ["--tensor-parallel", "2"])]
    for proc in runs:
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    alone, ranks = (json.loads(proc.stdout) for proc in runs)
    assert ranks["tokens"] == alone["tokens"] and len(ranks["tokens"]) == 16


def test_ctrl_c_under_tensor_parallel_is_one_line() -> None:
    """SIGINT to the command (what a terminal's Ctrl-C sends it): rank 0 stops as one process does."""
    proc = subprocess.Popen([sys.executable, str(SCRIPTS / "generate.py"), "--tensor-parallel", "2", "--prompt",
                             "def f(x):", "--max-new-tokens", "900", "--ignore-eos"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
    seen = []
    while not any(line.startswith("decoding") for line in seen):  # the header's last line: the run begins
        line = proc.stderr.readline()
        assert line, "".join(seen)
        seen.append(line)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    lines = ("".join(seen) + err).strip().splitlines()
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert lines[-1].startswith("interrupted after ") and lines[-1].endswith(" new tokens"), lines[-3:]
