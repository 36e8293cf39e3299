"""The slow, obviously-correct logit warp: the reference the fast `gemma4.sampling.warp` is tested against
(tests/test_sampling.py). Nothing in the sampling path calls it.

Every token of the row is divided, masked, sorted and soft-maxed, in fp32 and in transformers' order:
temperature, then top-k, then top-p, then softmax, with the semantics gemma4/sampling.py states:
- the temperature divides the logits minus the row's maximum (a tiny T gives -inf, never inf - inf);
- top-k keeps every token whose logit is >= the k-th largest: ties at the k-th are all kept;
- top-p removes the tokens whose ascending cumulative probability is <= 1 - top_p, ordered by a stable
  sort (equal logits in id order: the higher ids are kept first), and always keeps the most likely one;
- a token already at -inf (the centroid head's filler) gets probability 0.

Shape legend: N rows, V vocab.
"""

import torch

from gemma4.sampling import SamplerConfig


def reference_warp(logits: torch.Tensor, cfg: SamplerConfig) -> torch.Tensor:
    """logits (N, V) -> probabilities (N, V) in fp32, 0 for every token removed."""
    x = logits.float()
    x = (x - x.max(dim=-1, keepdim=True).values) / cfg.temperature  # (N, V)
    if 0 < cfg.top_k < x.shape[-1]:
        kth = x.topk(cfg.top_k, dim=-1).values[:, -1:]  # (N, 1)
        x = x.masked_fill(x < kth, float("-inf"))  # ties at the k-th logit stay
    if cfg.top_p < 1:
        sorted_x, order = x.sort(dim=-1, stable=True)  # (N, V) ascending: the removed tokens are a prefix
        cumulative = sorted_x.softmax(dim=-1).cumsum(dim=-1)  # (N, V)
        remove = cumulative <= 1 - cfg.top_p  # (N, V) in sorted order
        remove[:, -1] = False  # the most likely token always stays
        x = x.masked_fill(remove.scatter(1, order, remove), float("-inf"))  # back to id order
    return x.softmax(dim=-1)  # (N, V)
