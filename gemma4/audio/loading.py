"""Loading a target's audio side from the same checkpoint files, only when a clip is given.

Facts a reader must know:
- `load_target` never reads the audio tensors: a text-only run's memory is what it was. `load_audio` reads
  `model.audio_tower.*` (E2B, E4B) and `model.embed_audio.*` (E2B, E4B, 12B) from the same files, by the same
  streaming reader, checked against the same kind of name table. 26B-A4B and 31B take no audio.
- The feature settings come from `processor_config.json` / `preprocessor_config.json` beside them
  (gemma4/audio/features.py `feature_settings`; every release stores the defaults).
- `Audio.encode` turns one clip of 16 kHz samples into its n vectors of the text width: what its n soft tokens
  become. E2B/E4B: log-mel frames -> tower -> embed_audio, n about 25 a second (30 s at most); 12B: 640-sample
  frames -> embed_audio, n = ceil(samples / 640).

Shape legend: N samples, F log-mel frames, n vectors (soft tokens), E text hidden.
"""

from pathlib import Path

import torch
from torch import nn

from gemma4.audio import tower
from gemma4.audio.config import MEL_BINS, AudioConfig, AudioTokens, audio_config, audio_tokens
from gemma4.audio.embedder import EMBED_PREFIX, AudioEmbedder, embed_weight_table
from gemma4.audio.features import AudioFeatureSettings, cut_and_pad, feature_settings, frames, log_mel
from gemma4.audio.prompt import PromptAudio, place
from gemma4.audio.wav import SAMPLE_RATE, AudioError, read_wav
from gemma4.config import ConfigError
from gemma4.config_file import read_json
from gemma4.weights import load_modules, resolve_model_dir


class Audio:
    """A target's audio side: its feature settings, its tower (None on the 12B) and `embed_audio`."""

    def __init__(self, config: AudioConfig, tokens: AudioTokens, settings: AudioFeatureSettings,
                 encoder: nn.Module | None, embedder: nn.Module) -> None:
        self.config, self.tokens, self.settings = config, tokens, settings
        self.encoder, self.embedder = encoder, embedder  # (F, 128) -> (n, O) and (n, O) -> (n, E)

    @torch.inference_mode()
    def encode(self, samples: torch.Tensor) -> torch.Tensor:
        """One clip, (N,) float samples at 16 kHz in [-1, 1) -> its (n, E) vectors, in the weights' dtype, on their
        device. A clip too short for a soft token gives (0, E)."""
        weight = self.embedder.embedding_projection.weight
        if self.encoder is None:  # the 12B: raw frames straight into embed_audio
            return self.embedder(frames(samples, self.settings).to(weight.device))
        mel = log_mel(samples, self.settings)
        if mel.soft_tokens == 0:
            return weight.new_zeros(0, weight.shape[0])
        # The valid frames only: the masked ones trail the clip and change no valid position (tower.py).
        vectors = self.embedder(self.encoder(mel.features[mel.mask].to(weight.device)))  # (n, E)
        if len(vectors) != mel.soft_tokens:
            raise AssertionError(f"the tower made {len(vectors)} vectors for {mel.soft_tokens} soft tokens")
        return vectors

    def read(self, clip: str | Path | torch.Tensor, name: str = "the clip") -> torch.Tensor:
        """A WAV file (or its (N,) samples at 16 kHz) -> the clip's (n, E) vectors. E2B/E4B cut a clip at 30 s, as
        the release's feature extractor does (`cut`); the 12B takes it whole. A clip too short for one soft token
        (E2B/E4B: 10 ms, 160 samples, or less) is refused, naming the file (or `name`, for samples)."""
        samples = read_wav(clip) if isinstance(clip, (str, Path)) else clip
        vectors = self.encode(samples)
        if not len(vectors):  # a prompt cannot hold a clip of no soft token
            name = Path(clip).name if isinstance(clip, (str, Path)) else name
            raise AudioError(f"{name} lasts {len(samples) / SAMPLE_RATE * 1000:.0f} ms: too short for one audio token "
                             f"(40 ms each); give a longer clip")
        return vectors

    def cut(self, samples: torch.Tensor) -> bool:
        """Whether these samples are longer than the tower reads (E2B/E4B: 30 s): the rest is dropped."""
        return self.encoder is not None and cut_and_pad(len(samples), self.settings)[0] < len(samples)

    def prompt(self, ids: list[int], clips: list[torch.Tensor]) -> tuple[list[int], PromptAudio]:
        """Ids where one boa id marks each clip's place -> the ids with boa, soft tokens, eoa, and the clips."""
        return place(ids, clips, self.tokens)


def load_audio(path: str | Path, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> Audio:
    """The audio side of the target at `path` (a directory or a Hub id), in eval mode, without gradients."""
    model_dir = Path(resolve_model_dir(path, audio=True))
    raw = read_json(model_dir / "config.json")
    config = audio_config(raw)
    if config is None:
        raise AudioError(f"{model_dir} takes no audio (its config.json has no audio_config): audio needs E2B, E4B or "
                         f"the 12B, e.g. google/gemma-4-E2B-it")
    settings = feature_settings(model_dir, config.unified)
    if config.unified and settings.samples_per_token != config.output_proj_dims:
        raise ConfigError(f"{model_dir}: the feature extractor's audio_samples_per_token is "
                          f"{settings.samples_per_token}, audio_config's audio_embed_dim {config.output_proj_dims}: "
                          f"restore the release's processor config")
    if not config.unified and settings.mel_bins != MEL_BINS:
        raise ConfigError(f"{model_dir}: the feature extractor makes {settings.mel_bins} mel bins, the tower reads "
                          f"{MEL_BINS}: restore the release's processor config")
    parts = [] if config.unified else [(tower.AudioTower, tower.weight_table(config), tower.AUDIO_PREFIX)]
    parts.append((AudioEmbedder, embed_weight_table(config), EMBED_PREFIX))
    modules = load_modules(model_dir, parts, config, dtype, device)
    encoder = None if config.unified else modules[0]
    return Audio(config, audio_tokens(raw), settings, encoder, modules[-1])
