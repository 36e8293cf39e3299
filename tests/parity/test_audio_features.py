"""gemma4/audio/features.py and wav.py against transformers 5.22.2's Gemma 4 audio feature extractors, on clips made
here with seeded generators: the log-mel features of the E2B/E4B (`Gemma4AudioFeatureExtractor`) within float32
rounding (tests/tolerance.py: float64 runs of both agree to 1e-9, and our float32 error is bounded by
transformers' own), their masks and soft-token counts equal, the 12B's raw-sample frames
(`Gemma4UnifiedAudioFeatureExtractor`) equal bit for bit, the counts also against the processors' own counting
code; the settings read from configs transformers saved; WAV files written with `wave` read back exactly, refused
in one line, or resampled to within the filter's stated error of the analytic 16 kHz signal."""

import copy
import inspect
import json
import math
import wave
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers.audio_utils import window_function
from transformers.feature_extraction_utils import BatchFeature
from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
from transformers.models.gemma4.processing_gemma4 import Gemma4Processor
from transformers.models.gemma4_unified.feature_extraction_gemma4_unified import Gemma4UnifiedAudioFeatureExtractor
from transformers.models.gemma4_unified.processing_gemma4_unified import Gemma4UnifiedProcessor

from gemma4.audio.features import (AudioFeatureSettings, feature_settings, frames, log_mel, mel_filterbank,
                                   soft_tokens)
from gemma4.audio.wav import PASSBAND, SAMPLE_RATE, AudioError, read_wav
from gemma4.config import ConfigError
from tests.tolerance import assert_fp32_parity

CAP = 30 * SAMPLE_RATE


def noise(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed)) * 0.1


def tone(n: int, hz: float, amplitude: float = 0.5, rate: int = SAMPLE_RATE) -> torch.Tensor:
    return (amplitude * torch.sin(2 * math.pi * hz * torch.arange(n, dtype=torch.float64) / rate)).float()


# Lengths: not a multiple of the hop or of 128; under one window (320) but with a frame (200, 300), with no frame
# at all (100: 128 samples or fewer); 320 (padding to 384 adds a masked frame) and 770 (padding to 896 adds a
# fifth frame to 4 valid ones: counting frames instead of valid ones gives 2 tokens, not 1); exactly the 30 s cap
# and over it.
CLIPS: dict[str, Callable[[], torch.Tensor]] = {
    "noise-1.37s+3": lambda: noise(int(SAMPLE_RATE * 1.37) + 3, 1),
    "short-100": lambda: noise(100, 2),
    "short-200": lambda: noise(200, 3),
    "short-300": lambda: noise(300, 4),
    "masked-frame-320": lambda: noise(320, 5),
    "masked-frame-770": lambda: noise(770, 9),
    "silence-1s": lambda: torch.zeros(SAMPLE_RATE),
    "tone-440Hz-2s+77": lambda: tone(2 * SAMPLE_RATE + 77, 440.0),
    "tone-and-noise-3s": lambda: tone(3 * SAMPLE_RATE + 5, 3150.0, 0.8) + noise(3 * SAMPLE_RATE + 5, 6),
    "cap-30s": lambda: noise(CAP, 7),
    "over-30s": lambda: noise(CAP + 12_345, 8),
}


@pytest.fixture(scope="module")
def extractor() -> Gemma4AudioFeatureExtractor:
    return Gemma4AudioFeatureExtractor()


def tf_float64(extractor: Gemma4AudioFeatureExtractor, samples: np.ndarray) -> np.ndarray:
    """transformers' extractor run in float64: its own padding (`pad`, of which only the mask is taken: it rounds
    float64 samples to float32) and `_extract_spectrogram` on the float64 samples, with the window it rounds to
    float32 left in float64."""
    defaults = inspect.signature(extractor.__call__).parameters  # the 30 s cap and the 128-sample padding
    padded = extractor.pad(BatchFeature({"input_features": [samples[:, None]]}), padding="longest",
                           max_length=defaults["max_length"].default, truncation=True,
                           pad_to_multiple_of=defaults["pad_to_multiple_of"].default, return_attention_mask=True)
    attention = padded["attention_mask"][0]
    wave64 = np.zeros(len(attention))
    kept = min(len(samples), len(attention))
    wave64[:kept] = samples[:kept]
    float64_run = copy.deepcopy(extractor)
    float64_run.window = window_function(extractor.frame_length)  # float64, before transformers' astype
    spectrum, mask = float64_run._extract_spectrogram(wave64[None], attention)
    return spectrum * mask[:, None]


