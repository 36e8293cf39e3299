"""The MoE experts without a host read (gemma4/fast/experts.py) compute what the loop of gemma4/moe.py computes.

- The block alone, in float64 (so that only the order of the sums differs): every token count from 1 to past X / k,
  gathering as a compiled step of up to 16 rows does and by default (the loop from X (token, slot) pairs on).
- The whole tiny MoE model with the gathered experts: plain greedy and speculative greedy give the textbook's
  tokens, and a decode step reads the device once, a round twice (what a GPU gets: the loaders swap them in off
  the CPU). The experts are gathered in a copy of the session's shared model, which other tests read.
"""

import copy
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from torch import nn

from bench.syncs import per_step
from gemma4 import greedy_generate
from gemma4.config import TextConfig
from gemma4.fast.experts import GatheredExperts, gather_experts
from gemma4.moe import Experts, Router
from mtp import DraftLength, speculative_generate
from tests.pairs import prompt


@contextmanager
def gathered(model: nn.Module, rows: int = 0) -> Iterator[None]:
    replaced = gather_experts(model, rows)
    try:
        yield
    finally:
        for name, module in replaced:
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, module)


def block(models: dict) -> tuple[TextConfig, Router, Experts]:
    target, _ = models["moe", "echo"]
    layer = target.layers[0]
    return target.config, layer.router, layer.experts


@pytest.mark.parametrize("rows", [16, 0])
def test_the_block_equals_the_loop(models, rows: int) -> None:  # noqa: ANN001
    config, trained_router, experts = block(models)
    x, k = config.num_experts, config.top_k_experts
    loop = Experts(config).double()
    loop.load_state_dict(experts.state_dict())
    router = Router(config).double()
    router.load_state_dict(trained_router.state_dict())
    model = nn.Sequential(loop)
    with gathered(model, rows):
        fast = model[0]
        assert isinstance(fast, GatheredExperts) and fast.gate_up_proj is loop.gate_up_proj
        g = torch.Generator().manual_seed(0)
        for n in range(1, x // k + 3):  # past X / k tokens: the default runs the loop there
            u = torch.randn(n, config.hidden_size, generator=g, dtype=torch.float64)
            weights, chosen = router(u)
            want = loop(u, weights, chosen)
            got = fast(u, weights, chosen)
            if n > rows and n * k >= x:
                assert torch.equal(got, want)  # the loop itself
            else:
                torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert type(model[0]) is Experts  # put back


@pytest.mark.parametrize("rows", [5, 0])
def test_the_model_gives_the_textbook_tokens_reading_once_a_step(models, rows: int) -> None:  # noqa: ANN001
    target, drafter = models["moe", "echo"]
    ids, n = prompt("long"), 16
    # By default the loop runs from X (token, slot) pairs: on this shape (X = 8, k = 2) a verify of K + 1 = 3 rows
    # gathers, one of 5 loops (a 26B-A4B, X = 128, k = 8, gathers up to 15 rows); gathering up to 5 rows, K = 4 does.
    k = 4 if rows else 2
    plain = greedy_generate(target, ids, n)
    spec = speculative_generate(target, drafter, ids, n, DraftLength(k)).tokens
    fast = copy.deepcopy(target)
    gather_experts(fast, rows)
    assert greedy_generate(fast, ids, n) == plain
    assert speculative_generate(fast, drafter, ids, n, DraftLength(k)).tokens == spec
    # Tensor reads; and, as a GPU loads it (rows 0), ops that wait for the device too (nonzero, unique)
    counts = per_step(fast, drafter, ids, 12, k=k, profile=rows == 0)
    for kind in ("host_reads", "syncing_ops") if rows == 0 else ("host_reads",):
        assert counts[kind]["plain_step"] <= 1 and counts[kind]["spec_round"] <= 2, (kind, counts[kind])


def test_the_loop_reads_once_a_layer(models) -> None:  # noqa: ANN001
    """Why the swap exists: the eager CPU model keeps the loop, which asks the host for its experts."""
    target, drafter = models["moe", "echo"]
    reads = per_step(target, drafter, prompt("long"), 24, k=4)["host_reads"]
    assert reads["plain_step"] == 1 + sum(layer.moe for layer in target.layers)
