"""Reading a target's `config.json` key by key into a validated `TextConfig` (defaults as transformers 5.22.2).

Facts a reader must know (gemma4/README.md §1-§3):
- Official targets are multimodal (`model_type: gemma4`, or `gemma4_unified` for the 12B): the text
  fields sit in `text_config`. A bare `gemma4_text` / `gemma4_unified_text` config (saved from a
  `…ForCausalLM`) holds them at the top level.
- The two text model types are one model read with different defaults (`TEXT_DEFAULTS`): the 12B's
  ("unified") type has no fields for Per-Layer Embeddings or MoE, and a 1024-token window.
- Sliding and full layers have different head sizes (`head_dim` vs `global_head_dim`) and, on K=V
  models, different kv-head counts. Files saved by transformers itself replace those two keys with a
  `per_layer_config` table; when present it is authoritative.
"""

import json
from pathlib import Path
from typing import Any

from gemma4.config import FULL, SLIDING, ConfigError, RopeConfig, TextConfig

# Outer model_type -> (the text model_type it holds, where the text fields are, the tensor-name prefix).
FILE_TYPES = {
    "gemma4": ("gemma4_text", "text_config", "model.language_model."),
    "gemma4_text": ("gemma4_text", None, "model."),
    "gemma4_unified": ("gemma4_unified_text", "text_config", "model.language_model."),
    "gemma4_unified_text": ("gemma4_unified_text", None, "model."),
}
# What transformers 5.22.2 assumes for an absent field, where the two text model types differ.
TEXT_DEFAULTS = {
    "gemma4_text": {"sliding_window": 512, "max_position_embeddings": 131_072},
    "gemma4_unified_text": {"sliding_window": 1024, "max_position_embeddings": 262_144},
}
# Fields the unified text model does not have: transformers would ignore them, so a file that sets them
# was not written for the model it names.
NOT_UNIFIED = ("hidden_size_per_layer_input", "vocab_size_per_layer_input", "enable_moe_block", "num_experts",
               "top_k_experts", "moe_intermediate_size")
# The ids of a multimodal file's soft-token placeholders (defaults of both multimodal configs).
MEDIA_FIELDS = {"image_token_id": 258_880, "video_token_id": 258_884, "audio_token_id": 258_881}


def _require(d: dict[str, Any], key: str) -> Any:
    if d.get(key) is None:
        raise ConfigError(f"config.json text fields lack {key!r}")
    return d[key]


def _get(d: dict[str, Any], key: str, default: Any) -> Any:
    value = d.get(key, default)
    return default if value is None else value


def _rope(params: dict[str, Any], layer_type: str) -> RopeConfig:
    kind = params.get("rope_type", "default")
    if kind not in ("default", "proportional"):
        raise ConfigError(f"rope_parameters.{layer_type}.rope_type={kind!r} is not a Gemma 4 rope type")
    partial = float(params.get("partial_rotary_factor", 1.0)) if kind == "proportional" else 1.0
    return RopeConfig(float(params["rope_theta"]), partial, float(params.get("factor", 1.0)))


DEFAULT_ROPE = {
    SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
    FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
}


