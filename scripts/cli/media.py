"""Media in a prompt from the command line: generate.py's `--image`, `--video-frames`/`--fps` and `--audio`, chat.py's
`/image` and `/audio`, and `--image-tokens`.

- A medium's side is read from the target's own files, and only when one is given: the image side (its tower, or
  the 12B's embedder) for images and video frames, the audio side (E2B/E4B's conformer, the 12B's frame embedder)
  for clips. A text-only run loads and holds none of it (gemma4/vision/loading.py, gemma4/audio/loading.py).
- Where each goes: a chat model's user turn holds its images, then its video, then its clips, before the text (the
  release's chat template writes a turn's media items in the order it is given them, and this is the order we
  give: gemma4/tokenizer.py `render`); a model without a chat template
  gets them right after `<bos>`. With `--prompt-ids` the user marks each place: one boi id per image, one video id
  for the video, one boa id per clip (config.json's boi_token_id, video_token_id, boa_token_id).
- Clips are expanded first and placed last: every kind is expanded before any is placed, so each span sits on the
  final ids (`place`).
- A clip longer than 30 s is cut to its first 30 s on E2B/E4B, as the release's feature extractor cuts it, with a
  note line; the 12B takes it whole, as transformers does.
- Everything a user can get wrong is one line and exit status 2 (ImageError, AudioError, PromptError): a target
  without the side asked for (the demo pair; audio on 26B-A4B and 31B), an unreadable file, a WAV that is not PCM,
  Pillow missing, a marker count that is not the media count, more media tokens than the context holds.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gemma4.audio.loading import Audio, load_audio
from gemma4.audio.prompt import PromptAudio
from gemma4.audio.prompt import expand as expand_audio
from gemma4.audio.wav import SAMPLE_RATE, read_wav
from gemma4.engine.media import Media, joined
from gemma4.engine.rows import PromptError
from gemma4.tokenizer import Gemma4Tokenizer, Message
from gemma4.vision.loading import Vision, load_vision
from gemma4.vision.processor import SOFT_TOKEN_CHOICES
from gemma4.vision.video import Frames, VideoConfig, place_media, read_video, video_config


def read_clip(audio: Audio, path: str, note: Callable[[str], None]) -> torch.Tensor:
    """One WAV file -> its (n, E) vectors; a note line when the tower reads only its first 30 s."""
    samples = read_wav(path)
    if audio.cut(samples):
        note(f"note: {Path(path).name} lasts {len(samples) / SAMPLE_RATE:.1f} s and is cut to its first "
             f"{audio.settings.max_samples / SAMPLE_RATE:.0f} s, as the release's feature extractor cuts it")
    return audio.read(samples, Path(path).name)


@dataclass
class Given:
    """A prompt's media, read: each kind's vectors, and the side that read them (None when not asked for)."""
    images: list[torch.Tensor] = field(default_factory=list)  # (n, E) each
    clips: list[torch.Tensor] = field(default_factory=list)  # (n, E) each
    video: Frames | None = None
    vision: Vision | None = None
    frames: VideoConfig | None = None  # the video's settings and ids, read beside the images'
    audio: Audio | None = None

    def message(self, text: str) -> Message:
        """The user turn that holds these media before `text`."""
        return Message("user", text, len(self.images), len(self.clips), int(self.video is not None))

    def marks(self) -> dict[str, int]:
        """The ids that mark each kind's place, as `render` takes them (the target's, where the side is read)."""
        out = {} if self.vision is None else {"boi": self.vision.tokens.boi}
        out |= {} if self.frames is None else {"video": self.frames.tokens.soft}
        return out | ({} if self.audio is None else {"boa": self.audio.tokens.boa})

    def after_bos(self) -> list[int]:
        """The marks of a prompt without a chat template, right after `<bos>`: images, the video, clips."""
        m = self.marks()  # every kind given has its side read, so its mark; a kind not given has none
        return ([m["boi"]] * len(self.images) if self.images else []) + (
            [m["video"]] if self.video is not None else []) + ([m["boa"]] * len(self.clips) if self.clips else [])


def read_media(target_dir: Path, images: Sequence[str], clips: Sequence[str], video_dir: str | None, fps: float,
               max_soft_tokens: int | None, device: torch.device, dtype: torch.dtype,
               say: Callable[[str], None], note: Callable[[str], None]) -> Given:
    """Every given medium read, with one header line per kind (`say`) and a note line per cut clip (`note`)."""
    given = Given()
    if images or video_dir:
        given.vision = load_vision(target_dir, dtype, device)
        given.images = [given.vision.read(path, max_soft_tokens) for path in images]
        if images:
            say(f"images     {', '.join(f'{Path(p).name} ({len(v)} tokens)' for p, v in zip(images, given.images))}")
    if video_dir:
        given.frames = video_config(target_dir, given.vision)
        given.video = read_video(given.vision, video_dir, fps, given.frames)
        n = sum(len(v) for v in given.video.vectors)
        say(f"video      {Path(video_dir).name}: {len(given.video.vectors)} frames at {fps:g} fps "
            f"({given.video.timestamps[0]} to {given.video.timestamps[-1]}), {n} tokens")
    if clips:
        given.audio = load_audio(target_dir, dtype, device)
        given.clips = [read_clip(given.audio, path, note) for path in clips]
        say(f"audio      {', '.join(f'{Path(p).name} ({len(v)} tokens)' for p, v in zip(clips, given.clips))}")
    return given


def place(given: Given, ids: list[int], tokenizer: Gemma4Tokenizer | None, context: int) -> tuple[list[int], Media]:
    """Ids holding each medium's mark -> the full prompt and its media. A prompt the context cannot hold with one new
    token is refused here, naming the media's part."""
    if given.clips:
        ids = expand_audio(ids, [len(v) for v in given.clips], given.audio.tokens)
    pictures = None
    if given.video:  # images, then the video's frames (which bring boi ids of their own)
        ids, pictures = place_media(ids, given.images, [given.video], given.vision.tokens, given.frames.tokens,
                                    tokenizer)
    elif given.images:
        ids, pictures = given.vision.prompt(ids, given.images)
    sounds = PromptAudio([ids], [given.clips], given.audio.tokens) if given.clips else None  # on the final ids
    media = joined(pictures, sounds)
    soft = sum(len(s.vectors) for s in media.rows[0])
    if len(ids) >= context:
        raise PromptError(f"the prompt takes {len(ids)} positions, {soft} of them media tokens, and the context "
                          f"holds {context}: give fewer or shorter media, --image-tokens {SOFT_TOKEN_CHOICES[0]}, "
                          f"or less text")
    return ids, media
