"""The engine is the textbook: every row of the engine's loops (gemma4/engine/decode.py `decode`, `generate_one`;
mtp/engine/rows.py `speculative_rows`, `speculative_one`; mtp/engine/batch.py `speculative_generate_batch`) commits the tokens,
and ends for the reason, of the textbook loop's solo run of the same prompt (gemma4/generate.py `sample_generate`,
`greedy_generate`; mtp/speculative.py `speculative_rounds`, `speculative_generate`), on every case the textbook
covers. float32, token lists `==`; a speculative row's rounds (position, drafts, targets, block) are the textbook's
too.

- greedy: every family of tests/checkpoints.py SHAPES, every drafter of tests/pairs.py DRAFTERS (never, partly and
  always right), three ragged prompts (3, 11 and 21 tokens: below, past and far past the window 8) in one batch;
- keyed sampling, a seed per row and a greedy row beside them, argmax and sample drafting;
- stop ids each row's own textbook run commits (finish_reason "stop"): with a drafter always right (`Oracle`), one
  inside a block of kept drafts and one as the target's own token after them; another row's stop id that a row
  never commits; budgets per row down to 1 and one ending inside a block;
- every draft-length schedule: constant, heuristic, heuristic_transient and auto with fixed costs (its clock never
  read), each row's moving as it moves alone, and one schedule carried from call to call;
- the rings' wrap: prompts and budgets past W + slack so the rings wrap while decoding, a ring of W + 5 slots, and
  prefill in chunks of 5 and 8 positions against the textbook's one forward over the prompt;
- one row's `on_round` reports exactly the rounds `speculative_rounds` yields, the prefill first.
Every expected value is a textbook run of the same models: no token is written down here.
"""

from collections.abc import Callable, Iterable, Sequence

import pytest
import torch

from gemma4 import Gemma4Model, RingCache, SamplerConfig, greedy_generate, sample_generate
from gemma4.engine import decode, generate_one
from gemma4.engine.rows import Request, new_cache
from mtp import Drafter, DraftLength, Round, Schedule, SpecResult, speculative_generate, speculative_generate_batch
from mtp.engine import speculative_one, speculative_rows
from mtp.speculative import speculative_rounds
from tests.checkpoints import SHAPES
from tests.pairs import DRAFTERS, plain, prompt

W = 8  # the target's sliding window (tests/checkpoints.py); the drafter's is 6
PROMPTS = [prompt(3, 301), prompt(11, 1101), prompt(21, 2101)]  # ragged: below, past and far past the window
BUDGETS = [20, 12, 16]
K = 3


def sampler(b: int) -> SamplerConfig:
    """Row b's keyed sampler: its own seed."""
    return SamplerConfig(temperature=0.9, top_k=40, top_p=0.95, seed=11 + b)


def never() -> float:
    raise AssertionError("auto read its clock: its costs were to be fixed")


# name -> a fresh schedule. auto with both costs fixed follows the acceptance alone: the same on every machine.
SCHEDULES: dict[str, Callable[[], Schedule]] = {
    "constant": lambda: DraftLength(K),
    "heuristic": lambda: DraftLength(2, "heuristic"),
    "heuristic_transient": lambda: DraftLength(2, "heuristic_transient"),
    "auto": lambda: DraftLength(2, "auto", costs=lambda n: 1.0 + 0.2 * (n - 1), draft_cost=0.3, clock=never),
}


def fields(rounds: Iterable[Round]) -> list[tuple]:
    """Every field of every round, for `==`."""
    return [(r.position, r.drafted, r.targets, r.block, r.prefill) for r in rounds]


def same_run(row: SpecResult, solo: SpecResult, where: object) -> None:
    """An engine row and the textbook's solo run: the same tokens, finish and verify rounds."""
    assert row.tokens == solo.tokens, where
    assert row.finish_reason == solo.finish_reason, where
    assert fields(row.stats.rounds) == fields(solo.stats.rounds), where


def ring(model: Gemma4Model, positions: int, slack: int) -> RingCache:
    """One row's cache whose sliding layers keep W + slack slots (positions: its capacity)."""
    w = model.embed_tokens.weight
    return RingCache(model.config, positions, slack=slack, dtype=w.dtype, device=w.device)


