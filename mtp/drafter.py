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

Shape legend: B rows (1 in the textbook), E target hidden, U drafter width, V vocab, C centroids,
N centroids kept, S key positions."""

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from gemma4.cache import KVCache, KVPair
from gemma4.config import FULL, SLIDING, TextConfig
from gemma4.generate import check_finite
from gemma4.model import (
    DecoderLayer, Gemma4Model, LayerInputs, RMSNorm, TiedHead, layer_inputs, linear,
)
from gemma4.sampling import DRAFT_STREAM, SamplerConfig, draw, warp
from mtp.sample_drafting import draft_logits


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

    def scored_tokens(self, hn: Tensor, head: Tensor) -> tuple[Tensor, Tensor]:
        """hn (B, U), head (V, U) -> token ids (B, N*V/C) and their scores (B, N*V/C)."""
        top = self.centroids(hn).topk(self.top_k, dim=-1).indices  # (B, N)
        # (C, V/C): cluster -> its tokens
        table = self.token_ordering.view(self.centroids.out_features, -1)
        ids = table[top].flatten(1)  # (B, N*V/C)
        scores = (head[ids] @ hn[:, :, None]).squeeze(-1)  # (B, N*V/C, U) @ (B, U, 1)
        return ids, scores  # (B, N*V/C) each

    def greedy(self, hn: Tensor, head: Tensor) -> Tensor:
        """(B,) argmax without a length-V vector; exact ties go to the lowest id, as argmax over V
        would."""
        ids, scores = self.scored_tokens(hn, head)
        best = scores == scores.max(dim=-1, keepdim=True).values  # (B, N*V/C)
        # Above every id: a candidate that is not the best never wins the min. (Scores that are all
        # NaN have no best: the clamp keeps the id a token, and the loops refuse the NaN itself.)
        never = ids.new_full((), torch.iinfo(ids.dtype).max)
        return torch.where(best, ids, never).min(dim=-1).values.clamp_(max=head.shape[0] - 1)


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

    def step(self, token_embedding: Tensor, hidden: Tensor, inputs: dict[str, LayerInputs],
             kv: dict[str, KVPair]) -> tuple[Tensor, Tensor]:
        """One draft step (§4). token_embedding, hidden (B, T, E) -> normed state (B, T, U), next
        hidden (B, T, E). `kv`: layer type -> the target's keys and values it reads."""
        # (B, T, 2E) -> (B, T, U)
        u = self.pre_projection(torch.cat([token_embedding, hidden], dim=-1))
        for layer in self.model.layers:
            # Every drafter layer is KV-shared: it reads the target's K/V of its type.
            u, _ = layer(u, inputs[layer.kind], shared_kv=kv[layer.kind])
        hn = self.model.norm(u)  # (B, T, U)
        return hn, self.post_projection(hn)

    def greedy_token(self, hn: Tensor) -> Tensor:
        """(B, U) -> (B,) the proposed token, without a full-vocabulary tensor on the centroid head.
        """
        if self.config.use_ordered_embeddings:
            return self.masked_embedding.greedy(hn, self.model.embed_tokens.weight)
        return self.head(hn, self.model.embed_tokens.weight).argmax(dim=-1)

    @torch.inference_mode()
    def propose(self, target: Gemma4Model, *, token: int, hidden: Tensor, position: int,
                kv: dict[str, KVPair], k: int, sampler: SamplerConfig | None = None,
                ) -> tuple[list[int], list[Tensor]]:
        """k drafts after `token`, the newest committed one, at `position`. `hidden` (E,) is the
        target's post-norm hidden at position - 1; `kv` its K/V of positions 0..position-1
        (`target_kv`). Greedy: each draft is the drafter's argmax. With a sampler (sample
        drafting, §11), draft j is drawn from q_j, its warped logits, with DRAFT_STREAM noise
        keyed at position + j. -> the drafts, and q_1..q_k (V,) each (none when greedy)."""
        device = hidden.device
        # Every step of a round queries the same position, over keys 0..position-1 (§4).
        query = torch.tensor([[position]], device=device)  # (1, 1)
        keys = torch.arange(position, device=device)[None]  # (1, S)
        inputs = layer_inputs(self.config.text, query, {SLIDING: keys, FULL: keys}, hidden.dtype,
                              shift=1)
        h = hidden[None, None]  # (1, 1, E)
        drafts, q = [], []
        for j in range(1, k + 1):
            x = target.embed(torch.tensor([[token]], device=device))  # (1, 1, E)
            hn, h = self.step(x, h, inputs, kv)  # (1, 1, U), (1, 1, E)
            check_finite(hn, f"the drafter's states at draft step {j} of position {position}")
            if sampler is None:
                token = int(self.greedy_token(hn[:, 0]))
            else:
                q.append(warp(draft_logits(self, hn[:, 0], float("-inf"))[0], sampler))  # (V,)
                token = draw(q[-1], sampler.seed, DRAFT_STREAM, position + j)
            drafts.append(token)
        return drafts, q


def target_kv(cache: KVCache, target: Gemma4Model) -> dict[str, KVPair]:
    """What the drafter reads (§3): the committed K/V, positions 0..cache.length-1, of the target's
    last non-shared sliding and full layers."""
    c = target.config
    return {kind: cache.read(c.kv_source(kind)) for kind in (SLIDING, FULL)}
