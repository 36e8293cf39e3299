"""Batches: every row of a batch is exactly its own solo run (mtp/README.md §12), float32, token lists `==`.

Over the three tiny shapes, ragged prompts below, at and far above the sliding window (8; the
drafter's is 6), K in {1, 2, 4, 7}, a duplicate prompt, permuted rows, a batch of one, and:
- a *scripted* drafter, right on a chosen schedule per row (always, never, partly), so that one
  batch holds rows whose accept counts differ in every round;
- stop ids as the first token, inside an accepted block and as the bonus; a budget ending inside a
  block; rows finishing in different rounds, down to a batch of one;
- keyed sampling: row b equals plain sampling with seed + b (argmax drafting), or its solo sample-drafting
  run with seed + b (sample drafting);
- no NaN in any logits, and every row's cache after ragged rounds equals its solo cache.
The echo drafter (tests/checkpoints.py) against a target with halved branches is partly right.
"""

import copy
from collections.abc import Callable

import pytest
import torch

from gemma4 import RingCache, Gemma4Model, SamplerConfig, greedy_generate, sample_generate
from gemma4.engine import decode
from gemma4.engine.rows import prefill
from mtp import DraftLength, Drafter, speculative_generate, speculative_generate_batch
from gemma4.engine.forward import forward_rows
from tests.checkpoints import SHAPES
from tests.pairs import plain, prompt

LENGTHS = (3, 8, 30)  # below, at and far above the target's sliding window
BUDGET = 26  # > 3 windows of the target (8) and of the drafter (6)


# Ragged rows, one of them twice (each length its own seed: no two prompts share a prefix).
PROMPTS = [prompt(3, 3000), prompt(8, 8000), prompt(30, 30000), prompt(8, 8000)]
BUDGETS = [BUDGET, 20, BUDGET, 13]


@pytest.fixture(scope="module")
def pairs(models) -> dict[str, tuple[Gemma4Model, Drafter]]:  # noqa: ANN001 (conftest.py's session pairs)
    """shape -> (target with halved branches, echo drafter): partly right (tests/pairs.py)."""
    return {shape: models[shape, "echo"] for shape in SHAPES}


def greedy_rows(target: Gemma4Model, prompts: list[list[int]], budgets: int | list[int]) -> list[list[int]]:
    """Every row's plain greedy tokens from one batched `decode`."""
    return [row.tokens for row in decode(target, prompts, budgets)]


def sample_rows(target: Gemma4Model, prompts: list[list[int]], budgets: list[int],
                samplers: list[SamplerConfig]) -> list[list[int]]:
    """Every row's plain sampled tokens from one batched `decode`, row b with samplers[b]."""
    return [row.tokens for row in decode(target, prompts, budgets, samplers)]


def rounds(result) -> list[tuple[list[int], int]]:  # noqa: ANN001
    return [(r.drafted, r.matched) for r in result.stats.rounds]


# ---------------------------------------------------------------- every row is its solo run


@pytest.mark.parametrize("k", (1, 2, 4, 7))
@pytest.mark.parametrize("shape", SHAPES)
def test_rows_equal_solo_runs(pairs, shape: str, k: int) -> None:  # noqa: ANN001
    target, drafter = pairs[shape]
    batch = speculative_generate_batch(target, drafter, PROMPTS, BUDGETS, DraftLength(k))
    for b, (ids, n) in enumerate(zip(PROMPTS, BUDGETS)):
        solo = speculative_generate(target, drafter, ids, n, DraftLength(k))
        assert batch[b].tokens == solo.tokens == plain(target, ids, n), b
        assert rounds(batch[b]) == rounds(solo), b  # the same drafts and accept counts, round by round
        assert batch[b].stats.target_forwards == solo.stats.target_forwards
        assert batch[b].finish_reason == solo.finish_reason == "length"
    assert batch[3].tokens == batch[1].tokens[:13]  # the duplicate prompt, with a smaller budget
    accepted = [a for result in batch for _, a in rounds(result)]
    assert 0 in accepted and max(accepted) > 0  # rejected and accepted drafts in the same batch


