"""Plain decoding with the KV cache, greedy and sampling, for one prompt or many: one loop, every row its own run.

Greedy is an explicit argmax (first index of the maximum on ties) of the softcapped logits. Sampling warps the same
logits and draws the token at position n with noise keyed by (seed, n) (gemma4/sampling.py); the first token after
the prefill is sampled like every other. The loop owns the positions: it passes `start_pos` to every forward and
moves `cache.length`. A conversation hands the loop its own cache holding the K/V of the prompt's first `reuse` ids
(the prefix it shares with the previous turn): only the rest is prefilled (`prefill`).

Many prompts (mtp/README.md §12): every row keeps its own positions from 0 (one row: an int; several: `cache.length`
and `start_pos` are (B,) tensors), no left padding. Ragged prompts run together right-padded: a row's pads sit past
its prompt, in slots the causal mask hides and its next writes overwrite. A row that chooses a stop id or spends its
budget leaves (`cache.keep`). Row b chooses every token as its run alone would (`choose`, its own sampler), at its
own positions, so its tokens are its solo run's (float32: a batched forward only reduces in another order, ~1e-6
relative).

Shape legend: B rows still running, T new tokens per row, V vocab, E hidden."""

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import torch

from gemma4.cache import PREFILL_CHUNK, KVCache, ring_slack
from gemma4.model import Gemma4Model
from gemma4.sampling import TOKEN_STREAM, SamplerConfig, sample

if TYPE_CHECKING:  # a prompt's images: the loops pass them on, `prefill` asks them what to replace
    from gemma4.vision.prompt import PromptImages

PAD = 0  # <pad>: any id would do, a pad's K/V lands in stale slots only


class PromptError(ValueError):
    """A prompt or budget the model cannot run (empty, ids outside the vocabulary or for media, past the context)."""


def check_prompt(model: Gemma4Model, prompt: list[int], max_new_tokens: int) -> None:
    """Reject what the model cannot run, with a message that says what to change."""
    c = model.config
    if not prompt:
        raise PromptError("the prompt is empty: give at least one token")
    bad = [i for i in prompt if not 0 <= i < c.vocab_size]
    if bad:
        raise PromptError(f"token id {bad[0]} is outside the vocabulary 0..{c.vocab_size - 1}")
    media = [i for i in prompt if i in c.media_token_ids]
    if media:  # an image's soft tokens are filled by `images` (check_rows hands them over as pads), others never
        raise PromptError(f"token id {media[0]} " + ("is an image's soft token and no image fills it: give the image "
                          "(--image, or images=) at one boi id" if media[0] == c.image_token_id else "stands for a "
                          "video or audio input, which this implementation does not run: remove it"))
    if max_new_tokens < 1:
        raise PromptError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if len(prompt) >= c.max_position_embeddings:
        raise PromptError(
            f"the prompt has {len(prompt)} tokens; the model's context is {c.max_position_embeddings}: shorten it"
        )


def check_rows(model: Gemma4Model, prompts: Sequence[list[int]], budgets: int | Sequence[int],
               stop_ids: Sequence[int] | Sequence[Sequence[int]], images: "PromptImages | None" = None
               ) -> tuple[list[int], list[tuple[int, ...]]]:
    """Every prompt checked (its images' soft tokens as text pads), and one budget and one stop-id list per row:
    given once for all rows, or one per row."""
    rows = len(prompts)
    budgets = [budgets] * rows if isinstance(budgets, int) else list(budgets)
    stops = [tuple(s) for s in stop_ids] if stop_ids and not isinstance(stop_ids[0], int) else [tuple(stop_ids)] * rows
    if not rows:
        raise ValueError("the batch is empty: give at least one prompt")
    if len(budgets) != rows or len(stops) != rows:
        raise ValueError(f"{rows} prompts need {rows} budgets and stop-id lists, got {len(budgets)} and {len(stops)}")
    for b, (prompt, budget) in enumerate(zip(prompts, budgets)):
        check_prompt(model, prompt if images is None else images.text_ids(b, prompt), budget)
    return budgets, stops


