"""The loops on an int4 target (Google's w4a16 layout, tests/int4_checkpoints.py; the drafter stays floating point)
commit the tokens of plain decoding, on the textbook's modules (`fast=False`: `Int4Linear` dequantizes each call) and
on the speed layer (`fast=True`: torch's int4 kernel multiplies the packed weights): speculative == plain, greedy
and keyed sampling; every batch row == its solo run; every chat turn == a fresh run over its prompt. And the speed
layer's tokens are the textbook's, its logits within the float32 bound of a float64 textbook run.

The E2B-like family (sliding window 8, KV sharing, PLE width 32 so its per-layer projections are int4), its branches
halved (tests/pairs.py `shrink_branches`: the post-norms are not quantized) against the echo drafter written for it:
partly right, so rounds accept none, some and all of their drafts. float32, token lists `==`; every expected value
is a run of the same models, no token is written down here."""

from pathlib import Path

import pytest
import torch

from gemma4 import Gemma4Model, Gemma4Tokenizer, SamplerConfig, greedy_generate, load_target, sample_generate
from gemma4.fast import products
from gemma4.fast.int4 import Int4Product
from gemma4.int4 import Int4Linear
from mtp import Conversation, Drafter, DraftLength, load_drafter, speculative_generate, speculative_generate_batch
from gemma4.engine.forward import forward_rows
from tests.checkpoints import STOP_IDS, write_assistant
from tests.int4_checkpoints import write_int4_target
from tests.pairs import plain, prompt, shrink_branches
from tests.tokenizer_fixture import write_tokenizer

PROMPTS = [prompt(3, 301), prompt(11, 1101), prompt(21, 2101)]  # below, past and far past the window (8)
BUDGETS = [20, 12, 16]
SAMPLED = SamplerConfig(temperature=0.9, top_k=40, top_p=0.95, seed=11)
LAYERS = ("textbook", "speed")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("int4-pair")
    target = write_int4_target(root / "target", "e2b")
    shrink_branches(target, 0.5)
    return target, write_assistant(root / "assistant", target, ordered_embeddings=True, echo=True, seed=2)


@pytest.fixture(scope="module", params=LAYERS)
def pair(request: pytest.FixtureRequest, files: tuple[Path, Path]) -> tuple[Gemma4Model, Drafter]:
    fast = request.param == "speed"
    target, drafter = load_target(files[0], fast=fast), load_drafter(files[1], fast=fast)
    if fast:  # torch's int4 kernel multiplies every int4 layer (q/k/v and gate/up stacked): 6 a layer, and one
        assert sum(isinstance(p, Int4Product) for p in products(target)) == 8 * 6 + 1
    else:  # 7 a layer, k and v on the 5 layers that are not KV-shared, the PLE model projection
        assert sum(isinstance(m, Int4Linear) for m in target.modules()) == 8 * 7 + 5 * 2 + 1
    return target, drafter


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Gemma4Tokenizer:
    return Gemma4Tokenizer(write_tokenizer(tmp_path_factory.mktemp("tok")))


def test_speculative_equals_plain(pair) -> None:  # noqa: ANN001
    target, drafter = pair
    accepted = []
    for ids, n in zip(PROMPTS, BUDGETS):
        for k in (2, 4):
            greedy = speculative_generate(target, drafter, ids, n, DraftLength(k))
            assert greedy.tokens == plain(target, ids, n), (len(ids), k)
            sampled = speculative_generate(target, drafter, ids, n, DraftLength(k), sampler=SAMPLED)
            assert sampled.tokens == plain(target, ids, n, SAMPLED), (len(ids), k)
            accepted += [r.matched for r in greedy.stats.rounds + sampled.stats.rounds]
    assert 0 in accepted and 4 in accepted  # rounds that kept none and all of their drafts
    assert plain(target, PROMPTS[2], 16, SAMPLED) != plain(target, PROMPTS[2], 16)  # sampling is not greedy here


def test_batch_rows_equal_solo_runs(pair) -> None:  # noqa: ANN001
    target, drafter = pair
    samplers = [SamplerConfig(temperature=0.9, top_k=40, seed=5 + b) for b in range(len(PROMPTS))]
    for rows in (None, samplers):
        batch = speculative_generate_batch(target, drafter, PROMPTS, BUDGETS, DraftLength(3), samplers=rows)
        for b, (ids, n) in enumerate(zip(PROMPTS, BUDGETS)):
            sampler = None if rows is None else rows[b]
            solo = speculative_generate(target, drafter, ids, n, DraftLength(3), sampler=sampler)
            assert batch[b].tokens == solo.tokens == plain(target, ids, n, sampler), (b, sampler)
            assert [(r.drafted, r.matched) for r in batch[b].stats.rounds] == [
                (r.drafted, r.matched) for r in solo.stats.rounds], (b, sampler)


@pytest.mark.parametrize("sampler", (SamplerConfig(temperature=0.0), SamplerConfig(temperature=0.8, top_k=40, seed=7)),
                         ids=("greedy", "sampled"))
def test_chat_turns_equal_fresh_runs(pair, tokenizer: Gemma4Tokenizer, sampler: SamplerConfig) -> None:  # noqa: ANN001
    target, drafter = pair
    conv = Conversation(target, tokenizer, drafter, " Be brief. ", False, STOP_IDS)
    previous = None
    for text in ("Hello there, who are you?", "Tell me a story about a cat.", "Why is that?"):
        reply = conv.say(text, 10, sampler, DraftLength(3))
        fresh = speculative_generate(target, drafter, reply.prompt_ids, 10, DraftLength(3), STOP_IDS, sampler)
        assert reply.tokens == fresh.tokens, f"turn {reply.turn} differs from a fresh run"
        if previous is not None:  # the conversation's cache was reused, not rebuilt
            assert reply.reused >= len(previous.prompt_ids)
        previous = reply


def test_speed_layer_is_the_textbook(files: tuple[Path, Path]) -> None:
    """Tokens equal; logits each within a few float32 roundings of a float64 textbook run: the speed layer's error at
    most 4 times the textbook's own, or 64 float32 ulps of the largest logit where the textbook's happens to be smaller
    (the rule of tests/speed/test_fast.py: two float32 runs that sum in other orders; the kernel's scale and zero
    are the same q · s, so a wrong nibble order or scale would be off by whole logits)."""
    textbook, speed = load_target(files[0], fast=False), load_target(files[0], fast=True)
    drafter = load_drafter(files[1])
    for ids, n in zip(PROMPTS, BUDGETS):
        assert greedy_generate(speed, ids, n) == greedy_generate(textbook, ids, n)
        assert sample_generate(speed, ids, n, SAMPLED) == sample_generate(textbook, ids, n, SAMPLED)
        assert (speculative_generate(speed, drafter, ids, n, DraftLength(3)).tokens
                == speculative_generate(textbook, drafter, ids, n, DraftLength(3)).tokens)
    exact = load_target(files[0], dtype=torch.float64, fast=False)
    for ids in PROMPTS:
        x = torch.tensor([ids])
        reference = forward_rows(exact, x).logits[0]
        floor = 64 * torch.finfo(torch.float32).eps * float(reference.abs().max())
        textbook_error = float((forward_rows(textbook, x).logits[0].double() - reference).abs().max())
        assert float((forward_rows(speed, x).logits[0].double() - reference).abs().max()) <= max(4 * textbook_error, floor)
