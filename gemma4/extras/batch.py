"""Plain decoding of many prompts at once: every row of the batch is its own run (mtp/README.md §12).

The batch-1 loop in gemma4/generate.py stays the textbook; this is the same loop over B rows beside
it, and the tests hold every row against it. Facts a reader must know:
- Rows keep their own positions from 0: no left padding, no shared offset. Each forward takes a (B,)
  start position, and RoPE, masks and cache writes follow each row's own positions (gemma4/model.py).
- Ragged prompts are prefilled together, in chunks, right-padded: a row's pad tokens sit at positions after
  its prompt, where its cache slots are stale: the causal mask hides them (a query at p sees keys
  j <= p only) and the row's next writes overwrite them. Nothing is zero-filled.
- A row that chooses a stop id or spends its budget leaves the batch (its cache rows are dropped);
  it never stops another. Budgets and stop ids are per row.
- Row b chooses every token with the very function its solo run uses (greedy_choice, or keyed sampling
  with its own seed), at its own positions, so its tokens are the solo run's (float32; a batched
  forward only reduces in another order, ~1e-6 relative, see README "What equivalent means").

Shape legend: B rows still in the batch, T new tokens per row, V vocab, E hidden.
"""

from collections.abc import Sequence

import torch

from gemma4.cache import PREFILL_CHUNK, KVCache, ring_slack
from gemma4.generate import Chooser, Generated, check_prompt, finish_reason, greedy_choice, sampler_choice
from gemma4.model import Gemma4Model
from gemma4.sampling import SamplerConfig

PAD = 0  # <pad>: any id would do, a pad's K/V lands in stale slots only


def per_row(budgets: int | Sequence[int], stop_ids: Sequence[int] | Sequence[Sequence[int]], rows: int
            ) -> tuple[list[int], list[tuple[int, ...]]]:
    """One budget and one stop-id list for every row: given once for all rows, or one per row."""
    budgets = [budgets] * rows if isinstance(budgets, int) else list(budgets)
    if stop_ids and not isinstance(stop_ids[0], int):
        stops = [tuple(s) for s in stop_ids]
    else:
        stops = [tuple(stop_ids)] * rows
    if len(budgets) != rows or len(stops) != rows:
        raise ValueError(f"{rows} prompts need {rows} budgets and stop-id lists, got {len(budgets)} and {len(stops)}")
    return budgets, stops


def check_prompts(model: Gemma4Model, prompts: Sequence[list[int]], budgets: list[int]) -> None:
    if not prompts:
        raise ValueError("the batch is empty: give at least one prompt")
    for prompt, budget in zip(prompts, budgets):
        check_prompt(model, prompt, budget)


