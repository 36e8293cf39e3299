"""The test pairs of the equivalence suites: three tiny shapes, each with three drafters.

- `random`: a seeded random drafter, almost never right;
- `echo`:   a drafter biased to propose the token it was given (tests/checkpoints.py), against a
            target whose layer branches are halved through their post-norm gains, so that its greedy
            output wanders at first and then settles into repeats: partly right;
- `always`: the echo drafter against an *echo target* (branches shrunk 100-fold, so its greedy
            output repeats its last token): every draft is right.
`build_pairs` writes and loads them once per session (the `models` fixture of conftest.py).
"""

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from gemma4 import Gemma4Model, load_target
from mtp import Drafter, load_drafter
from tests.checkpoints import SHAPES, write_assistant, write_target

DRAFTERS = ("random", "echo", "always")
PROMPTS = {"short": 5, "long": 21}  # the target's sliding window is 8, the drafter's 6


def prompt(kind: str, vocab: int = 512) -> list[int]:
    g = torch.Generator().manual_seed(PROMPTS[kind])
    return [2] + torch.randint(3, vocab, (PROMPTS[kind] - 1,), generator=g).tolist()


def shrink_branches(path: Path, factor: float) -> None:
    """Scale every branch's post-norm gain: the residual stream stays closer to the token's own
    embedding, which the tied head matches best, so greedy decoding tends to repeat the last token."""
    for file in path.glob("*.safetensors"):
        tensors = load_file(file)
        for name in tensors:
            if name.endswith(("post_attention_layernorm.weight", "post_feedforward_layernorm.weight",
                              "post_per_layer_input_norm.weight")):
                tensors[name] = tensors[name] * factor
        save_file(tensors, file, metadata={"format": "pt"})


def build_pairs(root: Path) -> dict[tuple[str, str], tuple[Gemma4Model, Drafter]]:
    """(shape, drafter kind) -> (target, drafter). E2B-like drafters use the centroid head, as E2B's."""
    out = {}
    for shape in SHAPES:
        targets = {}
        for name, factor in (("plain", 1.0), ("settling", 0.5), ("echo", 0.01)):
            targets[name] = write_target(root / shape / name, shape)
            shrink_branches(targets[name], factor)
        ordered = shape == "e2b"
        random = write_assistant(root / shape / "random_drafter", targets["plain"], ordered_embeddings=ordered, seed=1)
        echo = load_drafter(write_assistant(root / shape / "echo_drafter", targets["plain"],
                                            ordered_embeddings=ordered, echo=True, seed=2))
        out[shape, "random"] = (load_target(targets["plain"]), load_drafter(random))
        out[shape, "echo"] = (load_target(targets["settling"]), echo)
        out[shape, "always"] = (load_target(targets["echo"]), echo)
    return out
