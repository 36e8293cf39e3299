"""The engine's forward: many rows at their own positions, over the ring cache, with media.

It is the textbook's forward (gemma4/model.py `Gemma4Model.forward`) made of the same parts (the
embedding, Per-Layer Embeddings, `layer_inputs`, the layer stack, the head), with what the engine
adds:
- rows: `start_pos` (B,) holds each row's first position; RoPE, masks and cache writes are per row;
- the ring cache (gemma4/engine/ring.py): `claim` gives the slots a forward writes and the
  positions of the slots each layer type reads;
- media (gemma4/engine/media.py): media ids embed as the pad token, their PLE rows too, as
  transformers does; `soft` vectors then replace those embeddings, and an image's tokens see each
  other both ways on sliding layers (gemma4/README.md §19).

Shape legend: B rows, T new tokens, S key positions, E hidden, V vocab, L layers, P PLE width."""

from functools import lru_cache
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor

from gemma4.config import SLIDING
from gemma4.engine.ring import KV, RingCache
from gemma4.model import Gemma4Model, LayerInputs, additive_mask, attention_mask, layer_inputs

if TYPE_CHECKING:
    from gemma4.engine.media import Soft


class RowsOutput(NamedTuple):
    logits: Tensor  # (B, n, V) for the last n positions, softcapped
    hidden: Tensor  # (B, T, E) after the final norm: the drafter's "hidden" input
    # type -> K, V (B, G, S, D) of kv_source(type) and their positions
    source_kv: dict[str, KV]


def forward_rows(model: Gemma4Model, input_ids: Tensor, cache: RingCache | None = None,
                 start_pos: Tensor | None = None, num_logits: int | None = None,
                 soft: "Soft | None" = None) -> RowsOutput:
    """input_ids (B, T), row b at positions start_pos[b]..start_pos[b]+T-1 (start_pos (B,) on the
    host; None: 0). With a cache, K/V are written at those positions and queries attend to
    0..start_pos+T-1 (sliding layers: what their ring holds of it); the caller moves
    `cache.length`. `num_logits`: the head on the last n positions only (0: none). `soft`: vectors
    in place of some embeddings (§19). A stand-in for the model (gemma4/fast/static.py) runs its
    own."""
    if not isinstance(model, Gemma4Model):
        return model.forward_rows(input_ids, cache, start_pos, num_logits, soft)
    c = model.config
    b, t = input_ids.shape
    input_ids = as_pads(input_ids, c.media_token_ids)  # (B, T)
    x = model.embed(input_ids.to(model.embed_tokens.weight.device))  # (B, T, E)
    tok = model.per_layer_rows(input_ids, x) if c.ple_dim else None  # (B, T, L*P)
    if soft is not None:
        x = x.masked_scatter(soft.where[..., None].to(x.device), soft.vectors.to(x.dtype))
    # The per-layer inputs see the soft vectors too.
    ple = model.per_layer_inputs(tok, x) if c.ple_dim else None  # (B, T, L, P)
    start = torch.zeros(b, dtype=torch.long) if start_pos is None else start_pos  # (B,)
    if cache is None:
        # Positions 0..T-1, every layer reading this forward's keys.
        if bool(start.any()):
            raise ValueError("a forward without a cache starts at position 0")
        positions, slots = torch.arange(t, device=x.device)[None], None  # (1, T): every row's
        key_positions = {kind: positions for kind in c.layer_types}
    else:
        # Where the K/V go and which keys each type reads, once.
        slots = cache.claim(start, t)
        positions, key_positions = slots.positions, slots.key_positions  # (B, T)
    inputs = layer_inputs(c, positions, key_positions, x.dtype)
    if soft is not None and soft.both_ways is not None:
        inputs[SLIDING] = both_ways(c.sliding_window, positions, key_positions[SLIDING],
                                    soft.both_ways, inputs[SLIDING])
    hidden, source_kv = model.stack(x, ple, inputs, cache, slots)
    shown = t if num_logits is None else num_logits
    kv = {kind: KV(k, v, key_positions[kind]) for kind, (k, v) in source_kv.items()}
    return RowsOutput(model.logits(hidden[:, t - shown:]), hidden, kv)


@lru_cache
def media_id_tensor(media_token_ids: tuple[int, ...]) -> Tensor:
    """(M,) the media ids on the host, made once per config, not per forward."""
    return torch.tensor(media_token_ids, dtype=torch.long)


def as_pads(input_ids: Tensor, media_token_ids: tuple[int, ...]) -> Tensor:
    """input_ids (B, T) with every media id replaced by the pad token (id 0), as transformers embeds them."""
    media = torch.isin(input_ids, media_id_tensor(media_token_ids).to(input_ids.device))  # (B, T)
    return input_ids.masked_fill(media, 0)


def both_ways(window: int, positions: Tensor, key_positions: Tensor,
              spans: tuple[Tensor, Tensor], inputs: LayerInputs) -> LayerInputs:
    """A sliding layer's inputs with the mask of §19: query p also sees the keys lo <= j < hi of
    its span, ahead of it too, within the window. spans (lo, hi), each (B, T)."""
    lo, hi = spans
    k = key_positions[:, None, :]  # (B or 1, 1, S)
    causal = attention_mask(positions, key_positions, window)[:, 0]  # (B, T, S)
    ahead = (k >= lo[..., None]) & (k < hi[..., None]) & (k > positions[..., None] - window)
    visible = (causal | ahead)[:, None]  # (B, 1, T, S)
    return inputs._replace(mask=additive_mask(visible, inputs.mask.dtype))
