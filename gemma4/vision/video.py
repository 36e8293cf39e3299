"""A video in a prompt, as timed frames: a directory of its frames, sampled, each read as an image at the video budget
and written after its timestamp, as transformers 5.22.2's Gemma4Processor and Gemma4VideoProcessor write a video
(gemma4_unified's are the same).

Facts a reader must know (gemma4/README.md §19):
- Nothing here decodes a video: a video is a directory of its frames as image files, taken in name order (ffmpeg's
  `%04d` keeps that the time order), and the rate they were extracted at, `fps`: frame i is at i / fps seconds.
- At most `num_frames` (32) frames are kept, uniformly: the j-th of n kept is frame j * total // n (transformers'
  `default_sample_indices_fn`); a video of fewer frames keeps every one. Only the kept frames are decoded.
- A frame is an image at the video budget, `max_soft_tokens` 70 (the video processor's; an image's is 280): the same
  resize, patches and tower (gemma4/vision/processor.py), one frame at a time, so n vectors per frame. A video's
  frames have one size, as transformers stacks them. The settings are read where transformers reads them
  (`video_section`): a checkpoint without a video processor config gets its image processor's file, budget included.
- One video id (config.json's `video_token_id`, `<|video|>`) marks a video's place, as the chat template writes a
  video item. It becomes, frame after frame, the timestamp `mm:ss`, a space, then boi, n video ids, eoi; frames are
  joined by a space: `00:00 <|image>…<image|> 00:02 <|image>…<image|>`. The timestamp is the frame's seconds floored
  to whole minutes and seconds, two digits at least ("75:03" past the hour). A frame's soft tokens are video ids,
  not image ids; boi and eoi are the image's. So a frame is written as an image whose soft id is the video id
  (`VideoConfig.tokens`), and `PromptImages` places frames as it places images.
- Both ways (config "vision"): each frame's soft tokens see each other both ways, never another frame's:
  transformers groups each unbroken run of image or video ids, and the text between two frames breaks it.
- A timestamp's text is tokenized on its own. transformers tokenizes the expanded string, where the first timestamp
  joins the text before the video; the ids are the same because Gemma's vocabulary spells every digit alone (no
  piece joins a digit to its neighbour), and the run after the last eoi is the text after the video in both.
- Images and videos in one prompt: the images are placed first (`place_media`), because a frame brings boi ids of
  its own, which mark no image's place.

Shape legend: n vectors (soft tokens) of a frame, E text hidden.
"""

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from gemma4.config import ConfigError
from gemma4.config_file import processor_section, read_json
from gemma4.engine.media import Media
from gemma4.tokenizer import VIDEO_ID
from gemma4.vision.config import ImageTokens
from gemma4.vision.processor import SOFT_TOKEN_CHOICES, ImageProcessing, Pixels, open_image, process
from gemma4.vision.prompt import ImageError, PromptImages, expand

if TYPE_CHECKING:
    from gemma4.tokenizer import Gemma4Tokenizer
    from gemma4.vision.loading import Vision

FRAME_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp")  # what Pillow reads as images here
EXTRACT = "extract the video's frames first, e.g. `ffmpeg -i clip.mp4 -vf fps=1 frames/%04d.png` (and fps 1)"


class VideoError(ImageError):
    """A video this implementation cannot take; the one-line message says what to change."""


@dataclass(frozen=True)
class VideoConfig:
    """How a target writes a video: a frame's ids and the video processor's settings."""
    tokens: ImageTokens  # a frame's: boi, the video id as its soft token, eoi, and both ways as an image's
    num_frames: int | None = 32  # frames kept at most; None: every frame
    max_soft_tokens: int = 70  # soft tokens per frame at most, one of SOFT_TOKEN_CHOICES


class Frames(NamedTuple):
    """A video's kept frames: each one's timestamp, as the prompt writes it, and its (n, E) vectors."""
    timestamps: list[str]
    vectors: list[torch.Tensor]


def video_section(model_dir: Path) -> dict[str, Any]:
    """The video processor's settings, found as transformers finds them: processor_config.json's "video_processor",
    else video_preprocessor_config.json, else preprocessor_config.json (the image processor's file); {} without any."""
    return processor_section(model_dir, (("processor_config.json", "video_processor"),
                                         ("video_preprocessor_config.json", None), ("preprocessor_config.json", None)))


def video_config(model_dir: str | Path, vision: "Vision") -> VideoConfig:
    """The video side of the target at `model_dir` (a directory), whose image side is `vision`."""
    raw = read_json(Path(model_dir) / "config.json")
    video_id = raw.get("video_token_id", VIDEO_ID)
    if video_id is None:
        raise VideoError(f"{model_dir} has no video token (config.json's video_token_id is null): a video needs a "
                         f"target that has one, e.g. google/gemma-4-E2B-it")
    if int(video_id) in (vision.tokens.boi, vision.tokens.soft, vision.tokens.eoi):
        raise ConfigError(f"{model_dir}: video_token_id {video_id} is also an image id: restore the release's "
                          f"config.json")
    section = video_section(Path(model_dir))
    # The frames go through the image side's tower: the geometry the video processor states must be the tower's.
    for field in ("patch_size", "pooling_kernel_size"):
        if field in section and int(section[field]) != getattr(vision.processing, field):
            raise ConfigError(f"{model_dir}: the video processor's {field} is {section[field]}, the image "
                              f"processor's {getattr(vision.processing, field)}: restore the release's processor "
                              f"config")
    if section.get("fps") is not None:
        raise ConfigError(f"{model_dir}: the video processor samples fps={section['fps']} frames per second: only "
                          f"sampling a number of frames (num_frames) is implemented")
    num_frames = section.get("num_frames", 32) if section.get("do_sample_frames", True) else None
    if num_frames is not None and int(num_frames) < 1:
        raise ConfigError(f"video processor num_frames={num_frames}: it must be at least 1")
    config = VideoConfig(tokens=dataclasses.replace(vision.tokens, soft=int(video_id)),
                         num_frames=None if num_frames is None else int(num_frames),
                         max_soft_tokens=int(section.get("max_soft_tokens", 70)))
    if config.max_soft_tokens not in SOFT_TOKEN_CHOICES:
        raise ConfigError(f"video processor max_soft_tokens={config.max_soft_tokens}: it must be one of "
                          f"{SOFT_TOKEN_CHOICES}")
    return config