def first_new(tokens: list[int], at: int) -> int:
    """The first token at index >= at that appears there for the first time (a stop id that ends the run there)."""
    found = [x for i, x in enumerate(tokens) if i >= at and x not in tokens[:i]]
    assert found, "no new token that late: the stop would prove nothing"
    return found[0]


class Oracle:
    """A drafter always right: it proposes each row's own textbook continuation (plain decoding's, which greedy and
    argmax drafting commit), recognising a row by its newest position (the rows' positions must not overlap). Only
    `propose` (the textbook loop's, one row) and `propose_rows` (the engine's) are asked of a drafter."""

    def __init__(self, prompts: list[list[int]], continuations: list[list[int]]) -> None:  # longer than runs ask
        self.at = {n: p + c for p, c in zip(prompts, continuations) for n in range(len(p), len(p) + len(c))}
        assert len(self.at) == sum(map(len, continuations)), "two rows reach the same position: ambiguous"

    def propose(self, target, *, token: int, hidden, position: int, kv, k: int,  # noqa: ANN001
                sampler=None) -> tuple[list[int], list]:  # noqa: ANN001
        assert self.at[position][position] == token, "off the textbook's path"
        return self.at[position][position + 1:position + 1 + k], []

    def propose_rows(self, target, tokens: list[int], hidden, positions: list[int], source_kv, k: int,  # noqa: ANN001
                     samplers=None) -> tuple[torch.Tensor, None]:  # noqa: ANN001
        assert all(self.at[n][n] == x for x, n in zip(tokens, positions)), "off the textbook's path"
        return torch.tensor([self.at[n][n + 1:n + 1 + k] for n in positions]), None


STOP_PROMPTS = PROMPTS + [prompt(14, 1401)]
STOP_BUDGETS = [1, 16, 20, 9]
REASONS = ["length", "stop", "stop", "length"]  # what `stops` makes of each row


def stop_pair(models, shape: str) -> tuple[Gemma4Model, Drafter]:  # noqa: ANN001
    """The target as written (its output repeats less than the echo pair's: new tokens to stop at) with the echo
    drafter, which was written for it (tests/pairs.py): partly right there too."""
    return models[shape, "random"][0], models[shape, "echo"][1]


def stops(free: Sequence[list[int]]) -> list[list[int]]:
    """Per-row stop ids from the rows' textbook runs without stops (`free`, STOP_BUDGETS long): none for row 0
    (its budget of 1 ends it); row 1 one it commits at its 4th token or later, row 2 at its 9th or later; row 3
    row 1's stop id, one it never commits."""
    other = [x for x in free[1] if x not in free[3]]
    assert other, "row 1 commits nothing row 3 does not: row 3's stop would prove nothing"
    return [[], [first_new(free[1], 3)], [first_new(free[2], 8)], [other[0]]]


# ---------------------------------------------------------------- greedy: every family, every drafter


@pytest.mark.parametrize("kind", DRAFTERS)
@pytest.mark.parametrize("shape", SHAPES)
def test_speculative_rows_equal_textbook_runs(models, shape: str, kind: str) -> None:  # noqa: ANN001
    """Greedy, one batch through `speculative_rows`: every row reports exactly the rounds `speculative_rounds`
    yields on its prompt alone, the prefill first, and returns their tokens, ending on its budget."""
    target, drafter = models[shape, kind]
    seen: list[list[Round]] = [[] for _ in PROMPTS]
    rows = [Request(p, n) for p, n in zip(PROMPTS, BUDGETS)]
    batch = speculative_rows(target, drafter, rows, [DraftLength(K) for _ in rows],
                             on_round=lambda b, r: seen[b].append(r))
    for b, (p, n) in enumerate(zip(PROMPTS, BUDGETS)):
        solo = list(speculative_rounds(target, drafter, p, n, DraftLength(K)))
        assert fields(seen[b]) == fields(solo), b
        assert fields(batch[b].stats.rounds) == fields(solo[1:]), b
        assert batch[b].tokens == [t for r in solo for t in r.block] and len(batch[b].tokens) == n, b
        assert batch[b].finish_reason == "length", b


