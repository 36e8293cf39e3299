"""Audio and video on the command line, on tiny image-audio-text pairs of both families (tests/checkpoints.py
`images=True, audio=True`: E2B's conformer tower, and the 12B's frame embedder and encoder-free image embedder; a
tokenizer with the media tokens, a chat template): generate.py `--audio` / `--video-frames` / `--fps` and chat.py
`/audio`. The sibling of test_cli_images.py.

- The three spellings of one clip's prompt give the same tokens: `--prompt` (the chat template puts the clip before
  the text), `--prompt-ids` with one boa id where the clip goes, and a chat turn after `/audio`; with and without the
  assistant, `--compare` finds them identical, and the JSON's "audio" counts what `load_audio(target).read` gives.
  Another clip of the same length gives other tokens: the clip's sound is heard, not only its length.
- An image, a video and two clips in one prompt: the same tokens with and without the assistant, and as
  `--prompt-ids` with boi, video id, boa, boa in that order (another order gives other tokens); the JSON's "images",
  "video" (the frames' mm:ss at `--fps 2`, and at the default 1) and "audio". Without a chat template the same
  marks follow `<bos>`.
- Every refusal is one line and exit status 2: a target that takes no audio (the demo; `audio_config: null`), a
  missing, non-WAV or float WAV file, `--compile`, `--raw`, a batch, a boa or video id count that is not the media
  count, `--fps` alone or 0, a frames directory that is missing, empty or holds no image (its line names ffmpeg),
  more media tokens than the context holds.
- A 31 s clip: E2B's tower reads its first 30 s (750 tokens) with a note line on stderr, with `--json` too (then
  the only line there); the 12B takes it whole (775 tokens), without a note.
- chat.py: in `--json` mode a clip that is not attached is `{"error": ...}` in the turn's place and the
  conversation goes on, its second turn equal to generate.py's on that turn's prompt; on a pseudo-terminal, as a
  person types: `/audio`, a message, a file it cannot read ("not attached: ..."), another message, `/exit`.
  A clip too short for one soft token (E2B: 10 ms or less) is not attached, and the chat goes on.
"""

import json
import math
import random
import struct
import wave
from pathlib import Path

import pytest

from gemma4.audio.loading import load_audio
from gemma4.tokenizer import Gemma4Tokenizer
from gemma4.vision.loading import load_vision
from gemma4.vision.video import read_video, timestamp, video_config
from tests.checkpoints import MEDIA_IDS, picture, write_assistant, write_target
from tests.commands.test_chat_cli import Terminal, run_chat, terminal  # noqa: F401 (a fixture)
from tests.commands.test_cli import assert_one_line_failure, run_inprocess
from tests.tokenizer_fixture import write_tokenizer

BOA, SOFT, EOA = MEDIA_IDS["boa_token_id"], MEDIA_IDS["audio_token_id"], MEDIA_IDS["eoa_token_index"]
BOI, VIDEO = MEDIA_IDS["boi_token_id"], MEDIA_IDS["video_token_id"]
TEMPLATE = "{{ bos_token }}{% for m in messages %}<|turn>{{ m['role'] }}\n{{ m['content'] }}<turn|>\n{% endfor %}"
FAMILIES = ("e2b", "12b")  # E2B's conformer tower; the 12B's frame embedder (and its encoder-free image embedder)
FPS2 = ["00:00", "00:00", "00:01", "00:01", "00:02"]  # 5 frames extracted at 2 per second


def write_wav(path: Path, seconds: float, rate: int = 16_000, channels: int = 1, tone: float = 440.0,
              seed: int = 0) -> Path:
    """A 16-bit PCM WAV of a tone with a little noise (each channel at its own level), by the standard library."""
    rng = random.Random(seed)
    frames = []
    for k in range(int(seconds * rate)):
        x = 0.3 * math.sin(2 * math.pi * tone * k / rate) + 0.05 * rng.uniform(-1, 1)
        frames.append(struct.pack(f"<{channels}h", *(int(32767 * x / (c + 1)) for c in range(channels))))
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"".join(frames))
    return path


