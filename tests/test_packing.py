"""Prepared products (gemma4/packing.py, weights.prepare_weights): stacked and packed weights give the same
products and tokens as the parameters themselves, and a plain fallback serves wherever a prepared product
must not (autograd, a changed weight, a build or dtype without oneDNN).

Whether a weight is packed is measured at load time, so no test here depends on what the measurement
finds: the loaders' choice is only checked for its form, and both branches are forced with `pack=True`
(pack wherever oneDNN can) and `pack=False` (never), through the same `prepare_weights` the loaders call."""

import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import gemma4.packing
from gemma4 import Gemma4Model, greedy_generate, load_target
from gemma4.model import MLP, Attention
from gemma4.packing import Choice, Linear, Product, linear, measure, packable
from gemma4.weights import prepare_weights
from mtp import Drafter, DraftLength, load_drafter, speculative_generate
from tests.checkpoints import write_assistant, write_target

PROMPT = [2, 17, 300, 45, 99, 260, 7, 410, 33]
ROWS = range(1, 10)  # a decode step multiplies 1 row, a verify of K = 1..8 drafts K + 1


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("packing")
    target = write_target(root / "target", "e2b", multimodal=False)
    return target, write_assistant(root / "assistant", target, ordered_embeddings=False, echo=True)


def forced_pair(pair: tuple[Path, Path], pack: bool, dtype: torch.dtype = torch.float32) -> tuple[Gemma4Model, Drafter]:
    """The pair with every product prepared plain (pack=False) or packed wherever oneDNN can (pack=True)."""
    target, drafter = load_target(pair[0], dtype=dtype, pack=False), load_drafter(pair[1], dtype=dtype, pack=False)
    if pack:  # prepared again, from the files, as the loaders would with a measurement that always favours packing
        target.head_product, target.packing = prepare_weights(target, pair[0], "model.", "embed_tokens.weight", True)
        drafter.head_product, drafter.packing = prepare_weights(drafter, pair[1], "", "model.embed_tokens.weight", True)
    return target, drafter


def unprepared(pair: tuple[Path, Path], dtype: torch.dtype = torch.float32) -> tuple[Gemma4Model, Drafter]:
    """The pair's parameters with no product at all: every projection takes the per-call fallback."""
    out = []
    for model in (load_target(pair[0], dtype=dtype, pack=False), load_drafter(pair[1], dtype=dtype, pack=False)):
        twin = copy.deepcopy(model)
        for m in twin.modules():
            for attribute in ("product", "qkv", "gate_up", "norms", "head_product"):
                if hasattr(m, attribute):
                    setattr(m, attribute, None)
        out.append(twin)
    return out[0], out[1]


def products(model: torch.nn.Module) -> list[Product | None]:
    """Every product the loader should have made: stacks, the other projections, the dense head."""
    found = []
    for m in model.modules():
        if isinstance(m, Attention):
            found += [] if m.shared else [m.qkv]
            found += [m.o_proj.product] + ([m.q_proj.product] if m.shared else [])
        elif isinstance(m, MLP):
            found += [m.gate_up, m.down_proj.product]
    stacked = {id(p) for m in model.modules() if isinstance(m, (Attention, MLP)) for p in m.children()}
    found += [m.product for m in model.modules() if isinstance(m, Linear) and id(m) not in stacked]
    return found + [model.head_product]


def test_packed_and_plain_products_agree_fp32() -> None:
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(384, 256, generator=g) / 16  # (O, I)
    kinds = [(False, 0)] + ([(False, 1), (False, 5), (True, 0)] if packable(weight) else [])
    for packed, onednn_rows in kinds:  # plain; plain with oneDNN for many rows; packed
        product = Product((weight,), weight, packed, onednn_rows=onednn_rows)
        for rows in ROWS:
            x = torch.randn(1, rows, 256, generator=g)  # (B, N, I)
            with torch.inference_mode():
                assert product.serves(x, (weight,))
                torch.testing.assert_close(linear(x, weight, product), F.linear(x, weight), rtol=1e-5, atol=1e-5)


def test_packed_and_plain_products_agree_bf16() -> None:
    g = torch.Generator().manual_seed(1)
    weight = (torch.randn(384, 256, generator=g) / 16).bfloat16()
    xs = [torch.randn(1, rows, 256, generator=g).bfloat16() for rows in ROWS]
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        # No oneDNN bfloat16 kernels on this CPU (AVX2 only): no copy can be made, the plain product serves.
        assert not packable(weight)
    products = [Product((weight,), weight, False)]
    if packable(weight):
        products += [Product((weight,), weight, True), Product((weight,), weight, False, onednn_rows=2)]
    for product in products:
        for x in xs:
            with torch.inference_mode():
                assert product.serves(x, (weight,))
                # bfloat16 outputs: one rounding of an fp32 sum either way, so they differ by about one ulp
                torch.testing.assert_close(linear(x, weight, product), F.linear(x, weight), rtol=1.6e-2, atol=1e-2)


