"""Int4 weights as Google's QAT w4a16 releases ship them: the compressed-tensors `pack-quantized` layout, read
and kept packed, and the textbook's int4 linear layer that multiplies by them (weights.md: the files and ids).

Facts a reader must know:
- config.json's `quantization_config` names the scheme: `quant_method` "compressed-tensors", `format`
  "pack-quantized", one group of 4-bit signed integer weights, symmetric (no zero point), a scale per group of
  32 inputs, no activation quantization ("w4a16": the products run on 16-bit or 32-bit activations).
  `check_scheme` accepts exactly that and refuses any other scheme in one line.
- A quantized linear layer `M` stores three tensors in place of `M.weight` (O, I):
  `M.weight_packed` int32 (O, I/8), `M.weight_scale` bf16 (O, I/32), `M.weight_shape` int64 [O, I].
- Which layers: every decoder q/k/v/o/gate/up/down projection, and with Per-Layer Embeddings (E2B, E4B) also
  `per_layer_input_gate`, `per_layer_projection` and `per_layer_model_projection` (`QUANTIZED`). Embeddings,
  norms, `layer_scalar`, the router and the experts keep their floating-point weights.
- A weight is w = q · s: q an integer in -8..7, s its group's scale. q · s is exact in float32 (4 bits times
  8 bits of mantissa fit in 24), so `Int4Linear` forms the weight in float32 and the product then runs in the
  activations' dtype: a float32 run multiplies by the exact weights; a bfloat16 run rounds each weight once to
  bfloat16 (at most half a unit in the last place), as served engines computing in bfloat16 do.
- The release recipe, also what `quantize` does (load_target(..., quantize="int4")), as compressed-tensors'
  round to nearest computes it: s = max|w| / 7.5 over the group, then q = clamp(round(w / s), -8, 7), both in
  the weight's own dtype. For a bf16 weight (every release) that is bf16 arithmetic: w / s rounds to bf16
  before it rounds to an integer, and about 1% of the q differ from a division in float32. A float32 weight
  has its scale rounded to bf16 first, the dtype the layer stores.

Shape legend: O out features, I in features, G = I/32 groups, N rows (tokens).
"""

import json
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gemma4.config import ConfigError
from gemma4.weights import CheckpointError

GROUP = 32  # inputs sharing one scale
PER_WORD = 8  # 4-bit values in one int32 word
OFFSET = 8  # q in -8..7 is stored as q + 8 in 0..15: a nibble holds no sign
SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)  # (8,) element k of a word sits at bits 4·k
SCHEME = ("compressed-tensors pack-quantized int4 weights, symmetric, one scale per group of 32 inputs, "
          "no activation quantization (w4a16)")

# The module keys (in gemma4/model.py's names) whose weights the releases store as int4.
QUANTIZED = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
             "mlp.up_proj", "mlp.down_proj", "per_layer_input_gate", "per_layer_projection")
QUANTIZED_TOP = ("per_layer_model_projection",)  # on the model itself, not in a layer


def is_quantized(key: str) -> bool:
    """Whether a weight key of the name table (`layers.3.mlp.up_proj.weight`) is one the releases quantize."""
    module = key.removesuffix(".weight")
    if module in QUANTIZED_TOP:
        return True
    return module.startswith("layers.") and module.split(".", 2)[-1] in QUANTIZED and key.endswith(".weight")


