"""The textbook target (`fast=False`: gemma4/model.py's own modules) against transformers 5.22.2 on the same tiny
files: full-prompt logits and step-by-step cached logits (float32, bound against a float64 run: tests/tolerance.py),
each through the textbook's one-row forward and full-length cache (`model(ids, start, cache)`, gemma4/cache.py)
and through the engine's (`forward_rows` on a `RingCache`, whose sliding layers read their keys in ring order), and
64-token greedy decoding, for every shape (and the unified file with K=V, KV sharing and a double-wide MLP
set), with prompts longer than the sliding window (8). Plus our cached decoder against our cache-free reference
decoder. The speed layer is held to these modules in tests/speed/test_fast.py."""

from pathlib import Path

import pytest
import torch
from transformers import GenerationConfig

from gemma4 import Gemma4Model, KVCache, RingCache, greedy_generate, load_target, reference_greedy
from gemma4.tokenizer import stop_ids
from gemma4.engine.forward import forward_rows
from tests.checkpoints import SHAPES, STOP_IDS, write_target
from tests.pairs import prompt
from tests.tf_oracle import tf_cached_step_logits, tf_greedy, tf_logits, tf_target
from tests.tolerance import assert_fp32_parity



# The 12B release leaves K=V, KV sharing and the double-wide MLP at their defaults (off): the variant sets them,
# so that reading and applying them in a unified file is tested too.
@pytest.fixture(scope="module", params=SHAPES + ("12b_variant",))
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    return request.param, write_target(tmp_path_factory.mktemp(request.param), request.param)


@pytest.fixture(scope="module")
def target_vs_tf(checkpoint: tuple[str, Path]):  # noqa: ANN201
    shape, path = checkpoint
    return shape, load_target(path, fast=False), tf_target(path)  # the textbook's modules


@pytest.fixture(scope="module")
def target_vs_tf64(checkpoint: tuple[str, Path]):  # noqa: ANN201
    """The same checkpoint in float64: the reference the float32 target_vs_tf is measured against."""
    _, path = checkpoint
    return load_target(path, dtype=torch.float64, fast=False), tf_target(path, dtype=torch.float64)


def test_full_prompt_logits(target_vs_tf, target_vs_tf64) -> None:  # noqa: ANN001
    shape, ours, theirs = target_vs_tf
    ours64, theirs64 = target_vs_tf64
    for seed, length in ((0, 5), (1, 23), (2, 40)):  # shorter and longer than the window
        ids = prompt(length, seed)
        x = torch.tensor([ids])
        assert_fp32_parity("target full prompt", f"{shape}, {length} tokens", ours(ids).logits, tf_logits(theirs, ids),
                           ours64(ids).logits, tf_logits(theirs64, ids), ours.config.num_layers)
        assert_fp32_parity("engine full prompt", f"{shape}, {length} tokens", forward_rows(ours, x).logits[0],
                           tf_logits(theirs, ids), forward_rows(ours64, x).logits[0], tf_logits(theirs64, ids),
                           ours.config.num_layers)


def cached_step_logits(model: Gemma4Model, ids: list[int], n_prompt: int) -> torch.Tensor:
    """Our tf_cached_step_logits on the textbook's forward and cache: prefill ids[:n_prompt], then one token per
    forward -> (1 + len - n_prompt, V)."""
    cache = KVCache(model.config, len(ids), dtype=next(model.parameters()).dtype)
    rows = [model(ids[:n_prompt], start=0, cache=cache, last=1).logits[-1]]
    cache.length = n_prompt
    for token in ids[n_prompt:]:
        rows.append(model([token], start=cache.length, cache=cache).logits[-1])
        cache.length += 1
    return torch.stack(rows)


def ring_step_logits(model: Gemma4Model, ids: list[int], n_prompt: int) -> torch.Tensor:
    """cached_step_logits on the engine's forward and ring."""
    cache = RingCache(model.config, len(ids), dtype=next(model.parameters()).dtype)
    rows = [forward_rows(model, torch.tensor([ids[:n_prompt]]), cache, num_logits=1).logits[0, -1]]
    cache.length = torch.tensor([n_prompt])
    for token in ids[n_prompt:]:
        rows.append(forward_rows(model, torch.tensor([[token]]), cache, cache.length).logits[0, -1])
        cache.length = cache.length + 1
    return torch.stack(rows)


def test_cached_step_logits(target_vs_tf, target_vs_tf64) -> None:  # noqa: ANN001
    shape, ours, theirs = target_vs_tf
    ours64, theirs64 = target_vs_tf64
    ids, n_prompt = prompt(30, 3), 11
    theirs32, theirs64 = tf_cached_step_logits(theirs, ids, n_prompt), tf_cached_step_logits(theirs64, ids, n_prompt)
    for name, steps in (("target cached steps", cached_step_logits), ("engine ring steps", ring_step_logits)):
        assert_fp32_parity(name, shape, steps(ours, ids, n_prompt), theirs32, steps(ours64, ids, n_prompt), theirs64,
                           ours.config.num_layers)