def tf_prompt_count(processor: type, mask: np.ndarray) -> int:
    """Audio ids in the prompt as the processor's own `replace_audio_token` writes them for this mask."""
    stub = SimpleNamespace(boa_token="<boa>", audio_token="<a>", eoa_token="<eoa>")
    return processor.replace_audio_token(stub, {"input_features_mask": [mask]}, 0).count("<a>")


@pytest.mark.parametrize("name", CLIPS)
def test_log_mel_matches_transformers(name: str, extractor: Gemma4AudioFeatureExtractor) -> None:
    samples = CLIPS[name]()
    theirs = extractor([samples.numpy()])  # a bare 1-D array is refused: one clip goes in a list
    tf_features, tf_mask = torch.from_numpy(theirs["input_features"][0]), theirs["input_features_mask"][0]
    ours = log_mel(samples)
    assert ours.features.dtype == torch.float32 and ours.features.shape == tf_features.shape
    assert ours.mask.tolist() == tf_mask.tolist()
    # The count three ways in transformers: the processor's prompt from the mask, its closed form from the
    # length (capped at audio_seq_length = 750), and ours from the length alone.
    stub = SimpleNamespace(feature_extractor=extractor, audio_seq_length=750)
    closed_form = Gemma4Processor._compute_audio_num_tokens(stub, np.zeros(len(samples)), SAMPLE_RATE)
    assert ours.soft_tokens == tf_prompt_count(Gemma4Processor, tf_mask) == closed_form
    assert soft_tokens(len(samples), AudioFeatureSettings()) == ours.soft_tokens
    assert ours.cut == (len(samples) > CAP)
    if len(tf_features) == 0:  # 128 samples or fewer: no frame on either side
        assert ours.soft_tokens == 0
        return
    tf64 = torch.from_numpy(tf_float64(extractor, samples.double().numpy()))
    ours64 = log_mel(samples.double()).features
    assert_fp32_parity("audio log-mel", name, ours.features, tf_features, ours64, tf64, depth=1)


def test_cut_keeps_the_first_30_seconds() -> None:
    samples = CLIPS["over-30s"]()
    cut, whole = log_mel(samples), log_mel(samples[:CAP])
    assert cut.cut and not whole.cut and cut.soft_tokens == whole.soft_tokens == 750
    assert torch.equal(cut.features, whole.features) and torch.equal(cut.mask, whole.mask)


def test_filterbank_and_window_facts(extractor: Gemma4AudioFeatureExtractor) -> None:
    settings = AudioFeatureSettings()
    assert (settings.frame_length, settings.hop_length, settings.fft_length, settings.mel_bins) == \
           (extractor.frame_length, extractor.hop_length, extractor.fft_length, extractor.feature_size)
    bank = mel_filterbank(settings)
    # Both are float64 evaluations of the same formulas: they differ by libm rounding (3.5e-14 measured).
    torch.testing.assert_close(bank, torch.from_numpy(extractor.mel_filters), atol=1e-12, rtol=0)
    assert (bank.max(dim=0).values == 0).nonzero().flatten().tolist() == [0]  # the lowest filter is empty
    # transformers' window is periodic Hann (np.hanning(321)[:-1]), which torch's periodic window is.
    torch.testing.assert_close(torch.hann_window(320, periodic=True, dtype=torch.float64),
                               torch.from_numpy(window_function(320)), atol=1e-15, rtol=0)
    silence = log_mel(torch.zeros(SAMPLE_RATE)).features
    assert torch.equal(silence, torch.full_like(silence, math.log(1e-3)))  # ln(0 + 1e-3), an offset not a max


@pytest.mark.parametrize("length", [1, 639, 640, 641, int(SAMPLE_RATE * 1.37) + 3, CAP + 12_345])
def test_frames_match_transformers(length: int) -> None:
    extractor = Gemma4UnifiedAudioFeatureExtractor()
    samples = noise(length, length)
    for given in (samples, samples.double()):  # both cast to float32 at the end
        theirs = extractor([given.numpy()])
        ours = frames(given)
        assert ours.dtype == torch.float32 and torch.equal(ours, torch.from_numpy(theirs["input_features"][0]))
    count = Gemma4UnifiedProcessor._compute_audio_num_tokens(SimpleNamespace(feature_extractor=extractor),
                                                             np.zeros(length), SAMPLE_RATE)
    mask = np.asarray(theirs["input_features_mask"][0])
    assert len(ours) == soft_tokens(length, AudioFeatureSettings(unified=True)) == math.ceil(length / 640)
    assert len(ours) == tf_prompt_count(Gemma4UnifiedProcessor, mask) == count  # no 30 s cap on the 12B


