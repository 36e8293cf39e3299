"""What both engine loops do with their rows (plain decoding, gemma4/engine/decode.py; speculative, mtp/engine/rows.py): a
`Request` per prompt, checked; one cache for them all; step 0, the prefill; and how a row's token is chosen.

Many prompts (mtp/README.md §12): every row keeps its own positions from 0 (`cache.length` and `start_pos` are (B,),
one prompt is B = 1), no left padding. Each row's prompt is prefilled as its solo run's would be; after that, ragged
rows step together, right-padded: a row's pads sit past its prompt, in slots the causal mask hides and its next
writes overwrite. Row b chooses every token as its run alone would (`choose`, its own sampler), at its own
positions, so its tokens are its solo run's: with the same logits bits on the speed layer (a step of up to
STEP_ROWS rows, gemma4/fast/rows.py), in the textbook's modules up to a batched forward's other order of sums. A
conversation hands a loop its cache, holding K/V for the first cache.length ids of the prompt (the prefix shared
with the previous turn): only the rest is prefilled.

Shape legend: B rows, T new tokens per row, V vocab, E hidden."""

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import torch

from gemma4.engine.ring import PREFILL_CHUNK, RingCache, ring_slack
from gemma4.generate import PromptError, check_prompt, finished  # noqa: F401 (PromptError: importable here)
from gemma4.model import Gemma4Model
from gemma4.engine.forward import forward_rows
from gemma4.engine.sampling import finite_argmax, refuse_marked, rule_of
from gemma4.sampling import TOKEN_STREAM, SamplerConfig

if TYPE_CHECKING:  # soft embeddings in the prompts: `prefill` asks them what to replace
    from gemma4.engine.media import Media

PAD = 0  # <pad>: any id would do, a pad's K/V lands in stale slots only


class Request(NamedTuple):
    """One row's run: what every loop takes per prompt."""
    prompt: list[int]
    max_new_tokens: int
    stop_ids: tuple[int, ...] = ()  # the run ends after the first one it commits (kept)
    sampler: SamplerConfig | None = None  # None or temperature 0: greedy


def check_rows(model: Gemma4Model, rows: Sequence[Request], media: "Media | None") -> None:
    """Every row's prompt (its media's placeholders as text pads) and budget checked."""
    if not rows:
        raise ValueError("the batch is empty: give at least one prompt")
    for b, row in enumerate(rows):
        check_prompt(model, row.prompt if media is None else media.text_ids(b, row.prompt), row.max_new_tokens)


def new_cache(model: Gemma4Model, rows: Sequence[Request], chunk: int | None, media: "Media | None" = None,
              verify: bool = False) -> RingCache:
    """A cache for every row's prompt + budget (within the context), its sliding layers' slack fitting the prefill
    chunks (a chunk holds a whole both-ways span where `media` has one). `verify`, several rows: room for a verify's
    pads past a row's last position, at most the slack (K + 1 rows) and the budget."""
    w, context = model.embed_tokens.weight, model.config.max_position_embeddings
    longest = max(min(len(r.prompt) + r.max_new_tokens, context) for r in rows)
    slack = ring_slack(max(PREFILL_CHUNK if chunk is None else chunk, media.longest if media else 0))
    pads = min(max(r.max_new_tokens for r in rows), slack) if verify and len(rows) > 1 else 0
    return RingCache(model.config, longest + pads, batch=len(rows), dtype=w.dtype, device=w.device, slack=slack)


