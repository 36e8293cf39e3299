"""config.json parsing: the released configurations resolve to the geometry of gemma4/README.md §2-§3 and
§16, both serialisation forms agree, and inconsistent configs are rejected with the field named."""

import dataclasses
import json
import math

import pytest

from gemma4.config import FULL, SLIDING, ConfigError
from gemma4.config_file import load_config, text_config_from_dict, text_fields

ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
}


def released(name: str) -> dict:
    """The text_config of the five released targets, as gemma4/README.md §16 tabulates them (official form).
    The 12B's file is `gemma4_unified_text` (its released config; its text parameters add up to the card's count less
    the vision and audio embedders, test_released_parameter_counts)."""
    common = {"vocab_size": 262144, "head_dim": 256, "global_head_dim": 512, "rms_norm_eps": 1e-6,
              "final_logit_softcapping": 30.0, "rope_parameters": ROPE, "model_type": "gemma4_text"}
    shapes = {
        "e2b": dict(hidden_size=1536, num_hidden_layers=35, period=5, num_attention_heads=8, num_key_value_heads=1,
                    sliding_window=512, intermediate_size=6144, num_kv_shared_layers=20, use_double_wide_mlp=True,
                    hidden_size_per_layer_input=256, vocab_size_per_layer_input=262144, attention_k_eq_v=False),
        "e4b": dict(hidden_size=2560, num_hidden_layers=42, period=6, num_attention_heads=8, num_key_value_heads=2,
                    sliding_window=512, intermediate_size=10240, num_kv_shared_layers=18,
                    hidden_size_per_layer_input=256, vocab_size_per_layer_input=262144, attention_k_eq_v=False),
        "26b": dict(hidden_size=2816, num_hidden_layers=30, period=6, num_attention_heads=16, num_key_value_heads=8,
                    num_global_key_value_heads=2, attention_k_eq_v=True, sliding_window=1024,
                    intermediate_size=2112, num_kv_shared_layers=0, hidden_size_per_layer_input=None,
                    enable_moe_block=True, num_experts=128, top_k_experts=8, moe_intermediate_size=704),
        "12b": dict(model_type="gemma4_unified_text", hidden_size=3840, num_hidden_layers=48, period=6,
                    sliding_window=1024, max_position_embeddings=262144,
                    num_attention_heads=16, num_key_value_heads=8, num_global_key_value_heads=1, attention_k_eq_v=True,
                    intermediate_size=15360),
        "31b": dict(hidden_size=5376, num_hidden_layers=60, period=6, num_attention_heads=32, num_key_value_heads=16,
                    num_global_key_value_heads=4, attention_k_eq_v=True, sliding_window=1024,
                    intermediate_size=21504, num_kv_shared_layers=0, hidden_size_per_layer_input=0),
    }
    fields = dict(shapes[name])
    period = fields.pop("period")
    n = fields["num_hidden_layers"]
    fields["layer_types"] = [FULL if (i + 1) % period == 0 else SLIDING for i in range(n)]
    return {**common, **fields}


@pytest.mark.parametrize("name, sources, first_shared", [
    ("e2b", (13, 14), 15), ("e4b", (22, 23), 24), ("26b", (28, 29), 30), ("31b", (58, 59), 60), ("12b", (46, 47), 48),
])
def test_released_kv_sources(name: str, sources: tuple[int, int], first_shared: int) -> None:
    c = text_config_from_dict(released(name))
    assert (c.kv_source(SLIDING), c.kv_source(FULL)) == sources  # gemma4/README.md §3 table
    assert c.first_shared_layer == first_shared


def test_released_geometry() -> None:
    e2b = text_config_from_dict(released("e2b"))
    assert e2b.head_dims[4] == 512 and e2b.head_dims[0] == 256
    assert set(e2b.kv_heads) == {1}  # K=V off: full layers keep num_key_value_heads
    assert [e2b.mlp_width(i) for i in (14, 15, 34)] == [6144, 12288, 12288]  # double-wide on shared layers
    big = text_config_from_dict(released("31b"))
    assert (big.kv_heads[0], big.kv_heads[5]) == (16, 4)  # K=V: full layers take num_global_key_value_heads
    assert not big.has_v_proj(5) and big.has_v_proj(0)
    moe = text_config_from_dict(released("26b"))
    assert (moe.ple_dim, moe.num_experts, moe.top_k_experts) == (0, 128, 8)
    assert moe.rope[FULL].partial_rotary_factor == 0.25 and moe.rope[SLIDING].partial_rotary_factor == 1.0


