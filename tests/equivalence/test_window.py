"""The bounded KV cache is exact: sliding layers that keep only a ring of W + slack slots (gemma4/engine/ring.py) give the
logits and tokens of a cache that keeps every position, and of the cache-free forward.

The test models' windows are tiny (target W = 8, drafter W_d = 6) and the rings here are W + 1..7 slots (a cache
made with `slack=`, or prefill chunks that small), so the prompts (40-150 tokens) and generations (30-60) wrap
every ring many times: chunked prefills, verifies that write across the wrap and roll back right after it, rows of
a batch at different positions, conversations that reuse a prefix, the textbook modules, the static steps, and
transformers' logits. Logits are bound as tests/tolerance.py bounds them (float64 runs); tokens are equal.
The last tests show the failures the design prevents: a ring one slot shorter than a reader needs, and a
rollback that trusts slots the ring has reused, each far off the reference.
"""

import copy
import dataclasses
import math

import pytest
import torch

from gemma4 import (
    Gemma4Model, Gemma4Tokenizer, RingCache, SamplerConfig, greedy_generate, load_target, reference_greedy,
)
from gemma4.engine.ring import EMPTY
from gemma4.extras.memory import cache_bytes
from gemma4.fast.static import StaticDrafter, StaticKVCache, StaticTarget
from gemma4.engine import decode
from gemma4.generate import sample_generate
from gemma4.engine.rows import prefill
from mtp import Conversation, DraftLength, load_drafter, speculative_generate, speculative_generate_batch
from mtp.extras.conversation import common_prefix
from mtp.extras.growing import GrowingCache
from tests.checkpoints import SHAPES, STOP_IDS
from tests.pairs import plain
from tests.tf_oracle import tf_logits, tf_target
from tests.tokenizer_fixture import write_tokenizer
from tests.tolerance import EPS32, FLOOR, RATIO, SAME_MATH, assert_fp32_parity
from gemma4.engine import generate_one
from mtp.engine import speculative_one
from mtp.sample_drafting import draft_logits
from gemma4.engine.forward import forward_rows
from mtp.engine.drafts import drafter_inputs, pairs, propose_rows, ring_kv

W = 8  # the target's sliding window (tests/checkpoints.py)
SLACK = 5  # the rings: W + 5 = 13 slots, verifies of up to 4 drafts
NEW = 30  # new tokens
GREEDY = SamplerConfig(temperature=0.0)
SAMPLER = SamplerConfig(temperature=0.9, top_k=40, seed=5)


