"""The image towers (gemma4/vision/tower.py, gemma4/vision/unified.py) against transformers 5.22.2's own modules
(`Gemma4VisionModel` + `Gemma4MultimodalEmbedder`, `Gemma4UnifiedVisionEmbedder`) on tiny seeded configs.

Every parameter and buffer is redrawn so that nothing sits at its identity (norm weights U(0.5, 1.5), projections
N(0, 1/fan_in), position tables N(0, 1), clip bounds that cut, standardisation away from 0 and 1) and rounded
through float32: the float64 and float32 models hold the same numbers, as one float32 file loaded in both dtypes
would. Our state dicts are transformers' own, loaded by name with strict=True. Images are non-square patch grids,
given to transformers as a batch of one, both unpadded and padded with (-1, -1) rows. Checks: float64 within
1e-10 of transformers' float64 run, float32 within tests/tolerance.py's bound of it.
"""

import copy

import pytest
import torch
from torch import nn
from transformers.models.gemma4.configuration_gemma4 import Gemma4TextConfig, Gemma4VisionConfig
from transformers.models.gemma4.modeling_gemma4 import Gemma4MultimodalEmbedder, Gemma4VisionModel
from transformers.models.gemma4_unified.configuration_gemma4_unified import (
    Gemma4UnifiedTextConfig, Gemma4UnifiedVisionConfig,
)
from transformers.models.gemma4_unified.modeling_gemma4_unified import Gemma4UnifiedVisionEmbedder

from gemma4.vision.config import VisionConfig, vision_config
from gemma4.vision.tower import VisionEmbedder, VisionTower, embed_weight_table, weight_table
from gemma4.vision.unified import UnifiedEmbedder
from gemma4.vision.unified import weight_table as unified_weight_table
from tests.parity.towers import Normal, Uniform, check, ours, redraw
from tests.tf_oracle import _float64_throughout

TEXT_WIDTH = 24  # E
PAD = 8  # padding rows: transformers pools max_patches / k² outputs, so a multiple of k² = 4
TOWER_CASES = {"plain": (False, False), "clipped-standardized": (True, True)}  # (use_clipped_linears, standardize)
GRIDS = [(6, 4), (2, 8)]  # (columns, rows) of patches; k = 2 divides both
MERGED_GRIDS = [(3, 2), (1, 4)]  # the 12B's grids, in merged patches


def tower_tf_config(clipped: bool, standardize: bool) -> Gemma4VisionConfig:
    return Gemma4VisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                              num_key_value_heads=2, head_dim=8, position_embedding_size=64, pooling_kernel_size=2,
                              patch_size=4, use_clipped_linears=clipped, standardize=standardize)


def unified_tf_config() -> Gemma4UnifiedVisionConfig:
    return Gemma4UnifiedVisionConfig(patch_size=4, pooling_kernel_size=2, mm_embed_dim=16, mm_posemb_size=64,
                                     output_proj_dims=16)


def our_config(tf_config: Gemma4VisionConfig | Gemma4UnifiedVisionConfig, model_type: str) -> VisionConfig:
    """Ours read from the same dict transformers was built from, through gemma4/vision/config.py."""
    return vision_config({"model_type": model_type, "vision_config": tf_config.to_dict(),
                          "text_config": {"hidden_size": TEXT_WIDTH}})


def draw(name: str, t: torch.Tensor, normal: Normal, uniform: Uniform) -> torch.Tensor:
    """The docstring's rule for one tensor of the image side."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf in ("input_min", "output_min"):
        return -uniform(t.shape, 0.5, 1.5)  # normed inputs and projections reach past 1: the bounds cut
    if leaf in ("input_max", "output_max", "std_scale") or ("norm" in name or "_ln" in name) and leaf == "weight":
        return uniform(t.shape, 0.5, 1.5)
    if leaf in ("position_embedding_table", "pos_embedding", "std_bias"):
        return normal(t.shape)
    if leaf == "bias":  # the 12B's layer norms and dense projection
        return 0.1 * normal(t.shape)
    return normal(t.shape) * t.shape[-1] ** -0.5  # a projection (out, in)


def tf_pair(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """model (float64, redrawn) -> (a float32 copy with eager attention, itself computed in float64 with sdpa: eager's
    softmax runs in fp32). The standardisation's `std_bias.float()` stays exact: the values are float32's."""
    fp32 = copy.deepcopy(model).float().eval()
    if hasattr(fp32, "set_attn_implementation"):  # the tower; the 12B's embedder has no attention
        fp32.set_attn_implementation("eager")
        model.set_attn_implementation("sdpa")
    model = _float64_throughout(model.eval())  # RMSNorms and the pooler in float64 (tests/tf_oracle.py)
    return fp32, model


def split_unified(state: dict) -> tuple[dict, dict]:
    """transformers' unified embedder nests the projection as `multimodal_embedder.`; the files keep it apart as
    `model.embed_vision.` -> (UnifiedEmbedder's entries, VisionEmbedder's)."""
    nested = "multimodal_embedder."
    return ({k: v for k, v in state.items() if not k.startswith(nested)},
            {k.removeprefix(nested): v for k, v in state.items() if k.startswith(nested)})


def image(columns: int, rows: int, values: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-major patches of a columns x rows grid: pixels (N, values) as k/255 in float32, positions (N, 2) as
    (x, y)."""
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (columns * rows, values), generator=g).float() / 255
    y, x = torch.meshgrid(torch.arange(rows), torch.arange(columns), indexing="ij")
    return pixels, torch.stack([x.flatten(), y.flatten()], dim=-1)