@pytest.mark.parametrize("schedule", ("heuristic", "heuristic_transient"))
def test_every_row_adapts_its_own_draft_length(pairs, schedule: str) -> None:  # noqa: ANN001
    """Each row starts from the schedule's value and moves it on its own acceptances, as alone."""
    target, drafter = pairs["dense"]
    length = DraftLength(2, schedule)
    before = copy.deepcopy(vars(length))
    batch = speculative_generate_batch(target, drafter, PROMPTS, BUDGETS, length)
    assert vars(length) == before  # the batch leaves the caller's schedule as it was
    solo = [speculative_generate(target, drafter, p, n, DraftLength(2, schedule)) for p, n in zip(PROMPTS, BUDGETS)]
    assert [rounds(r) for r in batch] == [rounds(r) for r in solo]
    assert len({len(d) for r in batch for d, _ in rounds(r)}) > 1  # the draft lengths did move


@pytest.mark.parametrize("shape", SHAPES)
def test_plain_rows_equal_greedy(pairs, shape: str) -> None:  # noqa: ANN001
    target, _ = pairs[shape]
    assert greedy_rows(target, PROMPTS, BUDGETS) == [plain(target, p, n) for p, n in zip(PROMPTS, BUDGETS)]


def test_permuted_rows_and_a_batch_of_one(pairs) -> None:  # noqa: ANN001
    target, drafter = pairs["e2b"]
    order = [2, 0, 3, 1]
    forward = speculative_generate_batch(target, drafter, PROMPTS, BUDGETS, DraftLength(3))
    permuted = speculative_generate_batch(target, drafter, [PROMPTS[i] for i in order],
                                          [BUDGETS[i] for i in order], DraftLength(3))
    assert [r.tokens for r in permuted] == [forward[i].tokens for i in order]
    assert [rounds(r) for r in permuted] == [rounds(forward[i]) for i in order]
    one = speculative_generate_batch(target, drafter, PROMPTS[2:3], BUDGET, DraftLength(3))
    solo = speculative_generate(target, drafter, PROMPTS[2], BUDGET, DraftLength(3))
    assert len(one) == 1 and one[0].tokens == solo.tokens and rounds(one[0]) == rounds(solo)
    assert greedy_rows(target, PROMPTS[2:3], BUDGET) == [plain(target, PROMPTS[2], BUDGET)]


# ---------------------------------------------------------------- a drafter right on a schedule

# Row r's drafts at position t: the first right(r, t, k) are the target's own tokens, the next is wrong.
SCHEDULES: list[Callable[[int, int], int]] = [
    lambda t, k: k,  # always fully accepted
    lambda t, k: 0,  # never
    lambda t, k: t % (k + 1),  # partly, a different count every round
    lambda t, k: min(1, k),  # exactly one
]


def scripted(target: Gemma4Model, rows: list[list[int]], schedules: list[Callable[[int, int], int]]):  # noqa: ANN201
    """A stand-in for the engine's `propose_rows` (mtp/engine/drafts.py). `rows` are the prompts' greedy sequences (prompt and
    continuation). It recognises each batch row by the target hidden it is given (h[t-1] of one
    sequence) and proposes that sequence's next tokens, wrong from row r's scheduled count on."""
    with torch.inference_mode():
        hidden = [forward_rows(target, torch.tensor([seq])).hidden[0] for seq in rows]  # (L, E) each, cache-free

    def draft(drafter_, target_, tokens, h, positions, source_kv, k, samplers=None):  # noqa: ANN001, ANN202
        out = []
        for i, pos in enumerate(positions):
            r = [j for j, hid in enumerate(hidden)
                 if pos <= len(hid) and torch.allclose(hid[pos - 1], h[i], atol=1e-4, rtol=0)]
            assert len(r) == 1, "each batch row matches exactly one sequence"
            right = rows[r[0]][pos + 1: pos + 1 + k]
            n = schedules[r[0]](pos, k)
            out.append(right[:n] + [(x + 1) % 512 for x in right[n:]])
        return torch.tensor(out), None
    return draft


