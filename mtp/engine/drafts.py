"""The engine's drafting: the drafter's steps (mtp/drafter.py `Drafter.step`, `greedy_token`) for many
rows at once, over the ring cache's K/V, and sample drafting by a model's sampling rule.

Row b drafts after its own newest token at its own position; the mask hides row b's keys from its
position on. Greedy drafts stay on the device until the caller reads them all at once.

Shape legend: B rows, k drafts, E target hidden, U drafter width, V vocab, M candidates."""

import torch
from torch import Tensor

from gemma4.config import FULL, SLIDING
from gemma4.engine.ring import KV, RingCache
from gemma4.engine.sampling import NOT_FINITE, Sampling, keyed_choice, rule_of
from gemma4.generate import choosable
from gemma4.model import Gemma4Model, LayerInputs, layer_inputs
from gemma4.sampling import DRAFT_STREAM, SamplerConfig
from mtp.drafter import Drafter
from mtp.sample_drafting import draft_logits


def ring_kv(cache: RingCache, target: Gemma4Model, end: int) -> dict[str, KV]:
    """What the drafter reads (mtp §3): K/V of positions 0..end-1 of the target's last non-shared
    sliding and full layers, with their slots' positions. A ring's stale slots past a row's newest
    position are hidden by the mask."""
    c = target.config
    return {kind: cache.read(c.kv_source(kind), end) for kind in (SLIDING, FULL)}


@torch.inference_mode()
def propose_rows(drafter: Drafter, target: Gemma4Model, tokens: list[int], hidden: Tensor,
                 positions: list[int], source_kv: dict[str, KV], k: int,
                 samplers: list[SamplerConfig] | None = None) -> tuple[Tensor, Tensor | None]:
    """k drafts for each of B rows: row b's after tokens[b] at positions[b], from the target's
    post-norm hidden (B, E) at positions[b] - 1 and its K/V (`ring_kv`). Greedy without samplers;
    with one per row (sample drafting), draft j of row b is drawn from its warped q_j with
    DRAFT_STREAM noise keyed at positions[b] + j, by the target's rule. -> drafts (B, k), q (B, k,
    V) or None. A stand-in for the drafter (gemma4/fast/static.py) runs its own."""
    if not isinstance(drafter, Drafter):
        return drafter.propose_rows(target, tokens, hidden, positions, source_kv, k, samplers)
    h = hidden[:, None]  # (B, 1, E)
    ids = torch.tensor(tokens, device=hidden.device)[:, None]  # (B, 1)
    # Every step of a round queries the same position (mtp §4).
    query = torch.tensor(positions, device=hidden.device)[:, None]  # (B, 1)
    inputs = drafter_inputs(drafter, query, source_kv, hidden.dtype)
    kv = pairs(source_kv)
    drafted: list[Tensor] = []
    probs: list[Tensor] = []
    finite = torch.ones(len(tokens), 1, dtype=torch.bool, device=hidden.device)  # (B, 1) every state so far
    for j in range(1, k + 1):
        hn, h = drafter.step(target.embed(ids), h, inputs, kv)  # (B, 1, U), (B, 1, E)
        finite &= choosable(hn)
        if samplers is None:
            ids = drafter.greedy_token(hn[:, 0])[:, None]  # (B, 1)
        else:
            ids, q = draw_drafts(drafter, rule_of(target), hn[:, 0], samplers, positions, j)
            probs.append(q)  # (B, V)
        drafted.append(ids)
    q = torch.stack(probs, dim=1) if probs else None  # (B, k, V)
    # A row whose drafter states held a NaN or +inf drafts NOT_FINITE, refused when read.
    return torch.where(finite, torch.cat(drafted, dim=1), NOT_FINITE), q  # (B, k)


def keyed_sample(rule: Sampling, probs: Tensor, seed: int, stream: int,
                 positions: list[int]) -> Tensor:
    """probs (N, V), row i the token at positions[i]'s -> (N,) tokens, not read: the keyed draws of
    `rule.sample` from probabilities already warped (the drafter's q)."""
    ids = [rule.support(row) for row in probs]  # (M_i,) each
    rows = zip(ids, probs, positions)
    return torch.cat([keyed_choice(i, row[i], seed, stream, p) for i, row, p in rows])  # (N,)


def draw_drafts(drafter: Drafter, rule: Sampling, hn: Tensor, samplers: list[SamplerConfig],
                positions: list[int], j: int) -> tuple[Tensor, Tensor]:
    """Draft j of every row from the drafter's normed state hn (B, U): its logits warped by row b's
    sampler into q (B, V), 0 outside a centroid head's tokens, drawn with DRAFT_STREAM noise keyed at
    positions[b] + j. -> ids (B, 1), q (B, V)."""
    logits = draft_logits(drafter, hn, filler=float("-inf"))  # (B, V)
    # A NaN state's logits are drawn from as zeros (propose_rows marks its drafts NOT_FINITE); -inf stays.
    logits = torch.nan_to_num(logits, nan=0.0, posinf=float("inf"), neginf=float("-inf"))
    q = torch.cat([rule.warp(logits[b:b + 1], s) for b, s in enumerate(samplers)])  # (B, V)
    rows = enumerate(zip(samplers, positions))
    ids = [keyed_sample(rule, q[b:b + 1], s.seed, DRAFT_STREAM, [p + j]) for b, (s, p) in rows]
    return torch.cat(ids)[:, None], q


def pairs(source_kv: dict[str, KV]) -> dict[str, tuple[Tensor, Tensor]]:
    """The keys and values `Drafter.step` reads, from the ring's `KV` (their positions go to the mask)."""
    return {kind: (kv.keys, kv.values) for kind, kv in source_kv.items()}


def drafter_inputs(drafter: Drafter, positions: Tensor, source_kv: dict[str, KV],
                   dtype: torch.dtype) -> dict[str, LayerInputs]:
    """RoPE at the drafter's query positions (B, T) and masks over the target's keys, known by their
    positions: a query at p sees keys 0..p-1, its sliding layers the newest W_d + 1 (mtp §5)."""
    key_positions = {kind: kv.positions for kind, kv in source_kv.items()}
    return layer_inputs(drafter.config.text, positions, key_positions, dtype, shift=1)
