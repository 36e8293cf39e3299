"""Video prompts (gemma4/vision/video.py) against transformers 5.22.2: the kept frames, their timestamps, the expanded
prompt ids and the frames' pixels equal its Gemma4Processor's for fewer than, exactly and more than 32 frames at
several rates; logits of a video prompt within the float64 bound (tests/tolerance.py) and greedy tokens equal to its
`generate(pixel_values_videos=...)`, for an encoder family, one that sees each frame both ways, and the 12B; each
frame its own both-ways block (one block for all frames, or none, is far off); speculative equal to plain decoding.

- transformers' Gemma4VideoProcessor needs torchvision, which is not installed: its Gemma4Processor runs with
  `FramesAsImages`, transformers' own video processor base (its frame sampling and metadata) with
  Gemma4VideoProcessor's settings, read from that class's source, whose frames' pixels are transformers' PIL image
  processor at the video budget. That is the path the video processor reduces to, with Pillow's bicubic resize
  where torchvision's would be (which can round a pixel differently: gemma4/vision/processor.py).
- transformers refuses a video of fewer frames than num_frames (32): it is given num_frames = the frame count then,
  which keeps every frame, as ours does.
- transformers' forward drops `num_frames_per_video` on its way to `get_video_features` and fails; its `generate`
  encodes the frames first and passes `mm_encoder_outputs`, which the logits here do too. The 12B's masks are its
  `create_masks_for_generate`'s (both ways on sliding layers only), as in tests/parity/test_images.py.
"""

import ast
import re
from pathlib import Path

import pytest
import torch
import transformers.models.gemma4 as tf_gemma4
import transformers.models.gemma4_unified as tf_unified
from PIL import Image
from transformers import PreTrainedTokenizerFast
from transformers.image_processing_utils import BatchFeature
from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil
from transformers.models.gemma4.processing_gemma4 import Gemma4Processor
from transformers.models.gemma4_unified import modeling_gemma4_unified as unified
from transformers.processing_utils import ProcessorMixin
from transformers.video_processing_utils import BaseVideoProcessor
from transformers.video_utils import VideoMetadata

from gemma4 import load_target
from gemma4.engine.media import Media
from gemma4.tokenizer import Gemma4Tokenizer
from gemma4.vision.loading import load_vision
from gemma4.vision.video import (Frames, VideoConfig, VideoError, frame_files, frame_pixels, place_media, read_video,
                                 sample, timestamp, video_config)
from mtp import DraftLength, load_drafter
from tests.checkpoints import IMAGE_PATCH, MEDIA_IDS, STOP_IDS, picture, write_assistant, write_target
from tests.tf_oracle import tf_target
from tests.tokenizer_fixture import write_tokenizer
from tests.tolerance import assert_fp32_parity
from gemma4.engine import generate_one
from mtp.engine import speculative_one
from gemma4.engine.forward import forward_rows


