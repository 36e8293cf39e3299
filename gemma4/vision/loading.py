"""Loading a target's image side from the same checkpoint files, only when an image is given.

Facts a reader must know (gemma4/README.md §19; names in weights.md):
- `load_target` never reads the tower: a text-only run's memory is what it was. `load_vision` reads
  `model.vision_tower.*` (or the 12B's `model.vision_embedder.*`) and `model.embed_vision.*`, from the same
  files, by the same streaming reader, checked against the same kind of name table.
- The processor's settings come from `processor_config.json` / `preprocessor_config.json` beside them.
- `Vision.encode` turns one image into its n vectors of the text width: what its n soft tokens become.

Shape legend: N patches, n vectors (soft tokens), E text hidden.
"""

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from gemma4.config import ConfigError
from gemma4.config_file import read_json
from gemma4.vision import tower, unified
from gemma4.vision.config import ImageTokens, VisionConfig, image_tokens, vision_config
from gemma4.vision.processor import ImageError, ImageProcessing, Pixels, open_image, process, processing_config
from gemma4.vision.prompt import PromptImages, place
from gemma4.weights import load_modules, resolve_model_dir

if TYPE_CHECKING:
    import PIL.Image


class Vision:
    """A target's image side: its processor settings, its tower (or the 12B's embedder) and `embed_vision`."""

    def __init__(self, config: VisionConfig, tokens: ImageTokens, processing: ImageProcessing,
                 encoder: nn.Module, embedder: nn.Module) -> None:
        self.config, self.tokens, self.processing = config, tokens, processing
        self.encoder, self.embedder = encoder, embedder  # (N, C) -> (n, W) and (n, W) -> (n, E)

    @torch.inference_mode()
    def encode(self, pixels: Pixels) -> torch.Tensor:
        """One processed image -> its (n, E) vectors, in the weights' dtype, on their device."""
        device = self.embedder.embedding_projection.weight.device
        return self.embedder(self.encoder(pixels.patches.to(device), pixels.positions.to(device)))

    def read(self, image: "str | Path | PIL.Image.Image", max_soft_tokens: int | None = None) -> torch.Tensor:
        """An image file (or a decoded Pillow image) -> its (n, E) vectors; `max_soft_tokens` (70, 140, 280, 560,
        1120) overrides the config."""
        decoded = open_image(image) if isinstance(image, (str, Path)) else image
        return self.encode(process(decoded, self.processing, max_soft_tokens))

    def prompt(self, ids: list[int], images: list[torch.Tensor]) -> tuple[list[int], PromptImages]:
        """Ids where one boi id marks each image's place -> the ids with boi, soft tokens, eoi, and the images."""
        return place(ids, images, self.tokens)


def load_vision(path: str | Path, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> Vision:
    """The image side of the target at `path` (a directory or a Hub id), in eval mode, without gradients."""
    model_dir = resolve_model_dir(path, images=True)
    raw = read_json(Path(model_dir) / "config.json")
    config = vision_config(raw)
    if config is None:
        raise ImageError(f"{model_dir} has no vision tower (its config.json has no vision_config): images and video "
                         f"frames need one of the multimodal releases, e.g. google/gemma-4-E2B-it")
    processing = processing_config(Path(model_dir), config.unified)
    for field in ("patch_size", "pooling_kernel_size"):  # the tower's input is the processor's output
        if getattr(processing, field) != getattr(config, field):
            raise ConfigError(f"{model_dir}: the image processor's {field} is {getattr(processing, field)}, its "
                              f"vision_config's {getattr(config, field)}: restore the release's processor config")
    if config.unified:
        parts = [(unified.UnifiedEmbedder, unified.weight_table(config), unified.UNIFIED_PREFIX)]
    else:
        parts = [(tower.VisionTower, tower.weight_table(config), tower.VISION_PREFIX)]
    parts.append((tower.VisionEmbedder, tower.embed_weight_table(config), tower.EMBED_PREFIX))
    modules = load_modules(model_dir, parts, config, dtype, device)
    return Vision(config, image_tokens(raw), processing, *modules)
