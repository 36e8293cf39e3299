"""Logits that hold a NaN (a NaN weight or scale in a file, a bfloat16 overflow) stop every loop with one
NonFiniteLogits naming the step, where argmax would take the NaN for the largest logit and emit token 0 at every
step, and a centroid head would look up a token that does not exist: plain and speculative, greedy and sampled,
the textbook's loops and the engine's (one row, a batch, chat), a NaN in the target or in the drafter alone, and
the command's one line with exit status 2."""

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from gemma4 import SamplerConfig, greedy_generate, load_target, sample_generate
from gemma4.engine import decode, generate_one
from gemma4.generate import NonFiniteLogits
from gemma4.tokenizer import Gemma4Tokenizer
from mtp import Conversation, DraftLength, load_drafter, speculative_generate, speculative_generate_batch
from mtp.engine import speculative_one
from tests.checkpoints import write_assistant, write_target
from tests.tokenizer_fixture import write_tokenizer
from tests.commands.test_cli import assert_one_line_failure, run_inprocess

SAMPLER = SamplerConfig(temperature=0.8, top_k=20, seed=1)
PROMPT = [2, 5, 17, 99, 300, 41, 5, 17]


def with_nan(src: Path, dst: Path, name: str) -> Path:
    """A copy of the checkpoint in `src` with the tensor `name` all NaN."""
    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    tensors[name] = torch.full_like(tensors[name], float("nan"))
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """'target': the E2B-like target's final norm NaN, beside its sound drafter (a centroid head);
    'drafter': the sound target beside a drafter whose final norm is NaN."""
    root = tmp_path_factory.mktemp("nan")
    target = write_target(root / "target", "e2b")
    assistant = write_assistant(root / "assistant", target, ordered_embeddings=True)
    bad_target = with_nan(target, root / "bad-target", "model.language_model.norm.weight")
    bad_assistant = with_nan(assistant, root / "bad-assistant", "model.norm.weight")
    sound = load_target(target)
    return {"target": (load_target(bad_target), load_drafter(assistant)),
            "drafter": (sound, load_drafter(bad_assistant)), "paths": (bad_target, assistant)}


@pytest.mark.parametrize("sampler", [None, SAMPLER], ids=["greedy", "sampled"])
def test_plain_decoding_stops_at_the_prefill(pairs: dict, sampler: SamplerConfig | None) -> None:
    target, _ = pairs["target"]
    step = f"the target's logits for position {len(PROMPT)} hold a NaN or \\+inf"
    for run in (lambda: sample_generate(target, PROMPT, 8, sampler),  # the textbook
                lambda: generate_one(target, PROMPT, 8, sampler),  # the engine, one row
                lambda: decode(target, [PROMPT, PROMPT[:5]], 8, [sampler, sampler])):  # a batch
        with pytest.raises(NonFiniteLogits, match="^" + step) as e:
            run()
        assert "bfloat16 overflow" in str(e.value) and "float32" in str(e.value)
    with pytest.raises(NonFiniteLogits):
        greedy_generate(target, PROMPT, 8)


@pytest.mark.parametrize(("sampler", "drafting"), [(None, "argmax"), (SAMPLER, "argmax"), (SAMPLER, "sample")],
                         ids=["greedy", "sampled", "sample-drafted"])
def test_speculative_decoding_stops_with_one_error(pairs: dict, sampler: SamplerConfig | None,
                                                    drafting: str) -> None:
    for which, step in (("target", "the target's logits for position"), ("drafter", "the drafter's states")):
        target, drafter = pairs[which]
        runs = [lambda: speculative_generate(target, drafter, PROMPT, 12, 4, sampler=sampler, drafting=drafting),
                lambda: speculative_one(target, drafter, PROMPT, 12, DraftLength(4), sampler=sampler,
                                        drafting=drafting),
                lambda: speculative_generate_batch(target, drafter, [PROMPT, PROMPT[:5]], 12, DraftLength(4),
                                                   samplers=[sampler, sampler] if sampler else None,
                                                   drafting=drafting)]
        for run in runs:
            with pytest.raises(NonFiniteLogits, match=step):
                run()


def test_a_conversation_stops_with_one_error(pairs: dict, tmp_path: Path) -> None:
    tokenizer = Gemma4Tokenizer(write_tokenizer(tmp_path))
    for which in ("target", "drafter"):
        target, drafter = pairs[which]
        with pytest.raises(NonFiniteLogits):
            Conversation(target, tokenizer, drafter).say("Hi.", 8, draft_length=DraftLength(4))


def test_the_command_prints_one_line(pairs: dict, capsys: pytest.CaptureFixture) -> None:
    target, assistant = pairs["paths"]
    status, out, err = run_inprocess(capsys, ["--target", str(target), "--assistant", str(assistant),
                                              "--prompt-ids", "2,5,17", "--max-new-tokens", "4"])
    assert_one_line_failure(status, out, err, "error: the target's logits for position 3 hold a NaN or +inf: a "
                                              "NaN or infinite weight or scale in the checkpoint, or a bfloat16 "
                                              "overflow; check the files, or run in float32")
