"""What a multimodal `config.json` says about audio: the tower's geometry and the prompt's audio ids.

Facts a reader must know (transformers 5.22.2 `Gemma4AudioConfig`, `Gemma4UnifiedAudioConfig`):
- E2B and E4B (`model_type: gemma4`) carry a conformer (`audio_config`, model_type `gemma4_audio`) over 128-bin
  log-mel frames at 100 per second; it emits one vector per 4 frames (25 per second), which `embed_audio` carries
  into the text width. 26B-A4B and 31B have `audio_config: null`.
- The 12B (`gemma4_unified`) has no tower: each soft token is 640 raw samples (40 ms at 16 kHz) that `embed_audio`
  normalises and projects (`audio_config.audio_embed_dim`, model_type `gemma4_unified_audio`).
- The prompt holds, per clip, boa, one audio soft token per vector, eoa. Only the soft tokens are replaced by the
  clip's vectors. The end id's config key is `eoa_token_index` (not `eoa_token_id`).
"""

from dataclasses import dataclass
from typing import Any

from gemma4.config import ConfigError

MEL_BINS = 128  # the feature extractor's bins; the subsampler's flattening assumes its first channel count equals it


@dataclass(frozen=True)
class AudioConfig:
    unified: bool  # the 12B's frame embedder (True) or the conformer tower (False)
    text_hidden_size: int  # E: the width the audio vectors are projected into
    output_proj_dims: int  # width entering embed_audio: the tower's output_proj, or the 12B's samples per frame
    rms_norm_eps: float  # embed_audio's norm and, in the tower, the subsampler's and light conv's norms
    # The conformer tower (unified=False); zero on the 12B.
    hidden_size: int = 0  # W
    num_layers: int = 0
    num_heads: int = 0
    subsampling_channels: tuple[int, int] = (0, 0)  # the two 3x3 stride-2 convolutions' output channels
    conv_kernel_size: int = 0  # the light conv's causal depthwise kernel
    residual_weight: float = 0.5  # each half-step feed-forward adds this times its output
    chunk_size: int = 0  # C: queries attend in blocks of C positions (after subsampling, 40 ms each)
    context_left: int = 0  # C + 1 in every release: a position sees itself and the C - 1 before it
    logit_cap: float = 0.0  # tanh soft cap of the attention logits
    invalid_logit: float = 0.0  # the logit of a key a query may not see
    use_clipped_linears: bool = False  # projections clamp their input and output to stored bounds
    gradient_clipping: float = 0.0  # a clamp TF keeps between blocks: 1e10, a no-op on real activations

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(frozen=True)
class AudioTokens:
    """The ids a clip occupies in a prompt (config.json's top level)."""
    boa: int  # <|audio>: opens a clip
    soft: int  # <|audio|>: one per audio vector, replaced by it
    eoa: int  # <audio|>: closes it


UNIFIED_TYPES = {"gemma4": False, "gemma4_unified": True}


def _positive(**values: float) -> None:
    for key, value in values.items():
        if value <= 0:
            raise ConfigError(f"audio_config.{key}={value}: it must be positive")


def audio_config(raw: dict[str, Any]) -> AudioConfig | None:
    """The `AudioConfig` of a multimodal config.json, or None when the model takes no audio (a bare text file,
    or `audio_config: null` as in 26B-A4B and 31B). Absent keys take transformers 5.22.2's defaults."""
    unified = UNIFIED_TYPES.get(raw.get("model_type"))
    a, text = raw.get("audio_config"), raw.get("text_config") or {}
    if unified is None or not isinstance(a, dict):
        return None
    eps = float(a.get("rms_norm_eps", 1e-6))
    if unified:
        frame = int(a.get("audio_embed_dim", 640))
        _positive(audio_embed_dim=frame)
        return AudioConfig(unified=True, text_hidden_size=int(text["hidden_size"]), output_proj_dims=frame,
                           rms_norm_eps=eps)
    if a.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"audio_config.hidden_act={a['hidden_act']!r}: only 'silu' is implemented")
    channels = tuple(int(c) for c in a.get("subsampling_conv_channels", (128, 32)))
    if len(channels) != 2 or channels[0] != MEL_BINS or channels[1] < 1:
        raise ConfigError(f"audio_config.subsampling_conv_channels={list(channels)}: expected two, the first "
                          f"{MEL_BINS} (the mel bins, which the subsampler's flattening assumes)")
    hidden, heads = int(a.get("hidden_size", 1024)), int(a.get("num_attention_heads", 8))
    chunk, left, right = (int(a.get(k, d)) for k, d in (("attention_chunk_size", 12), ("attention_context_left", 13),
                                                         ("attention_context_right", 0)))
    _positive(hidden_size=hidden, num_attention_heads=heads, num_hidden_layers=int(a.get("num_hidden_layers", 12)),
              conv_kernel_size=int(a.get("conv_kernel_size", 5)), attention_chunk_size=chunk,
              output_proj_dims=int(a.get("output_proj_dims", 1536)),
              attention_logit_cap=float(a.get("attention_logit_cap", 50.0)),
              gradient_clipping=float(a.get("gradient_clipping", 1e10)))
    if hidden % heads:
        raise ConfigError(f"audio_config.hidden_size={hidden} is not a multiple of num_attention_heads={heads}")
    # Every release: blocks of 12, 13 "left" (the window of 12 plus the relative table's extra row), none right.
    # Only then do transformers' relative table and its window agree (gemma4/audio/attention.py).
    if right != 0 or left != chunk + 1:
        raise ConfigError(f"audio_config attention_chunk_size={chunk}, attention_context_left={left}, "
                          f"attention_context_right={right}: only left = chunk + 1 and right = 0 are implemented")
    if hidden % 2:
        raise ConfigError(f"audio_config.hidden_size={hidden}: the sinusoidal position table needs an even width")
    return AudioConfig(
        unified=False, text_hidden_size=int(text["hidden_size"]), output_proj_dims=int(a.get("output_proj_dims", 1536)),
        rms_norm_eps=eps, hidden_size=hidden, num_layers=int(a.get("num_hidden_layers", 12)), num_heads=heads,
        subsampling_channels=(channels[0], channels[1]), conv_kernel_size=int(a.get("conv_kernel_size", 5)),
        residual_weight=float(a.get("residual_weight", 0.5)), chunk_size=chunk, context_left=left,
        logit_cap=float(a.get("attention_logit_cap", 50.0)),
        invalid_logit=float(a.get("attention_invalid_logits_value", -1.0e9)),
        use_clipped_linears=bool(a.get("use_clipped_linears", True)),
        gradient_clipping=float(a.get("gradient_clipping", 1e10)),
    )


def audio_tokens(raw: dict[str, Any]) -> AudioTokens:
    """The audio ids of a multimodal config.json (transformers 5.22.2's defaults where absent)."""
    return AudioTokens(boa=int(raw.get("boa_token_id", 256_000)), soft=int(raw.get("audio_token_id", 258_881)),
                       eoa=int(raw.get("eoa_token_index", 258_883)))
