"""The textbook drafter and target (`fast=False`) against transformers 5.22.2 `Gemma4AssistantForCausalLM` on the
same files: logits of both heads and the next hidden for the same target state (float32, bound against a float64
run: tests/tolerance.py), whole drafting rounds, and the first round of transformers' assisted `generate`. Plus
the load-time pair checks (a wider sliding window than the target's among them)."""

import copy
import json
from pathlib import Path

import pytest
import torch

from gemma4 import ConfigError, RingCache, load_target
from gemma4.engine.ring import KV
from mtp import DraftLength, check_pair, load_drafter, speculative_generate
from mtp.loading import drafter_config_from_dict
from tests.checkpoints import SHAPES, write_assistant, write_target
from tests.pairs import prompt
from tests.tf_oracle import tf_assisted_greedy, tf_assistant, tf_draft, tf_drafter_step, tf_target, tf_target_outputs
from tests.tolerance import assert_fp32_parity
from mtp.sample_drafting import draft_logits
from gemma4.engine.forward import forward_rows
from mtp.engine.drafts import drafter_inputs, pairs, propose_rows, ring_kv

CASES = [(shape, ordered) for shape in SHAPES for ordered in (True, False)]



@pytest.fixture(scope="module", params=CASES, ids=[f"{s}-{'centroid' if o else 'dense'}" for s, o in CASES])
def files(request: pytest.FixtureRequest, make_pair) -> tuple[Path, Path]:  # noqa: ANN001 (conftest.py)
    shape, ordered = request.param
    return make_pair(shape, ordered_embeddings=ordered, assistant_seed=3)


def load_pair(files: tuple[Path, Path], dtype: torch.dtype):  # noqa: ANN201
    target, assistant = files
    return (load_target(target, dtype=dtype, fast=False), load_drafter(assistant, dtype=dtype, fast=False),
            tf_target(target, dtype=dtype), tf_assistant(assistant, dtype=dtype))


@pytest.fixture(scope="module")
def drafter_vs_tf(files: tuple[Path, Path]):  # noqa: ANN201
    return load_pair(files, torch.float32)


@pytest.fixture(scope="module")
def drafter_vs_tf64(files: tuple[Path, Path]):  # noqa: ANN201
    """The same files in float64: the reference the float32 drafter_vs_tf is measured against."""
    return load_pair(files, torch.float64)


def our_state(target, ids: list[int]):  # noqa: ANN001, ANN201
    """Prefill like the loop does: the committed token at position P, h[P-1], K/V of 0..P-1."""
    cache = RingCache(target.config, len(ids) + 1)
    out = forward_rows(target, torch.tensor([ids]), cache)
    cache.length = torch.tensor([len(ids)])
    return int(out.logits[0, -1].argmax()), out.hidden[0, -1], ring_kv(cache, target, len(ids))


def one_step(target, drafter, tf_t, tf_a, ids: list[int], token: int):  # noqa: ANN001, ANN201
    """Both drafters' step from transformers' own target state over ids, at t = len(ids) -> ours (model
    head logits, dense head logits, next hidden), our greedy token, and transformers' DrafterStep."""
    state, t = tf_target_outputs(tf_t, ids), len(ids)
    kv = {kind: KV(k[:, :, :t], v[:, :, :t], torch.arange(t)[None]) for kind, (k, v) in state.kv.items()}  # 0..t-1
    inputs = drafter_inputs(drafter, torch.tensor([[t]]), kv, state.hidden.dtype)
    hn, next_hidden = drafter.step(target.embed(torch.tensor([[token]])), state.hidden[None, -1:], inputs, pairs(kv))
    hn = hn[:, 0]  # (1, D)
    ours = (draft_logits(drafter, hn)[0], hn[0] @ drafter.model.embed_tokens.weight.T, next_hidden[0, 0])  # (V,), (V,), (E,)
    return ours, int(drafter.greedy_token(hn)), tf_drafter_step(tf_a, tf_t, state, token, t)


@pytest.mark.parametrize("length", [4, 21])  # within and beyond the drafter's window (6)
def test_one_step_matches_transformers(drafter_vs_tf, drafter_vs_tf64, length: int,  # noqa: ANN001
                                       request: pytest.FixtureRequest) -> None:
    """The same target state (transformers' own) goes into both drafters, in float32 and in float64."""
    target, drafter, tf_t, tf_a = drafter_vs_tf
    ids = prompt(length, 11)
    token = int(tf_target_outputs(tf_t, ids).logits[-1].argmax())  # the same token in both runs
    ours, greedy, theirs = one_step(target, drafter, tf_t, tf_a, ids, token)
    ours64, _, theirs64 = one_step(*drafter_vs_tf64, ids, token)
    depth = target.config.num_layers + drafter.config.text.num_layers  # the target's error is in the state
    case = request.node.callspec.id  # e.g. e2b-centroid-21
    heads = (("model head", 0, "logits"), ("dense head", 1, "dense_logits"), ("next hidden", 2, "hidden"))
    for name, i, field in heads:
        assert_fp32_parity(f"drafter {name}", case, ours[i], getattr(theirs, field), ours64[i],
                           getattr(theirs64, field), depth)
    assert greedy == theirs.token


