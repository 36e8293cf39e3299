"""From 16 kHz samples to what the audio models read, as transformers 5.22.2's Gemma 4 feature extractors.

Facts a reader must know:
- E2B/E4B (`Gemma4AudioFeatureExtractor`): a log-mel spectrogram, one 128-bin frame per 10 ms.
  1. Clips longer than 30 s (480,000 samples) are cut to 30 s (transformers truncates silently; `LogMel.cut`
     says so here), then zero-padded at the end to a multiple of 128 samples.
  2. 160 zeros are prepended (frame_length // 2: the first frame is centred on t = 0).
  3. Frames of 320 samples every 160. A frame needs 321 samples to exist: transformers cuts 321-sample frames,
     the room pre-emphasis would need, and with pre-emphasis 0 uses the first 320. So F = (L + 160 - 321) // 160
     + 1 for the padded length L, and a clip of 128 samples or fewer gives no frame.
  4. A periodic Hann window of 320 (0.5 - 0.5 cos(2 pi n / 320)), a 512-point real FFT of the zero-padded frame,
     its magnitude (not power).
  5. 128 triangular mel filters, HTK scale (mel = 2595 log10(1 + f / 700)), over 0-8000 Hz, unnormalised (no
     Slaney area norm), with the 257 FFT bins at linspace(0, 8000, 257) Hz. The lowest filter (0-28 Hz) falls
     between the bins at 0 and 31.25 Hz and is all zero: feature 0 is always ln(1e-3) (transformers' comment
     says the uppermost; it is the lowest).
  6. ln(mel + 1e-3): an added offset, not a floor by max. transformers windows in float32, takes a float32 FFT
     and computes the mel products and the log in float64 (numpy promotes to the float64 filterbank), rounding to
     float32 at the end. Here the windowing is float32 too but the FFT is float64: torch's float32 FFT rounds
     several times more than numpy's (on a tone, 2.6e-3 against 3.0e-4 in the log of near-silent bins).
  7. A frame counts only if the last sample it reads lies inside the clip (before the padding); the others
     become all-zero features. Soft tokens are the valid frames left after two stride-2 convolutions:
     sum(mask[::2][::2]), which is ceil(valid / 4) since the valid frames come first: 25 per second, 750 at
     30 s; none for 160 samples (10 ms) or fewer. Padding can add an invalid frame, hence counting valid frames,
     not frames.
- The 12B (`Gemma4UnifiedAudioFeatureExtractor`): the raw samples in frames of 640 (40 ms), the last one
  zero-padded; one soft token per frame, ceil(N / 640). No normalisation (the model's RMSNorm removes
  amplitude) and no 30 s cap: transformers' unified extractor and processor truncate nothing by default.
- Settings come from the processor config beside a checkpoint (`feature_settings`); every release stores the
  defaults below. transformers rebuilds frame and hop lengths from `frame_length_ms` / `hop_length_ms` (20, 10)
  and ignores the sample counts it saves (`frame_length`, `hop_length`, `fft_length`); so does this file.

Shape legend: N samples, L padded samples, F mel frames, B FFT bins (fft_length // 2 + 1), M mel bins.
"""

import math
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

from gemma4.audio.wav import SAMPLE_RATE, AudioError
from gemma4.config import ConfigError
from gemma4.config_file import processor_section


@dataclass(frozen=True)
class AudioFeatureSettings:
    """What processor_config.json / preprocessor_config.json say about audio, with every release's values."""
    unified: bool = False  # the 12B: raw-sample frames instead of log-mel features
    mel_bins: int = 128  # M: "feature_size"; the subsampler's flattening expects 128
    frame_length: int = 320  # samples per window: round(16000 * frame_length_ms / 1000)
    hop_length: int = 160  # samples between windows: round(16000 * hop_length_ms / 1000)
    fft_length: int = 512  # the power of two >= frame_length (twice that with fft_overdrive)
    min_frequency: float = 0.0  # Hz, the mel filters' span
    max_frequency: float = 8000.0
    mel_floor: float = 1e-3  # added before the log
    max_samples: int = 30 * SAMPLE_RATE  # the 30 s cap: the extractor's max_length, an argument, not stored
    pad_to_multiple_of: int = 128  # samples: the extractor's argument default, not stored
    samples_per_token: int = 640  # the 12B's frame: "audio_samples_per_token"


