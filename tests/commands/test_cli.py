"""`scripts/generate.py` end to end, on a tiny checkpoint pair the tests write.

Most cases call the script's `cli(argv)` in this process (loading a tiny model takes milliseconds;
starting a Python with torch takes seconds). Three run it as a real subprocess: the JSON contract
(stdout must hold the object and nothing else), a Hub id with the Hub offline (huggingface_hub reads
HF_HUB_OFFLINE when it is imported), and Ctrl-C (a real SIGINT). The pair is conftest.py's `pair`: the
test target's files are shaped like a release's, a tokenizer, a chat template, and a generation_config.json
that samples (T 1, top-k 64, top-p 0.95).
The defaults rule, the refused flags and the pipes have their own files (tests/commands/test_cli_*.py).
"""

import io
import json
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import generate  # scripts/generate.py (pyproject.toml puts scripts/ on pytest's path)
from cli.options import guarded
from cli.stream import Sink, Stream
from cli.report import stats_text
from gemma4.tokenizer import Gemma4Tokenizer
from mtp.stats import SpecStats
from tests.checkpoints import STOP_IDS, write_assistant, write_target

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "generate.py"


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def run_subprocess(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=120)


def run_inprocess(capsys: pytest.CaptureFixture, args: list[str], demo: Path | None = None) -> tuple[int, str, str]:
    try:
        status = generate.cli(args) if demo is None else generate.cli(args, demo_target=demo)
    except SystemExit as e:  # argparse's own checks leave through Parser.error
        status = e.code
    out, err = capsys.readouterr()
    return status, out, err


def assert_one_line_failure(status: int, out: str, err: str, expected: str) -> None:
    lines = err.strip().splitlines()
    assert status == 2
    assert "Traceback" not in err
    assert [line for line in lines if line.startswith("error:")] == [lines[-1]], err  # one error line, the last
    assert expected in lines[-1], lines[-1]
    assert "error" not in out and "Traceback" not in out


# ---------------------------------------------------------------- what a user sees when it works

def test_json_contract_and_compare(pair: tuple[Path, Path]) -> None:
    target, assistant = pair
    args = ["--target", str(target), "--assistant", str(assistant), "--prompt", "hi", "--max-new-tokens", "24",
            "--num-assistant-tokens", "3", "--temperature", "0", "--json", "--compare"]
    proc = run_subprocess(args)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)  # the whole of stdout is one JSON object
    assert set(result) == {"tokens", "text", "finish_reason", "stats", "sampling", "plain", "identical",
                           "identical_expected", "low_precision", "speedup", "notes", "target", "assistant", "dtype",
                           "device", "threads", "prompt_tokens", "new_tokens", "memory"}
    assert result["low_precision"] is False and result["notes"] == []
    assert result["sampling"] == {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0, "drafting": "argmax"}
    tokens, stats = result["tokens"], result["stats"]
    assert all(isinstance(t, int) for t in tokens) and 1 <= len(tokens) <= 24
    assert isinstance(result["text"], str)
    assert result["finish_reason"] == ("stop" if tokens[-1] in STOP_IDS else "length")
    assert set(stats) == {"target_forwards", "drafted", "accepted", "acceptance_rate", "tokens_per_forward",
                          "seconds", "tokens_per_second", "rounds", "draft_lengths", "seconds_at_k0", "eager_rounds",
                          "schedule"}
    assert stats["draft_lengths"] == {str(k): n for k, n in Counter(len(r["drafted"]) for r in stats["rounds"]).items()}
    assert stats["schedule"] == {"name": "constant", "estimates": None}
    assert stats["drafted"] == sum(len(r["drafted"]) for r in stats["rounds"]) > 0
    assert 0 <= stats["accepted"] <= stats["drafted"]
    assert stats["acceptance_rate"] == pytest.approx(stats["accepted"] / stats["drafted"])
    assert stats["target_forwards"] >= 1 + len(stats["rounds"])  # prefill + one verification per round
    assert stats["tokens_per_forward"] == pytest.approx(len(tokens) / stats["target_forwards"])
    assert stats["seconds"] > 0 and stats["tokens_per_second"] > 0
    assert set(result["plain"]) == {"tokens", "seconds", "tokens_per_second"}
    assert result["identical"] is True and result["identical_expected"] is True
    assert result["plain"]["tokens"] == tokens
    assert result["speedup"] > 0


