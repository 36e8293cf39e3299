"""Images on the command line, on a tiny E2B-shaped image-text pair (tests/checkpoints.py `images=True`, a tokenizer
with the media tokens, a chat template): generate.py `--image` / `--image-tokens` and chat.py `/image`.

- The three spellings of one image prompt give the same tokens: `--prompt` (the chat template puts the image first
  in the turn), `--prompt-ids` with one boi id where the image goes, and a chat turn after `/image`; with and
  without the assistant, and `--compare` finds them identical.
- Every refusal the issue names is one line and exit status 2: an unreadable or missing file, a target without a
  vision tower (the demo), `--raw`, `--compile`, a batch, a boi count that is not the image count, more image
  tokens than the context holds, `--image-tokens` without an image, Pillow missing, an audio id.
- chat.py on a pseudo-terminal, as a person types: `/image`, a message, a file it cannot read, `/exit`.
"""

import json
import sys
from pathlib import Path

import pytest

from gemma4.tokenizer import Gemma4Tokenizer
from tests.checkpoints import MEDIA_IDS, picture, write_assistant, write_target
from tests.commands.test_chat_cli import Terminal, run_chat, terminal  # noqa: F401 (a fixture)
from tests.commands.test_cli import assert_one_line_failure, run_inprocess
from tests.tokenizer_fixture import write_tokenizer

