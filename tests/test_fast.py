"""The speed layer (gemma4/fast/): a fast model computes what the textbook model computes.

Whether a weight is packed is measured at load time, so no test here depends on what the measurement finds:
the loaders' choice is checked for its form, and both branches are forced with `make_fast(..., pack=True)`
(pack wherever oneDNN can) and `pack=False` (never) on a model loaded with `fast=False`."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gemma4.fast.kernels
from gemma4 import Gemma4Model, greedy_generate, load_target
from gemma4.fast import Choice, Product, kernels_of, make_fast, products
from gemma4.fast.kernels import measure, packable
from gemma4.fast.modules import FastHead, FastLinear, StackedAttention, StackedMLP
from gemma4.model import MLP, Attention, TiedHead
from gemma4.weights import file_reader
from mtp import Drafter, DraftLength, load_drafter, speculative_generate
from tests.checkpoints import SHAPES, write_assistant, write_target

PROMPT = [2, 17, 300, 45, 99, 260, 7, 410, 33, 12, 5, 480, 77, 301, 18, 64, 9, 250, 3, 11]  # past both windows
ROWS = range(1, 10)  # a decode step multiplies 1 row, a verify of K = 1..8 drafts K + 1


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    root = tmp_path_factory.mktemp("fast")
    out = {}
    for shape in SHAPES:
        target = write_target(root / shape / "target", shape, multimodal=False)
        out[shape] = target, write_assistant(root / shape / "assistant", target, ordered_embeddings=shape == "e2b",
                                             echo=True)
    return out


def forced(pair: tuple[Path, Path], pack: bool, dtype: torch.dtype = torch.float32) -> tuple[Gemma4Model, Drafter]:
    """The pair made fast with every product plain (pack=False) or packed wherever oneDNN can (pack=True)."""
    target, drafter = load_target(pair[0], dtype=dtype, fast=False), load_drafter(pair[1], dtype=dtype, fast=False)
    make_fast(target, file_reader(pair[0], "model."), ("head", "embed_tokens.weight"), pack=pack)
    head = None if drafter.config.use_ordered_embeddings else ("head", "model.embed_tokens.weight")
    make_fast(drafter, file_reader(pair[1], ""), head, pack=pack)
    return target, drafter


def textbook(pair: tuple[Path, Path], dtype: torch.dtype = torch.float32) -> tuple[Gemma4Model, Drafter]:
    return load_target(pair[0], dtype=dtype, fast=False), load_drafter(pair[1], dtype=dtype, fast=False)


def assert_logits_close(fast: torch.Tensor, plain: torch.Tensor, exact: torch.Tensor) -> None:
    """Two float32 runs that sum in other orders: each within a few float32 roundings of the float64 run, so the
    fast one's error is bounded by a multiple of the textbook's own, or by a floor of 64 float32 ulps of the
    largest logit where the textbook's happens to be smaller (its error is not zero, only small)."""
    floor = 64 * torch.finfo(torch.float32).eps * float(exact.abs().max())
    textbook_error = float((plain.double() - exact).abs().max())
    assert float((fast.double() - exact).abs().max()) <= max(4 * textbook_error, floor)


def test_products_agree_with_f_linear_fp32() -> None:
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(384, 256, generator=g) / 16  # (O, I)
    kinds = [(False, 0)] + ([(False, 1), (False, 5), (True, 0)] if packable(weight) else [])
    for packed, onednn_rows in kinds:  # plain; plain with oneDNN for many rows; packed
        product = Product(weight, packed, onednn_rows=onednn_rows)
        for rows in ROWS:
            x = torch.randn(1, rows, 256, generator=g)  # (B, N, I)
            with torch.inference_mode():
                exact = F.linear(x.double(), weight.double())
                assert_logits_close(product(x), F.linear(x, weight), exact)


def test_products_agree_with_f_linear_bf16() -> None:
    g = torch.Generator().manual_seed(1)
    weight = (torch.randn(384, 256, generator=g) / 16).bfloat16()
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        assert not packable(weight)  # no oneDNN bfloat16 kernels on this CPU (AVX2 only): the plain product serves
    kinds = [Product(weight, False)]
    if packable(weight):
        kinds += [Product(weight, True), Product(weight, False, onednn_rows=2)]
    for product in kinds:
        for rows in ROWS:
            x = torch.randn(1, rows, 256, generator=g).bfloat16()
            with torch.inference_mode():
                # bfloat16 outputs: one rounding of an fp32 sum either way: within two bfloat16 ulps
                exact = F.linear(x.double(), weight.double())
                assert float((product(x).double() - exact).abs().max()) <= 2 * 2**-8 * float(exact.abs().max())