def prefill(model: Gemma4Model, cache: RingCache, prompts: Sequence[list[int]], chunk: int | None = None,
            media: "Media | None" = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 0: write every row's prompt K/V; return each row's logits (B, V) and post-norm hidden (B, E) at its
    last prompt position, and leave `cache.length` at the prompts' lengths.

    A cache whose length is n > 0 (one row: a conversation's) already holds prompt[:n]'s K/V: only prompt[n:] runs,
    and K/V depend only on the ids before them. The prompts run in chunks of at most `chunk` positions
    (PREFILL_CHUNK, at most the cache's slack); each chunk reads the K/V the earlier ones wrote, so a prefill's
    extra memory grows with the prompt only through the full layers' cache. Several rows run one after another,
    each as it would alone; with media, all rows in each forward, right-padded, and a row whose prompt is done
    re-runs its last token (the same K/V) rather than writing pads past its length: the rings stay exact
    (gemma4/README.md §15). `media`: the prompts' soft embeddings (gemma4/engine/media.py), which say
    where a chunk may end and what each forward replaces."""
    chunk = PREFILL_CHUNK if chunk is None else chunk
    if chunk < 1:
        raise ValueError(f"a prefill chunk holds at least 1 position, got {chunk}")
    lengths, first = [len(p) for p in prompts], int(cache.length.max())
    if first >= lengths[0] or (first and len(prompts) > 1):  # the newest token must run: its logits choose the next
        raise ValueError(f"a cache may hold 0..{lengths[0] - 1} of the prompt's ids, one row only, not {first}")
    if len(prompts) > 1 and media is None:
        # Row by row, each through a one-row view of the cache: a row's prefill is then its solo run's, call for
        # call, so the speed layer gives it the solo run's bits (a forward of several rows multiplies them
        # together, and a kernel's bits follow the row count: gemma4/fast/rows.py). Its steps after need nothing:
        # each row of a step already gets the bits it has alone. Media keep one forward for all rows.
        alone = [prefill(model, cache.row(b), [prompt], chunk) for b, prompt in enumerate(prompts)]
        cache.length = torch.tensor(lengths)
        return torch.cat([logits for logits, _ in alone]), torch.cat([last for _, last in alone])  # (B, V), (B, E)
    chunk = min(chunk, cache.slack)
    while first < max(lengths):
        t = min(chunk, max(lengths) - first)
        t = t if media is None else min(media.chunk(first, t), max(lengths) - first)
        starts = [min(first, n - 1) for n in lengths]
        ids = torch.tensor([p[s:s + t] + [PAD] * (t - len(p[s:s + t])) for p, s in zip(prompts, starts)])  # (B, T)
        cache.length = torch.tensor(starts)  # positions 0..s_b-1 hold row b's prompt
        soft = None if media is None else media.soft(starts, t, cache.slot_positions.device)
        out = forward_rows(model, ids, cache, start_pos=cache.length, num_logits=0, soft=soft)  # host ids
        first += t
    cache.length = torch.tensor(lengths)  # the pads are stale
    ends = torch.tensor([n - 1 - s for n, s in zip(lengths, starts)], device=out.hidden.device)  # (B,) in the chunk
    last = out.hidden[torch.arange(len(prompts), device=out.hidden.device), ends]  # (B, E) each row's last position
    return model.logits(last), last  # (B, V), (B, E)


def keep(cache: RingCache, kept: list[int]) -> None:
    """Keep only these batch rows of the cache, in this order: finished rows leave (a copy per finish, not
    per step)."""
    index = torch.tensor(kept, device=cache.slot_positions.device)
    for layer in cache.keys:
        cache.keys[layer] = cache.keys[layer][index]  # (B', K, S_alloc, D)
        cache.values[layer] = cache.values[layer][index]
    cache.slot_positions = cache.slot_positions[index]  # (B', R)
    cache.length = cache.length[kept]


def finish_reason(seq: list[int], row: Request, context: int) -> str | None:
    """"stop" after a committed stop id, "length" when the budget or the context is spent, else None: the
    textbook loops' rule (gemma4/generate.py `finished`) on the row's new tokens."""
    new = seq[len(row.prompt):]
    if not new or not finished(new, row.stop_ids, min(row.max_new_tokens, context - len(row.prompt))):
        return None
    return "stop" if new[-1] in row.stop_ids else "length"


def choose(model: Gemma4Model, logits: torch.Tensor, samplers: Sequence[SamplerConfig | None],
           positions: list[int]) -> list[int]:
    """Row i's token at absolute positions[i] from the logits (B, V) of the position before: the argmax without a
    sampler (all such rows in one read of the device), else its keyed sample by the model's rule. Plain decoding's
    tokens and every loop's first (verifies: mtp/accept.py)."""
    greedy = finite_argmax(logits).tolist() if None in samplers else None  # (B,)
    tokens = [greedy[i] if s is None else rule_of(model).sample(logits[i:i + 1], s, TOKEN_STREAM, [n])[0]
              for i, (s, n) in enumerate(zip(samplers, positions))]
    for token, n in zip(tokens, positions):
        refuse_marked([token], f"the target's logits for position {n}")
    return tokens

