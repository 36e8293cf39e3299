"""From a picture to the pixel patches the vision tower reads, as transformers 5.22.2's Gemma 4 image processors.

Facts a reader must know:
- One image at a time, no padding: transformers pads every image of a batch to max_patches rows with
  (-1, -1) positions; here an image is exactly its own patches.
- Transparency is composited onto white, grey is repeated into R, G and B (transformers' `convert_to_rgb`).
- The image is resized once, keeping its aspect ratio, to the largest size whose sides are multiples of
  k*p (48 px) and which holds at most max_soft_tokens * k**2 patches of p px (`image_size`). The filter is
  Pillow's BICUBIC, which antialiases when it shrinks (the PIL processor's `resize`). The 12B's transformers
  processor resizes with torchvision instead (antialiased bicubic on a uint8 tensor), which follows Pillow's
  filter but can round a pixel differently; this file uses Pillow for every model.
- Pixels are bytes / 255 in [0, 1], with no mean or std: Gemma 4 was trained on [0, 1] pixels.
- Patches are p x p squares (p = 16) taken row by row, each flattened channel last as (p, p, 3).
  Positions are (x, y) = (column, row) of the patch grid.
- The encoder families (E2B, E4B, 26B-A4B, 31B) take the N patches; the tower pools k x k of them, so the
  image becomes N / k**2 soft tokens. The 12B (gemma4_unified) has no tower: transformers merges each k x k
  group into one model patch (`patches_merge`), laid out as the (k*p, k*p, 3) square it covers, at position
  (x // k, y // k). That is exactly cutting the image into k*p px patches, which is how it is done here;
  each merged patch is one soft token.
- Pillow is imported inside the functions that need it: the text-only model runs without it.

Shape legend: H, W image height and width in px, p patch size, k pooling kernel, N patches.
"""

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from gemma4.config import ConfigError
from gemma4.config_file import processor_section
from gemma4.vision.prompt import ImageError

if TYPE_CHECKING:
    import PIL.Image

SOFT_TOKEN_CHOICES = (70, 140, 280, 560, 1120)  # the budgets the models were trained with
READABLE = "give a PNG, JPEG, WebP, GIF or BMP file"
BICUBIC = 3  # PIL.Image.Resampling.BICUBIC, the number processor configs store as "resample"


@dataclass(frozen=True)
class ImageProcessing:
    """What preprocessor_config.json / processor_config.json say about images."""
    patch_size: int = 16  # p
    pooling_kernel_size: int = 3  # k
    max_soft_tokens: int = 280  # the default budget of soft tokens per image, one of SOFT_TOKEN_CHOICES
    merge: bool = False  # the 12B (gemma4_unified): k x k patches merged into one model patch
    rescale_factor: float = 1 / 255


class Pixels(NamedTuple):
    patches: torch.Tensor  # (N, 3*p*p) float32 in [0, 1]; the 12B: (N, 3*(k*p)**2), N merged patches
    positions: torch.Tensor  # (N, 2) long (x, y) patch coordinates (merged coordinates for the 12B)
    soft_tokens: int  # vectors the image becomes = soft tokens in the prompt: N // k**2, or N when merged


def processing_config(model_dir: Path, unified: bool) -> ImageProcessing:
    """The image settings of a model directory. As transformers does, processor_config.json's "image_processor"
    object comes first, then preprocessor_config.json; with neither, the defaults (every release's values)."""
    raw = processor_section(model_dir, (("processor_config.json", "image_processor"), ("preprocessor_config.json", None)))
    # Refuse the switches that would change the pixels in ways not written here.
    for flag, want in (("do_resize", True), ("do_rescale", True), ("do_convert_rgb", True)):
        if raw.get(flag, want) is not want:
            raise ConfigError(f"image processor {flag}={raw[flag]!r}: only {flag}={want} is implemented")
    if raw.get("resample", BICUBIC) != BICUBIC:
        raise ConfigError(f"image processor resample={raw['resample']!r}: only bicubic ({BICUBIC}) is implemented")
    # do_normalize with mean 0 and std 1 is the identity (the releases save it so): only other values refuse.
    if raw.get("do_normalize", False) and (any(m != 0 for m in raw.get("image_mean", [0.0] * 3))
                                           or any(s != 1 for s in raw.get("image_std", [1.0] * 3))):
        raise ConfigError(f"image processor do_normalize with image_mean={raw.get('image_mean')} image_std="
                          f"{raw.get('image_std')}: only pixels in [0, 1] (mean 0, std 1) are implemented")
    config = ImageProcessing(patch_size=int(raw.get("patch_size", 16)),
                             pooling_kernel_size=int(raw.get("pooling_kernel_size", 3)),
                             max_soft_tokens=int(raw.get("max_soft_tokens", 280)), merge=unified,
                             rescale_factor=float(raw.get("rescale_factor", 1 / 255)))
    if config.max_soft_tokens not in SOFT_TOKEN_CHOICES:
        raise ConfigError(f"image processor max_soft_tokens={config.max_soft_tokens}: it must be one of "
                          f"{SOFT_TOKEN_CHOICES}")
    if config.patch_size < 1 or config.pooling_kernel_size < 1:
        raise ConfigError(f"image processor patch_size={config.patch_size}, pooling_kernel_size="
                          f"{config.pooling_kernel_size}: both must be positive")
    return config


