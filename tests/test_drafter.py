"""The drafter against transformers 5.22.2 `Gemma4AssistantForCausalLM` on the same files (float32):
logits of both heads and the next hidden for the same target state, whole drafting rounds, and the
first round of transformers' assisted `generate`. Plus the load-time pair checks."""

import json
from pathlib import Path

import pytest
import torch

from gemma4 import ConfigError, KVCache, load_target
from mtp import DraftLength, check_pair, load_drafter, speculative_generate
from mtp.loading import drafter_config_from_dict
from mtp.speculative import target_kv
from tests.checkpoints import SHAPES, write_assistant, write_target
from tests.tf_oracle import tf_assisted_greedy, tf_assistant, tf_draft, tf_drafter_step, tf_target, tf_target_outputs

CASES = [(shape, ordered) for shape in SHAPES for ordered in (True, False)]


def prompt(length: int, seed: int = 11) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return [2] + torch.randint(3, 512, (length - 1,), generator=g).tolist()


@pytest.fixture(scope="module", params=CASES, ids=[f"{s}-{'centroid' if o else 'dense'}" for s, o in CASES])
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    shape, ordered = request.param
    root = tmp_path_factory.mktemp(shape)
    target = write_target(root / "target", shape)
    assistant = write_assistant(root / "assistant", target, ordered_embeddings=ordered, seed=3)
    return load_target(target), load_drafter(assistant), tf_target(target), tf_assistant(assistant)


def our_state(target, ids: list[int]):  # noqa: ANN001, ANN201
    """Prefill like the loop does: the committed token at position P, h[P-1], K/V of 0..P-1."""
    cache = KVCache(target.config, len(ids) + 1)
    out = target.run(torch.tensor([ids]), cache, 0)
    cache.length = len(ids)
    return int(out.logits[0, -1].argmax()), out.hidden[0, -1], target_kv(cache, target, len(ids))


@pytest.mark.parametrize("length", [4, 21])  # within and beyond the drafter's window (6)
def test_one_step_matches_transformers(pair, length: int) -> None:  # noqa: ANN001
    """The same target state (transformers' own) goes into both drafters."""
    target, drafter, tf_t, tf_a = pair
    ids = prompt(length)
    state = tf_target_outputs(tf_t, ids)
    token, t = int(state.logits[-1].argmax()), len(ids)
    kv = {kind: (k[:, :, :t], v[:, :, :t]) for kind, (k, v) in state.kv.items()}  # positions 0..t-1
    inputs = drafter.layer_inputs(torch.tensor([t]), t, torch.float32)
    hn, next_hidden = drafter.step(target.embed(torch.tensor([[token]])), state.hidden[None, -1:], inputs, kv)
    hn, next_hidden = hn[:, 0], next_hidden[0, 0]  # (1, D), (E,)
    expected = tf_drafter_step(tf_a, tf_t, state, token, t)
    torch.testing.assert_close(drafter.logits(hn)[0], expected.logits, atol=1e-4, rtol=0)  # the model's head
    dense = hn[0] @ drafter.model.embed_tokens.weight.T
    torch.testing.assert_close(dense, expected.dense_logits, atol=1e-4, rtol=0)  # the dense head, always
    torch.testing.assert_close(next_hidden, expected.hidden, atol=1e-4, rtol=0)
    assert int(drafter.greedy_token(hn)) == expected.token


def test_a_whole_round_matches_transformers(pair) -> None:  # noqa: ANN001
    target, drafter, tf_t, tf_a = pair
    ids = prompt(19)
    token, hidden, kv = our_state(target, ids)
    ours = drafter.draft(target, token, hidden, len(ids), kv, 6)
    theirs = [s.token for s in tf_draft(tf_a, tf_t, tf_target_outputs(tf_t, ids), token, len(ids), 6)]
    assert ours == theirs


def test_first_round_of_assisted_generate(pair) -> None:  # noqa: ANN001
    """Only the first round: later rounds differ by design (mtp/README.md §9)."""
    target, drafter, tf_t, tf_a = pair
    ids = prompt(17)
    run = tf_assisted_greedy(tf_t, tf_a, ids, 24, num_assistant_tokens=4)
    ours = speculative_generate(target, drafter, ids, 24, DraftLength(4))
    assert ours.stats.rounds[0].drafted == run.rounds[0].drafted
    assert ours.tokens == run.tokens


def test_centroid_greedy_needs_no_full_vocabulary(pair) -> None:  # noqa: ANN001
    _, drafter, _, _ = pair
    if not hasattr(drafter, "masked_embedding"):
        return
    head = drafter.model.embed_tokens.weight
    hn = torch.randn(64, drafter.config.text.hidden_size, generator=torch.Generator().manual_seed(0))
    assert torch.equal(drafter.greedy_token(hn), drafter.logits(hn).argmax(-1))
    # An exact tie between two candidates goes to the lower id, as argmax over the full vector does.
    ids, scores = drafter.masked_embedding.candidates(hn[:1], head)
    best = int(ids[0, scores[0].argmax()])
    other = int(ids[0, scores[0].argsort()[-2]])
    tied = head.clone()
    tied[min(best, other)] = tied[max(best, other)] = head[best]
    drafter.model.embed_tokens.weight.data, saved = tied, head
    try:
        assert int(drafter.greedy_token(hn[:1])) == min(best, other) == int(drafter.logits(hn[:1]).argmax())
    finally:
        drafter.model.embed_tokens.weight.data = saved


def test_pair_checks_name_both_checkpoints(tmp_path: Path) -> None:
    e2b, moe = write_target(tmp_path / "e2b", "e2b"), write_target(tmp_path / "moe", "moe")
    for_moe = load_drafter(write_assistant(tmp_path / "moe-assistant", moe, ordered_embeddings=False))
    with pytest.raises(ConfigError, match=r"assistant A does not belong to target T: its layer 0 expects"):
        check_pair(load_target(e2b).config, for_moe.config, "T", "A")
    config = json.loads((tmp_path / "moe-assistant" / "config.json").read_text())
    config["backbone_hidden_size"] = 96
    with pytest.raises(ConfigError, match="backbone_hidden_size is 96, the target's hidden size is 64"):
        check_pair(load_target(moe).config, drafter_config_from_dict(config), "T", "A")
    config["backbone_hidden_size"], config["text_config"]["vocab_size"] = 64, 1024
    with pytest.raises(ConfigError, match="vocabulary has 1024 tokens"):
        check_pair(load_target(moe).config, drafter_config_from_dict(config), "T", "A")
    config["text_config"]["num_kv_shared_layers"] = 2
    with pytest.raises(ConfigError, match="num_kv_shared_layers must equal num_hidden_layers"):
        drafter_config_from_dict(config)