def test_sampling_settings_come_from_generation_config(pair: tuple[Path, Path], capsys: pytest.CaptureFixture) -> None:
    # The test target's generation_config.json has the releases' do_sample, T 1.0, top_k 64, top_p 0.95.
    common = ["--target", str(pair[0]), "--assistant", str(pair[1]), "--prompt", "hi",
              "--max-new-tokens", "24", "--ignore-eos", "--compare"]
    status, out, err = run_inprocess(capsys, [*common, "--json"])
    result = json.loads(out)
    assert status == 0, err
    assert result["sampling"] == {"temperature": 1.0, "top_k": 64, "top_p": 0.95, "seed": 0, "drafting": "argmax"}
    assert result["identical"] is True and result["identical_expected"] is True  # argmax drafting: token equality
    assert result["plain"]["tokens"] == result["tokens"]
    status, out, err = run_inprocess(capsys, [*common, "--top-k", "5"])
    assert status == 0, err
    assert ("decoding   temperature 1, top-k 5, top-p 0.95, seed 0, argmax drafting "
            "(do_sample, temperature, top_p from generation_config.json)") in err
    assert "identical tokens     yes" in err and "plain sampling decoding (--compare)" in err


def test_sampling_seeds_and_sample_drafting(pair: tuple[Path, Path], capsys: pytest.CaptureFixture) -> None:
    common = ["--target", str(pair[0]), "--assistant", str(pair[1]), "--prompt", "hi",
              "--max-new-tokens", "24", "--ignore-eos", "--temperature", "1", "--json"]
    runs = {}
    for name, extra in {"seed 0": [], "again": [], "seed 1": ["--seed", "1"], "greedy": ["--temperature", "0"],
                        "sample drafting": ["--drafting", "sample", "--compare"]}.items():
        status, out, err = run_inprocess(capsys, [*common, *extra])
        assert status == 0, err
        runs[name] = json.loads(out)
    assert runs["seed 0"]["tokens"] == runs["again"]["tokens"]  # same seed, same draws
    assert runs["seed 1"]["tokens"] != runs["seed 0"]["tokens"]
    assert runs["greedy"]["sampling"]["temperature"] == 0.0
    sampled = runs["sample drafting"]
    assert sampled["sampling"]["drafting"] == "sample" and sampled["identical_expected"] is False
    assert len(sampled["tokens"]) == 24 and sampled["stats"]["drafted"] > 0
    status, out, err = run_inprocess(capsys, [*common[:-1], "--drafting", "sample", "--compare", "--seed", "3"])
    assert status == 0, err
    assert "by design" in err.split("identical tokens", 1)[1].splitlines()[0]  # a difference is no failure


def test_no_assistant_is_plain_decoding(pair: tuple[Path, Path], capsys: pytest.CaptureFixture) -> None:
    target, assistant = pair
    common = ["--target", str(target), "--prompt", "hi", "--max-new-tokens", "20", "--json"]
    status, out, _ = run_inprocess(capsys, [*common, "--no-assistant"])
    plain = json.loads(out)
    assert status == 0
    assert plain["stats"]["rounds"] == [] and plain["stats"]["drafted"] == 0
    assert plain["stats"]["target_forwards"] == len(plain["tokens"])
    _, out, _ = run_inprocess(capsys, [*common, "--assistant", str(assistant)])
    assert json.loads(out)["tokens"] == plain["tokens"]


