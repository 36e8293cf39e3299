"""The defaults rule and the refusal rule of scripts/generate.py (scripts/cli/options.py), case by case.

- A flag changes only itself: the run without arguments, `--json` alone and `--seed 1` differ only in
  what was asked, on the demo (whose generation_config.json says greedy) and on a release-shaped
  test target (whose file says sample at T 1, top-k 64, top-p 0.95).
- Naming the demo's own directories is the run without arguments.
- A flag that would do nothing in the given combination is refused before any weights load: one line, exit
  status 2. (`--seed` on a greedy run is let through and said to do nothing: tests/commands/test_habits.py.)
- `--reference` (the textbook's modules, no speed layer) gives the default run's tokens.
"""

import json
import shutil
from pathlib import Path

import pytest

import cli.options
from tests.commands.test_cli import assert_one_line_failure, run_inprocess  # the `pair` fixture is in conftest.py

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "scripts" / "demo"
SHORT = ["--max-new-tokens", "12"]


def run_json(capsys: pytest.CaptureFixture, args: list[str]) -> dict:
    status, out, err = run_inprocess(capsys, [*args, "--json"])
    assert status == 0, err
    assert err == ""  # --json keeps stderr quiet
    return json.loads(out)


def test_demo_defaults_are_its_files(capsys: pytest.CaptureFixture) -> None:
    status, out, err = run_inprocess(capsys, SHORT)
    assert status == 0, err
    result = run_json(capsys, SHORT)
    assert out == result["text"] + "\n"  # the same run: --json changes only the output
    assert result["sampling"] == {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0, "drafting": "argmax"}
    assert "no chat template" in err and "(raw)" in err and "decoding   greedy" in err
    # the demo's generation_config.json carries top-k and top-p for a sampled run
    sampled = run_json(capsys, [*SHORT, "--temperature", "0.7"])
    assert sampled["sampling"] == {"temperature": 0.7, "top_k": 64, "top_p": 0.95, "seed": 0, "drafting": "argmax"}


@pytest.mark.parametrize("named", [["--target", "scripts/demo/target"],
                                   ["--target", str(DEMO / "target"), "--assistant", str(DEMO / "assistant")]])
