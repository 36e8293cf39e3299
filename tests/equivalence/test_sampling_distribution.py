"""Speculative sampling is exact in distribution, in both drafting modes: a χ² test with teeth.

The law of the first L = 4 new tokens with K = 2 drafts per round (so the first round verifies
d_1, d_2 and, when both are kept, draws the bonus from the last row) is compared with the exact
target law, enumerated on a tiny model: with top-k 3 every position has 3 possible tokens, and the
81 sequences' probabilities are products of warped target rows (a cache-free forward per prefix).
N runs with seeds 0..N-1 give the observed counts; Pearson's χ² over the cells, those with an
expected count below 5 merged into one, passes iff χ² is below the 99.9% quantile of χ²(df)
(mtp/README.md §11).

The threshold: a correct law fails one fixed-seed run in 1000. The quantile is Wilson–Hilferty's
df·(1 − v + z·√v)³, v = 2/(9·df), z = 3.0902: 77.5 at df = 43 (exact 77.4), 16.6 at df = 3 (exact
16.3). A wrong law adds its noncentrality λ = N·Σ (p' − p)²/p to χ²'s mean df: the wrong rules below
give χ² ≥ 80 at 400 runs (threshold 51.3), while 5% of the likeliest token's mass moved to the least
likely of one row's 3 candidates has λ = 2.0 at N = 800 and 39 at N = 16,000, the draws that
`test_a_five_percent_bias_fails` takes: there the exact sampler passes and the biased one fails.

The product's rules run in the textbook loop (mtp/speculative.py). Each mode also runs deliberately wrong
acceptance rules in the engine (mtp/engine/rows.py, which the engine tests hold token-equal to the textbook loop),
monkeypatched into mtp/engine/accept.py (or, for argmax drafting's keyed rule, which `accept_by_rule` runs
inline, into the engine loop's `accept_by_rule`; N_WRONG runs each) and asserts that
they fail, so the test is known to detect what it is for:
- transformers' rule: q = softmax of the raw, unwarped drafter logits in the ratio test
  (transformers#47932). Against a drafter whose raw q(d) is below the target's p(d) it always keeps d;
- the bonus drawn from the wrong row (the last draft's row instead of the row after it);
- argmax drafting: on rejection a fresh draw from p, without removing d;
- sample drafting: one uniform shared by a block's positions (the first draft's, at every draft).
`u ≤ p/q` is not run: the keyed uniforms lie in (0, 1], where it differs from `u·q < p` only when
u·q = p exactly, so no sample can show it.

The pair: a two-layer target (`mini` in tests/checkpoints.py, seed 2: its consecutive positions
have distinct laws, so a bonus from the wrong row shows) and an `echo` drafter, which proposes
tokens the target often ranks in its top 3 with a raw probability below the target's, exactly where
transformers' rule goes wrong. Run with `-s` to print every statistic.

With top-k 0 every token of the vocabulary is a candidate: plain keyed draws of one row at many
positions are tested against that row's warped law, at top-p 1 and 0.9.
"""

import copy
import math

import pytest
import torch

import mtp.engine.accept as rules
import mtp.engine.accept as rejection
import mtp.engine.rows as loop
from gemma4 import SamplerConfig, load_target
from gemma4.engine.sampling import (
    TOKEN_STREAM, ACCEPT_STREAM, candidates, keyed_choice, sample, warp,
)
from mtp import DraftLength, Schedule, load_drafter, speculative_generate, speculative_one
from tests.pairs import prompt
from mtp.sample_drafting import draft_logits
from mtp.sample_drafting import keyed_uniform
from mtp.engine.drafts import keyed_sample
from gemma4.engine.forward import forward_rows

L, K, N, N_WRONG = 4, 2, 800, 400  # a wrong rule fails by a wide margin at half the runs
SAMPLER = dict(temperature=1.0, top_k=3, top_p=1.0)
STATS: dict[str, tuple[float, float, float]] = {}  # rule -> (χ², threshold), printed at the end