def test_a_12b_target_runs_and_refuses_media_tokens(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A 12B-layout file with --no-assistant, then with its assistant, the same tokens; an
    image token id in the prompt is one line and exit 2 (text only). The file's image id is moved into the tiny
    vocabulary so a prompt can hold it."""
    target = write_target(tmp_path / "target", "12b")
    assistant = write_assistant(tmp_path / "assistant", target, ordered_embeddings=False, echo=True)
    config = json.loads((target / "config.json").read_text())
    assert config["model_type"] == "gemma4_unified" and "vision_config" in config
    common = ["--target", str(target), "--prompt-ids", "2,105,7,300", "--max-new-tokens", "12", "--json"]
    status, out, err = run_inprocess(capsys, [*common, "--no-assistant"])
    assert status == 0, err
    plain = json.loads(out)["tokens"]
    status, out, err = run_inprocess(capsys, [*common, "--assistant", str(assistant)])
    assert status == 0 and json.loads(out)["tokens"] == plain, err
    config["image_token_id"] = 500
    (target / "config.json").write_text(json.dumps(config))
    status, out, err = run_inprocess(capsys, ["--target", str(target), "--no-assistant", "--prompt-ids", "2,105,500,7"])
    assert_one_line_failure(status, out, err, "token id 500 is a media soft token and nothing fills it")
    config["audio_token_id"] = 501
    (target / "config.json").write_text(json.dumps(config))
    status, out, err = run_inprocess(capsys, ["--target", str(target), "--no-assistant", "--prompt-ids", "2,105,501,7"])
    assert_one_line_failure(status, out, err, "token id 501 is a media soft token and nothing fills it: give the "
                                              "image, clip or frames")


def test_stream_marks_drafts_and_matches_json(pair: tuple[Path, Path], capsys: pytest.CaptureFixture) -> None:
    target, assistant = pair
    common = ["--target", str(target), "--assistant", str(assistant), "--prompt", "tell me about foxes",
              "--max-new-tokens", "40", "--num-assistant-tokens", "3", "--ignore-eos", "--temperature", "0"]
    _, out, _ = run_inprocess(capsys, [*common, "--json"])
    result = json.loads(out)
    assert result["stats"]["accepted"] > 0  # this prompt gets drafts accepted: the marks below are exercised
    status, out, err = run_inprocess(capsys, [*common, "--show-drafts"])
    assert status == 0
    assert out == result["text"] + "\n"  # stdout is not a terminal: the text alone, unmarked
    legend, _, rest = err.partition("proposed by the drafter and accepted; the rest the target supplied\n\n")
    marked, _, stats_block = rest.partition("\n\n-- speculative decoding")
    assert "⟦between these⟧" in legend  # no colour: the marks are named in the legend
    assert "⟦" in marked and marked.translate(str.maketrans("", "", "⟦⟧")) == result["text"]
    assert "acceptance rate" in stats_block and "tokens per forward" in stats_block and "tokens/s" in stats_block


def test_stream_marks_and_byte_runs(pair: tuple[Path, Path], capsys: pytest.CaptureFixture) -> None:
    tokenizer = Gemma4Tokenizer(pair[0] / "tokenizer.json")
    stream = Stream(tokenizer, [Sink(sys.stdout, mark=True, colour=False)])
    h, i, space, e2, e3, x82, xac, eos = (tokenizer.tokenizer.token_to_id(p) for p in
                                          ("h", "i", "▁", "<0xE2>", "<0xE3>", "<0x82>", "<0xAC>", "<eos>"))
    stream.commit([h, i, space], [True, True, False])  # two accepted drafts, then the target's token
    assert capsys.readouterr().out == "⟦hi⟧ "
    stream.commit([e2, x82, eos], [True, True, False])  # an open run of byte tokens: nothing is final yet
    assert capsys.readouterr().out == ""
    stream.commit([xac, h], [False, False])  # E2 82 AC is the euro sign; the special <eos> is not text
    assert capsys.readouterr().out == "€h"
    stream.commit([e3, h], [False, False])  # a byte run that is not UTF-8 is final only once it closes
    stream.finish()
    assert capsys.readouterr().out == "\ufffdh\n"
    assert stream.text() == "hi €h\ufffdh"
    Stream(tokenizer, [Sink(sys.stdout, mark=True, colour=True)]).commit([h, i], [True, False])
    assert capsys.readouterr().out == "\x1b[32mh\x1b[0mi"


def test_no_arguments_runs_the_demo_pair(
    pair: tuple[Path, Path], capsys: pytest.CaptureFixture, tmp_path: Path,
) -> None:
    target, assistant = pair
    shutil.copytree(target, tmp_path / "target")
    shutil.copytree(assistant, tmp_path / "assistant")
    status, out, err = run_inprocess(capsys, ["--max-new-tokens", "8"], demo=tmp_path / "target")
    assert status == 0, err
    assert f"assistant  {tmp_path / 'assistant'}" in err  # the sibling of a directory named target
    assert "-- speculative decoding" in err and "Tell me a story" in err  # a chat model's default prompt


class CountingTokenizer(Gemma4Tokenizer):
    """The tokenizer, counting the tokens the stream hands to `decode`."""

    def __init__(self, file: Path) -> None:
        super().__init__(file)
        self.decoded = 0

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        self.decoded += len(ids)
        return super().decode(ids, skip_special_tokens)


def test_stream_of_a_byte_level_vocabulary() -> None:
    """The demo's vocabulary spells € (E2 82 AC) as three ordinary tokens, whose first bytes decode to U+FFFD."""
    tokenizer = Gemma4Tokenizer(REPO / "scripts" / "demo" / "target" / "tokenizer.json")
    reply = tokenizer.encode_raw("x = '€é' + \"naïve\"\n")[1:]  # no <bos>
    assert "\ufffd" in tokenizer.decode(reply[3:4])  # a character is split across tokens here
    for block in (1, 2, 3):  # commits of one token, and blocks that end inside the character
        file = io.StringIO()
        stream = Stream(tokenizer, [Sink(file, mark=False, colour=False)])
        for i in range(0, len(reply), block):
            stream.commit(reply[i:i + block], [False] * len(reply[i:i + block]))
            assert "\ufffd" not in file.getvalue()
        stream.finish()
        assert file.getvalue() == tokenizer.decode(reply) + "\n"


def test_stream_decodes_each_token_a_bounded_number_of_times(pair: tuple[Path, Path]) -> None:
    tokenizer = CountingTokenizer(pair[0] / "tokenizer.json")
    words = [tokenizer.tokenizer.token_to_id(p) for p in ("h", "i", "▁", "<0xE2>", "<0x82>", "<0xAC>")]
    n = 600
    reply = [words[i % len(words)] for i in range(n)]
    file = io.StringIO()
    stream = Stream(tokenizer, [Sink(file, mark=False, colour=False)])
    for token in reply:
        stream.commit([token], [False])
    stream.finish()
    assert file.getvalue() == tokenizer.decode(reply, skip_special_tokens=True) + "\n"
    # The window holds the last printed piece and what came since: a few tokens a commit, not all the reply
    # (re-decoding the whole reply each commit would hand decode n (n + 1) / 2 = 180,300 tokens).
    assert tokenizer.decoded <= 8 * n, tokenizer.decoded


# ---------------------------------------------------------------- clear failures

def _copy(src: Path, dst: Path, skip: tuple[str, ...] = ()) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(*skip))
    return dst


