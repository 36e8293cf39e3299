"""Tiny int4 checkpoints in the layout of Google's QAT w4a16 releases (compressed-tensors `pack-quantized`).

`write_int4_target` writes a float checkpoint with tests/checkpoints.py `write_target`, then `to_int4` rewrites it
as a release stores it: each quantized projection `M.weight` (O, I) becomes the triple `M.weight_packed` int32
(O, I/8), `M.weight_scale` bf16 (O, I/32), `M.weight_shape` int64 [O, I], and config.json gets the release's
`quantization_config`. Everything else (embeddings, norms, scalars, the vision tower) is written as it was.

Notable facts:
- The words are packed by compressed-tensors' own `pack_to_int32`, the oracle's packing, not gemma4/int4.py's.
- The recipe is the release's round to nearest: s = max|w| / 7.5 over each group of 32 inputs, rounded to bf16,
  q = clamp(round(w / s), -8, 7) (an all-zero group: s = 0, q = 0). Written here from the recipe, not imported.
- Which layers: every decoder q/k/v/o/gate/up/down projection and the Per-Layer Embedding projections
  (`per_layer_input_gate`, `per_layer_projection`, `per_layer_model_projection`), chosen by their names below.
  KV-shared layers carry no k/v in the file, and K=V full layers no v: there is nothing to quantize there.
- E2B's PLE width (8 in tests/checkpoints.py) is no multiple of 32: `write_int4_target` writes the PLE shape with
  a width of 32 (`PLE_WIDTH`), so its per-layer projections are int4 as in the release.
"""

import json
import re
from pathlib import Path

import torch
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
from safetensors.torch import load_file, save_file

from tests.checkpoints import write_target

GROUP = 32
PLE_WIDTH = 32  # the Per-Layer Embedding width of an int4 E2B-like file: one group of 32 inputs

# The text model's projections the releases store as int4 (the prefix `model.language_model.` or `model.` before).
QUANTIZED_NAME = re.compile(
    r"(layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj|per_layer_input_gate|per_layer_projection)"
    r"|per_layer_model_projection)\.weight")
TEXT_PREFIXES = ("model.language_model.", "model.")

# config.json's quantization_config, as the w4a16 releases write it.
QUANTIZATION_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "quantization_status": "compressed",
    "config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": GROUP,
                    "dynamic": False, "actorder": None, "observer": "minmax"},
        "input_activations": None,
        "output_activations": None,
        "format": "pack-quantized",
    }},
    "ignore": ["lm_head", "re:.*vision_tower.*", "re:.*embed_vision.*", "re:.*audio_tower.*", "re:.*embed_audio.*"],
    "kv_cache_scheme": None,
}


def is_quantized_name(name: str) -> bool:
    """Whether a file tensor is one the releases store as int4."""
    return any(name.startswith(p) and QUANTIZED_NAME.fullmatch(name[len(p):]) for p in TEXT_PREFIXES)


def int4_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w (O, I) -> q (O, I) int8 in -8..7 and scales (O, I/32) bf16, by the release's recipe."""
    o, i = w.shape
    groups = w.float().view(o, i // GROUP, GROUP)  # (O, G, 32)
    scales = (groups.abs().amax(-1) / 7.5).to(torch.bfloat16)  # (O, G)
    s = scales.float()[..., None]  # (O, G, 1)
    ratio = torch.where(s > 0, groups / torch.where(s > 0, s, 1.0), 0.0)  # an all-zero group: q = 0
    q = torch.clamp(torch.round(ratio), -8, 7).to(torch.int8).view(o, i)
    return q, scales


def to_int4(src: str | Path, dst: str | Path) -> Path:
    """The float checkpoint in `src` (one model.safetensors) rewritten into `dst` as an int4 release (dst may be
    src). The other files are copied as they are."""
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    tensors = load_file(src / "model.safetensors")
    out: dict[str, torch.Tensor] = {}
    for name, w in tensors.items():
        if not is_quantized_name(name):
            out[name] = w
            continue
        q, scales = int4_weight(w)
        module = name.removesuffix(".weight")
        out[module + ".weight_packed"] = pack_to_int32(q, 4)  # (O, I/8) int32
        out[module + ".weight_scale"] = scales  # (O, I/32) bf16
        out[module + ".weight_shape"] = torch.tensor(list(w.shape))  # int64 [O, I]
    for file in src.iterdir():
        if file.name not in ("model.safetensors", "config.json") and file.is_file() and src != dst:
            (dst / file.name).write_bytes(file.read_bytes())
    save_file(out, dst / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = QUANTIZATION_CONFIG
    (dst / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return dst


def write_int4_target(path: str | Path, shape: str, dtype: torch.dtype = torch.bfloat16, seed: int = 0,
                      multimodal: bool = True) -> Path:
    """A tiny int4 target in the release layout: tests/checkpoints.py's `shape` (a PLE shape with width
    PLE_WIDTH), its float tensors in `dtype` (the releases' bf16), its projections int4."""
    ple = PLE_WIDTH if shape == "e2b" else None
    return to_int4(write_target(path, shape, dtype=dtype, seed=seed, multimodal=multimodal, ple_width=ple), path)


__all__ = ["PLE_WIDTH", "QUANTIZATION_CONFIG", "int4_weight", "is_quantized_name", "to_int4", "write_int4_target"]