def test_released_12b_parameter_count() -> None:
    """The 12B's released dimensions give the model card's 11,959,730,224 parameters: 11,907,350,320 of text, and
    52,379,904 of image and audio embedders, of which the image side (its embedder and `embed_vision`, as
    transformers 5.22.2 defines them at the release's sizes) is 49,922,304 (gemma4/README.md §16, §19)."""
    from transformers.models.gemma4_unified.configuration_gemma4_unified import Gemma4UnifiedVisionConfig

    from gemma4.vision import tower, unified
    from gemma4.vision.config import vision_config
    from gemma4.weights import target_weight_table
    count = lambda table: sum(math.prod(shape) for shape in table.values())  # noqa: E731
    text = count(target_weight_table(text_config_from_dict(released("12b"))))
    assert text == 11_907_350_320
    v = vision_config({"model_type": "gemma4_unified", "vision_config": Gemma4UnifiedVisionConfig().to_dict(),
                       "text_config": {"hidden_size": 3840}})
    assert (v.mm_embed_dim, v.mm_posemb_size, v.patch_size, v.pooling_kernel_size) == (3840, 1120, 16, 3)
    image = count(unified.weight_table(v)) + count(tower.embed_weight_table(v))
    assert image == 49_922_304 and text + 52_379_904 == 11_959_730_224


def test_default_vision_tower_size() -> None:
    """The ViT at transformers 5.22.2's default vision_config, as gemma4/README.md §19 states it per family."""
    from transformers import Gemma4VisionConfig

    from gemma4.vision import tower
    from gemma4.vision.config import vision_config
    count = lambda table: sum(math.prod(shape) for shape in table.values())  # noqa: E731
    sizes = {}
    for name, e in (("e2b", 1536), ("e4b", 2560), ("26b", 2816), ("31b", 5376)):
        v = vision_config({"model_type": "gemma4", "vision_config": Gemma4VisionConfig().to_dict(),
                           "text_config": {"hidden_size": e}})
        assert count(tower.weight_table(v)) == 167_364_608
        sizes[name] = round((count(tower.weight_table(v)) + count(tower.embed_weight_table(v))) / 1e6, 1)
    assert sizes == {"e2b": 168.5, "e4b": 169.3, "26b": 169.5, "31b": 171.5}


def test_unified_defaults() -> None:
    """A unified file that leaves a field out gets transformers' default for that type, not the other type's."""
    fields = {k: v for k, v in released("12b").items() if k not in ("sliding_window", "max_position_embeddings")}
    c = text_config_from_dict(fields)
    assert (c.sliding_window, c.max_position_embeddings) == (1024, 262144)
    assert (c.ple_dim, c.enable_moe, c.use_double_wide_mlp, c.first_shared_layer) == (0, False, False, 48)
    assert (c.head_dims[0], c.head_dims[5], c.kv_heads[0], c.kv_heads[5]) == (256, 512, 8, 1)  # K=V: 1 global head
    assert c.has_v_proj(0) and not c.has_v_proj(5)
    plain = text_config_from_dict({**fields, "model_type": "gemma4_text"})
    assert (plain.sliding_window, plain.max_position_embeddings) == (512, 131072)


def test_per_layer_config_form_is_authoritative() -> None:
    official = released("31b")
    saved = {k: v for k, v in official.items() if k not in ("global_head_dim", "num_global_key_value_heads")}
    saved["per_layer_config"] = {f"{i:02d}": {"head_dim": 512, "num_key_value_heads": 4}
                                 for i, t in enumerate(official["layer_types"]) if t == FULL}
    assert text_config_from_dict(saved) == text_config_from_dict(official)


