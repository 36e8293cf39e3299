"""Step 4 of a round: which drafts the target keeps, and the token it commits after them.

Each rule gets the drafts d_1..d_K and the verify's logits rows 0..K (row i chooses the token at
position newest+1+i) and returns g_0..g_a: the target's token at rows 0..a, where d_i == g_(i-1) for
every i <= a. The round commits d_1..d_a and g_a: the correction, or the bonus token when every
draft was kept.
- greedy (§7): g_i is the argmax of row i. Token equality, never a probability.
- keyed (§11, argmax drafting): g_i is the keyed sample of row i at its position, exactly what plain
  sampling draws there. This is the rejection rule for a one-hot q.
- rejection (§11, sample drafting): mtp/sample_drafting.py."""

from collections.abc import Iterable

from torch import Tensor

from gemma4.generate import check_finite
from gemma4.sampling import SamplerConfig, sample
from mtp.sample_drafting import accept_rejection


def accept(drafts: list[int], logits: Tensor, sampler: SamplerConfig | None, newest: int,
           q: list[Tensor]) -> list[int]:
    """g_0..g_a by the rule of this run: greedy when `sampler` is None, the rejection rule when
    the drafter's q rows are given (sample drafting), keyed samples otherwise. logits (K+1, V)
    choose positions newest+1..newest+K+1."""
    last = newest + len(drafts)
    check_finite(logits, f"the target's logits of the verify at positions {newest}..{last}")
    if sampler is None:
        return agree(drafts, logits.argmax(dim=-1).tolist())
    if q:
        return accept_rejection(drafts, q, logits, sampler, newest)
    # Drawn one row at a time, as `agree` asks: no row past the first mismatch.
    draws = (sample(row, sampler, newest + 1 + i) for i, row in enumerate(logits))
    return agree(drafts, draws)


def agree(drafts: list[int], tokens: Iterable[int]) -> list[int]:
    """The target's tokens g_0, g_1, ... taken while d_i == g_(i-1): the last one taken is the
    target's own."""
    taken = []
    for g in tokens:
        taken.append(g)
        if len(taken) > len(drafts) or drafts[len(taken) - 1] != g:
            break
    return taken


def cut_at_stop(block: list[int], stop_ids: Iterable[int]) -> list[int]:
    """A committed block ends at its first stop id (kept): what would follow is never emitted."""
    for i, token in enumerate(block):
        if token in stop_ids:
            return block[:i + 1]
    return block
