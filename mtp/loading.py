"""Loading an MTP drafter ("assistant") checkpoint: its name table, the pair check, the loader.

Design: mtp/README.md §2. The drafter file holds an ordinary Gemma 4 stack under `model.` whose layers are all
KV-shared (Q-only, no PLE, no MoE), so the target's own name table describes it, plus the two projections and
(E2B/E4B) the centroid head.
"""

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from gemma4.config import FULL, SLIDING, ConfigError, TextConfig
from gemma4.config_file import read_json, text_config_from_dict
from gemma4.weights import (
    CheckpointError, Progress, file_reader, read_state_dict, resolve_model_dir, target_ignored,
    target_weight_table,
)
from gemma4.model import Gemma4Model
from mtp.drafter import Drafter, DrafterConfig

if TYPE_CHECKING:
    from gemma4.parallel.plan import Shard


# An assistant's model_type -> the text model_type its text_config holds by default, and the target hidden size
# transformers 5.22.2 assumes for `backbone_hidden_size` (E2B's 1536; the 12B's 3840).
ASSISTANT_TYPES = {"gemma4_assistant": ("gemma4_text", 1536), "gemma4_unified_assistant": ("gemma4_unified_text", 3840)}


def drafter_config_from_dict(raw: dict) -> DrafterConfig:
    if raw.get("model_type") not in ASSISTANT_TYPES:
        expected = " or ".join(repr(t) for t in ASSISTANT_TYPES)
        raise ConfigError(f"model_type={raw.get('model_type')!r} is not a Gemma 4 assistant ({expected})")
    text_type, backbone = ASSISTANT_TYPES[raw["model_type"]]
    fields = {"model_type": text_type, **(raw.get("text_config") or {})}
    if fields["model_type"] not in ("gemma4_text", "gemma4_unified_text"):
        raise ConfigError(f"an assistant's text_config has model_type={fields['model_type']!r}, expected "
                          f"'gemma4_text' or 'gemma4_unified_text'")
    if not fields.get("num_kv_shared_layers"):  # transformers fills it in: every drafter layer is Q-only
        fields["num_kv_shared_layers"] = fields.get("num_hidden_layers")
    if fields["num_kv_shared_layers"] != fields.get("num_hidden_layers"):
        raise ConfigError("text_config.num_kv_shared_layers must equal num_hidden_layers: assistant layers own no K/V")
    if fields["model_type"] == "gemma4_text":
        fields["hidden_size_per_layer_input"] = fields.get("hidden_size_per_layer_input") or 0
    text = text_config_from_dict(fields)
    if text.ple_dim or text.enable_moe or text.use_double_wide_mlp:
        raise ConfigError("an assistant has no Per-Layer Embeddings, MoE or double-wide MLP")
    if set(text.layer_types) != {SLIDING, FULL}:
        raise ConfigError("an assistant needs sliding and full layers to read the target's two KV sources")
    cfg = DrafterConfig(
        text=text,
        backbone_hidden_size=int(raw.get("backbone_hidden_size", backbone)),
        use_ordered_embeddings=bool(raw.get("use_ordered_embeddings", False)),
        num_centroids=int(raw.get("num_centroids", 2048)),
        centroid_top_k=int(raw.get("centroid_intermediate_top_k", 32)),
    )
    if cfg.use_ordered_embeddings and (text.vocab_size % cfg.num_centroids or cfg.centroid_top_k > cfg.num_centroids):
        raise ConfigError(f"num_centroids={cfg.num_centroids} must divide vocab_size={text.vocab_size}")
    return cfg


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
    if drafter.text.sliding_window > target.sliding_window:  # the target's rings keep its own window (README §15)
        fail(f"its sliding window ({drafter.text.sliding_window}) is wider than the target's ({target.sliding_window})")
    for i, kind in enumerate(drafter.text.layer_types):
        src = target.kv_source(kind)
        mine, theirs = (drafter.text.kv_heads[i], drafter.text.head_dims[i]), (target.kv_heads[src], target.head_dims[src])
        if mine != theirs:
            fail(f"its layer {i} expects (kv heads, head dim) {mine}, target layer {src} has {theirs}")


