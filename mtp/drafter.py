"""The Gemma 4 MTP drafter ("assistant"): its config, model, centroid head and loader.

Design: mtp/README.md (cited as §n). Facts a reader must know:
- The drafter has no K/V of its own: each of its 4 layers (3 sliding, 1 full) attends to the K/V the
  target already computed in its last non-shared layer of the same type (§3). It writes nothing.
- Its input is concat(the *target's* scaled embedding of a token, a target-sized hidden state),
  projected down to the drafter width; its output is logits and the next hidden, projected back up.
- Every draft step of a round uses the same query position t and the same KV (positions 0..t-1).
  That constant position is how the drafter was trained: do not "fix" it (§4).
- The sliding layers see the newest W_d + 1 positions, one more than a target query would (§5).
- `model.embed_tokens` is the drafter's output head, never an input embedding. E2B/E4B drafters use a
  centroid head over it (§6): score 2048 clusters, keep the top 32, score only their 4096 tokens.

Shape legend: B batch, E target hidden, D drafter hidden, V vocab, C centroids, k top centroids,
S key positions.
"""

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from gemma4.config import FULL, SLIDING, ConfigError, TextConfig, read_json, text_config_from_dict
from gemma4.model import (
    DecoderLayer, Gemma4Model, LayerInputs, RMSNorm, additive_mask, attention_mask, rope_cos_sin, rope_frequencies,
)
from gemma4.packing import Choice, Linear, Product, linear
from gemma4.sampling import DRAFT, SamplerConfig, keyed_sample, warp
from gemma4.weights import (
    CheckpointError, prepare_weights, read_state_dict, resolve_model_dir, target_ignored, target_weight_table,
)


@dataclass(frozen=True)
class DrafterConfig:
    text: TextConfig  # the drafter's own layers; all of them KV-shared
    backbone_hidden_size: int  # the target's hidden size E
    use_ordered_embeddings: bool  # centroid head (E2B/E4B) or dense head (26B/31B)
    num_centroids: int
    centroid_top_k: int


def drafter_config_from_dict(raw: dict) -> DrafterConfig:
    if raw.get("model_type") != "gemma4_assistant":
        raise ConfigError(f"model_type={raw.get('model_type')!r} is not a Gemma 4 assistant ('gemma4_assistant')")
    fields = dict(raw.get("text_config") or {})
    if not fields.get("num_kv_shared_layers"):  # transformers fills it in: every drafter layer is Q-only
        fields["num_kv_shared_layers"] = fields.get("num_hidden_layers")
    if fields["num_kv_shared_layers"] != fields.get("num_hidden_layers"):
        raise ConfigError("text_config.num_kv_shared_layers must equal num_hidden_layers: assistant layers own no K/V")
    fields["hidden_size_per_layer_input"] = fields.get("hidden_size_per_layer_input") or 0
    text = text_config_from_dict(fields)
    if text.ple_dim or text.enable_moe or text.use_double_wide_mlp:
        raise ConfigError("an assistant has no Per-Layer Embeddings, MoE or double-wide MLP")
    if set(text.layer_types) != {SLIDING, FULL}:
        raise ConfigError("an assistant needs sliding and full layers to read the target's two KV sources")
    cfg = DrafterConfig(
        text=text,
        backbone_hidden_size=int(raw.get("backbone_hidden_size", 1536)),
        use_ordered_embeddings=bool(raw.get("use_ordered_embeddings", False)),
        num_centroids=int(raw.get("num_centroids", 2048)),
        centroid_top_k=int(raw.get("centroid_intermediate_top_k", 32)),
    )
    if cfg.use_ordered_embeddings and (text.vocab_size % cfg.num_centroids or cfg.centroid_top_k > cfg.num_centroids):
        raise ConfigError(f"num_centroids={cfg.num_centroids} must divide vocab_size={text.vocab_size}")
    return cfg