@pytest.mark.parametrize("shape", SHAPES)
def test_speculative_batch_equals_textbook_runs(models, shape: str) -> None:  # noqa: ANN001
    """Greedy, one batch through `speculative_generate_batch` (a copy of the schedule per row), the echo drafter:
    every row is `speculative_generate` alone, and the blocks it streamed are its tokens."""
    target, drafter = models[shape, "echo"]
    streamed: list[list[int]] = [[] for _ in PROMPTS]
    batch = speculative_generate_batch(target, drafter, PROMPTS, BUDGETS, DraftLength(K),
                                       on_commit=lambda b, block, _: streamed[b].extend(block))
    for b, (p, n) in enumerate(zip(PROMPTS, BUDGETS)):
        same_run(batch[b], speculative_generate(target, drafter, p, n, DraftLength(K)), b)
        assert streamed[b] == batch[b].tokens, b


@pytest.mark.parametrize("kind", DRAFTERS)
@pytest.mark.parametrize("shape", SHAPES)
def test_plain_rows_equal_textbook_runs(models, shape: str, kind: str) -> None:  # noqa: ANN001
    """Greedy, one batch through `decode` (each drafter kind's target): every row, and every row's streamed tokens,
    are `greedy_generate`'s alone."""
    target, _ = models[shape, kind]
    streamed: list[list[int]] = [[] for _ in PROMPTS]
    rows = decode(target, PROMPTS, BUDGETS, on_token=lambda b, t: streamed[b].append(t))
    expected = [greedy_generate(target, p, n) for p, n in zip(PROMPTS, BUDGETS)]
    assert [r.tokens for r in rows] == streamed == expected
    assert [r.finish_reason for r in rows] == ["length"] * len(PROMPTS)


# ---------------------------------------------------------------- keyed sampling


@pytest.mark.parametrize("shape", SHAPES)
def test_sampled_plain_rows_equal_textbook_runs(models, shape: str) -> None:  # noqa: ANN001
    """Keyed sampling, a seed per row and a temperature-0 row beside them: every `decode` row is `sample_generate`
    alone with its sampler; the sampled rows are not the greedy ones."""
    target, _ = models[shape, "echo"]
    samplers = [SamplerConfig(temperature=0.0)] + [sampler(b) for b in (1, 2)]
    rows = decode(target, PROMPTS, BUDGETS, samplers)
    expected = [sample_generate(target, p, n, s) for p, n, s in zip(PROMPTS, BUDGETS, samplers)]
    assert [r.tokens for r in rows] == expected
    assert expected[0] == plain(target, PROMPTS[0], BUDGETS[0])
    assert expected[1:] != [plain(target, p, n) for p, n in zip(PROMPTS[1:], BUDGETS[1:])]


@pytest.mark.parametrize("drafting", ("argmax", "sample"))
@pytest.mark.parametrize("shape", SHAPES)
def test_sampled_speculative_rows_equal_textbook_runs(models, shape: str, drafting: str) -> None:  # noqa: ANN001
    """Keyed sampling, a seed per row (argmax drafting: and a temperature-0 row): every row of
    `speculative_generate_batch` is `speculative_generate` alone with its sampler and drafting, tokens and rounds;
    argmax drafting's tokens are plain sampling's."""
    target, drafter = models[shape, "echo"]
    samplers = [SamplerConfig(temperature=0.0) if b == 0 and drafting == "argmax" else sampler(b) for b in range(3)]
    solo = [speculative_generate(target, drafter, p, n, DraftLength(K), sampler=s, drafting=drafting)
            for p, n, s in zip(PROMPTS, BUDGETS, samplers)]
    batch = speculative_generate_batch(target, drafter, PROMPTS, BUDGETS, DraftLength(K), samplers=samplers,
                                       drafting=drafting)
    for b in range(len(PROMPTS)):
        same_run(batch[b], solo[b], b)
    if drafting == "argmax":
        assert [r.tokens for r in solo] == [plain(target, p, n, s) for p, n, s in zip(PROMPTS, BUDGETS, samplers)]
    accepted = [r.matched for s in solo for r in s.stats.rounds]
    assert 0 in accepted and max(accepted) > 0  # rejections and acceptances: both paths of `accept` ran