def test_naming_the_demo_is_the_default_run(named: list[str], capsys: pytest.CaptureFixture,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # the relative path as README writes it
    default = run_json(capsys, SHORT)
    given = run_json(capsys, [*named, *SHORT])
    assert given["tokens"] == default["tokens"] and given["sampling"] == default["sampling"]
    assert [(r["drafted"], r["accepted"]) for r in given["stats"]["rounds"]] == \
           [(r["drafted"], r["accepted"]) for r in default["stats"]["rounds"]]  # the same assistant, the same K


def test_release_shaped_defaults_sample(pair, capsys: pytest.CaptureFixture) -> None:  # noqa: ANN001
    common = ["--target", str(pair[0]), "--prompt", "hi", *SHORT, "--ignore-eos"]
    status, out, err = run_inprocess(capsys, common)
    assert status == 0, err
    base = run_json(capsys, common)
    assert out == base["text"] + "\n"
    assert base["sampling"] == {"temperature": 1.0, "top_k": 64, "top_p": 0.95, "seed": 0, "drafting": "argmax"}
    seeded = run_json(capsys, [*common, "--seed", "1"])
    assert seeded["sampling"] == {**base["sampling"], "seed": 1}  # only what was asked
    assert seeded["tokens"] != base["tokens"]
    assert run_json(capsys, [*common, "--seed", "0"])["tokens"] == base["tokens"]  # 0 is the default seed
    greedy = run_json(capsys, [*common, "--temperature", "0"])
    assert greedy["sampling"] == {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0, "drafting": "argmax"}


def _greedy_copy(target: Path, tmp: Path) -> Path:
    """The test target with a generation_config.json that does not sample."""
    d = shutil.copytree(target, tmp / "greedy-target")
    gen = json.loads((d / "generation_config.json").read_text())
    (d / "generation_config.json").write_text(json.dumps({k: v for k, v in gen.items() if k != "do_sample"}))
    return d


REFUSED = {  # name -> (arguments, what the line names)
    "top-k, greedy by flag": (["--temperature", "0", "--top-k", "10"], "--top-k has no effect here: it applies to sampling, and --temperature 0"),
    "top-p, greedy by flag": (["--temperature", "0", "--top-p", "0.5"], "--top-p has no effect here"),
    "drafting, greedy by flag": (["--temperature", "0", "--drafting", "argmax"], "--drafting has no effect here"),
    "top-k, greedy by file": (["GREEDY", "--top-k", "10"], "says greedy (no do_sample): add --temperature T"),
    "assistant without one": (["--no-assistant", "--assistant", "X"], "--assistant has no effect here"),
    "K without an assistant": (["--no-assistant", "--num-assistant-tokens", "3"], "--num-assistant-tokens has no effect"),
    "schedule without an assistant": (["--no-assistant", "--schedule", "heuristic"], "--schedule has no effect here"),
    "drafting without an assistant": (["--no-assistant", "--drafting", "argmax"], "--drafting has no effect here"),
    "show-drafts without an assistant": (["--no-assistant", "--show-drafts"], "--show-drafts has no effect here"),
    "compare without an assistant": (["--no-assistant", "--compare"], "--compare has no effect here"),
    "show-drafts with json": (["--show-drafts", "--json"], "--show-drafts has no effect here: --json streams no text"),
    "raw on a model without a chat template": (["DEMO", "--raw", "--prompt", "def f():"], "--raw has no effect here"),
    "raw with ids": (["--prompt-ids", "2,3", "--raw"], "--raw applies to --prompt text"),
    "show-drafts with several prompts": (["--prompt", "hi", "--prompt", "yo", "--show-drafts"],
                                         "--show-drafts has no effect here: it marks the streamed text of one"),
    "reference with compile": (["--reference", "--compile"], "--reference runs the textbook's modules"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_flags_that_would_do_nothing_are_refused(case: str, pair, tmp_path: Path,  # noqa: ANN001
                                                 capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused before any weights load: the loaders here fail the test if called."""
    def no_weights(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"{case}: weights loaded before the refusal")
    monkeypatch.setattr(cli.options, "load_target", no_weights)
    monkeypatch.setattr(cli.options, "load_drafter", no_weights)
    args, expected = REFUSED[case]
    if args[0] == "GREEDY":
        args = ["--target", str(_greedy_copy(pair[0], tmp_path)), "--assistant", str(pair[1]), *args[1:]]
    elif args[0] == "DEMO":
        args = args[1:]
    elif "--no-assistant" in args:
        args = ["--target", str(pair[0]), *args]
    else:
        args = ["--target", str(pair[0]), "--assistant", str(pair[1]), *args]
    status, out, err = run_inprocess(capsys, args)
    assert_one_line_failure(status, out, err, expected)
    assert out == ""


def test_reference_gives_the_default_tokens(pair, capsys: pytest.CaptureFixture) -> None:  # noqa: ANN001
    """--reference loads both models with fast=False (the textbook's modules): the same tokens as the default run,
    speculative and plain, on the float32 test pair."""
    base = ["--target", str(pair[0]), "--prompt", "hi", "--max-new-tokens", "24"]
    for args in ([*base, "--assistant", str(pair[1])], [*base, "--no-assistant"]):
        default, reference = run_json(capsys, args), run_json(capsys, [*args, "--reference"])
        assert reference["tokens"] == default["tokens"] and len(default["tokens"]) > 0


def test_reference_with_compile_is_one_line(capsys: pytest.CaptureFixture) -> None:
    status, out, err = run_inprocess(capsys, ["--reference", "--compile"])
    assert_one_line_failure(status, out, err, "--reference runs the textbook's modules")
    assert len(err.strip().splitlines()) == 1 and out == ""