def frame_files(directory: str | Path) -> list[Path]:
    """A video's frames: the image files in `directory` (not below it), in name order."""
    folder = Path(directory)
    if folder.is_file():
        raise VideoError(f"{folder} is a file, and a video is given as the directory of its frames: for one picture "
                         f"use --image; for a video file, {EXTRACT}")
    if not folder.is_dir():
        raise VideoError(f"{folder}: no such directory: a video is given as the directory of its frames; {EXTRACT}")
    files = sorted(p for p in folder.iterdir()
                   if p.is_file() and p.suffix.lower() in FRAME_SUFFIXES and not p.name.startswith("."))
    if not files:
        what = "is empty" if not any(folder.iterdir()) else "holds no PNG, JPEG, WebP, GIF or BMP file"
        raise VideoError(f"{folder} {what}: {EXTRACT}")
    return files


def sample(total: int, num_frames: int | None) -> list[int]:
    """The frames kept of `total`: at most num_frames (None: all), spread uniformly (transformers'
    `default_sample_indices_fn`, which refuses fewer frames than num_frames; here that keeps every frame)."""
    n = total if num_frames is None else min(num_frames, total)
    return [j * total // n for j in range(n)]


def timestamp(index: int, fps: float) -> str:
    """Frame `index`'s time as the prompt writes it: mm:ss, both floored (transformers' own float operations)."""
    seconds = index / fps
    return f"{int(seconds // 60):02d}:{int(seconds % 60):02d}"


def frame_pixels(paths: Sequence[Path], processing: ImageProcessing, max_soft_tokens: int) -> list[Pixels]:
    """Each frame decoded and processed as an image at `max_soft_tokens`; every frame must have the first's size."""
    pixels, size = [], None
    for path in paths:
        image = open_image(path)
        if size is not None and image.size != size:
            raise VideoError(f"{path} is {image.width}x{image.height} px and {paths[0].name} {size[0]}x{size[1]}: a "
                             f"video's frames have one size; {EXTRACT}")
        size = image.size
        pixels.append(process(image, processing, max_soft_tokens))
    return pixels


def read_video(vision: "Vision", directory: str | Path, fps: float, config: VideoConfig,
               num_frames: int | None = None, max_soft_tokens: int | None = None) -> Frames:
    """The frames in `directory`, extracted at `fps` frames per second -> the kept frames' timestamps and vectors;
    `num_frames` and `max_soft_tokens` override the config's."""
    if not (math.isfinite(fps) and fps > 0):
        raise VideoError(f"fps={fps}: give the positive rate the frames were extracted at (ffmpeg's -vf fps=N)")
    if num_frames is not None and num_frames < 1:
        raise VideoError(f"num_frames={num_frames}: keep at least 1 frame")
    files = frame_files(directory)
    kept = sample(len(files), config.num_frames if num_frames is None else num_frames)
    budget = config.max_soft_tokens if max_soft_tokens is None else max_soft_tokens
    pixels = frame_pixels([files[i] for i in kept], vision.processing, budget)
    return Frames([timestamp(i, fps) for i in kept], [vision.encode(p) for p in pixels])


def expand_video(ids: Sequence[int], videos: Sequence[Frames], tokens: ImageTokens,
                 tokenizer: "Gemma4Tokenizer") -> list[int]:
    """Ids where each video id marks a video's place (one per video, in order) -> every frame of it written as
    `mm:ss`, boi, its n video ids, eoi, the frames joined by a space."""
    places = [j for j, i in enumerate(ids) if i == tokens.soft]
    if len(places) != len(videos):
        raise VideoError(f"the prompt marks {len(places)} video place(s) (video id {tokens.soft}) for {len(videos)} "
                         f"video(s): give one video id per video")
    out, last = [], 0
    for j, video in zip(places, videos):
        out += list(ids[last:j])
        for f, (stamp, vectors) in enumerate(zip(video.timestamps, video.vectors)):
            text = (" " if f else "") + stamp + " "  # "00:00 " opens the first frame, " 00:02 " every later one
            out += tokenizer.encode_text(text) + [tokens.boi] + [tokens.soft] * len(vectors) + [tokens.eoi]
        last = j + 1
    return out + list(ids[last:])


def place_media(ids: Sequence[int], images: Sequence[torch.Tensor], videos: Sequence[Frames], image_tokens: ImageTokens,
                frame_tokens: ImageTokens, tokenizer: "Gemma4Tokenizer") -> tuple[list[int], Media]:
    """One prompt with one boi id per image and one video id per video -> the full prompt, and the `Media` of its
    images and frames (spans in prompt order)."""
    full = expand_video(expand(ids, [len(v) for v in images], image_tokens), videos, frame_tokens, tokenizer)
    pictures = PromptImages([full], [list(images)], image_tokens)  # on the runs of image ids
    frames = PromptImages([full], [[v for video in videos for v in video.vectors]], frame_tokens)  # of video ids
    return full, pictures + frames