def test_a_whole_round_matches_transformers(drafter_vs_tf) -> None:  # noqa: ANN001
    target, drafter, tf_t, tf_a = drafter_vs_tf
    ids = prompt(19, 11)
    token, hidden, kv = our_state(target, ids)
    ours = propose_rows(drafter, target, [token], hidden[None], [len(ids)], kv, 6)[0][0].tolist()
    theirs = [s.token for s in tf_draft(tf_a, tf_t, tf_target_outputs(tf_t, ids), token, len(ids), 6)]
    assert ours == theirs


def test_first_round_of_assisted_generate(drafter_vs_tf) -> None:  # noqa: ANN001
    """Only the first round: later rounds differ by design (mtp/README.md §9)."""
    target, drafter, tf_t, tf_a = drafter_vs_tf
    ids = prompt(17, 11)
    run = tf_assisted_greedy(tf_t, tf_a, ids, 24, num_assistant_tokens=4)
    ours = speculative_generate(target, drafter, ids, 24, DraftLength(4))
    assert ours.stats.rounds[0].drafted == run.rounds[0].drafted
    assert ours.tokens == run.tokens


def test_centroid_greedy_needs_no_full_vocabulary(drafter_vs_tf) -> None:  # noqa: ANN001
    _, drafter, _, _ = drafter_vs_tf
    if not hasattr(drafter, "masked_embedding"):
        return
    head = drafter.model.embed_tokens.weight
    hn = torch.randn(64, drafter.config.text.hidden_size, generator=torch.Generator().manual_seed(0))
    assert torch.equal(drafter.greedy_token(hn), draft_logits(drafter, hn).argmax(-1))
    # An exact tie between two candidates goes to the lower id, as argmax over the full vector does.
    ids, scores = drafter.masked_embedding.scored_tokens(hn[:1], head)
    best = int(ids[0, scores[0].argmax()])
    other = int(ids[0, scores[0].argsort()[-2]])
    tied_head = head.clone()
    tied_head[min(best, other)] = tied_head[max(best, other)] = head[best]
    tied = copy.deepcopy(drafter)  # the module's drafter stays as loaded, for the other tests
    tied.model.embed_tokens.weight.data = tied_head
    assert int(tied.greedy_token(hn[:1])) == min(best, other) == int(draft_logits(tied, hn[:1]).argmax())


def test_pair_checks_name_both_checkpoints(tmp_path: Path) -> None:
    e2b, moe = write_target(tmp_path / "e2b", "e2b"), write_target(tmp_path / "moe", "moe")
    for_moe = load_drafter(write_assistant(tmp_path / "moe-assistant", moe, ordered_embeddings=False))
    with pytest.raises(ConfigError, match=r"assistant A does not belong to target T: its layer 0 expects"):
        check_pair(load_target(e2b).config, for_moe.config, "T", "A")
    config = json.loads((tmp_path / "moe-assistant" / "config.json").read_text())
    config["backbone_hidden_size"] = 96
    with pytest.raises(ConfigError, match="backbone_hidden_size is 96, the target's hidden size is 64"):
        check_pair(load_target(moe).config, drafter_config_from_dict(config), "T", "A")
    window = config["text_config"]["sliding_window"]
    config["backbone_hidden_size"], config["text_config"]["sliding_window"] = 64, 16  # the target's is 8
    with pytest.raises(ConfigError, match=r"its sliding window \(16\) is wider than the target's \(8\)"):
        check_pair(load_target(moe).config, drafter_config_from_dict(config), "T", "A")
    config["text_config"]["sliding_window"], config["text_config"]["vocab_size"] = window, 1024
    with pytest.raises(ConfigError, match="vocabulary has 1024 tokens"):
        check_pair(load_target(moe).config, drafter_config_from_dict(config), "T", "A")
    config["text_config"]["num_kv_shared_layers"] = 2
    with pytest.raises(ConfigError, match="num_kv_shared_layers must equal num_hidden_layers"):
        drafter_config_from_dict(config)


def test_a_12b_assistant_belongs_to_the_12b_alone(tmp_path: Path) -> None:
    """The 12B's assistant (`gemma4_unified_assistant`) loads and pairs with its target, and is refused on every
    other family's target with one line; theirs are refused on the 12B's."""
    targets = {shape: write_target(tmp_path / shape, shape) for shape in SHAPES}
    unified = load_drafter(write_assistant(tmp_path / "12b-assistant", targets["12b"], ordered_embeddings=False))
    config = json.loads((tmp_path / "12b-assistant" / "config.json").read_text())
    assert config["model_type"] == "gemma4_unified_assistant"
    check_pair(load_target(targets["12b"]).config, unified.config, "T", "A")
    for shape in set(SHAPES) - {"12b"}:
        other = load_drafter(write_assistant(tmp_path / f"{shape}-assistant", targets[shape], ordered_embeddings=False))
        for target, drafter in ((targets[shape], unified), (targets["12b"], other)):
            with pytest.raises(ConfigError, match=r"^assistant A does not belong to target T: [^\n]+$"):
                check_pair(load_target(target).config, drafter.config, "T", "A")
    config["model_type"] = "gemma4_assistent"
    with pytest.raises(ConfigError, match="'gemma4_assistant' or 'gemma4_unified_assistant'"):
        drafter_config_from_dict(config)