# ---------------------------------------------------------------- stop ids and budgets


@pytest.mark.parametrize("sampled", (False, True))
@pytest.mark.parametrize("shape", SHAPES)
def test_plain_stops_and_budgets(models, shape: str, sampled: bool) -> None:  # noqa: ANN001
    """Per-row stop ids that the rows' own textbook runs commit, a stop id that only another row commits, and
    budgets of 1, 9, 16 and 20: every `decode` row is `sample_generate` alone with its stop ids and budget, and
    ends for the same reason."""
    target, _ = stop_pair(models, shape)
    samplers = [sampler(b) if sampled else None for b in range(len(STOP_PROMPTS))]
    free = [sample_generate(target, p, n, s) for p, n, s in zip(STOP_PROMPTS, STOP_BUDGETS, samplers)]
    ids = stops(free)
    rows = decode(target, STOP_PROMPTS, STOP_BUDGETS, samplers, ids)
    expected = [sample_generate(target, p, n, s, stop)
                for p, n, s, stop in zip(STOP_PROMPTS, STOP_BUDGETS, samplers, ids)]
    assert [r.tokens for r in rows] == expected
    assert [r.finish_reason for r in rows] == REASONS
    assert [len(t) for t in expected] == [1, free[1].index(ids[1][0]) + 1, free[2].index(ids[2][0]) + 1, 9]


@pytest.mark.parametrize("mode", ("greedy", "sample"))  # argmax drafting: test_stops_inside_accepted_blocks
@pytest.mark.parametrize("shape", SHAPES)
def test_speculative_stops_and_budgets(models, shape: str, mode: str) -> None:  # noqa: ANN001
    """As test_plain_stops_and_budgets, speculative (greedy, keyed sampling with sample drafting), the stops picked
    from each row's own textbook speculative run: every row of `speculative_generate_batch` is
    `speculative_generate` alone, tokens, rounds and finish."""
    target, drafter = stop_pair(models, shape)
    drafting = "sample" if mode == "sample" else "argmax"
    samplers = [None if mode == "greedy" else sampler(b) for b in range(len(STOP_PROMPTS))]

    def solo(p: list[int], n: int, s: SamplerConfig | None, stop: Sequence[int] = ()) -> SpecResult:
        return speculative_generate(target, drafter, p, n, DraftLength(K), stop, s, drafting)

    free = [solo(p, n, s).tokens for p, n, s in zip(STOP_PROMPTS, STOP_BUDGETS, samplers)]
    ids = stops(free)
    batch = speculative_generate_batch(target, drafter, STOP_PROMPTS, STOP_BUDGETS, DraftLength(K), ids, samplers,
                                       drafting)
    for b, (p, n, s, stop) in enumerate(zip(STOP_PROMPTS, STOP_BUDGETS, samplers, ids)):
        same_run(batch[b], solo(p, n, s, stop), b)
    assert [r.finish_reason for r in batch] == REASONS
    assert [r.tokens[-1] for r in batch[1:3]] == [ids[1][0], ids[2][0]]


