"""Reading a WAV file into the 16 kHz mono samples Gemma 4's audio features start from.

Facts a reader must know:
- Gemma 4 hears 16 kHz mono samples in [-1, 1). transformers' feature extractors take samples already at 16 kHz
  and never resample (they ignore a `sampling_rate` argument); for a file path its chat template decodes and
  resamples with `load_audio` (librosa or torchcodec). Here the standard library's `wave` decodes and PyTorch
  resamples.
- Integer PCM only, 8, 16, 24 or 32 bits: a b-bit value v becomes v / 2**(b-1) (16-bit: v / 32768, as soundfile
  and so librosa read it; 32-bit values within 2**-25 of full scale round to 1.0 in float32). 8-bit WAV stores
  unsigned bytes, 128 = silence. Float WAV, compressed WAV (and, with the `wave` of Python < 3.12,
  WAVE_FORMAT_EXTENSIBLE headers) are refused with the ffmpeg line that converts them.
- Channels are averaged, as librosa's `mono=True`.
- Another sample rate is resampled by band-limited windowed-sinc interpolation: a Hann-windowed sinc with 6 zero
  crossings each side and its cutoff at 0.99 of the lower Nyquist frequency, the kernel of
  `torchaudio.functional.resample`'s defaults (transformers' "torchaudio" backend of `load_audio`). Why this method:
  it removes what lies above 8 kHz before it can fold back into the band the model hears (linear interpolation
  folds it back), and it is one strided conv1d. Its passband error at speech frequencies is below 1e-3 of the
  amplitude (tests/parity/test_audio_features.py measures it on tones).

Shape legend: N samples at 16 kHz, M samples at the file's rate, C channels, P, Q the reduced rate ratio.
"""

import math
import shlex
import wave
from pathlib import Path

import torch
import torch.nn.functional as F

SAMPLE_RATE = 16_000  # Hz: what every Gemma 4 audio input is
ZERO_CROSSINGS = 6  # of the windowed sinc, each side: sharper cutoff for a longer kernel
ROLLOFF = 0.99  # cutoff as a share of the lower Nyquist frequency: room for the filter's transition band


class AudioError(ValueError):
    """An audio input that cannot be read or used; the message names the problem and the fix."""


def convert_hint(path: str | Path) -> str:
    """The ffmpeg command that turns any audio file into what read_wav reads best."""
    return f"convert it, e.g. `ffmpeg -i {shlex.quote(str(path))} -ar 16000 -ac 1 -c:a pcm_s16le out.wav`"


def read_wav(path: str | Path) -> torch.Tensor:
    """(N,) float32 mono samples at 16 kHz in [-1, 1) from an integer-PCM WAV file of any rate and channel count."""
    if not Path(path).is_file():
        raise AudioError(f"{path}: no such file: give a 16-bit PCM WAV file")
    try:
        with wave.open(str(path), "rb") as wav:
            channels, width, rate = wav.getnchannels(), wav.getsampwidth(), wav.getframerate()
            data = wav.readframes(wav.getnframes())
    except (wave.Error, EOFError) as e:  # not RIFF/WAVE, a float or compressed format tag, a cut-off header
        reason = str(e) or "the file ends inside its header"
        raise AudioError(f"{path} is not 16-bit PCM WAV ({reason}): {convert_hint(path)}") from e
    if not 1 <= width <= 4:
        raise AudioError(f"{path} has {8 * width}-bit samples, not 16-bit PCM: {convert_hint(path)}")
    if len(data) < channels * width:
        raise AudioError(f"{path} holds no audio frames: give a recording")
    data = data[:len(data) - len(data) % (channels * width)]  # a last frame cut off mid-way is dropped
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8).reshape(-1, width)  # (M*C, width) little-endian
    if width == 1:
        values = (raw[:, 0].to(torch.int16) - 128).float() / 128  # (M*C,) unsigned bytes around 128
    else:
        # Put the value's bytes at the top of an int32 (zeros below): the int32 is v * 2**(32 - 8*width) with its
        # sign, so / 2**31 gives v / 2**(8*width - 1) for every width, exactly up to 24 bits. WAV is little-endian,
        # as every CPU PyTorch ships for, so the view reads the bytes in the file's order.
        word = torch.zeros(raw.shape[0], 4, dtype=torch.uint8)  # (M*C, 4)
        word[:, 4 - width:] = raw
        values = word.view(torch.int32).reshape(-1).float() / 2**31  # (M*C,)
    mono = values.reshape(-1, channels).mean(dim=1)  # (M,) frames hold one sample per channel, interleaved
    return mono if rate == SAMPLE_RATE else resample(mono, rate, SAMPLE_RATE)


def sinc_kernels(rate: int, new_rate: int) -> tuple[torch.Tensor, int]:
    """The resampling filter for rate -> new_rate, reduced to P -> Q by their gcd: (Q, 1, 2*half + P) float32
    kernels, one per output phase, and `half`, the kernel's reach in input samples each side.

    Output sample j = q + b*Q (phase q, block b) lies at input time b*P + q*P/Q; its kernel weighs each input
    sample by the windowed sinc of their distance. Distances are measured in units of 1/P (the reduced input
    period), so the sinc's first zero falls at 1/cutoff, with cutoff = ROLLOFF * min(P, Q)."""
    reduced = math.gcd(rate, new_rate)
    p, q = rate // reduced, new_rate // reduced
    cutoff = ROLLOFF * min(p, q)  # twice the passband edge, in reduced units
    half = math.ceil(ZERO_CROSSINGS * p / cutoff)  # input samples each side within ZERO_CROSSINGS zeros of the sinc
    offsets = torch.arange(-half, half + p, dtype=torch.float64) / p  # (2*half + P,) input sample times
    times = offsets[None, :] - torch.arange(q, dtype=torch.float64)[:, None] / q  # (Q, 2*half + P) minus phase time
    x = (times * cutoff).clamp(-ZERO_CROSSINGS, ZERO_CROSSINGS)  # in sinc zero crossings; clamped: window is 0 there
    window = torch.cos(x * math.pi / ZERO_CROSSINGS / 2) ** 2  # Hann over [-ZERO_CROSSINGS, ZERO_CROSSINGS]
    sinc = torch.where(x == 0, 1.0, torch.sin(math.pi * x) / (math.pi * x))
    kernels = sinc * window * cutoff / p  # cutoff / P: unit gain at 0 Hz
    return kernels[:, None, :].float(), half  # (Q, 1, 2*half + P)


def resample(samples: torch.Tensor, rate: int, new_rate: int) -> torch.Tensor:
    """(M,) samples at `rate` Hz -> (ceil(M * new_rate / rate),) samples at `new_rate` Hz, windowed-sinc."""
    if rate <= 0:
        raise AudioError(f"sample rate {rate} Hz: give a recording with a positive sample rate")
    kernels, half = sinc_kernels(rate, new_rate)  # (Q, 1, K), K = 2*half + P
    q, p = kernels.shape[0], kernels.shape[2] - 2 * half
    # Zeros beyond both ends: `half` before the first sample, and enough after the last for its last block.
    padded = F.pad(samples.float()[None, None], (half, half + p))  # (1, 1, M + 2*half + P)
    blocks = F.conv1d(padded, kernels, stride=p)  # (1, Q, blocks): block b of P inputs gives Q outputs
    out = blocks[0].t().reshape(-1)  # (blocks * Q,) phase fastest: outputs in time order
    return out[:math.ceil(len(samples) * q / p)]  # (N,)
