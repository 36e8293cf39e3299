"""`load_target(..., quantize_head="int4")` (gemma4/fast/apply.py `int4_head`, `--quantize-head int4`): the tied head
multiplies by an int4 copy of the embedding, made by the release recipe (gemma4/int4.py `quantize`). What it
computes is the textbook's head on the dequantized copy, summed in another order; the embedding's lookup keeps the
file's rows; speculative decoding still commits plain decoding's tokens; a load it cannot serve is refused in one
line. Its argmax agreement with the bf16 head is a benchmark figure (scripts/bench/peer.py), not a test: it
depends on the model's logit gaps."""

from pathlib import Path

import pytest
import torch

from gemma4 import greedy_generate, load_target
from gemma4.config import ConfigError
from gemma4.fast import kernels_of
from gemma4.fast.int4 import Int4Product
from gemma4.fast.modules import FastHead
from gemma4.int4 import dequantize, quantize
from mtp import DraftLength, load_drafter, speculative_generate
from tests.pairs import prompt

PROMPT = prompt(13, 77)


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_the_head_is_the_dequantized_embedding(pair: tuple[Path, Path], dtype: torch.dtype) -> None:
    model = load_target(pair[0], dtype, fast=True, quantize_head="int4")
    assert isinstance(model.head, FastHead) and isinstance(model.head.product, Int4Product)
    plain = load_target(pair[0], dtype, fast=True)
    assert torch.equal(model.embed_tokens.weight, plain.embed_tokens.weight)  # the lookup keeps the file's rows
    hidden = torch.randn(5, model.config.hidden_size).to(dtype)  # (T, E)
    embedding = model.embed_tokens.weight
    expected = hidden.double() @ dequantize(*quantize(embedding)).double().T  # (T, V) by the textbook's sum
    got = model.head(hidden, embedding).double()
    scale = expected.abs().max().item()
    bound = 1e-5 if dtype == torch.float32 else 2e-2  # another summation order, then the output's rounding
    assert (got - expected).abs().max().item() <= bound * scale
    # Not the float head: the quantization moves the logits by far more than either rounding.
    assert (plain.head(hidden, embedding).double() - expected).abs().max().item() > bound * scale
    assert any("the tied head quantized at load" in c.why for c in kernels_of(model))


def test_speculative_equals_plain_with_the_int4_head(pair: tuple[Path, Path]) -> None:
    model = load_target(pair[0], torch.bfloat16, fast=True, quantize_head="int4")
    drafter = load_drafter(pair[1], torch.bfloat16, fast=True, target=model)
    expected = greedy_generate(model, PROMPT, 24)
    for k in (1, 3, 6):
        assert speculative_generate(model, drafter, PROMPT, 24, DraftLength(k)).tokens == expected, k


@pytest.mark.parametrize("kwargs, words", (({"quantize_head": "int8"}, "the one scheme is 'int4'"),
                                           ({"quantize_head": "int4", "fast": False}, "load with fast=True")))
def test_a_head_it_cannot_quantize_is_refused(pair: tuple[Path, Path], kwargs: dict, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        load_target(pair[0], **kwargs)