def test_which_weights_can_be_packed() -> None:
    weight = torch.empty(64, 64)
    assert packable(weight) == gemma4.fast.kernels.ONEDNN
    assert not packable(weight.double()) and not packable(weight.half()) and not packable(weight.to("meta"))


def test_the_measurement_times_both_ways_and_packs_only_where_faster_for_the_rows_used() -> None:
    """Its form only: which way is faster is the machine's."""
    weight = torch.randn(96, 64)
    choice, blocked = measure(weight, rows=5, reps=2)
    assert choice.shape == (96, 64) and choice.dtype == "float32" and choice.cost_s > 0
    if not packable(weight):
        assert not choice.packed and choice.plain_s is None and blocked is None
        return
    assert all(s > 0 for s in choice.plain_s + choice.packed_s)
    assert choice.packed == all(p < q for p, q in zip(choice.packed_s, choice.plain_s))  # faster for both
    assert choice.onednn_rows in ((0,) if choice.packed else (0, 5))  # a second kernel only for a plain weight
    assert (blocked is not None) == choice.packed
    verifies, blocked = measure(weight, rows=5, reps=2, decodes=False)  # a model that only verifies
    assert verifies.packed == (verifies.packed_s[1] < verifies.plain_s[1])  # the 1-row time does not count
    assert (blocked is not None) == verifies.packed
    double, _ = measure(weight.double())
    assert not double.packed and double.plain_s is None  # nothing to time without a kernel


def test_fast_false_gives_the_textbook_modules(pairs: dict[str, tuple[Path, Path]]) -> None:
    target, drafter = textbook(pairs["e2b"])
    for model in (target, drafter):
        assert not products(model) and not kernels_of(model)
        assert all(type(m) in (Attention, MLP, nn.Linear, TiedHead) for m in model.modules()
                   if isinstance(m, (Attention, MLP, nn.Linear, TiedHead)))
        assert not any(isinstance(m, (FastLinear, FastHead)) for m in model.modules())


def test_the_loaders_swap_every_projection_and_report_one_decision_per_shape(pairs: dict[str, tuple[Path, Path]]) -> None:
    target = load_target(pairs["moe"][0])
    choices = {(c.shape, c.dtype): c for c in kernels_of(target)}
    assert len(choices) == len(kernels_of(target)) and all(isinstance(c, Choice) for c in choices.values())
    for product in products(target):  # each product follows the decision of its (shape, dtype)
        assert product.packed == choices[product.shape, "float32"].packed
        assert product.onednn_rows == choices[product.shape, "float32"].onednn_rows
    for m in target.modules():
        if isinstance(m, Attention):
            assert isinstance(m, StackedAttention) != m.shared  # a shared layer has no k/v to stack
        assert not isinstance(m, MLP) or isinstance(m, StackedMLP)
    assert isinstance(target.head, FastHead)
    assert not any(type(m) is nn.Linear for m in target.modules()
                   if m not in {c for s in target.modules() if isinstance(s, (StackedAttention, StackedMLP))
                                for c in (getattr(s, n, None) for n in ("q_proj", "k_proj", "v_proj", "gate_proj",
                                                                         "up_proj")) if c is not None})


def test_stacks_hold_q_k_v_and_gate_up_as_views(pairs: dict[str, tuple[Path, Path]]) -> None:
    """Plain stacks: the parameters become views of the stacked rows, so the weights are held once."""
    target, _ = forced(pairs["e2b"], pack=False)
    attention = next(m for m in target.modules() if isinstance(m, StackedAttention))
    stack = attention.qkv.operand.t()  # ((H+2K)*D, E)
    q, k = attention.q_proj.weight, attention.k_proj.weight
    assert q.untyped_storage().data_ptr() == stack.untyped_storage().data_ptr()
    assert torch.equal(stack[:q.shape[0]], q) and torch.equal(stack[q.shape[0]:q.shape[0] + k.shape[0]], k)
    mlp = next(m for m in target.modules() if isinstance(m, StackedMLP))
    assert mlp.gate_up.operand.shape == (mlp.gate_proj.in_features, 2 * mlp.width)


def assert_same_as_textbook(fast: tuple[Gemma4Model, Drafter], plain: tuple[Gemma4Model, Drafter],
                            exact: Gemma4Model) -> None:
    """Logits within the float32 bound, and the same tokens and rounds, plain and speculative."""
    ids = torch.tensor([PROMPT])
    with torch.inference_mode():
        assert_logits_close(fast[0](ids), plain[0](ids), exact(ids.clone()))
    tokens = greedy_generate(plain[0], PROMPT, 24)
    assert greedy_generate(fast[0], PROMPT, 24) == tokens
    for k in (1, 4):
        ours = speculative_generate(*fast, PROMPT, 24, DraftLength(k))
        theirs = speculative_generate(*plain, PROMPT, 24, DraftLength(k))
        assert ours.tokens == tokens == theirs.tokens and ours.stats.rounds == theirs.stats.rounds