def write_float_wav(path: Path, seconds: float = 0.5, rate: int = 16_000) -> Path:
    """A 32-bit IEEE float WAV (format tag 3), which `wave` and so the reader refuse."""
    data = struct.pack(f"<{int(seconds * rate)}f", *(0.3 * math.sin(k / 5) for k in range(int(seconds * rate))))
    fmt = struct.pack("<HHIIHH", 3, 1, rate, 4 * rate, 4, 32)
    path.write_bytes(b"RIFF" + struct.pack("<I", 4 + 8 + len(fmt) + 8 + len(data)) + b"WAVE"
                     + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data)
    return path


def edited_copy(target: Path, where: Path, edit) -> Path:  # noqa: ANN001 (a callable on the config's dict)
    """A copy of the target (its files linked) whose config.json is `edit`ed."""
    where.mkdir()
    for f in target.iterdir():
        (where / f.name).symlink_to(f)
    config = json.loads((target / "config.json").read_text())
    edit(config)
    (where / "config.json").unlink()
    (where / "config.json").write_text(json.dumps(config))
    return where


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("audio")
    out = {}
    for family in FAMILIES:
        target = write_target(root / family, family, images=True, audio=True)
        write_assistant(root / f"{family}-assistant", target, ordered_embeddings=False, echo=True)
        write_tokenizer(target, media=True)
        (target / "chat_template.jinja").write_text(TEMPLATE)
        out[family] = target
    out["deaf"] = edited_copy(out["e2b"], root / "deaf", lambda c: c.update(audio_config=None))  # as 26B-A4B, 31B
    out["small"] = edited_copy(out["e2b"], root / "small",
                               lambda c: c["text_config"].update(max_position_embeddings=100))
    out["a"] = write_wav(root / "a.wav", 1.5)  # 16-bit mono 16 kHz
    out["a2"] = write_wav(root / "a2.wav", 1.5, tone=1250.0, seed=7)  # as long as a.wav, another sound
    out["b"] = write_wav(root / "b.wav", 2.2, rate=44_100, channels=2, seed=1)  # stereo 44.1 kHz: mixed, resampled
    out["long"] = write_wav(root / "long.wav", 31.0, seed=2)
    out["blip"] = write_wav(root / "blip.wav", 0.01, seed=3)  # 160 samples: under E2B's one soft token (320)
    out["notwav"] = root / "notes.wav"
    out["notwav"].write_text("not a recording\n")
    out["float"] = write_float_wav(root / "float.wav")
    picture(37, 91, 1).save(root / "tall.png")
    out["tall"] = root / "tall.png"
    out["frames"] = root / "frames"
    out["frames"].mkdir()
    for i in range(5):
        picture(40, 24, 10 + i).save(out["frames"] / f"{i + 1:04d}.png")
    out["empty"] = root / "empty"
    out["empty"].mkdir()
    out["no-images"] = root / "no-images"
    out["no-images"].mkdir()
    (out["no-images"] / "clip.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42")
    return out


def generate_json(capsys: pytest.CaptureFixture, target: Path, *args: str) -> dict:
    status, out, err = run_inprocess(capsys, ["--target", str(target), "--max-new-tokens", "10", "--temperature", "0",
                                              "--json", *args])
    assert status == 0, err
    return json.loads(out)


def soft_tokens(target: Path, path: Path) -> int:
    """The clip's soft tokens as the library reads it."""
    return len(load_audio(target).read(path))


def marked(prompt_ids: list[int]) -> list[int]:
    """A prompt's ids with each clip back to its one boa id: what --prompt-ids takes."""
    ids = [i for i in prompt_ids if i != SOFT]
    return [i for j, i in enumerate(ids) if not (i == EOA and j and ids[j - 1] == BOA)]