class LogMel(NamedTuple):
    features: torch.Tensor  # (F, M) float32 (float64 for float64 samples); invalid frames are zeros
    mask: torch.Tensor  # (F,) bool: the frame lies wholly inside the clip
    soft_tokens: int  # audio soft tokens in the prompt: sum(mask[::2][::2])
    cut: bool  # the clip was longer than max_samples and was cut: the caller may say so


def feature_settings(model_dir: Path, unified: bool = False) -> AudioFeatureSettings:
    """The audio settings of a model directory. As transformers does, processor_config.json's "feature_extractor"
    (or "audio_processor") object comes first, then preprocessor_config.json; with neither, the defaults."""
    raw = processor_section(model_dir, (("processor_config.json", "feature_extractor"),  # as transformers 5 saves it
                                        ("processor_config.json", "audio_processor"), ("preprocessor_config.json", None)))
    # Refuse the switches that would change the features in ways not written here.
    for key, want in (("sampling_rate", SAMPLE_RATE), ("padding_value", 0.0), ("padding_side", "right"),
                      ("preemphasis", 0.0), ("dither", 0.0), ("input_scale_factor", 1.0), ("per_bin_mean", None),
                      ("per_bin_stddev", None)):
        if raw.get(key, want) != want:
            raise ConfigError(f"audio feature extractor {key}={raw[key]!r}: only {key}={want!r} is implemented")
    if unified:
        settings = AudioFeatureSettings(unified=True, samples_per_token=int(raw.get("audio_samples_per_token", 640)))
        if settings.samples_per_token < 1:
            raise ConfigError(f"audio_samples_per_token={settings.samples_per_token}: it must be positive")
        return settings
    # transformers' __init__ arithmetic: lengths from milliseconds, the FFT the next power of two.
    frame_length = int(round(SAMPLE_RATE * float(raw.get("frame_length_ms", 20.0)) / 1000.0))
    hop_length = int(round(SAMPLE_RATE * float(raw.get("hop_length_ms", 10.0)) / 1000.0))
    if frame_length < 2 or hop_length < 1:
        raise ConfigError(f"audio frame of {frame_length} samples every {hop_length}: both must be positive")
    fft_length = 2 ** math.ceil(math.log2(frame_length)) * (2 if raw.get("fft_overdrive", False) else 1)
    settings = AudioFeatureSettings(mel_bins=int(raw.get("feature_size", 128)), frame_length=frame_length,
                                    hop_length=hop_length, fft_length=fft_length,
                                    min_frequency=float(raw.get("min_frequency", 0.0)),
                                    max_frequency=float(raw.get("max_frequency", 8000.0)),
                                    mel_floor=float(raw.get("mel_floor", 1e-3)))
    if not 0 <= settings.min_frequency <= settings.max_frequency:
        raise ConfigError(f"audio mel filters over {settings.min_frequency}-{settings.max_frequency} Hz: give "
                          f"0 <= min_frequency <= max_frequency")
    return settings