def class_constants(module_file: str, name: str) -> dict[str, object]:
    """The literal class attributes of a transformers class, read from its source (importing it needs torchvision)."""
    tree = ast.parse(Path(module_file).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    return {t.id: s.value.value for s in cls.body if isinstance(s, ast.Assign) and isinstance(s.value, ast.Constant)
            for t in s.targets if isinstance(t, ast.Name)}


GEMMA4_VIDEO = class_constants(f"{tf_gemma4.__path__[0]}/video_processing_gemma4.py", "Gemma4VideoProcessor")
UNIFIED_VIDEO = class_constants(f"{tf_unified.__path__[0]}/video_processing_gemma4_unified.py",
                                "Gemma4UnifiedVideoProcessor")


class FramesAsImages(BaseVideoProcessor):
    """transformers' video processor base with Gemma4VideoProcessor's settings; pixels: its PIL image processor's."""
    num_frames = GEMMA4_VIDEO["num_frames"]
    do_sample_frames = GEMMA4_VIDEO["do_sample_frames"]
    max_soft_tokens = GEMMA4_VIDEO["max_soft_tokens"]
    patch_size, pooling_kernel_size = IMAGE_PATCH["encoder"]  # the tiny tower's
    do_convert_rgb = False  # torchvision's; the frames here are RGB already

    def _preprocess(self, videos: list[torch.Tensor], **kwargs: object) -> BatchFeature:
        images = Gemma4ImageProcessorPil(patch_size=self.patch_size, pooling_kernel_size=self.pooling_kernel_size,
                                         max_soft_tokens=self.max_soft_tokens)
        out = images([Image.fromarray(f.permute(1, 2, 0).numpy()) for f in videos[0]], return_tensors="pt")
        return BatchFeature({"pixel_values_videos": out["pixel_values"],
                             "video_position_ids": out["image_position_ids"], "num_frames_per_video": [len(videos[0])],
                             "num_soft_tokens_per_video": [int(out["num_soft_tokens_per_image"][0])]})


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokenizer(tmp_path_factory.mktemp("tokenizer"), media=True)


@pytest.fixture(scope="module")
def tokenizer(tokenizer_file: Path) -> Gemma4Tokenizer:
    return Gemma4Tokenizer(tokenizer_file)


@pytest.fixture(scope="module")
def processor(tokenizer_file: Path) -> Gemma4Processor:
    """transformers' processor on the same tokenizer file, its media tokens named as the release's tokenizer names
    them. Its check of each part's class looks VideoProcessorMixin up among the classes torchvision enables: off."""
    tok = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_file), bos_token="<bos>", pad_token="<pad>",
                                  model_specific_special_tokens=dict(
                                      image_token="<|image|>", boi_token="<|image>", eoi_token="<image|>",
                                      audio_token="<|audio|>", boa_token="<|audio>", eoa_token="<audio|>"))
    patch, k = IMAGE_PATCH["encoder"]
    images = Gemma4ImageProcessorPil(patch_size=patch, pooling_kernel_size=k, max_soft_tokens=70)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(ProcessorMixin, "check_argument_for_proper_class", lambda self, name, arg: None)
        return Gemma4Processor(Gemma4AudioFeatureExtractor(), images, tok, FramesAsImages())


@pytest.fixture(scope="module")
def e2b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_target(tmp_path_factory.mktemp("e2b"), "e2b", images=True)


def write_frames(folder: Path, count: int, width: int = 30, height: int = 20) -> list[Image.Image]:
    folder.mkdir(parents=True, exist_ok=True)
    frames = [picture(width, height, 100 + i) for i in range(count)]
    for i, frame in enumerate(frames):
        frame.save(folder / f"{i:04d}.png")
    return frames


def test_settings_are_the_video_processors(e2b: Path) -> None:
    """Both families' video processors keep 32 frames at 70 soft tokens; a checkpoint's are read where transformers
    reads them (here the image processor's preprocessor_config.json, the last place it looks)."""
    keys = ("num_frames", "max_soft_tokens", "do_sample_frames")
    assert [GEMMA4_VIDEO[k] for k in keys] == [UNIFIED_VIDEO[k] for k in keys] == [32, 70, True]
    assert (VideoConfig.num_frames, VideoConfig.max_soft_tokens) == (32, 70)
    theirs = FramesAsImages.from_pretrained(e2b)
    ours = video_config(e2b, load_vision(e2b))
    assert (ours.num_frames, ours.max_soft_tokens) == (theirs.num_frames, theirs.max_soft_tokens)
    assert ours.tokens.soft == MEDIA_IDS["video_token_id"]


