"""Packed weights (gemma4/packing.py): the same products and tokens as plain weights, and a plain fallback
wherever a packed copy must not serve (autograd, a changed weight, a build or dtype without oneDNN).

The test models are tiny, below `MIN_ELEMENTS`, so the loaders pack nothing by themselves: these tests
pack every weight with `min_elements=0`, through the same `pack_weights` the loaders call."""

import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import gemma4.packing
from gemma4 import Gemma4Model, greedy_generate, load_target
from gemma4.packing import MIN_ELEMENTS, Linear, linear, pack, packable
from gemma4.weights import pack_weights
from mtp import Drafter, DraftLength, load_drafter, speculative_generate
from tests.checkpoints import write_assistant, write_target

PROMPT = [2, 17, 300, 45, 99, 260, 7, 410, 33]
ROWS = range(1, 10)  # a decode step multiplies 1 row, a verify of K = 1..8 drafts K + 1


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("packing")
    target = write_target(root / "target", "e2b", multimodal=False)
    return target, write_assistant(root / "assistant", target, ordered_embeddings=False, echo=True)


def packed_pair(pair: tuple[Path, Path], dtype: torch.dtype = torch.float32) -> tuple[Gemma4Model, Drafter]:
    """The pair with every Linear and both dense heads packed."""
    target, drafter = load_target(pair[0], dtype=dtype, pack=False), load_drafter(pair[1], dtype=dtype, pack=False)
    target.head_packed = pack_weights(target, pair[0], "model.", "embed_tokens.weight", min_elements=0)
    drafter.head_packed = pack_weights(drafter, pair[1], "", "model.embed_tokens.weight", min_elements=0)
    return target, drafter


def linears(model: torch.nn.Module) -> list[Linear]:
    return [m for m in model.modules() if isinstance(m, Linear)]


def test_packed_and_plain_products_agree_fp32() -> None:
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(384, 256, generator=g) / 16  # (O, I)
    packed = pack(weight)
    for rows in ROWS:
        x = torch.randn(1, rows, 256, generator=g)  # (B, N, I)
        with torch.inference_mode():
            assert packed.serves(x, weight)
            torch.testing.assert_close(linear(x, weight, packed), F.linear(x, weight), rtol=1e-5, atol=1e-5)


def test_packed_and_plain_products_agree_bf16() -> None:
    g = torch.Generator().manual_seed(1)
    weight = (torch.randn(384, 256, generator=g) / 16).bfloat16()
    xs = [torch.randn(1, rows, 256, generator=g).bfloat16() for rows in ROWS]
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        # No oneDNN bfloat16 kernels on this CPU (AVX2 only): no copy is made, the plain product serves.
        assert not packable(weight, min_elements=0)
        assert all(torch.equal(linear(x, weight, None), F.linear(x, weight)) for x in xs)
        return
    packed = pack(weight)
    for x in xs:
        with torch.inference_mode():
            assert packed.serves(x, weight)
            # bfloat16 outputs: one rounding of an fp32 sum either way, so they differ by about one ulp
            torch.testing.assert_close(linear(x, weight, packed), F.linear(x, weight), rtol=1.6e-2, atol=1e-2)


