"""Audio prompts against transformers 5.22.2 on tiny audio checkpoints it wrote (tests/checkpoints.py `audio=True`):
the E2B family (a conformer tower and embed_audio) and the 12B (its 640-sample frame embedder), each with two clips
of different lengths between text, and with a clip and an image (`images=True` too), the clip before the image.

- The prompt ids are transformers' processor's: Gemma4Processor / Gemma4UnifiedProcessor on the same tokenizer file
  write boa, n audio ids and eoa for each clip, as ours does from one boa id (the 12B with an image excepted: its
  image processor needs torchvision, as in tests/parity/test_images.py).
- Greedy tokens, plain and speculative (a drafter from `write_assistant`, a prefill chunk that ends inside a clip),
  equal transformers' `generate(input_ids, input_features=..., input_features_mask=...)` for 16 tokens, in float64
  (no near tie can flip an argmax). transformers gets the features of its own feature extractor
  (Gemma4AudioFeatureExtractor's log-mel frames; Gemma4UnifiedAudioFeatureExtractor's 640-sample frames, what the
  12B's `get_audio_features` embeds) on the same samples, ours are ours: the whole path from samples to tokens on
  both sides. Our first clip's vectors in reversed order give other tokens: the test sees a misplaced clip.
- Logits of each prompt within the float64 bound (tests/tolerance.py): here transformers gets our features (our
  log-mel with its frame mask; the 12B's frames are bit for bit its own), so that the four runs see one input;
  our features are held to its extractor in tests/parity/test_audio_features.py. transformers runs float64 with two
  edits (tests/tf_oracle.py): eager attention in its audio tower, which refuses sdpa, and that attention's fp32
  casts removed, without which it fails in float64.
- Audio is causal: transformers marks audio ids 3 in `mm_token_type_ids`, which no both-ways block takes. A clip
  marked both ways on our side is far from its logits, so the parity above holds the causal rule.
The 12B with an image builds its masks as its `create_masks_for_generate` does (both ways on sliding layers only),
as tests/parity/test_images.py explains.
"""

from pathlib import Path

import pytest
import torch
from transformers import PreTrainedTokenizerFast
from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil
from transformers.models.gemma4.processing_gemma4 import Gemma4Processor
from transformers.models.gemma4_unified import modeling_gemma4_unified as unified
from transformers.models.gemma4_unified.feature_extraction_gemma4_unified import Gemma4UnifiedAudioFeatureExtractor
from transformers.models.gemma4_unified.processing_gemma4_unified import Gemma4UnifiedProcessor
from transformers.processing_utils import ProcessorMixin

from gemma4 import load_target
from gemma4.audio.features import frames, log_mel
from gemma4.audio.loading import Audio, load_audio
from gemma4.audio.prompt import PromptAudio
from gemma4.audio.prompt import expand as expand_audio
from gemma4.engine.media import Media, Span, joined
from gemma4.tokenizer import Gemma4Tokenizer
from gemma4.vision.loading import Vision, load_vision
from gemma4.vision.processor import process
from gemma4.vision.prompt import PromptImages
from gemma4.vision.prompt import expand as expand_images
from mtp import DraftLength, load_drafter
from tests.checkpoints import IMAGE_PATCH, IMAGE_SOFT_TOKENS, STOP_IDS, picture, write_assistant, write_target
from tests.tf_oracle import tf_target
from tests.tokenizer_fixture import write_tokenizer
from tests.tolerance import assert_fp32_parity
from gemma4.engine import generate_one
from mtp.engine import speculative_one
from gemma4.engine.forward import forward_rows

NEW = 16


def clip(samples: int, seed: int) -> torch.Tensor:
    """(N,) float32 samples at 16 kHz: a 440 Hz tone under noise."""
    t = torch.arange(samples) / 16_000
    noise = torch.randn(samples, generator=torch.Generator().manual_seed(seed))
    return (0.3 * torch.sin(2 * torch.pi * 440 * t) + 0.1 * noise).float()


