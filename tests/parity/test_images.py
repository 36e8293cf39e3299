"""Image prompts against transformers 5.22.2 on tiny image-text checkpoints it wrote (tests/checkpoints.py `images=True`):
logits of a prompt holding two images within the float64 bound (tests/tolerance.py), for every family; a causal-only
mask failing where the config asks for both ways; speculative decoding equal to plain decoding over an image prompt;
and a media id the model generates embedded as transformers embeds it.

Transformers gets the pixels its own PIL processor makes (float32, as it returns them); the 12B's processor needs
torchvision, so it gets ours (tests/parity/test_image_processor.py holds our pixels to transformers'). The 12B's
masks are the ones transformers' `create_masks_for_generate` builds (both ways on sliding layers only): its plain
forward also opens full layers both ways, which its own docstring says Gemma 4 does not (see gemma4/README.md §19).
"""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

from gemma4 import SamplerConfig, load_target
from gemma4.fast.static import StaticKVCache, StaticTarget
from gemma4.generate import greedy_generate
from gemma4.vision.loading import load_vision
from gemma4.vision.processor import process
from mtp import DraftLength, load_drafter, speculative_generate
from tests.checkpoints import IMAGE_SOFT_TOKENS, MEDIA_IDS, STOP_IDS, picture, write_assistant, write_target
from tests.tf_oracle import tf_greedy, tf_target
from tests.tolerance import assert_fp32_parity
from gemma4.engine import generate_one
from mtp.engine import speculative_one
from gemma4.engine.forward import forward_rows

FAMILIES = {"e2b": None, "moe": None, "dense": True, "12b": None}  # shape -> both_ways (None: TF's default)


PICTURES = [picture(37, 91, 1), picture(120, 50, 2)]  # portrait and landscape, odd sides: 65 and 60 soft tokens


def tf_pixels(vision, pictures) -> dict:  # noqa: ANN001
    if not vision.config.unified:
        out = Gemma4ImageProcessorPil(patch_size=vision.processing.patch_size, max_soft_tokens=IMAGE_SOFT_TOKENS,
                                      pooling_kernel_size=vision.processing.pooling_kernel_size)(pictures, return_tensors="pt")
        return dict(pixel_values=out["pixel_values"], image_position_ids=out["image_position_ids"])
    pixels = [process(p, vision.processing) for p in pictures]
    n = max(len(x.patches) for x in pixels)
    pad = [n - len(x.patches) for x in pixels]
    return dict(pixel_values=torch.stack([torch.cat([x.patches, x.patches.new_zeros(m, x.patches.shape[1])])
                                          for x, m in zip(pixels, pad)]),
                image_position_ids=torch.stack([torch.cat([x.positions, torch.full((m, 2), -1)])
                                                for x, m in zip(pixels, pad)]))


