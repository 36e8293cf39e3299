"""Row invariance: a row's product has the same bits whatever the number of rows multiplied with it.

A decode step multiplies each weight by 1 row, a verify of K drafts by K + 1. A CPU kernel picks its blocking
by the row count, so row 0 of a 5-row product need not have the bits of the same row multiplied alone: in
float32 on one CPU the 1-row product sums in another order than every product of 2 to 64 rows, on another 2
and 3 rows agree with each other and 4 or more do not. Where the bits differ, a verify's logits differ from the
decode step's at the same position in the last bits, and at a near tie the argmax, so speculative decoding
would commit another token than plain decoding.

The cure is measured, not assumed, when a model loads (`measure`; once a process per shape, dtype, kernel and
thread count, gemma4/fast/apply.py `PLANS`): rows of random numbers are multiplied alone and among 1 to 63
others, at other places, at the row counts of `MEASURED`. The longest run of row counts [least, most] that all
give the same bits, within the library the 1-row call runs in (`measure`), is the product's `RowPlan`: a call of
fewer than `least` rows is padded with zero rows up to `least`, a call of more than `most` rows (up to
`STEP_ROWS`) runs in pieces of at most `most` rows, each padded likewise. Every row of a step then gets the bits
of that one run of row counts, and so do the decode's single row and each row of a verify.
A measurement, not a timing: the same machine gives the same bits, so the same plan, on every load.

Calls of more than `STEP_ROWS` rows (a prefill's chunk) run as one call: no step is that long.

Shape legend: N rows, I in features, O out features.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

STEP_ROWS = 64  # the most rows a decode or verify step multiplies: a verify of 63 drafts (the ring's slack)
# The row counts measured: every count a default verify reaches (K <= 8), then enough to see the run go on.
MEASURED = (*range(1, 17), 24, 32, 48, 64)
SAMPLES = 2 ** 12  # results compared at 1 row, at least: a product of O outputs measures 4096 / O blocks,
MAX_BLOCKS = 16  # and at most this many


@dataclass(frozen=True)
class RowPlan:
    """How a product's calls of up to STEP_ROWS rows are cut so that every row gets the same bits: pieces of at
    most `most` rows, each padded to at least `least`. RowPlan(1, STEP_ROWS) is no cutting at all."""
    least: int
    most: int

    def describe(self) -> str:
        if (self.least, self.most) == (1, STEP_ROWS):
            return f"1..{STEP_ROWS} rows give each row the same bits: multiplied as called"
        pad = f"fewer than {self.least} rows padded to {self.least}" if self.least > 1 else ""
        cut = f"more than {self.most} rows cut into pieces of {self.most}" if self.most < STEP_ROWS else ""
        return f"{self.least}..{self.most} rows give each row the same bits: " + "; ".join(p for p in (pad, cut) if p)


AS_CALLED = RowPlan(1, STEP_ROWS)


def measure(multiply: Callable[[Tensor], Tensor], in_features: int, dtype: torch.dtype, device: torch.device,
            library: Callable[[int], str] = lambda n: "") -> RowPlan:
    """The plan for `multiply` (N, I) -> (N, O): the longest run of `MEASURED` row counts that give each row the
    same bits, never two counts that `library` says run in other libraries (`better`: the 1-row call's library
    first, then the longer run, then the fewer pad rows).

    Each row count n multiplies the n middle rows of one block of STEP_ROWS random rows, so a row sits at another
    place in each call and among other neighbours. Two counts agree when every row they share has the same bits.
    Two kernels that sum in other orders can still round most results alike (in bfloat16 most of the time), so
    the blocks are repeated until about `SAMPLES` results of one row have been compared (at most `MAX_BLOCKS`).
    Where a call moves to another library at some row count, the two may round alike far more often still (one
    result in 400,000 differed for a tiny bfloat16 product): what is known of the dispatch, `library(n)`, splits
    the runs before any bits are compared (gemma4/fast/kernels.py `library_of`), and a run in the 1-row call's
    library is preferred (`better`)."""
    generator = torch.Generator().manual_seed(0)
    middle = {n: slice(STEP_ROWS // 2 - n // 2, STEP_ROWS // 2 - n // 2 + n) for n in MEASURED}  # nested windows
    out: dict[int, list[Tensor]] = {n: [] for n in MEASURED}
    blocks = 1
    while len(out[1]) < blocks:
        rows = torch.randn(STEP_ROWS, in_features, generator=generator).to(device, dtype)  # (64, I)
        for n in MEASURED:
            out[n].append(multiply(rows[middle[n]]))  # (n, O)
        blocks = max(1, min(MAX_BLOCKS, -(-SAMPLES // out[1][0].numel())))

    def agree(fewer: int, more: int) -> bool:
        if library(fewer) != library(more):
            return False
        shared = slice(middle[fewer].start - middle[more].start, middle[fewer].stop - middle[more].start)
        return all(torch.equal(a, b[shared]) for a, b in zip(out[fewer], out[more]))

    def better(plan: RowPlan) -> tuple[bool, int, int]:
        # The 1-row call's library first: where torch's dispatch moves a product to another library as rows
        # grow, it keeps the small calls in its own gemm because there the other's fixed cost dominates, so a
        # decode padded into the other library would pay it on every step. Then a longer run, then fewer pad rows.
        return library(plan.least) == library(1), plan.most - plan.least + 1, -plan.least

    plan, start = RowPlan(1, 1), 0  # `start`: where the current run of equal bits began, in MEASURED
    for i, n in enumerate(MEASURED):
        if not agree(MEASURED[start], n):
            start = i
        plan = max(plan, RowPlan(MEASURED[start], n), key=better)
    return plan


def by_plan(multiply: Callable[[Tensor], Tensor], x: Tensor, plan: RowPlan, out_features: int) -> Tensor:
    """x (..., I) -> (..., O): `multiply` as called, or, for a step whose row count is outside the plan's run, in
    the plan's pieces. A strided x is made contiguous first: the plan was measured on contiguous rows, and a kernel
    may block rows otherwise when they sit apart (the PLE gate's output does, gemma4/fast/modules.py)."""
    x = x.contiguous()  # no copy where it already is
    n = x.numel() // x.shape[-1]  # N rows
    if 0 < n < plan.least or plan.most < n <= STEP_ROWS:
        return in_pieces(multiply, x.reshape(n, -1), plan).view(*x.shape[:-1], out_features)
    return multiply(x)


def in_pieces(multiply: Callable[[Tensor], Tensor], rows: Tensor, plan: RowPlan) -> Tensor:
    """rows (N, I) multiplied as `plan` says: pieces of at most plan.most rows, each padded with zero rows to at
    least plan.least -> (N, O)."""
    out = []
    for start in range(0, rows.shape[0], plan.most):
        piece = rows[start:start + plan.most]  # (n, I)
        n = piece.shape[0]
        if n < plan.least:
            piece = F.pad(piece, (0, 0, 0, plan.least - n))  # (least, I): zero rows below
        out.append(multiply(piece)[:n])
    return out[0] if len(out) == 1 else torch.cat(out)
