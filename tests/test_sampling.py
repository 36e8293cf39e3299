"""Sampling: the warpers, keyed noise, and argmax-drafted speculative sampling == plain sampling.

- The warpers against hand-checked cases (ties at the k-th logit, the top-p boundary, temperature
  before top-k/top-p) and against transformers' own warpers on random logits.
- Keyed noise: a position's draw depends on (seed, position) only; the global RNG is never touched.
- With `argmax` drafting, speculative sampling commits exactly the tokens of plain sampling with the
  same seed (float32), over the three tiny shapes, the three drafters of tests/pairs.py, K in
  {1, 3, 6}, the three schedules and three seeds, at T = 1 with top-k and top-p on.
The distributions themselves (both drafting modes) are tested in test_sampling_distribution.py.
"""

import math

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from gemma4 import SamplerConfig, greedy_generate, sample_generate
from gemma4.sampling import TARGET, keyed_sample, warp
from mtp import SCHEDULES, DraftLength, speculative_generate
from tests.checkpoints import SHAPES
from tests.pairs import DRAFTERS, prompt  # the `models` fixture is in conftest.py

SEEDS = (0, 1, 2)
SAMPLER = dict(temperature=1.0, top_k=20, top_p=0.9)


def kept(logits: list[float], **settings: float) -> list[int]:
    """The tokens that keep a non-zero probability."""
    probs = warp(torch.tensor([logits]), SamplerConfig(**settings))[0]
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
    assert torch.equal(ours > 0, theirs > 0)  # the same tokens kept
    torch.testing.assert_close(ours, theirs)


@pytest.mark.parametrize("bad, message", [
    (dict(temperature=-1.0), "temperature must be >= 0"),
    (dict(temperature=float("nan")), "temperature must be >= 0"),
    (dict(top_k=-1), "top_k must be an integer >= 0"),
    (dict(top_p=0.0), "top_p must be in (0, 1]"),
    (dict(top_p=1.5), "top_p must be in (0, 1]"),
    (dict(seed=-3), "seed must be an integer"),
])
def test_sampler_config_is_validated(bad: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("]", r"\]")):
        SamplerConfig(**bad)


# ---------------------------------------------------------------- keyed noise


def test_keyed_draws_depend_on_seed_and_position_only() -> None:
    probs = torch.full((1, 50), 1 / 50)
    draw = lambda seed, n: keyed_sample(probs, seed, TARGET, [n])[0]  # noqa: E731
    state = torch.get_rng_state()
    first = [draw(0, n) for n in range(40)]
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is untouched
    torch.manual_seed(123)  # and moving it changes nothing
    assert [draw(0, n) for n in reversed(range(40))] == first[::-1]  # order of the calls does not matter
    assert [draw(1, n) for n in range(40)] != first
    rows = keyed_sample(probs.expand(40, 50), 0, TARGET, list(range(40)))  # one call, 40 rows
    assert rows == first


def test_keyed_draws_follow_the_distribution() -> None:
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05, 0.0]])
    n = 4000
    counts = torch.bincount(torch.tensor(keyed_sample(p.expand(n, 5), 5, TARGET, list(range(n)))), minlength=5)
    assert counts[4] == 0  # p = 0 never wins
    expected = p[0, :4] * n
    chi2 = float(((counts[:4] - expected) ** 2 / expected).sum())
    assert chi2 < 3 + 10 * math.sqrt(6), (counts.tolist(), chi2)  # df 3: the suite's χ² rule


# ---------------------------------------------------------------- plain and speculative sampling


PLAIN: dict[tuple[int, int, int], list[int]] = {}


def plain(target, seed: int, n: int) -> list[int]:  # noqa: ANN001
    key = (id(target), seed, n)
    if key not in PLAIN:
        PLAIN[key] = sample_generate(target, prompt("long"), n, SamplerConfig(**SAMPLER, seed=seed))
    return PLAIN[key]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("schedule", SCHEDULES)
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
    assert result.tokens == plain(target, seed, budget)
    assert result.finish_reason == "length"


def test_sampling_paths_are_exercised(models) -> None:  # noqa: ANN001
    """Drafts are accepted, partly and fully, and rejected: the grid above proves something."""
    counts = []
    for shape in SHAPES:
        for drafter in ("echo", "always"):
            target, draft_model = models[shape, drafter]
            stats = speculative_generate(target, draft_model, prompt("long"), 30, DraftLength(3),
                                         sampler=SamplerConfig(**SAMPLER, seed=0)).stats
            counts += [r.accepted for r in stats.rounds]
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
    assert plain(target, 0, 20) != greedy[:20]  # sampling really samples


def test_bad_drafting_is_refused(models) -> None:  # noqa: ANN001
    target, draft_model = models["e2b", "echo"]
    with pytest.raises(ValueError, match="needs a temperature > 0"):
        speculative_generate(target, draft_model, prompt("short"), 5, DraftLength(2), drafting="sample")
    with pytest.raises(ValueError, match="drafting must be one of argmax, sample"):
        speculative_generate(target, draft_model, prompt("short"), 5, DraftLength(2),
                             sampler=SamplerConfig(), drafting="greedy")


def test_sample_drafting_gives_the_centroid_filler_probability_zero(models) -> None:  # noqa: ANN001
    """The centroid head scores only its candidates; for sampling the rest must get exactly 0 (§11),
    not transformers' min - 1 filler, which gives every other token a small probability."""
    target, drafter = models["e2b", "echo"]  # E2B-like: centroid head, 16 centroids, top 4 -> 128 candidates
    p = prompt("long")
    out = target.run(torch.tensor([p]))
    t = len(p)
    sampler = SamplerConfig(temperature=1.0)  # no top-k/top-p: only the filler can make zeros
    drafts, q = drafter.propose(target, p[-1], out.hidden[0, -2], t - 1,
                                {kind: (k[:, :, :t - 1], v[:, :, :t - 1]) for kind, (k, v) in out.shared_kv.items()},
                                3, sampler)
    assert q.shape == (3, 512)
    torch.testing.assert_close(q.sum(dim=-1), torch.ones(3))
    assert ((q > 0).sum(dim=-1) == 128).all()  # the 4 chosen clusters' tokens, nothing else
    assert all(float(q[i, d]) > 0 for i, d in enumerate(drafts))
    transformers_q = drafter.logits(torch.randn(1, drafter.config.text.hidden_size)).softmax(dim=-1)
    assert (transformers_q > 0).all()  # the default filler, for parity with transformers
