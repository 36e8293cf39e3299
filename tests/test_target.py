"""The target against transformers 5.22.2 on the same tiny files, in float32: full-prompt logits,
step-by-step cached logits and 64-token greedy decoding, for the three shapes, with prompts longer
than the sliding window (8). Plus our cached decoder against our cache-free reference decoder."""

from pathlib import Path

import pytest
import torch

from gemma4 import KVCache, greedy_generate, load_target, reference_greedy
from tests.checkpoints import SHAPES, STOP_IDS, write_target
from tests.tf_oracle import tf_cached_step_logits, tf_greedy, tf_logits, tf_target

MAX_DIFF: dict[str, float] = {}  # shape -> largest |ours - transformers| logit seen, printed at the end


def prompt(seed: int, length: int, vocab: int = 512) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return [2] + torch.randint(3, vocab, (length - 1,), generator=g).tolist()  # BOS, then no special ids


@pytest.fixture(scope="module", params=SHAPES)
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    path = write_target(tmp_path_factory.mktemp(request.param), request.param)
    return request.param, load_target(path), tf_target(path)


def record(shape: str, ours: torch.Tensor, theirs: torch.Tensor) -> None:
    MAX_DIFF[shape] = max(MAX_DIFF.get(shape, 0.0), float((ours - theirs).abs().max()))


def test_full_prompt_logits(pair) -> None:  # noqa: ANN001
    shape, ours, theirs = pair
    for seed, length in ((0, 5), (1, 23), (2, 40)):  # shorter and longer than the window
        ids = prompt(seed, length)
        expected = tf_logits(theirs, ids)
        got = ours(torch.tensor([ids]))[0]
        record(shape, got, expected)
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_cached_step_logits(pair) -> None:  # noqa: ANN001
    shape, ours, theirs = pair
    ids, n_prompt = prompt(3, 30), 11
    expected = tf_cached_step_logits(theirs, ids, n_prompt)  # (1 + 19, V)
    cache = KVCache(ours.config, len(ids))
    rows = [ours.run(torch.tensor([ids[:n_prompt]]), cache, 0, num_logits=1).logits[0, -1]]
    cache.length = n_prompt
    for token in ids[n_prompt:]:
        rows.append(ours.run(torch.tensor([[token]]), cache, cache.length).logits[0, -1])
        cache.length += 1
    got = torch.stack(rows)
    record(shape, got, expected)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("shape", SHAPES)
def test_multi_token_chunks_match_one_prefill(shape: str, tmp_path: Path) -> None:
    """Verification feeds several tokens after a cached prefix: the same logits as one full forward.

    In float64, so that a wrong mask, position or cache slot cannot hide in fp32 rounding (fp32 alone
    moves these logits by ~3e-4 against float64 on this model).
    """
    ours = load_target(write_target(tmp_path, shape), dtype=torch.float64)
    ids = prompt(4, 33)
    full = ours(torch.tensor([ids]))[0]
    cache = KVCache(ours.config, len(ids), dtype=torch.float64)
    chunks, start, rows = (9, 5, 1, 12, 6), 0, []
    for n in chunks:
        rows.append(ours.run(torch.tensor([ids[start:start + n]]), cache, start).logits[0])
        start += n
        cache.length = start
    torch.testing.assert_close(torch.cat(rows), full, atol=1e-9, rtol=0)


def test_greedy_64_tokens(pair) -> None:  # noqa: ANN001
    _, ours, theirs = pair
    for seed, length in ((5, 6), (6, 21)):
        ids = prompt(seed, length)
        cached = greedy_generate(ours, ids, 64)
        assert len(cached) == 64
        assert cached == tf_greedy(theirs, ids, 64)
        assert cached == reference_greedy(ours, ids, 64)
        assert len(set(cached)) > 3  # a degenerate model would prove nothing


def test_stops_at_the_first_stop_id(pair) -> None:  # noqa: ANN001
    _, ours, theirs = pair
    ids = prompt(7, 12)
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
    ids = torch.tensor([prompt(8, 24)])
    a, b = fp32(ids)[0], bf16(ids)[0].float()
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.8  # 0.96 measured; a wrong model gives ~0
    assert float((a - b).abs().mean()) < 0.15 * float(a.abs().mean())  # 0.08 of the scale measured


def test_report_max_diff() -> None:
    """Runs last in this file: prints the largest logit difference per shape (for the closing note)."""
    assert MAX_DIFF, "the parity tests did not run"
    print("\nlargest |ours - transformers| logit difference:", {k: f"{v:.2e}" for k, v in MAX_DIFF.items()})
    assert max(MAX_DIFF.values()) < 1e-4


def test_stop_ids_constant() -> None:
    assert STOP_IDS == [1, 106, 50]