def test_rows_accepting_very_differently(pairs, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    k = 3
    for shape in SHAPES:
        target, drafter = pairs[shape]
        prompts = [prompt(length, 1000 * length + 7) for length in (5, 12, 30, 9)]
        sequences = [p + plain(target, p, BUDGET + k + 1) for p in prompts]
        monkeypatch.setattr("mtp.engine.rows.propose_rows", scripted(target, sequences, SCHEDULES))
        batch = speculative_generate_batch(target, drafter, prompts, BUDGET, DraftLength(k))
        monkeypatch.undo()
        for r, (ids, result) in enumerate(zip(prompts, batch)):
            assert result.tokens == plain(target, ids, BUDGET), (shape, r)
            t = len(ids)  # the first round drafts at position P
            for drafted, a in rounds(result):
                assert a == min(SCHEDULES[r](t, k), len(drafted)), (shape, r, t)
                t += a + 1
        accepted = [[a for _, a in rounds(result)] for result in batch]
        assert set(accepted[0]) == {k} or set(accepted[0][:-1]) == {k}  # always (the last round may be cut)
        assert set(accepted[1]) == {0} and len(set(accepted[2])) > 1  # never; partly


def first_at(tokens: list[int], where: Callable[[int], bool]) -> int:
    """An index i with where(i) whose token appears there for the first time (so it can be a stop id)."""
    found = [i for i, x in enumerate(tokens) if where(i) and x not in tokens[:i]]
    assert found, "no new token at such an index: the test would prove nothing"
    return found[0]


def test_stops_budgets_and_rows_leaving(models, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """Always-right rows with K = 3 commit new tokens 0 (prefill), then blocks 1-4, 5-8, ...: the
    last of each block is the bonus. Per-row stop ids end rows at chosen indices, per-row budgets
    inside a block; rows leave in different rounds until one is left."""
    k = 3
    target, drafter = models["moe", "random"]  # the target as written: its output repeats less (new tokens to stop at)
    prompts = [prompt(length, 1000 * length + 3) for length in (4, 9, 20, 6, 14)]
    free = [plain(target, p, 40) for p in prompts]
    sequences = [p + f for p, f in zip(prompts, free)]
    stop_first = free[0][0]
    stop_inside = free[1][first_at(free[1], lambda i: i % (k + 1) != 0)]  # a draft, not the bonus
    stop_bonus = free[2][first_at(free[2], lambda i: i >= 4 and i % (k + 1) == 0)]
    stops = [[stop_first], [stop_inside], [stop_bonus], [], []]
    budgets = [40, 40, 40, 1 + (k + 1) * 2 + 2, 30]  # row 3's budget ends inside its third block
    monkeypatch.setattr("mtp.engine.rows.propose_rows", scripted(target, sequences, [SCHEDULES[0]] * len(prompts)))
    sizes: list[int] = []
    spied = copy.deepcopy(target)  # the spy goes on a copy: `models` is the session's, read by other tests

    def spy(model, ids, cache=None, start_pos=None, num_logits=None, soft=None):  # noqa: ANN001, ANN202
        sizes.append(ids.shape[0])
        out = forward_rows(model, ids, cache, start_pos=start_pos, num_logits=num_logits, soft=soft)
        assert not out.logits.isnan().any() and not out.hidden.isnan().any()
        return out

    monkeypatch.setattr("gemma4.engine.rows.forward_rows", spy)  # the engine's prefill
    monkeypatch.setattr("mtp.engine.rows.forward_rows", spy)  # and its verifies
    batch = speculative_generate_batch(spied, drafter, prompts, budgets, DraftLength(k), stops)
    monkeypatch.undo()
    for ids, n, stop, result in zip(prompts, budgets, stops, batch):
        expected = greedy_generate(target, ids, n, stop_ids=stop)
        assert result.tokens == expected
        assert result.finish_reason == ("stop" if stop else "length")
    assert batch[0].tokens == [stop_first] and batch[0].stats.rounds == []
    assert batch[1].tokens[-1] == stop_inside and batch[1].stats.accepted < sum(a for _, a in rounds(batch[1]))
    assert batch[2].tokens[-1] == stop_bonus and rounds(batch[2])[-1][1] == k  # the bonus, after k accepted
    assert len(rounds(batch[3])[-1][0]) < k  # the budget cut the last round's drafts
    prefills, verifies = sizes[:len(prompts)], sizes[len(prompts):]
    assert prefills == [1] * len(prompts)  # the prefill, a row at a time (as each row's solo run)
    assert verifies[0] == len(prompts) - 1 and verifies[-1] == 1  # row 0 ended at the prefill's token; down to one
    assert verifies == sorted(verifies, reverse=True) and len(set(verifies)) >= 3


# ---------------------------------------------------------------- sampling


@pytest.mark.parametrize("shape", SHAPES)
def test_sampled_rows_equal_solo_sampling(pairs, shape: str) -> None:  # noqa: ANN001
    """Keyed sampling, argmax drafting: row b == plain sampling of its prompt with seed + b, and the solo
    speculative run's drafts and accept counts."""
    target, drafter = pairs[shape]
    samplers = [SamplerConfig(temperature=0.8, top_k=40, seed=5 + b) for b in range(len(PROMPTS))]
    solo = [sample_generate(target, p, n, s) for p, n, s in zip(PROMPTS, BUDGETS, samplers)]
    assert sample_rows(target, PROMPTS, BUDGETS, samplers) == solo
    batch = speculative_generate_batch(target, drafter, PROMPTS, BUDGETS, DraftLength(3), samplers=samplers)
    assert [r.tokens for r in batch] == solo
    for row, ids, n, s in zip(batch, PROMPTS, BUDGETS, samplers):  # and the solo speculative run's rounds
        assert rounds(row) == rounds(speculative_generate(target, drafter, ids, n, DraftLength(3), sampler=s))
    assert solo[3] != solo[1][:13]  # the duplicate prompt draws other tokens with its own seed
    assert sum(r.stats.accepted for r in batch) > 0


@pytest.mark.parametrize("k", (1, 3))
@pytest.mark.parametrize("shape", SHAPES)
def test_sample_drafted_rows_equal_solo_sample_drafting(pairs, shape: str, k: int) -> None:  # noqa: ANN001
    """`sample` drafting: row b == its solo sample-drafting run with seed + b, tokens and rounds."""
    target, drafter = pairs[shape]
    samplers = [SamplerConfig(temperature=1.0, top_k=40, top_p=0.95, seed=5 + b) for b in range(len(PROMPTS))]
    batch = speculative_generate_batch(target, drafter, PROMPTS, BUDGETS, DraftLength(k), samplers=samplers,
                                       drafting="sample")
    for b, (row, ids, n, s) in enumerate(zip(batch, PROMPTS, BUDGETS, samplers)):
        solo = speculative_generate(target, drafter, ids, n, DraftLength(k), sampler=s, drafting="sample")
        assert row.tokens == solo.tokens, b
        assert rounds(row) == rounds(solo), b
        assert row.finish_reason == solo.finish_reason == "length"
    assert batch[3].tokens != batch[1].tokens[:13]  # the duplicate prompt, its own seed
    accepted = [a for row in batch for _, a in rounds(row)]
    assert 0 in accepted and max(accepted) > 0  # rejections and acceptances in the same batch
    with pytest.raises(ValueError, match="needs a temperature > 0"):
        speculative_generate_batch(target, drafter, PROMPTS[:2], 4, DraftLength(k), drafting="sample")


# ---------------------------------------------------------------- the cache after ragged rounds


@pytest.mark.parametrize("shape", SHAPES)
def test_cache_rows_equal_solo_caches(pairs, shape: str) -> None:  # noqa: ANN001
    """Ragged prefill, then rounds of ragged verify blocks with per-row rollbacks (what the loop does):
    every row's K/V up to its length equal a solo prefill of that row's committed tokens."""
    target, _ = pairs[shape]
    rows = [p + plain(target, p, 30) for p in (prompt(3, 3001), prompt(8, 8001), prompt(30, 30001))]
    lengths = [3, 8, 30]
    cache = RingCache(target.config, 100, batch=3)
    with torch.inference_mode():
        logits, _ = prefill(target, cache, [r[:n] for r, n in zip(rows, lengths)])
        assert not logits.isnan().any()
        for blocks, keep in (([4, 1, 3], [3, 1, 2]), ([2, 5, 1], [1, 5, 1]), ([3, 3, 3], [2, 3, 1])):
            t = max(blocks)
            ids = torch.tensor([r[n:n + b] + [0] * (t - b) for r, n, b in zip(rows, lengths, blocks)])  # (B, T)
            out = forward_rows(target, ids, cache, start_pos=cache.length)
            assert not out.logits.isnan().any()
            lengths = [n + c for n, c in zip(lengths, keep)]  # roll back: keep c of the b positions written
            cache.length = torch.tensor(lengths)
        for b, (seq, n) in enumerate(zip(rows, lengths)):
            solo = RingCache(target.config, n)
            forward_rows(target, torch.tensor([seq[:n]]), solo)
            for layer in solo.keys:
                torch.testing.assert_close(cache.keys[layer][b, :, :n], solo.keys[layer][0], atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(cache.values[layer][b, :, :n], solo.values[layer][0], atol=1e-5, rtol=1e-5)


def test_bad_batches_say_what_to_change(pairs) -> None:  # noqa: ANN001
    target, drafter = pairs["dense"]
    with pytest.raises(ValueError, match="the batch is empty"):
        greedy_rows(target, [], 4)
    with pytest.raises(ValueError, match="the prompt is empty"):
        speculative_generate_batch(target, drafter, [PROMPTS[0], []], 4, DraftLength(2))
    with pytest.raises(ValueError, match="2 prompts need 2 budgets"):
        greedy_rows(target, PROMPTS[:2], [4, 4, 4])
