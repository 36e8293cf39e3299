"""The sampler's candidates without sorting or soft-maxing a whole row: `fast_candidates`, what the loaders give
a fast model as its `sampler_candidates` (gemma4/fast/apply.py). The rule is `gemma4.sampling.candidates`'s
(tests/test_sampling.py compares them on ties, -inf fillers and rows large enough for both fast paths).

- top-k (`top_k_ids`) reads the row in two passes: the maxima of CHUNK-long chunks, then only the chunks
  whose maximum reaches the k-th largest maximum. With top-k set, top-p runs on those candidates alone.
- top-p (`top_p_keep`) with top-k 0 adds up the mass of BINS value slices on the CPU instead of sorting the
  row, and sorts on other devices, where `scatter_add_` sums in an order that varies between runs while a
  sort is cheap and gives the same sums every time.

Shape legend: V vocab, M candidates of one row.
"""

import torch

from gemma4.sampling import SamplerConfig

CHUNK = 64  # top-k's first pass takes the maximum of every CHUNK consecutive logits
SMALL = 2048  # top-p sorts a working set this small; a larger one is first cut into value slices
BINS = 1024  # top-p's value slices per pass
UNDERFLOW = 104.0  # softmax gives 0 in fp32 below z = -104 (z <= 0): slices need not reach lower


def top_k_ids(x: torch.Tensor, k: int) -> torch.Tensor:
    """x (V,) -> the ids (M,) ascending of every finite logit >= the k-th largest, ties included.

    In two passes, so that the whole row is only read, never sorted: the maxima of CHUNK-long chunks
    first. At least k chunks have a maximum >= the k-th largest maximum, so the k-th largest logit is
    >= it too: only the chunks whose maximum reaches it can hold a candidate."""
    v = x.shape[0]
    if v % CHUNK or v // CHUNK < 2 * k:  # too few chunks to gain anything: one pass
        ids = torch.arange(v, device=x.device)
    else:
        maxima = x.view(-1, CHUNK).amax(dim=1)  # (V/CHUNK,)
        chunks = (maxima >= maxima.topk(k).values[-1]).nonzero()  # (C, 1): at least k chunks
        ids = (chunks * CHUNK + torch.arange(CHUNK, device=x.device)).flatten()  # (C*CHUNK,) ascending
    vals = x[ids]
    kth = vals.topk(k).values[-1]
    return ids[(vals >= kth) & (vals > float("-inf"))]  # -inf: probability 0 anyway (the centroid filler)


def top_p_keep(z: torch.Tensor, top_p: float) -> torch.Tensor:
    """z (M,) scaled logits of candidates in ascending id order -> a mask (M,) of the ones top-p keeps.

    The rule as a stable ascending sort reads it: a token goes when the mass at or below it (equal
    values: lower ids below) is <= 1 - top_p; sums in float64. On the CPU a large set is never sorted: one pass
    adds up the mass of BINS equal value slices; the slices above the one where the mass below
    passes 1 - top_p are kept whole, those under it removed whole, and only that slice is looked at
    again (slices never split equal values)."""
    p = z.softmax(dim=-1)  # (M,)
    pos, w, wp = None, z, p  # the undecided tokens: positions (None: all), values, probabilities
    below = 0.0  # mass of the tokens under them, all removed
    while len(w) > SMALL and z.device.type == "cpu":  # elsewhere scatter_add_ sums in varying order: sort
        hi, lo = float(w.max()), max(float(w.min()), -UNDERFLOW)  # z <= 0: the maximum is 0
        if lo == hi:
            break  # all equal: the exact pass below orders them by id
        slices = w.mul(-(BINS - 1) / (hi - lo)).add_(hi * (BINS - 1) / (hi - lo)).long().clamp_(max=BINS - 1)
        mass = wp.new_zeros(BINS).scatter_add_(0, slices, wp).double()  # (BINS,) slice 0: the top
        under = mass.flip(0).cumsum(dim=0).flip(0) - mass + below  # (BINS,) mass under each slice
        b = int((under > 1 - top_p).sum())  # the top slice with <= 1 - top_p under it: the boundary
        below = float(under[b])  # slices above b are kept whole: more than 1 - top_p under any token
        inside = (slices == b).nonzero().flatten()  # slices under b go: at most under[b] at or below
        pos, w, wp = inside if pos is None else pos[inside], w[inside], wp[inside]
    if pos is None:
        pos = torch.arange(len(z), device=z.device)
    ranked = pos[w.sort(stable=True).indices]  # (W,) ascending value, ties by ascending id
    removed = p[ranked].double().cumsum(dim=0) + below <= 1 - top_p  # (W,)
    removed[-1] = False  # the most likely token always stays
    keep = z > w.max()  # (M,) everything above the last slice is kept
    keep[ranked[~removed]] = True
    return keep


def fast_candidates(logits: torch.Tensor, cfg: SamplerConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """`gemma4.sampling.candidates` without touching the whole row: one row of logits (V,) -> ids (M,)
    ascending and probabilities (M,) fp32. A candidate may have probability 0 (underflow far below the
    maximum; the textbook leaves those out): it never wins a draw, so the tokens are the same."""
    x, v = logits, logits.shape[0]  # in the model's dtype: only the candidates are cast to fp32
    if 0 < cfg.top_k < v:
        ids = top_k_ids(x, cfg.top_k)
    elif float(x.min()) > float("-inf"):
        ids = torch.arange(v, device=x.device)
    else:
        ids = (x > float("-inf")).nonzero().flatten()  # the centroid head's filler: probability 0
    vals = (x if len(ids) == v else x[ids]).float()  # (M,): every token needs no gather
    z = (vals - vals.max()) / cfg.temperature  # max subtracted first: a tiny T gives -inf, never NaN
    if cfg.top_p < 1:
        kept = top_p_keep(z, cfg.top_p).nonzero().flatten()  # (M',) positions, ascending
        ids, z = (kept if len(ids) == v else ids[kept]), z[kept]  # every token: ids[i] == i
    return ids, z.softmax(dim=-1)  # a tiny T underflows all but the maximum to probability 0
