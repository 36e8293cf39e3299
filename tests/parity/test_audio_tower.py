"""The audio side (gemma4/audio/tower.py, attention.py, embedder.py, loading.py) against transformers 5.22.2's own
modules (`Gemma4AudioModel` + `Gemma4MultimodalEmbedder`, `Gemma4UnifiedMultimodalEmbedder`) on tiny seeded configs,
and `load_audio` end to end on tiny checkpoints transformers wrote (tests/checkpoints.py `audio=True`).

Every parameter and buffer is redrawn so that nothing sits at its identity (norm weights U(0.5, 1.5), projections
N(0, 1/fan_in), per_dim_scale N(0, 0.25), clip bounds of about +-1.5 that cut) and rounded through float32. The
module config takes rms_norm_eps 1e-5, not the releases' 1e-6, so a norm given the wrong eps shows. Clips run from
1 to 250 frames: positions not a multiple of 4 frames nor of the 12-position block, and up to 6 blocks. Checks:
float64 within 1e-10 of transformers' float64 run, float32 within tests/tolerance.py's bound of it, bfloat16 equal
bit for bit. transformers' float64 run needs two edits: its attention casts q, k, v to fp32 (and then fails in float64,
where softplus(per_dim_scale) is float64), so `audio_attention_in_dtype` (tests/tf_oracle.py) drops the casts; and its audio tower refuses the
sdpa that `tf_target` asks for in float64, so `tf_model` loads it with eager attention.
"""

import copy
import math
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import Gemma4ForConditionalGeneration
from transformers.models.gemma4.configuration_gemma4 import Gemma4AudioConfig, Gemma4Config, Gemma4TextConfig
from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
from transformers.models.gemma4.modeling_gemma4 import Gemma4AudioAttention, Gemma4AudioModel, Gemma4MultimodalEmbedder
from transformers.models.gemma4_unified.configuration_gemma4_unified import (
    Gemma4UnifiedAudioConfig, Gemma4UnifiedConfig, Gemma4UnifiedTextConfig,
)
from transformers.models.gemma4_unified.feature_extraction_gemma4_unified import Gemma4UnifiedAudioFeatureExtractor
from transformers.models.gemma4_unified.modeling_gemma4_unified import Gemma4UnifiedMultimodalEmbedder

from gemma4.audio.config import AudioConfig, AudioTokens, audio_config, audio_tokens
from gemma4.audio.features import frames, log_mel
from gemma4.audio.embedder import AudioEmbedder, embed_weight_table
from gemma4.audio.loading import load_audio
from gemma4.audio.tower import AudioTower, weight_table
from gemma4.audio.wav import AudioError
from gemma4.config import ConfigError
from tests.checkpoints import MEDIA_IDS, write_target
from tests.parity.towers import SAME_MATH_ABS, Normal, Uniform, check, ours, redraw
from tests.tf_oracle import _float64_throughout, audio_attention_in_dtype, tf_target

TEXT_WIDTH = 40  # E
FRAMES = [1, 5, 37, 98, 250]  # valid log-mel frames -> 1, 2, 10, 25 (3 blocks), 63 (6 blocks) positions
# 38 valid frames padded to 41: 19 positions after the first conv, the last masked one (from frames 37-39) read by
# the second conv. Only transformers' mask (or cutting the frames) keeps frame 37 out of the 10th vector.
MASKED = (38, 41)
SAMPLES = [1000, 12_345, 40_100]  # end to end: 40,100 samples give 251 frames of which 250 are valid (the case above)


def tower_tf_config() -> Gemma4AudioConfig:
    return Gemma4AudioConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             subsampling_conv_channels=[128, 8], output_proj_dims=24, rms_norm_eps=1e-5)


def our_config(tf_config: Gemma4AudioConfig | Gemma4UnifiedAudioConfig, model_type: str) -> AudioConfig:
    """Ours read from the same dict transformers was built from, through gemma4/audio/config.py."""
    return audio_config({"model_type": model_type, "audio_config": tf_config.to_dict(),
                         "text_config": {"hidden_size": TEXT_WIDTH}})


