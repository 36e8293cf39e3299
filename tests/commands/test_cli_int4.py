"""Int4 targets through the commands (scripts/README.md): `--quantize int4` on the bundled demo and on the test pair
(generate.py and chat.py), an int4 checkpoint given as `--target` (tests/int4_checkpoints.py, shaped like a release),
and the refusals, each one `error:` line, exit status 2, no traceback: a target whose quantization_config names
another scheme, and an assistant that carries a quantization_config. The scripts run in this process (loading a
tiny model takes milliseconds, starting a Python with torch seconds), but for the first, which runs the demo as a
user types it; their tokens are held to the library's."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from gemma4 import greedy_generate, load_target
from mtp import DraftLength, load_drafter, speculative_generate
from tests.checkpoints import write_assistant
from tests.commands.test_chat_cli import run_chat
# the `pair` fixture is in conftest.py
from tests.commands.test_cli import assert_one_line_failure, run_inprocess, run_subprocess
from tests.int4_checkpoints import write_int4_target
from tests.tokenizer_fixture import write_tokenizer

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "scripts" / "demo"
IDS = [2, 17, 300, 45, 99, 260, 7, 410, 33, 12, 5]  # below the test vocabulary (512) and the demo's (4096)


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


@pytest.fixture(scope="module")
def int4_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """An E2B-like int4 target beside a release's files (tokenizer, chat template) and its floating-point drafter."""
    root = tmp_path_factory.mktemp("int4-cli")
    target = write_int4_target(root / "target", "e2b")
    write_tokenizer(target)
    (target / "chat_template.jinja").write_text("{# Gemma 4's turns: rendered by gemma4/tokenizer.py #}\n")
    return target, write_assistant(root / "assistant", target, ordered_embeddings=True, echo=True)


def header(err: str) -> str:
    return next(line for line in err.splitlines() if line.startswith("target "))


def test_quantize_int4_on_the_demo(capsys: pytest.CaptureFixture) -> None:
    proc = run_subprocess(["--quantize", "int4", "--max-new-tokens", "8", "--compare"])  # as a user types it
    status, out, err = proc.returncode, proc.stdout, proc.stderr
    assert status == 0, err
    # The demo: 24 layers, 12 KV-shared, PLE width 16. Every layer's q, o, gate, up, down and PLE input gate, k and v
    # on the 12 unshared layers, and the PLE model projection; its per_layer_projection (16 inputs) stays float.
    assert header(err).endswith(f", {24 * 6 + 12 * 2 + 1} int4 layers quantized at load)"), header(err)
    assert "identical tokens     yes" in err and out.strip()
    # The tokens are the library's on the same model.
    status, out, err = run_inprocess(capsys, ["--quantize", "int4", "--max-new-tokens", "8", "--temperature", "0",
                                              "--prompt-ids", ",".join(map(str, IDS)), "--json"])
    assert status == 0, err
    # An int4 target runs in bfloat16 unless --dtype says otherwise (w4a16: the releases' activations).
    demo = load_target(DEMO / "target", torch.bfloat16, quantize="int4")
    assert json.loads(out)["tokens"] == greedy_generate(demo, IDS, 8)


def test_an_int4_target_runs(int4_pair: tuple[Path, Path], capsys: pytest.CaptureFixture) -> None:
    target, assistant = int4_pair
    common = ["--target", str(target), "--assistant", str(assistant), "--max-new-tokens", "12", "--temperature", "0",
              "--num-assistant-tokens", "3"]
    status, out, err = run_inprocess(capsys, [*common, "--prompt", "hi", "--compare"])
    assert status == 0, err
    assert header(err).endswith(", 67 int4 layers)"), header(err)  # as the file stores them: not "quantized at load"
    assert "identical tokens     yes" in err
    status, out, err = run_inprocess(capsys, [*common, "--prompt", "hi", "--quantize", "int4"])
    assert status == 0 and header(err).endswith(", 67 int4 layers (int4 already: --quantize int4 changes nothing))")
    bf16 = torch.bfloat16  # an int4 target's default dtype
    expected = {fast: speculative_generate(load_target(target, bf16, fast=fast), load_drafter(assistant, bf16, fast=fast),
                                           IDS, 12, DraftLength(3)).tokens for fast in (True, False)}
    for flags in ([], ["--reference"], ["--quantize", "int4"]):  # speed layer, textbook; --quantize: a no-op here
        status, out, err = run_inprocess(capsys, [*common, *flags, "--prompt-ids", ",".join(map(str, IDS)), "--json"])
        assert status == 0, err
        assert json.loads(out)["tokens"] == expected["--reference" not in flags], flags


