"""The equivalence suite: speculative greedy == plain greedy, token for token, in float32.

Over the three tiny shapes, K in {1, 2, 3, 4, 6, 8}, the three schedules, prompts shorter and longer
than the sliding window (8), budgets that end inside a drafted block, a stop id inside an accepted
block, and the three drafters of tests/pairs.py (random: almost never right, echo: partly, always:
every draft right), all real drafter modules.
A cache-free reference loop written from the design (mtp/README.md §7) must reproduce the loop's committed
tokens and every round's drafts and acceptance counts exactly.
"""

import copy
from pathlib import Path

import pytest
import torch

from gemma4 import Gemma4Model, greedy_generate, load_target, reference_greedy
from gemma4.tokenizer import Gemma4Tokenizer
from mtp import SCHEDULES, Drafter, DraftLength, Schedule, load_drafter, speculative_generate
from tests.checkpoints import SHAPES
from tests.measured import ACCEPTANCE  # printed by the terminal summary
from tests.pairs import DRAFTERS, PROMPTS, plain, prompt  # the `models` fixture is in conftest.py
from mtp.engine import speculative_one
from mtp.speculative import speculative_rounds
from mtp.stats import result_of
from gemma4.engine.forward import forward_rows
from mtp.engine.drafts import drafter_inputs, pairs, propose_rows, ring_kv

KS = (1, 2, 4, 8)
# heuristic_transient drafts as heuristic within one call (they differ across calls: its own test below).
GRID_SCHEDULES = tuple(s for s in SCHEDULES if s != "heuristic_transient")


def target_tokenizer(demo: Path) -> Gemma4Tokenizer:
    return Gemma4Tokenizer(demo / "target" / "tokenizer.json")




@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("kind", PROMPTS)
@pytest.mark.parametrize("schedule", GRID_SCHEDULES)
@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("shape", SHAPES)
def test_speculative_equals_plain_greedy(models, shape: str, k: int, schedule: str, kind: str, drafter: str) -> None:  # noqa: ANN001
    target, draft_model = models[shape, drafter]
    budget = 17 + k  # 17 + K: blocks rarely line up with the end, so the last round is cut by the budget
    result = speculative_generate(target, draft_model, prompt(kind), budget, DraftLength(k, schedule))
    assert result.tokens == plain(target, prompt(kind), budget)
    assert result.finish_reason == "length"
    ACCEPTANCE.setdefault((shape, drafter), []).append(result.stats.acceptance_rate)


def test_drafters_cover_every_path(models) -> None:  # noqa: ANN001
    """The three drafters really are never, partly and always right (else the suite proves less)."""
    partial: list[int] = []  # the echo drafter's accepted counts, every shape
    for shape in SHAPES:
        rates = {}
        for drafter in DRAFTERS:
            target, draft_model = models[shape, drafter]
            rates[drafter] = speculative_generate(target, draft_model, prompt("long"), 40, DraftLength(3)).stats
        assert rates["random"].acceptance_rate < 0.2, shape
        assert 0.2 < rates["echo"].acceptance_rate < 0.95, shape
        assert rates["always"].acceptance_rate == 1.0, shape
        partial += [r.matched for r in rates["echo"].rounds]
    assert 0 in partial and any(0 < a < 3 for a in partial) and 3 in partial  # none, some, all accepted


def test_stop_id_inside_an_accepted_block() -> None:
    """A stop id met inside an accepted block cuts the block right after it.

    This needs a drafter whose accepted drafts are new tokens (an echo drafter only ever repeats a
    token the target already committed), so it runs on the bundled trained demo pair."""
    demo = Path(__file__).resolve().parents[2] / "scripts" / "demo"
    target, draft_model = load_target(demo / "target"), load_drafter(demo / "assistant")
    ids = [2] + target_tokenizer(demo).encode("def read_config(path):\n    ")
    free = speculative_generate(target, draft_model, ids, 48, DraftLength(4))
    # A token committed as an accepted draft, not last in its block, and seen there for the first time.
    committed, position, stop = 1, None, None
    for r in free.stats.rounds:
        for i in range(min(r.matched, 3)):
            if r.drafted[i] not in free.tokens[: committed + i]:
                position, stop = committed + i, r.drafted[i]
                break
        if stop is not None:
            break
        committed += r.matched + 1
    assert stop is not None, "no accepted draft introduced a new token"
    expected = greedy_generate(target, ids, 48)[: position + 1]
    assert expected[-1] == stop
    result = speculative_generate(target, draft_model, ids, 48, DraftLength(4), stop_ids=[stop])
    assert result.tokens == expected
    assert result.finish_reason == "stop"
    assert result.stats.emitted == len(expected)
    assert result.stats.accepted < sum(r.matched for r in result.stats.rounds)  # drafts after the stop
    assert reference_greedy(target, ids, 48, stop_ids=[stop]) == expected


