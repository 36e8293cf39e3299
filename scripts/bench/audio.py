"""scripts/benchmark.py's `audio` section: the E2B audio tower encoding one clip, its time and its memory.

    python scripts/benchmark.py --only audio              # a 30 s clip; --audio-small: tiny sizes, for the tests

- The model: gemma4/audio's `AudioTower` and `AudioEmbedder` (`embed_audio`) at E2B's geometry (`E2B_AUDIO`), built
  on the meta device and filled with seeded random weights of a sensible scale (normal · fan_in^-1/2, norm weights
  1, per_dim_scale 0, output_proj's bias 0, clip bounds ±inf: the clamps still run), in bfloat16 and in float32.
  Random values cost what the released ones cost: the work depends on the shapes only.
- The clip: seeded uniform noise at 16 kHz, `--audio-seconds` long (30 s, the most the tower reads: 750 soft
  tokens, 25 a second of audio). `Audio.encode` (gemma4/audio/loading.py) runs it: log-mel features (on the CPU),
  then the tower and embed_audio on the valid frames.
- Times: the features, and the tower + embed_audio in each dtype on the same features, taken in turns
  (bench/timing.py `interleaved`: one untimed warm-up, the order reversed every other repetition, the median).
  An encode is features + tower; throughput: soft tokens a second, and seconds of audio encoded a wall-clock
  second (clip seconds / encode seconds).
- Memory (CPU only): in a fresh process per dtype, the model built, a 1 s clip encoded (first calls page code in),
  the peak restarted (/proc's VmHWM, as bench/memory.py), one `Audio.encode` of the clip; the peak over the
  resident memory before it, beside the weights' bytes (tower + embed_audio, clip bounds included).
"""

import dataclasses
import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from math import inf, prod
from pathlib import Path
from typing import Any

import torch

from bench.memory import SCRIPTS, reset_peak, status_mib
from bench.timing import HOST, Clock, interleaved
from gemma4.audio.config import AudioConfig, audio_config, audio_tokens
from gemma4.audio.features import AudioFeatureSettings, log_mel
from gemma4.audio.embedder import AudioEmbedder
from gemma4.audio.loading import Audio
from gemma4.audio.tower import AudioTower, weight_table
from gemma4.audio.wav import SAMPLE_RATE

# E2B's audio_config: transformers 5.22.2's `Gemma4AudioConfig` defaults are E2B's (google/gemma-4-E2B-it's
# config.json), and E2B's text width is 1536 (`text_config.hidden_size`). 304,825,088 tower values (tower.py).
E2B_AUDIO = {"model_type": "gemma4", "text_config": {"hidden_size": 1536}, "audio_config": {
    "hidden_size": 1024, "num_hidden_layers": 12, "num_attention_heads": 8, "conv_kernel_size": 5,
    "attention_chunk_size": 12, "attention_context_left": 13, "attention_context_right": 0,
    "subsampling_conv_channels": [128, 32], "output_proj_dims": 1536, "use_clipped_linears": True}}
# The tests' stand-in: the same code paths (chunks of 12, clipped linears), a thousandth of the work.
SMALL_AUDIO = {"model_type": "gemma4", "text_config": {"hidden_size": 64}, "audio_config": {
    "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "subsampling_conv_channels": [128, 4],
    "output_proj_dims": 48}}
DTYPES = ("bfloat16", "float32")
SEED = 0
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")  # what bf16 speed hangs on


def geometry(small: bool) -> AudioConfig:
    config = audio_config(SMALL_AUDIO if small else E2B_AUDIO)
    assert config is not None
    return config


def fill(module: torch.nn.Module, generator: torch.Generator) -> None:
    """Random weights in place: matrices and filters normal · fan_in^-1/2, norm weights 1, clip bounds ±inf,
    per_dim_scale and biases 0 (softplus(0) = ln 2: the plain 1/sqrt(D) scale)."""
    with torch.no_grad():
        for name, t in [*module.named_parameters(), *module.named_buffers()]:
            leaf = name.rsplit(".", 1)[-1]
            if leaf in ("input_min", "output_min", "input_max", "output_max"):
                t.fill_(-inf if leaf.endswith("min") else inf)
            elif t.dim() >= 2:  # (out, in), (out, in/groups, kernel...)
                t.normal_(0.0, prod(t.shape[1:]) ** -0.5, generator=generator)
            else:
                t.fill_(1.0 if leaf == "weight" else 0.0)


