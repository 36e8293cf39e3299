"""gemma4/audio/wav.py's resampler on its own: no files, no wall clock.

- Cost: a 0.1 s clip at a rate whose reduced ratio to 16 kHz is large (16,001:16,000, 11,127:16,000,
  22,254 -> 11,127:8,000) builds no tensor over 2 MiB and writes under 32 MiB in all ops' outputs
  together, which bounds both its peak memory and its work (every op writes each output byte once).
  The old kernel, one per phase spanning P inputs, built 2.0, 1.4 and 0.7 GB float64 tensors there,
  took 13 to 19 s, or ran out of memory. The sizes are counted on every aten op's output, factory
  functions included, by a dispatch mode: Python's tracemalloc does not see PyTorch's allocator.
- Doubling the clip at most doubles those sizes, plus a constant: they follow the clip's length. A
  header's rate of 4 GHz with 100 samples builds nothing over 64 KiB (the window's 7 million taps
  are cut to the clip).
- What would fold back into the band wav.py states (tones above 1.1 of 8 kHz, from 22.254, 44.1 and
  48 kHz) leaves less than 2e-4 of its amplitude.
- A constant comes back unchanged at every phase (the taps of each output sum to 1), and the output
  has ceil(M * new_rate / rate) samples, none for an empty clip.
"""

import math
import wave
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from gemma4.audio.wav import SAMPLE_RATE, AudioError, read_wav, resample

MIB = 2**20


class BufferSizes(TorchDispatchMode):
    """The bytes of every buffer an aten op allocates: each output whose storage is none of its
    inputs' (a view or an in-place op's result shares its input's and allocates nothing)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        shared = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in shared:
                size = t.untyped_storage().nbytes()
                self.largest, self.total = max(self.largest, size), self.total + size
        return out


def tone(n: int, hz: float, rate: int, amplitude: float = 1.0) -> torch.Tensor:
    times = torch.arange(n, dtype=torch.float64) / rate  # (n,) seconds
    return (amplitude * torch.sin(2 * math.pi * hz * times)).float()


def sizes(rate: int, seconds: float) -> BufferSizes:
    clip = tone(int(rate * seconds), 440.0, rate, 0.5)
    with BufferSizes() as counted:
        got = resample(clip, rate, SAMPLE_RATE)
    assert len(got) == math.ceil(len(clip) * SAMPLE_RATE / rate)
    return counted


@pytest.mark.parametrize("rate", [16_001, 11_127, 22_254])
def test_an_odd_rate_costs_what_its_clip_does(rate: int) -> None:
    # Measured for 0.1 s: largest 0.7 MiB (16,001, 11,127: float64 taps, 1,600 outputs x 58 inputs)
    # and 1.0 MiB (22,254: x 80), total 15 and 20 MiB, most of it the taps' few float64 steps.
    short = sizes(rate, 0.1)
    assert short.largest < 2 * MIB and short.total < 32 * MIB
    long = sizes(rate, 0.2)
    assert long.largest <= 2 * short.largest + MIB and long.total <= 2 * short.total + MIB


def test_a_rate_in_ghz_costs_what_its_clip_does() -> None:
    # The window reaches 28 / 0.99 inputs per 16 kHz output: 7 million at a header's 4 GHz. Its taps
    # stop at the clip's 100 samples; measured: largest 1.6 KiB, total 36 KiB.
    counted = sizes(4_000_000_000, 100 / 4_000_000_000)
    assert counted.largest < 64 * 2**10 and counted.total < MIB


@pytest.mark.parametrize("rate", [22_254, 44_100, 48_000])
def test_what_would_fold_into_the_band_is_removed(rate: int) -> None:
    # A tone above 8 kHz cannot be represented at 16 kHz; one at f folds back to 16 kHz - f, into
    # the band wav.py states (up to 0.9 of 8 kHz) when f > 1.1 x 8 kHz. Measured: at most 6.6e-5 of
    # the amplitude left (the Kaiser window's stopband); bound 2e-4. Linear interpolation leaves
    # 99% at 12 kHz. Ends skipped: 64 samples, beyond the kernel's reach (at most 30 outputs here).
    for hz in torch.linspace(8_800, 0.49 * rate, 8).tolist():
        got = resample(tone(rate // 4, hz, rate), rate, SAMPLE_RATE)
        assert got[64:-64].abs().max() < 2e-4, f"{hz:.0f} Hz from {rate} Hz"


@pytest.mark.parametrize("rate", [8_000, 11_127, 16_001, 22_254, 44_100, 48_000])
def test_constants_and_lengths(rate: int) -> None:
    for m in (0, 1, 2, 3, 1000, rate // 10 + 7):
        got = resample(torch.full((m,), 0.25), rate, SAMPLE_RATE)
        assert len(got) == math.ceil(m * SAMPLE_RATE / rate)
        if m > 200:  # 64 samples from the ends: beyond the kernel's reach, where zeros come in
            inner = got[64:-64]
            torch.testing.assert_close(inner, torch.full_like(inner, 0.25), atol=1e-6, rtol=0)


def test_a_rate_below_any_speech_recording_is_refused(tmp_path: Path) -> None:
    """A header that says 1 Hz would turn 100 samples into 1.6 million: refused in one line with the fix."""
    path = tmp_path / "odd.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(1)
        w.writeframes(b"\x00\x01" * 100)
    with pytest.raises(AudioError, match=r"sampled at 1 Hz, below the 4000 Hz .*ffmpeg -i"):
        read_wav(path)
