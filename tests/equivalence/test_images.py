"""Image prompts through every loop, on tiny image-text checkpoints of every family (tests/checkpoints.py
`images=True`; each image's 60-65 soft tokens are longer than the sliding window of 8):

- the speculative loop == plain decoding == a cache-free decoder that reruns the whole sequence with its images
  every step, greedy and keyed sampling (argmax drafting: plain sampling's tokens, same seed);
- a batch whose rows hold different images (and one row none) == each row run alone;
- a conversation with an image in any turn on one cache == fresh runs of each turn's prompt, and reuse never
  keeps a cached image that the new prompt replaced by another one at the same place.
"""

import dataclasses
from pathlib import Path

import pytest
import torch

from gemma4 import Gemma4Tokenizer, SamplerConfig, load_target
from gemma4.engine import decode
from gemma4.model import Gemma4Model
from gemma4.engine.rows import choose
from gemma4.vision.loading import Vision, load_vision
from gemma4.vision.prompt import PromptImages, expand
from mtp import Conversation, DraftLength, load_drafter
from mtp.drafter import Drafter
from mtp.engine.batch import speculative_generate_batch
from tests.checkpoints import STOP_IDS, picture, write_assistant, write_target
from tests.tokenizer_fixture import write_tokenizer
from mtp.engine import speculative_one
from gemma4.engine.forward import forward_rows

FAMILIES = {"e2b": None, "moe": None, "dense": True, "12b": None}  # shape -> both_ways (None: the file's default)
NEW = 12
SAMPLED = SamplerConfig(temperature=1.0, top_k=40, top_p=0.95, seed=11)


@pytest.fixture(scope="module", params=list(FAMILIES))
def image_pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
               ) -> tuple[Gemma4Model, Drafter, Vision, list[torch.Tensor]]:
    root = tmp_path_factory.mktemp(request.param)
    path = write_target(root / "t", request.param, images=True, both_ways=FAMILIES[request.param])
    drafter = load_drafter(write_assistant(root / "a", path, ordered_embeddings=False, echo=True, seed=2))
    vision = load_vision(path)
    pictures = [picture(37, 91, 1), picture(120, 50, 2), picture(64, 64, 3)]
    return load_target(path), drafter, vision, [vision.read(p) for p in pictures]


@torch.inference_mode()
def cache_free(target: Gemma4Model, ids: list[int], images: PromptImages, n: int,
               sampler: SamplerConfig | None = None) -> list[int]:
    """No cache and no chunks: every token from one forward over the whole sequence, its images replaced in."""
    seq = list(ids)
    for _ in range(n):
        out = forward_rows(target, torch.tensor([seq]), soft=images.soft([0], len(seq), torch.device("cpu")))
        seq += choose(target, out.logits[:, -1], [sampler], [len(seq)])
    return seq[len(ids):]


@pytest.mark.parametrize("sampler", [None, SAMPLED], ids=["greedy", "sampled"])
def test_speculative_equals_plain_equals_cache_free(image_pair, sampler: SamplerConfig | None) -> None:  # noqa: ANN001
    target, drafter, vision, vectors = image_pair
    b = vision.tokens.boi
    ids, images = vision.prompt([2, 10, b, 12, 13, b, 14], vectors[:2])
    reference = cache_free(target, ids, images, NEW, sampler)
    plain = decode(target, [ids], NEW, [sampler], images=images)[0].tokens
    assert plain == reference
    for chunk, k in ((None, 3), (16, 1), (5, 4)):  # chunks shorter than an image, and than the window
        spec = speculative_one(target, drafter, ids, NEW, DraftLength(k), (), sampler, images=images,
                                    prefill_chunk=chunk)
        assert spec.tokens == reference, f"prefill chunk {chunk}, K={k}"


def test_batch_rows_with_different_images_equal_solo_runs(image_pair) -> None:  # noqa: ANN001
    target, drafter, vision, vectors = image_pair
    b = vision.tokens.boi
    rows = [([2, 10, b, 12], [vectors[0]]), ([2, b, 30, 31, 32, b, 33], [vectors[2], vectors[1]]),
            ([2, 40, 41], []), ([2, b, 50], [vectors[1]])]
    expanded = [vision.prompt(ids, images) for ids, images in rows]
    prompts = [ids for ids, _ in expanded]
    together = PromptImages(prompts, [images for _, images in rows], vision.tokens)
    samplers = [None, SAMPLED, SAMPLED, None]
    solo = [decode(target, [ids], NEW, [s], images=images)[0].tokens for (ids, images), s in zip(expanded, samplers)]
    assert [g.tokens for g in decode(target, prompts, NEW, samplers, images=together)] == solo
    spec = speculative_generate_batch(target, drafter, prompts, NEW, DraftLength(3), (), samplers, images=together,
                                      prefill_chunk=16)
    assert [r.tokens for r in spec] == solo


