"""Tiny random Gemma 4 checkpoints in the official file layout, written by `transformers` itself.

Tests call `write_target` / `write_assistant` to get a directory that looks like a Google release
(config.json, generation_config.json, model.safetensors or shards + index) but holds a model small
enough to run on one CPU core in milliseconds. `transformers` (TF) builds the modules and writes the
files, so tensor names, shapes and config keys are TF's own, and TF can load the same directory as the
parity oracle (see `tf_oracle.py`).

Notable facts:
- TF's init leaves every norm at 1, layer_scalar at 1, the router scales at 1 and the token ordering at 0.
  A model like that hides bugs (a norm applied as `1 + w` or not at all gives the same output). So after
  building, every saved tensor is redrawn from one seeded generator: norms, scalars and router scales
  near 1 with noise, projections ~ N(0, 1/fan_in) so activations stay O(1). The vision tower keeps TF's init.
- The tied embedding is both the input table and the output head, so the token's own embedding pulls
  greedy towards repeating the input token. Its size X0_RMS (rms of x0 = E[id] * sqrt(H)) sets how often
  that wins: 0.5 gives ~10% repeats, 1.5 almost only repeats; 0.8 gives ~20-30% repeats and ~40 distinct
  tokens in 64 greedy steps. Some repetition is wanted: the `echo` drafter gets its drafts accepted
  exactly there. The final norm weight (~1.5) then sets logits of std ~1.2 (max ~5): the softcap (30)
  still bends them measurably (by up to ~0.05), while fp32 rounding, which grows with the logit scale,
  stays a few 1e-5 (parity is bounded against float64 runs: tests/tolerance.py).
- Everything is drawn in float32 and then cast, so a bfloat16 checkpoint is the float32 one rounded.
- `audio=True` adds an audio side drawn from a stream of its own, with finite clip bounds that cut on the tower's
  first layer (`_redraw_audio`).
- `official_config=True` rewrites the config into the form Google's files use (`global_head_dim`,
  `num_global_key_value_heads`, no `per_layer_config`); TF resolves both forms to the same geometry.
- Shapes (all: H 64, V 512, Hq 4-8, head_dim 16 / global_head_dim 32, sliding_window 8, softcap 30, tied):
  `e2b`   8 layers s s F s F | s s F (last 3 KV-shared, sources 3 and 4), PLE P=8, double-wide MLP, no K=V.
  `moe`   6 layers s s F s s F, 8 experts top-2, K=V with full Hkv 1 != sliding Hkv 2, no PLE.
  `dense` 12 layers, full at 5 and 11 (TF pads its per_layer_config keys: "05", "11"), K=V, no PLE.
  `12b`   6 layers s s F s s F as `gemma4_unified`: no PLE, MoE, KV sharing or K=V (sources 4 and 5).
  Not in SHAPES: `12b_variant` (unified with K=V, 2 KV-shared layers, double-wide MLP), `mini` (2 layers).
"""

import json
from pathlib import Path

import torch
from PIL import Image
from safetensors import safe_open
from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil
from transformers.models.gemma4_unified.feature_extraction_gemma4_unified import Gemma4UnifiedAudioFeatureExtractor
from transformers import (
    AutoConfig,
    GenerationConfig,
    Gemma4AssistantConfig,
    Gemma4AssistantForCausalLM,
    Gemma4AudioConfig,
    Gemma4Config,
    Gemma4ForCausalLM,
    Gemma4ForConditionalGeneration,
    Gemma4TextConfig,
    Gemma4VisionConfig,
    Gemma4UnifiedAssistantConfig,
    Gemma4UnifiedAssistantForCausalLM,
    Gemma4UnifiedAudioConfig,
    Gemma4UnifiedConfig,
    Gemma4UnifiedForCausalLM,
    Gemma4UnifiedForConditionalGeneration,
    Gemma4UnifiedTextConfig,
    Gemma4UnifiedVisionConfig,
)

SHAPES = ("e2b", "moe", "dense", "12b")
UNIFIED = ("12b", "12b_variant")  # written as transformers' `gemma4_unified` model
STOP_IDS = [1, 106, 50]  # <eos>, <turn|>, <|tool_response>: what the IT generation_config.json lists
VOCAB = 512
HIDDEN = 64
DRAFTER_HIDDEN = 32
DRAFTER_WINDOW = 6  # smaller than the target's 8, so prompts of ~20 tokens exercise the drafter window
X0_RMS = 0.8  # rms of the scaled input embedding; see the module docstring

