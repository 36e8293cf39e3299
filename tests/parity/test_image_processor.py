"""gemma4/vision/processor.py against transformers 5.22.2's Gemma 4 image processors, on images drawn here with
Pillow (seeded noise and gradients; some written to PNG/JPEG and read back): the PIL processor
(`Gemma4ImageProcessorPil`) for the encoder families, transformers' own `patches_merge` for the 12B. Plus the
size rule over a sweep of sizes, the refusals, and reading the processor config files."""

import ast
import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import transformers
from PIL import Image
from transformers.models.gemma4.image_processing_pil_gemma4 import (Gemma4ImageProcessorPil,
                                                                   get_aspect_ratio_preserving_size)

from gemma4.config import ConfigError
from gemma4.vision.processor import (SOFT_TOKEN_CHOICES, ImageError, ImageProcessing, image_size, open_image,
                                     process, processing_config)

# Both sides resize with the same Pillow call on the same bytes and rescale in float64 before rounding to
# float32, so the pixels are equal bit for bit (measured: max difference 0.0 on every case below). Any
# difference would be a step done differently, not rounding noise.
PIXEL_TOLERANCE = 0.0
BUDGETS = (70, 280)  # the smallest budget and the releases' default
UNIFIED_SOURCE = Path(transformers.__file__).parent / "models/gemma4_unified/image_processing_gemma4_unified.py"


def noise(height: int, width: int, mode: str, seed: int) -> Image.Image:
    """Seeded random bytes as an image of `mode` (noise is where resampling differences would show)."""
    bands = len(Image.new(mode, (1, 1)).getbands())
    data = torch.randint(0, 256, (height * width * bands,), dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(seed))
    return Image.frombytes(mode, (width, height), bytes(data.tolist()))


def gradient(height: int, width: int, seed: int) -> Image.Image:
    """An RGB ramp across the image with a little noise on top: smooth regions as photos have."""
    y = torch.linspace(0, 1, height)[:, None, None]  # (H, 1, 1)
    x = torch.linspace(0, 1, width)[None, :, None]  # (1, W, 1)
    ramp = torch.cat([x.expand(height, width, 1), y.expand(height, width, 1), (x + y).expand(height, width, 1) / 2],
                     dim=-1)  # (H, W, 3)
    jitter = torch.rand(height, width, 3, generator=torch.Generator().manual_seed(seed)) * 0.1  # (H, W, 3)
    data = ((ramp * 0.9 + jitter) * 255).round().clamp(0, 255).to(torch.uint8)
    return Image.frombytes("RGB", (width, height), bytes(data.flatten().tolist()))


def rgba(height: int, width: int, seed: int) -> Image.Image:
    """Noise colours under an alpha that runs from transparent (left) to opaque (right)."""
    image = noise(height, width, "RGB", seed).convert("RGBA")
    alpha = torch.linspace(0, 255, width).round().to(torch.uint8).repeat(height)  # (H*W,) row by row
    image.putalpha(Image.frombytes("L", (width, height), bytes(alpha.tolist())))
    return image