def splits(text: TextConfig, world: int) -> bool:
    """Whether `world` ranks can split a drafter's layers (gemma4/parallel/plan.py `check_world`)."""
    from gemma4.parallel.plan import check_world

    try:
        check_world(text, world, "assistant")
    except ConfigError:
        return False
    return True


def check_whole_kv(target: TextConfig, drafter: DrafterConfig, world: int) -> None:
    """A drafter replicated on every rank reads the target's K/V of its source layers whole: refused in one line
    where a rank holds only its part of them (`target`: the rank's local config)."""
    for i, kind in enumerate(drafter.text.layer_types):
        held, needed = target.kv_heads[target.kv_source(kind)], drafter.text.kv_heads[i]
        if held != needed:
            raise ConfigError(f"{world} ranks cannot split the assistant ({drafter.text.num_heads} query heads), and "
                              f"it cannot run whole on each rank: the target's K/V it reads is split ({held} of "
                              f"{needed} kv heads a rank); run with a rank count that divides "
                              f"{drafter.text.num_heads}")


def load_drafter(
    path: str | Path, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", fast: bool = False,
    target: Gemma4Model | None = None, progress: Progress | None = None, shard: "Shard | None" = None,
) -> Drafter:
    """The assistant of a local directory or Hub id, in eval mode, without gradients; `fast`: the speed layer, as
    `load_target`'s (a centroid head gathers rows: it has no product). Given its `target`, the pair is checked
    first (`check_pair`: sizes, vocabulary, K/V shapes, and a sliding window no wider than the target's). `shard`:
    one rank of a tensor-parallel run, as `load_target`'s (its query heads split as the target's kv heads are).
    A drafter whose heads the rank count does not divide is replicated whole on every rank, which needs the
    target's K/V whole on each rank too (one kv head, as E2B and E4B have): a drafter is small."""
    model_dir = resolve_model_dir(path)
    if not (model_dir / "config.json").is_file():
        raise CheckpointError(f"{model_dir} has no config.json")
    raw = read_json(model_dir / "config.json")
    if raw.get("quantization_config") is not None:  # a scheme belongs to its own model: never the target's
        raise ConfigError(f"{path} is a quantized assistant; assistants load in floating point only: use the bf16 "
                          f"assistant (for a QAT target, its -qat-q4_0-unquantized-assistant)")
    cfg = drafter_config_from_dict(raw)
    table, cuts = drafter_weight_table(cfg), None
    if shard is not None and splits(cfg.text, shard.world):  # split as the target is: its heads read local K/V
        from gemma4.parallel.group import rank_part

        cuts, text = rank_part(cfg.text, table, shard, model_dir, "assistant", layer_prefix="model.layers.")
        cfg = replace(cfg, text=text)
    elif shard is not None:  # whole on every rank: the same files, and the target's K/V it reads whole here
        from gemma4.parallel.group import check_same, fingerprint

        check_same(fingerprint(model_dir), "assistant checkpoint")
        if target is not None:
            check_whole_kv(target.config, cfg, shard.world)
    if target is not None:  # a rank's target is checked against its own part of the drafter
        check_pair(target.config, cfg, "the target given", str(path))
    state = read_state_dict(model_dir, table, "", drafter_ignored(cfg), lambda name: True, dtype, device,
                            progress=progress, cuts=cuts)
    with torch.device("meta"):
        drafter = Drafter(cfg)
    drafter.load_state_dict(state, strict=True, assign=True)
    del state  # see load_target
    drafter.eval().requires_grad_(False)
    if fast:
        from gemma4.fast import make_fast  # here, not at the top: the textbook's imports hold no speed layer

        head = None if cfg.use_ordered_embeddings else ("head", "model.embed_tokens.weight")
        make_fast(drafter, file_reader(model_dir, "", cuts), head, progress=progress)
    if cuts is not None:
        from gemma4.parallel.reduce import parallelize

        parallelize(drafter)
    return drafter