def test_settings_from_saved_configs(tmp_path: Path) -> None:
    assert feature_settings(tmp_path) == AudioFeatureSettings()  # no file: the defaults
    Gemma4AudioFeatureExtractor().save_pretrained(tmp_path / "saved")  # preprocessor_config.json
    assert feature_settings(tmp_path / "saved") == AudioFeatureSettings()
    # Non-default values, nested in processor_config.json as transformers 5 saves processors. The millisecond
    # lengths are not among what it saves, so they are written in by hand; its stale sample counts are ignored.
    custom = json.loads(Gemma4AudioFeatureExtractor(feature_size=80, max_frequency=7600.0, min_frequency=60.0,
                                                    mel_floor=1e-5, fft_overdrive=True).to_json_string())
    custom.update(frame_length_ms=25.0, hop_length_ms=12.5)
    (tmp_path / "custom").mkdir()
    (tmp_path / "custom" / "processor_config.json").write_text(json.dumps({"feature_extractor": custom}))
    (tmp_path / "custom" / "preprocessor_config.json").write_text(json.dumps({"image_processor_type": "x"}))
    theirs = Gemma4AudioFeatureExtractor.from_pretrained(tmp_path / "custom")
    settings = feature_settings(tmp_path / "custom")
    assert (settings.mel_bins, settings.frame_length, settings.hop_length, settings.fft_length,
            settings.min_frequency, settings.max_frequency, settings.mel_floor) == \
           (theirs.feature_size, theirs.frame_length, theirs.hop_length, theirs.fft_length, theirs.min_frequency,
            theirs.max_frequency, float(theirs.mel_floor)) == (80, 400, 200, 1024, 60.0, 7600.0, 1e-5)
    samples = CLIPS["tone-and-noise-3s"]()
    expected = theirs([samples.numpy()])
    ours = log_mel(samples, settings)
    assert ours.mask.tolist() == expected["input_features_mask"][0].tolist()
    assert_fp32_parity("audio log-mel", "custom-config", ours.features, torch.from_numpy(expected["input_features"][0]),
                       log_mel(samples.double(), settings).features,
                       torch.from_numpy(tf_float64(theirs, samples.double().numpy())), depth=1)
    # The 12B's own setting.
    Gemma4UnifiedAudioFeatureExtractor(audio_samples_per_token=320).save_pretrained(tmp_path / "unified")
    unified = feature_settings(tmp_path / "unified", unified=True)
    assert unified.unified and unified.samples_per_token == 320 and frames(samples, unified).shape == (151, 320)


@pytest.mark.parametrize("change", [{"preemphasis": 0.97}, {"dither": 1e-4}, {"per_bin_mean": [0.0] * 128},
                                    {"sampling_rate": 48000}, {"padding_side": "left"}])
def test_settings_refuse_what_is_not_implemented(tmp_path: Path, change: dict) -> None:
    config = {**json.loads(Gemma4AudioFeatureExtractor().to_json_string()), **change}
    (tmp_path / "processor_config.json").write_text(json.dumps({"feature_extractor": config}))
    with pytest.raises(ConfigError, match=next(iter(change))) as caught:
        feature_settings(tmp_path)
    assert "\n" not in str(caught.value)


def test_bad_config_and_samples_refused(tmp_path: Path) -> None:
    (tmp_path / "processor_config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not readable JSON"):
        feature_settings(tmp_path)
    for bad in (torch.zeros(2, 100), torch.zeros(100, dtype=torch.int16), torch.zeros(0)):
        with pytest.raises(AudioError) as caught:
            log_mel(bad)
        assert "\n" not in str(caught.value)