def _pillow() -> tuple[Any, Any]:
    """(PIL.Image, PIL.ImageOps), or the ImageError that says how to install Pillow."""
    try:
        from PIL import Image, ImageOps
    except ImportError as e:
        raise ImageError('reading images needs Pillow: pip install -e ".[images]"') from e
    return Image, ImageOps


def open_image(path: str | Path) -> "PIL.Image.Image":
    """The decoded image at path, turned upright by its EXIF orientation (as transformers' `load_image`)."""
    Image, ImageOps = _pillow()
    if not Path(path).exists():
        raise ImageError(f"{path}: no such file: {READABLE}")
    try:
        with Image.open(path) as image:
            image.load()  # Image.open only reads the header: decode now, so a truncated file fails here
            # A camera stores a portrait photo sideways plus an orientation tag; viewers (and load_image) obey it.
            return ImageOps.exif_transpose(image)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise ImageError(f"{path} is not an image Pillow can read ({e}): {READABLE}") from e


def image_size(height: int, width: int, patch_size: int, max_patches: int, pooling_kernel_size: int) -> tuple[int, int]:
    """(height, width) to resize to: the image's aspect ratio, both sides multiples of k*p, at most max_patches
    p x p patches (transformers' `get_aspect_ratio_preserving_size`, the same float operations in the same order,
    so a side on the edge of a multiple rounds the same way)."""
    side = pooling_kernel_size * patch_size  # 48 px: a side holds whole k x k groups, so pooling/merging is exact
    # Scale the area to what max_patches patches cover, then round each side down to a multiple of `side`.
    # Rounding down keeps the area within the budget.
    scale = math.sqrt(max_patches * patch_size**2 / (height * width))
    new_height = math.floor(scale * height / side) * side
    new_width = math.floor(scale * width / side) * side
    if new_height == 0 and new_width == 0:
        raise ImageError(f"a {height}x{width} image with {max_patches} patches of {patch_size} px would have "
                         f"no pixels: give a larger max_soft_tokens")
    # A very thin image rounds its short side to 0: it becomes one row (or column) of k x k groups instead, as
    # long as the aspect ratio in whole multiples says, and at most max_patches / k**2 groups long.
    longest = (max_patches // pooling_kernel_size**2) * side  # (longest / side) groups, each k*k patches
    if new_height == 0:
        new_height, new_width = side, min(width // height * side, longest)
    elif new_width == 0:
        new_height, new_width = min(height // width * side, longest), side
    return new_height, new_width


def to_rgb(image: "PIL.Image.Image") -> "PIL.Image.Image":
    """RGB, with any transparency (an alpha band, or a palette's or grey image's transparent colour) composited
    onto white, as transformers' `convert_to_rgb`: a plain convert would show what the transparent pixels
    happen to store, often black."""
    Image, _ = _pillow()
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def patchify(pixels: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(3, H, W) -> patches (N, size*size*3), row-major over the grid and channel last inside a patch, and their
    (x, y) grid positions (N, 2)."""
    channels, height, width = pixels.shape
    rows, cols = height // size, width // size
    grid = pixels.reshape(channels, rows, size, cols, size)  # (3, H/size, size, W/size, size)
    grid = grid.permute(1, 3, 2, 4, 0)  # (H/size, W/size, size, size, 3): patch row, patch column, y, x, colour
    patches = grid.reshape(rows * cols, size * size * channels)  # (N, size*size*3)
    index = torch.arange(rows * cols)  # (N,) row-major: patch n sits at column n % cols of row n // cols
    positions = torch.stack([index % cols, index // cols], dim=-1)  # (N, 2) (x, y)
    return patches, positions


def process(image: "PIL.Image.Image", config: ImageProcessing, max_soft_tokens: int | None = None) -> Pixels:
    """The patches, positions and soft-token count of one image, with max_soft_tokens (default: the config's)."""
    Image, _ = _pillow()
    budget = config.max_soft_tokens if max_soft_tokens is None else max_soft_tokens
    if budget not in SOFT_TOKEN_CHOICES:
        raise ImageError(f"max_soft_tokens={budget}: Gemma 4 was trained with {', '.join(map(str, SOFT_TOKEN_CHOICES))}"
                         f" soft tokens per image: pick one of those")
    p, k = config.patch_size, config.pooling_kernel_size
    rgb = to_rgb(image)
    height, width = image_size(rgb.height, rgb.width, p, budget * k**2, k)
    if (width, height) != rgb.size:  # Pillow sizes are (width, height)
        rgb = rgb.resize((width, height), resample=Image.Resampling.BICUBIC)
    data = torch.frombuffer(bytearray(rgb.tobytes()), dtype=torch.uint8)  # (H*W*3,) row by row, RGB interleaved
    pixels = data.reshape(height, width, 3).permute(2, 0, 1)  # (3, H, W)
    # The product in float64 rounded once to float32, as transformers' `rescale`: the same bits (a float32
    # product lands one ulp off for about half the byte values).
    pixels = (pixels.double() * config.rescale_factor).float()  # (3, H, W) in [0, 1]
    if config.merge:
        patches, positions = patchify(pixels, k * p)  # (N, 3*(k*p)**2): one k x k group of p px patches each
        return Pixels(patches, positions, soft_tokens=len(patches))
    patches, positions = patchify(pixels, p)  # (N, 3*p*p): the tower pools k x k of them into one vector
    return Pixels(patches, positions, soft_tokens=len(patches) // k**2)
