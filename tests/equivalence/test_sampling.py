"""Sampling: the warpers, keyed noise, and argmax-drafted speculative sampling == plain sampling.

- `warp` (`candidates`: with top-k, only the k largest logits are warped) against the rule on the whole row
  (`warp_row`: the full-vocabulary sort and softmax) everywhere: on hand-checked cases (ties at the k-th logit,
  the top-p boundary, temperature before top-k/top-p), on random logits where both must also equal transformers'
  own warpers, and on ties, -inf fillers and large rows; numeric edges never give NaN.
- Keyed noise: the int64 tensor hash equals splitmix64 on Python ints; a token's noise does not depend
  on the other candidates; a position's draw depends on (seed, position) only; the global RNG is
  never touched.
- With `argmax` drafting, speculative sampling commits exactly the tokens of plain sampling with the
  same seed (float32), over the three tiny shapes, the three drafters of tests/pairs.py, K in
  {1, 3, 6}, the three schedules and three seeds, at T = 1 with top-k and top-p on.
The distributions themselves (both drafting modes) are tested in tests/equivalence/test_sampling_distribution.py.
"""

import itertools
import math

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from gemma4 import SamplerConfig, greedy_generate, sample_generate
from gemma4.engine.ring import KV
from gemma4.fast.sampling import WHOLE_ROWS
from gemma4.engine.sampling import (
    GOLDEN, MASK64, RULE, TOKEN_STREAM, ACCEPT_STREAM, candidates, exponential_noise, finalise, keyed_bits,
    keyed_choice, sample, signed, stream_key, uniform_from_bits, warp, warp_row,
)
from mtp import SCHEDULES, DraftLength, speculative_generate
from tests.checkpoints import SHAPES
from tests.pairs import DRAFTERS, plain, prompt  # the `models` fixture is in conftest.py
from mtp.sample_drafting import draft_logits
from mtp.sample_drafting import keyed_uniform
from mtp.engine.drafts import keyed_sample
from gemma4.engine import generate_one
from gemma4.engine.forward import forward_rows
from mtp.engine import speculative_one
from mtp.engine.drafts import drafter_inputs, pairs, propose_rows, ring_kv

SEEDS = (0, 1, 2)
SAMPLER = dict(temperature=1.0, top_k=20, top_p=0.9)


def whole(logits: torch.Tensor, cfg: SamplerConfig) -> torch.Tensor:
    """The rule on the whole row (`warp_row`: every token sorted and soft-maxed): what `warp`, which warps only the
    k largest logits when top-k is set (`candidates`), must equal."""
    return torch.stack([warp_row(x, cfg) for x in logits])


def kept(logits: list[float], **settings: float) -> list[int]:
    """The tokens that keep a non-zero probability, the same under `warp` and the whole-row rule."""
    x, cfg = torch.tensor([logits]), SamplerConfig(**settings)
    probs, reference = warp(x, cfg)[0], whole(x, cfg)[0]
    assert torch.equal(probs > 0, reference > 0)
    torch.testing.assert_close(probs, reference)
    return [i for i, p in enumerate(probs.tolist()) if p > 0]


# ---------------------------------------------------------------- warpers


def test_top_k_keeps_every_tie_at_the_kth_logit() -> None:
    assert kept([3.0, 1.0, 1.0, 1.0, 0.0], top_k=2) == [0, 1, 2, 3]
    assert kept([3.0, 1.0, 1.0, 1.0, 0.0], top_k=1) == [0]
    assert kept([3.0, 1.0, 2.0, 0.0], top_k=4) == [0, 1, 2, 3]  # k = V and k = 0: off
    assert kept([3.0, 1.0, 2.0, 0.0], top_k=0) == [0, 1, 2, 3]


def test_top_p_boundary() -> None:
    # Four equal logits: probabilities 0.25 each and ascending cumulative sums 0.25, 0.5, 0.75, 1, exact.
    flat = [0.0, 0.0, 0.0, 0.0]
    assert len(kept(flat, top_p=0.5)) == 2  # cumulative 0.5 <= 1 - 0.5: removed
    assert len(kept(flat, top_p=0.5000001)) == 3  # 0.5 > 1 - 0.5000001: kept
    assert len(kept(flat, top_p=0.75)) == 3
    assert kept([0.0, 5.0, 1.0], top_p=1e-9) == [1]  # the most likely token always stays
    probs = warp(torch.tensor([flat]), SamplerConfig(top_p=0.5))[0]
    assert sorted(probs.tolist()) == [0.0, 0.0, 0.5, 0.5]  # renormalised over what is kept


