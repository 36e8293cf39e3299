"""What a multimodal `config.json` says about images: the tower's geometry and the prompt's image ids.

Facts a reader must know (gemma4/README.md §19):
- E2B, E4B, 26B-A4B and 31B (`model_type: gemma4`) carry a ViT encoder (`vision_config`, model_type
  `gemma4_vision`): 16 px patches, 2-D RoPE, k x k average pooling, then `embed_vision` into the text width.
- The 12B (`gemma4_unified`) has no encoder: k x k merged patches go through layer norms, one projection
  and a factorized position table (`vision_config`, model_type `gemma4_unified_vision`).
- The prompt holds, per image, boi, one image soft token per output vector, eoi. Only the soft tokens are
  replaced by the image's vectors; boi and eoi are ordinary tokens.
"""

from dataclasses import dataclass
from typing import Any

from gemma4.config import ConfigError


@dataclass(frozen=True)
class VisionConfig:
    unified: bool  # the 12B's encoder-free embedder (True) or the ViT encoder (False)
    text_hidden_size: int  # E: the width the image vectors are projected into
    patch_size: int  # 16 px in every release (the processor's `patch_size`)
    pooling_kernel_size: int  # k: the encoder pools k x k patches into one vector; the 12B merges them first
    rms_norm_eps: float
    # The ViT encoder (unified=False); zero on the 12B.
    hidden_size: int = 0
    intermediate_size: int = 0
    num_layers: int = 0
    num_heads: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    rope_theta: float = 100.0  # axial 2-D RoPE: half the head for x, half for y
    position_embedding_size: int = 0  # rows of the learned (x, y) position tables
    use_clipped_linears: bool = False  # projections clamp their input and output to stored bounds
    standardize: bool = False  # pooled vectors are shifted and scaled by stored std_bias / std_scale
    # The 12B's embedder (unified=True); zero on the others.
    mm_embed_dim: int = 0
    mm_posemb_size: int = 0  # rows of the factorized (x, y) position table
    output_proj_dims: int = 0  # width entering embed_vision (the 12B: mm_embed_dim)

    @property
    def out_dim(self) -> int:
        """The width of the vectors `embed_vision` normalizes and projects to E."""
        return self.output_proj_dims if self.unified else self.hidden_size


@dataclass(frozen=True)
class ImageTokens:
    """The ids an image occupies in a prompt (config.json's top level)."""
    boi: int  # <|image>: opens an image
    soft: int  # <|image|>: one per image vector, replaced by it
    eoi: int  # <image|>: closes it
    both_ways: bool  # text_config.use_bidirectional_attention == "vision": one image's tokens see each other


UNIFIED_TYPES = {"gemma4": False, "gemma4_unified": True}


def vision_config(raw: dict[str, Any]) -> VisionConfig | None:
    """The `VisionConfig` of a multimodal config.json, or None when the file has no images (a bare text file,
    or `vision_config: null`)."""
    unified = UNIFIED_TYPES.get(raw.get("model_type"))
    v, text = raw.get("vision_config"), raw.get("text_config") or {}
    if unified is None or not isinstance(v, dict):
        return None
    common = dict(unified=unified, text_hidden_size=int(text["hidden_size"]), patch_size=int(v.get("patch_size", 16)),
                  pooling_kernel_size=int(v.get("pooling_kernel_size", 3)), rms_norm_eps=float(v.get("rms_norm_eps", 1e-6)))
    if unified:
        embed = int(v.get("mm_embed_dim", 3840))
        return VisionConfig(**common, mm_embed_dim=embed, mm_posemb_size=int(v.get("mm_posemb_size", 1120)),
                            output_proj_dims=int(v.get("output_proj_dims", embed)))
    if v.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise ConfigError(f"vision_config.hidden_activation={v['hidden_activation']!r}: only 'gelu_pytorch_tanh' "
                          f"is implemented")
    rope = v.get("rope_parameters") or {"rope_type": "axial", "rope_theta": 100.0}
    if rope.get("rope_type", "axial") != "axial":
        raise ConfigError(f"vision_config.rope_parameters.rope_type={rope['rope_type']!r}: only 'axial' is implemented")
    heads = int(v.get("num_attention_heads", 12))
    hidden = int(v.get("hidden_size", 768))
    return VisionConfig(
        **common, hidden_size=hidden, intermediate_size=int(v.get("intermediate_size", 3072)),
        num_layers=int(v.get("num_hidden_layers", 16)), num_heads=heads,
        num_kv_heads=int(v.get("num_key_value_heads", heads)), head_dim=int(v.get("head_dim") or hidden // heads),
        rope_theta=float(rope.get("rope_theta", 100.0)), position_embedding_size=int(v.get("position_embedding_size", 10_240)),
        use_clipped_linears=bool(v.get("use_clipped_linears", False)), standardize=bool(v.get("standardize", False)),
    )


def image_tokens(raw: dict[str, Any]) -> ImageTokens:
    """The image ids of a multimodal config.json (transformers 5.22.2's defaults where absent)."""
    text = raw.get("text_config") or {}
    # Absent, transformers' default: "vision" for the 12B's text config, None for the others'.
    both_ways = text.get("use_bidirectional_attention", "vision" if UNIFIED_TYPES.get(raw.get("model_type")) else None)
    return ImageTokens(boi=int(raw.get("boi_token_id", 255_999)), soft=int(raw.get("image_token_id", 258_880)),
                       eoi=int(raw.get("eoi_token_id", 258_882)), both_ways=both_ways == "vision")
