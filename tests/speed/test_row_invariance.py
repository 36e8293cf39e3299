"""Bit for bit: on the speed layer a row of a step has the same bits whatever the other rows of the step.

- Per kernel (gemma4/fast/rows.py): every product the speed layer can choose on the CPU (MKL, oneDNN on the plain
  weight, oneDNN packed; float32 and bfloat16; torch's int4 kernel), at the shapes of E2B, the tied head and the
  drafter's centroid scores, gives row 0 of an M-row call the bits of a 1-row call, M = 1..9 and up to STEP_ROWS,
  with other rows of random numbers. The plan is measured on one set of numbers and checked on new ones.
- Attention and MoE experts: a query's attention and a token's experts in a step of many are the decode step's.
- End to end, on every family of the test pairs, in float32, bfloat16 and bfloat16 int4: a verify's logits at row i
  equal, bit for bit, the logits of the decode step at that position, over prompts that wrap the rings.
- On the demo pair, 200 prompts in bfloat16 and in bfloat16 int4: speculative decoding commits plain decoding's
  tokens, every one; and a batch row's logits are its solo run's, bit for bit, at every step.
- The one kernel found not invariant by itself, float32 gelu on a width that is not a whole number of vectors, is
  named in a test; the speed layer runs it row by row (gemma4/fast/modules.py `GateLinear`).
"""

import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gemma4 import load_target
from gemma4.engine.forward import forward_rows
from gemma4.engine.ring import RingCache
from gemma4.engine.decode import decode
from gemma4.engine.rows import choose, prefill
from gemma4.fast.attention import attend_by_query
from gemma4.fast.experts import TokenExperts
from gemma4.fast.int4 import int4_product
from gemma4.fast.kernels import Choice, Product, library_of, packable
from gemma4.fast.modules import adopt, row_by_row
from gemma4.fast.rows import STEP_ROWS, RowPlan, in_pieces, measure
from gemma4.model import attend
from gemma4.moe import Experts
from mtp import DraftLength, load_drafter
from mtp.drafter import CentroidHead
from mtp.engine.batch import speculative_generate_batch
from tests.checkpoints import SHAPES

ROWS = (*range(1, 10), 16, 33, STEP_ROWS)  # a decode step, every verify of K <= 8, and longer steps
E2B = {"q/k/v, sliding": (2560, 1536), "gate/up": (12288, 1536), "down": (1536, 6144), "PLE gate": (256, 1536)}
KERNELS = {"mkl": (False, (False, False)), "onednn": (False, (True, True)), "packed": (True, (True, True))}
DEMO = "scripts/demo/target", "scripts/demo/assistant"


def assert_rows_invariant(call, in_features: int, dtype: torch.dtype, seed: int = 1) -> None:  # noqa: ANN001
    """Row 0 of every M-row call has the bits of the 1-row call, its other rows new random numbers each time."""
    generator = torch.Generator().manual_seed(seed)
    probe = torch.randn(1, in_features, generator=generator).to(dtype)
    alone = call(probe)[0]
    for m in ROWS:
        x = torch.cat([probe, torch.randn(m - 1, in_features, generator=generator).to(dtype)])
        assert torch.equal(call(x)[0], alone), f"{m} rows"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("name", list(E2B))
def test_products_are_row_invariant(name: str, kernel: str, dtype: torch.dtype) -> None:
    if kernel != "mkl" and not torch.backends.mkldnn.is_available():
        pytest.fail("this torch has no oneDNN: the speed layer's CPU products need it")
    packed, onednn = KERNELS[kernel]
    weight = torch.randn(E2B[name], generator=torch.Generator().manual_seed(0)).to(dtype)  # (O, I)
    if dtype == torch.bfloat16 and kernel != "mkl" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        assert not packable(weight)  # no oneDNN bfloat16 kernel on this CPU: the rule never chooses one
        return
    product = Product(weight, packed, onednn)
    product.plan = measure(product.multiply, weight.shape[1], dtype, weight.device)
    assert_rows_invariant(product, weight.shape[1], dtype)