def prefill_rows(model: Gemma4Model, cache: KVCache, prompts: Sequence[list[int]], chunk: int | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 0 for every row: positions 0..P_b-1 in chunks of at most `chunk` positions (gemma4/generate.py
    `prefill`), every row in each forward, right-padded. A row whose prompt is done re-runs its last token
    (the same K/V again) rather than writing pads past it, so no forward writes more than `chunk` positions
    past a row's length: the sliding layers' rings stay exact (gemma4/README.md §15).
    Returns each row's logits (B, V) and post-norm hidden (B, E) at its last prompt position."""
    device = cache.slot_positions.device
    chunk = min(PREFILL_CHUNK if chunk is None else chunk, cache.slack)
    lengths = [len(p) for p in prompts]
    longest = max(lengths)
    for first in range(0, longest, chunk):
        t = min(chunk, longest - first)
        starts = [min(first, n - 1) for n in lengths]
        ids = torch.tensor([p[s:s + t] + [PAD] * (t - len(p[s:s + t])) for p, s in zip(prompts, starts)],
                           device=device)  # (B, T)
        cache.length = torch.tensor(starts, device=device)  # (B,): positions 0..s_b-1 hold row b's prompt
        out = model.run(ids, cache, start_pos=cache.length, num_logits=0)
    cache.length = torch.tensor(lengths, device=device)  # (B,): the pads are stale
    rows = torch.arange(len(prompts), device=device)
    last = out.hidden[rows, torch.tensor([n - 1 - s for n, s in zip(lengths, starts)], device=device)]  # (B, E)
    return model.logits(last), last  # (B, V), (B, E)


def new_cache(model: Gemma4Model, rows: int, capacity: int, chunk: int | None = None) -> KVCache:
    w = model.embed_tokens.weight
    return KVCache(model.config, capacity, batch=rows, dtype=w.dtype, device=w.device,
                   slack=ring_slack(PREFILL_CHUNK if chunk is None else chunk))


@torch.inference_mode()
def decode_batch(
    model: Gemma4Model, prompts: Sequence[list[int]], max_new_tokens: int | Sequence[int],
    choosers: Sequence[Chooser], stop_ids: Sequence[int] | Sequence[Sequence[int]] = (),
    prefill_chunk: int | None = None,
) -> list[Generated]:
    """gemma4.generate.decode over B rows: each row's new tokens, ending with its first stop id (kept)
    or after its budget, and why they ended; choosers[b] picks row b's tokens."""
    budgets, stops = per_row(max_new_tokens, stop_ids, len(prompts))
    check_prompts(model, prompts, budgets)
    context = model.config.max_position_embeddings
    cache = new_cache(model, len(prompts), max(min(len(p) + n, context) for p, n in zip(prompts, budgets)),
                      prefill_chunk)
    logits, _ = prefill_rows(model, cache, prompts, prefill_chunk)  # (B, V)
    seqs = [list(p) for p in prompts]
    results: list[Generated | None] = [None] * len(prompts)
    rows = list(range(len(prompts)))  # cache row i holds prompt rows[i]
    while True:
        tokens, going = [], []
        for i, b in enumerate(rows):  # row b's token at its own position len(seqs[b])
            tokens.append(choosers[b](logits[i:i + 1], len(seqs[b])))
            seqs[b].append(tokens[-1])
            if reason := finish_reason(seqs[b], len(prompts[b]), budgets[b], stops[b], context):
                results[b] = Generated(seqs[b][len(prompts[b]):], reason)
            else:
                going.append(i)
        if not going:
            return results
        if len(going) < len(rows):  # finished rows leave: the others' positions do not move
            cache.keep(going)
            rows, tokens = [rows[i] for i in going], [tokens[i] for i in going]
        ids = torch.tensor(tokens, device=cache.keys[0].device)[:, None]  # (B, 1)
        logits = model.run(ids, cache, start_pos=cache.length).logits[:, -1]  # (B, V)
        cache.length = cache.length + 1


def greedy_generate_batch(
    model: Gemma4Model, prompts: Sequence[list[int]], max_new_tokens: int | Sequence[int],
    stop_ids: Sequence[int] | Sequence[Sequence[int]] = (), prefill_chunk: int | None = None,
) -> list[list[int]]:
    """Row b == greedy_generate(model, prompts[b], max_new_tokens[b], stop_ids[b])."""
    rows = decode_batch(model, prompts, max_new_tokens, [greedy_choice] * len(prompts), stop_ids, prefill_chunk)
    return [row.tokens for row in rows]


def sample_generate_batch(
    model: Gemma4Model, prompts: Sequence[list[int]], max_new_tokens: int | Sequence[int],
    samplers: Sequence[SamplerConfig], stop_ids: Sequence[int] | Sequence[Sequence[int]] = (),
    prefill_chunk: int | None = None,
) -> list[list[int]]:
    """Row b == sample_generate(model, prompts[b], max_new_tokens[b], samplers[b], stop_ids[b]): give
    each row its own seed (the CLI uses seed + b)."""
    return [row.tokens for row in plain_generate_batch(model, prompts, max_new_tokens, samplers, stop_ids,
                                                       prefill_chunk)]


def plain_generate_batch(
    model: Gemma4Model, prompts: Sequence[list[int]], max_new_tokens: int | Sequence[int],
    samplers: Sequence[SamplerConfig], stop_ids: Sequence[int] | Sequence[Sequence[int]] = (),
    prefill_chunk: int | None = None,
) -> list[Generated]:
    """Row b == plain_generate(model, prompts[b], max_new_tokens[b], samplers[b], stop_ids[b])."""
    choosers = [greedy_choice if s.greedy else sampler_choice(s, model.sampler_candidates) for s in samplers]
    return decode_batch(model, prompts, max_new_tokens, choosers, stop_ids, prefill_chunk)