def _refuse_unimplemented(d: dict[str, Any], text_type: str) -> None:
    """Fields that would change the math in a way this implementation does not compute: refused, never ignored."""
    if d.get("use_bidirectional_attention") not in (None, "vision"):  # "vision": only image tokens look ahead
        raise ConfigError(f"use_bidirectional_attention={d['use_bidirectional_attention']!r} is not a causal "
                          f"Gemma 4 text model")
    if _get(d, "hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise ConfigError(f"hidden_activation={d['hidden_activation']!r}: only 'gelu_pytorch_tanh' is implemented")
    if _get(d, "attention_bias", False):
        raise ConfigError("attention_bias=true: Gemma 4 projections have no bias and none is implemented")
    if not _get(d, "tie_word_embeddings", True):
        raise ConfigError("tie_word_embeddings=false: the output head is the embedding table here (§13)")
    if text_type == "gemma4_unified_text":
        for key in NOT_UNIFIED:
            if d.get(key):
                raise ConfigError(f"{key}={d[key]!r} in a gemma4_unified text config: that model has no "
                                  f"Per-Layer Embeddings or MoE; check the file's model_type")


def text_config_from_dict(d: dict[str, Any], media_token_ids: tuple[int, ...] = (),
                          image_token_id: int | None = None) -> TextConfig:
    """Resolve a Gemma 4 text dict (its `model_type` picks transformers 5.22.2's defaults) into per-layer geometry."""
    text_type = d.get("model_type") if d.get("model_type") in TEXT_DEFAULTS else "gemma4_text"
    defaults = TEXT_DEFAULTS[text_type]
    _refuse_unimplemented(d, text_type)
    num_layers = int(_require(d, "num_hidden_layers"))
    layer_types = list(d.get("layer_types") or [SLIDING if (i + 1) % 6 else FULL for i in range(num_layers)])
    if len(layer_types) != num_layers:
        raise ConfigError(f"layer_types has {len(layer_types)} entries, num_hidden_layers is {num_layers}")
    if any(t not in (SLIDING, FULL) for t in layer_types):
        raise ConfigError(f"layer_types may only hold {SLIDING!r} and {FULL!r}")
    layer_types[-1] = FULL  # transformers forces the last layer to full attention

    head_dim, kv_heads = int(_get(d, "head_dim", 256)), int(_require(d, "num_key_value_heads"))
    k_eq_v = bool(_get(d, "attention_k_eq_v", False))
    if "per_layer_config" in d:  # the form transformers itself writes: authoritative
        overrides = {int(k): v for k, v in d["per_layer_config"].items()}
        head_dims = [int(overrides.get(i, {}).get("head_dim", head_dim)) for i in range(num_layers)]
        kvs = [int(overrides.get(i, {}).get("num_key_value_heads", kv_heads)) for i in range(num_layers)]
    else:  # the form of the official files
        global_dim = int(_get(d, "global_head_dim", 512))
        global_kv = d.get("num_global_key_value_heads") if k_eq_v else None
        full_kv = int(global_kv) if global_kv is not None else kv_heads
        head_dims = [global_dim if t == FULL else head_dim for t in layer_types]
        kvs = [full_kv if t == FULL else kv_heads for t in layer_types]

    num_heads = int(_require(d, "num_attention_heads"))
    for i, kv in enumerate(kvs):
        if kv <= 0 or num_heads % kv:
            raise ConfigError(f"num_attention_heads={num_heads} is not a multiple of layer {i}'s {kv} kv heads")

    shared = int(_get(d, "num_kv_shared_layers", 0))
    if not 0 <= shared <= num_layers:
        raise ConfigError(f"num_kv_shared_layers={shared} is outside 0..{num_layers}")
    first_shared = num_layers - shared
    if shared and first_shared > 0 and any(t not in layer_types[:first_shared] for t in set(layer_types[first_shared:])):
        raise ConfigError("num_kv_shared_layers leaves a shared layer type with no non-shared layer to read from")

    rope_params = d.get("rope_parameters") or DEFAULT_ROPE
    moe = bool(_get(d, "enable_moe_block", False))
    cfg = TextConfig(
        vocab_size=int(_get(d, "vocab_size", 262_144)),
        hidden_size=int(_require(d, "hidden_size")),
        num_layers=num_layers,
        num_heads=num_heads,
        layer_types=tuple(layer_types),
        head_dims=tuple(head_dims),
        kv_heads=tuple(kvs),
        sliding_window=int(_get(d, "sliding_window", defaults["sliding_window"])),
        rope={t: _rope(rope_params.get(t, DEFAULT_ROPE[t]), t) for t in (SLIDING, FULL)},
        intermediate_size=int(_require(d, "intermediate_size")),
        use_double_wide_mlp=bool(_get(d, "use_double_wide_mlp", False)),
        num_kv_shared_layers=shared,
        attention_k_eq_v=k_eq_v,
        ple_dim=int(_get(d, "hidden_size_per_layer_input", 0)),
        ple_vocab_size=int(_get(d, "vocab_size_per_layer_input", 0)),
        enable_moe=moe,
        num_experts=int(_get(d, "num_experts", 0)) if moe else 0,
        top_k_experts=int(_get(d, "top_k_experts", 0)) if moe else 0,
        moe_intermediate_size=int(_get(d, "moe_intermediate_size", 0)) if moe else 0,
        rms_norm_eps=float(_get(d, "rms_norm_eps", 1e-6)),
        final_logit_softcapping=d.get("final_logit_softcapping"),
        max_position_embeddings=int(_get(d, "max_position_embeddings", defaults["max_position_embeddings"])),
        media_token_ids=tuple(media_token_ids),
        image_token_id=image_token_id,
    )
    if cfg.ple_dim and cfg.ple_vocab_size <= 0:
        raise ConfigError("hidden_size_per_layer_input is set but vocab_size_per_layer_input is not")
    if moe and not (0 < cfg.top_k_experts <= cfg.num_experts and cfg.moe_intermediate_size > 0):
        raise ConfigError("enable_moe_block needs num_experts >= top_k_experts > 0 and moe_intermediate_size > 0")
    for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "sliding_window", "vocab_size"):
        if getattr(cfg, name) <= 0:
            raise ConfigError(f"{name} must be positive, got {getattr(cfg, name)}")
    return cfg