def build(config: AudioConfig, dtype: torch.dtype, device: torch.device | str = "cpu") -> Audio:
    """E2B's audio side with seeded random weights, made in `dtype` (no float32 copy on the way), eval mode."""
    generator = torch.Generator().manual_seed(SEED)
    parts = []
    for cls in (AudioTower, AudioEmbedder):
        with torch.device("meta"):
            module = cls(config).to(dtype)
        module = module.to_empty(device="cpu")
        fill(module, generator)
        parts.append(module.to(device).eval().requires_grad_(False))
    names = {n for n, _ in [*parts[0].named_parameters(), *parts[0].named_buffers()]}
    assert names == set(weight_table(config)), "the tower's tensors are not tower.py's name table"
    return Audio(config, audio_tokens({}), AudioFeatureSettings(), parts[0], parts[1])


def weight_bytes(audio: Audio) -> int:
    return sum(t.numel() * t.element_size() for m in (audio.encoder, audio.embedder)
               for t in [*m.parameters(), *m.buffers()])


def clip(seconds: float) -> torch.Tensor:
    """(N,) seeded uniform noise in [-0.5, 0.5) at 16 kHz."""
    return torch.rand(round(seconds * SAMPLE_RATE), generator=torch.Generator().manual_seed(SEED)) - 0.5


def cpu() -> dict[str, Any]:
    """lscpu's model name and the flags of CPU_FLAGS it has (/proc/cpuinfo; empty elsewhere)."""
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return {"model": None, "flags": []}
    fields = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in info) if k.strip()}
    have = set(fields.get("flags", "").split())
    return {"model": fields.get("model name"), "flags": [f for f in CPU_FLAGS if f in have]}


def memory_child(dtype: str, seconds: float, small: bool, threads: int) -> dict[str, Any]:
    """Runs in a fresh process: the model built, a 1 s encode (it pages the kernels' code in), the peak restarted,
    one encode of the clip."""
    torch.set_num_threads(threads)
    samples = clip(seconds)
    base = status_mib()
    audio = build(geometry(small), getattr(torch, dtype))
    audio.encode(clip(1.0))  # activations of 25 positions: too few to hide the clip's peak in what it frees
    built = status_mib()
    restarted = reset_peak()
    vectors = audio.encode(samples)
    after = status_mib()
    weights = weight_bytes(audio) / 2**20
    peak = after["VmHWM"] - built["VmRSS"]  # without the restart, the build's own peak may be the one read
    return {"dtype": dtype, "weights_mib": weights, "before_encode_over_baseline_mib": built["VmRSS"] - base["VmRSS"],
            "encode_peak_mib": peak, "encode_peak_over_weights": peak / weights, "peak_restarted": restarted,
            "soft_tokens": len(vectors)}


