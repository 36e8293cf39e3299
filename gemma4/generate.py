"""Plain decoding with the KV cache (greedy and sampling), and a cache-free reference decoder for tests.

Greedy is an explicit argmax (first index of the maximum on ties) of the softcapped logits.
Sampling warps the same logits and draws the token at position n with noise keyed by (seed, n)
(gemma4/sampling.py); the first token after the prefill is sampled like every other.
The loop owns the position: it passes `start_pos` to every forward and moves `cache.length`.
A conversation hands the loops its own cache holding the K/V of the prompt's first `reuse` ids
(the prefix it shares with the previous turn): only the rest is prefilled (`prefill`).
"""

from collections.abc import Callable
from typing import NamedTuple

import torch

from gemma4.cache import PREFILL_CHUNK, KVCache, ring_slack
from gemma4.model import Gemma4Model, ModelOutput
from gemma4.sampling import TOKEN_STREAM, Candidates, SamplerConfig, candidates, sample

# Chooses the token at absolute position n from the logits (1, V) of position n - 1.
Chooser = Callable[[torch.Tensor, int], int]


class PromptError(ValueError):
    """A prompt or budget the model cannot run (empty, ids outside the vocabulary or standing for media, past
    the context)."""


def check_prompt(model: Gemma4Model, prompt: list[int], max_new_tokens: int) -> None:
    """Reject what the model cannot run, with a message that says what to change."""
    c = model.config
    if not prompt:
        raise PromptError("the prompt is empty: give at least one token")
    bad = [i for i in prompt if not 0 <= i < c.vocab_size]
    if bad:
        raise PromptError(f"token id {bad[0]} is outside the vocabulary 0..{c.vocab_size - 1}")
    media = [i for i in prompt if i in c.media_token_ids]
    if media:
        raise PromptError(f"token id {media[0]} stands for an image, video or audio input: this model runs text "
                          f"only, remove it from the prompt")
    if max_new_tokens < 1:
        raise PromptError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if len(prompt) >= c.max_position_embeddings:
        raise PromptError(
            f"the prompt has {len(prompt)} tokens; the model's context is {c.max_position_embeddings}: shorten it"
        )


def prefill(model: Gemma4Model, prompt: list[int], max_new_tokens: int, cache: KVCache | None,
            reuse: int, chunk: int | None = None) -> tuple[KVCache, ModelOutput]:
    """Write the prompt's K/V and return the output of its last position.

    Without a cache, a new one sized for the call, its sliding layers' slack fitting `chunk`. With one, its
    positions 0..reuse-1 must hold the K/V of prompt[:reuse] (the caller's promise; `KVCache.holds` says whether
    the sliding layers' rings still do): they are kept and only prompt[reuse:] runs. K/V depend only on the ids
    before them, so the result is the full prefill's. The prompt runs in chunks of at most `chunk` positions
    (PREFILL_CHUNK, and never more than the cache's slack): each chunk's queries read the K/V the earlier
    chunks wrote, so the extra memory of a prefill grows with the prompt only through the full layers' cache.
    """
    chunk = PREFILL_CHUNK if chunk is None else chunk
    if chunk < 1:
        raise ValueError(f"a prefill chunk holds at least 1 position, got {chunk}")
    device, dtype = model.embed_tokens.weight.device, model.embed_tokens.weight.dtype
    if cache is None:
        context = model.config.max_position_embeddings
        cache = KVCache(model.config, min(len(prompt) + max_new_tokens, context), dtype=dtype, device=device,
                        slack=ring_slack(chunk))
    if not 0 <= reuse < len(prompt):  # the newest prompt token must run: its logits choose the first new one
        raise ValueError(f"reuse must be in 0..{len(prompt) - 1}, got {reuse}")
    if not cache.holds(reuse):
        raise ValueError(f"the cache no longer holds the sliding window before position {reuse}: prefill from 0")
    chunk = min(chunk, cache.slack)
    for start in range(reuse, len(prompt), chunk):
        cache.length = start  # positions 0..start-1 hold the prompt's K/V
        ids = prompt[start:start + chunk]
        out = model.run(torch.tensor([ids]), cache, start_pos=start, num_logits=1)  # (1, T) host ids
    cache.length = len(prompt)
    return cache, out


