"""scripts/generate.py with several prompts (scripts/cli/batch.py), in this process, on a tiny pair:
every row is the single-prompt run of its prompt (sampling: with seed + i), the JSON object and its
totals, the labelled text, and bad input as one line and exit 2."""

import json
from pathlib import Path

import pytest

from tests.commands.test_cli import assert_one_line_failure, run_inprocess  # the `pair` fixture is in conftest.py

ROW_KEYS = {"tokens", "text", "finish_reason", "stats", "sampling"}  # the one-prompt object without --compare


def common(pair: tuple[Path, Path]) -> list[str]:
    target, assistant = pair
    return ["--target", str(target), "--assistant", str(assistant), "--max-new-tokens", "16",
            "--num-assistant-tokens", "3", "--ignore-eos"]


def single(capsys: pytest.CaptureFixture, args: list[str]) -> dict:
    status, out, _ = run_inprocess(capsys, [*args, "--json"])
    assert status == 0
    return json.loads(out)


@pytest.mark.parametrize("drafting", ("argmax", "sample"))
def test_rows_are_single_runs_with_seed_plus_i(pair, capsys: pytest.CaptureFixture,  # noqa: ANN001
                                               drafting: str) -> None:
    texts = ["hi", "tell me about foxes", "hi"]
    sampled = [*common(pair), "--temperature", "0.9", "--top-k", "20", "--drafting", drafting]
    status, out, err = run_inprocess(capsys, [*sampled, "--seed", "7", *[x for t in texts for x in ("--prompt", t)],
                                              "--json"])
    assert status == 0, err
    result = json.loads(out)  # stdout holds the one object
    assert set(result) == {"rows", "stats", "notes"} and len(result["rows"]) == 3
    for i, (text, row) in enumerate(zip(texts, result["rows"])):
        assert set(row) == ROW_KEYS
        alone = single(capsys, [*sampled, "--seed", str(7 + i), "--prompt", text])
        assert row["tokens"] == alone["tokens"] and row["text"] == alone["text"]
        assert row["sampling"] == alone["sampling"]
        assert outcomes(row) == outcomes(alone)  # the rounds, their times aside
    assert result["rows"][0]["tokens"] != result["rows"][2]["tokens"]  # the same prompt, another seed
    totals = result["stats"]
    assert totals["tokens"] == sum(len(r["tokens"]) for r in result["rows"]) == 48
    assert totals["tokens_per_second"] == pytest.approx(totals["tokens"] / totals["seconds"])
    assert totals["target_forwards"] == max(r["stats"]["target_forwards"] for r in result["rows"])
    assert totals["accepted"] == sum(r["stats"]["accepted"] for r in result["rows"])


def test_prompt_ids_file_and_text_output(pair, capsys: pytest.CaptureFixture, tmp_path: Path) -> None:  # noqa: ANN001
    greedy = ["--target", str(pair[0]), "--max-new-tokens", "16", "--ignore-eos", "--no-assistant", "--temperature", "0"]
    ids = ["2,105,300,301", "2,7,8,9,10,11,12"]
    status, out, _ = run_inprocess(capsys, [*greedy, "--prompt-ids", ids[0], "--prompt-ids", ids[1], "--json"])
    rows = json.loads(out)["rows"]
    assert status == 0
    assert [r["tokens"] for r in rows] == [single(capsys, [*greedy, "--prompt-ids", i])["tokens"] for i in ids]
    file = tmp_path / "prompts.txt"
    file.write_text("hi\n---\ntell me about foxes\n")
    from_file = json.loads(run_inprocess(capsys, [*common(pair), "--prompts-file", str(file), "--json"])[1])
    given = json.loads(run_inprocess(capsys, [*common(pair), "--prompt", "hi", "--prompt", "tell me about foxes",
                                              "--json"])[1])
    assert [r["tokens"] for r in from_file["rows"]] == [r["tokens"] for r in given["rows"]]
    status, out, err = run_inprocess(capsys, [*common(pair), "--prompts-file", str(file), "--compare"])
    assert status == 0
    assert out.startswith("== row 0: 16 tokens, finished by length") and "\n== row 1: " in out  # rows: stdout
    assert "batch of 2 rows, speculative decoding: 32 tokens" in err and "identical tokens     yes" in err  # totals
    assert "batch of" not in out
    file.write_text("hi\n")  # one prompt: exactly today's object
    one = json.loads(run_inprocess(capsys, [*common(pair), "--prompts-file", str(file), "--json"])[1])
    assert one == {**single(capsys, [*common(pair), "--prompt", "hi"]), "stats": one["stats"], "notes": one["notes"]}
    assert one["notes"][0].startswith(f"1 prompt read from {file}")


