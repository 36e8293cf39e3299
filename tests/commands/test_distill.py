"""The drafter's losses (`scripts/training/distill.py`) and the closed form they optimise.

- The loss side's warp is the product's (`gemma4.sampling.warp`) on logits without ties.
- tv, kl, ce on small hand-checked distributions: tv(p, p) = 0, tv of disjoint supports = 1,
  kl >= 0 and 0 only when p = q.
- The closed form: sample drafting keeps a draft with probability sum_x min(p(x), q(x)). On a tiny
  pair the loop's first-draft acceptance over many seeds agrees with the mean of that sum.
"""

import math

import pytest
import torch

from gemma4 import RingCache, SamplerConfig, load_target, sample_generate
from gemma4.engine.sampling import warp
from mtp import DraftLength, load_drafter, speculative_generate
from mtp.engine.drafts import propose_rows, ring_kv
from gemma4.engine.forward import forward_rows
from training.distill import Distill, ce_loss, distill_loss, kl_loss, parse_losses, tv_loss, warped_top


def logits_of(*rows: list[float]) -> torch.Tensor:
    """Probabilities (N, V) -> logits whose softmax they are."""
    return torch.tensor(rows).log()


def dense(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    ids, log_p = warped_top(logits, temperature, top_k, top_p)
    return torch.zeros_like(logits).scatter(1, ids, log_p.exp())


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 64, 0.95), (0.5, 0, 0.8), (1.3, 10, 1.0)])
def test_the_loss_side_warp_is_the_products(temperature, top_k, top_p):
    logits = torch.randn(6, 512, generator=torch.Generator().manual_seed(0)) * 3
    expected = warp(logits, SamplerConfig(temperature, top_k, top_p))
    torch.testing.assert_close(dense(logits, temperature, top_k, top_p), expected)


def test_top_p_by_hand():
    # Descending 0.4, 0.3, 0.2, 0.1: the mass before each token is 0, 0.4, 0.7, 0.9; top-p 0.6 keeps
    # the tokens with less than 0.6 before them, renormalised: 4/7, 3/7.
    got = dense(logits_of([0.1, 0.4, 0.2, 0.3]), 1.0, 0, 0.6)
    torch.testing.assert_close(got, torch.tensor([[0.0, 4 / 7, 0.0, 3 / 7]]))


def test_tv_by_hand():
    p, q = logits_of([0.5, 0.3, 0.2]), logits_of([0.2, 0.3, 0.5])
    torch.testing.assert_close(tv_loss(q, p, 1.0, 0, 1.0), torch.tensor([0.3]))  # 1 - (0.2 + 0.3 + 0.2)
    # Greedy: 1 - q(argmax p) with q's plain softmax.
    torch.testing.assert_close(tv_loss(q, p, 0.0, 0, 1.0), torch.tensor([0.8]))


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 64, 0.95), (0.5, 3, 0.9)])
def test_tv_of_equal_is_0_and_of_disjoint_is_1(temperature, top_k, top_p):
    logits = torch.randn(5, 512, generator=torch.Generator().manual_seed(1)) * 2
    assert tv_loss(logits, logits, temperature, top_k, top_p).abs().max() < 1e-6
    # Disjoint supports: p lives on tokens 0..9, q on 10..19 (every other logit -inf).
    p = torch.full((1, 512), float("-inf"))
    q = p.clone()
    p[0, :10], q[0, 10:20] = torch.randn(10), torch.randn(10)
    torch.testing.assert_close(tv_loss(q, p, temperature, top_k, top_p), torch.tensor([1.0]))


def test_kl_by_hand_and_its_sign():
    p, q = logits_of([0.5, 0.5]), logits_of([0.25, 0.75])
    torch.testing.assert_close(kl_loss(q, p), torch.tensor([0.5 * math.log(2) + 0.5 * math.log(2 / 3)]))
    gen = torch.Generator().manual_seed(2)
    p, q = torch.randn(20, 512, generator=gen), torch.randn(20, 512, generator=gen)
    assert (kl_loss(q, p) > 1e-3).all()
    assert kl_loss(p, p).abs().max() < 1e-5
    assert kl_loss(p + 3.0, p).abs().max() < 1e-5  # logits equal up to a constant: the same distribution