def mel_filterbank(settings: AudioFeatureSettings) -> torch.Tensor:
    """(B, M) float64 triangular filters, transformers' `mel_filter_bank(norm=None, mel_scale="htk")`."""
    def to_mel(hz: torch.Tensor) -> torch.Tensor:
        return 2595.0 * torch.log10(1.0 + hz / 700.0)  # HTK

    span = to_mel(torch.tensor([settings.min_frequency, settings.max_frequency], dtype=torch.float64))
    # M + 2 edges evenly spaced in mel: filter m rises from edge m, peaks at edge m+1, falls to edge m+2.
    edges = 700.0 * (10.0 ** (torch.linspace(float(span[0]), float(span[1]), settings.mel_bins + 2,
                                             dtype=torch.float64) / 2595.0) - 1.0)  # (M+2,) Hz
    bins = torch.linspace(0, SAMPLE_RATE // 2, settings.fft_length // 2 + 1, dtype=torch.float64)  # (B,) Hz
    widths = edges.diff()  # (M+1,)
    offsets = edges[None, :] - bins[:, None]  # (B, M+2) edge minus bin frequency
    rising = -offsets[:, :-2] / widths[:-1]  # (B, M) 0 at the lower edge, 1 at the peak
    falling = offsets[:, 2:] / widths[1:]  # (B, M) 1 at the peak, 0 at the upper edge
    return torch.minimum(rising, falling).clamp(min=0)  # (B, M)


def cut_and_pad(num_samples: int, settings: AudioFeatureSettings) -> tuple[int, int]:
    """(samples kept after the 30 s cut, padded length L: the next multiple of pad_to_multiple_of)."""
    kept = min(num_samples, settings.max_samples)
    return kept, -(-kept // settings.pad_to_multiple_of) * settings.pad_to_multiple_of


def frame_mask(num_samples: int, settings: AudioFeatureSettings) -> torch.Tensor:
    """(F,) bool: which log-mel frames of a clip of num_samples lie wholly inside it (after the 30 s cut)."""
    kept, padded = cut_and_pad(num_samples, settings)
    # +1: transformers cuts frame_length + 1 samples per frame (see the module docstring, step 3).
    frames = max(0, (padded + settings.frame_length // 2 - (settings.frame_length + 1)) // settings.hop_length + 1)
    # Frame i reads samples i*hop .. i*hop + frame_length of the clip with frame_length // 2 zeros before it, so
    # its last sample is the clip's sample i*hop + frame_length - frame_length // 2: valid when that is a real one.
    last = torch.arange(frames) * settings.hop_length + settings.frame_length - settings.frame_length // 2  # (F,)
    return last < kept


def mask_tokens(mask: torch.Tensor) -> int:
    """Soft tokens of a clip whose frames are valid where `mask` (F,) is: the tower's two 3x3 stride-2 convolutions
    (padding 1) keep every other position of the mask, twice."""
    return int(mask[::2][::2].sum())


def soft_tokens(num_samples: int, settings: AudioFeatureSettings) -> int:
    """Audio soft tokens a clip of num_samples becomes in the prompt (boa + this many audio ids + eoa)."""
    if settings.unified:
        return -(-num_samples // settings.samples_per_token)  # ceil: one per 640-sample frame, no cap
    return mask_tokens(frame_mask(num_samples, settings))


def check_samples(samples: torch.Tensor) -> None:
    """Refuse what is not a non-empty 1-D float tensor of samples."""
    if samples.dim() != 1 or samples.dtype not in (torch.float32, torch.float64):
        raise AudioError(f"audio samples of shape {tuple(samples.shape)} and type {samples.dtype}: give one mono "
                         f"clip as a 1-D float tensor in [-1, 1) (read_wav returns one)")
    if len(samples) == 0:
        raise AudioError("the audio clip has no samples: give a recording")


def log_mel(samples: torch.Tensor, settings: AudioFeatureSettings = AudioFeatureSettings()) -> LogMel:
    """The E2B/E4B features of one clip of (N,) samples at 16 kHz (steps 1-7 of the module docstring)."""
    check_samples(samples)
    kept, padded = cut_and_pad(len(samples), settings)
    mask = frame_mask(len(samples), settings)  # (F,)
    cut = kept < len(samples)
    if len(mask) == 0:  # 128 samples or fewer: no frame, no soft token (transformers returns (0, M) too)
        return LogMel(samples.new_zeros(0, settings.mel_bins), mask, 0, cut)
    half = settings.frame_length // 2
    clip = F.pad(samples[:kept], (half, padded - kept))  # (half + L,) zeros before and after
    windows = clip.unfold(0, settings.frame_length, settings.hop_length)[:len(mask)]  # (F, frame_length) views
    # Periodic Hann, built in float64 and rounded once to the samples' type, as transformers' float32 window.
    window = torch.hann_window(settings.frame_length, periodic=True, dtype=torch.float64).to(samples.dtype)
    # float64 from the FFT on (step 6); the frame is zero-padded to fft_length.
    spectrum = torch.fft.rfft((windows * window).double(), n=settings.fft_length)  # (F, B) complex128
    mel = spectrum.abs() @ mel_filterbank(settings)  # (F, B) @ (B, M) -> (F, M)
    features = torch.log(mel + settings.mel_floor).to(samples.dtype) * mask[:, None]  # (F, M) invalid frames 0
    return LogMel(features, mask, mask_tokens(mask), cut)


def frames(samples: torch.Tensor, settings: AudioFeatureSettings = AudioFeatureSettings(unified=True)) -> torch.Tensor:
    """The 12B's input: (ceil(N / 640), 640) float32 frames of the raw samples, the last zero-padded; each frame is
    one soft token. Nothing is cut or normalised."""
    check_samples(samples)
    size = settings.samples_per_token
    padded = F.pad(samples.float(), (0, -len(samples) % size))  # (n * size,)
    return padded.reshape(-1, size)  # (n, size)
