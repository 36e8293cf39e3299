"""Random Gemma 4 target/assistant pairs of any size, written in the official layout, tensor by tensor.

The benchmark needs a pair at the real E2B dimensions (gemma4/README.md §16, mtp/README.md §1), and a mid-size one,
without downloading Google's weights. Nothing here knows a tensor name: the names and shapes come from the
loaders' own tables (`target_weight_table`, `drafter_weight_table`), so the files are exactly what
`load_target` / `load_drafter` and `transformers` read.

- A safetensors file is an 8-byte header length, a JSON header (name -> dtype, shape, byte range) and
  the raw bytes. Writing it by hand lets each tensor be drawn, written and freed in turn: an E2B-sized
  file (≈ 9 GB in float32) never has to sit in memory at once, as `safetensors.save_file` would need.
- The values follow tests/checkpoints.py: norms near 1, projections N(0, 1/fan_in) so activations
  stay O(1), an input embedding with x0 = E[id]·sqrt(H) of rms 0.8, a final norm of ≈ 3.75 so logits
  have a std of ≈ 3 (the softcap is mildly active and top-1 gaps are far above fp32 noise).
- The config is the bare `gemma4_text` form (tensors under `model.`), as a saved `Gemma4ForCausalLM`.
- `random_prompt` / `text_prompt`: the benchmark's prompts for a pair, seeded or tokenized.

Shape legend: V vocab, E target hidden, D drafter hidden, P PLE width, L layers.
"""

import ctypes
import json
import struct
from pathlib import Path
from typing import Any

import torch

from bench.show import written
from gemma4.config import FULL, SLIDING
from gemma4.config_file import read_json, text_config_from_dict
from gemma4.tokenizer import Gemma4Tokenizer
from gemma4.weights import target_weight_table
from mtp.loading import drafter_config_from_dict, drafter_weight_table

STOP_IDS = [1, 106, 50]
DTYPE_CODES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.int64: "I64"}
ROPE = {
    SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
    FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
}