def _edit_tensors(model_dir: Path, edit) -> None:  # noqa: ANN001 (dict -> None)
    tensors = load_file(model_dir / "model.safetensors")
    edit(tensors)
    save_file(tensors, model_dir / "model.safetensors", metadata={"format": "pt"})


def _truncated(target: Path, tmp: Path) -> Path:
    d = _copy(target, tmp / "t")
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])
    return d


def _garbage(target: Path, tmp: Path) -> Path:
    d = _copy(target, tmp / "t")
    (d / "model.safetensors").write_bytes(b"\xff" * 64)
    return d


def _pickle_only(target: Path, tmp: Path) -> Path:
    d = _copy(target, tmp / "t", skip=("*.safetensors",))
    (d / "pytorch_model.bin").write_bytes(b"not unpickled")
    return d


def _missing_tensor(target: Path, tmp: Path) -> Path:
    d = _copy(target, tmp / "t")
    _edit_tensors(d, lambda t: t.pop("model.language_model.layers.1.mlp.up_proj.weight"))
    return d


def _misshaped_tensor(target: Path, tmp: Path) -> Path:
    d = _copy(target, tmp / "t")
    _edit_tensors(d, lambda t: t.update({"model.language_model.norm.weight": torch.ones(65)}))
    return d


TARGET_CASES = {  # name -> (make the target directory, what the error line says)
    "path does not exist": (lambda target, tmp: tmp / "nope", "is not a directory with a checkpoint"),
    "no config.json": (lambda target, tmp: _copy(target, tmp / "t", skip=("config.json",)), "has no config.json"),
    "no safetensors": (lambda target, tmp: _copy(target, tmp / "t", skip=("*.safetensors",)),
                       "has no model.safetensors or model.safetensors.index.json"),
    "only pickled weights": (_pickle_only, "has only pickled weights (pytorch_model.bin)"),
    "truncated safetensors": (_truncated, "is truncated"),
    "corrupt safetensors": (_garbage, "is truncated or not a safetensors file"),
    "tensor missing": (_missing_tensor, "tensor model.language_model.layers.1.mlp.up_proj.weight is missing"),
    "tensor mis-shaped": (_misshaped_tensor, "tensor model.language_model.norm.weight has shape [65]"),
}