def memory_run(dtype: str, seconds: float, small: bool, threads: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "bench.audio", dtype, str(seconds), str(int(small)), str(threads)],
                         capture_output=True, text=True, cwd=SCRIPTS)
    if out.returncode:
        raise RuntimeError(f"the audio memory measurement failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def audio_section(seconds: float, reps: int, small: bool, threads: int, clock: Clock = HOST,
                  say: Callable[..., None] = print) -> dict[str, Any]:
    settings = AudioFeatureSettings()
    if not 0 < seconds * SAMPLE_RATE <= settings.max_samples:
        raise ValueError(f"--audio-seconds {seconds}: give 0 < seconds <= {settings.max_samples / SAMPLE_RATE:g}, "
                         f"the most the tower reads")
    config, samples = geometry(small), clip(seconds)
    say(f"audio: building the {'small' if small else 'E2B'} audio tower with random weights, bfloat16 and float32")
    models = {name: build(config, getattr(torch, name), clock.device) for name in DTYPES}
    mel = log_mel(samples, settings)
    frames = mel.features[mel.mask].to(clock.device)  # (F valid, 128): what Audio.encode gives the tower

    def tower(audio: Audio) -> Callable[[], torch.Tensor]:
        return torch.inference_mode()(lambda: audio.embedder(audio.encoder(frames)))

    say(f"audio: {seconds:g} s clip, {mel.soft_tokens} soft tokens; features and the tower in turns, {reps} reps")
    runs = {"features": lambda: log_mel(samples, settings)} | {name: tower(m) for name, m in models.items()}
    times, outputs = interleaved(runs, reps, warm_up=runs, clock=clock)
    features_s = statistics.median(times["features"])
    rows: dict[str, Any] = {}
    for name, audio in models.items():
        out = outputs[name][-1]
        tower_s = statistics.median(times[name])
        encode_s = features_s + tower_s
        rows[name] = {"tower_s": tower_s, "tower_seconds": times[name], "encode_s": encode_s,
                      "weights_bytes": weight_bytes(audio), "vectors": list(out.shape),
                      "finite": bool(torch.isfinite(out).all()), "soft_tokens_per_s": mel.soft_tokens / encode_s,
                      "audio_s_per_s": seconds / encode_s, "tower_audio_s_per_s": seconds / tower_s}
    del models, outputs
    memory: dict[str, Any] | None = None
    if not clock.cuda:  # the host's resident memory; on CUDA the tower's memory is the device's
        say("audio: peak resident memory of one encode, a fresh process per dtype")
        memory = {name: memory_run(name, seconds, small, threads) for name in DTYPES}
    return {"geometry": "small" if small else "E2B", "config": dataclasses.asdict(config),
            "values": sum(prod(s) for s in weight_table(config).values()), "clip_seconds": seconds,
            "soft_tokens": mel.soft_tokens, "soft_tokens_per_audio_s": mel.soft_tokens / seconds,
            "valid_frames": len(frames), "reps": reps, "features_s": features_s, "features_seconds": times["features"],
            "device": str(clock.device), "cpu": cpu(), "dtypes": rows, "memory": memory}


def audio_table(result: dict[str, Any]) -> str:
    a = result.get("audio")
    if not a:
        return ""
    c = a["cpu"]
    lines = ["", f"== audio: the {a['geometry']} audio tower + embed_audio, random weights ({a['values'] / 1e6:.1f} M "
                 f"tower values), a {a['clip_seconds']:g} s clip, {a['reps']} timed reps, on {a['device']}",
             f"   cpu: {c['model'] or 'n/a'}; flags {' '.join(c['flags']) or 'none of ' + ' '.join(CPU_FLAGS)}",
             f"   soft tokens {a['soft_tokens']} ({a['soft_tokens_per_audio_s']:g} a second of audio), from "
             f"{a['valid_frames']} log-mel frames; features {a['features_s'] * 1e3:.0f} ms (median)",
             f"   {'dtype':<10}{'weights MiB':>12}{'tower s':>10}{'encode s':>10}{'tokens/s':>10}{'audio s/s':>11}"
             f"{'peak MiB':>10}{'x weights':>11}"]
    for name, r in a["dtypes"].items():
        m = (a["memory"] or {}).get(name)
        peak = (f"{m['encode_peak_mib']:>10.0f}{m['encode_peak_over_weights']:>10.2f}x" if m
                else f"{'n/a':>10}{'n/a':>11}")
        lines.append(f"   {name:<10}{r['weights_bytes'] / 2**20:>12.0f}{r['tower_s']:>10.3f}{r['encode_s']:>10.3f}"
                     f"{r['soft_tokens_per_s']:>10.0f}{r['audio_s_per_s']:>11.1f}{peak}")
    lines.append("   encode = features + tower (the median of each); audio s/s: seconds of audio encoded a second; "
                 "peak: one encode in a fresh process, over the resident memory before it")
    return "\n".join(lines)


if __name__ == "__main__":  # memory_run's child: python -m bench.audio DTYPE SECONDS SMALL THREADS
    print(json.dumps(memory_child(sys.argv[1], float(sys.argv[2]), bool(int(sys.argv[3])), int(sys.argv[4]))))