def row_positions(values: list[int], device: torch.device) -> int | torch.Tensor:
    """A cache length or start position: an int for one row, a (B,) tensor for several (each row's own)."""
    return values[0] if len(values) == 1 else torch.tensor(values).to(device, non_blocking=True)  # no wait


def new_cache(model: Gemma4Model, prompts: Sequence[list[int]], budgets: list[int], chunk: int | None, pads: int = 0,
              images: "PromptImages | None" = None) -> KVCache:
    """A cache for every row's prompt + budget (within the context) and `pads` more positions, its sliding layers'
    slack fitting the prefill chunks (a chunk holds a whole image where `images` need it)."""
    w, context = model.embed_tokens.weight, model.config.max_position_embeddings
    longest = max(min(len(p) + n, context) for p, n in zip(prompts, budgets))
    chunk = max(PREFILL_CHUNK if chunk is None else chunk, images.longest if images else 0)
    return KVCache(model.config, longest + pads, batch=len(prompts), dtype=w.dtype, device=w.device,
                   slack=ring_slack(chunk))


def prefill(model: Gemma4Model, cache: KVCache, prompts: Sequence[list[int]], reuse: int = 0,
            chunk: int | None = None, images: "PromptImages | None" = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 0: write every row's prompt K/V; return each row's logits (B, V) and post-norm hidden (B, E) at its
    last prompt position, and leave `cache.length` at the prompts' lengths.

    `reuse` (one row): positions 0..reuse-1 already hold prompt[:reuse]'s K/V (the caller's promise; `KVCache.holds`
    says whether the rings still do): only prompt[reuse:] runs, and K/V depend only on the ids before them. The
    prompts run in chunks of at most `chunk` positions (PREFILL_CHUNK, at most the cache's slack), all rows in
    each forward, right-padded; each chunk reads the K/V the earlier ones wrote, so a prefill's extra memory
    grows with the prompt only through the full layers' cache. A row whose prompt is done re-runs its last
    token (the same K/V) rather than writing pads past its length: the rings stay exact (gemma4/README.md §15).
    `images`: the prompts' images (§19), which say where a chunk may end and what each forward replaces."""
    chunk = PREFILL_CHUNK if chunk is None else chunk
    if chunk < 1:
        raise ValueError(f"a prefill chunk holds at least 1 position, got {chunk}")
    if not 0 <= reuse < len(prompts[0]) or (reuse and len(prompts) > 1):  # the newest token must run: its logits
        raise ValueError(f"reuse must be in 0..{len(prompts[0]) - 1}, one row only, got {reuse}")  # choose the next
    if not cache.holds(reuse):
        raise ValueError(f"the cache no longer holds the sliding window before position {reuse}: prefill from 0")
    device, chunk, lengths = cache.slot_positions.device, min(chunk, cache.slack), [len(p) for p in prompts]
    first = reuse
    while first < max(lengths):
        t = min(chunk, max(lengths) - first)
        t = t if images is None else min(images.chunk(first, t), max(lengths) - first)
        starts = [min(first, n - 1) for n in lengths]
        ids = torch.tensor([p[s:s + t] + [PAD] * (t - len(p[s:s + t])) for p, s in zip(prompts, starts)])  # (B, T)
        cache.length = row_positions(starts, device)  # positions 0..s_b-1 hold row b's prompt
        soft = None if images is None else images.soft(starts, t, device)
        out = model.run(ids, cache, cache.length, 0, *[soft] if soft is not None else [])  # host ids; text: as ever
        first += t
    cache.length = row_positions(lengths, device)  # the pads are stale
    ends = torch.tensor([n - 1 - s for n, s in zip(lengths, starts)], device=device)  # (B,) within the last chunk
    last = out.hidden[torch.arange(len(prompts), device=device), ends]  # (B, E) each row's last prompt position
    return model.logits(last), last  # (B, V), (B, E)


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


def choose(logits: torch.Tensor, samplers: Sequence[SamplerConfig | None], positions: list[int]) -> list[int]:
    """Row i's token at absolute positions[i] from the logits (B, V) of the position before: the argmax without a
    sampler (all such rows in one read of the device), else its keyed sample. Plain decoding's tokens and every
    loop's first (verifies: mtp/accept.py)."""
    greedy = logits.argmax(dim=-1).tolist() if None in samplers else None  # (B,)
    return [greedy[i] if s is None else sample(logits[i:i + 1], s, TOKEN_STREAM, [n])[0]
            for i, (s, n) in enumerate(zip(samplers, positions))]


@torch.inference_mode()
def decode(
    model: Gemma4Model, prompts: Sequence[list[int]], max_new_tokens: int | Sequence[int],
    samplers: Sequence[SamplerConfig | None] | None = None, stop_ids: Sequence[int] | Sequence[Sequence[int]] = (),
    on_token: Callable[[int, int], None] | None = None, cache: KVCache | None = None, reuse: int = 0,
    prefill_chunk: int | None = None, images: "PromptImages | None" = None,
) -> list[Generated]:
    """The plain cached loop: prefill, then one forward per token for every row still running. Row b's new
    tokens, ending with its first stop id (kept) or after its budget, and why they ended.
    `samplers[b]`: row b's (None or temperature 0: greedy); budgets and stop ids once for all rows or one per
    row; `on_token(b, token)` sees each token as it is chosen (for streaming); `cache`, `reuse`: one row's cache
    already holding prompt[:reuse]; `prefill_chunk`, `images`: see `prefill`."""
    budgets, stops = check_rows(model, prompts, max_new_tokens, stop_ids, images)
    samplers = [None if s is None or s.greedy else s for s in samplers or [None] * len(prompts)]
    context = model.config.max_position_embeddings
    if cache is None:
        cache = new_cache(model, prompts, budgets, prefill_chunk, images=images)
    logits, _ = prefill(model, cache, prompts, reuse, prefill_chunk, images)  # (B, V)
    seqs, results = [list(p) for p in prompts], [None] * len(prompts)
    rows = list(range(len(prompts)))  # cache row i holds prompt rows[i]
    while True:
        going, tokens = [], choose(logits, [samplers[b] for b in rows], [len(seqs[b]) for b in rows])
        for i, b in enumerate(rows):  # row b's token at its own position len(seqs[b])
            seqs[b].append(tokens[i])
            if on_token:
                on_token(b, seqs[b][-1])
            if reason := finish_reason(seqs[b], len(prompts[b]), budgets[b], stops[b], context):
                results[b] = Generated(seqs[b][len(prompts[b]):], reason)
            else:
                going.append(i)
        if not going:
            return results
        if len(going) < len(rows):  # finished rows leave: the others' positions do not move
            cache.keep(going)
            rows = [rows[i] for i in going]
        ids = torch.tensor([seqs[b][-1:] for b in rows])  # (B, 1) from the host
        logits = model.run(ids, cache, start_pos=cache.length).logits[:, -1]  # (B, V)
        cache.length = cache.length + 1


def greedy_generate(
    model: Gemma4Model, prompt: list[int], max_new_tokens: int, stop_ids: list[int] | tuple[int, ...] = (),
    on_token: Callable[[int], None] | None = None, prefill_chunk: int | None = None,
    images: "PromptImages | None" = None,
) -> list[int]:
    """New tokens, ending with the first stop id (kept) or after max_new_tokens: `decode` of one row, greedy.
    `on_token` sees each token as it is chosen (for streaming); `prefill_chunk`, `images`: see `prefill`."""
    return sample_generate(model, prompt, max_new_tokens, SamplerConfig(temperature=0), stop_ids, on_token,
                           prefill_chunk=prefill_chunk, images=images)


def sample_generate(
    model: Gemma4Model, prompt: list[int], max_new_tokens: int, sampler: SamplerConfig,
    stop_ids: list[int] | tuple[int, ...] = (), on_token: Callable[[int], None] | None = None,
    cache: KVCache | None = None, reuse: int = 0, prefill_chunk: int | None = None,
    images: "PromptImages | None" = None,
) -> list[int]:
    """Like greedy_generate, each token drawn from the warped distribution with keyed noise:
    the same seed gives the same tokens. Temperature 0 is greedy_generate itself."""
    each = None if on_token is None else lambda _, token: on_token(token)
    return decode(model, [prompt], max_new_tokens, [sampler], stop_ids, each, cache, reuse, prefill_chunk,
                  images)[0].tokens