@pytest.mark.parametrize(("name", "dtype"), [("PLE gate", torch.float32), ("q/k/v, sliding", torch.bfloat16),
                                             ("down", torch.bfloat16)], ids=["ple-float32", "qkv-bfloat16", "down-bfloat16"])
def test_int4_products_are_row_invariant(name: str, dtype: torch.dtype) -> None:
    o, i = E2B[name]
    generator = torch.Generator().manual_seed(0)
    words = torch.randint(-2**31, 2**31 - 1, (o, i // 8), dtype=torch.int32, generator=generator)
    scales = (torch.rand(o, i // 32, generator=generator) / 8).to(dtype)
    product, _ = int4_product(words, scales, dtype)
    product.plan = measure(product.multiply, i, dtype, words.device)
    assert_rows_invariant(product, i, dtype)


def test_the_tied_head_is_row_invariant() -> None:
    """E2B's head, (262144, 1536) in bfloat16, packed as the rule packs it."""
    block = torch.randn(4096, 1536, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    weight = block.repeat(64, 1)  # (262144, 1536): random rows, made fast
    product = Product(weight, torch.ops.mkldnn._is_mkldnn_bf16_supported())
    product.plan = measure(product.multiply, 1536, torch.bfloat16, weight.device)
    assert_rows_invariant(product, 1536, torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_the_centroid_head_is_row_invariant(dtype: torch.dtype) -> None:
    """The E2B assistant's centroid head as the speed layer makes it: 2048 centroids over its 256-wide hidden (a
    product), then the scores of the top 32 clusters' tokens (262144 / 2048 each), row by row (`row_by_row`: one
    batched product over the rows gives a row other bits in float32)."""
    generator = torch.Generator().manual_seed(0)
    centroids = Product(torch.randn(2048, 256, generator=generator).to(dtype), False)
    centroids.plan = measure(centroids.multiply, 256, dtype, torch.device("cpu"))
    assert_rows_invariant(centroids, 256, dtype)
    plain = CentroidHead.__new__(CentroidHead)
    nn.Module.__init__(plain)
    plain.top_k, plain.centroids = 32, nn.Linear(256, 2048, bias=False).to(dtype)
    plain.register_buffer("token_ordering", torch.randperm(262144, generator=generator))
    head = torch.randn(4096, 256, generator=generator).to(dtype).repeat(64, 1)  # (262144, 256)
    fast = row_by_row(plain)
    assert_rows_invariant(lambda hn: fast.scored_tokens(hn, head)[1], 256, dtype)


def test_a_measured_plan_cuts_and_pads_rows() -> None:
    """`in_pieces` returns each row's own product whatever the plan, and pads to the plan's least rows."""
    seen = []

    def multiply(x: torch.Tensor) -> torch.Tensor:
        seen.append(x.shape[0])
        return x * 2
    x = torch.arange(10.0)[:, None]
    assert torch.equal(in_pieces(multiply, x, RowPlan(3, 4)), x * 2)
    assert seen == [4, 4, 3]
    seen.clear()
    assert torch.equal(in_pieces(multiply, x[:1], RowPlan(3, 4)), x[:1] * 2) and seen == [3]


def test_a_tiny_bfloat16_product_stays_in_one_library() -> None:
    """The demo's PLE projection, (64, 16) in bfloat16: torch's `matmul` multiplies up to 4 rows in its own gemm
    and 5 or more in oneDNN (`library_of`). The two round alike on all but about one result in 400,000, too rare
    for `measure`'s blocks to see; named here where this CPU has oneDNN's bfloat16 kernels. The plan keeps every
    call in the 1-row call's library, so over 40,000 random 5-row blocks each row has its 1-row bits."""
    weight = torch.randn(64, 16, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    product = Product(weight, False)
    choice = Choice((64, 16), "bfloat16", ("mkl", "mkl"), "plain")
    switch = library_of(choice, torch.bfloat16, weight.device)
    product.plan = measure(product.multiply, 16, torch.bfloat16, weight.device, switch)
    rows = torch.randn(40_000, 5, 16, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    alone = torch.cat([product.multiply(block[:1]) for block in rows])  # (40000, 64): the 1-row calls
    if switch(5) == switch(1):  # no oneDNN bfloat16 kernels here: one library for every row count
        assert product.plan == RowPlan(1, STEP_ROWS)
    else:
        assert product.plan == RowPlan(1, 4)
        as_called = torch.cat([product.multiply(block)[:1] for block in rows])
        assert not torch.equal(as_called, alone)  # oneDNN's 5-row call: some row rounds otherwise
    assert torch.equal(torch.cat([product(block)[:1] for block in rows]), alone)


def test_float32_gelu_is_not_invariant_on_a_narrow_row() -> None:
    """The one kernel named as not invariant by itself: float32 gelu on a contiguous run that is not a whole number
    of vectors finishes with scalar code that rounds otherwise. A 13-wide row (a tail on any vector width) alone
    is all tail; among 8 others most of it is vector code, so some of 64 such rows differ. Rows apart in memory
    (the PLE gate's `GateLinear`) take the same path in any step."""
    x = torch.randn(64, 9, 13, generator=torch.Generator().manual_seed(0))
    gelu = lambda t: F.gelu(t, approximate="tanh")  # noqa: E731
    apart = lambda t: F.pad(t, (0, 51))[:, :13]  # noqa: E731  (9, 13) with rows 64 apart
    assert any(not torch.equal(gelu(rows)[0], gelu(rows[:1])[0]) for rows in x)
    assert all(torch.equal(gelu(apart(rows))[0], gelu(apart(rows[:1]))[0]) for rows in x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_attention_query_by_query(dtype: torch.dtype) -> None:
    """E2B's full layer (8 query heads, 1 kv head, 512 wide): query j of a 9-query step at positions 40..48 has the
    bits of the one-query step at its position over the keys that step reads. One SDPA call for all 9 does not
    (on every CPU measured), which is why the speed layer splits a step."""
    generator = torch.Generator().manual_seed(0)
    k, v = (torch.randn(1, 1, 49, 512, generator=generator).to(dtype) for _ in range(2))
    q = torch.randn(1, 9, 8, 512, generator=generator).to(dtype)
    positions = torch.arange(40, 49)[:, None]
    mask = torch.zeros(1, 1, 9, 49, dtype=dtype).masked_fill_(torch.arange(49)[None] > positions, -torch.inf)
    steps = attend_by_query(q, k, v, mask, (40,))  # (1, 9, H*D)
    for j in range(9):
        n = 41 + j
        alone = attend(q[:, j:j + 1], k[:, :, :n], v[:, :, :n], mask[:, :, j:j + 1, :n])
        assert torch.equal(steps[:, j], alone[:, 0]), j


def test_experts_token_by_token(models) -> None:  # noqa: ANN001
    """A step's tokens through their experts one by one: each has the bits of its decode step."""
    target, _ = models["moe", "random"]
    experts = next(m for m in target.modules() if isinstance(m, Experts))
    by_token = adopt(TokenExperts, experts)
    generator = torch.Generator().manual_seed(0)
    u = torch.randn(9, target.config.hidden_size, generator=generator)
    weights = torch.rand(9, target.config.top_k_experts, generator=generator)
    chosen = torch.stack([torch.randperm(target.config.num_experts, generator=generator)[:target.config.top_k_experts]
                          for _ in range(9)])
    out = by_token(u, weights, chosen)
    for i in range(9):
        assert torch.equal(out[i], Experts.forward(experts, u[i:i + 1], weights[i:i + 1], chosen[i:i + 1])[0])


def verify_and_steps(model, n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
    """From a prefill of n random ids: the logits of one verify of k + 1 ids and of k + 1 decode steps over them."""
    generator = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    prompt = torch.randint(1, vocab, (1, n), generator=generator)
    block = torch.randint(1, vocab, (1, k + 1), generator=generator)
    out = []
    for steps in (False, True):
        cache = RingCache(model.config, n + k + 1, dtype=model.embed_tokens.weight.dtype, slack=16)
        prefill(model, cache, [prompt[0].tolist()], chunk=16)
        if steps:
            logits = []
            for i in range(k + 1):
                logits.append(forward_rows(model, block[:, i:i + 1], cache, torch.tensor([n + i]), 1).logits)
                cache.length[:] = n + i + 1
            out.append(torch.cat(logits, dim=1))
        else:
            out.append(forward_rows(model, block, cache, torch.tensor([n]), k + 1).logits)
    return out[0], out[1]  # (1, k + 1, V) each


@pytest.mark.parametrize("kind", ["float32", "bfloat16", "bfloat16 int4"])
@pytest.mark.parametrize("shape", SHAPES)
def test_verify_logits_are_the_decode_steps_bits(make_pair, shape: str, kind: str) -> None:  # noqa: ANN001
    """Every family: verify row i's logits == the decode step's at that position, bit for bit, for K = 1, 4, 8, at
    positions inside the windows and past them (the rings wrapped: slack 16)."""
    target_dir, _ = make_pair(shape, ordered_embeddings=False, multimodal=False)
    dtype = torch.float32 if kind == "float32" else torch.bfloat16
    model = load_target(target_dir, dtype=dtype, fast=True, quantize="int4" if "int4" in kind else None)
    for n, k, seed in ((3, 8, 0), (17, 4, 1), (40, 1, 2), (45, 8, 3)):
        verified, stepped = verify_and_steps(model, n, k, seed)
        for i in range(k + 1):
            assert torch.equal(verified[:, i], stepped[:, i]), (n, k, i)


def demo(kind: str):  # noqa: ANN201
    """The demo pair in bfloat16, its target quantized at load for "bfloat16 int4"."""
    target = load_target(DEMO[0], dtype=torch.bfloat16, fast=True, quantize="int4" if "int4" in kind else None)
    return target, load_drafter(DEMO[1], dtype=torch.bfloat16, fast=True)


@pytest.mark.parametrize("kind", ["bfloat16", "bfloat16 int4"])
def test_demo_speculative_is_plain_on_200_prompts(kind: str) -> None:
    """The demo pair: 200 prompts of 4-16 random ids, 8 new tokens each, K = 4: speculative decoding commits plain
    decoding's tokens on every prompt. Plain runs 50 rows a batch, speculative 12 (a verify of 60 rows): a batch
    row's bits are its solo run's (the test below)."""
    target, drafter = demo(kind)
    generator = torch.Generator().manual_seed(0)
    prompts = []
    for _ in range(200):
        length = int(torch.randint(4, 17, (), generator=generator))
        prompts.append(torch.randint(1, target.config.vocab_size, (length,), generator=generator).tolist())
    plain = [r.tokens for s in range(0, 200, 50) for r in decode(target, prompts[s:s + 50], 8)]
    speculative = [r.tokens for s in range(0, 200, 12)
                   for r in speculative_generate_batch(target, drafter, prompts[s:s + 12], 8, DraftLength(4))]
    assert [i for i in range(200) if speculative[i] != plain[i]] == []


@pytest.mark.parametrize("kind", ["bfloat16", "bfloat16 int4"])
def test_batch_rows_have_their_solo_runs_bits(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo target: every step of a batch of 6 ragged prompts (3 to 70 ids: prefills of one chunk and of
    more than STEP_ROWS rows) gives each row the logits of its solo run at that position, bit for bit."""
    target, _ = demo(kind)
    generator = torch.Generator().manual_seed(2)
    prompts = [torch.randint(1, target.config.vocab_size, (n,), generator=generator).tolist()
               for n in (3, 20, 70, 33, 9, 64)]
    seen: list[torch.Tensor] = []

    def spy(model, logits, samplers, positions):  # noqa: ANN001, ANN202
        seen.append(logits.clone())  # (B, V): every running row's logits, one step
        return choose(model, logits, samplers, positions)
    monkeypatch.setattr(sys.modules["gemma4.engine.decode"], "choose", spy)  # the module: `decode` is also a function
    batch = decode(target, prompts, 10)
    together, seen = torch.stack(seen), []  # (10, 6, V): no row leaves early, all have one budget
    for b, ids in enumerate(prompts):
        assert decode(target, [ids], 10)[0].tokens == batch[b].tokens
        alone, seen = torch.stack(seen), []  # (10, 1, V)
        for step in range(10):
            assert torch.equal(together[step, b], alone[step, 0]), (b, step)
