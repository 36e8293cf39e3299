"""The 12B's pixels against transformers' own 12B processor, which resizes with torchvision (not Pillow).

Not a test: torchvision cannot be installed beside the CPU build of torch the suite pins, so this runs in an
environment that has it, e.g. `pip install torch==2.14.1 torchvision==0.29.1 transformers==5.22.2 Pillow pytest` and
`pip install --no-deps -e .`, then `python -m tests.parity.unified_pixels`. It prints, per image and budget, the
largest difference of our patches from transformers' (values in [0, 1]; 1/255 is one step of a pixel byte) and
the mean, on the images tests/parity/test_image_processor.py draws (odd sizes, portrait, landscape, grey, RGBA).
"""

import torch
from transformers.models.gemma4_unified.image_processing_gemma4_unified import Gemma4UnifiedImageProcessor

from gemma4.vision.processor import ImageProcessing, process, to_rgb
from tests.parity.test_image_processor import gradient, noise, rgba

IMAGES = {
    "noise 37x91 RGB": noise(91, 37, "RGB", 1), "noise 120x50 RGB": noise(50, 120, "RGB", 2),
    "gradient 333x517": gradient(517, 333, 3), "gradient 1000x2": gradient(2, 1000, 4),
    "grey 64x48": noise(48, 64, "L", 5), "RGBA 95x77": rgba(77, 95, 6),
}


def main() -> None:
    worst = 0.0
    for budget in (70, 280):
        theirs = Gemma4UnifiedImageProcessor(max_soft_tokens=budget)
        ours = ImageProcessing(patch_size=16, pooling_kernel_size=3, max_soft_tokens=budget, merge=True)
        for name, image in IMAGES.items():
            out = theirs(to_rgb(image), return_tensors="pt")  # the same RGB (transparency on white) on both sides
            mine = process(image, ours)
            n = len(mine.patches)
            reference = out["pixel_values"][0, :n].to(torch.float64)  # (n, 3·48²), padding past n
            assert torch.equal(out["image_position_ids"][0, :n], mine.positions), name
            diff = (mine.patches.to(torch.float64) - reference).abs()
            worst = max(worst, float(diff.max()))
            print(f"{budget:5d}  {name:18s} {n:4d} patches  max {float(diff.max()):.4f} ({float(diff.max()) * 255:.1f}/255)"
                  f"  mean {float(diff.mean()):.5f}")
    print(f"largest difference: {worst:.4f} ({worst * 255:.1f}/255)")


if __name__ == "__main__":
    main()