@torch.inference_mode()
def exact_law(target, ids: list[int], sampler: SamplerConfig) -> dict[tuple[int, ...], float]:  # noqa: ANN001
    """Every sequence of L new tokens with its probability under the warped target, no cache."""
    law = {(): 1.0}
    for _ in range(L):
        longer = {}
        for seq, p in law.items():
            row = warp(forward_rows(target, torch.tensor([ids + list(seq)])).logits[0, -1:], sampler)[0]  # (V,)
            for token in row.nonzero().flatten().tolist():
                longer[seq + (token,)] = p * float(row[token])
        law = longer
    return law


def quantile_999(df: int) -> float:
    """The 99.9% quantile of χ²(df) by Wilson–Hilferty: (χ²/df)^(1/3) is close to normal, mean 1 − v, variance v."""
    v = 2 / (9 * df)
    return df * (1 - v + 3.0902 * math.sqrt(v)) ** 3


def chi_square(law: dict[tuple[int, ...], float], samples: list[tuple[int, ...]]) -> tuple[float, float]:
    """Pearson's χ² and the pass threshold (its 99.9% quantile), cells of expected count < 5 merged."""
    n = len(samples)
    counts: dict[tuple[int, ...], int] = {}
    for s in samples:
        counts[s] = counts.get(s, 0) + 1
    big = [cell for cell, p in law.items() if p * n >= 5]
    rest_expected = n - sum(law[c] * n for c in big)
    rest_observed = n - sum(counts.get(c, 0) for c in big)  # small cells and anything outside the law
    cells = [(counts.get(c, 0), law[c] * n) for c in big] + [(rest_observed, rest_expected)]
    chi2 = sum((o - e) ** 2 / e for o, e in cells if e > 0) + (math.inf if rest_expected <= 0 < rest_observed else 0)
    df = len(cells) - 1
    return chi2, quantile_999(df)


# ---------------------------------------------------------------- the wrong rules

CORRECT_ACCEPT, CORRECT_REJECTION = rules.accept_by_rule, rules.reject_by_rule


def correct_keyed(rule, drafts, logits, sampler, t):  # noqa: ANN001, ANN201
    """The product's keyed rule (argmax drafting): `accept` with a sampler and no q, as (a, the token added)."""
    targets = CORRECT_ACCEPT(rule, drafts, logits, sampler, t, None)
    return len(targets) - 1, targets[-1]


def keyed_replaced(replacement):  # noqa: ANN001, ANN201
    """The loop's `accept` with its keyed rule (a sampler, no q) replaced; greedy and rejection as they are."""
    def accept(rule, drafts, logits, sampler, t, q):  # noqa: ANN001, ANN202
        if sampler is None or (q is not None and drafts):
            return CORRECT_ACCEPT(rule, drafts, logits, sampler, t, q)
        a, token = replacement(rule, drafts, logits, sampler, t)
        return drafts[:a] + [token]  # g_0..g_a, as `accept` returns them
    return accept

RAW_Q: list[torch.Tensor] = []  # softmax of the raw drafter logits of every draft step (see raw_q_spy)