def ids(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return [2] + torch.randint(3, 512, (n - 1,), generator=g).tolist()  # BOS, then no special ids


PROMPT = ids(40, 1)  # 5 target windows, 3 rings of 13
ODD = ids(43, 11)  # a prime length: no chunk of 3, 5 or 7 divides it


def ring(model: Gemma4Model, positions: int, slack: int = SLACK, **kw) -> RingCache:  # noqa: ANN003
    """A cache whose sliding layers keep W + slack slots (positions: its capacity)."""
    w = model.embed_tokens.weight
    return RingCache(model.config, positions, slack=slack, dtype=w.dtype, device=w.device, **kw)


def growing(model: Gemma4Model, positions: int, slack: int = SLACK) -> GrowingCache:
    """The conversation's cache (mtp/extras/growing.py), its sliding layers keeping W + slack slots."""
    w = model.embed_tokens.weight
    return GrowingCache(model.config, positions, dtype=w.dtype, device=w.device, slack=slack)


def written(cache: RingCache) -> int:
    """One past the newest position a forward wrote (a stale one included): the rings record every write's position,
    and a rollback's rewrite never reaches the newest one's slot (it lies less than a ring behind)."""
    return int(cache.slot_positions.max()) + 1


def unbounded(model: Gemma4Model, positions: int) -> RingCache:
    """A cache that keeps every position of every layer: slack >= capacity makes the ring the capacity."""
    cache = ring(model, positions, slack=positions)
    assert cache.ring == positions
    return cache


def chunked_logits(model: Gemma4Model, tokens: list[int], chunk: int, cache: RingCache) -> torch.Tensor:
    """Every position's logits (T, V), the ids run in chunks through `cache` as `prefill` runs them."""
    rows = []
    for start in range(0, len(tokens), chunk):
        cache.length = torch.tensor([start])
        rows.append(forward_rows(model, torch.tensor([tokens[start:start + chunk]]), cache, cache.length).logits[0])
    cache.length = torch.tensor([len(tokens)])
    return torch.cat(rows)


def same_math(ours: torch.Tensor, reference: torch.Tensor) -> None:
    """float64 against float64: equal to rounding (tests/tolerance.py SAME_MATH)."""
    assert ours.dtype == reference.dtype == torch.float64
    torch.testing.assert_close(ours, reference, atol=SAME_MATH * float(reference.abs().max()), rtol=0)


def within_bound(ours: torch.Tensor, one_pass: torch.Tensor, ours64: torch.Tensor, one_pass64: torch.Tensor,
                 depth: int) -> None:
    """tests/tolerance.py's two checks, with the one-pass forward where transformers stands there: float64 equal to
    rounding, and the float32 error against float64 at most RATIO times the one-pass run's own, or the floor."""
    same_math(ours64, one_pass64)
    scale = float(one_pass64.abs().max())
    bound = max(RATIO * float((one_pass.double() - one_pass64).abs().max()), FLOOR * EPS32 * scale * math.sqrt(depth))
    torch.testing.assert_close(ours.double(), one_pass64, atol=bound, rtol=0)


def far_off(ours: torch.Tensor, reference: torch.Tensor, depth: int) -> None:
    """float64 against float64, off by more than 10 times the float32 floor of tests/tolerance.py (and so by
    orders of magnitude more than float64 rounding)."""
    floor = FLOOR * EPS32 * float(reference.abs().max()) * math.sqrt(depth)
    assert float((ours - reference).abs().max()) > 10 * floor


def rounds(result, start: int) -> list[tuple[int, int, int]]:  # noqa: ANN001
    """(t, K, a) of every round of a speculative run from a prompt of `start` tokens (no stop ids)."""
    out, t = [], start
    for r in result.stats.rounds:
        out.append((t, len(r.drafted), r.matched))
        t += r.matched + 1
    return out


def crosses(t: int, n: int, size: int) -> bool:
    """Whether n positions written from t wrap around a ring of `size` slots."""
    return t % size + n > size


@pytest.fixture(scope="module")
def float64_e2b(make_pair):  # noqa: ANN001, ANN201
    """The E2B-like pair (PLE, KV sharing, centroid head) in float64, and its checkpoint directories."""
    target_dir, assistant_dir = make_pair("e2b", ordered_embeddings=True, echo=True)
    return (load_target(target_dir, dtype=torch.float64), load_drafter(assistant_dir, dtype=torch.float64),
            target_dir)


# ---------------------------------------------------------------- chunked prefill


@pytest.mark.parametrize("chunk", [1, 3, 5, 7])
def test_chunked_prefill_logits_within_the_float64_bound(float64_e2b, chunk: int) -> None:  # noqa: ANN001
    """A prompt of 43 ids run in chunks that do not divide it (3, 5, 7; and one id at a time), on the tightest ring for
    that chunk (W + chunk slots), gives every position's logits within the float64 bound of one forward over the
    whole prompt; `prefill` itself gives the last position's."""
    target64, _, target_dir = float64_e2b
    target32 = load_target(target_dir)
    one_pass, one_pass64 = forward_rows(target32, torch.tensor([ODD])).logits[0], forward_rows(target64, torch.tensor([ODD])).logits[0]
    chunked = chunked_logits(target32, ODD, chunk, ring(target32, len(ODD), slack=chunk))
    cache = ring(target64, len(ODD), slack=chunk)
    chunked64 = chunked_logits(target64, ODD, chunk, cache)
    assert written(cache) > 2 * cache.ring  # wrapped twice at least
    within_bound(chunked, one_pass, chunked64, one_pass64, target32.config.num_layers)
    logits, _ = prefill(target64, ring(target64, len(ODD) + 1, slack=chunk), [ODD])
    same_math(logits[0], one_pass64[-1])


@pytest.mark.parametrize("chunk", [1, 3, 5, 7])
def test_chunked_prefill_tokens_equal_one_pass(models, chunk: int) -> None:  # noqa: ANN001
    """Greedy and keyed-sampled tokens after a chunked prefill on a ring of W + chunk slots (decode steps included)
    equal the run whose prompt is one forward on a cache that never wraps."""
    target, _ = models["e2b", "random"]  # the plain target
    n = len(ODD) + NEW
    for sampler in (GREEDY, SAMPLER):
        one_pass = sample_generate(target, ODD, NEW, sampler)
        cache = ring(target, n, slack=chunk)
        assert generate_one(target, ODD, NEW, sampler, cache=cache) == one_pass
        assert written(cache) == n - 1 > 4 * cache.ring
    assert generate_one(target, ODD, NEW, GREEDY, prefill_chunk=chunk) == \
        sample_generate(target, ODD, NEW, GREEDY)  # prefill_chunk= on a cache the call makes


# ---------------------------------------------------------------- speculative == plain == cache-free



@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("shape", SHAPES)
def test_speculative_equals_plain_and_cache_free(models, shape: str, k: int) -> None:  # noqa: ANN001
    """On a ring of W + 5 slots, speculative greedy (K = 1..4) and plain greedy give the cache-free tokens, every
    shape. Two drafters: the echo drafter, whose accepted blocks cross the wrap, and the random one, whose every
    verify is rejected, so verifies that wrote across the wrap are rolled back right after it."""
    target, echo = models[shape, "echo"]
    expected = plain(target, PROMPT, NEW, decoder=reference_greedy)
    n = len(PROMPT) + NEW
    cache = ring(target, n)
    assert generate_one(target, PROMPT, NEW, GREEDY, cache=cache) == expected
    for name, drafter in (("echo", echo), ("random", models[shape, "random"][1])):
        cache = ring(target, n)
        result = speculative_one(target, drafter, PROMPT, NEW, DraftLength(k), cache=cache)
        assert result.tokens == expected, name
        assert written(cache) > 4 * cache.ring
        wrapped = [(t, kk, a) for t, kk, a in rounds(result, len(PROMPT)) if crosses(t, kk + 1, cache.ring)]
        if name == "echo":  # a verify wrote across the wrap and its accepted drafts were committed there
            assert any(a > 0 and crosses(t, a + 1, cache.ring) for t, _, a in wrapped), name
        else:  # every verify is rejected: those that wrote across the wrap were rolled back right after it
            assert any(a < kk for _, kk, a in wrapped) and result.stats.accepted == 0, name


def test_draft_length_is_capped_by_the_slack(models) -> None:  # noqa: ANN001
    """A schedule asking for more drafts than the slack can verify drafts slack - 1: the tokens are the same."""
    target, drafter = models["dense", "echo"]
    cache = ring(target, len(PROMPT) + NEW)
    result = speculative_one(target, drafter, PROMPT, NEW, DraftLength(8), cache=cache)
    assert result.tokens == plain(target, PROMPT, NEW, decoder=reference_greedy)
    assert max(len(r.drafted) for r in result.stats.rounds) == SLACK - 1


def test_sampling_on_a_small_ring(models) -> None:  # noqa: ANN001
    """Keyed sampling on a ring of W + 5 slots: argmax drafting == plain keyed sampling token for token (on the
    ring and on a cache that never wraps); sample drafting on the ring == sample drafting on an unbounded cache,
    token for token and draft for draft."""
    target, drafter = models["e2b", "echo"]
    n = len(PROMPT) + NEW
    plain = sample_generate(target, PROMPT, NEW, SAMPLER)  # one prefill, ring = capacity
    assert generate_one(target, PROMPT, NEW, SAMPLER, cache=ring(target, n)) == plain
    argmax = speculative_one(target, drafter, PROMPT, NEW, DraftLength(3), sampler=SAMPLER, cache=ring(target, n))
    assert argmax.tokens == plain
    small = ring(target, n)
    sampled = speculative_one(target, drafter, PROMPT, NEW, DraftLength(3), sampler=SAMPLER, drafting="sample",
                                   cache=small)
    whole = speculative_one(target, drafter, PROMPT, NEW, DraftLength(3), sampler=SAMPLER, drafting="sample",
                                 cache=unbounded(target, n))
    assert sampled.tokens == whole.tokens
    assert [(r.drafted, r.matched) for r in sampled.stats.rounds] == [(r.drafted, r.matched)
                                                                       for r in whole.stats.rounds]
    assert written(small) > 4 * small.ring and any(r.matched < len(r.drafted) for r in sampled.stats.rounds)


# ---------------------------------------------------------------- batches


def test_batch_rows_equal_solo_runs(models) -> None:  # noqa: ANN001
    """Ragged rows (5, 70 and 150 prompt tokens) prefilled together in chunks of 64, the slack of the batch's cache
    (ring W + 64 = 72): the short rows, done, re-run their last token while the long one goes on; every row then
    crosses the ring at its own positions. Plain and speculative rows equal their solo runs (the same drafts and
    acceptances) and the tokens of a solo run whose cache never wraps."""
    target, drafter = models["moe", "echo"]
    prompts = [ids(5, 2), ids(70, 3), ids(150, 4)]
    budgets = [60, 40, 30]  # positions up to 65, 110 and 180
    expected = [greedy_generate(target, p, n) for p, n in zip(prompts, budgets)]  # one prefill, no wrap
    assert [r.tokens for r in decode(target, prompts, budgets, prefill_chunk=64)] == expected
    batch = speculative_generate_batch(target, drafter, prompts, budgets, DraftLength(4), prefill_chunk=64)
    for b, (p, n) in enumerate(zip(prompts, budgets)):
        solo = speculative_one(target, drafter, p, n, DraftLength(4), prefill_chunk=64)
        assert batch[b].tokens == solo.tokens == expected[b], b
        assert [(r.drafted, r.matched) for r in batch[b].stats.rounds] == \
            [(r.drafted, r.matched) for r in solo.stats.rounds], b


def test_batch_rows_on_a_tiny_ring(float64_e2b) -> None:  # noqa: ANN001
    """The batch's cache paths on a ring of W + 5 slots, in float64: ragged rows (5, 17, 40) prefilled in chunks of 5
    (done rows re-run their last token), then verify-like forwards of 3 tokens per row at each row's own position,
    each row keeping 1 to 3 of them (rollbacks at different positions): every row's logits equal the cache-free
    forward over that row's sequence."""
    target, _, _ = float64_e2b
    prompts = [ids(5, 5), ids(17, 6), ids(40, 7)]
    cache = ring(target, 80, batch=3)
    logits, _ = prefill(target, cache, prompts, chunk=SLACK)  # (B, V)
    seqs = [list(p) for p in prompts]
    for b, seq in enumerate(seqs):
        same_math(logits[b], forward_rows(target, torch.tensor([seq])).logits[0, -1])
    g = torch.Generator().manual_seed(8)
    for step in range(8):
        block = torch.randint(3, 512, (3, 3), generator=g)  # (B, 3)
        out = forward_rows(target, block, cache, start_pos=cache.length)  # (B, 3, V)
        keep = [1 + (step + b) % 3 for b in range(3)]
        for b, seq in enumerate(seqs):
            same_math(out.logits[b], forward_rows(target, torch.tensor([seq + block[b].tolist()])).logits[0, -3:])
            seq += block[b, :keep[b]].tolist()
        cache.length = cache.length + torch.tensor(keep)
    assert [len(s) for s in seqs] == cache.length.tolist() and written(cache) > 4 * cache.ring


# ---------------------------------------------------------------- a conversation on one cache


@pytest.mark.parametrize("speculative", [True, False])
def test_chat_on_a_small_ring(models, tmp_path, speculative: bool) -> None:  # noqa: ANN001
    """A conversation whose cache keeps W + 5 slots. Turns that diverge from what the cache holds within the slack
    of its newest write reuse the prefix (reused > 0); a turn that diverges further back than the ring (after a
    reset, a new first message) is prefilled again from position 0 (reused == 0) although it shares a prefix.
    Every turn equals a fresh run over its prompt."""
    tokenizer = Gemma4Tokenizer(write_tokenizer(tmp_path))
    target, drafter = models["e2b", "echo"]
    conv = Conversation(target, tokenizer, drafter if speculative else None, stop_ids=STOP_IDS)
    conv.cache = growing(target, conv.context)
    sampler = GREEDY if speculative else SAMPLER
    n = 6

    def fresh(prompt_ids: list[int]) -> list[int]:
        if speculative:
            return speculative_generate(target, drafter, prompt_ids, n, DraftLength(4), STOP_IDS, sampler).tokens
        return sample_generate(target, prompt_ids, n, sampler, STOP_IDS)

    for i, text in enumerate(["Hello there, who are you?", "Tell me a story about a cat.", "Why?"]):
        reply = conv.say(text, n, sampler, DraftLength(4))
        assert reply.tokens == fresh(reply.prompt_ids), i
        assert (reply.reused > 2 * conv.cache.ring) == (i > 0), i  # turns 2, 3: well past the ring
    assert conv.cache.frontier > 4 * conv.cache.ring
    conv.reset()
    held = list(conv.held)
    reply = conv.say("Something else entirely.", n, sampler, DraftLength(4))
    assert common_prefix(reply.prompt_ids, held) > 0 and reply.reused == 0
    assert reply.tokens == fresh(reply.prompt_ids)


# ---------------------------------------------------------------- the textbook modules, the static steps


def test_textbook_modules_on_a_small_ring(make_pair) -> None:  # noqa: ANN001
    """The loaders' fast=False models (the textbook attention and MoE paths) on a ring of W + 5 slots: speculative
    and plain greedy give the cache-free tokens."""
    target_dir, assistant_dir = make_pair("moe", ordered_embeddings=False, echo=True, branches=0.5)
    target, drafter = load_target(target_dir, fast=False), load_drafter(assistant_dir, fast=False)
    expected = plain(target, PROMPT, NEW, decoder=reference_greedy)
    n = len(PROMPT) + NEW
    assert generate_one(target, PROMPT, NEW, GREEDY, cache=ring(target, n)) == expected
    result = speculative_one(target, drafter, PROMPT, NEW, DraftLength(4), cache=ring(target, n))
    assert result.tokens == expected and 0 < result.stats.acceptance_rate < 1


def test_static_steps_on_a_small_ring(models) -> None:  # noqa: ANN001
    """StaticTarget and StaticDrafter, eager, on a StaticKVCache of W + 5 ring slots: plain greedy and speculative
    greedy (K = 4) give the cache-free tokens, one run after the other on the same cache."""
    target, drafter = models["e2b", "echo"]
    expected = plain(target, PROMPT, NEW, decoder=reference_greedy)
    st, sd = StaticTarget(target), StaticDrafter(drafter)
    cache = StaticKVCache(target.config, len(PROMPT) + NEW, slack=SLACK, align=1)
    assert cache.ring == W + SLACK
    assert generate_one(st, PROMPT, NEW, GREEDY, cache=cache) == expected
    cache.length = torch.tensor([0])  # the next run holds nothing of it: a prefill from position 0
    result = speculative_one(st, sd, PROMPT, NEW, DraftLength(4), cache=cache)
    assert result.tokens == expected and cache.frontier > 4 * cache.ring
    assert any(r.matched < len(r.drafted) for r in result.stats.rounds)


# ---------------------------------------------------------------- transformers


def test_logits_match_transformers_through_the_ring(float64_e2b) -> None:  # noqa: ANN001
    """A prompt of 5 windows run in chunks of 3 through a ring of W + 3 slots: every position's logits within the
    bound of tests/tolerance.py of transformers' cache-free forward."""
    target64, _, target_dir = float64_e2b
    target = load_target(target_dir)
    ours = chunked_logits(target, PROMPT, 3, ring(target, len(PROMPT), slack=3))
    ours64 = chunked_logits(target64, PROMPT, 3, ring(target64, len(PROMPT), slack=3))
    assert_fp32_parity("target through the ring", "e2b, chunks of 3", ours, tf_logits(tf_target(target_dir), PROMPT),
                       ours64, tf_logits(tf_target(target_dir, dtype=torch.float64), PROMPT), target.config.num_layers)


# ---------------------------------------------------------------- what the design prevents


def shortened(cache: RingCache, by: int) -> RingCache:
    """The same cache with a ring `by` slots shorter, before anything is written."""
    assert bool((cache.slot_positions == EMPTY).all())
    cache.ring -= by
    cache.slot_positions = cache.slot_positions[:, :cache.ring]
    return cache


def test_a_ring_one_slot_short_loses_a_key(float64_e2b) -> None:  # noqa: ANN001
    """W + slack is the least ring that keeps every key. A target query reads W keys and one forward writes up to
    slack positions: it needs W + slack - 1 slots. The drafter at t reads t-1-W_d..t-1 while stale slots of a
    rejected verify reach t + slack - 2: W_d + slack slots, W + slack for a drafter as wide as the target. One
    slot fewer than a reader needs gives logits far off the reference (float64, a prefill in chunks of the slack,
    then a verify of `slack` rows that keeps only its first)."""
    target, drafter, _ = float64_e2b
    one_pass = forward_rows(target, torch.tensor([PROMPT])).logits[0]
    depth = target.config.num_layers
    for by in (0, 1):  # the target needs W + slack - 1 slots
        same_math(chunked_logits(target, PROMPT, SLACK, shortened(ring(target, len(PROMPT)), by)), one_pass)
    far_off(chunked_logits(target, PROMPT, SLACK, shortened(ring(target, len(PROMPT)), 2)), one_pass, depth)

    wide = copy.deepcopy(drafter)  # a drafter as wide as the target: W_d = W
    wide.config = dataclasses.replace(drafter.config, text=dataclasses.replace(drafter.config.text, sliding_window=W))
    n = len(PROMPT) + SLACK

    def drafter_logits(cache: RingCache) -> torch.Tensor:
        """The drafter's logits at t = P + 1 after a verify of slack rows at P that kept only its first."""
        chunked_logits(target, PROMPT, SLACK, cache)
        verify = ids(SLACK, 9)
        out = forward_rows(target, torch.tensor([verify]), cache, torch.tensor([len(PROMPT)]))  # stale slots up to t + slack - 2
        t = len(PROMPT) + 1
        cache.length = torch.tensor([t])
        kv = ring_kv(cache, target, t)
        inputs = drafter_inputs(wide, torch.tensor([[t]]), kv, torch.float64)
        hn, _ = wide.step(target.embed(torch.tensor([[verify[1]]])), out.hidden[:, :1], inputs, pairs(kv))
        return draft_logits(wide, hn[:, 0])[0]

    expected = drafter_logits(unbounded(target, n))
    same_math(drafter_logits(ring(target, n)), expected)
    far_off(drafter_logits(shortened(ring(target, n), 1)), expected, depth + wide.config.text.num_layers)


def test_a_rollback_past_the_ring(float64_e2b) -> None:  # noqa: ANN001
    """Lowering the length to n keeps every key a later query reads only while the newest write reached at most
    n + slack (the growing cache's `holds`, which a conversation asks before it keeps a prefix: it prefills from 0
    where the answer is no: test_chat_on_a_small_ring). A rollback within that equals the cache-free
    forward; one further back is refused by `holds`, and run anyway (bypassing `holds`) it reads slots the ring has
    given to later positions: far off."""
    target, _, _ = float64_e2b
    one_pass = forward_rows(target, torch.tensor([PROMPT])).logits[0]
    cache = growing(target, len(PROMPT))
    chunked_logits(target, PROMPT, SLACK, cache)
    back = len(PROMPT) - SLACK  # 35: the newest write reached 39 < 35 + 5
    assert cache.holds(back) and not cache.holds(back - 1)
    cache.length = torch.tensor([back])
    same_math(forward_rows(target, torch.tensor([PROMPT[back:]]), cache, cache.length).logits[0], one_pass[back:])

    cache.length = torch.tensor([len(PROMPT)])
    far = 20  # the ring (13) has wrapped past it: slots of 20..26 now hold 33..39
    assert not cache.holds(far)
    cache.length = torch.tensor([far])  # trust the reused slots
    far_off(forward_rows(target, torch.tensor([PROMPT[far:far + SLACK]]), cache, cache.length).logits[0],
            one_pass[far:far + SLACK], target.config.num_layers)


def test_cache_bytes_of_the_rings(models) -> None:  # noqa: ANN001
    """What the rings here cost: a full cache of the test models holds W + slack slots per sliding layer."""
    target, _ = models["e2b", "echo"]
    n = len(PROMPT) + NEW
    cache = ring(target, n)
    assert cache_bytes(target.config, n, SLACK, 1, torch.float32) == sum(
        b[i].nbytes for b in (cache.keys, cache.values) for i in cache.keys) < cache_bytes(
        target.config, n, n, 1, torch.float32)
