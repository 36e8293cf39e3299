"""The speed layer (gemma4/fast/): a fast model computes what the textbook model computes.

Which kernel multiplies a weight is a rule of the device, dtype and shape (gemma4/fast/kernels.py `choose`): the
rule is checked on given weights and for reading no clock, and every choice is forced in turn with
`make_fast(..., kernels=...)` (for 1 row and for 2 or more: packed, or plain with MKL or oneDNN for each) on a model
loaded with `fast=False`: the test pairs' weights are all under the rule's threshold."""

import random
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gemma4.fast.kernels
from gemma4 import Gemma4Model, greedy_generate, load_target
from gemma4.fast import Choice, Product, kernels_of, make_fast, products
from gemma4.fast.kernels import NO_KERNEL, PACK_MIN, choose, packable
from gemma4.fast.modules import FastHead, FastLinear, StackedAttention, StackedMLP
from gemma4.model import MLP, Attention, TiedHead
from gemma4.weights import file_reader
from mtp import Drafter, DraftLength, load_drafter, speculative_generate
from gemma4.engine.forward import forward_rows
from tests.checkpoints import SHAPES, write_target

PROMPT = [2, 17, 300, 45, 99, 260, 7, 410, 33, 12, 5, 480, 77, 301, 18, 64, 9, 250, 3, 11]  # past both windows
ROWS = range(1, 10)  # a decode step multiplies 1 row, a verify of K = 1..8 drafts K + 1
PLAIN, PACKED = ("mkl", "mkl"), ("packed", "packed")  # kernels for (1 row, 2 or more rows)
ONEDNN = [("onednn", "onednn"), ("mkl", "onednn"), ("onednn", "mkl")]  # oneDNN on the plain weight, per row count


@pytest.fixture(scope="module")
def pairs(make_pair) -> dict[str, tuple[Path, Path]]:  # noqa: ANN001 (conftest.py)
    return {shape: make_pair(shape, ordered_embeddings=shape == "e2b", echo=True, multimodal=False)
            for shape in SHAPES}


def forced(pair: tuple[Path, Path], kernels: tuple[str, str], dtype: torch.dtype = torch.float32
           ) -> tuple[Gemma4Model, Drafter]:
    """The pair made fast with `kernels` for 1 row and for 2 or more on every product, wherever oneDNN can."""
    target, drafter = load_target(pair[0], dtype=dtype, fast=False), load_drafter(pair[1], dtype=dtype, fast=False)
    make_fast(target, file_reader(pair[0], "model."), ("head", "embed_tokens.weight"), kernels=kernels)
    head = None if drafter.config.use_ordered_embeddings else ("head", "model.embed_tokens.weight")
    make_fast(drafter, file_reader(pair[1], ""), head, kernels=kernels)
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


def kinds(weight: torch.Tensor) -> list[Product]:
    """The weight prepared every way: plain with MKL or oneDNN for each row count, and packed (where oneDNN can)."""
    if not packable(weight):
        return [Product(weight, False)]
    return [Product(weight, False, onednn=(one, many)) for one in (False, True) for many in (False, True)] + [
        Product(weight, True)]


def test_products_agree_with_f_linear_fp32() -> None:
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(384, 256, generator=g) / 16  # (O, I)
    for product in kinds(weight):
        for shape in [(1, rows, 256) for rows in ROWS] + [(3, 1, 256), (2, 4, 256)]:  # (B, N, I)
            x = torch.randn(*shape, generator=g)
            with torch.inference_mode():
                exact = F.linear(x.double(), weight.double())
                assert_logits_close(product(x), F.linear(x, weight), exact)


def test_products_agree_with_f_linear_bf16() -> None:
    g = torch.Generator().manual_seed(1)
    weight = (torch.randn(384, 256, generator=g) / 16).bfloat16()
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        assert not packable(weight)  # no oneDNN bfloat16 kernels on this CPU (AVX2 only): the plain product serves
    for product in kinds(weight):
        for rows in ROWS:
            x = torch.randn(1, rows, 256, generator=g).bfloat16()
            with torch.inference_mode():
                # bfloat16 outputs: one rounding of an fp32 sum either way: within two bfloat16 ulps
                exact = F.linear(x.double(), weight.double())
                assert float((product(x).double() - exact).abs().max()) <= 2 * 2**-8 * float(exact.abs().max())