def test_temperature_comes_before_top_p() -> None:
    # At T = 1 the probabilities are (0.64, 0.24, 0.09, 0.03): top-p 0.9 keeps three tokens. At T = 0.5
    # they are (0.87, 0.12, 0.016, 0.002): it keeps two. Applying top-p before the temperature keeps three.
    logits = [2.0, 1.0, 0.0, -1.0]
    assert kept(logits, temperature=1.0, top_p=0.9) == [0, 1, 2]
    assert kept(logits, temperature=0.5, top_p=0.9) == [0, 1]
    probs = warp(torch.tensor([logits]), SamplerConfig(temperature=0.5, top_p=0.9))[0]
    expected = torch.tensor([math.exp(4), math.exp(2), 0, 0]) / (math.exp(4) + math.exp(2))
    torch.testing.assert_close(probs, expected.float())


@pytest.mark.parametrize("temperature, top_k, top_p", [
    (1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 64, 0.95), (1.3, 10, 1.0), (0.5, 0, 0.8), (1.0, 3, 0.5),
])
def test_warpers_match_transformers(temperature: float, top_k: int, top_p: float) -> None:
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(16, 300, generator=g) * 3  # (N, V)
    ours = warp(logits, SamplerConfig(temperature, top_k, top_p))
    scores = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1:
        scores = TopPLogitsWarper(top_p)(None, scores)
    theirs = scores.softmax(dim=-1)
    reference = whole(logits, SamplerConfig(temperature, top_k, top_p))
    for probs in (ours, reference):
        assert torch.equal(probs > 0, theirs > 0)  # the same tokens kept
        torch.testing.assert_close(probs, theirs)


def rows(v: int, n: int, seed: int) -> torch.Tensor:
    """n rows of V logits: random (std 3), ties in blocks, and the centroid head's -inf fillers."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, v, generator=g) * 3  # (n, V)
    x[1] = (x[1] * 2).round() / 2  # many exact ties, at every level
    x[2] = x[2].masked_fill(torch.rand(v, generator=g) < 0.9, float("-inf"))  # a centroid-like row
    x[3] = x[3] / 50  # nearly flat: top-p keeps most of the row
    return x


@pytest.mark.parametrize("v", (300, 4096, 16384))  # vocabularies small and large, as one row
@pytest.mark.parametrize("temperature, top_k, top_p", [
    (1.0, 1, 1.0), (1.0, 64, 1.0), (0.7, 64, 0.95), (1.0, 0, 0.95), (1.3, 0, 0.5), (1.0, 0, 1.0), (0.8, 3, 0.9),
    (1.0, 40, 0.5), (1.0, 1000, 0.99), (2.0, 0, 0.999),
])
def test_warp_equals_the_full_vocabulary_reference(v: int, temperature: float, top_k: int, top_p: float) -> None:
    cfg = SamplerConfig(temperature, top_k, top_p)
    logits = rows(v, 5, seed=v + top_k)
    ours, reference = warp(logits, cfg), whole(logits, cfg)
    assert torch.equal(ours > 0, reference > 0)  # the same tokens kept, ties at both boundaries included
    torch.testing.assert_close(ours, reference)
    for x, row in zip(logits, ours):  # the candidates: ascending ids, the kept tokens
        ids, probs = candidates(x, cfg)
        assert torch.equal(ids[probs > 0], row.nonzero().flatten()) and torch.equal(probs, row[ids])


def test_bfloat16_logits_warp_as_their_float32_copy() -> None:
    """bfloat16 logits warp as their float32 copy: the rule runs in fp32 (only top-k's choice reads the bf16 row)."""
    logits = rows(4096, 5, seed=9).bfloat16()
    for cfg in (SamplerConfig(top_k=64, top_p=0.95), SamplerConfig(top_k=0, top_p=0.9), SamplerConfig(0.5, 0, 1.0)):
        assert torch.equal(warp(logits, cfg), warp(logits.float(), cfg))
        assert torch.equal(whole(logits, cfg), whole(logits.float(), cfg))


def test_top_p_ties_keep_the_higher_ids_as_a_stable_sort() -> None:
    flat = torch.zeros(1, 4)  # 0.25 each: top-p 0.5 keeps two of four equal tokens
    assert warp(flat, SamplerConfig(top_p=0.5))[0].tolist() == [0.0, 0.0, 0.5, 0.5]
    assert torch.equal(warp(flat, SamplerConfig(top_p=0.5)), whole(flat, SamplerConfig(top_p=0.5)))
    big = torch.zeros(1, 8192)  # a large flat row: the sliced pass must hand the ties to the exact one
    cfg = SamplerConfig(top_p=0.25)
    assert torch.equal(warp(big, cfg) > 0, whole(big, cfg) > 0)


@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (5, 1.0), (0, 0.9), (5, 0.9), (0, 1e-9)])
def test_numeric_edges_never_give_nan(top_k: int, top_p: float) -> None:
    x = torch.tensor([[0.5, 2.0, -1.0, 2.0, 1.0, float("-inf")]])
    one = torch.full((1, 6), float("-inf"))
    one[0, 4] = -3.0  # all -inf but one
    for temperature, warper in itertools.product((1e-40, 1e-45, 1e-30, 1e-3, 1.0, 1e30, 3e38), (warp, whole)):
        cfg = SamplerConfig(temperature, top_k, top_p)  # 1e-40, 1e-45: subnormal
        probs = warper(x, cfg)
        assert not probs.isnan().any(), (temperature, probs)
        assert float(probs.sum()) == pytest.approx(1.0)
        assert warper(one, cfg)[0].tolist() == [0, 0, 0, 0, 1, 0]
        if temperature <= 1e-30:  # far below fp32's range: the limit, the argmax (its two ties share)
            expected = [0, 0, 0, 1, 0, 0] if top_p < 0.5 else [0, 0.5, 0, 0.5, 0, 0]  # top-p: the later tie
            assert probs[0].tolist() == expected
            assert sample(x, cfg, TOKEN_STREAM, [7])[0] in (1, 3)
    assert kept([0.0, 5.0, 1.0], top_p=1e-9, top_k=0) == [1]