@torch.no_grad()
def logits(path: Path, dtype: torch.dtype, causal_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(ours, transformers') logits (T, V) of one prompt with both pictures, in `dtype`."""
    ours, vision = load_target(path, dtype=dtype, fast=False), load_vision(path, dtype=dtype)
    vectors = [vision.encode(process(p, vision.processing)) for p in PICTURES]
    b = vision.tokens.boi
    ids, images = vision.prompt([2, 10, 11, b, 12, 13, b, 14], vectors)
    soft = images.soft([0], len(ids), torch.device("cpu"))
    if causal_only:
        soft = soft._replace(both_ways=None)
    mine = forward_rows(ours, torch.tensor([ids]), soft=soft).logits[0]
    tf = tf_target(path, dtype=dtype)
    x = torch.tensor([ids])
    mm = (x == vision.tokens.soft).long()
    masks = type(tf).create_masks_for_generate(tf.config, torch.empty((1, len(ids), 0), dtype=dtype), torch.ones_like(x),
                                               None, torch.arange(len(ids))[None], mm_token_type_ids=mm)
    theirs = tf(input_ids=x, mm_token_type_ids=mm, attention_mask=masks, **tf_pixels(vision, PICTURES)).logits[0]
    return mine, theirs


@pytest.fixture(scope="module", params=list(FAMILIES))
def image_target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    shape = request.param
    return shape, write_target(tmp_path_factory.mktemp(shape), shape, images=True, both_ways=FAMILIES[shape])


def test_image_prompt_logits_match_transformers(image_target) -> None:  # noqa: ANN001
    shape, path = image_target
    ours, theirs = logits(path, torch.float32)
    ours64, theirs64 = logits(path, torch.float64)
    assert_fp32_parity("image prompt", f"{shape}, 2 images", ours, theirs, ours64, theirs64,
                       load_target(path, fast=False).config.num_layers)


def test_causal_only_mask_fails_where_both_ways_are_asked(tmp_path: Path) -> None:
    path = write_target(tmp_path, "dense", images=True, both_ways=True)
    ours, theirs = logits(path, torch.float64, causal_only=True)
    assert float((ours - theirs).abs().max()) > 1e-2  # both ways matter: the causal mask is far off


@pytest.mark.parametrize("shape", ["dense", "12b"])
def test_speculative_equals_plain_over_an_image_prompt(shape: str, tmp_path: Path) -> None:
    """Greedy, with a prefill chunk shorter than an image (it must not split one where both ways are asked)."""
    path = write_target(tmp_path / "t", shape, images=True, both_ways=FAMILIES.get(shape))
    drafter = load_drafter(write_assistant(tmp_path / "a", path, ordered_embeddings=False, echo=True, seed=2))
    target, vision = load_target(path), load_vision(path)
    vectors = [vision.encode(process(p, vision.processing)) for p in PICTURES]
    ids, images = vision.prompt([2, 10, vision.tokens.boi, 12, vision.tokens.boi, 14], vectors)
    plain = generate_one(target, ids, 12, None, images=images)
    for chunk in (None, 16):
        spec = speculative_one(target, drafter, ids, 12, DraftLength(3), images=images, prefill_chunk=chunk)
        assert spec.tokens == plain
    assert generate_one(target, ids, 12, None, images=images, prefill_chunk=16) == plain


@torch.no_grad()
def test_greedy_tokens_equal_transformers_generate(image_target, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """transformers' own `generate` with the pixels, greedy, in float64 (no near tie can flip an argmax). The 12B's
    forward builds its masks with `create_masks_for_vision_model`, as its `create_masks_for_generate` does (both ways
    on sliding layers only), rather than opening full layers too (module doc)."""
    shape, path = image_target
    if shape == "12b":
        from transformers.models.gemma4_unified import modeling_gemma4_unified as unified
        causal = unified.create_masks_for_generate

        def sliding_only(block_sequence_ids: torch.Tensor | None = None, **kw) -> dict:  # noqa: ANN003
            return (unified.create_masks_for_vision_model(block_sequence_ids=block_sequence_ids, **kw)
                    if block_sequence_ids is not None else causal(**kw))
        monkeypatch.setattr(unified, "create_masks_for_generate", sliding_only)
    ours, vision = load_target(path, dtype=torch.float64, fast=False), load_vision(path, dtype=torch.float64)
    vectors = [vision.encode(process(p, vision.processing)) for p in PICTURES]
    ids, images = vision.prompt([2, 10, vision.tokens.boi, 12, 13, vision.tokens.boi, 14], vectors)
    mine = generate_one(ours, ids, 16, None, STOP_IDS, images=images)
    tf = tf_target(path, dtype=torch.float64)
    x = torch.tensor([ids])
    out = tf.generate(input_ids=x, attention_mask=torch.ones_like(x), mm_token_type_ids=(x == vision.tokens.soft).long(),
                      max_new_tokens=16, do_sample=False, **tf_pixels(vision, PICTURES))
    assert out[0, len(ids):].tolist() == mine


@torch.no_grad()
def test_a_generated_media_id_embeds_as_transformers_does(tmp_path: Path) -> None:
    """transformers embeds every image, video and audio id as the pad token in every forward, one the model itself
    generated included (its embedding and its PLE rows). A tiny E2B image model made to emit the image id (its tied
    head row set to 4x that of a token it picks): greedy tokens, plain, speculative and through the static steps,
    equal transformers' `generate`, in float64, and the id is among them."""
    path = write_target(tmp_path / "t", "e2b", images=True)
    ids = [2, 10, 11, 12, 13]
    picked = greedy_generate(load_target(path, dtype=torch.float64, fast=False), ids, 6)[3]
    file = next(path.glob("*.safetensors"))
    tensors = load_file(file)
    name = next(n for n in tensors if n.endswith("language_model.embed_tokens.weight"))
    image = MEDIA_IDS["image_token_id"]
    tensors[name][image] = 4 * tensors[name][picked]
    save_file(tensors, file, metadata={"format": "pt"})
    ours = load_target(path, dtype=torch.float64, fast=False)
    mine = greedy_generate(ours, ids, 16)
    assert image in mine[:-1]  # generated, and a token chosen after it
    assert mine == tf_greedy(tf_target(path, dtype=torch.float64), ids, 16)
    drafter = load_drafter(write_assistant(tmp_path / "a", path, ordered_embeddings=False, echo=True, seed=2),
                           dtype=torch.float64)
    assert speculative_generate(ours, drafter, ids, 16, DraftLength(3)).tokens == mine
    static = StaticTarget(ours)
    cache = StaticKVCache(ours.config, 32, torch.float64, align=1)
    assert generate_one(static, ids, 16, SamplerConfig(temperature=0), cache=cache) == mine