def palette(height: int, width: int, seed: int) -> Image.Image:
    """A 16-colour palette image whose colour 0 is transparent."""
    image = noise(height, width, "L", seed).point(lambda v: v // 16).convert("P")  # (H, W) indices 0..15
    image.putpalette(bytes(torch.randint(0, 256, (48,), generator=torch.Generator().manual_seed(seed)).tolist()))
    image.info["transparency"] = 0
    return image


# name -> (image, file format to write and read back through open_image, or None to use the image itself).
# Heights x widths: odd sizes both ways; thin ones whose short side rounds to 0 (transformers' edge branch:
# 2x1000 at both budgets, 700x3 at 70; 700x3 at 280 keeps one 48 px column by the ordinary rule); 336x480,
# which 70 soft tokens take without resizing.
CASES: dict[str, tuple[Callable[[], Image.Image], str | None]] = {
    "rgb-37x91": (lambda: noise(37, 91, "RGB", 1), None),
    "rgb-523x311-jpeg": (lambda: gradient(523, 311, 2), "JPEG"),
    "rgb-2x1000": (lambda: noise(2, 1000, "RGB", 3), None),
    "rgb-700x3": (lambda: noise(700, 3, "RGB", 4), None),
    "rgb-336x480-exact": (lambda: gradient(336, 480, 5), None),
    "grey-120x200-png": (lambda: noise(120, 200, "L", 6), "PNG"),
    "rgba-90x64-png": (lambda: rgba(90, 64, 7), "PNG"),
    "palette-64x80-png": (lambda: palette(64, 80, 8), "PNG"),
}


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Image.Image, Image.Image]]:
    """name -> (ours, theirs): the image as open_image reads it, and as Pillow alone decodes the same file (so
    open_image losing anything, e.g. a palette's transparency, shows as a difference)."""
    folder = tmp_path_factory.mktemp("images")
    out = {}
    for name, (make, fmt) in CASES.items():
        image = make()
        if fmt is None:
            out[name] = (image, image)
            continue
        path = folder / f"{name}.{fmt.lower()}"
        image.save(path, format=fmt)
        out[name] = (open_image(path), Image.open(path))
    return out


def transformers_functions() -> dict:
    """transformers' own `convert_image_to_patches` and `patches_merge` of the 12B's processor. That module
    imports torchvision, which is not installed here, so its source is parsed with `ast` and just these two
    function definitions are executed, in a namespace holding torch and math: this runs transformers' code
    unchanged, it is not a mock."""
    tree = ast.parse(UNIFIED_SOURCE.read_text())
    wanted = {"convert_image_to_patches", "patches_merge"}
    defs = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in wanted]
    assert {d.name for d in defs} == wanted, f"{UNIFIED_SOURCE} no longer defines {wanted}"
    namespace = {"torch": torch, "math": math}
    exec(compile(ast.Module(body=defs, type_ignores=[]), str(UNIFIED_SOURCE), "exec"), namespace)
    return namespace


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("name", CASES)
def test_matches_transformers_pil(images: dict, name: str, budget: int) -> None:
    ours_image, their_image = images[name]
    ours = process(ours_image, ImageProcessing(), max_soft_tokens=budget)
    theirs = Gemma4ImageProcessorPil()(images=[their_image], max_soft_tokens=budget, return_tensors="pt")
    n = len(ours.patches)
    their_patches, their_positions = theirs["pixel_values"][0], theirs["image_position_ids"][0]
    # transformers pads every image to max_patches rows at position (-1, -1); ours has no padding.
    assert ours.soft_tokens == int(theirs["num_soft_tokens_per_image"][0])
    assert ours.positions.dtype == torch.long and torch.equal(ours.positions, their_positions[:n])
    assert bool((their_positions[n:] == -1).all()) and bool((their_patches[n:] == 0).all())
    assert ours.patches.dtype == torch.float32 and ours.patches.shape == their_patches[:n].shape
    assert float((ours.patches - their_patches[:n]).abs().max()) <= PIXEL_TOLERANCE


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("name", ["rgb-523x311-jpeg", "rgb-2x1000", "rgb-700x3", "rgba-90x64-png"])
def test_merge_matches_transformers_unified(images: dict, name: str, budget: int) -> None:
    """The 12B: the same resized pixels (transformers' PIL steps) cut into 16 px patches and merged k x k by
    transformers' unified processor's own functions, in the order its `_preprocess` calls them."""
    ours_image, their_image = images[name]
    ours = process(ours_image, ImageProcessing(merge=True), max_soft_tokens=budget)
    tf, fns = Gemma4ImageProcessorPil(), transformers_functions()
    p, k = tf.patch_size, tf.pooling_kernel_size
    pixels = tf.process_image(their_image, do_convert_rgb=True)  # (3, H, W) uint8
    pixels = tf.aspect_ratio_preserving_resize(pixels, p, budget * k**2, k, tf.resample)
    pixels = torch.from_numpy(tf.rescale(pixels, tf.rescale_factor))  # (3, H', W') float32
    teacher = fns["convert_image_to_patches"](pixels, p)  # (N, p*p*3)
    rows, cols = pixels.shape[-2] // p, pixels.shape[-1] // p
    grid = torch.meshgrid(torch.arange(cols), torch.arange(rows), indexing="xy")  # as its _preprocess
    teacher_positions = torch.stack(grid, dim=-1).reshape(len(teacher), 2)  # (N, 2) (x, y)
    merged, positions = fns["patches_merge"](teacher[None], teacher_positions[None], len(teacher) // k**2)
    assert ours.soft_tokens == merged.shape[1] == len(teacher) // k**2
    assert torch.equal(ours.positions, positions[0])
    assert torch.equal(ours.patches, merged[0])  # a rearrangement of the same floats: exact


def test_image_size_matches_transformers_rule() -> None:
    """Every budget over a sweep of sizes from 1 px to thin and huge, the rounding edges included."""
    sides = [1, 2, 3, 5, 16, 47, 48, 49, 95, 96, 97, 223, 336, 480, 511, 1000, 1023, 1920, 4032, 9999]
    for budget in SOFT_TOKEN_CHOICES:
        for height in sides:
            for width in sides:
                want = get_aspect_ratio_preserving_size(height, width, 16, budget * 9, 3)
                assert image_size(height, width, 16, budget * 9, 3) == want, (height, width, budget)


def test_refusals(tmp_path: Path) -> None:
    image = noise(20, 30, "RGB", 9)
    with pytest.raises(ImageError, match="max_soft_tokens=100"):
        process(image, ImageProcessing(), max_soft_tokens=100)
    garbage = tmp_path / "photo.png"
    garbage.write_bytes(bytes(torch.randint(0, 256, (512,), generator=torch.Generator().manual_seed(0)).tolist()))
    truncated = tmp_path / "cut.png"
    noise(64, 64, "RGB", 10).save(truncated)
    truncated.write_bytes(truncated.read_bytes()[:2000])
    for path in (garbage, truncated, tmp_path / "missing.jpg", tmp_path):
        with pytest.raises(ImageError) as error:
            open_image(path)
        assert str(path) in str(error.value) and "\n" not in str(error.value)


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data))