def raw_q_spy(drafter, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """Record transformers' q at every draft step: softmax of the raw logits, min-1 filler included."""
    step = drafter.step

    def spy(*args):  # noqa: ANN002, ANN202
        hn, h = step(*args)
        RAW_Q.append(draft_logits(drafter, hn[:, 0]).float().softmax(dim=-1)[0])  # (V,)
        return hn, h

    RAW_Q.clear()
    monkeypatch.setattr(drafter, "step", spy)


def keyed_transformers(rule, drafts, logits, sampler, t):  # noqa: ANN001, ANN201
    """Argmax drafts, but the ratio test (and residual) against the raw q, as transformers 5.22.2 does."""
    if not drafts:  # a round that drafted nothing: no test to run
        return correct_keyed(rule, drafts, logits, sampler, t)
    targets = CORRECT_REJECTION(rule, drafts, torch.stack(RAW_Q[-len(drafts):]), logits, sampler, t)  # q: (K, V)
    return len(targets) - 1, targets[-1]


def keyed_wrong_bonus(rule, drafts, logits, sampler, t):  # noqa: ANN001, ANN201
    a, token = correct_keyed(rule, drafts, logits, sampler, t)
    if a == len(drafts) > 0:  # all kept: the bonus from the last draft's row, not from the row after it
        token = keyed_sample(rule, rule.warp(logits[a - 1:a], sampler), sampler.seed, TOKEN_STREAM, [t + 1 + a]).item()
    return a, token


def keyed_no_zeroing(rule, drafts, logits, sampler, t):  # noqa: ANN001, ANN201
    """Keep d with probability p(d), else a fresh draw from p, which can be d again."""
    p = rule.warp(logits, sampler)
    for i, d in enumerate(drafts):
        if not keyed_uniform(sampler.seed, ACCEPT_STREAM, t + 1 + i) < float(p[i, d]):
            return i, keyed_sample(rule, p[i:i + 1], sampler.seed, TOKEN_STREAM, [t + 1 + i]).item()
    return len(drafts), keyed_sample(rule, p[-1:], sampler.seed, TOKEN_STREAM, [t + 1 + len(drafts)]).item()


def rejection_transformers(rule, drafts, q, logits, sampler, t):  # noqa: ANN001, ANN201
    """Sampled drafts, but the raw q in the ratio test and the residual instead of the warped one."""
    return CORRECT_REJECTION(rule, drafts, torch.stack(RAW_Q[-len(drafts):]), logits, sampler, t)


def rejection_wrong_bonus(rule, drafts, q, logits, sampler, t):  # noqa: ANN001, ANN201
    # The last row replaced by the last draft's row: the bonus is drawn from the wrong distribution.
    return CORRECT_REJECTION(rule, drafts, q, torch.cat([logits[:-1], logits[-2:-1]]), sampler, t)


def rejection_shared_uniform(rule, drafts, q, logits, sampler, t):  # noqa: ANN001, ANN201
    """The product's rule with the first draft's uniform used at every position of the block."""
    keyed = rejection.keyed_uniform
    rejection.keyed_uniform = lambda seed, stream, position: keyed(seed, stream, t + 1)
    try:
        return CORRECT_REJECTION(rule, drafts, q, logits, sampler, t)
    finally:
        rejection.keyed_uniform = keyed


RULES = {  # name -> (drafting mode, the function replaced, its replacement); None: the product's own
    # "keyed": argmax drafting's rule, which `accept_by_rule` runs inline: the engine loop's is replaced
    "argmax": ("argmax", None, None),
    "argmax, transformers' raw-q rule": ("argmax", "keyed", keyed_transformers),
    "argmax, bonus from the wrong row": ("argmax", "keyed", keyed_wrong_bonus),
    "argmax, no d-zeroing on rejection": ("argmax", "keyed", keyed_no_zeroing),
    "sample": ("sample", None, None),
    "sample, transformers' raw-q rule": ("sample", "reject_by_rule", rejection_transformers),
    "sample, bonus from the wrong row": ("sample", "reject_by_rule", rejection_wrong_bonus),
    "sample, one uniform for the block": ("sample", "reject_by_rule", rejection_shared_uniform),
    "argmax, auto schedule": ("argmax", None, None),
    "sample, auto schedule": ("sample", None, None),
}


def draft_length(rule: str) -> Schedule:
    """K drafts a round, or the auto schedule with fixed costs (a verify costs 1 + 0.2 per extra row, a draft
    step 0.3): K then follows the acceptance alone, so the run is the same on every machine."""
    if "auto" in rule:
        return DraftLength(K, "auto", costs=lambda n: 1.0 + 0.2 * (n - 1), draft_cost=0.3)
    return DraftLength(K)


# ---------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def mini(make_pair):  # noqa: ANN001, ANN201 (conftest.py)
    """The two-layer target and the echo drafter (see above), loaded."""
    target, drafter = make_pair("mini", ordered_embeddings=False, echo=True, target_seed=2, assistant_seed=2)
    return load_target(target), load_drafter(drafter)


@pytest.fixture(scope="module")
def law(mini) -> dict[tuple[int, ...], float]:  # noqa: ANN001
    return exact_law(mini[0], prompt("short"), SamplerConfig(**SAMPLER))


@pytest.mark.parametrize("rule", RULES)
def test_first_tokens_follow_the_target_law(rule: str, mini, law, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    target, drafter = mini[0], copy.deepcopy(mini[1])  # the spy goes on a copy: the module's drafter stays
    drafting, replaced, replacement = RULES[rule]
    raw_q_spy(drafter, monkeypatch)
    if replaced == "keyed":
        monkeypatch.setattr(loop, "accept_by_rule", keyed_replaced(replacement))
    elif replaced:
        monkeypatch.setattr(rules, replaced, replacement)
    runs = N if replaced is None else N_WRONG
    samples, accepted = [], 0
    for seed in range(runs):
        run = speculative_generate if replaced is None else speculative_one  # the textbook; the engine, patched
        result = run(target, drafter, prompt("short"), L, draft_length(rule),
                     sampler=SamplerConfig(**SAMPLER, seed=seed), drafting=drafting)
        samples.append(tuple(result.tokens))
        accepted += result.stats.accepted
    chi2, threshold = chi_square(law, samples)
    STATS[rule] = (chi2, threshold, accepted / runs)
    if replaced is None:
        assert chi2 < threshold, (rule, chi2, threshold)
    else:
        assert chi2 >= threshold, f"the χ² test cannot tell the wrong rule {rule!r} ({chi2:.1f} < {threshold:.1f})"


DRAWS = 4000
TOP_P_AT_K0 = (1.0, 0.9)


@pytest.mark.parametrize("top_p", TOP_P_AT_K0)
def test_keyed_draws_with_every_token_a_candidate(top_p: float, mini) -> None:  # noqa: ANN001
    """top-k 0: every token of the vocabulary is a candidate and draws noise. One row of the target's
    logits drawn at DRAWS positions (each its own noise: i.i.d. draws) against its warped law."""
    target, _ = mini
    with torch.inference_mode():
        logits = forward_rows(target, torch.tensor([prompt("short")])).logits[0, -1:]  # (1, V)
    cfg = SamplerConfig(temperature=1.0, top_k=0, top_p=top_p)
    probs = warp(logits, cfg)[0]  # (V,)
    assert int((probs > 0).sum()) > (100 if top_p < 1 else logits.shape[-1] - 1)  # many candidates
    law = {(x,): float(probs[x]) for x in probs.nonzero().flatten().tolist()}
    draws = [tuple(sample(logits, cfg, TOKEN_STREAM, [n])) for n in range(DRAWS)]
    chi2, threshold = chi_square(law, draws)
    STATS[f"keyed draws, top-k 0, top-p {top_p:g}"] = (chi2, threshold, math.nan)
    assert chi2 < threshold, (top_p, chi2, threshold)


BIASED_DRAWS = 16_000


def test_a_five_percent_bias_fails(mini) -> None:  # noqa: ANN001
    """The threshold's power: one row of the target at top-k 3 (the rules' sampler), BIASED_DRAWS keyed draws
    at positions 0..BIASED_DRAWS-1. The exact sampler passes; the same draws from the row with 5% of its
    likeliest token's mass moved to its least likely candidate fail."""
    target, _ = mini
    with torch.inference_mode():
        logits = forward_rows(target, torch.tensor([prompt("short")])).logits[0, -1]  # (V,)
    cfg = SamplerConfig(**SAMPLER)
    ids, p = candidates(logits, cfg)  # (3,) each: `sample` draws keyed_choice(ids, p, ...)
    biased = p.clone()
    most, least = int(p.argmax()), int(p.argmin())
    biased[least] += 0.05 * p[most]
    biased[most] *= 0.95
    law = {(x,): float(px) for x, px in zip(ids.tolist(), p)}
    for name, probs in (("exact", p), ("5% biased", biased)):
        draws = [(keyed_choice(ids, probs, cfg.seed, TOKEN_STREAM, n).item(),) for n in range(BIASED_DRAWS)]
        chi2, threshold = chi_square(law, draws)
        STATS[f"one row at top-k 3, {name}"] = (chi2, threshold, math.nan)
        assert (chi2 < threshold) == (name == "exact"), (name, chi2, threshold)


@pytest.fixture(scope="module", autouse=True)
def report_statistics():  # noqa: ANN201
    """After this module's tests in this process: each χ² and its threshold, printed (`pytest -s` on this file; a
    report for the closing note, not a proof: under `-n 2` the tests may be shared between two processes)."""
    yield
    for rule, (chi2, threshold, accepted) in STATS.items():
        runs = "" if math.isnan(accepted) else f"  accepted drafts per run {accepted:.2f}"
        print(f"\n{rule:40s} χ² {chi2:9.1f}  threshold {threshold:6.1f}{runs}")