def test_ce_is_minus_log_q_of_the_targets_argmax():
    p, q = logits_of([0.1, 0.6, 0.3]), logits_of([0.2, 0.5, 0.3])
    torch.testing.assert_close(ce_loss(q, p), torch.tensor([-math.log(0.5)]))


def test_combined_loss_sums_and_centroids_learn_cluster_mass():
    gen = torch.Generator().manual_seed(3)
    p, q = torch.randn(4, 16, generator=gen), torch.randn(4, 16, generator=gen, requires_grad=True)
    cluster_of = torch.arange(16) // 4  # 4 clusters of 4 tokens
    cfg = Distill(parse_losses("kl+tv"), "sampled", (0.0, 0.7), top_k=8, top_p=0.9)
    loss, mass = distill_loss(q, p, cfg, cluster_of, 4)
    tv = (tv_loss(q, p, 0.0, 8, 0.9) + tv_loss(q, p, 0.7, 8, 0.9)) / 2
    torch.testing.assert_close(loss, kl_loss(q, p) + tv)
    torch.testing.assert_close(mass.sum(dim=-1), torch.ones(4))
    kl_mass = p.softmax(-1).view(4, 4, 4).sum(-1)  # (N, C)
    tv_mass = (torch.nn.functional.one_hot(p.argmax(-1), 16).float() + dense(p, 0.7, 8, 0.9)).view(4, 4, 4).sum(-1) / 2
    torch.testing.assert_close(mass, (kl_mass + tv_mass) / 2)
    loss.sum().backward()
    assert torch.isfinite(q.grad).all() and q.grad.abs().sum() > 0


def test_bad_losses_and_temperatures_are_refused():
    with pytest.raises(ValueError, match="losses"):
        Distill(parse_losses("kl+js"))
    with pytest.raises(ValueError, match="temperatures"):
        Distill(temperatures=(-1.0,))


# ---------------------------------------------------------------- the closed form against the loop

@pytest.fixture(scope="module")
def tiny_pair(make_pair):
    # branches 0.2: a target that often repeats, as the echo drafter proposes: alpha ~0.3-0.7
    target_dir, drafter_dir = make_pair("e2b", ordered_embeddings=True, echo=True, assistant_seed=2, branches=0.2)
    return load_target(target_dir), load_drafter(drafter_dir)


@torch.inference_mode()
def first_round_alpha(target, drafter, prompt: list[int], sampler: SamplerConfig) -> float:
    """sum min(p, q) of the first draft of the first round, from the states the loop will be in."""
    first = sample_generate(target, prompt, 1, sampler)[0]  # the loop's first token: the same keyed draw
    t = len(prompt)
    cache = RingCache(target.config, t + 1)
    out = forward_rows(target, torch.tensor([prompt]), cache, num_logits=1)
    cache.length = torch.tensor([t])
    _, q = propose_rows(drafter, target, [first], out.hidden[:, -1], [t], ring_kv(cache, target, t), 1, [sampler])
    q = q[0]  # (1, V): row 0's one draft
    p = warp(forward_rows(target, torch.tensor([prompt + [first]])).logits[0, -1:], sampler)  # (1, V): the verify's row 0
    return float(torch.minimum(p, q).sum())


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 64, 0.95)])
def test_sample_drafting_keeps_a_draft_with_probability_sum_min(tiny_pair, temperature, top_k, top_p):
    target, drafter = tiny_pair
    prompt = [2] + torch.randint(3, 512, (10,), generator=torch.Generator().manual_seed(4)).tolist()
    kept, alphas = [], []
    for seed in range(300):
        sampler = SamplerConfig(temperature, top_k, top_p, seed)
        # 3 new tokens: the prefill commits one, the first round drafts exactly one.
        stats = speculative_generate(target, drafter, prompt, 3, DraftLength(1), sampler=sampler,
                                     drafting="sample").stats
        kept.append(stats.accepted_at[0])
        alphas.append(first_round_alpha(target, drafter, prompt, sampler))
    n, expected = len(kept), sum(alphas) / len(alphas)
    assert 0.1 < expected < 0.9, expected  # a pair where both outcomes happen
    # The kept drafts are independent Bernoulli draws with means alpha_s: the empirical rate lies within
    # 4 standard deviations of their mean (a 1-in-15,000 event for a fresh seed set).
    bound = 4 * math.sqrt(sum(a * (1 - a) for a in alphas)) / n
    assert abs(sum(kept) / n - expected) < bound, (sum(kept) / n, expected, bound)
