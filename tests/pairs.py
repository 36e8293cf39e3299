"""The test pairs of the equivalence suites: three tiny shapes, each with three drafters.

- `random`: a seeded random drafter, almost never right;
- `echo`:   a drafter biased to propose the token it was given (tests/checkpoints.py), against a
            target whose layer branches are halved through their post-norm gains, so that its greedy
            output wanders at first and then settles into repeats: partly right;
- `always`: the echo drafter against an *echo target* (branches shrunk 100-fold, so its greedy
            output repeats its last token): every draft is right.
`build_pairs` writes and loads them once per session (the `models` fixture of conftest.py).
"""

from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from gemma4 import Gemma4Model, SamplerConfig, greedy_generate, load_target, sample_generate
from mtp import Drafter, load_drafter
from tests.checkpoints import SHAPES, write_assistant, write_target

DRAFTERS = ("random", "echo", "always")
PROMPTS = {"short": 5, "long": 21}  # the target's sliding window is 8, the drafter's 6


def prompt(length: int | str, seed: int | None = None, vocab: int = 512) -> list[int]:
    """BOS, then length - 1 ids of 3..vocab-1 (no special id) drawn with `seed` (by default the length).
    `length` may name a PROMPTS kind."""
    n = PROMPTS[length] if isinstance(length, str) else length
    g = torch.Generator().manual_seed(n if seed is None else seed)
    return [2] + torch.randint(3, vocab, (n - 1,), generator=g).tolist()


# (decoder, id of the model, arguments) -> (the model, its tokens). The model is held so that its id cannot be
# reused by a later object (a test's deep copy) while the entry lives: an id alone once returned another
# shape's tokens to a copy born at a freed model's address.
RUNS: dict[tuple, tuple[Gemma4Model, list[int]]] = {}


def plain(target: Gemma4Model, ids: list[int], n: int, sampler: SamplerConfig | None = None,
          decoder: Callable[..., list[int]] | None = None) -> list[int]:
    """The reference run the loops are held to, decoded once per (model, prompt, budget, sampler): plain
    greedy decoding, plain keyed sampling with `sampler`, or `decoder(target, ids, n)` (e.g. the cache-free
    `reference_greedy`)."""
    if decoder is None:
        decoder = greedy_generate if sampler is None else partial(sample_generate, sampler=sampler)
    key = (decoder if not isinstance(decoder, partial) else ("sample", sampler), id(target), tuple(ids), n)
    if key not in RUNS:
        RUNS[key] = target, decoder(target, list(ids), n)
    return RUNS[key][1]


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
