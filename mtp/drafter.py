"""The Gemma 4 MTP drafter ("assistant"): its config, model and centroid head (its loader:
mtp/loading.py).

Design: mtp/README.md (cited as §n). Facts a reader must know:
- The drafter has no K/V of its own: each of its 4 layers (3 sliding, 1 full) attends to the K/V the
  target already computed in its last non-shared layer of the same type (§3). It writes nothing.
- Its input is concat(the *target's* scaled embedding of a token, a target-sized hidden state),
  projected down to the drafter width; its output is logits and the next hidden, projected back up.
- Every draft step of a round uses the same query position p and the same KV (positions 0..p-1).
  That constant position is how the drafter was trained: do not "fix" it (§4).
- The sliding layers see the newest W_d + 1 positions, one more than a target query would (§5).
- `model.embed_tokens` is the drafter's output head, never an input embedding. E2B/E4B drafters use
  a centroid head over it (§6): score 2048 clusters, keep the top 32, score only their 4096 tokens.

Shape legend: B batch, E target hidden, D drafter hidden, V vocab, C centroids, k top centroids, S
key positions."""

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from gemma4.cache import KV, KVCache
from gemma4.config import FULL, SLIDING, TextConfig
from gemma4.model import (
    DecoderLayer, Gemma4Model, LayerInputs, RMSNorm, TiedHead, layer_inputs, linear,
)
from gemma4.sampling import SamplerConfig
from mtp.sample_drafting import draw_drafts


@dataclass(frozen=True)
class DrafterConfig:
    text: TextConfig  # the drafter's own layers; all of them KV-shared
    backbone_hidden_size: int  # the target's hidden size E
    use_ordered_embeddings: bool  # centroid head (E2B/E4B) or dense head (26B/31B)
    num_centroids: int
    centroid_top_k: int


class CentroidHead(nn.Module):
    """§6: score centroids, keep the top k, score only the tokens of those clusters."""

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.top_k = cfg.centroid_top_k
        self.centroids = linear(cfg.text.hidden_size, cfg.num_centroids)
        self.register_buffer("token_ordering", torch.empty(cfg.text.vocab_size, dtype=torch.long))

    def candidates(self, hn: Tensor, head: Tensor) -> tuple[Tensor, Tensor]:
        """hn (B, D), head (V, D) -> token ids (B, k*V/C) and their scores (B, k*V/C)."""
        top = self.centroids(hn).topk(self.top_k, dim=-1).indices  # (B, k)
        # (C, V/C): cluster -> its tokens
        table = self.token_ordering.view(self.centroids.out_features, -1)
        ids = table[top].flatten(1)  # (B, k*V/C)
        scores = (head[ids] @ hn[:, :, None]).squeeze(-1)  # (B, k*V/C, D) @ (B, D, 1) -> (B, k*V/C)
        return ids, scores

    def greedy(self, hn: Tensor, head: Tensor) -> Tensor:
        """(B,) argmax without a length-V vector; exact ties go to the lowest id, as argmax over V
        would."""
        ids, scores = self.candidates(hn, head)
        best = scores == scores.max(dim=-1, keepdim=True).values  # (B, k*V/C)
        # Above every id: a candidate that is not the best never wins the min.
        never = ids.new_full((), torch.iinfo(ids.dtype).max)
        return torch.where(best, ids, never).min(dim=-1).values


class DrafterBody(nn.Module):
    """Named `model` in the checkpoint: the layers, the final norm and the output head."""

    def __init__(self, text: TextConfig) -> None:
        super().__init__()
        # The output head only; `_weight`: no init, see Gemma4Model
        v, d = text.vocab_size, text.hidden_size
        self.embed_tokens = nn.Embedding(v, d, _weight=torch.empty(v, d))
        self.layers = nn.ModuleList(DecoderLayer(text, i) for i in range(text.num_layers))
        self.norm = RMSNorm(text.hidden_size, text.rms_norm_eps)