@pytest.mark.parametrize("shape", SHAPES)
def test_multi_token_chunks_match_one_prefill(shape: str, tmp_path: Path) -> None:
    """Verification feeds several tokens after a cached prefix: the same logits as one full forward.

    In float64, so that a wrong mask, position or cache slot cannot hide in fp32 rounding (fp32 alone
    moves these logits by ~3e-4 against float64 on this model).
    """
    ours = load_target(write_target(tmp_path, shape), dtype=torch.float64)
    ids = prompt(33, 4)
    full = forward_rows(ours, torch.tensor([ids])).logits[0]
    cache = RingCache(ours.config, len(ids), dtype=torch.float64)
    chunks, start, rows = (9, 5, 1, 12, 6), 0, []
    for n in chunks:
        rows.append(forward_rows(ours, torch.tensor([ids[start:start + n]]), cache, torch.tensor([start])).logits[0])
        start += n
        cache.length = torch.tensor([start])
    torch.testing.assert_close(torch.cat(rows), full, atol=1e-9, rtol=0)


def test_greedy_64_tokens(target_vs_tf) -> None:  # noqa: ANN001
    _, ours, theirs = target_vs_tf
    for seed, length in ((5, 6), (6, 21)):
        ids = prompt(length, seed)
        cached = greedy_generate(ours, ids, 64)
        assert len(cached) == 64
        assert cached == tf_greedy(theirs, ids, 64)
        assert cached == reference_greedy(ours, ids, 64)
        assert len(set(cached)) > 3  # a degenerate model would prove nothing


def test_stops_at_the_first_stop_id(target_vs_tf) -> None:  # noqa: ANN001
    _, ours, theirs = target_vs_tf
    ids = prompt(12, 7)
    free = greedy_generate(ours, ids, 40)
    stop = free[9]
    expected = free[: free.index(stop) + 1]
    assert greedy_generate(ours, ids, 40, stop_ids=[stop]) == expected
    assert reference_greedy(ours, ids, 40, stop_ids=[stop]) == expected
    assert tf_greedy(theirs, ids, 40, stop_ids=[stop]) == expected


def test_bf16_runs_and_mostly_agrees(tmp_path: Path) -> None:
    """bf16 is not byte-identical to fp32 (mtp/README.md §10), but it must be the same model."""
    path = write_target(tmp_path, "e2b", dtype=torch.bfloat16)
    fp32, bf16 = load_target(path), load_target(path, dtype=torch.bfloat16)
    ids = torch.tensor([prompt(24, 8)])
    a, b = forward_rows(fp32, ids).logits[0], forward_rows(bf16, ids).logits[0].float()
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.8  # 0.96 measured; a wrong model gives ~0
    assert float((a - b).abs().mean()) < 0.15 * float(a.abs().mean())  # 0.08 of the scale measured


def test_a_bfloat16_heads_logits_are_capped_in_float32(tmp_path: Path) -> None:
    """The head's bfloat16 output is cast once, then capped in float32: capping in bfloat16 would round distinct
    outputs to one value, ties that an argmax breaks by id (decode and verify alike, but not by the model)."""
    model = load_target(write_target(tmp_path, "e2b", dtype=torch.bfloat16), dtype=torch.bfloat16)
    out = forward_rows(model, torch.tensor([prompt(24, 8)]))
    raw = model.head(out.hidden, model.embed_tokens.weight)  # (1, T, V) bfloat16
    cap = model.config.final_logit_softcapping
    assert out.logits.dtype == torch.float32 and torch.equal(out.logits, torch.tanh(raw.float() / cap) * cap)
    distinct = lambda x: sum(len(row.unique()) for row in x[0])  # noqa: E731
    assert distinct(out.logits) == distinct(raw) > distinct(torch.tanh(raw / cap) * cap)


def test_stop_ids_are_read_from_the_written_checkpoint(checkpoint: tuple[str, Path]) -> None:
    """The files the tests write list the IT releases' stop ids, and we read them as transformers does."""
    _, path = checkpoint
    assert stop_ids(path) == STOP_IDS == GenerationConfig.from_pretrained(path).eos_token_id


def test_plain_decoding_says_why_it_ended(tmp_path: Path) -> None:
    """decode's finish reason is the loop's own ("stop" at a stop id, kept; "length" at the budget or the
    context), the tokens sample_generate's; a batch row's is its solo run's."""
    from gemma4 import SamplerConfig, decode, sample_generate
    model = load_target(write_target(tmp_path, "e2b"))
    ids, greedy = prompt(12, 8), SamplerConfig(0.0)
    [free] = decode(model, [ids], 10, [greedy])
    assert free == (sample_generate(model, ids, 10, greedy), "length") and len(free.tokens) == 10
    stop = free.tokens[3]
    [stopped] = decode(model, [ids], 10, [greedy], stop_ids=[stop])
    assert stopped.finish_reason == "stop" and stopped.tokens == free.tokens[:free.tokens.index(stop) + 1]
    context = model.config.max_position_embeddings
    long = prompt(context - 2, 9)
    assert decode(model, [long], 10) == [(decode(model, [long], 2)[0].tokens, "length")]
    assert decode(model, [ids, ids], 10, [greedy, greedy], [[], [stop]]) == [free, stopped]