def test_budget_of_one_and_two(models) -> None:  # noqa: ANN001
    target, draft_model = models["e2b", "always"]
    for n in (1, 2):
        result = speculative_generate(target, draft_model, prompt("short"), n, DraftLength(8))
        assert result.tokens == plain(target, prompt("short"), n)
        assert result.stats.drafted == 0 and result.stats.target_forwards == n


# ---------------------------------------------------------------- the cache-free reference loop


@torch.inference_mode()
def reference_loop(
    target: Gemma4Model, drafter: Drafter, prompt_ids: list[int], max_new: int, length: Schedule,
) -> tuple[list[int], list[tuple[list[int], int]]]:
    """mtp/README.md §7 with no cache at all: every round recomputes the target over the committed sequence,
    hands the drafter the K/V of positions 0..t-1, and verifies by recomputing everything again."""
    seq = list(prompt_ids)
    seq.append(int(forward_rows(target, torch.tensor([seq])).logits[0, -1].argmax()))
    rounds = []
    while len(seq) - len(prompt_ids) < max_new:
        t = len(seq) - 1
        k_eff = length.next(max_new - (len(seq) - len(prompt_ids)) - 1)  # the schedule's K, within the budget
        before = forward_rows(target, torch.tensor([seq[:t]]))  # positions 0..t-1, fresh
        drafts = propose_rows(drafter, target, [seq[t]], before.hidden[:, -1], [t], before.source_kv, k_eff)[0][0].tolist() \
            if k_eff else []
        greedy = forward_rows(target, torch.tensor([seq + drafts])).logits[0, t:].argmax(-1).tolist()  # g_0..g_K
        a = 0
        while a < len(drafts) and drafts[a] == greedy[a]:
            a += 1
        seq += drafts[:a] + [greedy[a]]
        rounds.append((drafts, a))
        length.observe(k_eff, a)  # auto: both costs fixed below, so no clock is read
    return seq[len(prompt_ids):], rounds


# K 1, 3 and 8 on the constant schedule; the schedules that move K start from 3.
SCHEDULE_KS = [(s, k) for s in SCHEDULES for k in ((1, 3, 8) if s == "constant" else (3,))]


@pytest.mark.parametrize(("schedule", "k"), SCHEDULE_KS)
@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_reference_loop(models, shape: str, drafter: str, k: int, schedule: str) -> None:  # noqa: ANN001
    target, draft_model = models[shape, drafter]
    # `auto` with its costs fixed: both loops then choose K from the same acceptance alone.
    fixed = {"costs": lambda n: 1.0 + 0.1 * (n - 1), "draft_cost": 0.2} if schedule == "auto" else {}
    tokens, rounds = reference_loop(target, draft_model, prompt("long"), 30, DraftLength(k, schedule, **fixed))
    result = speculative_generate(target, draft_model, prompt("long"), 30, DraftLength(k, schedule, **fixed))
    assert result.tokens == tokens
    assert [(r.drafted, r.matched) for r in result.stats.rounds] == rounds


def test_heuristic_schedule_persists_across_calls(models) -> None:  # noqa: ANN001
    target, draft_model = models["dense", "always"]
    for schedule, carried in (("heuristic", True), ("heuristic_transient", False)):
        length = DraftLength(2, schedule)
        first = speculative_generate(target, draft_model, prompt("short"), 30, length)
        assert first.stats.rounds[0].matched == 2 and len(first.stats.rounds[1].drafted) == 4  # +2 when all accepted
        reached = length.k
        second = speculative_generate(target, draft_model, prompt("short"), 30, length)
        expected_first = min(reached, 30 - 2) if carried else 2
        assert len(second.stats.rounds[0].drafted) == expected_first
    length = DraftLength(5, "heuristic")
    speculative_generate(*models["dense", "random"], prompt("short"), 30, length)
    assert length.k == 1  # -1 per rejection, floor 1


# ---------------------------------------------------------------- invariants and statistics