@pytest.mark.parametrize("sampled", (False, True))
@pytest.mark.parametrize("shape", SHAPES)
def test_stops_inside_accepted_blocks(models, shape: str, sampled: bool) -> None:  # noqa: ANN001
    """With a drafter always right (`Oracle`) and K = 3 every round commits 4 new tokens (1-4, 5-8, ...; token 0 is
    the prefill's): row 0 stops at a kept draft inside a block (the drafts after it are not emitted), row 1 at a
    block's last token (the target's own), row 2's budget ends inside its third block (its last round drafts fewer).
    Greedy and keyed (argmax drafting): every row of `speculative_generate_batch` is `speculative_generate` alone."""
    target, _ = stop_pair(models, shape)
    prompts = [prompt(3, 302), prompt(30, 3002), prompt(60, 6002)]  # positions 3-26, 30-53 and 60-83 apart
    samplers = [sampler(b) if sampled else None for b in range(len(prompts))]
    free = [sample_generate(target, p, 24, s) for p, s in zip(prompts, samplers)]
    drafter = Oracle(prompts, free)
    inside = [x for i, x in enumerate(free[0][:20]) if i % (K + 1) not in (0, K) and x not in free[0][:i]]
    bonus = [x for i, x in enumerate(free[1][:20]) if i > 0 and i % (K + 1) == 0 and x not in free[1][:i]]
    assert inside and bonus, "no new token there: the stop would prove nothing"
    ids, budgets = [[inside[0]], [bonus[0]], []], [20, 20, 1 + (K + 1) * 2 + 2]
    batch = speculative_generate_batch(target, drafter, prompts, budgets, DraftLength(K), ids, samplers)
    for b, (p, n, s, stop) in enumerate(zip(prompts, budgets, samplers, ids)):
        same_run(batch[b], speculative_generate(target, drafter, p, n, DraftLength(K), stop, s), b)
    assert [r.finish_reason for r in batch] == ["stop", "stop", "length"]
    last = [r.stats.rounds[-1] for r in batch]
    assert len(last[0].block) < last[0].matched and last[0].block[-1] == inside[0]  # cut inside the kept drafts
    assert last[1].matched == K and last[1].block == last[1].drafted + last[1].targets[-1:]  # the bonus
    assert len(last[2].drafted) < K and len(batch[2].tokens) == budgets[2]
    assert all(r.matched == len(r.drafted) for row in batch for r in row.stats.rounds)  # always right


# ---------------------------------------------------------------- every schedule


@pytest.mark.parametrize(("schedule", "shape"), list(zip(SCHEDULES, SHAPES)))
def test_every_schedule(models, schedule: str, shape: str) -> None:  # noqa: ANN001
    """Each schedule on a family of its own, the echo drafter (partly right): every row of
    `speculative_generate_batch` (a copy of the schedule each) drafts as `speculative_generate` alone with a fresh
    schedule; one schedule carried through `speculative_one` call after call drafts as one carried through
    `speculative_generate` calls."""
    target, drafter = models[shape, "echo"]
    make = SCHEDULES[schedule]
    batch = speculative_generate_batch(target, drafter, PROMPTS, BUDGETS, make())
    engine, textbook = make(), make()  # each carried through three calls
    for b, (p, n) in enumerate(zip(PROMPTS, BUDGETS)):
        same_run(batch[b], speculative_generate(target, drafter, p, n, make()), ("batch", b))
        same_run(speculative_one(target, drafter, p, n, engine), speculative_generate(target, drafter, p, n, textbook),
                 ("carried", b))
    if schedule != "constant":  # the schedule did move K
        assert len({len(r.drafted) for row in batch for r in row.stats.rounds}) > 1


# ---------------------------------------------------------------- the rings' wrap and chunked prefill