@pytest.mark.parametrize("case", TARGET_CASES)
def test_bad_target_checkpoint(
    case: str, pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture,
) -> None:
    make, expected = TARGET_CASES[case]
    target = make(pair[0], tmp_path)
    status, out, err = run_inprocess(capsys, ["--target", str(target), "--assistant", str(pair[1]), "--json"])
    assert_one_line_failure(status, out, err, expected)
    assert out == ""


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_an_assistant_window_wider_than_the_target_is_refused_at_load(pair: tuple[Path, Path], tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture,
                                                                      command: str) -> None:
    """The target's rings keep its own window: an assistant that reads a wider one cannot run. One line, exit 2,
    before any generation (`check_pair`)."""
    target, assistant = pair
    wide = _copy(assistant, tmp_path / "wide")
    config = json.loads((wide / "config.json").read_text())
    config["text_config"]["sliding_window"] = 64
    (wide / "config.json").write_text(json.dumps(config))
    args = ["--target", str(target), "--assistant", str(wide), "--max-new-tokens", "4"]
    if command == "generate":
        status, out, err = run_inprocess(capsys, args)
    else:
        import chat  # scripts/chat.py

        status = chat.cli(args, source=io.StringIO("hi\n"))
        out, err = capsys.readouterr()
    assert_one_line_failure(status, out, err, "its sliding window (64) is wider than the target's (8)")
    assert out == ""