def test_which_weights_can_be_packed() -> None:
    weight = torch.empty(64, 64)
    assert packable(weight) == gemma4.packing.ONEDNN
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


def test_the_loaders_report_one_decision_per_shape(pair: tuple[Path, Path]) -> None:
    for target in (load_target(pair[0]), load_target(pair[0], pack=False)):
        choices = {(c.shape, c.dtype): c for c in target.packing}
        assert len(choices) == len(target.packing) and all(isinstance(c, Choice) for c in target.packing)
        for product in products(target):  # each product follows the decision of its (shape, dtype)
            assert product.packed == choices[product.shape, "float32"].packed
            assert product.onednn_rows == choices[product.shape, "float32"].onednn_rows
    assert all(not c.packed and c.why == "forced" for c in target.packing) or not gemma4.packing.ONEDNN


def test_stacks_hold_q_k_v_and_gate_up_as_views(pair: tuple[Path, Path]) -> None:
    """Plain stacks: the parameters become views of the stacked rows, so the weights are held once."""
    target, _ = forced_pair(pair, pack=False)
    attention = next(m for m in target.modules() if isinstance(m, Attention) and not m.shared)
    stack = attention.qkv.operand.t()  # ((H+2K)*D, E)
    q, k = attention.q_proj.weight, attention.k_proj.weight
    assert q.untyped_storage().data_ptr() == stack.untyped_storage().data_ptr()
    assert torch.equal(stack[:q.shape[0]], q) and torch.equal(stack[q.shape[0]:q.shape[0] + k.shape[0]], k)
    mlp = next(m for m in target.modules() if isinstance(m, MLP))
    assert mlp.gate_up.operand.shape == (mlp.gate_proj.in_features, 2 * mlp.width)
    assert all(m.qkv is None for m in target.modules() if isinstance(m, Attention) and m.shared)


def assert_same_as_unprepared(target: Gemma4Model, drafter: Drafter, raw_target: Gemma4Model,
                              raw_drafter: Drafter) -> None:
    """The same logits as the unprepared pair, and the same tokens and rounds, plain and speculative."""
    with torch.inference_mode():
        torch.testing.assert_close(target(torch.tensor([PROMPT])), raw_target(torch.tensor([PROMPT])))
    plain = greedy_generate(raw_target, PROMPT, 24)
    assert greedy_generate(target, PROMPT, 24) == plain
    for k in (1, 4):
        ours = speculative_generate(target, drafter, PROMPT, 24, DraftLength(k))
        theirs = speculative_generate(raw_target, raw_drafter, PROMPT, 24, DraftLength(k))
        assert ours.tokens == plain and ours.stats.rounds == theirs.stats.rounds


@pytest.mark.parametrize("pack", [False, True])
def test_prepared_models_give_the_same_logits_and_tokens(pair: tuple[Path, Path], pack: bool) -> None:
    raw_target, raw_drafter = unprepared(pair)
    target, drafter = forced_pair(pair, pack)
    assert all(p is not None for p in products(target) + products(drafter))
    assert all(p.packed == (pack and gemma4.packing.ONEDNN) for p in products(target) + products(drafter))
    assert_same_as_unprepared(target, drafter, raw_target, raw_drafter)


def test_onednn_for_many_rows_gives_the_same_logits_and_tokens(pair: tuple[Path, Path]) -> None:
    """Plain products that send verifies and prefills to oneDNN on the unpacked weight (as `measure` may
    choose): the same logits and tokens, plain and speculative."""
    raw_target, raw_drafter = unprepared(pair)
    target, drafter = forced_pair(pair, pack=False)
    for product in products(target) + products(drafter):
        product.onednn_rows = 2 if gemma4.packing.ONEDNN else 0  # from 2 rows; without oneDNN: never
    assert_same_as_unprepared(target, drafter, raw_target, raw_drafter)


@pytest.mark.parametrize("pack", [False, True])
def test_preparing_leaves_the_state_dict_alone(pair: tuple[Path, Path], pack: bool) -> None:
    """Official names and values, and strictly loadable into a model built from scratch."""
    raw = unprepared(pair)[0].state_dict()
    target, _ = forced_pair(pair, pack)
    state = target.state_dict()
    assert list(state) == list(raw)
    assert all(torch.equal(state[k], raw[k]) for k in raw)
    with torch.device("meta"):
        fresh = Gemma4Model(target.config)
    fresh.load_state_dict({k: v.clone() for k, v in state.items()}, strict=True, assign=True)


def test_a_bf16_file_run_in_fp32_keeps_one_copy(tmp_path: Path) -> None:
    """A cast weight is replaced by the file's (bfloat16) view once packed; the fallback casts it per call."""
    path = write_target(tmp_path / "bf16", "e2b", dtype=torch.bfloat16, multimodal=False)
    plain = load_target(path, pack=False)
    target = load_target(path, pack=False)
    target.head_product, _ = prepare_weights(target, path, "model.", "embed_tokens.weight", pack=True)
    q = target.layers[0].self_attn.q_proj
    if gemma4.packing.ONEDNN:
        assert q.weight.dtype == torch.bfloat16 and target.layers[0].self_attn.qkv.dtype == torch.float32
        assert target.embed_tokens.weight.dtype == torch.float32  # the embedding reads rows in fp32
    assert greedy_generate(target, PROMPT, 16) == greedy_generate(plain, PROMPT, 16)
    x = torch.randn(1, 2, q.in_features)
    with torch.inference_mode():
        torch.testing.assert_close(q(x), plain.layers[0].self_attn.q_proj(x))  # the fallback, cast per call


