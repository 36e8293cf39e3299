"""Plain decoding with the KV cache, for one prompt: the loop every other loop is measured against.

The loop owns the position. One forward over the whole prompt writes its K/V and gives the logits
that choose the first new token; then one forward per token, at the position after the last. Greedy
is an explicit argmax (the first index of the maximum on ties) of the softcapped logits. Sampling
warps the same logits and draws the token at position n with noise keyed by (seed, n)
(gemma4/sampling.py), so the same seed gives the same tokens, and a speculative loop that reaches
position n draws there exactly what this loop draws.

Many prompts at once, chunked prefill, media and a conversation's held cache are the engine's
(gemma4/engine/), held token-equal to this loop by the tests.

Shape legend: T new tokens, V vocab."""

from collections.abc import Sequence

import torch
from torch import Tensor

from gemma4.cache import KVCache
from gemma4.model import Gemma4Model
from gemma4.sampling import SamplerConfig, sample, sampling_or_greedy


class PromptError(ValueError):
    """A prompt or budget the model cannot run (empty, ids outside the vocabulary or for media, past
    the context)."""


class NonFiniteLogits(ArithmeticError):
    """Logits (or a drafter's state) holding a NaN or +inf: no token can be chosen from them. `what`
    names the step."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what} hold a NaN or +inf: a NaN or infinite weight or scale in the "
                         f"checkpoint, or a bfloat16 overflow; check the files, or run in float32")


def choosable(values: Tensor) -> Tensor:
    """(..., V) -> (...,) bool: can a token be chosen from the row? Not where it holds a NaN (argmax
    would take it for the largest) or +inf; a -inf logit is only a token never chosen."""
    return ~(values.isnan() | values.isposinf()).any(dim=-1)


def check_finite(values: Tensor, what: str) -> None:
    """Stop where no token can be chosen (`choosable`), naming the step."""
    if not choosable(values).all():
        raise NonFiniteLogits(what)


def check_prompt(model: Gemma4Model, prompt: list[int], max_new_tokens: int) -> None:
    """Reject what the model cannot run, with a message that says what to change."""
    c = model.config
    if not prompt:
        raise PromptError("the prompt is empty: give at least one token")
    if bad := [i for i in prompt if not 0 <= i < c.vocab_size]:
        raise PromptError(f"token id {bad[0]} is outside the vocabulary 0..{c.vocab_size - 1}")
    if placeholders := [i for i in prompt if i in c.media_token_ids]:
        raise PromptError(f"token id {placeholders[0]} is a media soft token and nothing fills it: "
                          f"give the image, clip or frames it stands for, or remove it")
    if max_new_tokens < 1:
        raise PromptError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if len(prompt) >= c.max_position_embeddings:
        raise PromptError(f"the prompt has {len(prompt)} tokens; the model's context is "
                          f"{c.max_position_embeddings}: shorten it")


def budget_of(model: Gemma4Model, prompt: list[int], max_new_tokens: int) -> int:
    """How many new tokens a run may commit: the budget, or what the context leaves."""
    return min(max_new_tokens, model.config.max_position_embeddings - len(prompt))


def new_cache(model: Gemma4Model, prompt: list[int], max_new_tokens: int) -> KVCache:
    """A cache for the prompt and the budget: every position the run can reach."""
    w = model.embed_tokens.weight
    capacity = len(prompt) + budget_of(model, prompt, max_new_tokens)
    return KVCache(model.config, capacity, dtype=w.dtype, device=w.device)


def next_token(logits: Tensor, sampler: SamplerConfig | None, position: int) -> int:
    """The token at `position` from the logits (V,) of the position before: the argmax when greedy
    (sampler None), else the keyed draw from the warped logits."""
    check_finite(logits, f"the target's logits for position {position}")
    if sampler is None:
        return int(logits.argmax())
    return sample(logits, sampler, position)


def finished(tokens: list[int], stop_ids: Sequence[int], budget: int) -> bool:
    """Does a run of new `tokens` end here: after a stop id (kept), or once the `budget` is spent?
    """
    return tokens[-1] in stop_ids or len(tokens) >= budget


@torch.inference_mode()
def sample_generate(model: Gemma4Model, prompt: list[int], max_new_tokens: int,
                    sampler: SamplerConfig | None, stop_ids: Sequence[int] = ()) -> list[int]:
    """The new tokens, ending with the first stop id (kept) or after max_new_tokens (or the
    context). Greedy when `sampler` is None or its temperature 0."""
    sampler = sampling_or_greedy(sampler)
    check_prompt(model, prompt, max_new_tokens)
    cache = new_cache(model, prompt, max_new_tokens)
    budget = budget_of(model, prompt, max_new_tokens)
    # The ids to run next and the position of the first of them; the new tokens.
    ids, position, tokens = prompt, 0, []
    while not tokens or not finished(tokens, stop_ids, budget):
        # One forward: K/V of `ids` written at position.., the logits of the last one.
        out = model(ids, start=position, cache=cache, last=1)
        position += len(ids)
        cache.length = position  # K/V of 0..position-1 are committed
        token = next_token(out.logits[-1], sampler, position)
        tokens.append(token)
        ids = [token]
    return tokens


def greedy_generate(model: Gemma4Model, prompt: list[int], max_new_tokens: int,
                    stop_ids: Sequence[int] = ()) -> list[int]:
    """`sample_generate` without a sampler: the argmax at every position."""
    return sample_generate(model, prompt, max_new_tokens, None, stop_ids)
