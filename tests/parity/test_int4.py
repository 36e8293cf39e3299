"""Int4 targets (Google's QAT w4a16 layout, tests/int4_checkpoints.py) against transformers 5.22.2 with
compressed-tensors loading the same files: the E2B-like family (PLE width 32, so its per-layer projections are int4;
KV-shared layers without k/v) and the dense K=V family. transformers reads the file's quantization_config itself
(tests/tf_oracle.py `tf_target`, unchanged) and unpacks each weight to q · s in the model's dtype on the first
forward; gemma4/int4.py's `Int4Linear` forms the same q · s on every call. So:

- the weights: transformers' dequantized weights equal ours bit for bit (float32: q · s is exact);
- the logits: float32 bound against a float64 run of the same files (tests/tolerance.py), float64 to 1e-9;
- greedy tokens equal transformers' `generate`;
- `quantize="int4"` on a floating-point file gives exactly the state and the logits of the int4 file written from
  that file by the release's recipe (tests/int4_checkpoints.py `to_int4`, packed by compressed-tensors)."""

from pathlib import Path

import pytest
import torch
from torch import nn

from gemma4 import greedy_generate, load_target
from gemma4.int4 import Int4Linear, dequantize
from gemma4.engine.forward import forward_rows
from tests.checkpoints import write_target
from tests.int4_checkpoints import PLE_WIDTH, to_int4, write_int4_target
from tests.pairs import prompt
from tests.tf_oracle import tf_greedy, tf_logits, tf_target
from tests.tolerance import assert_fp32_parity

FAMILIES = ("e2b", "dense")
PREFIX = "model.language_model."


@pytest.fixture(scope="module", params=FAMILIES)
def int4_file(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    return request.param, write_int4_target(tmp_path_factory.mktemp(f"int4-{request.param}"), request.param)


@pytest.fixture(scope="module")
def models(int4_file: tuple[str, Path]):  # noqa: ANN201
    """(family, ours float32, transformers float32, ours float64, transformers float64) on the same int4 file."""
    family, path = int4_file
    return (family, load_target(path, fast=False), tf_target(path), load_target(path, dtype=torch.float64, fast=False),
            tf_target(path, dtype=torch.float64))


def test_transformers_weights_are_ours(models) -> None:  # noqa: ANN001
    """After one forward (which unpacks transformers' weights), every int4 layer's weight is our q · s exactly."""
    family, ours, theirs, _, _ = models
    tf_logits(theirs, prompt(5, 0))
    int4 = {name: m for name, m in ours.named_modules() if isinstance(m, Int4Linear)}
    assert len(int4) == {"e2b": 1 + 8 * 7 + 5 * 2, "dense": 12 * 6 + 10 * 1}[family]  # dense: K=V full layers, no v
    for name, m in int4.items():
        weight = theirs.get_submodule(PREFIX.removesuffix(".") + "." + name).weight
        assert weight.dtype == torch.float32 and torch.equal(weight, dequantize(m.weight_packed, m.weight_scale)), name


def test_full_prompt_logits(models) -> None:  # noqa: ANN001
    family, ours, theirs, ours64, theirs64 = models
    for seed, length in ((0, 5), (1, 23)):  # shorter and longer than the sliding window (8)
        ids = prompt(length, seed)
        x = torch.tensor([ids])
        assert_fp32_parity("int4 target full prompt", f"{family}, {length} tokens", forward_rows(ours, x).logits[0],
                           tf_logits(theirs, ids), forward_rows(ours64, x).logits[0], tf_logits(theirs64, ids), ours.config.num_layers)


def test_greedy_tokens_equal_transformers_generate(models) -> None:  # noqa: ANN001
    _, ours, theirs, _, _ = models
    ids = prompt(21, 6)
    tokens = greedy_generate(ours, ids, 32)
    assert tokens == tf_greedy(theirs, ids, 32)
    assert len(set(tokens)) > 3  # a degenerate model would prove nothing


@pytest.mark.parametrize("family", FAMILIES)
def test_quantize_at_load_is_the_int4_file(family: str, tmp_path: Path) -> None:
    """The release's recipe two ways: gemma4/int4.py `quantize` at load, and tests/int4_checkpoints.py on the file."""
    ple = PLE_WIDTH if family == "e2b" else None
    floating = write_target(tmp_path / "float", family, ple_width=ple)
    at_load, from_file = load_target(floating, quantize="int4"), load_target(to_int4(floating, tmp_path / "int4"))
    a, b = at_load.state_dict(), from_file.state_dict()
    assert a.keys() == b.keys()
    assert all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)
    assert not any(type(m) is nn.Linear for m in at_load.modules())  # every projection int4, the PLE ones too
    x = torch.tensor([prompt(23, 1)])
    assert torch.equal(forward_rows(at_load, x).logits, forward_rows(from_file, x).logits)
    # and int4 is not the floating-point model: each weight moves by about 10% of its size (4 bits), which these
    # tiny random models amplify to logits far from the floating-point ones
    assert not torch.allclose(forward_rows(load_target(floating), x).logits, forward_rows(at_load, x).logits, atol=0.1)