def batch_of_one(pixels: torch.Tensor, positions: torch.Tensor, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' input: (1, N + pad, values) and (1, N + pad, 2), padding rows of random pixels at (-1, -1)."""
    noise = torch.rand(pad, pixels.shape[1], generator=torch.Generator().manual_seed(pad))
    return (torch.cat([pixels, noise])[None],
            torch.cat([positions, torch.full((pad, 2), -1, dtype=positions.dtype)])[None])


# ---------------------------------------------------------------- the ViT tower

@pytest.fixture(scope="module", params=list(TOWER_CASES), ids=list(TOWER_CASES))
def towers(request: pytest.FixtureRequest):  # noqa: ANN201
    """(config, transformers' (tower, embedder) by dtype, ours by dtype)."""
    clipped, standardize = TOWER_CASES[request.param]
    tf_config = tower_tf_config(clipped, standardize)
    tf_tower = Gemma4VisionModel(tf_config).double()
    tf_embed = Gemma4MultimodalEmbedder(tf_config, Gemma4TextConfig(hidden_size=TEXT_WIDTH)).double()
    redraw(tf_tower, 1, draw)
    redraw(tf_embed, 2, draw)
    config = our_config(tf_config, "gemma4")
    (tower32, tower64), (embed32, embed64) = tf_pair(tf_tower), tf_pair(tf_embed)
    theirs = {torch.float32: (tower32, embed32), torch.float64: (tower64, embed64)}
    mine = {dtype: (ours(VisionTower, config, t.state_dict()), ours(VisionEmbedder, config, e.state_dict()))
            for dtype, (t, e) in theirs.items()}
    return config, theirs, mine


@torch.no_grad()
@pytest.mark.parametrize("grid", GRIDS, ids=[f"{c}x{r}" for c, r in GRIDS])
def test_tower_matches_transformers(towers, grid: tuple[int, int],  # noqa: ANN001
                                    request: pytest.FixtureRequest) -> None:
    config, theirs, mine = towers
    pixels, positions = image(*grid, 3 * config.patch_size**2, seed=grid[0])
    got = {}
    for dtype, (tower, embed) in mine.items():
        pooled = tower(pixels, positions)
        got[dtype] = pooled, embed(pooled)
    m = pixels.shape[0] // config.pooling_kernel_size**2
    assert {v.shape for pair in got.values() for v in pair} == {(m, config.hidden_size), (m, TEXT_WIDTH)}
    assert all(v.dtype == dtype for dtype, pair in got.items() for v in pair)
    for pad in (0, PAD):
        tf_input = batch_of_one(pixels, positions, pad)
        want = {}
        for dtype, (tower, embed) in theirs.items():
            pooled = tower(pixel_values=tf_input[0], pixel_position_ids=tf_input[1]).last_hidden_state  # (M, W)
            want[dtype] = pooled, embed(pooled)
        case = f"{request.node.callspec.id}-pad{pad}"
        for i, what in enumerate(("vision tower", "embed_vision")):
            check(what, case, {d: v[i] for d, v in got.items()}, {d: v[i] for d, v in want.items()},
                  depth=config.num_layers + i)


@torch.no_grad()
def test_bf16_equals_transformers(towers) -> None:  # noqa: ANN001
    """bfloat16: the same torch operations in the same order and dtypes as transformers' default (sdpa) run give
    the same bits. The one check of the casts: the float tests cannot see the mean's rounding to the weights' dtype
    before the fp32 scale; leaving it out changes 27 of the 96 values of the clipped 6x4 case."""
    config, theirs, _ = towers
    tf_tower, tf_embed = (copy.deepcopy(m).bfloat16() for m in theirs[torch.float32])
    tf_tower.set_attn_implementation("sdpa")
    rope = tf_tower.encoder.rotary_emb  # its frequencies stay fp32, as from_pretrained(dtype=bfloat16) leaves them
    rope.inv_freq = rope.compute_axial_rope_parameters(rope.config)[0]
    tower, embed = ours(VisionTower, config, tf_tower.state_dict()), ours(VisionEmbedder, config, tf_embed.state_dict())
    for grid in GRIDS:
        pixels, positions = image(*grid, 3 * config.patch_size**2, seed=grid[0])
        want = tf_tower(pixel_values=pixels[None], pixel_position_ids=positions[None]).last_hidden_state
        got = tower(pixels, positions)
        assert got.dtype == torch.bfloat16 and torch.equal(got, want)
        assert torch.equal(embed(got), tf_embed(want))


@torch.no_grad()
@pytest.mark.parametrize("towers", ["clipped-standardized"], indirect=True)
def test_clip_bounds_cut(towers) -> None:  # noqa: ANN001
    """The clipped case's bounds change the output: the parity above covers clamping, not only its absence."""
    config, _, mine = towers
    tower = mine[torch.float64][0]
    unclipped = copy.deepcopy(tower)
    for name, buffer in unclipped.named_buffers():
        buffer.fill_(float("inf") if name.endswith("max") else float("-inf"))
    pixels, positions = image(*GRIDS[0], 3 * config.patch_size**2, seed=0)
    assert (tower(pixels, positions) - unclipped(pixels, positions)).abs().max() > 1e-2


def test_weight_tables_match_transformers(towers) -> None:  # noqa: ANN001
    config, theirs, _ = towers
    tower, embed = theirs[torch.float64]
    assert weight_table(config) == {k: tuple(v.shape) for k, v in tower.state_dict().items()}
    assert embed_weight_table(config) == {k: tuple(v.shape) for k, v in embed.state_dict().items()}


# ---------------------------------------------------------------- the 12B's encoder-free embedder

def both_unified(config: VisionConfig, state: dict[str, torch.Tensor]) -> tuple[nn.Module, nn.Module]:
    embedder, projection = split_unified(state)
    return ours(UnifiedEmbedder, config, embedder), ours(VisionEmbedder, config, projection)


@pytest.fixture(scope="module")
def unified():  # noqa: ANN201
    """(config, transformers' embedder by dtype, ours (embedder, embed_vision) by dtype)."""
    tf_config = unified_tf_config()
    tf_model = Gemma4UnifiedVisionEmbedder(tf_config, Gemma4UnifiedTextConfig(hidden_size=TEXT_WIDTH)).double()
    redraw(tf_model, 3, draw)
    config = our_config(tf_config, "gemma4_unified")
    fp32, fp64 = tf_pair(tf_model)
    theirs = {torch.float32: fp32, torch.float64: fp64}
    mine = {dtype: both_unified(config, m.state_dict()) for dtype, m in theirs.items()}
    return config, theirs, mine


@torch.no_grad()
@pytest.mark.parametrize("grid", MERGED_GRIDS, ids=[f"{c}x{r}" for c, r in MERGED_GRIDS])
def test_unified_matches_transformers(unified, grid: tuple[int, int]) -> None:  # noqa: ANN001
    config, theirs, mine = unified
    k_p = config.patch_size * config.pooling_kernel_size
    pixels, positions = image(*grid, 3 * k_p**2, seed=grid[0])
    got = {}
    for dtype, (embedder, embed) in mine.items():
        h = embedder(pixels, positions)
        got[dtype] = h, embed(h)
    for pad in (0, 3):  # no pooling here: any number of padding rows
        pv, pos = batch_of_one(pixels, positions, pad)
        keep = (pos[0] != -1).all(dim=-1)  # (N + pad,)
        want = {}
        for dtype, model in theirs.items():
            out = model(pv, pos)
            want[dtype] = out.last_hidden_state[0, keep], out.pooler_output[0, keep]
        for i, what in enumerate(("unified embedder", "unified embed_vision")):
            check(what, f"{grid[0]}x{grid[1]}-pad{pad}", {d: v[i] for d, v in got.items()},
                  {d: v[i] for d, v in want.items()}, depth=1 + i)


@torch.no_grad()
def test_unified_bf16_equals_transformers(unified) -> None:  # noqa: ANN001
    config, theirs, _ = unified
    tf_model = copy.deepcopy(theirs[torch.float32]).bfloat16()
    embedder, embed = both_unified(config, tf_model.state_dict())
    for grid in MERGED_GRIDS:
        pixels, positions = image(*grid, 3 * (config.patch_size * config.pooling_kernel_size) ** 2, seed=grid[0])
        out = tf_model(pixels[None], positions[None])
        h = embedder(pixels, positions)
        assert h.dtype == torch.bfloat16 and torch.equal(h, out.last_hidden_state[0])
        assert torch.equal(embed(h), out.pooler_output[0])


def test_unified_weight_table_matches_transformers(unified) -> None:  # noqa: ANN001
    config, theirs, _ = unified
    embedder, projection = split_unified({k: tuple(v.shape) for k, v in theirs[torch.float64].state_dict().items()})
    assert unified_weight_table(config) == embedder
    assert embed_weight_table(config) == projection