def e2b_configs(vocab: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """gemma-4-E2B's text config and its assistant's (gemma4/README.md §16 / mtp/README.md §1), the vocabulary cut
    to `vocab`."""
    target = target_config(vocab, layers=35, hidden=1536, intermediate=6144, heads=8, kv_heads=1,
                           head_dim=256, window=512, shared=20, ple_dim=256, double_wide=True)
    assistant = assistant_config(target, hidden=256, intermediate=2048, heads=4, num_centroids=2048, top_k=32)
    return target, assistant


def bench_configs() -> tuple[dict[str, Any], dict[str, Any]]:
    """A mid-size pair (16 layers of width 512, MLP 2048, the last 4 KV-shared, no PLE): weights of about 1M
    elements, where whether packing pays depends most on the CPU."""
    target = target_config(16384, layers=16, hidden=512, intermediate=2048, heads=8, kv_heads=2, head_dim=64,
                           window=256, shared=4, ple_dim=0, double_wide=False)
    assistant = assistant_config(target, hidden=256, intermediate=1024, heads=4, num_centroids=128, top_k=8)
    return target, assistant


def target_config(vocab: int, layers: int, hidden: int, intermediate: int, heads: int, kv_heads: int,
                  head_dim: int, window: int, shared: int, ple_dim: int, double_wide: bool) -> dict[str, Any]:
    """A `gemma4_text` config.json; full attention on every 5th layer and the last (E2B's 4:1 pattern)."""
    layer_types = [FULL if (i + 1) % 5 == 0 or i == layers - 1 else SLIDING for i in range(layers)]
    return {
        "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text",
        "vocab_size": vocab, "vocab_size_per_layer_input": vocab, "hidden_size_per_layer_input": ple_dim,
        "hidden_size": hidden, "intermediate_size": intermediate, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "num_global_key_value_heads": None,
        "head_dim": head_dim, "global_head_dim": 2 * head_dim, "layer_types": layer_types,
        "sliding_window": window, "rope_parameters": ROPE, "num_kv_shared_layers": shared,
        "use_double_wide_mlp": double_wide, "attention_k_eq_v": False, "enable_moe_block": False,
        "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": 30.0,
        "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
        "attention_bias": False, "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": [1, 106],
    }


def assistant_config(target: dict[str, Any], hidden: int, intermediate: int, heads: int, num_centroids: int,
                     top_k: int) -> dict[str, Any]:
    """A `gemma4_assistant` config.json whose 4 Q-only layers fit the target's two KV sources (mtp/README.md §1)."""
    text = {
        "model_type": "gemma4_text", "vocab_size": target["vocab_size"], "hidden_size": hidden,
        "intermediate_size": intermediate, "num_hidden_layers": 4, "layer_types": [SLIDING] * 3 + [FULL],
        "num_attention_heads": heads, "num_key_value_heads": target["num_key_value_heads"],
        "head_dim": target["head_dim"], "global_head_dim": target["global_head_dim"],
        "attention_k_eq_v": False, "sliding_window": target["sliding_window"], "rope_parameters": ROPE,
        "num_kv_shared_layers": 4, "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0,
        "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": None,
        "max_position_embeddings": target["max_position_embeddings"], "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
    }
    return {
        "architectures": ["Gemma4AssistantForCausalLM"], "model_type": "gemma4_assistant",
        "backbone_hidden_size": target["hidden_size"], "use_ordered_embeddings": True,
        "num_centroids": num_centroids, "centroid_intermediate_top_k": top_k, "tie_word_embeddings": True,
        "text_config": text,
    }


def random_tensor(name: str, shape: tuple[int, ...], ple_dim: int, gen: torch.Generator) -> torch.Tensor:
    """A fresh float32 (int64 for the token ordering) value for one tensor, chosen by its name, drawn on the
    generator's device."""
    on = {"generator": gen, "device": gen.device}
    if name.endswith("token_ordering"):
        return torch.randperm(shape[0], **on)  # (V,) a permutation: row-major [C, V/C] clusters
    if name.endswith("layer_scalar"):
        return 0.8 + 0.4 * torch.rand(shape, **on)
    if name in ("model.norm.weight",):
        return 2.5 + 2.5 * torch.rand(shape, **on)  # logits of std ≈ 3 through the tied head
    if "norm" in name:
        return 0.5 + torch.rand(shape, **on)
    if name.endswith("embed_tokens_per_layer.weight"):
        return torch.randn(shape, **on) / ple_dim**0.5  # times sqrt(P) in the model: rms 1
    if name.endswith("embed_tokens.weight"):
        return torch.randn(shape, **on) * (0.8 / shape[1] ** 0.5)  # x0 = E[id]·sqrt(H) has rms 0.8
    if name.endswith(("router.scale", "per_expert_scale")):
        return 0.5 + torch.rand(shape, **on)
    return torch.randn(shape, **on) / shape[-1] ** 0.5  # Linear [out, in], experts [X, out, in]: N(0, 1/in)


def write_safetensors(path: Path, shapes: dict[str, tuple[int, ...]], dtype: torch.dtype, seed: int,
                      ple_dim: int = 0, device: torch.device | str = "cpu") -> None:
    """Draw every tensor of `shapes` on `device` (a GPU draws an E2B-sized file in seconds, one CPU thread in
    minutes) and stream it into one safetensors file (floats cast to dtype), with a bar of the bytes written on a
    terminal (bench/show.py)."""
    dtypes = {n: torch.int64 if n.endswith("token_ordering") else dtype for n in shapes}
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes.items():
        size = torch.Size(shape).numel() * dtypes[name].itemsize
        header[name] = {"dtype": DTYPE_CODES[dtypes[name]], "shape": list(shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, so every tensor can be a view of it
    with open(path, "wb") as f, written(f"writing {path.parent.parent.name}/{path.parent.name}", offset) as done:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for i, (name, shape) in enumerate(shapes.items()):
            gen = torch.Generator(device).manual_seed(seed * 100_003 + i)  # one stream per tensor: order-independent
            t = random_tensor(name, shape, ple_dim, gen).to(dtypes[name]).cpu().contiguous()
            f.write((ctypes.c_ubyte * (t.numel() * t.itemsize)).from_address(t.data_ptr()))  # the bytes, no copy
            done.update(t.numel() * t.itemsize)


def pair_bytes(target: dict[str, Any], assistant: dict[str, Any], dtype: torch.dtype) -> int:
    """Bytes the pair's two files take (the token ordering is int64)."""
    shapes = list(target_weight_table(text_config_from_dict(target)).values())
    shapes += list(drafter_weight_table(drafter_config_from_dict(assistant)).values())
    return sum(torch.Size(s).numel() for s in shapes) * dtype.itemsize


def is_written(root: Path, target: dict[str, Any], assistant: dict[str, Any], dtype: torch.dtype, seed: int = 0
               ) -> bool:
    """Whether `write_pair` wrote this very pair under `root` already (it then reuses it)."""
    stamp = {"target": target, "assistant": assistant, "dtype": str(dtype), "seed": seed, "format": 1}
    return (root / "pair.json").is_file() and json.loads((root / "pair.json").read_text()) == stamp


def write_pair(root: Path, target: dict[str, Any], assistant: dict[str, Any], dtype: torch.dtype,
               num_assistant_tokens: int = 4, seed: int = 0, device: torch.device | str = "cpu") -> tuple[Path, Path]:
    """Write `root/target` and `root/assistant` unless the same pair is already there (drawn on any device: the
    values are random either way); return both."""
    stamp = {"target": target, "assistant": assistant, "dtype": str(dtype), "seed": seed, "format": 1}
    target_dir, assistant_dir = root / "target", root / "assistant"
    if is_written(root, target, assistant, dtype, seed):
        return target_dir, assistant_dir
    for d in (target_dir, assistant_dir):
        d.mkdir(parents=True, exist_ok=True)
    dtype_name = str(dtype).removeprefix("torch.")
    generation = {"bos_token_id": 2, "pad_token_id": 0, "eos_token_id": STOP_IDS, "do_sample": False}
    text = text_config_from_dict(target)
    table = {"model." + k: v for k, v in target_weight_table(text).items()}
    (target_dir / "config.json").write_text(json.dumps(target | {"dtype": dtype_name}, indent=2))
    (target_dir / "generation_config.json").write_text(json.dumps(generation, indent=2))
    write_safetensors(target_dir / "model.safetensors", table, dtype, seed, text.ple_dim, device)
    drafter = drafter_config_from_dict(assistant)
    (assistant_dir / "config.json").write_text(json.dumps(assistant | {"dtype": dtype_name}, indent=2))
    (assistant_dir / "generation_config.json").write_text(json.dumps(
        generation | {"num_assistant_tokens": num_assistant_tokens, "num_assistant_tokens_schedule": "constant"},
        indent=2))
    write_safetensors(assistant_dir / "model.safetensors", drafter_weight_table(drafter), dtype, seed + 1,
                      device=device)
    (root / "pair.json").write_text(json.dumps(stamp, indent=2))
    return target_dir, assistant_dir


def random_prompt(target_dir: Path, length: int) -> list[int]:
    """<bos> and seeded ids above the special tokens (0..106)."""
    raw = read_json(target_dir / "config.json")
    vocab = int(raw.get("text_config", raw)["vocab_size"])
    return [2] + torch.randint(107, vocab, (length - 1,), generator=torch.Generator().manual_seed(0)).tolist()


def text_prompt(target_dir: Path, text: str, length: int) -> list[int]:
    """`text` through the target's tokenizer; without a tokenizer.json, `length` seeded ids."""
    tok = target_dir / "tokenizer.json"
    return Gemma4Tokenizer(tok).encode_raw(text) if tok.is_file() else random_prompt(target_dir, length)