def kernel_called(product: Product, x: torch.Tensor) -> str:
    """Which kernel a product multiplied x by: "onednn" (packed or not) or "mkl"."""
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
        product(x)
    names = {e.key for e in prof.key_averages()}
    assert ("mkldnn::_linear_pointwise" in names) != ("aten::mm" in names)
    return "onednn" if "mkldnn::_linear_pointwise" in names else "mkl"


def test_each_row_count_goes_to_its_kernel() -> None:
    """1 row (B = T = 1) to the 1-row kernel; any more, by batch or by tokens, to the other (without oneDNN:
    MKL for both)."""
    weight = torch.randn(48, 32)
    for product in kinds(weight):
        one, many = ("onednn" if flag else "mkl" for flag in product.onednn)
        assert kernel_called(product, torch.randn(1, 1, 32)) == kernel_called(product, torch.randn(32)) == one
        assert all(kernel_called(product, torch.randn(*shape)) == many for shape in ((1, 2, 32), (3, 1, 32), (5, 32)))


def test_which_weights_can_be_packed() -> None:
    weight = torch.empty(64, 64)
    assert packable(weight) == gemma4.fast.kernels.ONEDNN
    assert not packable(weight.double()) and not packable(weight.half()) and not packable(weight.to("meta"))


def test_the_rule_packs_from_pack_min_elements_where_onednn_can() -> None:
    """Packed for every row count from PACK_MIN elements on, where oneDNN has a kernel; plain below it, and plain
    wherever it has none (another dtype, bfloat16 without oneDNN's bfloat16 kernels, another device)."""
    large, small = torch.empty(PACK_MIN // 1024, 1024), torch.empty(PACK_MIN // 1024 - 1, 1024)
    assert choose(large).kernels == (PACKED if packable(large) else PLAIN) and choose(small).kernels == PLAIN
    assert choose(large).shape == (PACK_MIN // 1024, 1024) and choose(large).dtype == "float32"
    bf16 = large.to(torch.bfloat16)
    assert choose(bf16).packed == (gemma4.fast.kernels.ONEDNN and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    for other in (large.double(), large.to("meta")):
        assert choose(other).kernels == PLAIN and choose(other).why == NO_KERNEL
    with pytest.raises(ValueError, match="one layout"):
        gemma4.fast.kernels.forced(large, ("packed", "mkl"))


def test_timing_noise_changes_no_choice(pairs: dict[str, tuple[Path, Path]], monkeypatch: pytest.MonkeyPatch) -> None:
    """One machine, the same choices on every load: the rule reads no clock, so a clock off by up to ±30% on every
    reading leaves every decision as it was."""
    assert not hasattr(gemma4.fast.kernels, "time")  # no timer in the module that decides
    weights = [torch.empty(PACK_MIN // 1024, 1024), torch.empty(512, 512), torch.empty(1536, 12288)]
    expected = [choose(w) for w in weights]
    target = load_target(pairs["moe"][0], fast=True)
    loaded = kernels_of(target)
    clock, noise = time.perf_counter, random.Random(0)
    monkeypatch.setattr(time, "perf_counter", lambda: clock() * noise.uniform(0.7, 1.3))
    for _ in range(20):
        assert [choose(w) for w in weights] == expected
    assert kernels_of(load_target(pairs["moe"][0], fast=True)) == loaded


def test_fast_false_gives_the_textbook_modules(pairs: dict[str, tuple[Path, Path]]) -> None:
    target, drafter = textbook(pairs["e2b"])
    for model in (target, drafter):
        assert not products(model) and not kernels_of(model)
        assert all(type(m) in (Attention, MLP, nn.Linear, TiedHead) for m in model.modules()
                   if isinstance(m, (Attention, MLP, nn.Linear, TiedHead)))
        assert not any(isinstance(m, (FastLinear, FastHead)) for m in model.modules())


def test_the_loaders_swap_every_projection_and_report_one_decision_per_shape(pairs: dict[str, tuple[Path, Path]]) -> None:
    target = load_target(pairs["moe"][0], fast=True)
    choices = {(c.shape, c.dtype): c for c in kernels_of(target)}
    assert len(choices) == len(kernels_of(target)) and all(isinstance(c, Choice) for c in choices.values())
    for product in products(target):  # each product follows the decision of its (shape, dtype)
        choice = choices[product.shape, "float32"]
        assert product.packed == choice.packed and product.onednn == choice.onednn and product.choice is choice
        assert choice.kernels == PACKED if choice.packed else "packed" not in choice.kernels
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
    target, _ = forced(pairs["e2b"], PLAIN)
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
        assert_logits_close(forward_rows(fast[0], ids).logits, forward_rows(plain[0], ids).logits,
                            forward_rows(exact, ids.clone()).logits)
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
    assert_same_as_textbook((load_target(pairs[shape][0], fast=True), load_drafter(pairs[shape][1], fast=True)), plain, exact)
    for kernels in (PLAIN, PACKED):
        assert_same_as_textbook(forced(pairs[shape], kernels), plain, exact)


@pytest.mark.parametrize("kernels", ONEDNN)
def test_onednn_on_the_plain_weight_gives_the_same_tokens(pairs: dict[str, tuple[Path, Path]],
                                                          kernels: tuple[str, str]) -> None:
    """Plain products that send 1 row, or 2 or more (verifies, prefills), or both to oneDNN on the unpacked weight,
    as `make_fast(..., kernels=...)` can force."""
    for shape in SHAPES:
        fast = forced(pairs[shape], kernels)
        assert all(p.onednn == (kernels[0] == "onednn", kernels[1] == "onednn") or not gemma4.fast.kernels.ONEDNN
                   for p in products(fast[0]) + products(fast[1]))
        exact = load_target(pairs[shape][0], dtype=torch.float64, fast=False)
        assert_same_as_textbook(fast, textbook(pairs[shape]), exact)


@pytest.mark.parametrize("kernels", [PLAIN, PACKED])
def test_the_state_dict_is_the_checkpoints(pairs: dict[str, tuple[Path, Path]], kernels: tuple[str, str]) -> None:
    """Official names and values, strictly loadable into a model built from scratch."""
    raw = textbook(pairs["e2b"])[0].state_dict()
    target, _ = forced(pairs["e2b"], kernels)
    state = target.state_dict()
    assert list(state) == list(raw)
    assert all(torch.equal(state[k], raw[k]) for k in raw)
    with torch.device("meta"):
        fresh = Gemma4Model(target.config)
    fresh.load_state_dict({k: v.clone() for k, v in state.items()}, strict=True, assign=True)


def test_a_fast_model_refuses_to_train_and_a_textbook_one_trains(pairs: dict[str, tuple[Path, Path]]) -> None:
    ids = torch.tensor([PROMPT])
    fast = load_target(pairs["dense"][0], fast=True).train().requires_grad_(True)
    with pytest.raises(RuntimeError, match="fast=False"):
        forward_rows(fast, ids).logits
    plain = load_target(pairs["dense"][0], fast=False).train().requires_grad_(True)
    optimizer = torch.optim.SGD(plain.parameters(), lr=1e-2)
    before = F.cross_entropy(forward_rows(plain, ids).logits[0, :-1], ids[0, 1:])
    before.backward()
    optimizer.step()
    with torch.no_grad():
        assert F.cross_entropy(forward_rows(plain, ids).logits[0, :-1], ids[0, 1:]) < before


def test_a_bf16_file_run_in_fp32_keeps_one_copy(tmp_path: Path) -> None:
    """A cast weight is replaced by the file's (bfloat16) view once packed."""
    path = write_target(tmp_path / "bf16", "e2b", dtype=torch.bfloat16, multimodal=False)
    plain = load_target(path, fast=False)
    target = load_target(path, fast=False)
    make_fast(target, file_reader(path, "model."), ("head", "embed_tokens.weight"), kernels=PACKED)
    attention = target.layers[0].self_attn
    if gemma4.fast.kernels.ONEDNN:
        assert attention.q_proj.weight.dtype == torch.bfloat16 and attention.qkv.dtype == torch.float32
        assert target.embed_tokens.weight.dtype == torch.float32  # the embedding reads rows in fp32
    assert greedy_generate(target, PROMPT, 16) == greedy_generate(plain, PROMPT, 16)


def test_without_onednn_nothing_is_packed(pairs: dict[str, tuple[Path, Path]], monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch build without oneDNN: the loaders still load, and generation runs plain."""
    expected = greedy_generate(textbook(pairs["e2b"])[0], PROMPT, 16)
    monkeypatch.setattr(gemma4.fast.kernels, "ONEDNN", False)
    target = load_target(pairs["e2b"][0], fast=True)
    assert all(not c.packed and c.kernels == PLAIN and c.why == NO_KERNEL for c in kernels_of(target))
    assert all(not p.packed for p in products(target))
    assert greedy_generate(target, PROMPT, 16) == expected


def test_loading_under_inference_mode(pairs: dict[str, tuple[Path, Path]]) -> None:
    expected = greedy_generate(load_target(pairs["e2b"][0], fast=True), PROMPT, 8)
    with torch.inference_mode():
        target = load_target(pairs["e2b"][0], fast=True)
    assert greedy_generate(target, PROMPT, 8) == expected


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_fast_rms_norm_is_the_textbook_norm(dtype: torch.dtype) -> None:
    """fast_rms_norm against gemma4/norms.py's formula, both measured against float64: the fast one's error is
    at most a few of the output dtype's roundings (float64: to 1e-12), with a weight and without."""
    from gemma4.fast.norms import fast_rms_norm
    from gemma4.norms import rms_norm
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 5, 64, generator=g) * 3, torch.randn(64, generator=g)
    for weight in (w, None):
        exact = rms_norm(x.double(), None if weight is None else weight.double(), 1e-6)
        fast = fast_rms_norm(x.to(dtype), None if weight is None else weight.to(dtype), 1e-6)
        plain = rms_norm(x.to(dtype), None if weight is None else weight.to(dtype), 1e-6)
        assert fast.dtype == plain.dtype == dtype
        ulp = 1e-12 if dtype == torch.float64 else torch.finfo(dtype).eps
        bound = 4 * ulp * float(exact.abs().max())
        assert float((fast.double() - exact).abs().max()) <= bound
        assert float((plain.double() - exact).abs().max()) <= bound


def test_the_speed_layer_swaps_every_norm_and_keeps_its_weight(pairs: dict[str, tuple[Path, Path]]) -> None:
    from gemma4.fast.norms import FastRMSNorm
    from gemma4.norms import RMSNorm
    target, fast = load_target(pairs["e2b"][0], fast=False), load_target(pairs["e2b"][0], fast=True)
    plain_norms = {n: m for n, m in target.named_modules() if isinstance(m, RMSNorm)}
    fast_norms = {n: m for n, m in fast.named_modules() if isinstance(m, FastRMSNorm)}
    assert plain_norms and set(plain_norms) == set(fast_norms)
    assert not any(type(m) is RMSNorm for m in fast.modules())
    assert target.state_dict().keys() == fast.state_dict().keys()
    for name, norm in fast_norms.items():
        torch.testing.assert_close(norm.weight, plain_norms[name].weight, atol=0, rtol=0)


def test_a_fast_model_samples_the_same_tokens_as_the_textbook(pairs: dict[str, tuple[Path, Path]]) -> None:
    """Sampling goes through gemma4/sampling.py on both models: the speed layer changes no sampled token,
    plain and speculative with sample drafting."""
    from gemma4 import SamplerConfig, sample_generate
    plain_target, plain_drafter = textbook(pairs["e2b"])
    target, drafter = load_target(pairs["e2b"][0], fast=True), load_drafter(pairs["e2b"][1], fast=True)
    sampler = SamplerConfig(temperature=1.0, top_k=20, top_p=0.9, seed=4)
    assert sample_generate(target, PROMPT, 16, sampler) == sample_generate(plain_target, PROMPT, 16, sampler)
    fast = speculative_generate(target, drafter, PROMPT, 16, DraftLength(3), sampler=sampler, drafting="sample")
    plain = speculative_generate(plain_target, plain_drafter, PROMPT, 16, DraftLength(3), sampler=sampler,
                                 drafting="sample")
    assert fast.tokens == plain.tokens
