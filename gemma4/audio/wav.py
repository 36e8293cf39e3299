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
- Another sample rate is resampled by band-limited windowed-sinc interpolation: a Kaiser-windowed
  sinc (beta 8) with 28 zero crossings each side, its cutoff at 0.99 of the lower Nyquist frequency.
  Why this method: it removes what lies above 8 kHz before it can fold back into the band the model
  hears (linear interpolation folds it back).
- Its accuracy, on tones against the exact tone at the new rate away from the clip's ends, down-
  and upsampling alike: every tone up to 0.9 of the lower Nyquist frequency (7.2 kHz from 16 kHz
  and above, 3.6 kHz from 8 kHz) comes back within 1e-3 of its amplitude (measured at most 1.4e-4,
  at that edge), and a tone above 1.1 of it (what would fold back below 0.9) leaves less than 2e-4
  of its amplitude (measured at most 8e-5). Between lies the transition band: at 0.95, 0.90 to
  0.92 of the amplitude is kept. tests/parity/test_audio_features.py checks the band on tones from
  8, 11.127, 16.001, 22.254, 44.1 and 48 kHz, tests/parts/test_wav.py what lies above. The long
  kernel buys that band: torchaudio's default (Hann, 6 zero crossings) loses 1.5% at 3 kHz from
  8 kHz.
- Time and memory in proportion to the clip, whatever the rate: output j lies at input time j*P/Q
  and its taps depend on its phase j mod Q only; each phase that occurs gets its taps once
  (min(Q, N) rows), then each output weighs its own window of inputs, CHUNK elements at a time.
  Nothing is sized by P or Q alone (one kernel per phase spanning P inputs took 4.2 GB for 0.1 s
  at 22,254 Hz); tests/parts/test_wav.py counts the bytes of every tensor built.

Shape legend: N samples at 16 kHz, M samples at the file's rate, C channels, P, Q the reduced rate
ratio, J output samples in a chunk, T = 2*half + 2 taps each.
"""

import math
import shlex
import wave
from pathlib import Path

import torch
import torch.nn.functional as F

SAMPLE_RATE = 16_000  # Hz: what every Gemma 4 audio input is
ZERO_CROSSINGS = 28  # of the windowed sinc, each side: a longer kernel, a narrower transition band
KAISER_BETA = 8.0  # the window's shape: passband ripple and stopband leak near 1e-4
ROLLOFF = 0.99  # cutoff as a share of the lower Nyquist frequency: room for the transition band
PASSBAND = 0.9  # share of the lower Nyquist frequency kept within 1e-3 (the docstring's band)
CHUNK = 2**18  # elements of each (outputs, taps) tensor built at once: bounded work tensors


class AudioError(ValueError):
    """An audio input that cannot be read or used; the message names the problem and the fix."""


MIN_RATE = 4_000  # Hz: telephone speech is 8 kHz; a header below this rate is refused


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
    # Below MIN_RATE a header is no recording of speech, and resampling would multiply its length many times.
    if rate < MIN_RATE:
        raise AudioError(f"{path} says it is sampled at {rate} Hz, below the {MIN_RATE} Hz of any speech "
                         f"recording: {convert_hint(path)}")
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


def sinc_taps(fractions: torch.Tensor, cutoff: float, half: int) -> torch.Tensor:
    """(J, 2*half + 2) float32 weights of the inputs floor(t) - half ... floor(t) + half + 1 for
    J outputs at input times t whose fractional parts are `fractions`, (J,) float64 in [0, 1).
    `cutoff`: the low-pass edge as a share of the input's Nyquist frequency; half is
    floor(ZERO_CROSSINGS / cutoff), the window's reach in inputs (or less: taps beyond are left
    out). Each row sums to 1: a constant comes back unchanged."""
    offsets = torch.arange(-half, half + 2, dtype=torch.float64)  # (T,) inputs after floor(t)
    x = (fractions[:, None] - offsets) * cutoff  # (J, T) t - i, in zero crossings of the sinc
    # Kaiser window over [-ZERO_CROSSINGS, ZERO_CROSSINGS], 0 beyond; its scale cancels in the sums.
    window = torch.special.i0(KAISER_BETA * (1 - (x / ZERO_CROSSINGS) ** 2).clamp(min=0).sqrt())
    sinc = torch.where(x == 0, 1.0, torch.sin(math.pi * x) / (math.pi * x))
    taps = torch.where(x.abs() < ZERO_CROSSINGS, sinc * window, 0.0)  # (J, T)
    return (taps / taps.sum(dim=1, keepdim=True)).float()


def resample(samples: torch.Tensor, rate: int, new_rate: int) -> torch.Tensor:
    """(M,) samples at `rate` Hz -> (ceil(M * new_rate / rate),) samples at `new_rate` Hz, windowed-sinc."""
    if rate <= 0:
        raise AudioError(f"sample rate {rate} Hz: give a recording with a positive sample rate")
    if len(samples) == 0:
        return torch.empty(0)  # (0,) no window to unfold
    reduced = math.gcd(rate, new_rate)
    p, q = rate // reduced, new_rate // reduced
    # Output j lies at input time j*P/Q: input floor(j*P/Q) plus the fraction (j*P mod Q) / Q, which
    # depends on j mod Q only, its phase. Integers: exact for every clip length and rate.
    cutoff = ROLLOFF * min(p, q) / p  # the lower Nyquist frequency, as a share of the input's
    # Inputs each side within the window, at most M: taps beyond weigh only the zeros past the ends,
    # and a header's rate in GHz would make them millions. Such a clip is shorter than the window's
    # reach (1.8 ms at 16 kHz and above), all edge: rows summing to 1 over fewer taps lose nothing.
    half = min(math.floor(ZERO_CROSSINGS / cutoff), len(samples))
    width = 2 * half + 2  # T
    n = -(-len(samples) * q // p)  # ceil(M * Q / P)
    per_chunk = max(1, CHUNK // width)  # J
    # Taps for each phase that occurs, once: min(Q, N) rows, never more than outputs. An odd rate
    # (Q = 16,000 at 16,001 Hz) costs what its clip's length does; 48 kHz needs 1 row, 44.1 kHz 160.
    phases = torch.arange(min(q, n))  # (min(Q, N),)
    taps = torch.empty(len(phases), width)  # (min(Q, N), T)
    for start in range(0, len(phases), per_chunk):
        chunk = phases[start:start + per_chunk]  # (J,)
        taps[start:start + len(chunk)] = sinc_taps((chunk * p % q).double() / q, cutoff, half)
    padded = F.pad(samples.float(), (half, half + 1))  # (M + T - 1,) zeros beyond both ends
    windows = padded.unfold(0, width, 1)  # (M, T) view: row i is inputs i - half ... i + half + 1
    out = torch.empty(n)  # (N,)
    for start in range(0, n, per_chunk):
        j = torch.arange(start, min(n, start + per_chunk))  # (J,) outputs
        out[start:start + len(j)] = (windows[j * p // q] * taps[j % q]).sum(dim=1)  # (J, T) -> (J,)
    return out