class CentroidHead(nn.Module):
    """§6: score centroids, keep the top k, score only the tokens of those clusters."""

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.top_k = cfg.centroid_top_k
        self.centroids = Linear(cfg.text.hidden_size, cfg.num_centroids)
        self.register_buffer("token_ordering", torch.empty(cfg.text.vocab_size, dtype=torch.long))

    def candidates(self, hn: torch.Tensor, head: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """hn (B, D), head (V, D) -> token ids (B, k*V/C) and their scores (B, k*V/C)."""
        top = self.centroids(hn).topk(self.top_k, dim=-1).indices  # (B, k)
        table = self.token_ordering.view(self.centroids.out_features, -1)  # (C, V/C): cluster -> its tokens
        ids = table[top].flatten(1)  # (B, k*V/C)
        scores = (head[ids] @ hn[:, :, None]).squeeze(-1)  # (B, k*V/C, D) @ (B, D, 1) -> (B, k*V/C)
        return ids, scores

    def greedy(self, hn: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
        """(B,) argmax without a length-V vector; exact ties go to the lowest id, as argmax over V would."""
        ids, scores = self.candidates(hn, head)
        best = scores == scores.max(dim=-1, keepdim=True).values  # (B, k*V/C)
        return torch.where(best, ids, ids.new_full((), torch.iinfo(ids.dtype).max)).min(dim=-1).values

    def logits(self, hn: torch.Tensor, head: torch.Tensor, filler: float | None = None) -> torch.Tensor:
        """(B, V): the candidates' scores, every other token at `filler`: by default min(score) - 1, as
        transformers (a small non-zero probability); sampling passes -inf, so they get exactly 0 (§11)."""
        ids, scores = self.candidates(hn, head)
        fill = float(scores.min()) - 1.0 if filler is None else filler
        out = torch.full((hn.shape[0], head.shape[0]), fill, dtype=hn.dtype, device=hn.device)
        return out.scatter_(1, ids, scores)


class DrafterBody(nn.Module):
    """Named `model` in the checkpoint: the layers, the final norm and the output head."""

    def __init__(self, text: TextConfig) -> None:
        super().__init__()
        v, d = text.vocab_size, text.hidden_size  # the output head only; `_weight`: no init, see Gemma4Model
        self.embed_tokens = nn.Embedding(v, d, _weight=torch.empty(v, d))
        self.layers = nn.ModuleList(DecoderLayer(text, i) for i in range(text.num_layers))
        self.norm = RMSNorm(text.hidden_size, text.rms_norm_eps)


class Drafter(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.config = cfg
        e, d = cfg.backbone_hidden_size, cfg.text.hidden_size
        self.pre_projection = Linear(2 * e, d)
        self.post_projection = Linear(d, e)
        self.model = DrafterBody(cfg.text)
        if cfg.use_ordered_embeddings:
            self.masked_embedding = CentroidHead(cfg)
        self.head_product: Product | None = None  # the dense head's product (weights.prepare_weights)
        self.packing: list[Choice] = []  # the loader's packing decisions, one per (shape, dtype)

    def layer_inputs(self, positions: torch.Tensor, num_keys: int, dtype: torch.dtype) -> dict[str, LayerInputs]:
        """RoPE at the query positions (T,) and masks over the target's keys 0..num_keys-1.

        A query at position t sees keys 0..t-1 only. The mask helper is asked for a query at t-1
        (the newest key it may see) so that the sliding layers keep exactly the newest W_d + 1
        keys (§5): t-1-W_d .. t-1. At inference T = 1 and num_keys = t; a training step may put
        many positions side by side (each needs t >= 1: position 0 has no keys to attend to).
        """
        c, device = self.config.text, positions.device
        out = {}
        for kind in (SLIDING, FULL):
            window = c.sliding_window + 1 if kind == SLIDING else None
            key_start = max(0, int(positions.min()) - window) if window else 0  # older keys are masked anyway
            mask = attention_mask(positions - 1, torch.arange(key_start, num_keys, device=device), window)  # (T, S)
            mask = additive_mask(mask, dtype)
            head_dim = c.head_dims[c.layer_types.index(kind)]
            cos, sin = rope_cos_sin(positions, rope_frequencies(c.rope[kind], head_dim, device), dtype)
            out[kind] = LayerInputs(cos, sin, mask, key_start)
        return out

    def step(
        self, token_embedding: torch.Tensor, hidden: torch.Tensor, inputs: dict[str, LayerInputs],
        shared_kv: dict[str, tuple[torch.Tensor, torch.Tensor]],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft step (§4). token_embedding, hidden (B, T, E) -> normed state (B, T, D), next hidden (B, T, E)."""
        u = self.pre_projection(torch.cat([token_embedding, hidden], dim=-1))  # (B, T, 2E) -> (B, T, D)
        for i, layer in enumerate(self.model.layers):
            kind = self.config.text.layer_types[i]
            u, _ = layer(u, inputs[kind], None, None, 0, shared_kv[kind])
        hn = self.model.norm(u)  # (B, T, D)
        return hn, self.post_projection(hn)

    def logits(self, hn: torch.Tensor, filler: float | None = None) -> torch.Tensor:
        """(B, D) -> (B, V). No softcap on the drafter. `filler`: see CentroidHead.logits."""
        head = self.model.embed_tokens.weight  # (V, D)
        if hasattr(self, "masked_embedding"):
            return self.masked_embedding.logits(hn, head, filler)
        return linear(hn, head, self.head_product)

    def greedy_token(self, hn: torch.Tensor) -> torch.Tensor:
        """(B, D) -> (B,) the proposed token, without a full-vocabulary tensor on the centroid head."""
        if hasattr(self, "masked_embedding"):
            return self.masked_embedding.greedy(hn, self.model.embed_tokens.weight)
        return linear(hn, self.model.embed_tokens.weight, self.head_product).argmax(dim=-1)

    def draft(
        self, target: Gemma4Model, token: int, hidden: torch.Tensor, t: int,
        shared_kv: dict[str, tuple[torch.Tensor, torch.Tensor]], k: int,
    ) -> list[int]:
        """k greedy drafts after `token` at position t, from the target's post-norm hidden (E,) at t-1
        and the target's K/V of positions 0..t-1 (shared_kv: type -> (1, K, t, D))."""
        return self.propose(target, token, hidden, t, shared_kv, k)[0]

    @torch.inference_mode()
    def propose(
        self, target: Gemma4Model, token: int, hidden: torch.Tensor, t: int,
        shared_kv: dict[str, tuple[torch.Tensor, torch.Tensor]], k: int, sampler: SamplerConfig | None = None,
    ) -> tuple[list[int], torch.Tensor | None]:
        """k drafts as `draft`, greedy without a sampler. With one (`sample` drafting, §11), draft j is
        drawn from the drafter's warped distribution q_j with the DRAFT stream keyed at its position
        t + j, and q (k, V) is returned too for the rejection test."""
        inputs = self.layer_inputs(torch.tensor([t], device=hidden.device), t, hidden.dtype)
        h = hidden[None, None]  # (1, 1, E)
        drafts: list[int] = []
        probs: list[torch.Tensor] = []
        for j in range(1, k + 1):
            ids = torch.tensor([[token]], device=hidden.device)  # (1, 1)
            hn, h = self.step(target.embed(ids), h, inputs, shared_kv)  # (1, 1, D), (1, 1, E)
            if sampler is None:
                token = int(self.greedy_token(hn[:, 0]))
            else:
                q = warp(self.logits(hn[:, 0], filler=float("-inf")), sampler)  # (1, V), filler at 0
                token = keyed_sample(q, sampler.seed, DRAFT, [t + j])[0]
                probs.append(q[0])
            drafts.append(token)
        return drafts, torch.stack(probs) if probs else None  # q: (k, V)


def drafter_weight_table(cfg: DrafterConfig) -> dict[str, tuple[int, ...]]:
    """Checkpoint name -> shape (§2). The drafter file has no prefix beyond these names."""
    c, e = cfg.text, cfg.backbone_hidden_size
    d = c.hidden_size
    # Under `model.` sits an ordinary Gemma 4 stack whose layers are all KV-shared (Q-only, no PLE,
    # no MoE): the target's own name table describes it exactly.
    table = {"model." + key: shape for key, shape in target_weight_table(c).items()}
    table["pre_projection.weight"] = (d, 2 * e)
    table["post_projection.weight"] = (e, d)
    if cfg.use_ordered_embeddings:
        table["masked_embedding.centroids.weight"] = (cfg.num_centroids, d)
        table["masked_embedding.token_ordering"] = (c.vocab_size,)
    return table


def drafter_ignored(cfg: DrafterConfig) -> set[str]:
    """Tensors a file may carry that the drafter never uses: K/V weights and an untied head copy."""
    return {"model." + key for key in target_ignored(cfg.text)} | {"lm_head.weight"}


def check_pair(target: TextConfig, drafter: DrafterConfig, target_name: str, drafter_name: str) -> None:
    """The drafter must have been built for this target (§2 load-time checks)."""
    def fail(why: str) -> None:
        raise ConfigError(f"assistant {drafter_name} does not belong to target {target_name}: {why}")

    if drafter.backbone_hidden_size != target.hidden_size:
        fail(f"its backbone_hidden_size is {drafter.backbone_hidden_size}, the target's hidden size is {target.hidden_size}")
    if drafter.text.vocab_size != target.vocab_size:
        fail(f"its vocabulary has {drafter.text.vocab_size} tokens, the target's {target.vocab_size}")
    if drafter.text.first_shared_layer != 0:
        fail("not every assistant layer is KV-shared")
    for i, kind in enumerate(drafter.text.layer_types):
        src = target.kv_source(kind)
        mine, theirs = (drafter.text.kv_heads[i], drafter.text.head_dims[i]), (target.kv_heads[src], target.head_dims[src])
        if mine != theirs:
            fail(f"its layer {i} expects (kv heads, head dim) {mine}, target layer {src} has {theirs}")


def load_drafter(
    path: str | Path, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", pack: bool = True,
) -> Drafter:
    """The assistant of a local directory or Hub id, in eval mode, without gradients, its products prepared as
    the target's (gemma4/weights.py `prepare_weights`; a centroid head gathers rows: it has no product)."""
    model_dir = resolve_model_dir(path)
    if not (model_dir / "config.json").is_file():
        raise CheckpointError(f"{model_dir} has no config.json")
    cfg = drafter_config_from_dict(read_json(model_dir / "config.json"))
    table = drafter_weight_table(cfg)
    state = read_state_dict(model_dir, table, "", drafter_ignored(cfg), lambda name: True, dtype, device)
    with torch.device("meta"):
        drafter = Drafter(cfg)
    drafter.load_state_dict(state, strict=True, assign=True)
    del state  # see load_target
    drafter.eval().requires_grad_(False)
    head = None if cfg.use_ordered_embeddings else "model.embed_tokens.weight"
    drafter.head_product, drafter.packing = prepare_weights(drafter, model_dir, "", head, None if pack else False)
    return drafter
