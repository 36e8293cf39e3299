"""The plain-decoding engine: many prompts at once, every row its own run, and one prompt with what the textbook
loop (gemma4/generate.py) leaves out: a streaming callback, a held cache prefix, chunked prefill, media.

Every row chooses its tokens as the textbook loop would at its own positions, so its tokens are that loop's on the
same prompt (the tests hold them equal). The rows, their cache and their prefill: gemma4/engine/rows.py. A row that
chooses a stop id or spends its budget leaves the batch (`keep`).

Shape legend: B rows still running, V vocab."""

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import torch

from gemma4.engine.ring import RingCache
from gemma4.engine.forward import forward_rows
from gemma4.engine.media import joined
from gemma4.model import Gemma4Model
from gemma4.engine.rows import Request, check_rows, choose, finish_reason, keep, new_cache, prefill
from gemma4.sampling import SamplerConfig

if TYPE_CHECKING:
    from gemma4.engine.media import Media


class Generated(NamedTuple):
    tokens: list[int]  # the new tokens, a stop id that ended them included
    finish_reason: str  # "stop" or "length" (the budget, or the model's context)


@torch.inference_mode()
def decode_rows(
    model: Gemma4Model, rows: Sequence[Request], on_token: Callable[[int, int], None] | None = None,
    cache: RingCache | None = None, prefill_chunk: int | None = None, media: "Media | None" = None,
) -> list[Generated]:
    """The plain cached loop: prefill, then one forward per token for every row still running. Row b's new
    tokens, ending with its first stop id (kept) or after its budget, and why they ended. `on_token(b, token)` sees
    each token as it is chosen (for streaming); `cache`: one row's cache, holding its first cache.length ids;
    `prefill_chunk`, `media`: see `prefill`."""
    check_rows(model, rows, media)
    samplers = [None if r.sampler is None or r.sampler.greedy else r.sampler for r in rows]  # temperature 0: greedy
    context = model.config.max_position_embeddings
    if cache is None:
        cache = new_cache(model, rows, prefill_chunk, media=media)
    logits, _ = prefill(model, cache, [r.prompt for r in rows], prefill_chunk, media)  # (B, V)
    seqs, results = [list(r.prompt) for r in rows], [None] * len(rows)
    going = list(range(len(rows)))  # cache row i holds request going[i]
    while True:
        tokens, still = choose(model, logits, [samplers[b] for b in going], [len(seqs[b]) for b in going]), []
        for i, b in enumerate(going):  # row b's token at its own position len(seqs[b])
            seqs[b].append(tokens[i])
            if on_token:
                on_token(b, seqs[b][-1])
            if reason := finish_reason(seqs[b], rows[b], context):
                results[b] = Generated(seqs[b][len(rows[b].prompt):], reason)
            else:
                still.append(i)
        if not still:
            return results
        if len(still) < len(going):  # finished rows leave: the others' positions do not move
            keep(cache, still)
            going = [going[i] for i in still]
        ids = torch.tensor([seqs[b][-1:] for b in going])  # (B, 1) from the host
        logits = forward_rows(model, ids, cache, start_pos=cache.length).logits[:, -1]  # (B, V)
        cache.length = cache.length + 1


def decode(
    model: Gemma4Model, prompts: Sequence[list[int]], max_new_tokens: int | Sequence[int],
    samplers: Sequence[SamplerConfig | None] | None = None, stop_ids: Sequence[int] | Sequence[Sequence[int]] = (),
    on_token: Callable[[int, int], None] | None = None, cache: RingCache | None = None,
    prefill_chunk: int | None = None, images: "Media | None" = None, audio: "Media | None" = None,
) -> list[Generated]:
    """`decode_rows` with budgets, samplers and stop ids given once for all rows or one per row."""
    return decode_rows(model, requests(prompts, max_new_tokens, stop_ids, samplers), on_token, cache, prefill_chunk,
                       joined(images, audio))


def requests(prompts: Sequence[list[int]], budgets: int | Sequence[int],
             stop_ids: Sequence[int] | Sequence[Sequence[int]],
             samplers: Sequence[SamplerConfig | None] | None) -> list[Request]:
    """One Request per prompt from settings given once for all rows or one per row."""
    n = len(prompts)
    budgets = [budgets] * n if isinstance(budgets, int) else list(budgets)
    stops = [tuple(s) for s in stop_ids] if stop_ids and not isinstance(stop_ids[0], int) else [tuple(stop_ids)] * n
    if len(budgets) != n or len(stops) != n:
        raise ValueError(f"{n} prompts need {n} budgets and stop-id lists, got {len(budgets)} and {len(stops)}")
    return [Request(list(p), m, s, c) for p, m, s, c in zip(prompts, budgets, stops, samplers or [None] * n)]


def generate_one(
    model: Gemma4Model, prompt: list[int], max_new_tokens: int, sampler: SamplerConfig | None = None,
    stop_ids: Sequence[int] = (), on_token: Callable[[int], None] | None = None, cache: RingCache | None = None,
    prefill_chunk: int | None = None, images: "Media | None" = None, audio: "Media | None" = None,
) -> list[int]:
    """One prompt through the engine: the tokens of gemma4.generate's `sample_generate`, with `on_token(token)`
    called as each is chosen (streaming), `cache` holding the prompt's first cache.length ids, `prefill_chunk`,
    `images` and `audio` (see `prefill`)."""
    each = None if on_token is None else lambda _, token: on_token(token)
    row = Request(list(prompt), max_new_tokens, tuple(stop_ids), sampler)
    return decode_rows(model, [row], each, cache, prefill_chunk, joined(images, audio))[0].tokens