def check_scheme(raw: dict) -> bool:
    """config.json (the whole file) -> whether its weights are int4 (False: no quantization config). Any scheme
    but the one this module reads is refused in one line."""
    q = raw.get("quantization_config")
    if q is None:
        return False

    def refuse(what: str) -> None:
        raise ConfigError(f"quantization_config: {what}; supported: {SCHEME}, or no quantization_config")

    def section(value: object, name: str) -> dict:
        """A part of the config that must be a JSON object (a hand-edited file may hold anything)."""
        if not isinstance(value, dict):
            refuse(f"{name} is {json.dumps(value)[:40]}, not an object")
        return value

    q = section(q, "quantization_config")
    if q.get("quant_method") != "compressed-tensors":
        refuse(f"quant_method {q.get('quant_method')!r} is not read here")
    if q.get("format") != "pack-quantized":
        refuse(f"format {q.get('format')!r} is not read here")
    groups = section(q.get("config_groups"), "config_groups")
    if len(groups) != 1:
        refuse(f"{len(groups)} config groups, expected one")
    name, group = next(iter(groups.items()))
    group = section(group, f"config_groups.{name}")
    if group.get("format") not in (None, "pack-quantized"):
        refuse(f"the group's format {group.get('format')!r} is not read here")
    w = section(group.get("weights"), f"config_groups.{name}.weights")
    wanted = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": GROUP}
    for key, value in wanted.items():
        if w.get(key) != value:
            refuse(f"weights.{key} is {w.get(key)!r}, not {value!r}")
    if w.get("actorder") not in (None, False):
        refuse(f"weights.actorder is {w.get('actorder')!r} (act-order reorders the inputs)")
    if w.get("dynamic") not in (None, False):
        refuse("weights.dynamic is set")
    if group.get("input_activations") is not None or group.get("output_activations") is not None:
        refuse("activations are quantized too")
    if q.get("kv_cache_scheme") is not None:
        refuse("the KV cache is quantized too")
    return True


# ---------------------------------------------------------------- packing

