"""Int4 files in the layout of Google's w4a16 releases, written for scripts/bench/int4.py: the E2B-dimension target
rewritten once as a release stores it (`quantized_copy`), and a random 31B-geometry file streamed to disk tensor by
tensor (`random_tensors`, `write_release`: it never sits in memory)."""

import ctypes
import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from bench.random_pair import (
    DTYPE_CODES,
    assistant_config,
    random_tensor,
    target_config,
)
from bench.show import written
from gemma4.config import FULL, SLIDING
from gemma4.config_file import read_json, text_config_from_dict
from gemma4.int4 import GROUP, int4_table, is_quantized, quantize
from gemma4.weights import target_weight_table

BF16 = torch.bfloat16
FULL_VOCAB = 262144
CODES = DTYPE_CODES | {torch.int32: "I32"}
Q_RMS = (sum(q * q for q in range(-8, 8)) / 16) ** 0.5  # rms of a uniform nibble's q in -8..7: 4.64
# config.json's quantization_config as the w4a16 releases write it (gemma4/int4.py `check_scheme` reads it).
QUANTIZATION_CONFIG = {
    "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
    "config_groups": {"group_0": {"targets": ["Linear"], "format": "pack-quantized",
                                  "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                                              "group_size": GROUP, "dynamic": False, "actorder": None,
                                              "observer": "minmax"},
                                  "input_activations": None, "output_activations": None}},
    "ignore": ["lm_head"], "kv_cache_scheme": None}


def small_e2b() -> tuple[dict[str, Any], dict[str, Any]]:
    """E2B's structure (KV sharing, PLE, double-wide MLP) at tiny widths that fill groups of 32 (the tests')."""
    target = target_config(512, layers=7, hidden=64, intermediate=128, heads=2, kv_heads=1, head_dim=32, window=8,
                           shared=2, ple_dim=32, double_wide=True)
    return target, assistant_config(target, hidden=32, intermediate=64, heads=2, num_centroids=16, top_k=4)


def config_31b(small: bool) -> dict[str, Any]:
    """31B's text config (spec §4: 60 layers, every 6th full with 4 K=V heads of 512); tiny widths when `small`."""
    dims = (dict(layers=6, hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=32, window=8) if small else
            dict(layers=60, hidden=5376, intermediate=21504, heads=32, kv_heads=16, head_dim=256, window=1024))
    target = target_config(512 if small else FULL_VOCAB, shared=0, ple_dim=0, double_wide=False, **dims)
    target["layer_types"] = [FULL if (i + 1) % 6 == 0 else SLIDING for i in range(dims["layers"])]
    return target | {"attention_k_eq_v": True, "num_global_key_value_heads": 1 if small else 4,
                     "max_position_embeddings": 262_144}


def release_layout(config: dict[str, Any]) -> tuple[dict[str, tuple[int, ...]], list[str], dict[str, Any]]:
    """The float name table, its keys a release stores as int4, and the file's tensors: name -> (dtype, shape)."""
    table = target_weight_table(text_config_from_dict(config))
    int4 = [k for k in table if is_quantized(k) and table[k][1] % GROUP == 0]
    kinds = {"weight_packed": torch.int32, "weight_shape": torch.int64}
    specs = {"model." + k: (kinds.get(k.rpartition(".")[2], BF16), s) for k, s in int4_table(table, int4).items()}
    return table, int4, specs


def file_bytes(specs: dict[str, Any]) -> int:
    return sum(torch.Size(shape).numel() * dtype.itemsize for dtype, shape in specs.values())


def write_release(dst: Path, config: dict[str, Any], tensors: Iterator[torch.Tensor], generation: dict) -> Path:
    """config.json with the release's quantization_config, and model.safetensors streamed tensor by tensor in the
    order of `release_layout` (as bench/random_pair.py writes: nothing sits in memory but the tensor at hand)."""
    _, _, specs = release_layout(config)
    dst.mkdir(parents=True, exist_ok=True)
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in specs.items():
        size = torch.Size(shape).numel() * dtype.itemsize
        header[name] = {"dtype": CODES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # the data 8-byte aligned: every tensor can be a view of it
    with open(dst / "model.safetensors", "wb") as f, written(f"writing {dst.parent.name}/{dst.name}", offset) as done:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for (name, (dtype, shape)), t in zip(specs.items(), tensors, strict=True):
            if t.dtype != dtype or tuple(t.shape) != tuple(shape):
                raise ValueError(f"{name}: {t.dtype} {list(t.shape)}, the layout says {dtype} {list(shape)}")
            t = t.contiguous()
            f.write((ctypes.c_ubyte * (t.numel() * t.itemsize)).from_address(t.data_ptr()))  # the bytes, no copy
            done.update(t.numel() * t.itemsize)
    (dst / "config.json").write_text(json.dumps(config | {"dtype": "bfloat16",
                                                          "quantization_config": QUANTIZATION_CONFIG}, indent=2))
    (dst / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return dst


def quantized_copy(src: Path, dst: Path) -> Path:
    """The bf16 target in `src` rewritten once into `dst` as a release stores it (reused while src is the same)."""
    stamp = {"source": read_json(src.parent / "pair.json"), "format": 1}
    if (dst / "int4.json").is_file() and read_json(dst / "int4.json") == stamp:
        return dst
    config = read_json(src / "config.json")
    config.pop("dtype", None)
    table, int4, _ = release_layout(config)
    handle = safe_open(str(src / "model.safetensors"), framework="pt")

    def tensors() -> Iterator[torch.Tensor]:
        for key, shape in table.items():
            w = handle.get_tensor("model." + key)
            if key in int4:
                yield from (*quantize(w), torch.tensor(list(shape)))  # words, scales, [O, I]
            else:
                yield w.to(BF16)

    write_release(dst, config, tensors(), read_json(src / "generation_config.json"))
    (dst / "int4.json").write_text(json.dumps(stamp, indent=2))
    return dst


def random_tensors(config: dict[str, Any], seed: int = 0) -> Iterator[torch.Tensor]:
    """Random int4 words (every nibble uniform in 0..15) with scales giving weights of rms I^-1/2, as random_pair's
    N(0, 1/I), and random_pair's values elsewhere, drawn 4096 rows at a time: a 31B file never sits in memory."""
    table, int4, _ = release_layout(config)
    gen = torch.Generator().manual_seed(seed)
    for key, shape in table.items():
        if key in int4:
            o, i = shape
            yield torch.randint(-2**31, 2**31, (o, i // 8), dtype=torch.int32, generator=gen)  # (O, I/8)
            yield torch.full((o, i // GROUP), 1 / (Q_RMS * i**0.5), dtype=BF16)  # (O, G)
            yield torch.tensor(list(shape))
            continue
        out = torch.empty(shape, dtype=BF16)
        for rows in out.split(4096):
            rows.copy_(random_tensor("model." + key, tuple(rows.shape), 0, gen))
        yield out