@pytest.mark.parametrize("total", [1, 2, 7, 31, 32, 33, 64, 100, 1000, 7301])
def test_kept_frames_and_timestamps_match_transformers(total: int, processor: Gemma4Processor) -> None:
    """Sampling by transformers' own video processor base; timestamps written by its `replace_video_token`."""
    theirs = FramesAsImages().sample_frames(VideoMetadata(total_num_frames=total), num_frames=min(32, total))
    assert sample(total, 32) == theirs.tolist()
    for fps in (0.5, 1.0, 2.5, 24.0, 30000 / 1001):
        meta = VideoMetadata(total_num_frames=total, fps=fps, frames_indices=theirs)
        text = processor.replace_video_token({"num_soft_tokens_per_video": [1], "video_metadata": [meta]}, 0)
        assert [timestamp(i, fps) for i in sample(total, 32)] == re.findall(r"(\d+:\d{2}) <\|image>", text)


@pytest.mark.parametrize("count, fps, text", [
    (5, 1.0, "<|turn>user\n<|video|>What happens?<turn|>\n<|turn>model\n"),
    (32, 2.5, "<|turn>user\n<|image|><|video|>Which frame is the picture?<turn|>\n<|turn>model\n"),
    (45, 0.5, "<|turn>user\nLook: <|video|> and <|image|>, then say.<turn|>\n<|turn>model\n"),
])
def test_prompt_and_pixels_match_gemma4_processor(count: int, fps: float, text: str, e2b: Path, tmp_path: Path,
                                                  tokenizer: Gemma4Tokenizer, processor: Gemma4Processor) -> None:
    vision = load_vision(e2b)
    config = video_config(e2b, vision)
    frames = write_frames(tmp_path / "frames", count)
    images = [picture(41, 23, 7)] if "<|image|>" in text else []
    theirs = processor(text=["<bos>" + text], images=[images] if images else None, videos=[frames],
                       video_metadata=[{"fps": fps, "total_num_frames": count}], return_metadata=True,
                       **({"num_frames": count} if count < 32 else {}))
    video = read_video(vision, tmp_path / "frames", fps, config)
    # Ours: one boi id marks each image's place (gemma4/vision/prompt.py), one video id the video's.
    ids = tokenizer.encode("<bos>" + text.replace("<|image|>", "<|image>"))
    full, media = place_media(ids, [vision.read(p) for p in images], [video], vision.tokens, config.tokens, tokenizer)
    assert full == theirs["input_ids"][0]
    kept = sample(count, config.num_frames)
    assert kept == theirs["video_metadata"][0].frames_indices.tolist()
    files = frame_files(tmp_path / "frames")
    pixels = frame_pixels([files[i] for i in kept], vision.processing, config.max_soft_tokens)
    n = len(pixels[0].patches)
    assert torch.equal(torch.stack([p.patches for p in pixels]), theirs["pixel_values_videos"][:, :n])
    assert torch.equal(torch.stack([p.positions for p in pixels]), theirs["video_position_ids"][:, :n])
    assert bool((theirs["video_position_ids"][:, n:] == -1).all())  # only padding past a frame's patches
    # Every frame is a span of its video ids, both ways as the config says; the image a span of image ids.
    frame_spans = [s for s in media.rows[0] if full[s.start] == config.tokens.soft]
    assert [len(s.vectors) for s in frame_spans] == [pixels[0].soft_tokens] * len(kept)
    assert full.count(config.tokens.soft) == len(kept) * pixels[0].soft_tokens
    assert all(s.both_ways == config.tokens.both_ways for s in frame_spans)
    assert [full[s.start] for s in media.rows[0]].count(vision.tokens.soft) == len(images)
    assert len(media.rows[0]) == len(images) + len(kept)
    # transformers' groups for both ways: 2 on video ids, 1 on image ids (`create_mm_token_type_ids`).
    kinds = {config.tokens.soft: 2, vision.tokens.soft: 1}
    assert theirs["mm_token_type_ids"][0] == [kinds.get(i, 0) for i in full]


PROMPT = [2, 10, 11, MEDIA_IDS["video_token_id"], 12, 13]
FPS = 0.5
FAMILIES = {"e2b": None, "dense": True, "12b": None}  # shape -> both_ways (None: TF's default; the 12B's: "vision")