@pytest.mark.parametrize("bad, message", [
    (dict(temperature=-1.0), "temperature must be >= 0"),
    (dict(temperature=float("nan")), "temperature must be >= 0 and finite"),
    (dict(temperature=float("inf")), "temperature must be >= 0 and finite"),
    (dict(top_k=-1), "top_k must be an integer >= 0"),
    (dict(top_p=0.0), "top_p must be in (0, 1]"),
    (dict(top_p=1.5), "top_p must be in (0, 1]"),
    (dict(seed=-3), "seed must be an integer"),
])
def test_sampler_config_is_validated(bad: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("]", r"\]")):
        SamplerConfig(**bad)


# ---------------------------------------------------------------- keyed noise


# The CPU always; a GPU where there is one: the same bits on every device.
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_tensor_hash_is_splitmix64_on_python_ints(device: str) -> None:
    """int64 wrap-around and the masked shifts give exactly the uint64 arithmetic, on any ids and device."""
    ids = torch.cat([torch.arange(300), torch.randint(0, 1 << 62, (300,), generator=torch.Generator().manual_seed(1))])
    for seed, stream, position in ((0, TOKEN_STREAM, 0), (12345, ACCEPT_STREAM, 999_999), ((1 << 63) - 1, TOKEN_STREAM, 7)):
        key = stream_key(seed, stream, position)
        expected = [signed(finalise((key + (x + 1) * GOLDEN) & MASK64)) for x in ids.tolist()]
        assert keyed_bits(seed, stream, position, ids.to(device)).tolist() == expected
    # uniforms in (0, 1]: all-zero bits give the smallest, all-one bits exactly 1; never 0
    u = uniform_from_bits(torch.tensor([0, -1, 1 << 11, signed(MASK64 ^ 0x7FF)]))  # 1 << 11: the lowest bit kept
    assert u.tolist() == [2.0**-53, 1.0, 2 * 2.0**-53, 1.0]
    bits = keyed_bits(3, ACCEPT_STREAM, 11, torch.tensor([0]))
    assert keyed_uniform(3, ACCEPT_STREAM, 11) == float(uniform_from_bits(bits)[0])  # the same bits, on the CPU in Python