def text_fields(raw: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The text part of a target config.json (its `model_type` filled in) and the tensor-name prefix that goes with it."""
    model_type = raw.get("model_type")
    if model_type not in FILE_TYPES:
        expected = ", ".join(repr(t) for t in FILE_TYPES)
        raise ConfigError(f"model_type={model_type!r} is not a Gemma 4 target (expected one of {expected})")
    text_type, key, prefix = FILE_TYPES[model_type]
    fields = raw if key is None else raw.get(key)
    if not isinstance(fields, dict):
        raise ConfigError(f"model_type {model_type!r} config has no {key} object")
    if fields.get("model_type", text_type) != text_type:
        raise ConfigError(f"a {model_type!r} config holds a {fields['model_type']!r} text_config, expected {text_type!r}")
    return {**fields, "model_type": text_type}, prefix


def media_token_ids(raw: dict[str, Any]) -> tuple[int, ...]:
    """The soft-token placeholder ids of a multimodal file (none for a bare text file)."""
    if FILE_TYPES.get(raw.get("model_type"), (None, None))[1] is None:
        return ()
    return tuple(int(raw.get(k, default)) for k, default in MEDIA_FIELDS.items() if raw.get(k, default) is not None)


def target_config(raw: dict[str, Any]) -> tuple[TextConfig, str]:
    """A target config.json's `TextConfig` and its tensor-name prefix."""
    fields, prefix = text_fields(raw)
    media = media_token_ids(raw)
    image = raw.get("image_token_id", MEDIA_FIELDS["image_token_id"]) if media else None
    return text_config_from_dict(fields, media, None if image is None else int(image)), prefix


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path} is not valid JSON ({e})") from None


def processor_section(model_dir: str | Path, places: tuple[tuple[str, str | None], ...]) -> dict[str, Any]:
    """A processor's settings, found as transformers finds them: the first of `places` (file, key in it, or None for
    the whole file) that holds a JSON object; {} with none (every release stores the defaults)."""
    for name, key in places:
        path = Path(model_dir) / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"{path} is not readable JSON ({e}): restore the file from the release") from e
        if not isinstance(data, dict):
            raise ConfigError(f"{path} holds no JSON object: restore the file from the release")
        section = data.get(key) if key else data
        if isinstance(section, dict):
            return section
    return {}


def load_config(model_dir: str | Path) -> TextConfig:
    return target_config(read_json(Path(model_dir) / "config.json"))[0]