@pytest.mark.parametrize("pack", [False, True])
def test_training_a_prepared_model(pair: tuple[Path, Path], pack: bool) -> None:
    """Autograd multiplies the parameters (stacked per call); the optimizer's step retires every copy (packed
    products, norm tables), while a plain product, made of views, multiplies the new weights."""
    target, _ = forced_pair(pair, pack)
    target.train().requires_grad_(True)
    optimizer = torch.optim.SGD(target.parameters(), lr=1e-2)
    ids = torch.tensor([PROMPT])
    before = F.cross_entropy(target(ids)[0, :-1], ids[0, 1:])
    before.backward()
    assert all(m.weight.grad is not None for m in target.modules() if isinstance(m, Linear))
    assert all(m.q_norm.weight.grad is not None for m in target.modules() if isinstance(m, Attention))
    optimizer.step()
    target.eval()
    with torch.inference_mode():
        x = torch.randn(1, 1, target.config.hidden_size)
        attention = target.layers[0].self_attn
        assert attention.qkv.serves(x, attention.qkv_weights()) == (not attention.qkv.packed)
        assert not attention.norms.serves((attention.q_norm.weight, attention.k_norm.weight))
        torch.testing.assert_close(linear(x, attention.qkv_weights(), attention.qkv),
                                   F.linear(x, torch.cat(attention.qkv_weights())), rtol=1e-5, atol=1e-6)
        after = F.cross_entropy(target(ids)[0, :-1], ids[0, 1:])
    assert after < before  # the step took effect: the new weights are the ones multiplied


@pytest.mark.parametrize("packed, onednn_rows",
                         [(False, 0)] + ([(False, 2), (True, 0)] if gemma4.packing.ONEDNN else []))
def test_a_changed_or_replaced_weight(packed: bool, onednn_rows: int) -> None:
    """A packed copy retires when its weight changes in place; a plain product follows the change, with
    either of its kernels."""
    weight = torch.randn(48, 32)
    product = Product((weight,), weight, packed, onednn_rows=onednn_rows)
    x = torch.randn(3, 32)
    with torch.no_grad():
        assert product.serves(x, (weight,))
        weight.mul_(2)  # an optimizer step, a copy_: the version counter moves
        assert product.serves(x, (weight,)) == (not packed)
        torch.testing.assert_close(linear(x, weight, product), F.linear(x, weight))
        assert not product.serves(x, (weight.clone(),))  # another tensor, even with the same numbers
        assert not product.serves(x.double(), (weight,))
    assert not product.serves(x, (weight,))  # autograd: always the plain product


@pytest.mark.parametrize("pack", [False, True])
def test_a_copied_model_prepares_its_own_weights(pair: tuple[Path, Path], pack: bool) -> None:
    target, _ = forced_pair(pair, pack)
    twin = copy.deepcopy(target)
    attention, original = twin.layers[0].self_attn, target.layers[0].self_attn
    assert attention.qkv.sources[0] is attention.q_proj.weight and attention.q_proj.weight is not original.q_proj.weight
    with torch.inference_mode():
        assert attention.qkv.serves(torch.zeros(1, attention.q_proj.in_features), attention.qkv_weights())
        assert attention.norms.serves((attention.q_norm.weight, attention.k_norm.weight))
    assert greedy_generate(twin, PROMPT, 12) == greedy_generate(target, PROMPT, 12)


def test_without_onednn_nothing_is_packed(pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch build without oneDNN: the loaders still load, and generation and training run plain."""
    plain = greedy_generate(unprepared(pair)[0], PROMPT, 16)
    monkeypatch.setattr(gemma4.packing, "ONEDNN", False)
    target = load_target(pair[0])
    assert all(not c.packed and c.plain_s is None for c in target.packing)
    assert all(not p.packed for p in products(target))
    assert greedy_generate(target, PROMPT, 16) == plain
    target.train().requires_grad_(True)
    loss = target(torch.tensor([PROMPT])).logsumexp(-1).mean()
    loss.backward()
    assert target.layers[0].self_attn.q_proj.weight.grad is not None


def test_loading_under_inference_mode(pair: tuple[Path, Path]) -> None:
    """Tensors made under inference mode have no version counter: the products must not ask for one."""
    expected = greedy_generate(load_target(pair[0]), PROMPT, 8)
    with torch.inference_mode():
        target = load_target(pair[0])
        attention = target.layers[0].self_attn
        assert attention.norms.serves((attention.q_norm.weight, attention.k_norm.weight))
    assert greedy_generate(target, PROMPT, 8) == expected