def draw(name: str, t: torch.Tensor, normal: Normal, uniform: Uniform) -> torch.Tensor:
    """The docstring's rule for one tensor of the audio side."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf in ("input_min", "output_min"):
        return -uniform(t.shape, 1.0, 2.0)  # normalised activations pass 1 often: the bounds cut
    if leaf in ("input_max", "output_max"):
        return uniform(t.shape, 1.0, 2.0)
    if "norm" in name and leaf == "weight":
        return uniform(t.shape, 0.5, 1.5)
    if leaf == "per_dim_scale":
        return 0.5 * normal(t.shape)
    if leaf == "bias":
        return 0.1 * normal(t.shape)
    return normal(t.shape) * t[0].numel() ** -0.5  # a projection (out, in) or a convolution (out, in / groups, *kernel)


def float64_audio(model: nn.Module) -> nn.Module:
    """A float64 transformers model computed in float64 (tests/tf_oracle.py's edits, and the attention's)."""
    for module in model.modules():
        if isinstance(module, Gemma4AudioAttention):
            audio_attention_in_dtype(module)
    return _float64_throughout(model.eval())


def tf_pair(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """model (float64, redrawn) -> (a float32 copy, itself computed in float64)."""
    return copy.deepcopy(model).float().eval(), float64_audio(model)


def features(count: int, seed: int) -> torch.Tensor:
    """(count, 128) float32 log-mel-like frames: ln(mel + 1e-3) of speech lies around -7 to 3."""
    return torch.randn(count, 128, generator=torch.Generator().manual_seed(seed)) * 2 - 3


# ---------------------------------------------------------------- the conformer tower and embed_audio

@pytest.fixture(scope="module")
def towers():  # noqa: ANN201
    """(config, transformers' (tower, embedder) by dtype, ours by dtype)."""
    tf_config = tower_tf_config()
    tf_tower = Gemma4AudioModel(tf_config).double()
    tf_embed = Gemma4MultimodalEmbedder(tf_config, Gemma4TextConfig(hidden_size=TEXT_WIDTH)).double()
    redraw(tf_tower, 1, draw)
    redraw(tf_embed, 2, draw)
    config = our_config(tf_config, "gemma4")
    (tower32, tower64), (embed32, embed64) = tf_pair(tf_tower), tf_pair(tf_embed)
    theirs = {torch.float32: (tower32, embed32), torch.float64: (tower64, embed64)}
    mine = {dtype: (ours(AudioTower, config, t.state_dict()), ours(AudioEmbedder, config, e.state_dict()))
            for dtype, (t, e) in theirs.items()}
    return config, theirs, mine


def run_tf(tower: nn.Module, embed: nn.Module, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A batch (B, F, 128) with its frame mask (B, F) -> the valid positions' (tower, embed_audio) rows, in order,
    as Gemma4Model fills the audio soft tokens (`pooler_output[attention_mask]`)."""
    out = tower(x.to(tower.output_proj.weight.dtype), mask)
    return out.last_hidden_state[out.attention_mask], embed(out.last_hidden_state)[out.attention_mask]


@torch.no_grad()
@pytest.mark.parametrize("count", FRAMES)
def test_tower_matches_transformers(towers, count: int) -> None:  # noqa: ANN001
    config, theirs, mine = towers
    x = features(count, seed=count)
    got = {dtype: (tower(x), embed(tower(x))) for dtype, (tower, embed) in mine.items()}
    positions = -(-(-(-count // 2)) // 2)  # ceil(ceil(F / 2) / 2)
    assert {v.shape for pair in got.values() for v in pair} == {(positions, 24), (positions, TEXT_WIDTH)}
    assert all(v.dtype == dtype for dtype, pair in got.items() for v in pair)
    want = {dtype: run_tf(*pair, x[None], torch.ones(1, count, dtype=torch.bool)) for dtype, pair in theirs.items()}
    for i, what in enumerate(("audio tower", "embed_audio")):
        check(what, f"{count} frames", {d: v[i] for d, v in got.items()}, {d: v[i] for d, v in want.items()},
              depth=config.num_layers + i)


@torch.no_grad()
def test_masked_frames_match_transformers(towers) -> None:  # noqa: ANN001
    """transformers' batch of two clips, the shorter padded with masked frames of noise: its valid positions are
    ours of each clip's valid frames alone. Cutting is what does it: the same frames with zeros in place of the
    masked ones (what the features hold there) differ at the last position."""
    config, theirs, mine = towers
    valid, total = MASKED
    long, short = features(98, seed=3), features(valid, seed=4)
    batch = torch.stack([long, torch.cat([short, features(98 - valid, seed=5)])])  # (2, 98, 128)
    mask = torch.arange(98)[None] < torch.tensor([[98], [valid]])  # (2, 98)
    got = {dtype: (torch.cat([tower(long), tower(short)]), embed(torch.cat([tower(long), tower(short)])))
           for dtype, (tower, embed) in mine.items()}
    want = {dtype: run_tf(*pair, batch, mask) for dtype, pair in theirs.items()}
    for i, what in enumerate(("audio tower", "embed_audio")):
        check(what, "masked frames", {d: v[i] for d, v in got.items()}, {d: v[i] for d, v in want.items()},
              depth=config.num_layers + i)
    tower = mine[torch.float64][0]
    zeros = torch.cat([short, short.new_zeros(total - valid, 128)])
    uncut = tower(zeros)[: len(tower(short))]
    assert (uncut[-1] - tower(short)[-1]).abs().max() > 1e-3
    torch.testing.assert_close(uncut[:-1], tower(short)[:-1], atol=SAME_MATH_ABS, rtol=0)


@torch.no_grad()
def test_bf16_equals_transformers(towers) -> None:  # noqa: ANN001
    """bfloat16: the same torch operations in the same order and dtypes as transformers give the same bits: the check
    of the casts (the sinusoids in bf16, the attention in fp32, the norms' fp32 and one rounding)."""
    config, theirs, _ = towers
    tf_tower, tf_embed = (copy.deepcopy(m).bfloat16() for m in theirs[torch.float32])
    tower, embed = ours(AudioTower, config, tf_tower.state_dict()), ours(AudioEmbedder, config, tf_embed.state_dict())
    for count in FRAMES:
        x = features(count, seed=count)
        want = run_tf(tf_tower, tf_embed, x[None], torch.ones(1, count, dtype=torch.bool))
        got = tower(x)
        assert got.dtype == torch.bfloat16 and torch.equal(got, want[0]) and torch.equal(embed(got), want[1])


@torch.no_grad()
def test_clip_bounds_cut(towers) -> None:  # noqa: ANN001
    """The bounds change the output: the parity above covers clamping, not only its absence."""
    _, _, mine = towers
    tower = mine[torch.float64][0]
    unclipped = copy.deepcopy(tower)
    for name, buffer in unclipped.named_buffers():
        buffer.fill_(float("inf") if name.endswith("max") else float("-inf"))
    x = features(98, seed=0)
    assert (tower(x) - unclipped(x)).abs().max() > 1e-2


def test_weight_tables_match_transformers(towers) -> None:  # noqa: ANN001
    config, theirs, _ = towers
    tower, embed = theirs[torch.float64]
    assert weight_table(config) == {k: tuple(v.shape) for k, v in tower.state_dict().items()}
    assert embed_weight_table(config) == {k: tuple(v.shape) for k, v in embed.state_dict().items()}


# ---------------------------------------------------------------- the 12B's frame embedder

@torch.no_grad()
def test_frame_embedder_matches_transformers() -> None:
    tf_config = Gemma4UnifiedAudioConfig()
    tf_model = Gemma4UnifiedMultimodalEmbedder(tf_config, Gemma4UnifiedTextConfig(hidden_size=TEXT_WIDTH)).double()
    redraw(tf_model, 6, draw)
    config = our_config(tf_config, "gemma4_unified")
    assert config.unified
    assert embed_weight_table(config) == {k: tuple(v.shape) for k, v in tf_model.state_dict().items()}
    fp32, fp64 = tf_pair(tf_model)
    theirs = {torch.float32: fp32, torch.float64: fp64}
    mine = {dtype: ours(AudioEmbedder, config, m.state_dict()) for dtype, m in theirs.items()}
    bf16 = copy.deepcopy(fp32).bfloat16()
    for n in (1, 640, 12_345):
        x = frames(torch.randn(n, generator=torch.Generator().manual_seed(n)) * 0.1)  # (ceil(n / 640), 640) float32
        check("frame embedder", f"{n} samples", {d: m(x) for d, m in mine.items()},
              {d: m(x[None])[0] for d, m in theirs.items()}, depth=1)
        assert torch.equal(ours(AudioEmbedder, config, bf16.state_dict())(x), bf16(x[None])[0])


# ---------------------------------------------------------------- config.json

def test_config_reads_transformers_defaults() -> None:
    assert audio_config(Gemma4Config(audio_config=None).to_dict()) is None  # 26B-A4B, 31B
    assert audio_config({"model_type": "gemma4_text", "hidden_size": 64}) is None
    full = audio_config(Gemma4Config(audio_config=Gemma4AudioConfig()).to_dict())
    assert (full.hidden_size, full.num_layers, full.num_heads, full.head_dim, full.subsampling_channels,
            full.chunk_size, full.context_left, full.logit_cap, full.invalid_logit, full.output_proj_dims,
            full.use_clipped_linears) == (1024, 12, 8, 128, (128, 32), 12, 13, 50.0, -1e9, 1536, True)
    # The size tower.py's docstring states: 24W² + (9 + k)W + W/H + 40 a layer, the subsampler, output_proj.
    w, (c0, c1), o = full.hidden_size, full.subsampling_channels, full.output_proj_dims
    per_layer = 24 * w**2 + (9 + full.conv_kernel_size) * w + w // full.num_heads + 40
    size = full.num_layers * per_layer + 10 * c0 + c1 * (9 * c0 + 1) + w * c0 // 4 * c1 + (w + 1) * o
    assert sum(math.prod(shape) for shape in weight_table(full).values()) == size == 304_825_088
    with torch.device("meta"):  # transformers' own tower at those defaults: its parameters and clip-bound buffers
        theirs = Gemma4AudioModel(Gemma4AudioConfig())
    assert sum(t.numel() for t in theirs.state_dict().values()) == size
    unified = audio_config(Gemma4UnifiedConfig(audio_config=Gemma4UnifiedAudioConfig()).to_dict())
    assert unified.unified and unified.output_proj_dims == 640
    assert audio_tokens(Gemma4Config().to_dict()) == AudioTokens(boa=256_000, soft=258_881, eoa=258_883)
    assert audio_tokens({"eoa_token_id": 1, "eoa_token_index": 7}).eoa == 7  # the index is the field transformers reads


@pytest.mark.parametrize("key, value", [("attention_context_right", 1), ("attention_context_left", 10),
                                        ("subsampling_conv_channels", [64, 32]), ("hidden_act", "gelu"),
                                        ("num_attention_heads", 5)])
def test_config_refuses_what_is_not_implemented(key: str, value: object) -> None:
    raw = Gemma4Config(audio_config=Gemma4AudioConfig()).to_dict()
    raw["audio_config"][key] = value
    with pytest.raises(ConfigError, match=key):
        audio_config(raw)


# ---------------------------------------------------------------- load_audio end to end

@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("audio")
    return {shape: write_target(root / shape, shape, audio=True) for shape in ("e2b", "12b")}


def tf_model(path: Path, dtype: torch.dtype) -> nn.Module:
    """The file as transformers loads it; eager attention (its audio tower refuses sdpa), float64 in float64."""
    if dtype == torch.float32:
        return tf_target(path, dtype)
    model = Gemma4ForConditionalGeneration.from_pretrained(path, dtype=dtype, attn_implementation="eager")
    return float64_audio(model)


def clip(samples: int) -> torch.Tensor:
    return torch.randn(samples, generator=torch.Generator().manual_seed(samples)) * 0.1  # (N,) float32


@torch.no_grad()
def test_load_audio_matches_transformers(checkpoints: dict[str, Path]) -> None:
    """Audio.encode of a clip = the rows transformers' Gemma4Model writes into the clip's soft tokens
    (`get_audio_features(...).pooler_output[attention_mask]`), given the same features: our features with their
    frame mask, masked frames included (gemma4/audio/features.py is held to transformers' extractor elsewhere)."""
    path = checkpoints["e2b"]
    audio = {dtype: load_audio(path, dtype=dtype) for dtype in (torch.float32, torch.float64)}
    theirs = {dtype: tf_model(path, dtype).model for dtype in audio}
    assert audio[torch.float32].tokens == AudioTokens(MEDIA_IDS["boa_token_id"], MEDIA_IDS["audio_token_id"],
                                                      MEDIA_IDS["eoa_token_index"])
    for n in SAMPLES:
        mel = log_mel(clip(n), audio[torch.float32].settings)
        tf_mask = Gemma4AudioFeatureExtractor()([clip(n).numpy()], return_tensors="pt")["input_features_mask"][0]
        got = {dtype: a.encode(clip(n)) for dtype, a in audio.items()}
        assert len(got[torch.float32]) == mel.soft_tokens == int(tf_mask[::2][::2].sum())
        want = {}
        for dtype, model in theirs.items():
            out = model.get_audio_features(mel.features[None].to(dtype), mel.mask[None])
            want[dtype] = out.pooler_output[out.attention_mask]
        check("load_audio e2b", f"{n} samples", got, want, depth=audio[torch.float32].config.num_layers + 1)
    # The file's finite bounds (tests/checkpoints.py: the first layer's) cut.
    tower = audio[torch.float64].encoder
    unclipped = copy.deepcopy(tower)
    for name, buffer in unclipped.named_buffers():
        buffer.fill_(float("inf") if name.endswith("max") else float("-inf"))
    x = log_mel(clip(SAMPLES[-1])).features[:250]
    assert (tower(x) - unclipped(x)).abs().max() > 1e-2


@torch.no_grad()
def test_load_audio_12b_matches_transformers(checkpoints: dict[str, Path]) -> None:
    path = checkpoints["12b"]
    audio = {dtype: load_audio(path, dtype=dtype) for dtype in (torch.float32, torch.float64)}
    theirs = {dtype: tf_target(path, dtype).model for dtype in audio}
    assert audio[torch.float32].encoder is None and audio[torch.float32].config.unified
    for n in SAMPLES:
        tf_input = Gemma4UnifiedAudioFeatureExtractor()([clip(n).numpy()], return_tensors="pt")
        got = {dtype: a.encode(clip(n)) for dtype, a in audio.items()}
        want = {}
        for dtype, model in theirs.items():
            out = model.get_audio_features(tf_input["input_features"], tf_input["input_features_mask"])
            want[dtype] = out.pooler_output[out.attention_mask]
        assert len(got[torch.float32]) == -(-n // 640)
        check("load_audio 12b", f"{n} samples", got, want, depth=1)


def test_load_audio_refuses_a_model_without_audio(tmp_path: Path) -> None:
    with pytest.raises(AudioError, match="no audio_config"):
        load_audio(write_target(tmp_path / "text", "mini"))