S, F = "sliding_attention", "full_attention"

# Fields every target shares; the per-shape dicts below override or extend them.
_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    num_attention_heads=4,
    head_dim=16,
    global_head_dim=32,
    sliding_window=8,
    max_position_embeddings=1024,
    final_logit_softcapping=30.0,
    tie_word_embeddings=True,
    rms_norm_eps=1e-6,
    eos_token_id=[1, 106],
    hidden_size_per_layer_input=0,
    vocab_size_per_layer_input=VOCAB,
)

_SHAPE_FIELDS: dict[str, dict] = {
    # E2B-like: sources are the last sliding (3) and last full (4) layer before the first shared one (5),
    # as in E2B (13, 14 | 15).
    "e2b": dict(
        num_hidden_layers=8,
        layer_types=[S, S, F, S, F, S, S, F],
        num_key_value_heads=1,
        intermediate_size=128,
        num_kv_shared_layers=3,
        use_double_wide_mlp=True,
        hidden_size_per_layer_input=8,
        attention_k_eq_v=False,
    ),
    # 26B-A4B-like: MoE beside the dense MLP on every layer; full layers have fewer kv heads (K=V).
    "moe": dict(
        num_hidden_layers=6,
        layer_types=[S, S, F, S, S, F],
        num_key_value_heads=2,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        intermediate_size=96,
        enable_moe_block=True,
        num_experts=8,
        top_k_experts=2,
        moe_intermediate_size=32,
    ),
    # 12B-like (`gemma4_unified`): no PLE, no MoE, no KV sharing, no K=V, single-wide MLP, as released, so
    # the KV sources are the last sliding (4) and last full (5) layer.
    "12b": dict(
        num_hidden_layers=6,
        layer_types=[S, S, F, S, S, F],
        num_key_value_heads=2,
        attention_k_eq_v=False,
        intermediate_size=96,
    ),
    # Not in SHAPES: the unified model with the fields the 12B release leaves at their defaults set, read and
    # applied (K=V with its own full kv heads, the last two layers KV-shared, a double-wide MLP on them).
    "12b_variant": dict(
        num_hidden_layers=6,
        layer_types=[S, S, F, S, S, F],
        num_key_value_heads=2,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        num_kv_shared_layers=2,
        use_double_wide_mlp=True,
        intermediate_size=96,
    ),
    # Not in SHAPES: two layers, for the statistical tests, which run the model thousands of times.
    "mini": dict(
        num_hidden_layers=2,
        layer_types=[S, F],
        num_key_value_heads=2,
        attention_k_eq_v=False,
        intermediate_size=64,
    ),
    # 31B-like: dense, K=V, 12 layers so a full layer index has two digits.
    "dense": dict(
        num_hidden_layers=12,
        layer_types=[S, S, S, S, S, F, S, S, S, S, S, F],
        num_attention_heads=8,
        num_key_value_heads=4,
        num_global_key_value_heads=2,
        attention_k_eq_v=True,
        intermediate_size=128,
    ),
}


def target_text_config(shape: str, overrides: dict | None = None) -> Gemma4TextConfig | Gemma4UnifiedTextConfig:
    if shape not in _SHAPE_FIELDS:
        raise ValueError(f"unknown shape {shape!r}; expected one of {tuple(_SHAPE_FIELDS)}")
    fields = _COMMON | _SHAPE_FIELDS[shape] | (overrides or {})
    if shape in UNIFIED:  # the unified text config has no Per-Layer Embedding fields at all
        del fields["hidden_size_per_layer_input"], fields["vocab_size_per_layer_input"]
        return Gemma4UnifiedTextConfig(**fields)
    return Gemma4TextConfig(**fields)


# Image checkpoints (`images=True`): towers big enough to run, the processor config beside them, and the media ids
# moved inside the tiny vocabulary (the release's 255999 / 258880... would not fit 512). Image-test prompts draw their
# text ids below MEDIA_IDS["boi_token_id"].
MEDIA_IDS = dict(boi_token_id=505, image_token_id=506, eoi_token_id=507, video_token_id=508, boa_token_id=509,
                 eoa_token_index=510, audio_token_id=511)