def finish_reason(seq: list[int], prompt_len: int, max_new_tokens: int, stop_ids: list[int] | tuple[int, ...],
                  context: int) -> str | None:
    """"stop" after a committed stop id, "length" when the budget or the context is spent, else None."""
    if seq[-1] in stop_ids:
        return "stop"
    if len(seq) - prompt_len == max_new_tokens or len(seq) >= context:
        return "length"
    return None


class Generated(NamedTuple):
    tokens: list[int]  # the new tokens, a stop id that ended them included
    finish_reason: str  # "stop" or "length" (the budget, or the model's context)


def greedy_choice(logits: torch.Tensor, position: int) -> int:
    return int(logits[0].argmax())


def sampler_choice(sampler: SamplerConfig, rows: Candidates = candidates) -> Chooser:
    def choose(logits: torch.Tensor, position: int) -> int:
        return sample(logits, sampler, TOKEN_STREAM, [position], rows)[0]
    return choose


@torch.inference_mode()
def decode(
    model: Gemma4Model, prompt: list[int], max_new_tokens: int, choose: Chooser,
    stop_ids: list[int] | tuple[int, ...] = (), on_token: Callable[[int], None] | None = None,
    cache: KVCache | None = None, reuse: int = 0, prefill_chunk: int | None = None,
) -> Generated:
    """The plain cached loop: prefill, then one forward per token; `choose` picks each token.
    `cache`, `reuse`: a cache already holding prompt[:reuse]; `prefill_chunk`: see `prefill`."""
    check_prompt(model, prompt, max_new_tokens)
    context = model.config.max_position_embeddings
    cache, out = prefill(model, prompt, max_new_tokens, cache, reuse, prefill_chunk)
    seq = list(prompt)
    while True:
        seq.append(choose(out.logits[0, -1:], cache.length))  # the token at position cache.length
        if on_token:
            on_token(seq[-1])
        if reason := finish_reason(seq, len(prompt), max_new_tokens, stop_ids, context):
            return Generated(seq[len(prompt):], reason)
        out = model.run(torch.tensor([seq[-1:]]), cache, start_pos=cache.length)  # the token from the host
        cache.length += 1


def greedy_generate(
    model: Gemma4Model, prompt: list[int], max_new_tokens: int, stop_ids: list[int] | tuple[int, ...] = (),
    on_token: Callable[[int], None] | None = None, prefill_chunk: int | None = None,
) -> list[int]:
    """New tokens, ending with the first stop id (kept) or after max_new_tokens.
    `on_token` sees each token as it is chosen (for streaming); `prefill_chunk`: see `prefill`."""
    return decode(model, prompt, max_new_tokens, greedy_choice, stop_ids, on_token,
                  prefill_chunk=prefill_chunk).tokens


def sample_generate(
    model: Gemma4Model, prompt: list[int], max_new_tokens: int, sampler: SamplerConfig,
    stop_ids: list[int] | tuple[int, ...] = (), on_token: Callable[[int], None] | None = None,
    cache: KVCache | None = None, reuse: int = 0, prefill_chunk: int | None = None,
) -> list[int]:
    """Like greedy_generate, each token drawn from the warped distribution with keyed noise:
    the same seed gives the same tokens. Temperature 0 is greedy_generate itself."""
    return plain_generate(model, prompt, max_new_tokens, sampler, stop_ids, on_token, cache, reuse,
                          prefill_chunk).tokens


def plain_generate(
    model: Gemma4Model, prompt: list[int], max_new_tokens: int, sampler: SamplerConfig,
    stop_ids: list[int] | tuple[int, ...] = (), on_token: Callable[[int], None] | None = None,
    cache: KVCache | None = None, reuse: int = 0, prefill_chunk: int | None = None,
) -> Generated:
    """sample_generate's tokens with the reason they ended, as speculative_generate returns them."""
    choose = greedy_choice if sampler.greedy else sampler_choice(sampler, model.sampler_candidates)
    return decode(model, prompt, max_new_tokens, choose, stop_ids, on_token, cache, reuse, prefill_chunk)


@torch.inference_mode()
def reference_greedy(
    model: Gemma4Model, prompt: list[int], max_new_tokens: int, stop_ids: list[int] | tuple[int, ...] = (),
) -> list[int]:
    """Obviously correct and slow: recompute the whole sequence for every new token, no cache."""
    seq = list(prompt)
    device = model.embed_tokens.weight.device
    for _ in range(max_new_tokens):
        token = int(model(torch.tensor([seq], device=device))[0, -1].argmax())
        seq.append(token)
        if token in stop_ids:
            break
    return seq[len(prompt):]