def test_assistant_of_another_target(pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    target, assistant = pair
    other = _copy(assistant, tmp_path / "other")  # a self-consistent drafter for a target of hidden size 96
    config = json.loads((other / "config.json").read_text())
    config["backbone_hidden_size"] = 96
    (other / "config.json").write_text(json.dumps(config))
    d = config["text_config"]["hidden_size"]
    _edit_tensors(other, lambda t: t.update({"pre_projection.weight": torch.zeros(d, 192),
                                             "post_projection.weight": torch.zeros(96, d)}))
    status, out, err = run_inprocess(capsys, ["--target", str(target), "--assistant", str(other)])
    assert_one_line_failure(status, out, err, "does not belong to target")
    assert "backbone_hidden_size is 96, the target's hidden size is 64" in err


def test_default_assistant(pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    lonely = _copy(pair[0], tmp_path / "lonely")  # neither lonely-assistant beside it nor named target
    status, out, err = run_inprocess(capsys, ["--target", str(lonely)])
    assert_one_line_failure(status, out, err, "pass --assistant, or --no-assistant")
    assert "the target directory + '-assistant'" in err
    _copy(pair[1], tmp_path / "lonely-assistant")  # DIR-assistant beside DIR
    status, _, err = run_inprocess(capsys, ["--target", str(lonely), "--max-new-tokens", "4"])
    assert status == 0 and f"assistant  {tmp_path / 'lonely-assistant'}" in err


ARGUMENT_CASES = {  # name -> (arguments after --target/--assistant, what the error line says)
    "prompt id outside the vocabulary": (["--prompt-ids", "2,105,512"],
                                         "token id 512 is outside the vocabulary 0..511"),
    "empty prompt ids": (["--prompt-ids", ""], "the prompt is empty"),
    "empty prompt text": (["--prompt", "  "], "the prompt is empty"),
    "prompt longer than the context": (["--prompt-ids", ",".join(["7"] * 1024)],
                                       "the prompt has 1024 tokens; the model's context is 1024"),
    "max-new-tokens below 1": (["--max-new-tokens", "0"], "--max-new-tokens must be at least 1, got 0"),
    "num-assistant-tokens below 1": (["--num-assistant-tokens", "0"], "--num-assistant-tokens must be at least 1"),
    "device that is not there": (["--device", "cuda:99"], "device 'cuda:99' is not available here"),
    "device that does not exist": (["--device", "gpu"], "'gpu' is not a device name like cpu, cuda or cuda:1"),
    "raw with ids": (["--prompt-ids", "2", "--raw"], "--raw applies to --prompt text"),
    "ids that are not integers": (["--prompt-ids", "2,x"], "argument --prompt-ids: expected comma-separated integers"),
    "unknown dtype": (["--dtype", "float64"], "argument --dtype: invalid choice: 'float64'"),
    "float16": (["--dtype", "float16"], "--dtype float16: Gemma 4 is trained and released in bfloat16"),
    "negative temperature": (["--temperature", "-0.5"], "--temperature must be a finite number, at least 0"),
    "infinite temperature": (["--temperature", "inf"], "--temperature must be a finite number, at least 0 (0 is greedy), got inf"),
    "temperature nan": (["--temperature", "nan"], "--temperature must be a finite number, at least 0 (0 is greedy), got nan"),
    "threads below 1": (["--threads", "0"], "--threads must be at least 1, got 0"),
    "prefill chunk below 1": (["--prefill-chunk", "0"], "--prefill-chunk must be at least 1, got 0"),
    "top-p 0": (["--temperature", "1", "--top-p", "0"], "--top-p must be in (0, 1] (1 turns it off), got 0.0"),
    "top-p above 1": (["--temperature", "1", "--top-p", "1.5"], "--top-p must be in (0, 1]"),
    "negative top-k": (["--temperature", "1", "--top-k", "-1"], "--top-k must be at least 0 (0 turns it off), got -1"),
    "sample drafting at temperature 0": (["--temperature", "0", "--drafting", "sample"],
                                         "--drafting has no effect here: it applies to sampling"),
    "unknown drafting": (["--drafting", "random"], "argument --drafting: invalid choice: 'random'"),
    "negative seed": (["--seed", "-1"], "--seed must be at least 0, got -1"),
}


@pytest.mark.parametrize("case", ARGUMENT_CASES)
def test_bad_arguments(case: str, pair: tuple[Path, Path], capsys: pytest.CaptureFixture) -> None:
    args, expected = ARGUMENT_CASES[case]
    argv = ["--target", str(pair[0]), "--assistant", str(pair[1]), *args]
    status, out, err = run_inprocess(capsys, argv)
    assert_one_line_failure(status, out, err, expected)


@pytest.mark.parametrize("case", ["id out of range", "prompt too long", "broken assistant config"])
def test_checks_come_before_any_line(case: str, pair: tuple[Path, Path], tmp_path: Path,
                                     capsys: pytest.CaptureFixture) -> None:
    """Every check runs before the header lines are printed: a refusal is the only line on stderr."""
    target, assistant = pair
    if case == "broken assistant config":
        assistant = _copy(assistant, tmp_path / "broken")
        (assistant / "config.json").write_text("{")
    ids = {"id out of range": "2,105,512", "prompt too long": ",".join(["7"] * 1024)}.get(case, "2,105,300")
    status, out, err = run_inprocess(capsys, ["--target", str(target), "--assistant", str(assistant),
                                              "--prompt-ids", ids])
    assert status == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err


def test_system_and_think_write_the_chat_template_turn(pair: tuple[Path, Path], capsys: pytest.CaptureFixture) -> None:
    """--system and --think write the template's system turn and thinking switch, as chat.py does: the tokens of
    --prompt with them are those of --prompt-ids holding that rendering. Without a template they are refused."""
    from gemma4.tokenizer import Gemma4Tokenizer, Message

    target, assistant = pair
    tokenizer = Gemma4Tokenizer(target / "tokenizer.json")
    base = ["--target", str(target), "--assistant", str(assistant), "--max-new-tokens", "6", "--json"]
    for extra, system, think in ((["--system", "Be brief."], "Be brief.", False), (["--think"], None, True)):
        status, out, err = run_inprocess(capsys, [*base, "--prompt", "hi", *extra])
        assert status == 0, err
        ids = tokenizer.render([Message("user", "hi")], system, think)
        status, expected, _ = run_inprocess(capsys, [*base, "--prompt-ids", ",".join(map(str, ids))])
        assert json.loads(out)["tokens"] == json.loads(expected)["tokens"]
    status, out, err = run_inprocess(capsys, [*base, "--prompt", "hi", "--raw", "--system", "x"])
    assert_one_line_failure(status, out, err, "--system has no effect here")


def test_prompt_text_without_tokenizer(pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    target = _copy(pair[0], tmp_path / "t", skip=("tokenizer.json",))
    status, out, err = run_inprocess(capsys, ["--target", str(target), "--assistant", str(pair[1]), "--prompt", "hi"])
    assert_one_line_failure(status, out, err, "has no tokenizer.json to encode --prompt")
    # ids still work, and the text is null
    status, out, _ = run_inprocess(capsys, ["--target", str(target), "--assistant", str(pair[1]), "--prompt-ids",
                                            "2,105,7", "--max-new-tokens", "3", "--json"])
    assert status == 0 and json.loads(out)["text"] is None


def test_hub_id_offline(tmp_path: Path) -> None:
    proc = run_subprocess(["--target", "google/gemma-4-no-such-model-it"],
                          env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path)})
    assert_one_line_failure(proc.returncode, proc.stdout, proc.stderr,  # both repos the run needs, named
                            "google/gemma-4-no-such-model-it and its assistant google/gemma-4-no-such-model-it-"
                            "assistant are not on this machine and the Hub cannot be reached")
    proc = run_subprocess(["--target", "google/gemma-4-no-such-model-it", "--no-assistant"],
                          env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path)})
    assert_one_line_failure(proc.returncode, proc.stdout, proc.stderr,
                            "google/gemma-4-no-such-model-it is not on this machine")