def test_last_layer_forced_full_and_default_pattern() -> None:
    fields = released("31b")
    del fields["layer_types"]
    fields["num_hidden_layers"] = 8
    c = text_config_from_dict(fields)
    assert c.layer_types == (SLIDING,) * 5 + (FULL, SLIDING, FULL)  # i+1 divisible by 6, last forced


def test_multimodal_and_bare_files(tmp_path) -> None:  # noqa: ANN001
    text = released("e2b")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma4", "text_config": text}))
    assert text_fields(json.loads((tmp_path / "config.json").read_text()))[1] == "model.language_model."
    multimodal = load_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(text))
    bare = load_config(tmp_path)
    assert sorted(multimodal.media_token_ids) == [258880, 258881, 258884] and bare.media_token_ids == ()
    assert multimodal.image_token_id == 258880 and bare.image_token_id is None
    assert dataclasses.replace(bare, media_token_ids=multimodal.media_token_ids, image_token_id=258880) == multimodal


@pytest.mark.parametrize("change, field", [
    ({"model_type": "llama"}, "model_type"),
    ({"layer_types": [SLIDING, FULL]}, "layer_types"),
    ({"num_key_value_heads": 3}, "num_attention_heads"),
    ({"hidden_size": None}, "hidden_size"),
    ({"num_kv_shared_layers": 99}, "num_kv_shared_layers"),
    ({"use_bidirectional_attention": "all"}, "use_bidirectional_attention"),
    ({"rope_parameters": {"sliding_attention": {"rope_type": "yarn", "rope_theta": 1.0}}}, "rope_type"),
    ({"enable_moe_block": True, "num_experts": 4, "top_k_experts": 8, "moe_intermediate_size": 8}, "enable_moe_block"),
])
def test_inconsistent_configs_name_the_field(tmp_path, change: dict, field: str) -> None:  # noqa: ANN001
    text = {**released("e2b"), **change}
    (tmp_path / "config.json").write_text(json.dumps(text if "model_type" in change else
                                                     {"model_type": "gemma4", "text_config": text}))
    with pytest.raises(ConfigError, match=field):
        load_config(tmp_path)


UNIFIED_TEXT = {"hidden_size": 3840, "num_hidden_layers": 12, "intermediate_size": 9216, "num_attention_heads": 8,
                "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 262144}


@pytest.mark.parametrize("change, field", [
    ({"hidden_size_per_layer_input": 256}, "hidden_size_per_layer_input"),
    ({"enable_moe_block": True}, "enable_moe_block"),
    ({"num_experts": 128}, "num_experts"),
    ({"hidden_activation": "gelu"}, "hidden_activation"),
    ({"attention_bias": True}, "attention_bias"),
    ({"tie_word_embeddings": False}, "tie_word_embeddings"),
    ({"use_bidirectional_attention": "all"}, "use_bidirectional_attention"),
    ({"model_type": "gemma4_text"}, "gemma4_text"),
])
def test_unified_fields_not_implemented_are_refused(tmp_path, change: dict, field: str) -> None:  # noqa: ANN001
    """A field of a 12B file that this implementation would not apply is refused with one line naming it."""
    text = {"model_type": "gemma4_unified_text", **UNIFIED_TEXT, **change}
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma4_unified", "text_config": text}))
    with pytest.raises(ConfigError, match=field) as caught:
        load_config(tmp_path)
    assert "\n" not in str(caught.value)


def test_unified_file_is_read(tmp_path) -> None:  # noqa: ANN001
    raw = {"model_type": "gemma4_unified", "text_config": {"model_type": "gemma4_unified_text", **UNIFIED_TEXT},
           "image_token_id": 258880, "audio_token_id": 258881, "video_token_id": 258884}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    c = load_config(tmp_path)
    assert text_fields(raw)[1] == "model.language_model."
    assert sorted(c.media_token_ids) == [258880, 258881, 258884] and c.sliding_window == 1024
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma4_unified_text", **UNIFIED_TEXT}))
    assert load_config(tmp_path).media_token_ids == ()  # a bare text file has no media placeholders


def test_unreadable_config(tmp_path) -> None:  # noqa: ANN001
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(tmp_path)