# case -> (the checkpoint's shape, whether it holds an image, the text as transformers' processor takes it; ours
# marks each place with one boa or boi id: `ours_text`)
CASES = {
    "e2b": ("e2b", False, "<bos>Listen: <|audio|> and <|audio|> then say."),
    "12b": ("12b", False, "<bos>Listen: <|audio|> and <|audio|> then say."),
    "e2b+image": ("e2b", True, "<bos>Hear <|audio|> see <|image|> then say."),
    "12b+image": ("12b", True, "<bos>Hear <|audio|> see <|image|> then say."),
}
CLIPS = {False: [clip(8000, 1), clip(5000, 2)], True: [clip(8000, 1)]}  # 13 and 8 soft tokens; 13
PICTURE = picture(64, 64, 3)  # 64 soft tokens


def ours_text(text: str) -> str:
    return text.replace("<|audio|>", "<|audio>").replace("<|image|>", "<|image>")


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokenizer(tmp_path_factory.mktemp("tokenizer"), media=True)


@pytest.fixture(scope="module", params=list(CASES))
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    shape, image, _ = CASES[request.param]
    return request.param, write_target(tmp_path_factory.mktemp(request.param), shape, images=image, audio=True)


def prompt(name: str, path: Path, dtype: torch.dtype, tokenizer_file: Path
           ) -> tuple[list[int], PromptImages | None, PromptAudio, Audio, Vision | None]:
    """Our prompt ids and media: each image's ids expanded, then each clip's, both placed on the final ids (a clip
    before an image moves it)."""
    _, image, text = CASES[name]
    audio = load_audio(path, dtype=dtype)
    vision = load_vision(path, dtype=dtype) if image else None
    ids = Gemma4Tokenizer(tokenizer_file).encode(ours_text(text))
    pictures = [vision.read(PICTURE)] if image else []
    clips = [audio.read(c) for c in CLIPS[image]]
    if pictures:
        ids = expand_images(ids, [len(v) for v in pictures], vision.tokens)
    ids = expand_audio(ids, [len(v) for v in clips], audio.tokens)
    images = PromptImages([ids], [pictures], vision.tokens) if pictures else None
    return ids, images, PromptAudio([ids], [clips], audio.tokens), audio, vision


def tf_media(name: str, ids: list[int], audio: Audio, vision: Vision | None, features: str) -> dict:
    """What transformers takes beside the ids: mm_token_type_ids (1 image, 3 audio, as its processor writes them),
    the pixels (as in tests/parity/test_images.py), and the clips' features, batched with their frame masks:
    `features` "transformers" (its feature extractor's) or "ours"."""
    x = torch.tensor([ids])
    out = dict(mm_token_type_ids=(x == audio.tokens.soft).long() * 3)
    clips = CLIPS[CASES[name][1]]
    if features == "transformers":
        extractor = Gemma4UnifiedAudioFeatureExtractor() if audio.config.unified else Gemma4AudioFeatureExtractor()
        theirs = extractor([c.numpy() for c in clips], return_tensors="pt")
        out |= dict(input_features=theirs["input_features"], input_features_mask=theirs["input_features_mask"])
    else:
        if audio.config.unified:
            pieces = [(f, torch.ones(len(f), dtype=torch.bool)) for f in (frames(c, audio.settings) for c in clips)]
        else:
            pieces = [(m.features, m.mask) for m in (log_mel(c, audio.settings) for c in clips)]
        n = max(len(f) for f, _ in pieces)  # padded as the extractor pads: zero frames, masked
        out |= dict(input_features=torch.stack([torch.cat([f, f.new_zeros(n - len(f), f.shape[1])])
                                                for f, _ in pieces]),
                    input_features_mask=torch.stack([torch.cat([m, m.new_zeros(n - len(m))]) for _, m in pieces]))
    if vision is not None:
        out["mm_token_type_ids"] += (x == vision.tokens.soft).long()
        if vision.config.unified:
            pixels = process(PICTURE, vision.processing)
            out |= dict(pixel_values=pixels.patches[None], image_position_ids=pixels.positions[None])
        else:
            patch, k = IMAGE_PATCH["encoder"]
            pil = Gemma4ImageProcessorPil(patch_size=patch, pooling_kernel_size=k, max_soft_tokens=IMAGE_SOFT_TOKENS)
            pixels = pil([PICTURE], return_tensors="pt")
            out |= dict(pixel_values=pixels["pixel_values"], image_position_ids=pixels["image_position_ids"])
    return out