def test_a_batch_with_a_both_ways_image_longer_than_a_chunk_drafts_past_it(image_pair) -> None:  # noqa: ANN001
    """An image of 70 soft tokens seen both ways makes the slack 70, more than the 64 a prefill chunk of 16 asks for.
    A batch's verify pads a row past its last position by up to the slack less one: the cache must hold them. Row 0
    (the image, a budget of 2) sets the cache's length; row 1 drafts 66 in the first round, so row 0's block reaches
    66 past its prompt, 2 past its budget plus 64 pads. Every row equals its run alone."""
    target, drafter, vision, vectors = image_pair
    tokens = dataclasses.replace(vision.tokens, both_ways=True)
    long = torch.cat(vectors)[:70]  # (70, E)
    rows, budgets = [([2, 10, tokens.boi, 12, 13], [long]), ([2, 40, 41], [])], [2, 72]
    prompts = [expand(ids, [len(v) for v in images], tokens) for ids, images in rows]
    together = PromptImages(prompts, [images for _, images in rows], tokens)
    assert together.longest == 70 and len(prompts[0]) + budgets[0] > len(prompts[1]) + budgets[1]
    solo = [decode(target, [p], n, images=PromptImages([p], [images], tokens))[0].tokens
            for p, n, (_, images) in zip(prompts, budgets, rows)]
    spec = speculative_generate_batch(target, drafter, prompts, budgets, DraftLength(66), images=together,
                                      prefill_chunk=16)
    assert [r.tokens for r in spec] == solo
    assert len(spec[1].stats.rounds[0].drafted) == 66


@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "speculative"])
def test_chat_with_an_image_in_any_turn_equals_fresh_runs(image_pair, tmp_path: Path, speculative: bool) -> None:  # noqa: ANN001
    target, drafter, vision, vectors = image_pair
    tokenizer = Gemma4Tokenizer(write_tokenizer(tmp_path, media=True))
    conv = Conversation(target, tokenizer, drafter if speculative else None, stop_ids=STOP_IDS, prefill_chunk=16,
                        image_tokens=vision.tokens)
    turns = [("What is this?", [vectors[0]]), ("And this one?", [vectors[1], vectors[2]]), ("Compare them.", []),
             ("A new start.", [vectors[2]])]
    previous = 0  # where the previous turn's last image ends
    for i, (text, images) in enumerate(turns):
        if i == 3:
            conv.reset()
        ids, every = conv.prompt(text, images)
        assert ids.count(vision.tokens.boi) == len(conv.images) + len(images)
        reply = conv.say(text, NEW, SamplerConfig(temperature=0.0), DraftLength(3), images=images)
        assert reply.prompt_ids == ids and reply.reused + reply.prefilled == len(ids)
        fresh = decode(target, [ids], NEW, stop_ids=STOP_IDS, images=every)[0].tokens
        assert reply.tokens == fresh, f"turn {i + 1}"
        if i in (1, 2):  # turn n reuses turn n-1's images: they are still where they were
            assert reply.reused >= previous
        previous = every.rows[0][-1].end if every else 0
    # After the reset another image sits where the first turn's was: nothing of it is reused.
    assert reply.reused <= every.rows[0][0].start


def test_a_changed_image_is_not_reused(image_pair, tmp_path: Path) -> None:  # noqa: ANN001
    """Two one-turn conversations whose prompts differ only in the image: the second reuses no soft token."""
    target, _, vision, vectors = image_pair
    conv = Conversation(target, Gemma4Tokenizer(write_tokenizer(tmp_path, media=True)), stop_ids=STOP_IDS,
                        image_tokens=vision.tokens)
    square = [vectors[2], vectors[2].flip(0)]  # the same size: the same ids, other vectors
    conv.say("Look.", 3, images=[square[0]])
    conv.reset()
    ids, every = conv.prompt("Look.", [square[1]])
    reply = conv.say("Look.", NEW, images=[square[1]])
    assert reply.reused == every.rows[0][0].start  # up to boi, not one soft token further
    assert reply.tokens == decode(target, [ids], NEW, stop_ids=STOP_IDS, images=every)[0].tokens