def test_a_tokens_noise_does_not_depend_on_the_other_candidates() -> None:
    full = exponential_noise(5, TOKEN_STREAM, 42, torch.arange(4096))  # (V,)
    some = torch.tensor([7, 100, 4095, 2048])
    assert torch.equal(exponential_noise(5, TOKEN_STREAM, 42, some), full[some])
    assert (full > 0).all() and full.dtype == torch.float64
    # so a draw from warped logits equals the draw over the whole vocabulary, and the dense form's
    logits = rows(4096, 4, seed=3)
    for cfg in (SamplerConfig(top_k=64, top_p=0.95), SamplerConfig(top_k=0), SamplerConfig(top_k=0, top_p=0.9)):
        probs = whole(logits, cfg)
        positions = [10, 11, 12, 13]
        everywhere = [int((probs[i].double() / exponential_noise(0, TOKEN_STREAM, n, torch.arange(4096))).argmax())
                      for i, n in enumerate(positions)]
        dense = keyed_sample(RULE, warp(logits, cfg), 0, TOKEN_STREAM, positions).tolist()
        assert sample(logits, cfg, TOKEN_STREAM, positions) == everywhere == dense


def test_an_exact_tie_goes_to_the_lowest_id() -> None:
    ids = torch.tensor([3, 8, 9])
    noise = exponential_noise(0, TOKEN_STREAM, 0, ids)  # weights equal to the noise: every score is exactly 1
    assert keyed_choice(ids, noise, 0, TOKEN_STREAM, 0).tolist() == [3]
    assert keyed_choice(ids, noise * torch.tensor([1.0, 2.0, 2.0], dtype=torch.float64), 0, TOKEN_STREAM, 0).tolist() == [8]


def test_keyed_draws_depend_on_seed_and_position_only() -> None:
    probs = torch.full((1, 50), 1 / 50)
    draw = lambda seed, n: keyed_sample(RULE, probs, seed, TOKEN_STREAM, [n]).item()  # noqa: E731
    state = torch.get_rng_state()
    first = [draw(0, n) for n in range(40)]
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is untouched
    torch.manual_seed(123)  # and moving it changes nothing
    assert [draw(0, n) for n in reversed(range(40))] == first[::-1]  # order of the calls does not matter
    assert [draw(1, n) for n in range(40)] != first
    rows = keyed_sample(RULE, probs.expand(40, 50), 0, TOKEN_STREAM, list(range(40))).tolist()  # one call, 40 rows
    assert rows == first


def test_keyed_draws_follow_the_distribution() -> None:
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05, 0.0]])
    n = 4000
    counts = torch.bincount(keyed_sample(RULE, p.expand(n, 5), 5, TOKEN_STREAM, list(range(n))), minlength=5)
    assert counts[4] == 0  # p = 0 never wins
    expected = p[0, :4] * n
    chi2 = float(((counts[:4] - expected) ** 2 / expected).sum())
    assert chi2 < 3 + 10 * math.sqrt(6), (counts.tolist(), chi2)  # df 3: the suite's χ² rule


# ---------------------------------------------------------------- plain and speculative sampling




# heuristic_transient drafts as heuristic within one call: the grid keeps the schedules that differ in a call.
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("schedule", [s for s in SCHEDULES if s != "heuristic_transient"])
@pytest.mark.parametrize("k", (1, 3, 6))
@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("shape", SHAPES)
def test_argmax_drafting_equals_plain_sampling(models, shape: str, drafter: str, k: int, schedule: str,  # noqa: ANN001
                                               seed: int) -> None:
    target, draft_model = models[shape, drafter]
    budget = 20
    sampler = SamplerConfig(**SAMPLER, seed=seed)
    result = speculative_generate(target, draft_model, prompt("long"), budget, DraftLength(k, schedule),
                                  sampler=sampler)
    assert result.tokens == plain(target, prompt("long"), budget, SamplerConfig(**SAMPLER, seed=seed))
    assert result.finish_reason == "length"