BOI, SOFT, EOI = MEDIA_IDS["boi_token_id"], MEDIA_IDS["image_token_id"], MEDIA_IDS["eoi_token_id"]
TEMPLATE = "{{ bos_token }}{% for m in messages %}<|turn>{{ m['role'] }}\n{{ m['content'] }}<turn|>\n{% endfor %}"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("images")
    target = write_target(root / "target", "e2b", images=True)
    write_assistant(root / "target-assistant", target, ordered_embeddings=False, echo=True)
    write_tokenizer(target, media=True)
    (target / "chat_template.jinja").write_text(TEMPLATE)
    picture(37, 91, 1).save(root / "tall.png")
    picture(120, 50, 2).convert("L").save(root / "wide.jpg")  # grey, JPEG
    (root / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    return {"target": target, "tall": root / "tall.png", "wide": root / "wide.jpg", "broken": root / "broken.png"}


def generate_json(capsys: pytest.CaptureFixture, files: dict[str, Path], *args: str) -> dict:
    status, out, err = run_inprocess(capsys, ["--target", str(files["target"]), "--max-new-tokens", "10",
                                              "--temperature", "0", "--json", *args])
    assert status == 0, err
    return json.loads(out)


def marked(prompt_ids: list[int]) -> list[int]:
    """A prompt's ids with each image back to its one boi id: what --prompt-ids takes."""
    ids = [i for i in prompt_ids if i != SOFT]
    return [i for j, i in enumerate(ids) if not (i == EOI and j and ids[j - 1] == BOI)]


def test_one_image_prompt_three_ways(files: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    tok = Gemma4Tokenizer(files["target"] / "tokenizer.json")
    image = ["--image", str(files["tall"])]
    by_text = generate_json(capsys, files, "--prompt", " What is it? ", *image)
    assert by_text["images"] == [{"path": str(files["tall"]), "tokens": 65}]
    # The template's text with the image item first: `<|image>` where the processor expands it.
    ids = tok.encode("<bos><|turn>user\n<|image>What is it?<turn|>\n<|turn>model\n")
    assert ids.count(BOI) == 1
    by_ids = generate_json(capsys, files, "--prompt-ids", ",".join(map(str, ids)), *image)
    assert by_ids["tokens"] == by_text["tokens"]
    plain = generate_json(capsys, files, "--prompt", " What is it? ", *image, "--no-assistant")
    assert plain["tokens"] == by_text["tokens"]
    compared = generate_json(capsys, files, "--prompt", "Both?", *image, "--image", str(files["wide"]), "--compare")
    assert compared["identical"] and [im["tokens"] for im in compared["images"]] == [65, 60]
    status, replies, err = run_chat(capsys, ["--target", str(files["target"]), "--max-new-tokens", "10",
                                             "--temperature", "0"], ["/image " + str(files["tall"]), "What is it?"])
    assert status == 0 and replies[0]["tokens"] == by_text["tokens"], err
    assert replies[0]["prompt_ids"] == ids[:ids.index(BOI) + 1] + [SOFT] * 65 + [EOI] + ids[ids.index(BOI) + 1:]


def test_image_tokens_sets_the_budget(files: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    small = generate_json(capsys, files, "--prompt", "x", "--image", str(files["wide"]))["images"][0]["tokens"]
    large = generate_json(capsys, files, "--prompt", "x", "--image", str(files["wide"]), "--image-tokens", "280")
    assert small <= 70 < large["images"][0]["tokens"] <= 280  # the file's processor config says 70


def test_chat_turns_with_images_equal_generate(files: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    """A second turn with two images, after a file that could not be read: generate.py --prompt-ids with the turn's
    prompt (each image back to one boi id) and the three images gives its tokens."""
    flags = ["--target", str(files["target"]), "--max-new-tokens", "10", "--temperature", "0"]
    lines = ["/image " + str(files["tall"]), "What is it?", "/image " + str(files["broken"]),
             "/image " + str(files["wide"]), "/image " + str(files["tall"]), "And these?"]
    status, replies, err = run_chat(capsys, flags, lines)
    assert status == 0, err
    assert "error" in replies[1] and str(files["broken"]) in replies[1]["error"]
    second = replies[2]
    assert second["turn"] == 2 and second["reused"] > 65  # the first turn's image stays in the cache
    images = [a for p in ("tall", "wide", "tall") for a in ("--image", str(files[p]))]
    status, out, err = run_inprocess(capsys, [*flags, "--json", "--prompt-ids",
                                              ",".join(map(str, marked(second["prompt_ids"]))), *images])
    assert status == 0 and json.loads(out)["tokens"] == second["tokens"], err


@pytest.mark.parametrize("case", ["broken", "missing", "demo", "raw", "compile", "batch", "places", "context",
                                  "budget-alone", "budget-value", "no-pillow", "audio", "processor"])
def test_refusals_are_one_line(case: str, files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    target, tall = str(files["target"]), str(files["tall"])
    args, expected = {
        "broken": (["--image", str(files["broken"])], "is not an image Pillow can read"),
        "missing": (["--image", str(tmp_path / "nothing.png")], "no such file"),
        "demo": (["--image", tall], "has no vision tower"),
        "raw": (["--image", tall, "--raw", "--prompt", "x"], "--image with --raw"),
        "compile": (["--image", tall, "--compile"], "--image runs eagerly"),
        "batch": (["--image", tall, "--prompt", "a", "--prompt", "b"], "--image goes with one prompt"),
        "places": (["--image", tall, "--prompt-ids", "2,10,11"], "marks 0 image place(s) (boi id 505) for 1 image(s)"),
        "context": (["--image", tall, "--image", tall], "of them media tokens, and the context holds 100"),
        "budget-alone": (["--image-tokens", "140"], "--image-tokens has no effect here"),
        "budget-value": (["--image", tall, "--image-tokens", "100"], "invalid choice: 100"),
        "no-pillow": (["--image", tall], 'reading images needs Pillow: pip install -e ".[images]"'),
        "audio": (["--image", tall, "--prompt-ids", f"2,{BOI},{MEDIA_IDS['audio_token_id']}"],
                  f"token id {MEDIA_IDS['audio_token_id']} is a media soft token and nothing fills it"),
        "processor": (["--image", tall], "the image processor's patch_size is 16, its vision_config's 4"),
    }[case]
    if case in ("context", "processor"):  # a copy of the target with one file changed
        small = tmp_path / "small"
        small.mkdir()
        for f in files["target"].iterdir():
            (small / f.name).symlink_to(f)
        name = "config.json" if case == "context" else "preprocessor_config.json"
        config = json.loads((files["target"] / name).read_text())
        if case == "context":  # it holds the text but not two images
            config["text_config"]["max_position_embeddings"] = 100
        else:  # the release's 16 px patches for a tower made for 4 px ones
            config["patch_size"] = 16
        (small / name).unlink()
        (small / name).write_text(json.dumps(config))
        target = str(small)
    if case == "no-pillow":
        monkeypatch.setitem(sys.modules, "PIL", None)  # `import PIL` raises ImportError, as without the extra
    status, out, err = run_inprocess(capsys, ([] if case == "demo" else ["--target", target]) + args)
    assert_one_line_failure(status, out, err, expected)


def test_image_in_a_terminal_chat(files: dict[str, Path], request: pytest.FixtureRequest) -> None:
    term: Terminal = request.getfixturevalue("terminal")(["--target", str(files["target"]), "--max-new-tokens", "6", "--temperature", "0"])
    assert "/image PATH or /audio PATH (a WAV file) adds an image or a clip" in term.until("\n>>> ")
    term.send(f"/image {files['tall']}\r")
    assert "-- tall.png: 65 image tokens; 1 image goes with your next message" in term.until("\n>>> ")
    term.send("What is it?\r")
    term.until("\n>>> ")
    term.send(f"/image {files['broken']}\r")
    assert "not attached:" in term.until("\n>>> ")
    term.send("/stats\r")
    assert "-- turn 1: the prompt has" in term.until("\n>>> ")
    term.send("/exit\r")
    assert term.status() == 0
    assert "Traceback" not in term.seen