@pytest.mark.parametrize("family", FAMILIES)
def test_one_clip_prompt_three_ways(family: str, files: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    target = files[family]
    tok = Gemma4Tokenizer(target / "tokenizer.json")
    n, n_b = soft_tokens(target, files["a"]), soft_tokens(target, files["b"])
    clip = ["--audio", str(files["a"])]
    by_text = generate_json(capsys, target, "--prompt", " What is it? ", *clip)
    assert by_text["audio"] == [{"path": str(files["a"]), "tokens": n}] and n > 0
    assert "images" not in by_text and "video" not in by_text
    # The template's text with the clip item first: `<|audio>` where the processor expands it.
    ids = tok.encode("<bos><|turn>user\n<|audio>What is it?<turn|>\n<|turn>model\n")
    assert ids.count(BOA) == 1
    by_ids = generate_json(capsys, target, "--prompt-ids", ",".join(map(str, ids)), *clip)
    assert by_ids["tokens"] == by_text["tokens"]
    plain = generate_json(capsys, target, "--prompt", " What is it? ", *clip, "--no-assistant")
    assert plain["tokens"] == by_text["tokens"]
    # The sound is heard: another clip of as many tokens gives other tokens.
    other = generate_json(capsys, target, "--prompt", " What is it? ", "--audio", str(files["a2"]))
    assert other["audio"][0]["tokens"] == n and other["tokens"] != by_text["tokens"]
    compared = generate_json(capsys, target, "--prompt", "Both?", *clip, "--audio", str(files["b"]), "--compare")
    assert compared["identical"] and compared["plain"]["tokens"] == compared["tokens"]
    assert compared["audio"] == [{"path": str(files["a"]), "tokens": n}, {"path": str(files["b"]), "tokens": n_b}]
    status, replies, err = run_chat(capsys, ["--target", str(target), "--max-new-tokens", "10", "--temperature", "0"],
                                    ["/audio " + str(files["a"]), "What is it?"])
    assert status == 0 and replies[0]["tokens"] == by_text["tokens"], err
    at = ids.index(BOA) + 1
    assert replies[0]["prompt_ids"] == ids[:at] + [SOFT] * n + [EOA] + ids[at:]


@pytest.mark.parametrize("family", FAMILIES)
def test_image_video_and_two_clips(family: str, files: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    target = files[family]
    tok = Gemma4Tokenizer(target / "tokenizer.json")
    vision = load_vision(target)
    n_image = len(vision.read(files["tall"]))
    video = read_video(vision, files["frames"], 2.0, video_config(target, vision))
    n_a, n_b = soft_tokens(target, files["a"]), soft_tokens(target, files["b"])
    media = ["--image", str(files["tall"]), "--video-frames", str(files["frames"]), "--fps", "2",
             "--audio", str(files["a"]), "--audio", str(files["b"])]
    spec = generate_json(capsys, target, "--prompt", "Tell me.", *media)
    assert spec["images"] == [{"path": str(files["tall"]), "tokens": n_image}]
    assert spec["video"] == {"path": str(files["frames"]), "frames": FPS2,
                             "tokens": sum(len(v) for v in video.vectors)}
    assert FPS2 == [timestamp(i, 2.0) for i in range(5)] == video.timestamps
    assert spec["audio"] == [{"path": str(files["a"]), "tokens": n_a}, {"path": str(files["b"]), "tokens": n_b}]
    plain = generate_json(capsys, target, "--prompt", "Tell me.", *media, "--no-assistant")
    assert plain["tokens"] == spec["tokens"]
    # A chat turn holds its images, then its video, then its clips, before its text.
    ids = tok.encode("<bos><|turn>user\n<|image><|video|><|audio><|audio>Tell me.<turn|>\n<|turn>model\n")
    assert [i for i in ids if i in (BOI, VIDEO, BOA)] == [BOI, VIDEO, BOA, BOA]
    by_ids = generate_json(capsys, target, "--prompt-ids", ",".join(map(str, ids)), *media)
    assert by_ids["tokens"] == spec["tokens"]
    swapped = tok.encode("<bos><|turn>user\n<|audio><|audio><|image><|video|>Tell me.<turn|>\n<|turn>model\n")
    other = generate_json(capsys, target, "--prompt-ids", ",".join(map(str, swapped)), *media)
    assert other["tokens"] != spec["tokens"]  # the order is seen, so the check above can fail


def test_without_a_chat_template_media_follow_bos(files: dict[str, Path], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    """A target without a chat template continues the text as it is: its media go right after `<bos>`, the image,
    then the video, then the clips, as --prompt-ids with those marks there give."""
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in files["e2b"].iterdir():
        if f.name != "chat_template.jinja":
            (bare / f.name).symlink_to(f)
    media = ["--image", str(files["tall"]), "--video-frames", str(files["frames"]), "--audio", str(files["a"]),
             "--audio", str(files["b"]), "--no-assistant"]
    by_text = generate_json(capsys, bare, "--prompt", "def f(x):", *media)
    ids = [2, BOI, VIDEO, BOA, BOA] + Gemma4Tokenizer(bare / "tokenizer.json").encode_raw("def f(x):")[1:]
    assert generate_json(capsys, bare, "--prompt-ids", ",".join(map(str, ids)), *media)["tokens"] == by_text["tokens"]
    swapped = ids[:1] + [BOA, BOA, BOI, VIDEO] + ids[5:]
    assert generate_json(capsys, bare, "--prompt-ids", ",".join(map(str, swapped)), *media)["tokens"] != \
        by_text["tokens"]


@pytest.mark.parametrize("kind", ["image", "video", "audio"])
def test_without_a_chat_template_one_kind_alone(kind: str, files: dict[str, Path], tmp_path: Path,
                                                capsys: pytest.CaptureFixture) -> None:
    """One kind of medium alone on a target without a chat template (a KeyError once: the marks of the kinds not
    given were looked up): its mark right after `<bos>`, as --prompt-ids with it there give."""
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in files["e2b"].iterdir():
        if f.name != "chat_template.jinja":
            (bare / f.name).symlink_to(f)
    flag, path, mark = {"image": ("--image", files["tall"], BOI), "video": ("--video-frames", files["frames"], VIDEO),
                        "audio": ("--audio", files["a"], BOA)}[kind]
    media = [flag, str(path), "--no-assistant"]
    by_text = generate_json(capsys, bare, "--prompt", "def f(x):", *media)
    ids = [2, mark] + Gemma4Tokenizer(bare / "tokenizer.json").encode_raw("def f(x):")[1:]
    assert generate_json(capsys, bare, "--prompt-ids", ",".join(map(str, ids)), *media)["tokens"] == by_text["tokens"]


def test_video_frames_default_to_one_per_second(files: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    result = generate_json(capsys, files["e2b"], "--prompt", "x", "--video-frames", str(files["frames"]),
                           "--no-assistant", "--max-new-tokens", "2")
    assert result["video"]["frames"] == ["00:00", "00:01", "00:02", "00:03", "00:04"]
    assert "audio" not in result and "images" not in result


@pytest.mark.parametrize("case", ["demo", "deaf", "missing", "not-wav", "float", "compile-audio", "compile-video",
                                  "raw", "batch", "no-boa", "two-boa", "no-video-id", "fps-alone", "fps-zero",
                                  "no-directory", "empty", "no-images", "context", "too-short", "typed-soft"])
def test_refusals_are_one_line(case: str, files: dict[str, Path], tmp_path: Path,
                               capsys: pytest.CaptureFixture) -> None:
    a, frames = str(files["a"]), str(files["frames"])
    args, expected = {
        "demo": (["--audio", a], "takes no audio"),
        "deaf": (["--audio", a], "takes no audio"),
        "missing": (["--audio", str(tmp_path / "nothing.wav")], "no such file"),
        "not-wav": (["--audio", str(files["notwav"])], "is not 16-bit PCM WAV"),
        "float": (["--audio", str(files["float"])], "is not 16-bit PCM WAV"),
        "compile-audio": (["--audio", a, "--compile"], "--audio runs eagerly"),
        "compile-video": (["--video-frames", frames, "--compile"], "--video-frames runs eagerly"),
        "raw": (["--audio", a, "--raw", "--prompt", "x"], "--audio with --raw"),
        "batch": (["--audio", a, "--prompt", "a", "--prompt", "b"], "--audio goes with one prompt"),
        "no-boa": (["--audio", a, "--prompt-ids", "2,10,11"], f"marks 0 audio place(s) (boa id {BOA}) for 1 clip(s)"),
        "two-boa": (["--audio", a, "--prompt-ids", f"2,{BOA},10,{BOA}"], "marks 2 audio place(s)"),
        "no-video-id": (["--video-frames", frames, "--prompt-ids", "2,10,11"],
                        f"marks 0 video place(s) (video id {VIDEO}) for 1 video(s)"),
        "fps-alone": (["--fps", "2"], "--fps has no effect here"),
        "fps-zero": (["--video-frames", frames, "--fps", "0"], "--fps must be above 0"),
        "no-directory": (["--video-frames", str(tmp_path / "nowhere")], "no such directory"),
        "empty": (["--video-frames", str(files["empty"])], "is empty"),
        "no-images": (["--video-frames", str(files["no-images"])], "holds no PNG, JPEG, WebP, GIF or BMP file"),
        "context": (["--audio", str(files["long"])], "of them media tokens, and the context holds 100"),
        "too-short": (["--audio", str(files["blip"])], "blip.wav lasts 10 ms: too short for one audio token"),
        "typed-soft": (["--audio", a, "--prompt-ids", f"2,{BOA},{SOFT},{EOA},10"],
                       f"the prompt already holds audio soft tokens (id {SOFT})"),
    }[case]
    target = {"deaf": files["deaf"], "context": files["small"]}.get(case, files["e2b"])
    status, out, err = run_inprocess(capsys, ([] if case == "demo" else ["--target", str(target)]) + args)
    assert_one_line_failure(status, out, err, expected)
    if case in ("not-wav", "float"):  # the fix: the ffmpeg line that converts it
        assert "-ar 16000 -ac 1 -c:a pcm_s16le" in err.strip().splitlines()[-1]
    if case in ("no-directory", "empty", "no-images"):
        assert "ffmpeg -i clip.mp4 -vf fps=1" in err.strip().splitlines()[-1]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_31_s_clip(family: str, files: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    """E2B: cut to its first 30 s (750 tokens), with a note line (with --json: in the JSON document's "notes", stderr
    quiet); the 12B takes it whole (ceil(31 s * 16000 / 640) = 775 frames), without a note."""
    note = "note: long.wav lasts 31.0 s and is cut to its first 30 s, as the release's feature extractor cuts it"
    flags = ["--target", str(files[family]), "--max-new-tokens", "6", "--temperature", "0", "--prompt", "x",
             "--audio", str(files["long"])]
    status, out, err = run_inprocess(capsys, flags)
    assert status == 0, err
    lines = err.splitlines()
    assert (note in lines) == (family == "e2b"), err
    assert any(line.startswith("audio      long.wav (") for line in lines), err
    status, out, err = run_inprocess(capsys, [*flags, "--json"])
    assert status == 0, err
    assert err == ""
    assert json.loads(out)["notes"] == ([note.removeprefix("note: ")] if family == "e2b" else [])
    assert json.loads(out)["audio"] == [{"path": str(files["long"]), "tokens": 750 if family == "e2b" else 775}]


def test_chat_json_clips(files: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    """A clip not attached is {"error": ...} in the turn's place; the conversation goes on, and its second turn (the
    first turn's clip and a 31 s one) is generate.py's on that turn's prompt."""
    flags = ["--target", str(files["e2b"]), "--max-new-tokens", "6", "--temperature", "0"]
    lines = ["/audio " + str(files["a"]), "What is it?", "/audio " + str(files["notwav"]), "/audio",
             "/audio " + str(files["a"].with_name("gone.wav")), "/audio " + str(files["long"]), "And this?"]
    status, replies, err = run_chat(capsys, flags, lines)
    assert status == 0, err
    assert [sorted(r) if "error" in r else r["turn"] for r in replies] == [1, ["error"], ["error"], ["error"], 2]
    assert "is not 16-bit PCM WAV" in replies[1]["error"] and str(files["notwav"]) in replies[1]["error"]
    assert "/audio needs a path" in replies[2]["error"]
    assert "gone.wav: no such file" in replies[3]["error"]
    # --json keeps stderr quiet: the note is in the turn's object.
    assert err == "" and replies[4]["notes"] == ["long.wav lasts 31.0 s and is cut to its first 30 s, as the "
                                                 "release's feature extractor cuts it"]
    second = replies[4]
    assert second["prompt_ids"].count(SOFT) == soft_tokens(files["e2b"], files["a"]) + 750
    assert second["reused"] >= len(replies[0]["prompt_ids"])  # the first turn's clip stays in the cache
    clips = ["--audio", str(files["a"]), "--audio", str(files["long"])]
    status, out, err = run_inprocess(capsys, [*flags, "--json", "--prompt-ids",
                                              ",".join(map(str, marked(second["prompt_ids"]))), *clips])
    assert status == 0 and json.loads(out)["tokens"] == second["tokens"], err
    # A target that takes no audio: the same object, and the next message is a turn.
    status, replies, err = run_chat(capsys, ["--target", str(files["deaf"]), "--no-assistant", "--max-new-tokens", "3"],
                                    ["/audio " + str(files["a"]), "hello"])
    assert status == 0 and "takes no audio" in replies[0]["error"] and replies[1]["turn"] == 1, err


def test_chat_goes_on_after_a_clip_too_short(files: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    """A clip E2B's tower makes no soft token of (10 ms or less) is refused as one line at /audio, naming the file, and
    the conversation goes on, as after any clip that cannot be used."""
    status, replies, err = run_chat(capsys, ["--target", str(files["e2b"]), "--no-assistant", "--max-new-tokens", "3"],
                                    ["/audio " + str(files["blip"]), "What is it?", "Still there?"])
    assert status == 0, err
    assert any("blip.wav" in r.get("error", "") for r in replies), replies
    assert [r.get("turn") for r in replies[1:]] == [1, 2], replies  # refused at /audio: both messages are turns


def test_audio_in_a_terminal_chat(files: dict[str, Path], request: pytest.FixtureRequest) -> None:
    term: Terminal = request.getfixturevalue("terminal")(["--target", str(files["e2b"]), "--max-new-tokens", "6",
                                                          "--temperature", "0"])
    assert "/audio PATH (a WAV file) adds an image or a clip" in term.until("\n>>> ")
    n, n_b = soft_tokens(files["e2b"], files["a"]), soft_tokens(files["e2b"], files["b"])
    term.send(f"/audio {files['a']}\r")
    assert f"-- a.wav: {n} audio tokens; 1 clip goes with your next message" in term.until("\n>>> ")
    term.send(f"/audio {files['b']}\r")
    assert f"-- b.wav: {n_b} audio tokens; 2 clips go with your next message" in term.until("\n>>> ")
    term.send("What is it?\r")
    term.until("\n>>> ")
    term.send(f"/audio {files['notwav']}\r")
    shown = term.until("\n>>> ")
    assert "not attached:" in shown and "is not 16-bit PCM WAV" in shown
    term.send("And now?\r")
    term.until("\n>>> ")
    term.send("/stats\r")
    assert "-- turn 2: the prompt has" in term.until("\n>>> ")
    term.send("/exit\r")
    assert term.status() == 0
    assert "Traceback" not in term.seen