IMAGE_PATCH = {"encoder": (4, 2), "unified": (2, 2)}  # (patch_size, pooling_kernel_size) of the tiny towers
IMAGE_SOFT_TOKENS = 70  # the smallest budget the processor accepts: 70 soft tokens, longer than the window (8)


def picture(width: int, height: int, seed: int) -> Image.Image:
    """A test image of random pixels: `width` x `height`, RGB, the same for the same seed."""
    g = torch.Generator().manual_seed(seed)
    return Image.fromarray(torch.randint(0, 256, (height, width, 3), generator=g, dtype=torch.uint8).numpy())


def _image_vision_config(unified: bool) -> Gemma4VisionConfig | Gemma4UnifiedVisionConfig:
    if unified:
        return Gemma4UnifiedVisionConfig(patch_size=2, pooling_kernel_size=2, mm_embed_dim=24, mm_posemb_size=320,
                                         output_proj_dims=24)
    return Gemma4VisionConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        head_dim=8, position_embedding_size=320, pooling_kernel_size=2, patch_size=4,
    )


def _redraw_vision(name: str, t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A fresh value for one tower tensor: no norm left at 1, no table left at TF's init."""
    if t.dim() == 0:  # a clipped linear's bound (not written by these configs)
        return t
    if "norm" in name or "_ln" in name:
        return _uniform(t.shape, 0.5, 1.5, gen) if name.endswith("weight") else torch.randn(t.shape, generator=gen) * 0.1
    if name.endswith("bias"):
        return torch.randn(t.shape, generator=gen) * 0.1
    if "position_embedding_table" in name or "pos_embedding" in name:
        return torch.randn(t.shape, generator=gen)
    if t.dim() == 2:
        return torch.randn(t.shape, generator=gen) / t.shape[1] ** 0.5
    raise ValueError(f"no re-randomisation rule for {name} {tuple(t.shape)}")


@torch.no_grad()
def _rerandomise_vision(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed + 3000)  # not the text model's stream: its tensors stay as without images
    for name, t in sorted(model.state_dict().items()):
        if name.startswith(("model.vision_tower.", "model.embed_vision.")):
            t.copy_(_redraw_vision(name, t, gen))


def _tiny_unified_vision_config() -> Gemma4UnifiedVisionConfig:
    # The 12B's encoder-free embedder (`model.embed_vision.*`: layer norms, a patch projection, a position
    # table): tensors a text-only loader must skip.
    return Gemma4UnifiedVisionConfig(patch_size=2, pooling_kernel_size=2, mm_embed_dim=16, mm_posemb_size=8,
                                     output_proj_dims=16)


def _tiny_vision_config() -> Gemma4VisionConfig:
    # Only there so the file carries real `model.vision_tower.*` / `model.embed_vision.*` tensors that a
    # text-only loader must skip, as in the official multimodal files.
    return Gemma4VisionConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, head_dim=8, position_embedding_size=64, pooling_kernel_size=2, patch_size=4,
    )


# Audio checkpoints (`audio=True`): E2B-family files get a conformer tower of width 32 (2 layers, 4 heads, the
# subsampler's first conv 128 channels as transformers requires: the mel bins) projecting to AUDIO_OUTPUT, then
# `embed_audio` to the text width; the 12B's files get its 640-sample frame embedder. Beside them, the feature
# extractor's settings (transformers' defaults, as every release stores) in processor_config.json.
AUDIO_OUTPUT = 24  # output_proj_dims of the tiny tower: not the text width, so embed_audio's projection is not square
AUDIO_CLIPPED_LAYERS = 1  # clipped linears of the first layers get finite bounds that cut; later ones keep +-inf


def _tiny_audio_config(unified: bool) -> Gemma4AudioConfig | Gemma4UnifiedAudioConfig:
    if unified:
        return Gemma4UnifiedAudioConfig()  # audio_embed_dim 640: the frame is the release's, it sets no width here
    return Gemma4AudioConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             subsampling_conv_channels=[128, 8], output_proj_dims=AUDIO_OUTPUT)