@pytest.mark.parametrize("shape", SHAPES)
def test_rows_wrap_their_rings(models, shape: str) -> None:  # noqa: ANN001
    """Prompts of 50, 61 and 130 tokens, 24 new each, prefilled in chunks of 8: the batch's rings hold W + 64 = 72
    slots, so rows 0 and 1 wrap theirs while decoding and row 2 while prefilling and decoding (the textbook's rings,
    W + max(P, 64), wrap while decoding too). Plain and speculative rows (K = 4) equal their textbook runs."""
    target, drafter = models[shape, "echo"]
    prompts, n, chunk = [prompt(50, 5001), prompt(61, 6101), prompt(130, 13001)], 24, 8
    rows = [Request(p, n) for p in prompts]
    ring_slots = new_cache(target, rows, chunk, verify=True).ring
    assert ring_slots == W + 64 and all((len(p) - 1) // ring_slots < (len(p) + n - 2) // ring_slots for p in prompts)
    assert [r.tokens for r in decode(target, prompts, n, prefill_chunk=chunk)] == \
        [greedy_generate(target, p, n) for p in prompts]
    batch = speculative_generate_batch(target, drafter, prompts, n, DraftLength(4), prefill_chunk=chunk)
    for b, p in enumerate(prompts):
        same_run(batch[b], speculative_generate(target, drafter, p, n, DraftLength(4)), b)


@pytest.mark.parametrize("shape", SHAPES)
def test_one_row_on_a_ring_of_w_plus_5(models, shape: str) -> None:  # noqa: ANN001
    """A cache of W + 5 = 13 ring slots (tests/equivalence/test_window.py's), a 32-token prompt and 24 new tokens:
    the prefill runs in chunks of 5 and the rings wrap 4 times. `generate_one` (greedy and keyed) and
    `speculative_one` (K = 4, all the slack verifies; greedy and sample drafting) equal their textbook runs, whose
    rings hold W + 64 slots."""
    target, drafter = models[shape, "echo"]
    p, n, slack = prompt(32, 3201), 24, 5
    room = len(p) + n
    for s in (None, sampler(0)):
        cache = ring(target, room, slack)
        assert generate_one(target, p, n, s, cache=cache) == sample_generate(target, p, n, s), s
        assert int(cache.slot_positions.max()) + 1 > 4 * cache.ring == 4 * (W + slack)  # wrapped 4 times
    for s, drafting in ((None, "argmax"), (sampler(0), "sample")):
        cache = ring(target, room, slack)
        got = speculative_one(target, drafter, p, n, DraftLength(4), sampler=s, drafting=drafting, cache=cache)
        same_run(got, speculative_generate(target, drafter, p, n, DraftLength(4), sampler=s, drafting=drafting),
                 drafting)
        assert int(cache.slot_positions.max()) + 1 > 4 * cache.ring, drafting


@pytest.mark.parametrize("shape", SHAPES)
def test_chunked_prefill_equals_one_forward(models, shape: str) -> None:  # noqa: ANN001
    """A 77-token prompt (no chunk of 8 divides it: the last is 5 long) prefilled in chunks of 8 by `generate_one`
    (greedy and keyed) and `speculative_one` (greedy): the tokens and rounds of the textbook's one forward over the
    prompt. (Keyed speculative rows prefilled in chunks: test_one_row_on_a_ring_of_w_plus_5.)"""
    target, drafter = models[shape, "echo"]
    p, n, chunk = prompt(77, 7701), 24, 8
    for s in (None, sampler(0)):
        assert generate_one(target, p, n, s, prefill_chunk=chunk) == sample_generate(target, p, n, s), s
    got = speculative_one(target, drafter, p, n, DraftLength(K), prefill_chunk=chunk)
    same_run(got, speculative_generate(target, drafter, p, n, DraftLength(K)), chunk)


# ---------------------------------------------------------------- one row's rounds


@pytest.mark.parametrize("kind", DRAFTERS)
@pytest.mark.parametrize("shape", SHAPES)
def test_on_round_reports_the_textbook_rounds(models, shape: str, kind: str) -> None:  # noqa: ANN001
    """Greedy, one row: `speculative_one`'s `on_round` sees exactly the rounds `speculative_rounds` yields (a batch
    of one runs the textbook's arithmetic), the prefill first, and its tokens are their blocks."""
    target, drafter = models[shape, kind]
    p, n = PROMPTS[2], 20
    seen: list[Round] = []
    result = speculative_one(target, drafter, p, n, DraftLength(K), on_round=seen.append)
    assert fields(seen) == fields(speculative_rounds(target, drafter, p, n, DraftLength(K)))
    assert result.tokens == [t for r in seen for t in r.block] and seen[0].prefill


@pytest.mark.parametrize("drafting", ("argmax", "sample"))
@pytest.mark.parametrize("shape", SHAPES)
def test_on_round_reports_the_textbook_rounds_when_sampling(models, shape: str, drafting: str) -> None:  # noqa: ANN001
    """Keyed sampling, one row, with a stop id the run commits: `on_round` sees exactly `speculative_rounds`'s
    rounds, the last one cut after the stop id."""
    target, drafter = models[shape, "echo"]
    p, n, s = PROMPTS[2], 20, sampler(0)
    free = speculative_generate(target, drafter, p, n, DraftLength(K), sampler=s, drafting=drafting).tokens
    stop = [first_new(free, 6)]
    seen: list[Round] = []
    result = speculative_one(target, drafter, p, n, DraftLength(K), stop, s, drafting, on_round=seen.append)
    assert fields(seen) == fields(speculative_rounds(target, drafter, p, n, DraftLength(K), stop, s, drafting))
    assert result.finish_reason == "stop" and result.tokens[-1] == stop[0]