@pytest.fixture(scope="module", params=list(FAMILIES))
def video_target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Path]:
    """A target and a directory of 3 frames."""
    shape, root = request.param, tmp_path_factory.mktemp(request.param)
    write_frames(root / "frames", 3)
    return shape, write_target(root / "target", shape, images=True, both_ways=FAMILIES[shape]), root / "frames"


def prompt(path: Path, frames: Path, dtype: torch.dtype, tokenizer: Gemma4Tokenizer
           ) -> tuple[list[int], Media, dict[str, torch.Tensor]]:
    """The video prompt's ids, its media, and the frames as transformers takes them (our pixels: module doc)."""
    vision = load_vision(path, dtype=dtype)
    config = video_config(path, vision)
    ids, media = place_media(PROMPT, [], [read_video(vision, frames, FPS, config)], vision.tokens, config.tokens,
                             tokenizer)
    pixels = frame_pixels(frame_files(frames), vision.processing, config.max_soft_tokens)
    return ids, media, dict(pixel_values_videos=torch.stack([p.patches for p in pixels]),
                            video_position_ids=torch.stack([p.positions for p in pixels]),
                            num_frames_per_video=torch.tensor([len(pixels)]))


@torch.no_grad()
def logits(path: Path, frames: Path, dtype: torch.dtype, tokenizer: Gemma4Tokenizer, blocks: str = "frames"
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """(ours, transformers') logits (T, V) of the video prompt; `blocks` "one" or "none" replaces ours' per-frame
    both-ways blocks by one over all frames, or by none."""
    ids, media, video = prompt(path, frames, dtype, tokenizer)
    soft = media.soft([0], len(ids), torch.device("cpu"))
    if blocks == "none":
        soft = soft._replace(both_ways=None)
    elif blocks == "one":
        first, last = media.rows[0][0].start, media.rows[0][-1].end
        lo, hi = torch.zeros(1, len(ids), dtype=torch.long), torch.zeros(1, len(ids), dtype=torch.long)
        lo[0, first:last], hi[0, first:last] = first, last
        soft = soft._replace(both_ways=(lo, hi))
    mine = forward_rows(load_target(path, dtype=dtype, fast=False), torch.tensor([ids]), soft=soft).logits[0]
    tf = tf_target(path, dtype=dtype)
    x = torch.tensor([ids])
    mm = 2 * (x == MEDIA_IDS["video_token_id"]).long()  # transformers' mm_token_type_ids: 2 on video ids
    masks = type(tf).create_masks_for_generate(tf.config, torch.empty((1, len(ids), 0), dtype=dtype),
                                               torch.ones_like(x), None, torch.arange(len(ids))[None],
                                               mm_token_type_ids=mm)
    encoded = tf.model.get_video_features(**video, return_dict=True)
    theirs = tf(input_ids=x, mm_token_type_ids=mm, attention_mask=masks, mm_encoder_outputs={"video": encoded})
    return mine, theirs.logits[0]


def test_video_prompt_logits_match_transformers(video_target, tokenizer: Gemma4Tokenizer) -> None:  # noqa: ANN001
    shape, path, frames = video_target
    ours, theirs = logits(path, frames, torch.float32, tokenizer)
    ours64, theirs64 = logits(path, frames, torch.float64, tokenizer)
    assert_fp32_parity("video prompt", f"{shape}, 3 frames", ours, theirs, ours64, theirs64,
                       load_target(path, fast=False).config.num_layers)


@pytest.mark.parametrize("shape", ["dense", "12b"])
def test_each_frame_is_its_own_both_ways_block(shape: str, tmp_path: Path, tokenizer: Gemma4Tokenizer) -> None:
    """Where the config asks for both ways, one block over all frames, or none, is far from transformers."""
    path = write_target(tmp_path / "target", shape, images=True, both_ways=True)
    write_frames(tmp_path / "frames", 3)
    for blocks in ("one", "none"):
        ours, theirs = logits(path, tmp_path / "frames", torch.float64, tokenizer, blocks)
        assert float((ours - theirs).abs().max()) > 1e-2, blocks


CAUSAL_MASKS = unified.create_masks_for_generate


def both_ways_on_sliding_layers_only(block_sequence_ids: torch.Tensor | None = None, **kwargs: object) -> dict:
    """The 12B forward's masks, built as its `create_masks_for_generate` builds them (module doc)."""
    if block_sequence_ids is None:
        return CAUSAL_MASKS(**kwargs)
    return unified.create_masks_for_vision_model(block_sequence_ids=block_sequence_ids, **kwargs)


@torch.no_grad()
def test_greedy_tokens_equal_transformers_generate(video_target, tokenizer: Gemma4Tokenizer,  # noqa: ANN001
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    shape, path, frames = video_target
    if shape == "12b":
        monkeypatch.setattr(unified, "create_masks_for_generate", both_ways_on_sliding_layers_only)
    ids, media, video = prompt(path, frames, torch.float64, tokenizer)
    mine = generate_one(load_target(path, dtype=torch.float64, fast=False), ids, 16, None, STOP_IDS, images=media)
    x = torch.tensor([ids])
    out = tf_target(path, dtype=torch.float64).generate(
        input_ids=x, attention_mask=torch.ones_like(x), mm_token_type_ids=2 * (x == MEDIA_IDS["video_token_id"]).long(),
        max_new_tokens=16, do_sample=False, **video)
    assert out[0, len(ids):].tolist() == mine


def test_speculative_equals_plain_over_a_video_prompt(tmp_path: Path, tokenizer: Gemma4Tokenizer) -> None:
    """Greedy, with a prefill chunk shorter than a frame (it must not split one where both ways are asked)."""
    path = write_target(tmp_path / "t", "dense", images=True, both_ways=True)
    write_frames(tmp_path / "frames", 3)
    drafter = load_drafter(write_assistant(tmp_path / "a", path, ordered_embeddings=False, echo=True, seed=2))
    ids, media, _ = prompt(path, tmp_path / "frames", torch.float32, tokenizer)
    target = load_target(path)
    plain = generate_one(target, ids, 12, None, images=media)
    for chunk in (None, 16):
        spec = speculative_one(target, drafter, ids, 12, DraftLength(3), images=media, prefill_chunk=chunk)
        assert spec.tokens == plain
    assert generate_one(target, ids, 12, None, images=media, prefill_chunk=16) == plain


def test_one_line_errors(e2b: Path, tmp_path: Path, tokenizer: Gemma4Tokenizer) -> None:
    vision = load_vision(e2b)
    config = video_config(e2b, vision)
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("no frames")
    write_frames(tmp_path / "mixed", 2)
    picture(40, 20, 9).save(tmp_path / "mixed" / "0002.png")
    cases = [(tmp_path / "missing", 1.0, "no such directory"), (tmp_path / "empty", 1.0, "is empty: extract"),
             (tmp_path / "notes", 1.0, "holds no PNG, JPEG, WebP, GIF or BMP file: extract"),
             (tmp_path / "mixed", 1.0, "a video's frames have one size"), (tmp_path / "mixed", 0.0, "fps=0.0")]
    for folder, fps, message in cases:
        with pytest.raises(VideoError, match=re.escape(message)) as e:
            read_video(vision, folder, fps, config)
        assert "\n" not in str(e.value)
    with pytest.raises(VideoError, match="marks 0 video place"):
        place_media([2, 10], [], [Frames(["00:00"], [torch.zeros(3, 64)])], vision.tokens, config.tokens, tokenizer)
    raw = (e2b / "config.json").read_text()
    no_video = tmp_path / "no_video"
    no_video.mkdir()
    (no_video / "config.json").write_text(re.sub(r'"video_token_id": \d+', '"video_token_id": null', raw))
    with pytest.raises(VideoError, match="has no video token"):
        video_config(no_video, vision)
