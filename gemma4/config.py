"""Gemma 4 text configuration: a frozen dataclass with the geometry of every layer (read from
`config.json` by gemma4/config_file.py).

Facts a reader must know (gemma4/README.md §1-§3):
- Sliding and full layers have different head sizes and, on K=V models, different kv-head counts.
- The last `num_kv_shared_layers` layers own no K/V: they read the last non-shared layer of their
  type. Those two "source" layers are also exactly what the MTP drafter reads."""

from dataclasses import dataclass

SLIDING = "sliding_attention"
FULL = "full_attention"


class ConfigError(ValueError):
    """A config.json that this implementation cannot or must not run."""


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    partial_rotary_factor: float  # 1.0 for "default"; 0.25 ("proportional") on full layers
    factor: float  # divides every proportional frequency; 1.0 in all releases


@dataclass(frozen=True)
class TextConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    layer_types: tuple[str, ...]
    head_dims: tuple[int, ...]  # per layer: 256 sliding / 512 full in releases
    kv_heads: tuple[int, ...]  # per layer
    sliding_window: int
    rope: dict[str, RopeConfig]  # keyed by layer type
    intermediate_size: int
    use_double_wide_mlp: bool
    num_kv_shared_layers: int
    attention_k_eq_v: bool
    ple_dim: int  # hidden_size_per_layer_input; 0 disables Per-Layer Embeddings
    ple_vocab_size: int
    enable_moe: bool
    num_experts: int
    top_k_experts: int
    moe_intermediate_size: int
    rms_norm_eps: float
    final_logit_softcapping: float | None
    max_position_embeddings: int
    # Ids that stand for an image, video or audio soft token in a multimodal file. Their rows of the
    # embedding table are never trained as text: a text-only model refuses them in a prompt.
    media_token_ids: tuple[int, ...] = ()
    # The one of them an image's vectors replace (gemma4/README.md §19).
    image_token_id: int | None = None

    @property
    def first_shared_layer(self) -> int:
        return self.num_layers - self.num_kv_shared_layers

    def is_shared(self, layer: int) -> bool:
        return layer >= self.first_shared_layer

    def kv_source(self, layer_type: str) -> int:
        """The last non-shared layer of this type: shared layers and the drafter read its K/V."""
        owners = range(self.first_shared_layer)
        return [i for i in owners if self.layer_types[i] == layer_type][-1]

    def mlp_width(self, layer: int) -> int:
        # Only E2B sets use_double_wide_mlp: its KV-shared layers get twice the MLP width.
        wide = self.use_double_wide_mlp and self.is_shared(layer) and self.first_shared_layer > 0
        return self.intermediate_size * (2 if wide else 1)

    def has_v_proj(self, layer: int) -> bool:
        # K=V full layers derive V from the raw key projection (gemma4/README.md §7).
        return not (self.attention_k_eq_v and self.layer_types[layer] == FULL)