def test_cache_length_and_statistics_match_a_recount(models, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """Every statistic against a recount made without the loop's bookkeeping: the drafts as the drafter
    returned them, checked against the tokens of a plain greedy run; the forwards as the target saw them."""
    for shape in SHAPES:
        # The spies go on copies: `models` is the session's, read by other tests.
        target, draft_model = copy.deepcopy(models[shape, "echo"])
        p = prompt("long")
        full = p + plain(target, prompt("long"), 37)  # prompt + the committed tokens, known beforehand
        seen: list[tuple[int, int, int]] = []  # (start_pos, cache length, committed tokens) at every verify forward
        proposals: list[tuple[int, list[int]]] = []  # (position, drafts) as the drafter returned them
        committed = [len(p)]
        forward, propose = target.forward, draft_model.propose

        def spy(ids, start=0, cache=None, last=None):  # noqa: ANN001, ANN202
            if start:  # past the prefill's, from position 0
                seen.append((start, cache.length, committed[0]))
            return forward(ids, start, cache, last)

        def spy_propose(target_, **kw):  # noqa: ANN001, ANN003, ANN202 (token, hidden, position, kv, k, sampler)
            drafts, q = propose(target_, **kw)
            proposals.append((kw["position"], drafts))
            return drafts, q

        monkeypatch.setattr(target, "forward", spy)
        monkeypatch.setattr(draft_model, "propose", spy_propose)
        rounds = []
        for r in speculative_rounds(target, draft_model, p, 37, DraftLength(3)):
            committed[0] += len(r.block)
            rounds.append(r)
        result = result_of(rounds, ())
        monkeypatch.undo()
        # Every round starts with the cache holding exactly the committed tokens but the newest.
        assert all(start == length == n - 1 for start, length, n in seen)
        assert result.tokens == full[len(p):]
        # Draft i of a round at t is right iff it is the token plain greedy put at t + 1 + i.
        accepted = []
        for t, drafts in proposals:
            a = 0
            while a < len(drafts) and drafts[a] == full[t + 1 + a]:
                a += 1
            accepted.append(a)
        longest = max(len(d) for _, d in proposals)
        drafted_at = [sum(len(d) > i for _, d in proposals) for i in range(longest)]
        accepted_at = [sum(a > i for a in accepted) for i in range(longest)]
        s = result.stats
        assert [(r.drafted, r.matched) for r in s.rounds] == [(d, a) for (_, d), a in zip(proposals, accepted)]
        assert 0 < sum(accepted) < s.drafted == sum(len(d) for _, d in proposals)  # partly right: the case is mixed
        assert (s.emitted, s.accepted, s.target_forwards) == (37, sum(accepted), 1 + len(seen))
        assert (s.drafted_at, s.accepted_at) == (drafted_at, accepted_at)
        assert s.per_position_acceptance == [a / d for a, d in zip(accepted_at, drafted_at)]
        assert s.acceptance_rate == sum(accepted) / sum(drafted_at)
        assert s.tokens_per_forward == 37 / (1 + len(seen))


def test_statistics_of_a_drafter_always_right(models) -> None:  # noqa: ANN001
    """Counted by hand: the prefill commits 1 token, four rounds of K = 3 commit 4 each (17), and the
    18th comes from a round with no drafts (K = 0: drafting it could not be committed)."""
    target, draft_model = models["moe", "always"]
    s = speculative_generate(target, draft_model, prompt("short"), 18, DraftLength(3)).stats
    assert [len(r.drafted) for r in s.rounds] == [3, 3, 3, 3, 0] and [r.matched for r in s.rounds] == [3, 3, 3, 3, 0]
    assert s.k_histogram == {0: 1, 3: 4}
    assert (s.emitted, s.drafted, s.accepted, s.target_forwards) == (18, 12, 12, 6)
    assert (s.drafted_at, s.accepted_at, s.per_position_acceptance) == ([4, 4, 4], [4, 4, 4], [1.0, 1.0, 1.0])
    assert (s.acceptance_rate, s.tokens_per_forward) == (1.0, 3.0)


def test_auto_stops_drafting_for_a_drafter_that_is_never_right(models) -> None:  # noqa: ANN001
    """With a verify costing 1 + 0.1 per extra row and a draft step 0.3 (fixed, so the run is the same on every
    machine), auto reaches K = 0 within 4 rounds of a drafter that is never right, still commits plain
    greedy's tokens, and only probes afterwards (one round in 16 at most)."""
    target, draft_model = models["dense", "random"]
    length = DraftLength(4, "auto", costs=lambda n: 1.0 + 0.1 * (n - 1), draft_cost=0.3)
    result = speculative_generate(target, draft_model, prompt("long"), 40, length)
    assert result.tokens == plain(target, prompt("long"), 40)
    ks = [len(r.drafted) for r in result.stats.rounds]
    first_zero = ks.index(0)
    assert first_zero < 4 and result.stats.accepted == 0
    assert sum(k > 0 for k in ks[first_zero:]) <= len(ks[first_zero:]) // 16 + 1  # probes only


def test_auto_drafts_long_for_a_drafter_that_is_always_right(models) -> None:  # noqa: ANN001
    target, draft_model = models["dense", "always"]
    length = DraftLength(2, "auto", costs=lambda n: 1.0 + 0.1 * (n - 1), draft_cost=0.1)
    result = speculative_generate(target, draft_model, prompt("long"), 80, length)
    assert result.tokens == plain(target, prompt("long"), 80)
    ks = [len(r.drafted) for r in result.stats.rounds]
    # One draft first, `initial` once one is kept; an untested position is taken as likely as the last: one deeper.
    assert ks[:4] == [1, 2, 3, 4] and max(ks) >= 7