def write_wav(path: Path, frames_bytes: bytes, channels: int, width: int, rate: int) -> Path:
    with wave.open(str(path), "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(width)
        out.setframerate(rate)
        out.writeframes(frames_bytes)
    return path


def int_bytes(values: torch.Tensor, width: int) -> bytes:
    """Little-endian two's-complement bytes of width each (8-bit WAV: unsigned, pass values + 128)."""
    return b"".join(int(v).to_bytes(width, "little", signed=width > 1) for v in values.tolist())


@pytest.mark.parametrize("width", [1, 2, 3, 4])
def test_read_wav_integer_pcm(tmp_path: Path, width: int) -> None:
    bits = 8 * width
    generator = torch.Generator().manual_seed(width)
    values = torch.randint(-2 ** (bits - 1), 2 ** (bits - 1), (2000,), generator=generator, dtype=torch.int64)
    values[:2] = torch.tensor([-2 ** (bits - 1), 2 ** (bits - 1) - 1])  # both extremes
    stored = values + 128 if width == 1 else values
    mono = read_wav(write_wav(tmp_path / "mono.wav", int_bytes(stored, width), 1, width, SAMPLE_RATE))
    assert mono.dtype == torch.float32 and torch.equal(mono, (values.double() / 2 ** (bits - 1)).float())
    assert mono.min() == -1.0 and (mono.max() < 1.0 if width < 4 else mono.max() == 1.0)  # float32 rounds 1 - 2^-31
    # Stereo: frames interleave left and right; the two are averaged.
    stereo = read_wav(write_wav(tmp_path / "stereo.wav", int_bytes(stored, width), 2, width, SAMPLE_RATE))
    left, right = values[0::2].double(), values[1::2].double()
    # Exact up to 16 bits; the float32 sum of two 24- or 32-bit values rounds, by at most 2^-24 of full scale.
    torch.testing.assert_close(stereo, ((left + right) / 2 ** bits).float(), atol=2 ** -23, rtol=0)


def test_read_wav_refusals(tmp_path: Path) -> None:
    def header(tag: int, width: int) -> bytes:  # RIFF/WAVE with a fmt chunk of format `tag`, 4 samples of data
        fmt = (tag.to_bytes(2, "little") + (1).to_bytes(2, "little") + SAMPLE_RATE.to_bytes(4, "little")
               + (SAMPLE_RATE * width).to_bytes(4, "little") + width.to_bytes(2, "little")
               + (8 * width).to_bytes(2, "little"))
        body = b"WAVE" + b"fmt " + len(fmt).to_bytes(4, "little") + fmt + b"data" + (4 * width).to_bytes(4, "little")
        return b"RIFF" + (len(body) + 4 * width).to_bytes(4, "little") + body + bytes(4 * width)

    (tmp_path / "text.wav").write_text("not audio at all\n")
    (tmp_path / "float.wav").write_bytes(header(3, 4))  # WAVE_FORMAT_IEEE_FLOAT
    (tmp_path / "mp3.wav").write_bytes(header(0x55, 2))  # MPEG layer 3 in a WAV container
    (tmp_path / "empty.wav").write_bytes(b"")
    write_wav(tmp_path / "silent.wav", b"", 1, 2, SAMPLE_RATE)  # a valid header and no frames
    for name in ("text.wav", "float.wav", "mp3.wav", "empty.wav"):
        with pytest.raises(AudioError, match="not 16-bit PCM WAV.*ffmpeg -i .* -c:a pcm_s16le out.wav") as caught:
            read_wav(tmp_path / name)
        assert "\n" not in str(caught.value)
    with pytest.raises(AudioError, match="no audio frames"):
        read_wav(tmp_path / "silent.wav")
    with pytest.raises(AudioError, match="no such file"):
        read_wav(tmp_path / "missing.wav")


# File rates: upsampling from 8 and 11.127 kHz; downsampling from the common 44.1 and 48 kHz and
# from odd rates whose reduced ratio is large (16,001:16,000 and 11,127:8,000). Tones: shares of the
# lower Nyquist frequency across the band wav.py states, up to its edge PASSBAND (0.9).
RESAMPLED = [8_000, 11_127, 16_001, 22_254, 44_100, 48_000]
SHARES = (0.02, 0.25, 0.5, 0.7, 0.8, 0.85, PASSBAND)


@pytest.mark.parametrize("rate", RESAMPLED)
def test_read_wav_resamples_to_16k(tmp_path: Path, rate: int) -> None:
    # A 16-bit tone at `rate` must come back as the exact tone sampled at 16 kHz, within the 1e-3 of
    # its amplitude that wav.py states up to PASSBAND of the lower Nyquist frequency. Error sources:
    # 16-bit rounding (3e-5 of the amplitude 0.5) and the filter's passband deviation, a property of
    # the kernel and not of the CPU: measured at most 1.4e-4 of the amplitude here (at the band's
    # edge, from 8 and 11.127 kHz), 7x below the bound. The old kernel (Hann, 6 zero crossings) lost
    # 1.5% at 3 kHz from 8 kHz; linear interpolation 2.3% at 3 kHz from 44.1 kHz. Ends skipped: 64
    # samples, beyond the kernel's reach (at most 56 output samples: 28 inputs a side from 8 kHz).
    amplitude, length = 0.5, rate // 4
    nyquist = min(rate, SAMPLE_RATE) / 2
    for share in SHARES:
        hz = share * nyquist
        values = (tone(length, hz, amplitude, rate).double() * 32768).round().long()
        got = read_wav(write_wav(tmp_path / "tone.wav", int_bytes(values, 2), 1, 2, rate))
        assert len(got) == math.ceil(length * SAMPLE_RATE / rate)
        expected = tone(len(got), hz, amplitude).double()
        error = (got.double() - expected)[64:-64].abs().max().item() / amplitude
        assert error < 1e-3, f"{hz:.0f} Hz from {rate} Hz: {error:.1e} of the amplitude"