@pytest.mark.parametrize("shape", SHAPES)
def test_fast_and_textbook_give_the_same_tokens(pairs: dict[str, tuple[Path, Path]], shape: str) -> None:
    exact = load_target(pairs[shape][0], dtype=torch.float64, fast=False)
    plain = textbook(pairs[shape])
    assert_same_as_textbook((load_target(pairs[shape][0]), load_drafter(pairs[shape][1])), plain, exact)
    for pack in (False, True):
        assert_same_as_textbook(forced(pairs[shape], pack), plain, exact)


def test_onednn_for_many_rows_gives_the_same_tokens(pairs: dict[str, tuple[Path, Path]]) -> None:
    """Plain products that send verifies and prefills to oneDNN on the unpacked weight (as `measure` may choose)."""
    target, drafter = forced(pairs["e2b"], pack=False)
    for product in products(target) + products(drafter):
        product.onednn_rows = 2 if gemma4.fast.kernels.ONEDNN else 0  # from 2 rows; without oneDNN: never
    exact = load_target(pairs["e2b"][0], dtype=torch.float64, fast=False)
    assert_same_as_textbook((target, drafter), textbook(pairs["e2b"]), exact)


@pytest.mark.parametrize("pack", [False, True])
def test_the_state_dict_is_the_checkpoints(pairs: dict[str, tuple[Path, Path]], pack: bool) -> None:
    """Official names and values, strictly loadable into a model built from scratch."""
    raw = textbook(pairs["e2b"])[0].state_dict()
    target, _ = forced(pairs["e2b"], pack)
    state = target.state_dict()
    assert list(state) == list(raw)
    assert all(torch.equal(state[k], raw[k]) for k in raw)
    with torch.device("meta"):
        fresh = Gemma4Model(target.config)
    fresh.load_state_dict({k: v.clone() for k, v in state.items()}, strict=True, assign=True)


def test_a_fast_model_refuses_to_train_and_a_textbook_one_trains(pairs: dict[str, tuple[Path, Path]]) -> None:
    ids = torch.tensor([PROMPT])
    fast = load_target(pairs["dense"][0]).train().requires_grad_(True)
    with pytest.raises(RuntimeError, match="fast=False"):
        fast(ids)
    plain = load_target(pairs["dense"][0], fast=False).train().requires_grad_(True)
    optimizer = torch.optim.SGD(plain.parameters(), lr=1e-2)
    before = F.cross_entropy(plain(ids)[0, :-1], ids[0, 1:])
    before.backward()
    optimizer.step()
    with torch.no_grad():
        assert F.cross_entropy(plain(ids)[0, :-1], ids[0, 1:]) < before


def test_a_bf16_file_run_in_fp32_keeps_one_copy(tmp_path: Path) -> None:
    """A cast weight is replaced by the file's (bfloat16) view once packed."""
    path = write_target(tmp_path / "bf16", "e2b", dtype=torch.bfloat16, multimodal=False)
    plain = load_target(path, fast=False)
    target = load_target(path, fast=False)
    make_fast(target, file_reader(path, "model."), ("head", "embed_tokens.weight"), pack=True)
    attention = target.layers[0].self_attn
    if gemma4.fast.kernels.ONEDNN:
        assert attention.q_proj.weight.dtype == torch.bfloat16 and attention.qkv.dtype == torch.float32
        assert target.embed_tokens.weight.dtype == torch.float32  # the embedding reads rows in fp32
    assert greedy_generate(target, PROMPT, 16) == greedy_generate(plain, PROMPT, 16)


def test_without_onednn_nothing_is_packed(pairs: dict[str, tuple[Path, Path]], monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch build without oneDNN: the loaders still load, and generation runs plain."""
    expected = greedy_generate(textbook(pairs["e2b"])[0], PROMPT, 16)
    monkeypatch.setattr(gemma4.fast.kernels, "ONEDNN", False)
    target = load_target(pairs["e2b"][0])
    assert all(not c.packed and c.plain_s is None for c in kernels_of(target))
    assert all(not p.packed for p in products(target))
    assert greedy_generate(target, PROMPT, 16) == expected


def test_loading_under_inference_mode(pairs: dict[str, tuple[Path, Path]]) -> None:
    expected = greedy_generate(load_target(pairs["e2b"][0]), PROMPT, 8)
    with torch.inference_mode():
        target = load_target(pairs["e2b"][0])
    assert greedy_generate(target, PROMPT, 8) == expected