class Drafter(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.config = cfg
        e, d = cfg.backbone_hidden_size, cfg.text.hidden_size
        self.pre_projection = linear(2 * e, d)
        self.post_projection = linear(d, e)
        self.model = DrafterBody(cfg.text)
        if cfg.use_ordered_embeddings:
            self.masked_embedding = CentroidHead(cfg)
        else:
            self.head = TiedHead()  # a dense head over `model.embed_tokens` (26B/31B)

    def layer_inputs(self, positions: Tensor, shared_kv: dict[str, KV], dtype: torch.dtype
                     ) -> dict[str, LayerInputs]:
        """RoPE at the query positions (B, T) and masks over the target's keys, known by their
        positions (a sliding ring's slots included). A query at p sees the target's keys 0..p-1, and
        its sliding layers the newest W_d + 1 of them (§5): shift 1."""
        key_positions = {kind: kv.positions for kind, kv in shared_kv.items()}
        return layer_inputs(self.config.text, positions, key_positions, dtype, shift=1)

    def step(
        self, token_embedding: Tensor, hidden: Tensor, inputs: dict[str, LayerInputs],
        shared_kv: dict[str, KV],
    ) -> tuple[Tensor, Tensor]:
        """One draft step (§4). token_embedding, hidden (B, T, E) -> normed state (B, T, D), next
        hidden (B, T, E)."""
        # (B, T, 2E) -> (B, T, D)
        u = self.pre_projection(torch.cat([token_embedding, hidden], dim=-1))
        for layer in self.model.layers:
            # Every drafter layer is KV-shared: it reads the target's K/V of its type.
            kv = shared_kv[layer.kind]
            u, _ = layer(u, inputs[layer.kind], None, None, None, (kv.keys, kv.values))
        hn = self.model.norm(u)  # (B, T, D)
        return hn, self.post_projection(hn)

    def greedy_token(self, hn: Tensor) -> Tensor:
        """(B, D) -> (B,) the proposed token, without a full-vocabulary tensor on the centroid head.
        """
        if self.config.use_ordered_embeddings:
            return self.masked_embedding.greedy(hn, self.model.embed_tokens.weight)
        return self.head(hn, self.model.embed_tokens.weight).argmax(dim=-1)

    @torch.inference_mode()
    def propose(
        self, target: Gemma4Model, tokens: list[int], hidden: Tensor, positions: list[int],
        shared_kv: dict[str, KV], k: int, samplers: list[SamplerConfig] | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """k drafts for each of B rows: row b's after tokens[b] at positions[b], from the target's
        post-norm hidden (B, E) at positions[b] - 1 and its K/V (type -> the cache's `KV`; the mask
        hides row b's keys from positions[b] on). Greedy without samplers; with one per row
        (`sample` drafting, §11), draft j of row b is drawn from its warped q_j with DRAFT_STREAM
        noise keyed at positions[b] + j, by the target's rule. -> drafts (B, k), q (B, k, V) or
        None."""
        h = hidden[:, None]  # (B, 1, E)
        ids = torch.tensor(tokens, device=hidden.device)[:, None]  # (B, 1)
        # Every step of a round queries the same position (§4).
        query = torch.tensor(positions, device=hidden.device)[:, None]  # (B, 1)
        inputs = self.layer_inputs(query, shared_kv, hidden.dtype)
        drafted: list[Tensor] = []
        probs: list[Tensor] = []
        for j in range(1, k + 1):
            hn, h = self.step(target.embed(ids), h, inputs, shared_kv)  # (B, 1, D), (B, 1, E)
            if samplers is None:
                ids = self.greedy_token(hn[:, 0])[:, None]  # (B, 1)
            else:
                ids, q = draw_drafts(self, target.sampling, hn[:, 0], samplers, positions, j)
                probs.append(q)  # (B, V)
            drafted.append(ids)
        q = torch.stack(probs, dim=1) if probs else None  # (B, k, V)
        return torch.cat(drafted, dim=1), q  # (B, k)


def target_kv(cache: KVCache, target: Gemma4Model, end: int) -> dict[str, KV]:
    """What the drafter reads (§3): K/V of positions 0..end-1 of the target's last non-shared
    sliding and full layers, with their slots' positions. A ring's stale slots past a row's newest
    position are hidden by the mask."""
    c = target.config
    return {kind: cache.read(c.kv_source(kind), end) for kind in (SLIDING, FULL)}