def sliding_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The 12B's forward builds its masks as its `create_masks_for_generate` does (module doc)."""
    causal = unified.create_masks_for_generate

    def masks(block_sequence_ids: torch.Tensor | None = None, **kw) -> dict:  # noqa: ANN003
        return (unified.create_masks_for_vision_model(block_sequence_ids=block_sequence_ids, **kw)
                if block_sequence_ids is not None else causal(**kw))
    monkeypatch.setattr(unified, "create_masks_for_generate", masks)


@pytest.mark.parametrize("name", ["e2b", "12b", "e2b+image"])  # the 12B's image processor needs torchvision
def test_prompt_ids_are_the_processors(name: str, tmp_path: Path, tokenizer_file: Path) -> None:
    """transformers' processor on the same text, tokenizer and samples writes our ids, and the audio ids' types,
    the features and (E2B) the pixels that `tf_media` gives transformers below."""
    shape, image, _ = CASES[name]
    ids, _, _, audio, vision = prompt(name, write_target(tmp_path, shape, images=image, audio=True), torch.float32,
                                      tokenizer_file)
    tok = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_file), bos_token="<bos>", pad_token="<pad>",
                                  model_specific_special_tokens=dict(
                                      image_token="<|image|>", boi_token="<|image>", eoi_token="<image|>",
                                      audio_token="<|audio|>", boa_token="<|audio>", eoa_token="<audio|>"))
    patch, k = IMAGE_PATCH["encoder"]
    pil = Gemma4ImageProcessorPil(patch_size=patch, pooling_kernel_size=k, max_soft_tokens=IMAGE_SOFT_TOKENS)
    with pytest.MonkeyPatch.context() as m:  # no video processor: the class check would look one up in torchvision
        m.setattr(ProcessorMixin, "check_argument_for_proper_class", lambda self, name, arg: None)
        if audio.config.unified:
            processor = Gemma4UnifiedProcessor(Gemma4UnifiedAudioFeatureExtractor(), pil, tok, None)
        else:
            processor = Gemma4Processor(Gemma4AudioFeatureExtractor(), pil, tok, None)
    theirs = processor(text=[CASES[name][2]], audio=[c.numpy() for c in CLIPS[image]],
                       images=[[PICTURE]] if image else None, return_tensors="pt")
    assert theirs["input_ids"][0].tolist() == ids
    assert ids.count(audio.tokens.soft) == sum(len(audio.read(c)) for c in CLIPS[image])
    for key, value in tf_media(name, ids, audio, vision, "transformers").items():
        assert torch.equal(theirs[key], value), key


@torch.no_grad()
def test_audio_prompt_logits_match_transformers(case, tokenizer_file: Path) -> None:  # noqa: ANN001
    name, path = case
    got = {}
    for dtype in (torch.float32, torch.float64):
        ids, images, audio_media, audio, vision = prompt(name, path, dtype, tokenizer_file)
        media = joined(images, audio_media)
        ours = load_target(path, dtype=dtype, fast=False)
        mine = forward_rows(ours, torch.tensor([ids]), soft=media.soft([0], len(ids), torch.device("cpu"))).logits[0]
        tf = tf_target(path, dtype=dtype)
        x = torch.tensor([ids])
        extra = tf_media(name, ids, audio, vision, "ours")
        extra["input_features"] = extra["input_features"].to(dtype)
        masks = type(tf).create_masks_for_generate(tf.config, torch.empty((1, len(ids), 0), dtype=dtype),
                                                   torch.ones_like(x), None, torch.arange(len(ids))[None],
                                                   mm_token_type_ids=extra["mm_token_type_ids"])
        got[dtype] = mine, tf(input_ids=x, attention_mask=masks, **extra).logits[0]
    (ours32, theirs32), (ours64, theirs64) = got[torch.float32], got[torch.float64]
    assert_fp32_parity("audio prompt", name, ours32, theirs32, ours64, theirs64, ours.config.num_layers)


