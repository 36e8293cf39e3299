"""Reading a target's `config.json` key by key into a validated `TextConfig` (defaults as transformers 5.22.2).

Facts a reader must know (gemma4/README.md §1-§3):
- Official targets are multimodal (`model_type: gemma4`): the text fields sit in `text_config`.
  A bare `gemma4_text` config (saved from a `Gemma4ForCausalLM`) holds them at the top level.
- Sliding and full layers have different head sizes (`head_dim` vs `global_head_dim`) and, on K=V
  models, different kv-head counts. Files saved by transformers itself replace those two keys with a
  `per_layer_config` table; when present it is authoritative.
"""

import json
from pathlib import Path
from typing import Any

from gemma4.config import FULL, SLIDING, ConfigError, RopeConfig, TextConfig

TEXT_MODEL_TYPES = ("gemma4", "gemma4_text")


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


def text_config_from_dict(d: dict[str, Any]) -> TextConfig:
    """Resolve a `gemma4_text` dict (defaults as transformers 5.22.2) into per-layer geometry."""
    if d.get("use_bidirectional_attention") == "all":
        raise ConfigError("use_bidirectional_attention='all' is not a causal Gemma 4 text model")
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
        sliding_window=int(_get(d, "sliding_window", 512)),
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
        max_position_embeddings=int(_get(d, "max_position_embeddings", 131_072)),
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
    """The text part of a target config.json and the tensor-name prefix that goes with it."""
    model_type = raw.get("model_type")
    if model_type == "gemma4":
        if not isinstance(raw.get("text_config"), dict):
            raise ConfigError("model_type 'gemma4' config has no text_config object")
        return raw["text_config"], "model.language_model."
    if model_type == "gemma4_text":
        return raw, "model."
    raise ConfigError(f"model_type={model_type!r} is not a Gemma 4 target (expected 'gemma4' or 'gemma4_text')")


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path} is not valid JSON ({e})") from None


def load_config(model_dir: str | Path) -> TextConfig:
    fields, _ = text_fields(read_json(Path(model_dir) / "config.json"))
    return text_config_from_dict(fields)