def test_which_weights_are_packed() -> None:
    big, small = torch.empty(MIN_ELEMENTS // 1024, 1024), torch.empty(64, 64)
    assert packable(big) and not packable(small) and packable(small, min_elements=0)
    assert not packable(big.double()) and not packable(big.half()) and not packable(big.to("meta"))


def test_a_changed_weight_retires_its_packed_copy() -> None:
    weight = torch.randn(48, 32)
    packed = pack(weight)
    x = torch.randn(3, 32)
    with torch.no_grad():
        assert packed.serves(x, weight)
        weight.mul_(2)  # an optimizer step, a copy_: the version counter moves
        assert not packed.serves(x, weight)
        assert torch.equal(linear(x, weight, packed), F.linear(x, weight))
        assert not packed.serves(x, weight.clone())  # another tensor, even with the same numbers
        assert not packed.serves(x.double(), weight)
    assert not packed.serves(x, weight) and torch.is_grad_enabled()  # autograd: always the plain product


def test_packed_model_gives_the_same_tokens(pair: tuple[Path, Path]) -> None:
    plain_target, plain_drafter = load_target(pair[0], pack=False), load_drafter(pair[1], pack=False)
    target, drafter = packed_pair(pair)
    assert all(m.packed is not None for m in linears(target) + linears(drafter))
    assert target.head_packed is not None and drafter.head_packed is not None
    assert all(m.packed is None for m in linears(plain_target))
    with torch.inference_mode():
        torch.testing.assert_close(target(torch.tensor([PROMPT])), plain_target(torch.tensor([PROMPT])))
    plain = greedy_generate(plain_target, PROMPT, 24)
    assert greedy_generate(target, PROMPT, 24) == plain
    for k in (1, 4):
        ours = speculative_generate(target, drafter, PROMPT, 24, DraftLength(k))
        theirs = speculative_generate(plain_target, plain_drafter, PROMPT, 24, DraftLength(k))
        assert ours.tokens == plain and ours.stats.rounds == theirs.stats.rounds


def test_packing_leaves_the_state_dict_alone(pair: tuple[Path, Path]) -> None:
    plain = load_target(pair[0], pack=False).state_dict()
    target, _ = packed_pair(pair)
    state = target.state_dict()
    assert list(state) == list(plain)
    assert all(torch.equal(state[k], plain[k]) for k in plain)


def test_a_bf16_file_run_in_fp32_keeps_one_copy(pair: tuple[Path, Path], tmp_path: Path) -> None:
    """A cast weight is replaced by the file's (bfloat16) view once packed; the fallback casts it per call."""
    path = write_target(tmp_path / "bf16", "e2b", dtype=torch.bfloat16, multimodal=False)
    plain = load_target(path, pack=False)
    target = load_target(path, pack=False)
    target.head_packed = pack_weights(target, path, "model.", "embed_tokens.weight", min_elements=0)
    q = target.layers[0].self_attn.q_proj
    if gemma4.packing.packable(plain.layers[0].self_attn.q_proj.weight, min_elements=0):
        assert q.weight.dtype == torch.bfloat16 and q.packed.blocked.dtype == torch.float32
        assert target.embed_tokens.weight.dtype == torch.float32  # the embedding reads rows in fp32
    assert greedy_generate(target, PROMPT, 16) == greedy_generate(plain, PROMPT, 16)
    x = torch.randn(1, 2, q.in_features)
    torch.testing.assert_close(F.linear(x, q.weight.float()), plain.layers[0].self_attn.q_proj(x))  # the fallback


def test_training_a_packed_model(pair: tuple[Path, Path]) -> None:
    """Autograd takes the plain product; the optimizer's in-place step retires every packed copy."""
    target, _ = packed_pair(pair)
    target.train().requires_grad_(True)
    optimizer = torch.optim.SGD(target.parameters(), lr=1e-2)
    ids = torch.tensor([PROMPT])
    before = F.cross_entropy(target(ids)[0, :-1], ids[0, 1:])
    before.backward()
    assert all(m.weight.grad is not None for m in linears(target))
    optimizer.step()
    target.eval()
    with torch.inference_mode():
        x = torch.randn(1, 1, target.config.hidden_size)
        q = target.layers[0].self_attn.q_proj
        assert not q.packed.serves(x, q.weight)
        assert torch.equal(q(x), F.linear(x, q.weight))
        after = F.cross_entropy(target(ids)[0, :-1], ids[0, 1:])
    assert after < before  # the step took effect: the new weights are the ones multiplied


def test_a_copied_model_packs_its_own_weights(pair: tuple[Path, Path]) -> None:
    target, _ = packed_pair(pair)
    twin = copy.deepcopy(target)
    q = twin.layers[0].self_attn.q_proj
    assert q.packed.source is q.weight and q.packed.source is not target.layers[0].self_attn.q_proj.weight
    with torch.inference_mode():
        assert q.packed.serves(torch.zeros(1, q.in_features), q.weight)
    assert greedy_generate(twin, PROMPT, 12) == greedy_generate(target, PROMPT, 12)


def test_without_onednn_nothing_is_packed(pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch build without oneDNN: the loaders still load, and generation and training run plain."""
    plain = greedy_generate(load_target(pair[0], pack=False), PROMPT, 16)
    monkeypatch.setattr(gemma4.packing, "ONEDNN", False)
    target = load_target(pair[0])
    assert pack_weights(target, pair[0], "model.", "embed_tokens.weight", min_elements=0) is None
    assert all(m.packed is None for m in linears(target)) and target.head_packed is None
    assert greedy_generate(target, PROMPT, 16) == plain
    target.train().requires_grad_(True)
    loss = target(torch.tensor([PROMPT])).logsumexp(-1).mean()
    loss.backward()
    assert target.layers[0].self_attn.q_proj.weight.grad is not None
