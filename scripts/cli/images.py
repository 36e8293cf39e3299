"""Images in a prompt from the command line: generate.py's `--image`, chat.py's `/image`, `--image-tokens`.

- The target's image side (its tower, or the 12B's embedder) is read from the target's own files, and only
  when an image is given: a text-only run loads and holds none of it (gemma4/vision/loading.py).
- Where an image goes: a chat model's user turn holds its images first, before the text, as the release's chat
  template writes an image item (gemma4/tokenizer.py `render`); a model without a chat template gets them right
  after `<bos>`; with `--prompt-ids` each image's place is one boi id (config.json's `boi_token_id`), expanded to
  boi, the image's soft tokens and eoi.
- Everything a user can get wrong is one line and exit status 2 (ImageError, PromptError): no vision tower (the
  demo pair), an unreadable file, Pillow missing, a boi count that is not the image count, more image tokens
  than the context holds.
"""

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from gemma4.rows import PromptError
from gemma4.vision.loading import Vision, load_vision
from gemma4.vision.processor import SOFT_TOKEN_CHOICES
from gemma4.vision.prompt import PromptImages


IMAGE_TOKENS_HELP = (f"soft tokens per image at most, one of {', '.join(map(str, SOFT_TOKEN_CHOICES))}: fewer is a "
                     f"smaller image, faster and shorter (default: the target's processor config, 280 in the "
                     f"releases)")


def load_images(target_dir: Path, paths: Sequence[str], max_soft_tokens: int | None, device: torch.device,
                dtype: torch.dtype, say: Callable[[str], None]) -> tuple[Vision, list[torch.Tensor]]:
    """The target's image side and each image's (n, E) vectors, with one header line."""
    vision = load_vision(target_dir, dtype, device)
    vectors = [vision.read(path, max_soft_tokens) for path in paths]
    say(f"images     {', '.join(f'{Path(p).name} ({len(v)} tokens)' for p, v in zip(paths, vectors))}")
    return vision, vectors


def place(vision: Vision, ids: list[int], vectors: list[torch.Tensor], context: int) -> tuple[list[int], PromptImages]:
    """Ids with one boi id per image -> the prompt with each image's soft tokens, and its images; a prompt the
    context cannot hold with one new token is refused here, naming the images' part."""
    full, images = vision.prompt(ids, vectors)
    soft = sum(len(v) for v in vectors)
    if len(full) >= context:
        raise PromptError(f"the prompt takes {len(full)} positions, {soft} of them image tokens, and the context "
                          f"holds {context}: give fewer images, --image-tokens {SOFT_TOKEN_CHOICES[0]}, or less text")
    return full, images