@pytest.mark.parametrize("case, expected", [
    ("empty file", "is empty: write a prompt"),
    ("blank line", "the prompt at line 3 of --prompts-file"),
    ("missing file", "cannot read --prompts-file"),
    ("empty prompt", "one of the prompts is empty"),
    ("ids and file", "give --prompt with it, not --prompt-ids"),
    ("show-drafts", "--show-drafts has no effect here"),
])
def test_bad_batches(pair, capsys: pytest.CaptureFixture, tmp_path: Path, case: str, expected: str) -> None:  # noqa: ANN001
    file = tmp_path / "prompts.txt"
    file.write_text({"empty file": "", "blank line": "hi\n---\n\n---\nthere\n"}.get(case, "hi\n---\nthere\n"))
    args = {
        "empty file": ["--prompts-file", str(file)],
        "blank line": ["--prompts-file", str(file)],
        "missing file": ["--prompts-file", str(tmp_path / "nowhere.txt")],
        "empty prompt": ["--prompt", "hi", "--prompt", " "],
        "ids and file": ["--prompt-ids", "2,3", "--prompts-file", str(file)],
        "show-drafts": ["--prompts-file", str(file), "--show-drafts"],
    }[case]
    status, out, err = run_inprocess(capsys, [*common(pair), *args])
    assert_one_line_failure(status, out, err, expected)


def test_compare_without_assistant(pair, capsys: pytest.CaptureFixture) -> None:  # noqa: ANN001
    """With several prompts --compare runs them one after another, which plain decoding can do too."""
    args = ["--target", str(pair[0]), "--max-new-tokens", "8", "--no-assistant", "--prompt", "hi", "--prompt", "yo",
            "--compare", "--json"]
    status, out, err = run_inprocess(capsys, args)
    assert status == 0, err
    totals = json.loads(out)["stats"]
    assert totals["identical"] is True and set(totals["sequential"]) == {"seconds", "tokens_per_second"}


def outcomes(result: dict) -> list[tuple[list[int], int]]:
    """Each round's drafts and how many were kept: what a run decides, without what it took."""
    return [(r["drafted"], r["accepted"]) for r in result["stats"]["rounds"]]


def short_context(target: Path, tmp_path: Path, positions: int) -> Path:
    """A copy of the target (its files linked) whose config.json holds `positions` positions."""
    small = tmp_path / "short"
    small.mkdir()
    for f in target.iterdir():
        (small / f.name).symlink_to(f)
    config = json.loads((target / "config.json").read_text())
    (config.get("text_config") or config)["max_position_embeddings"] = positions
    (small / "config.json").unlink()
    (small / "config.json").write_text(json.dumps(config))
    return small


@pytest.mark.parametrize("assistant", [True, False], ids=["speculative", "plain"])
def test_each_row_keeps_its_own_budget(pair, capsys: pytest.CaptureFixture, tmp_path: Path,  # noqa: ANN001
                                       assistant: bool) -> None:
    """A 160-position context, rows of 158 and 100 ids, --max-new-tokens 30: the first row gets 2 tokens and says
    so in a note, the second its 30, as alone or listed first; --compare's solo runs take the same budgets."""
    target = short_context(pair[0], tmp_path, 160)
    rows = [",".join(["2"] + ["300"] * 157), ",".join(["2"] + ["7"] * 99)]
    args = ["--target", str(target), "--max-new-tokens", "30", "--ignore-eos", "--temperature", "0",
            *(["--assistant", str(pair[1]), "--num-assistant-tokens", "3"] if assistant else ["--no-assistant"])]
    status, out, err = run_inprocess(capsys, [*args, "--prompt-ids", rows[0], "--prompt-ids", rows[1], "--json",
                                              "--compare"])
    assert status == 0, err
    result = json.loads(out)
    assert [len(r["tokens"]) for r in result["rows"]] == [2, 30]
    notes = " ".join(result["notes"])
    assert err == "" and "--max-new-tokens 30 is cut to 2 for row 0" in notes and "row 1" not in notes
    assert result["stats"]["identical"]
    alone = single(capsys, [*args, "--prompt-ids", rows[1]])
    assert result["rows"][1]["tokens"] == alone["tokens"]