def test_chat_quantize_int4_turns_equal_generate(pair: tuple[Path, Path], capsys: pytest.CaptureFixture) -> None:
    """chat.py --quantize int4: each turn is generate.py --quantize int4 over that turn's prompt_ids."""
    flags = ["--target", str(pair[0]), "--assistant", str(pair[1]), "--max-new-tokens", "8", "--temperature", "0",
             "--quantize", "int4"]
    status, replies, err = run_chat(capsys, flags, ["Hello there.", "Tell me more."])
    assert status == 0, err
    assert [r["turn"] for r in replies] == [1, 2]
    for reply in replies:
        status, out, err = run_inprocess(capsys, [*flags, "--prompt-ids", ",".join(map(str, reply["prompt_ids"])),
                                                  "--json"])
        assert status == 0, err
        assert json.loads(out)["tokens"] == reply["tokens"]


@pytest.mark.parametrize("change", ("format", "num_bits"))
def test_a_target_with_another_scheme_is_refused(int4_pair: tuple[Path, Path], tmp_path: Path, change: str,
                                                 capsys: pytest.CaptureFixture) -> None:
    target = shutil.copytree(int4_pair[0], tmp_path / "target")
    config = json.loads((target / "config.json").read_text())
    q = config["quantization_config"]
    if change == "format":
        q["format"] = "float-quantized"
    else:
        q["config_groups"]["group_0"]["weights"]["num_bits"] = 8
    (target / "config.json").write_text(json.dumps(config))
    status, out, err = run_inprocess(capsys, ["--target", str(target), "--assistant", str(int4_pair[1]),
                                              "--prompt", "hi", "--max-new-tokens", "4"])
    assert_one_line_failure(status, out, err, "quantization_config")
    assert "float-quantized" in err if change == "format" else "num_bits" in err


def test_a_quantized_assistant_is_refused(int4_pair: tuple[Path, Path], tmp_path: Path,
                                          capsys: pytest.CaptureFixture) -> None:
    assistant = shutil.copytree(int4_pair[1], tmp_path / "assistant")
    config = json.loads((assistant / "config.json").read_text())
    config["quantization_config"] = json.loads((int4_pair[0] / "config.json").read_text())["quantization_config"]
    (assistant / "config.json").write_text(json.dumps(config))
    status, out, err = run_inprocess(capsys, ["--target", str(int4_pair[0]), "--assistant", str(assistant),
                                              "--prompt", "hi", "--max-new-tokens", "4"])
    assert_one_line_failure(status, out, err, "assistants load in floating point only")


def test_an_int4_target_defaults_to_bfloat16_and_the_auto_schedule(int4_pair: tuple[Path, Path],
                                                                   capsys: pytest.CaptureFixture) -> None:
    """The two int4 defaults (scripts/README.md): bfloat16 activations, and `auto` draft lengths, each said in the
    header; a flag given keeps its value. The tokens are plain decoding's whatever the schedule."""
    target, assistant = int4_pair
    common = ["--target", str(target), "--assistant", str(assistant), "--max-new-tokens", "10", "--temperature", "0",
              "--prompt-ids", ",".join(map(str, IDS))]
    plain = {dtype: greedy_generate(load_target(target, getattr(torch, dtype), fast=True), IDS, 10)
             for dtype in ("bfloat16", "float32")}
    for flags, dtype, schedule in (([], "bfloat16", "auto schedule, the default for an int4 target"),
                                   (["--dtype", "float32"], "float32", "auto schedule, the default for an int4 target"),
                                   (["--schedule", "constant"], "bfloat16", "constant schedule")):
        status, out, err = run_inprocess(capsys, [*common, *flags])
        assert status == 0, err
        assert header(err).startswith(f"target     {target} ({dtype} on cpu"), header(err)
        assert f"drafts per round, {schedule})" in err, err
        status, out, err = run_inprocess(capsys, [*common, *flags, "--json"])  # --json prints no header
        assert status == 0, err
        assert json.loads(out)["tokens"] == plain[dtype], flags
    status, out, err = run_inprocess(capsys, ["--max-new-tokens", "4", "--prompt-ids", "2,5,9"])  # the demo, float
    assert status == 0, err
    assert "(float32 on cpu" in header(err) and "constant schedule)" in err


def test_quantize_head_int4_through_the_commands(pair: tuple[Path, Path], capsys: pytest.CaptureFixture) -> None:
    """--quantize-head int4: the library's tokens with quantize_head="int4", said in the header, speculative ==
    plain; refused with --reference in one line."""
    common = ["--target", str(pair[0]), "--assistant", str(pair[1]), "--max-new-tokens", "10", "--temperature", "0",
              "--quantize-head", "int4"]
    status, out, err = run_inprocess(capsys, [*common, "--prompt", "hi", "--compare"])
    assert status == 0 and "identical tokens     yes" in err, err
    assert header(err).endswith(", the head int4)") and "(bfloat16 on cpu" in header(err), header(err)
    status, out, err = run_inprocess(capsys, [*common, "--prompt-ids", ",".join(map(str, IDS)), "--json"])
    assert status == 0, err
    model = load_target(pair[0], torch.bfloat16, fast=True, quantize_head="int4")
    assert json.loads(out)["tokens"] == greedy_generate(model, IDS, 10)
    status, out, err = run_inprocess(capsys, [*common, "--reference", "--prompt", "hi"])
    assert_one_line_failure(status, out, err, "--quantize-head is a product of the speed layer")
