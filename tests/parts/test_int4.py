"""gemma4/int4.py and the int4 loading of gemma4/weights.py, each part on its own against compressed-tensors (the
oracle's packing) and hand-made cases: packing and unpacking, dequantizing, the release's quantizing recipe, the
one scheme accepted and every other refused in one line, the files refused (a weight_shape that disagrees, a dense
head that is not the embedding), which layers `quantize="int4"` makes int4, and the bytes an int4 model holds
(textbook: the file's triples; speed layer: torch's CPU kernel layout, whose zeros cost what is measured here)."""

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32
from safetensors.torch import load_file, save_file
from torch import nn

from gemma4 import CheckpointError, ConfigError, greedy_generate, load_target
from gemma4.fast import kernels_of, products
from gemma4.fast.int4 import Int4Product
from gemma4.int4 import Int4Linear, check_scheme, dequantize, is_quantized, pack, quantize, unpack
from mtp import load_drafter
from tests.checkpoints import write_assistant, write_target
from tests.int4_checkpoints import QUANTIZATION_CONFIG, int4_weight, is_quantized_name, write_int4_target

PREFIX = "model.language_model."


@pytest.fixture(scope="module")
def int4_e2b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The E2B-like int4 file (PLE width 32), as a release stores it."""
    return write_int4_target(tmp_path_factory.mktemp("int4-e2b"), "e2b")


def edges() -> torch.Tensor:
    """q (4, 64): every value -8..7 at elements 0, 7, 8, 31 and 32 of some row (a word's first and last nibble,
    the next word's first, a group's last and the next group's first), both signs beside each other."""
    g = torch.Generator().manual_seed(0)
    q = torch.randint(-8, 8, (4, 64), generator=g, dtype=torch.int8)
    values = torch.arange(-8, 8, dtype=torch.int8)  # 16 values, 4 rows x 4 places
    for k, at in enumerate((0, 7, 8, 31)):
        q[:, at] = values[4 * k:4 * k + 4]
    q[:, 32] = torch.tensor([7, -8, -1, 0], dtype=torch.int8)
    return q


# ---------------------------------------------------------------- packing


def test_pack_is_compressed_tensors_packing() -> None:
    q = edges()
    assert set(q[:, [0, 7, 8, 31, 32]].flatten().tolist()) == set(range(-8, 8))
    words = pack(q)
    assert words.dtype == torch.int32 and words.shape == (4, 8)
    assert torch.equal(words, pack_to_int32(q, 4))
    assert (words < 0).any() and (words > 0).any()  # words with their top bit set and clear


def test_unpack_inverts_pack() -> None:
    g = torch.Generator().manual_seed(1)
    q = torch.randint(-8, 8, (48, 96), generator=g, dtype=torch.int8)
    assert torch.equal(unpack(pack(q)), q)
    assert unpack(pack(q)).dtype == torch.int8


def test_negative_words_unpack_right() -> None:
    """A word whose top nibble is 8..15 (element 7 >= 0) is a negative int32: its arithmetic shift brings sign bits
    down, which the mask must drop."""
    g = torch.Generator().manual_seed(2)
    q = torch.randint(-8, 8, (16, 64), generator=g, dtype=torch.int8)
    q[:, 7::8] = torch.randint(0, 8, (16, 8), generator=g, dtype=torch.int8)  # every word's top nibble >= 8
    words = pack_to_int32(q, 4)
    assert (words < 0).all()
    assert torch.equal(unpack(words), q)
    assert torch.equal(unpack(words), unpack_from_int32(words, 4, torch.Size([16, 64])))
    # one word by hand: nibbles 15 (q 7) at the top, 0 (q -8) elsewhere = 0xF0000000, int32 -2^28
    word = torch.tensor([[-(1 << 28)]], dtype=torch.int32)
    assert unpack(word).tolist() == [[-8] * 7 + [7]]


def test_dequantize_is_q_times_s_exactly() -> None:
    g = torch.Generator().manual_seed(3)
    q = torch.randint(-8, 8, (32, 128), generator=g, dtype=torch.int8)
    scales = (torch.rand(32, 4, generator=g) * 0.2).bfloat16()  # (O, I/32)
    expected = q.float() * scales.float().repeat_interleave(32, dim=1)  # 4 bits x 8 bits: exact in float32
    w = dequantize(pack_to_int32(q, 4), scales)
    assert w.dtype == torch.float32 and torch.equal(w, expected)


# ---------------------------------------------------------------- the recipe


def compressed_tensors_rtn(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w (O, I) -> words and scales as compressed-tensors computes them: its min-max observer's range per group of
    32, `calculate_qparams`, `quantize` and `pack_to_int32`, with the release's scheme (QUANTIZATION_CONFIG)."""
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import quantize as ct_quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    args = QuantizationArgs(**QUANTIZATION_CONFIG["config_groups"]["group_0"]["weights"])
    groups = w.view(w.shape[0], -1, 32)  # (O, G, 32)
    scale, zero = calculate_qparams(groups.amin(-1), groups.amax(-1), args)  # (O, G) each, in w's dtype
    q = ct_quantize(w, scale, zero, args, dtype=torch.int8)  # (O, I)
    return pack_to_int32(q, 4), scale


def test_quantize_is_compressed_tensors_rtn_on_bf16_weights() -> None:
    """On bf16 weights (what a release is quantized from) the words and scales are compressed-tensors' own; a
    division in float32 would differ in about 1% of the integers."""
    g = torch.Generator().manual_seed(4)
    w = (torch.randn(64, 256, generator=g) / 8).bfloat16()
    w[3, 32:64] = 0  # an all-zero group: scale 0 (compressed-tensors: its eps), q 0
    words, scales = quantize(w)
    expected_words, expected_scales = compressed_tensors_rtn(w)
    assert torch.equal(words, expected_words)
    nonzero = expected_scales.float() > 1e-2  # the all-zero group's scale is 0 here, eps there: q 0 either way
    assert scales.dtype == torch.bfloat16 and torch.equal(scales[nonzero], expected_scales[nonzero])
    assert float(scales[3, 1]) == 0
    in_float32 = torch.round(w.float().view(64, 8, 32) / scales.float().clamp_min(1e-30)[..., None]).clamp(-8, 7)
    differ = (unpack(words).view(64, 8, 32).float() != in_float32).float().mean()
    assert 0 < differ < 0.05, differ  # the recipe's dtype matters, and the test sees it


def test_quantize_follows_the_release_recipe() -> None:
    g = torch.Generator().manual_seed(4)
    w = torch.randn(16, 96, generator=g) / 8
    w[3, 32:64] = 0  # an all-zero group: scale 0, q 0
    w[5, :32] = torch.linspace(-7.5, 7.5, 32)  # max 7.5: scale exactly 1, so +7.5 is 7.5 / s, clamped to 7
    words, scales = quantize(w)
    q, expected_scales = int4_weight(w)  # tests/int4_checkpoints.py: the recipe on float32 weights
    assert scales.dtype == torch.bfloat16 and torch.equal(scales, expected_scales)
    assert torch.equal(words, pack_to_int32(q, 4))
    # By hand, the cases the recipe has to get right.
    assert float(scales[3, 1]) == 0 and (unpack(words)[3, 32:64] == 0).all()
    assert float(scales[5, 0]) == 1.0
    assert unpack(words)[5, 31] == 7 and unpack(words)[5, 0] == -8  # round(7.5) = 8 -> 7; round(-7.5) = -8
    assert torch.equal(scales.float(), (w.view(16, 3, 32).abs().amax(-1) / 7.5).bfloat16().float())
    with pytest.raises(ConfigError, match="32"):
        quantize(torch.randn(4, 40))


def test_is_quantized_names_the_releases_layers() -> None:
    """The implementation's list against the names the release's files quantize (tests/int4_checkpoints.py)."""
    model_keys = ["embed_tokens.weight", "norm.weight", "per_layer_model_projection.weight",
                  "per_layer_projection_norm.weight", "embed_tokens_per_layer.weight"]
    for layer in (0, 11):
        model_keys += [f"layers.{layer}.{n}" for n in (
            "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
            "self_attn.q_norm.weight", "self_attn.k_norm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
            "mlp.down_proj.weight", "per_layer_input_gate.weight", "per_layer_projection.weight",
            "post_per_layer_input_norm.weight", "input_layernorm.weight", "layer_scalar", "router.proj.weight",
            "router.scale", "experts.gate_up_proj", "experts.down_proj")]
    chosen = [k for k in model_keys if is_quantized(k)]
    assert chosen == [k for k in model_keys if is_quantized_name(PREFIX + k)]
    assert len(chosen) == 1 + 2 * 9


# ---------------------------------------------------------------- the scheme


def refused(change) -> str:  # noqa: ANN001 (a function editing the config)
    raw = {"model_type": "gemma4", "quantization_config": copy.deepcopy(QUANTIZATION_CONFIG)}
    change(raw["quantization_config"])
    with pytest.raises(ConfigError) as e:
        check_scheme(raw)
    return str(e.value)


def weights(key: str, value: object):  # noqa: ANN201
    return lambda q: q["config_groups"]["group_0"]["weights"].__setitem__(key, value)


OTHER_SCHEMES = {
    "float-quantized": lambda q: q.__setitem__("format", "float-quantized"),
    "naive-quantized": lambda q: q.__setitem__("format", "naive-quantized"),
    "8 bits": weights("num_bits", 8),
    "asymmetric": weights("symmetric", False),
    "act-order": weights("actorder", "group"),
    "per channel": weights("strategy", "channel"),
    "quantized activations": lambda q: q["config_groups"]["group_0"].__setitem__(
        "input_activations", {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token"}),
    "quantized KV cache": lambda q: q.__setitem__(
        "kv_cache_scheme", {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor"}),
    "other method": lambda q: q.__setitem__("quant_method", "gptq"),
    "the group's own format": lambda q: q["config_groups"]["group_0"].__setitem__("format", "float-quantized"),
}


@pytest.mark.parametrize(("config", "field"), [
    ("w4a16", "quantization_config is \"w4a16\""),
    (["compressed-tensors"], "quantization_config is [\"compressed-tensors\"]"),
    ({**QUANTIZATION_CONFIG, "config_groups": [{"weights": {}}]}, "config_groups is [{\"weights\": {}}]"),
    ({**QUANTIZATION_CONFIG, "config_groups": {"group_0": None}}, "config_groups.group_0 is null"),
    ({**QUANTIZATION_CONFIG, "config_groups": {"group_0": {"weights": "int4"}}}, "config_groups.group_0.weights is"),
])
def test_a_malformed_quantization_config_is_one_line_naming_the_field(config: object, field: str,
                                                                      tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        check_scheme({"quantization_config": config})
    assert str(e.value).startswith(f"quantization_config: {field}") and "not an object" in str(e.value)
    assert "\n" not in str(e.value)
    path = write_target(tmp_path / "t", "e2b")  # and through the loader: the same line, no traceback
    raw = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(raw | {"quantization_config": config}))
    with pytest.raises(ConfigError, match="not an object"):
        load_target(path)


def test_check_scheme_accepts_the_release_and_plain_files() -> None:
    assert check_scheme({"quantization_config": copy.deepcopy(QUANTIZATION_CONFIG)}) is True
    assert check_scheme({"model_type": "gemma4"}) is False


@pytest.mark.parametrize("case", OTHER_SCHEMES)
def test_every_other_scheme_is_refused_in_one_line(case: str) -> None:
    message = refused(OTHER_SCHEMES[case])
    assert "\n" not in message
    assert "supported: " in message and "pack-quantized" in message and "group of 32" in message


# ---------------------------------------------------------------- loading


def quantized_names(path: Path) -> list[str]:
    return [n for n in load_file(path / "model.safetensors") if n.endswith(".weight_packed")]


def test_the_int4_file_loads_packed(int4_e2b: Path) -> None:
    model = load_target(int4_e2b)
    int4 = {name for name, m in model.named_modules() if isinstance(m, Int4Linear)}
    assert {PREFIX + n + ".weight_packed" for n in int4} == set(quantized_names(int4_e2b))
    assert len(int4) == 1 + 8 * 7 + 5 * 2  # the model's projection, 7 a layer, k and v on the 5 unshared layers
    assert not any(type(m) is nn.Linear for m in model.modules())
    tensors = load_file(int4_e2b / "model.safetensors")
    up = model.layers[2].mlp.up_proj
    for name in ("weight_packed", "weight_scale", "weight_shape"):  # the file's triple, as stored
        stored = tensors[PREFIX + "layers.2.mlp.up_proj." + name]
        assert getattr(up, name).dtype == stored.dtype and torch.equal(getattr(up, name), stored)


def test_quantize_at_load_leaves_narrow_layers_float(tmp_path: Path) -> None:
    """PLE width 8 (tests/checkpoints.py's E2B-like shape): per_layer_projection has 8 inputs, no group of 32, and
    stays float; every other quantized layer is int4."""
    model = load_target(write_target(tmp_path, "e2b"), quantize="int4")
    float_layers = {name for name, m in model.named_modules() if type(m) is nn.Linear}
    assert float_layers == {f"layers.{i}.per_layer_projection" for i in range(8)}
    assert sum(isinstance(m, Int4Linear) for m in model.modules()) == 1 + 8 * 6 + 5 * 2
    with pytest.raises(ConfigError, match="int4"):
        load_target(tmp_path, quantize="int8")



def test_the_speed_layer_reports_the_layers_no_kernel_takes(tmp_path: Path) -> None:
    """The 8-row per_layer_input_gate fits no int4 kernel (the CPU one needs rows in sixteens): it stays the
    textbook's layer, and `kernels_of` lists that decision beside the kernels'."""
    model = load_target(write_target(tmp_path, "e2b"), quantize="int4", fast=True)
    decisions = {c.shape: c.kernels for c in kernels_of(model) if c.dtype.startswith("int4")}
    assert decisions[(8, 64)] == ("dequantize", "dequantize") and decisions[(64, 64)] == ("int4", "int4")
    assert isinstance(model.layers[0].per_layer_input_gate, Int4Linear)


def edited(src: Path, dst: Path, edit) -> Path:  # noqa: ANN001 (a function editing the tensors)
    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    edit(tensors)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def test_a_weight_shape_that_disagrees_is_refused(int4_e2b: Path, tmp_path: Path) -> None:
    key = PREFIX + "layers.1.self_attn.o_proj.weight_shape"
    path = edited(int4_e2b, tmp_path / "t", lambda t: t.__setitem__(key, torch.tensor([64, 96])))
    with pytest.raises(CheckpointError, match=r"o_proj\.weight_shape is \[64, 96\].*\[64, 64\]"):
        load_target(path)


@pytest.mark.parametrize(("part", "dtype", "expected"), [
    ("weight_packed", torch.int16, "stored as I16, expected I32"),  # same shape: its nibbles would read other weights
    ("weight_packed", torch.float32, "stored as F32, expected I32"),
    ("weight_scale", torch.int32, "stored as I32, expected F64 or F32 or F16 or BF16"),
    ("weight_shape", torch.float32, "stored as F32, expected I64 or I32"),
])
def test_an_int4_tensor_of_another_dtype_is_refused(int4_e2b: Path, tmp_path: Path, part: str, dtype: torch.dtype,
                                                    expected: str) -> None:
    key = PREFIX + "layers.1.mlp.down_proj." + part
    path = edited(int4_e2b, tmp_path / "t", lambda t: t.__setitem__(key, t[key].to(dtype)))
    for fast in (False, True):
        with pytest.raises(CheckpointError, match=f"tensor {key} is {expected}: the file is not a checkpoint"):
            load_target(path, fast=fast)


def test_a_floating_weight_stored_as_integers_is_refused(tmp_path: Path) -> None:
    src = write_target(tmp_path / "float", "e2b")
    key = PREFIX + "layers.0.mlp.up_proj.weight"
    path = edited(src, tmp_path / "t", lambda t: t.__setitem__(key, t[key].to(torch.int32)))
    with pytest.raises(CheckpointError, match=f"tensor {key} is stored as I32, expected F64 or F32"):
        load_target(path)


@pytest.mark.parametrize("member", ["self_attn.k_proj", "mlp.up_proj"])
def test_a_stacked_group_with_one_float_member_runs_on_the_speed_layer(int4_e2b: Path, tmp_path: Path,
                                                                       member: str) -> None:
    """An ignore list that leaves one of q/k/v or gate/up floating point: the speed layer multiplies each member
    alone, and gives the textbook's tokens."""
    base = PREFIX + f"layers.1.{member}."

    def unquantize(t: dict[str, torch.Tensor]) -> None:
        t[base + "weight"] = dequantize(t.pop(base + "weight_packed"), t.pop(base + "weight_scale"))
        del t[base + "weight_shape"]
    path = edited(int4_e2b, tmp_path / "t", unquantize)
    textbook, fast = load_target(path), load_target(path, fast=True)
    assert not isinstance(textbook.get_submodule(f"layers.1.{member}"), Int4Linear)
    prompt = [2, 5, 17, 99, 300, 41, 5, 17]
    assert greedy_generate(fast, prompt, 12) == greedy_generate(textbook, prompt, 12)


def test_a_dense_head_must_be_the_embedding(int4_e2b: Path, tmp_path: Path) -> None:
    embedding = PREFIX + "embed_tokens.weight"
    same = edited(int4_e2b, tmp_path / "same", lambda t: t.__setitem__("lm_head.weight", t[embedding].clone()))
    reference, loaded = load_target(int4_e2b).state_dict(), load_target(same).state_dict()
    assert reference.keys() == loaded.keys() and all(torch.equal(reference[k], loaded[k]) for k in reference)

    def other(t: dict[str, torch.Tensor]) -> None:
        t["lm_head.weight"] = t[embedding].clone()
        t["lm_head.weight"][300, 5] += 1
    with pytest.raises(CheckpointError, match="lm_head.weight differs from embed_tokens.weight"):
        load_target(edited(int4_e2b, tmp_path / "other", other))


def test_a_quantized_assistant_is_refused(int4_e2b: Path, tmp_path: Path) -> None:
    assistant = write_assistant(tmp_path / "assistant", int4_e2b, ordered_embeddings=True)
    load_drafter(assistant)  # as written: floating point
    config = json.loads((assistant / "config.json").read_text())
    (assistant / "config.json").write_text(json.dumps(config | {"quantization_config": QUANTIZATION_CONFIG}))
    with pytest.raises(ConfigError, match="assistants load in floating point only"):
        load_drafter(assistant)


# ---------------------------------------------------------------- bytes


def test_textbook_int4_layers_hold_under_0_3_of_their_bf16_bytes(int4_e2b: Path) -> None:
    """Half a byte a weight and a bf16 scale per 32: (0.5 + 2 / 32) / 2 = 0.28 of bf16's 2 bytes, and the shape."""
    model = load_target(int4_e2b, dtype=torch.bfloat16)
    layers = [m for m in model.modules() if isinstance(m, Int4Linear)]
    held = sum(b.numel() * b.element_size() for m in layers for b in m.buffers())
    bf16 = sum(2 * m.out_features * m.in_features for m in layers)
    assert held <= 0.3 * bf16
    assert held == sum((0.5 + 2 / 32) * m.out_features * m.in_features + 16 for m in layers)


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32))
def test_speed_layer_int4_bytes(int4_e2b: Path, dtype: torch.dtype) -> None:
    """torch's CPU kernel holds half a byte a weight and, per group of 32, a scale and a zero in the activations'
    dtype: (0.5 + 4 / 32) / 2 = 0.3125 of bf16's bytes in a bfloat16 model, (0.5 + 8 / 32) / 2 = 0.375 in float32."""
    model = load_target(int4_e2b, dtype=dtype, fast=True)
    int4 = [p for p in products(model) if isinstance(p, Int4Product)]
    # every int4 weight of the textbook's model multiplied by the kernel (q/k/v and gate/up stacked)
    textbook = [m for m in load_target(int4_e2b, dtype=dtype).modules() if isinstance(m, Int4Linear)]
    assert len(int4) == 1 + 8 * 6 and all(p.choice.kernels == ("int4", "int4") for p in int4)
    assert sum(p.shape[0] * p.shape[1] for p in int4) == sum(m.out_features * m.in_features for m in textbook)
    ratio = sum(p.nbytes() for p in int4) / sum(2 * p.shape[0] * p.shape[1] for p in int4)
    per_group = 2 * torch.finfo(dtype).bits // 8  # a scale and a zero
    assert ratio == (0.5 + per_group / 32) / 2 == {torch.bfloat16: 0.3125, torch.float32: 0.375}[dtype]