@torch.no_grad()
@pytest.mark.parametrize("shape", ["e2b", "12b"])
def test_a_clip_seen_both_ways_is_far_from_transformers(shape: str, tmp_path: Path, tokenizer_file: Path) -> None:
    """The same float64 logits with each clip's span marked both ways (as an image's where the config asks): far
    off, while causal is within 1e-9 (above)."""
    path = write_target(tmp_path, shape, audio=True)
    ids, _, audio_media, audio, _ = prompt(shape, path, torch.float64, tokenizer_file)
    both = Media([[Span(s.start, s.vectors, True) for s in audio_media.rows[0]]])
    x = torch.tensor([ids])
    extra = tf_media(shape, ids, audio, None, "ours")
    extra["input_features"] = extra["input_features"].double()
    theirs = tf_target(path, dtype=torch.float64)(input_ids=x, **extra).logits[0]
    ours = load_target(path, dtype=torch.float64, fast=False)
    for media, far in ((audio_media, False), (both, True)):
        mine = forward_rows(ours, x, soft=media.soft([0], len(ids), torch.device("cpu"))).logits[0]
        error = float((mine - theirs).abs().max())
        assert error > 1e-2 if far else error < 1e-9 * float(theirs.abs().max())


@torch.no_grad()
def test_greedy_tokens_equal_transformers_generate(case, tmp_path: Path, tokenizer_file: Path,  # noqa: ANN001
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain and speculative (prefill chunks of 7: the first clip's ids split between two forwards) in float64, 16
    tokens each, equal transformers' `generate` given its own extractor's features (module doc); and a clip's
    vectors in reversed order of positions give other tokens."""
    name, path = case
    if name == "12b+image":
        sliding_only(monkeypatch)
    ids, images, audio_media, audio, vision = prompt(name, path, torch.float64, tokenizer_file)
    ours = load_target(path, dtype=torch.float64, fast=False)
    mine = generate_one(ours, ids, NEW, None, STOP_IDS, images=images, audio=audio_media)
    x = torch.tensor([ids])
    extra = tf_media(name, ids, audio, vision, "transformers")
    extra["input_features"] = extra["input_features"].double()
    out = tf_target(path, dtype=torch.float64).generate(input_ids=x, attention_mask=torch.ones_like(x),
                                                        max_new_tokens=NEW, do_sample=False, **extra)
    assert out[0, len(ids):].tolist() == mine and len(mine) == NEW
    drafter = load_drafter(write_assistant(tmp_path / "a", path, ordered_embeddings=CASES[name][0] == "e2b",
                                           echo=True, seed=2), dtype=torch.float64)
    spec = speculative_one(ours, drafter, ids, NEW, DraftLength(3), STOP_IDS, images=images, audio=audio_media,
                                prefill_chunk=7)
    assert spec.tokens == mine
    first = audio_media.rows[0][0]
    assert any(first.start < end < first.end for end in range(7, len(ids), 7))  # a chunk ends inside the clip
    clips = [s.vectors.flip(0) if s is first else s.vectors for s in audio_media.rows[0]]
    reversed_first = PromptAudio([ids], [clips], audio.tokens)
    assert generate_one(ours, ids, NEW, None, STOP_IDS, images=images, audio=reversed_first) != mine