def test_processing_config(tmp_path: Path) -> None:
    assert processing_config(tmp_path, unified=False) == ImageProcessing()
    assert processing_config(tmp_path, unified=True) == ImageProcessing(merge=True)
    released = {"do_convert_rgb": True, "do_normalize": False, "do_rescale": True, "do_resize": True,
                "image_mean": [0.0, 0.0, 0.0], "image_std": [1.0, 1.0, 1.0], "max_soft_tokens": 140,
                "patch_size": 16, "pooling_kernel_size": 3, "resample": 3, "rescale_factor": 1 / 255}
    write_json(tmp_path / "preprocessor_config.json", released)
    assert processing_config(tmp_path, unified=False) == ImageProcessing(max_soft_tokens=140)
    # processor_config.json without an "image_processor" object leaves the decision to preprocessor_config.json.
    write_json(tmp_path / "processor_config.json", {"image_seq_length": 280})
    assert processing_config(tmp_path, unified=False).max_soft_tokens == 140
    write_json(tmp_path / "processor_config.json", {"image_processor": {**released, "max_soft_tokens": 560}})
    assert processing_config(tmp_path, unified=True) == ImageProcessing(max_soft_tokens=560, merge=True)
    # do_normalize with mean 0 and std 1 is the identity; anything else is refused, as are the other switches.
    for changed in ({"do_normalize": True}, {"pooling_kernel_size": 2, "patch_size": 14}):
        write_json(tmp_path / "processor_config.json", {"image_processor": {**released, **changed}})
        processing_config(tmp_path, unified=False)
    for bad in ({"do_normalize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]},
                {"do_resize": False}, {"do_rescale": False}, {"resample": 2}, {"max_soft_tokens": 100}):
        write_json(tmp_path / "processor_config.json", {"image_processor": {**released, **bad}})
        with pytest.raises(ConfigError, match=next(iter(bad))):
            processing_config(tmp_path, unified=False)