GENERATION_CONFIG_CASES = {  # name -> (which model, what its generation_config.json gets, what the error line says)
    "top_k not a number": ("target", {"top_k": "many"}, "top_k is 'many', not a number"),
    "top_k below 0": ("target", {"top_k": -3}, "top_k must be an integer >= 0"),
    "temperature not a number": ("target", {"temperature": [1]}, "temperature is [1], not a number"),
    "no drafts a round": ("assistant", {"num_assistant_tokens": 0}, "num_assistant_tokens is 0, at least 1"),
}


@pytest.mark.parametrize("case", GENERATION_CONFIG_CASES)
def test_bad_generation_config(case: str, pair: tuple[Path, Path], tmp_path: Path,
                               capsys: pytest.CaptureFixture) -> None:
    which, values, expected = GENERATION_CONFIG_CASES[case]
    target, assistant = _copy(pair[0], tmp_path / "target"), _copy(pair[1], tmp_path / "assistant")
    file = (target if which == "target" else assistant) / "generation_config.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), **values}))
    status, out, err = run_inprocess(capsys, ["--target", str(target), "--assistant", str(assistant)])
    assert_one_line_failure(status, out, err, expected)
    assert str(file) in err  # the line names the file to correct


@pytest.mark.parametrize("bug", [ValueError("boom"), AttributeError("boom"), OSError(5, "boom")])
def test_a_bug_keeps_its_traceback(bug: Exception, pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture) -> None:
    """An exception that is none of the user's mistakes is the code's: its traceback, exit status 1."""
    def broken(*args: object, **kwargs: object) -> list[int]:
        raise bug
    monkeypatch.setattr(generate, "decode", broken)  # the library's decoder, inside the run
    status, out, err = run_inprocess(capsys, ["--target", str(pair[0]), "--no-assistant", "--prompt", "hi"])
    assert status == 1
    assert "Traceback (most recent call last)" in err and "in broken" in err
    assert err.strip().splitlines()[-1] == f"{type(bug).__name__}: {bug}"
    assert not [line for line in err.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("error, status", [
    (PermissionError(13, "Permission denied", "prompts.txt"), 2),  # a file the user named: theirs to fix
    (OSError(5, "Input/output error"), 1),  # about no file: from inside, a bug
])
def test_os_errors(error: OSError, status: int, capsys: pytest.CaptureFixture) -> None:
    def run() -> int:
        raise error
    assert guarded(run) == status
    err = capsys.readouterr().err
    assert ("Traceback" in err) == (status == 1)
    assert err.strip().splitlines()[-1].startswith("error: " if status == 2 else "OSError")


def test_a_closed_pipe_ends_quietly() -> None:
    """`generate.py | head -c 1`: the reader of stdout goes away; the command ends with status 141 (as a Unix
    tool on SIGPIPE) and says nothing on stderr but what it said before."""
    proc = subprocess.Popen([sys.executable, str(REPO / "scripts" / "generate.py"), "--max-new-tokens", "400",
                             "--ignore-eos", "--no-assistant"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.read(1)
    proc.stdout.close()  # as `head -c 1` does
    err = proc.stderr.read().decode()
    assert proc.wait() == 141, err
    assert "Traceback" not in err and "error" not in err, err


@pytest.mark.usefixtures("default_sigint")  # a SIGINT the run ignores stays ignored in the script it starts
def test_ctrl_c_prints_what_was_generated(pair: tuple[Path, Path]) -> None:
    target, assistant = pair
    args = ["--target", str(target), "--assistant", str(assistant), "--prompt-ids", "2,105,7",
            "--max-new-tokens", "1000", "--ignore-eos"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, str(SCRIPT), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    first = proc.stdout.read(1)  # generation has started: text is streaming
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "Traceback" not in err
    assert len(first + out) > 1
    assert err.strip().splitlines()[-1].startswith("interrupted after")


def test_a_draft_length_past_what_a_round_holds_is_cut(pair, capsys: pytest.CaptureFixture) -> None:  # noqa: ANN001
    """--num-assistant-tokens 3000 with --max-new-tokens 12: a round drafts at most 10 (the first token is the
    prefill's, and one token follows the drafts), so warm-up runs the row counts 1..11, not 1..3001 (which did not
    end in 120 s); a note line says so, and the tokens are plain decoding's."""
    from cli.options import draft_room, verify_rows
    from mtp import DraftLength

    assert verify_rows(DraftLength(3000), draft_room(12, None)) == tuple(range(1, 12))
    assert verify_rows(DraftLength(3000), draft_room(5000, 16)) == tuple(range(1, 65))  # one verify: 64 rows at most
    target, assistant = pair
    status, out, err = run_inprocess(capsys, ["--target", str(target), "--assistant", str(assistant),
                                              "--max-new-tokens", "12", "--ignore-eos", "--temperature", "0",
                                              "--num-assistant-tokens", "3000", "--compare", "--json"])
    assert status == 0, err
    assert err == ""  # --json: the note is in the document
    assert "3000 drafts a round is cut to 10: that is the most --max-new-tokens 12 holds" in json.loads(out)["notes"]
    assert json.loads(out)["identical"]


def test_statistics_read_right_at_tiny_budgets(capsys: pytest.CaptureFixture) -> None:
    """Two new tokens on the demo: the prefill's and one plain step (no room for a draft). The statistics say so,
    in the singular, rather than an acceptance rate of 0%."""
    status, out, err = run_inprocess(capsys, ["--max-new-tokens", "2"])
    assert status == 0, err
    assert "(1 prefill + 1 verification; plain decoding needs 2)" in err
    assert "drafted, accepted    0, 0: nothing drafted" in err and "acceptance rate" not in err
    assert "K=0: 1 round;" in err


def test_a_low_precision_difference_says_why() -> None:
    """A bfloat16 --compare whose tokens differ at a near tie says that below float32 this can happen, and how
    to check; a float32 one that differs says nothing of the kind (there it would be a bug)."""
    result = {"tokens": [5, 6], "finish_reason": "length", "sampling": {"temperature": 0},
              "stats": {"target_forwards": 2, "tokens_per_forward": 1.0, "drafted": 1, "accepted": 0,
                        "acceptance_rate": 0.0, "draft_lengths": {"1": 1}, "seconds_at_k0": 0, "seconds": 1.0,
                        "tokens_per_second": 2.0},
              "plain": {"tokens": [5, 7], "seconds": 1.0, "tokens_per_second": 2.0}, "identical": False,
              "identical_expected": True, "speedup": 1.0}
    stats = SpecStats()
    assert "--dtype float32 gives" in stats_text(result | {"low_precision": True}, stats)
    assert "--dtype float32" not in stats_text(result | {"low_precision": False}, stats)