def pack(q: Tensor) -> Tensor:
    """q (O, I) integers in -8..7 -> words (O, I/8) int32. Element k of a row goes to word k // 8 at bits
    4·(k % 8): element 0 is the lowest nibble. Stored as q + 8, so every nibble is 0..15."""
    o, i = q.shape
    nibbles = (q.to(torch.int64) + OFFSET).view(o, i // PER_WORD, PER_WORD)  # (O, I/8, 8) in 0..15
    words = (nibbles << SHIFTS.to(q.device, torch.int64)).sum(-1)  # (O, I/8): disjoint bits, 0..2^32-1
    # int32 holds a word with its top bit set as a negative number: the same 32 bits.
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def unpack(words: Tensor) -> Tensor:
    """words (O, I/8) int32 -> q (O, I) int8 in -8..7. The shift is arithmetic (a negative word brings its sign
    bits down), the mask keeps the nibble alone. Words stay integers: a float would round them."""
    o = words.shape[0]
    nibbles = (words[..., None] >> SHIFTS.to(words.device)) & 0xF  # (O, I/8, 8) in 0..15
    return (nibbles.view(o, -1) - OFFSET).to(torch.int8)  # (O, I)


def dequantize(words: Tensor, scales: Tensor) -> Tensor:
    """words (O, I/8), scales (O, G) -> w (O, I) float32, exactly q · s."""
    q = unpack(words).float()  # (O, I)
    return (q.view(q.shape[0], -1, GROUP) * scales.float()[..., None]).flatten(1)  # (O, G, 32) -> (O, I)


def quantize(w: Tensor) -> tuple[Tensor, Tensor]:
    """w (O, I) floating -> words (O, I/8) int32 and scales (O, G) bf16: the release's round-to-nearest recipe,
    in w's dtype (see the module docstring)."""
    o, i = w.shape
    if i % GROUP:
        raise ConfigError(f"a weight with {i} inputs cannot be quantized in groups of {GROUP}")
    groups = w.view(o, i // GROUP, GROUP)  # (O, G, 32), in w's dtype
    scales = (groups.abs().amax(-1) / 7.5).to(torch.bfloat16)  # (O, G)
    # An all-zero group has scale 0: its q is 0 (dividing by 1 instead keeps 0 / 0 out).
    step = scales.to(w.dtype).masked_fill(scales == 0, 1.0)[..., None]  # (O, G, 1)
    # w / s in w's dtype, as compressed-tensors divides: a bf16 quotient is rounded before `round`.
    q = torch.clamp(torch.round(groups / step), -OFFSET, OFFSET - 1).view(o, i)  # (O, I)
    return pack(q), scales


# ---------------------------------------------------------------- the layer

class Int4Linear(nn.Module):
    """A linear layer without bias whose weight is stored as int4 words and bf16 scales: about 0.28 of its
    bf16 bytes (half a byte a weight, two bytes a group of 32). Its state dict is the checkpoint's triple."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight_packed", torch.empty(out_features, in_features // PER_WORD, dtype=torch.int32))
        self.register_buffer("weight_scale", torch.empty(out_features, in_features // GROUP, dtype=torch.bfloat16))
        self.register_buffer("weight_shape", torch.empty(2, dtype=torch.int64))  # [O, I], as the file has it

    def forward(self, x: Tensor) -> Tensor:
        # The weight exact in float32 (see the module docstring), then in x's dtype for the product.
        w = dequantize(self.weight_packed, self.weight_scale).to(x.dtype)  # (O, I)
        return F.linear(x, w)  # (..., I) -> (..., O)


def swap_in(model: nn.Module, keys: list[str]) -> None:
    """Replace the `nn.Linear` of each weight key (`layers.0.mlp.up_proj.weight`) by an `Int4Linear` of its
    size, before the state dict is loaded (on the meta device the new buffers take no memory)."""
    for key in keys:
        name = key.removesuffix(".weight")
        parent, _, child = name.rpartition(".")
        plain = model.get_submodule(name)
        owner = model.get_submodule(parent) if parent else model
        with torch.device("meta"):
            setattr(owner, child, Int4Linear(plain.in_features, plain.out_features))


# ---------------------------------------------------------------- what the loader asks of this module

def int4_table(table: dict[str, tuple[int, ...]], keys: list[str]) -> dict[str, tuple[int, ...]]:
    """The name table with each of `keys` (an (O, I) weight) replaced by its int4 triple."""
    out = {}
    for key, shape in table.items():
        if key not in keys:
            out[key] = shape
            continue
        o, i = shape
        base = key.removesuffix("weight")
        out |= {base + "weight_packed": (o, i // PER_WORD), base + "weight_scale": (o, i // GROUP),
                base + "weight_shape": (2,)}
    return out


def int4_layers(raw: dict, table: dict[str, tuple[int, ...]], stored: Callable[[str], bool],
                quantize_at_load: bool) -> tuple[dict[str, tuple[int, ...]], list[str], frozenset[str]]:
    """Which weight keys of a target's name table are int4 layers: those an int4 file stores packed (`stored(key)`:
    the file holds it), or, quantizing at load, those the releases pack. -> (the name table as the file has them,
    the keys, the keys to quantize as they are read)."""
    if check_scheme(raw):
        keys = [k for k in table if is_quantized(k) and stored(k + "_packed")]
        return int4_table(table, keys), keys, frozenset()
    # A layer whose inputs do not fill groups of 32 stays as it is (no release has one; tiny models do).
    keys = [k for k in table if is_quantized(k) and table[k][1] % GROUP == 0] if quantize_at_load else []
    return table, keys, frozenset(keys)


def packed_state(weight: Tensor, shape: tuple[int, ...], device: torch.device | str) -> dict[str, Tensor]:
    """A floating weight quantized at load, as a file stores it: suffix -> tensor. `shape`: the weight_shape
    recorded, the whole weight's (a tensor-parallel rank quantizes its part)."""
    words, scales = quantize(weight)
    return {"weight_packed": words.to(device), "weight_scale": scales.to(device),
            "weight_shape": torch.tensor(shape, device=device)}


def check_shapes(state: dict[str, Tensor], keys: list[str], whole: dict[str, tuple[int, ...]],
                 local: dict[str, tuple[int, ...]], prefix: str) -> None:
    """Each int4 layer's stored weight_shape must be the whole weight's (`whole`, from the config); it becomes the
    module's (`local`: a tensor-parallel rank's part, else the same)."""
    for key in keys:
        stored = state[key + "_shape"].tolist()
        if stored != list(whole[key]):
            raise CheckpointError(f"{prefix}{key}_shape is {stored}, the config implies {list(whole[key])}")
        state[key + "_shape"] = torch.tensor(local[key], device=state[key + "_shape"].device)


__all__ = ["GROUP", "Int4Linear", "QUANTIZED", "check_scheme", "check_shapes", "dequantize", "int4_layers",
           "int4_table", "is_quantized", "pack", "packed_state", "quantize",
           "swap_in", "unpack"]