@pytest.mark.parametrize("shape", SHAPES)
def test_rows_kept_whole_as_on_a_gpu(models, shape: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """Rows kept whole (`WHOLE_ROWS`, the rule the speed layer gives a model off the CPU): the same rule over every
    id of a row. The probabilities are the picked-out ones (to float32 rounding: the softmax sums over more terms),
    and speculative sampling again equals plain sampling token for token (the drafter draws with the target's rule);
    sample drafting runs and repeats itself."""
    logits = rows(4096, 4, seed=3)
    picked = warp(logits, SamplerConfig(**SAMPLER))
    whole = WHOLE_ROWS.warp(logits, SamplerConfig(**SAMPLER))
    assert torch.equal(whole > 0, picked > 0) and torch.allclose(whole, picked, rtol=1e-5, atol=1e-7)
    target, draft_model = models[shape, "echo"]  # partly right: drafts kept and rejected
    # The session's model: it has no rule of its own again after. The engine's loops draw by a model's rule.
    monkeypatch.setattr(target, "sampling", WHOLE_ROWS, raising=False)
    sampler, budget = SamplerConfig(**SAMPLER, seed=1), 16
    expected = generate_one(target, prompt("long"), budget, sampler)  # not `plain`: it remembers picked-out runs
    assert speculative_one(target, draft_model, prompt("long"), budget, DraftLength(3), sampler=sampler).tokens \
        == expected
    runs = [speculative_one(target, draft_model, prompt("long"), budget, DraftLength(3), sampler=sampler,
                            drafting="sample").tokens for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) == budget


def test_sampling_paths_are_exercised(models) -> None:  # noqa: ANN001
    """Drafts are accepted, partly and fully, and rejected: the grid above proves something."""
    counts = []
    for shape in SHAPES:
        for drafter in ("echo", "always"):
            target, draft_model = models[shape, drafter]
            stats = speculative_generate(target, draft_model, prompt("long"), 30, DraftLength(3),
                                         sampler=SamplerConfig(**SAMPLER, seed=0)).stats
            counts += [r.matched for r in stats.rounds]
    assert 0 in counts and any(0 < a < 3 for a in counts) and 3 in counts


def test_seeds_and_greedy(models) -> None:  # noqa: ANN001
    target, draft_model = models["e2b", "echo"]
    p = prompt("long")
    state = torch.get_rng_state()
    runs = [speculative_generate(target, draft_model, p, 30, DraftLength(3),
                                 sampler=SamplerConfig(**SAMPLER, seed=seed)).tokens for seed in (0, 0, 1)]
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is never drawn from
    assert runs[0] == runs[1]  # the same seed, the same output
    assert runs[0] != runs[2]  # another seed, another output
    greedy = greedy_generate(target, p, 30)
    assert sample_generate(target, p, 30, SamplerConfig(temperature=0.0, top_k=5)) == greedy  # T = 0 is greedy
    assert speculative_generate(target, draft_model, p, 30, DraftLength(3),
                                sampler=SamplerConfig(temperature=0.0)).tokens == greedy
    assert plain(target, prompt("long"), 20, SamplerConfig(**SAMPLER, seed=0)) != greedy[:20]  # sampling really samples


def test_bad_drafting_is_refused(models) -> None:  # noqa: ANN001
    target, draft_model = models["e2b", "echo"]
    with pytest.raises(ValueError, match="needs a temperature > 0"):
        speculative_generate(target, draft_model, prompt("short"), 5, DraftLength(2), drafting="sample")
    with pytest.raises(ValueError, match="drafting must be one of argmax, sample"):
        speculative_generate(target, draft_model, prompt("short"), 5, DraftLength(2),
                             sampler=SamplerConfig(), drafting="greedy")


def test_sample_drafting_gives_the_centroid_filler_probability_zero(models) -> None:  # noqa: ANN001
    """The centroid head scores only its candidates; for sampling the rest must get exactly 0 (mtp/README.md §11),
    not transformers' min - 1 filler, which gives every other token a small probability."""
    target, drafter = models["e2b", "echo"]  # E2B-like: centroid head, 16 centroids, top 4 -> 128 candidates
    p = prompt("long")
    out = forward_rows(target, torch.tensor([p]))
    t = len(p)
    sampler = SamplerConfig(temperature=1.0)  # no top-k/top-p: only the filler can make zeros
    drafts, q = propose_rows(drafter, target, [p[-1]], out.hidden[:, -2], [t - 1],
                                {kind: KV(k[:, :, :t - 1], v[:, :, :t - 1], at[:, :t - 1])
                                 for kind, (k, v, at) in out.source_kv.items()},
                                3, [sampler])
    drafts, q = drafts[0].tolist(), q[0]  # the one row
    assert q.shape == (3, 512)
    torch.testing.assert_close(q.sum(dim=-1), torch.ones(3))
    assert ((q > 0).sum(dim=-1) == 128).all()  # the 4 chosen clusters' tokens, nothing else
    assert all(float(q[i, d]) > 0 for i, d in enumerate(drafts))
    transformers_q = draft_logits(drafter, torch.randn(1, drafter.config.text.hidden_size)).softmax(dim=-1)
    assert (transformers_q > 0).all()  # the default filler, for parity with transformers