def _redraw_audio(name: str, t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A fresh value for one audio tensor: norms and scales away from their identity, projections ~ N(0, 1/fan_in)
    (convolutions: fan_in = in channels x kernel) so activations stay O(1), and finite clip bounds (about +-1.5)
    on the first AUDIO_CLIPPED_LAYERS layers, where normalised activations pass them often."""
    if t.dim() == 0:  # a clipped linear's bound
        layer = int(name.split(".layers.")[1].split(".")[0])
        if layer >= AUDIO_CLIPPED_LAYERS:
            return t  # +-inf: loaded and applied, a no-op
        return _uniform(t.shape, 1.0, 2.0, gen) * (-1 if name.endswith("_min") else 1)
    if "norm" in name and name.endswith("weight"):
        return _uniform(t.shape, 0.5, 1.5, gen)
    if name.endswith("per_dim_scale"):  # softplus of it scales the queries: around ln 2, not exactly
        return torch.randn(t.shape, generator=gen) * 0.5
    if name.endswith("bias"):
        return torch.randn(t.shape, generator=gen) * 0.1
    if t.dim() >= 2:  # linear (out, in), conv (out, in / groups, *kernel)
        return torch.randn(t.shape, generator=gen) / t[0].numel() ** 0.5
    raise ValueError(f"no re-randomisation rule for {name} {tuple(t.shape)}")


@torch.no_grad()
def _rerandomise_audio(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed + 4000)  # a stream of its own: text and image tensors stay as without
    for name, t in sorted(model.state_dict().items()):
        if name.startswith(("model.audio_tower.", "model.embed_audio.")):
            t.copy_(_redraw_audio(name, t, gen))


def _write_feature_extractor(path: Path, unified: bool) -> None:
    """The feature extractor's settings under "feature_extractor" in processor_config.json, as transformers' processor
    saves them (the image processor, when written, keeps preprocessor_config.json)."""
    extractor = Gemma4UnifiedAudioFeatureExtractor() if unified else Gemma4AudioFeatureExtractor()
    file = path / "processor_config.json"
    config = json.loads(file.read_text()) if file.is_file() else {}
    config["feature_extractor"] = json.loads(extractor.to_json_string())
    file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


# ---------------------------------------------------------------------------------------------
# Re-randomisation
# ---------------------------------------------------------------------------------------------


def _uniform(shape: torch.Size, low: float, high: float, gen: torch.Generator) -> torch.Tensor:
    return low + (high - low) * torch.rand(shape, generator=gen)


def _redraw(name: str, t: torch.Tensor, final_norm: str, hidden: int, ple: int, gen: torch.Generator) -> torch.Tensor:
    """A fresh value for one saved tensor, chosen by its name (see module docstring)."""
    if name.endswith("token_ordering"):
        return torch.randperm(t.numel(), generator=gen)  # int64, a permutation of the vocab
    if name.endswith("layer_scalar"):
        return _uniform(t.shape, 0.8, 1.2, gen)
    if name.endswith("router.scale") or name.endswith("router.per_expert_scale"):
        return _uniform(t.shape, 0.5, 1.5, gen)
    if name == final_norm:  # logits = E . rms(h) * w: with |E| set by X0_RMS, w ~1.5 gives logit std ~1.2
        return _uniform(t.shape, 1.0, 2.0, gen)
    if "norm" in name:  # every other RMSNorm weight (layers, q/k norms, PLE norms)
        return _uniform(t.shape, 0.5, 1.5, gen)
    if name.endswith("embed_tokens.weight"):
        return torch.randn(t.shape, generator=gen) * (X0_RMS / hidden**0.5)  # x0 = E * sqrt(H) has rms X0_RMS
    if name.endswith("embed_tokens_per_layer.weight"):
        return torch.randn(t.shape, generator=gen) / ple**0.5  # times sqrt(P) in the model: rms 1
    if name.endswith("router.proj.weight"):
        # The router input is rms(r) * scale * H^-1/2 (elements ~H^-1/2): std 2 gives router logits of
        # std ~2, so different tokens pick different experts.
        return torch.randn(t.shape, generator=gen) * 2.0
    if name.endswith("experts.gate_up_proj"):  # [E, 2I, H]
        return torch.randn(t.shape, generator=gen) / t.shape[2] ** 0.5
    if name.endswith("experts.down_proj"):  # [E, H, I]
        return torch.randn(t.shape, generator=gen) / t.shape[2] ** 0.5
    if t.dim() == 2:  # nn.Linear weight [out, in]: N(0, 1/in) keeps outputs O(1)
        return torch.randn(t.shape, generator=gen) / t.shape[1] ** 0.5
    raise ValueError(f"no re-randomisation rule for {name} {tuple(t.shape)}")


@torch.no_grad()
def _rerandomise(model: torch.nn.Module, prefix: str, final_norm: str, hidden: int, ple: int, seed: int) -> None:
    """Redraw every saved tensor whose name starts with `prefix`."""
    gen = torch.Generator().manual_seed(seed)
    seen: set[int] = set()
    for name, t in sorted(model.state_dict().items()):  # sorted: draws do not depend on module order
        # lm_head is tied to (is the same tensor as) embed_tokens and is not saved: draw the table by its name.
        if not name.startswith(prefix) or name.startswith("lm_head") or t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        t.copy_(_redraw(name, t, final_norm, hidden, ple, gen))


# ---------------------------------------------------------------------------------------------
# Echo drafter
# ---------------------------------------------------------------------------------------------

def _read_target_embedding(path: Path) -> torch.Tensor:
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(file, "pt") as f:
            for name in f.keys():
                if name in ("model.language_model.embed_tokens.weight", "model.embed_tokens.weight"):
                    return f.get_tensor(name).float()
    raise FileNotFoundError(f"no embed_tokens.weight under {path}")


@torch.no_grad()
def _make_echo(model: Gemma4AssistantForCausalLM, target_embedding: torch.Tensor, seed: int) -> None:
    """Bias a random drafter towards proposing its input token again.

    Random targets often repeat a token for a few steps, so an echoing drafter gets rounds with nothing,
    part and all of its drafts accepted, which exercises the speculative loop's bookkeeping. Structure:
    the input side of pre_projection sends E[x] into a random D-dim subspace Q of the target embedding
    space, the output head is E @ Q (so the head's best match is x itself), and the layers and the hidden
    input are damped (not removed: they still move the logits).
    """
    gen = torch.Generator().manual_seed(seed)
    backbone, drafter = model.backbone_hidden_size, model.hidden_size
    q, _ = torch.linalg.qr(torch.randn(backbone, drafter, generator=gen))  # (B, D) orthonormal columns
    head = target_embedding @ q  # (V, B) @ (B, D) -> (V, D)
    model.model.embed_tokens.weight.copy_(head * (X0_RMS / drafter**0.5) / head.std())  # as in _redraw
    pre = model.pre_projection.weight  # (D, 2B): [embedding half | hidden half]
    # E[x]*sqrt(B) has rms X0_RMS; x4 puts it at ~3 in the drafter's residual stream, well above the
    # damped hidden input (x0.1) and layer outputs (post-norms x0.15, ~0.4 all together).
    pre[:, :backbone] = q.T * 4.0
    pre[:, backbone:] *= 0.1
    for layer in model.model.layers:
        layer.post_attention_layernorm.weight.mul_(0.15)
        layer.post_feedforward_layernorm.weight.mul_(0.15)
    if model.masked_embedding is not None:
        # Centroid c = sum of its cluster's head rows, so the cluster holding x tends to rank high.
        clusters = model.masked_embedding.token_ordering.view(model.masked_embedding.num_centroids, -1)  # (C, V/C)
        model.masked_embedding.centroids.weight.copy_(model.model.embed_tokens.weight[clusters].sum(1))  # (C, D)


# ---------------------------------------------------------------------------------------------
# Config rewriting
# ---------------------------------------------------------------------------------------------


def _officialise_text_config(text: dict) -> None:
    """Replace TF's `per_layer_config` with the `global_head_dim` / `num_global_key_value_heads` form."""
    per_layer = text.pop("per_layer_config")
    full = [per_layer[key] for key in sorted(per_layer, key=int)]
    assert all(entry == full[0] for entry in full), "every full layer must have the same override"
    text["global_head_dim"] = full[0]["head_dim"]
    # TF applies num_global_key_value_heads only on K=V models; write null otherwise, like E2B's file.
    text["num_global_key_value_heads"] = full[0].get("num_key_value_heads") if text["attention_k_eq_v"] else None


def _officialise_config(path: Path) -> None:
    config = json.loads((path / "config.json").read_text())
    _officialise_text_config(config["text_config"] if "text_config" in config else config)
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _save(model: torch.nn.Module, path: Path, dtype: torch.dtype, sharded: bool) -> None:
    model.to(dtype)  # floating tensors only: token_ordering stays int64
    if sharded:
        total = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        max_shard_size = max(total // 4, 1024)  # several shards + model.safetensors.index.json
    else:
        max_shard_size = 10**12  # one model.safetensors
    model.save_pretrained(path, max_shard_size=max_shard_size)


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------


def write_target(
    path: str | Path,
    shape: str,
    dtype: torch.dtype = torch.float32,
    sharded: bool = False,
    multimodal: bool = True,
    official_config: bool = False,
    seed: int = 0,
    images: bool = False,
    both_ways: bool | None = None,
    audio: bool = False,
    ple_width: int | None = None,
    fields: dict | None = None,
) -> Path:
    """Write a tiny target checkpoint to `path` and return it.

    images: a tower that runs on real images (MEDIA_IDS inside the vocabulary, IMAGE_PATCH, the processor's
    preprocessor_config.json beside it); the text tensors are those of the same shape without images.
    both_ways: `use_bidirectional_attention` "vision" (True) or null (False); None leaves TF's default (the
    unified text config's is "vision").
    audio: an audio side (`_tiny_audio_config`: E2B's conformer, or the 12B's frame embedder for the unified shapes)
    with finite clip bounds, MEDIA_IDS inside the vocabulary and the feature extractor's settings beside it; the
    text tensors (and with `images` the image tensors) are those without audio. Needs multimodal.
    ple_width: the Per-Layer Embedding width of a PLE shape in place of its own (an int4 file, whose projections
    are quantized in groups of 32 inputs, needs a multiple of 32: tests/int4_checkpoints.py).
    fields: text config fields in place of the shape's (tests/parallel/pairs.py: heads and widths that 2, 3 and 4
    ranks divide).

    multimodal: `Gemma4ForConditionalGeneration` (model_type gemma4, text under `text_config`, tensors
    `model.language_model.*`, plus a tiny vision tower); else
    `Gemma4ForCausalLM` (gemma4_text, `model.*`). The unified shapes use the `Gemma4Unified…` classes
    (gemma4_unified / gemma4_unified_text), with the 12B's encoder-free vision embedder.
    """
    path = Path(path)
    text_config = target_text_config(shape, fields)
    if ple_width is not None:
        text_config.hidden_size_per_layer_input = ple_width
    if both_ways is not None:
        text_config.use_bidirectional_attention = "vision" if both_ways else None
    unified = shape in UNIFIED
    media = dict(vision_config=_image_vision_config(unified), **MEDIA_IDS) if images else {}
    if audio and not multimodal:
        raise ValueError("audio=True needs multimodal=True: a bare text file has no audio side")
    audio_config = _tiny_audio_config(unified) if audio else None
    if audio:
        media.update(MEDIA_IDS)
    with torch.random.fork_rng():  # TF's init draws from the global RNG: keep the caller's stream intact
        torch.manual_seed(seed)
        if multimodal and unified:
            config = Gemma4UnifiedConfig(**{"text_config": text_config, "vision_config": _tiny_unified_vision_config(),
                                            "audio_config": audio_config, **media})
            model = Gemma4UnifiedForConditionalGeneration(config)
        elif multimodal:
            config = Gemma4Config(**{"text_config": text_config, "vision_config": _tiny_vision_config(),
                                     "audio_config": audio_config, **media})
            model = Gemma4ForConditionalGeneration(config)
        else:
            model = (Gemma4UnifiedForCausalLM if unified else Gemma4ForCausalLM)(text_config)
        prefix = "model.language_model." if multimodal else "model."
    ple = getattr(text_config, "hidden_size_per_layer_input", 0)
    _rerandomise(model, prefix, prefix + "norm.weight", HIDDEN, ple, seed)
    if images:
        _rerandomise_vision(model, seed)
    if audio:
        _rerandomise_audio(model, seed)
    # The IT releases sample by default; greedy must be asked for explicitly.
    model.generation_config = GenerationConfig(
        bos_token_id=2, pad_token_id=0, eos_token_id=STOP_IDS, do_sample=True, top_k=64, top_p=0.95, temperature=1.0
    )
    _save(model, path, dtype, sharded)
    if images:  # the processor config a release ships beside its weights
        patch, k = IMAGE_PATCH["unified" if unified else "encoder"]
        Gemma4ImageProcessorPil(patch_size=patch, pooling_kernel_size=k,
                                max_soft_tokens=IMAGE_SOFT_TOKENS).save_pretrained(path)
    if audio:
        _write_feature_extractor(path, unified)
    if official_config:
        _officialise_config(path)
    return path


def write_assistant(
    path: str | Path,
    target_path: str | Path,
    ordered_embeddings: bool,
    dtype: torch.dtype = torch.float32,
    official_config: bool = False,
    num_assistant_tokens: int = 4,
    echo: bool = False,
    seed: int = 0,
    heads: int = 4,
    intermediate: int = 64,
) -> Path:
    """Write a tiny MTP drafter matched to the target at `target_path` and return `path`.

    4 Q-only layers [s, s, s, F], hidden 32, sliding_window 6; each layer type copies (Hkv, d) of the
    target's source layer of that type. ordered_embeddings: centroid head with 16 centroids (32 tokens
    each), top-4, token_ordering a seeded permutation. num_assistant_tokens goes to generation_config.json
    (TF requires it). echo: bias the drafter to propose its input token again (see `_make_echo`), so
    speculative rounds accept 0, some or all drafts; a plain random drafter almost never gets a draft
    accepted. heads, intermediate: its query heads and MLP width (tests/parallel/pairs.py: 12 and 96, which
    2, 3 and 4 ranks divide).
    """
    path = Path(path)
    target = AutoConfig.from_pretrained(target_path).get_text_config()
    unified = target.model_type == "gemma4_unified_text"
    first_shared = target.num_hidden_layers - target.num_kv_shared_layers
    source = {kind: max(j for j in range(first_shared) if target.layer_types[j] == kind) for kind in (S, F)}
    sliding, full = target.per_layer_config[source[S]], target.per_layer_config[source[F]]

    per_layer_fields = {} if unified else dict(hidden_size_per_layer_input=0, vocab_size_per_layer_input=0)
    text_config = (Gemma4UnifiedTextConfig if unified else Gemma4TextConfig)(
        vocab_size=target.vocab_size,
        hidden_size=DRAFTER_HIDDEN,
        intermediate_size=intermediate,
        num_hidden_layers=4,
        layer_types=[S, S, S, F],
        num_attention_heads=heads,
        num_key_value_heads=sliding.num_key_value_heads,
        head_dim=sliding.head_dim,
        global_head_dim=full.head_dim,
        attention_k_eq_v=target.attention_k_eq_v,
        num_global_key_value_heads=full.num_key_value_heads if target.attention_k_eq_v else None,
        num_kv_shared_layers=4,  # every drafter layer reads the target's KV
        sliding_window=DRAFTER_WINDOW,
        max_position_embeddings=target.max_position_embeddings,
        final_logit_softcapping=None,
        tie_word_embeddings=True,
        **per_layer_fields,
    )
    config = (Gemma4UnifiedAssistantConfig if unified else Gemma4AssistantConfig)(
        text_config=text_config,
        backbone_hidden_size=target.hidden_size,
        use_ordered_embeddings=ordered_embeddings,
        num_centroids=16,
        centroid_intermediate_top_k=4,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = (Gemma4UnifiedAssistantForCausalLM if unified else Gemma4AssistantForCausalLM)(config)
    _rerandomise(model, "", "model.norm.weight", DRAFTER_HIDDEN, 0, seed + 1000)  # not the target's stream
    if echo:
        _make_echo(model, _read_target_embedding(Path(target_path)), seed + 2000)
    # TF's MTP generator reads num_assistant_tokens from here and raises if it is missing.
    model.generation_config = GenerationConfig(
        bos_token_id=2, pad_token_id=0, eos_token_id=STOP_IDS,
        num_assistant_tokens=num_assistant_tokens, num_assistant_tokens_schedule="constant",
    )
    _save(model, path, dtype, sharded=False)
    if official_config:
        _officialise_config(path)
    return path
