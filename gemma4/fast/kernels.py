"""The products the speed layer multiplies by, and how a weight's kernel is chosen: by timing them at load.

- A plain product is one `torch.matmul` on the weight's transpose, a view taken once at load (7 ATen calls;
  `F.linear` on a 3-d input dispatches 11, its transpose among them, on every call).
- A packed product multiplies by oneDNN's copy of the weight in its own blocked layout
  (`_reorder_linear_weight`, then `_linear_pointwise`: the pair torch.compile's CPU backend emits for a
  linear layer). Same sums in another order: about 1e-6 relative in float32.
- oneDNN's product on the *unpacked* weight (`_linear_pointwise` with a plain tensor: no copy) serves many
  rows on some CPUs where MKL's does not (`Product.onednn_rows`).
- Which pays depends on the CPU, the weight and the row count, so `measure` times them on the real weight
  for 1 row and for K + 1 = `VERIFY_ROWS` rows, alternating, the best of `REPS` each (minima: a neighbour's
  load only ever adds time), and keeps a packed copy only where it is faster for every row count the model
  multiplies: 1 and K + 1 by default, K + 1 alone for a model that only verifies (`decodes=False`).
  Figures: scripts/benchmark.md; why: gemma4/fast/README.md.

Shape legend: N rows (tokens), I in features, O out features.
"""

import time
from typing import NamedTuple

import torch

VERIFY_ROWS = 5  # K + 1 for the default K = 4: the rows of a verify the packing decision is timed for
REPS = 5  # timings of each of the five (product, rows) pairs; the minimum of each counts
REP_BUDGET_S = 0.1  # fewer repetitions (at least 3) where 5 x REPS products would take longer: large weights
NO_KERNEL = "no oneDNN kernel for this device or dtype"
ROWS_HINT = 8  # the row count oneDNN picks its layout for: verifies multiply 2-9 rows, a decode step 1
ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def packable(weight: torch.Tensor) -> bool:
    """Can this weight have a packed copy at all? CPU, a build with oneDNN, float32 (or bfloat16 on a CPU with
    oneDNN's bfloat16 kernels: AVX-512 or AVX-NE-CONVERT; AVX2 has none). Whether it gets one is `measure`'s."""
    if not (ONEDNN and weight.device.type == "cpu" and weight.dim() == 2):
        return False
    if weight.dtype == torch.bfloat16:
        return torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return weight.dtype == torch.float32


class Product:
    """One weight (O, I), or several stacked by rows, prepared once for inference: plain (its transpose, a
    view) or packed (oneDNN's opaque copy). `onednn_rows` (plain only; 0: never): inputs of at least that many
    rows go to oneDNN's product on the same unpacked weight, fewer stay with `torch.matmul`."""

    def __init__(self, weight: torch.Tensor, packed: bool, blocked: torch.Tensor | None = None,
                 onednn_rows: int = 0, choice: "Choice | None" = None) -> None:
        self.choice = choice  # the decision it was made by, for reports
        self.shape, self.dtype, self.packed = tuple(weight.shape), weight.dtype, packed  # (O, I)
        self.onednn_rows = 0 if packed else onednn_rows
        # Packed: the opaque layout (no views, no autograd, no storage). Plain: the (I, O) transpose, a view.
        self.operand = (blocked if blocked is not None else block(weight)) if packed else weight.t()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., I) -> (..., O)."""
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.operand, None, "none", [], "")
        if self.onednn_rows and x.numel() >= self.onednn_rows * x.shape[-1]:  # many rows: the weight (O, I) as it is
            return torch.ops.mkldnn._linear_pointwise(x, self.operand.t(), None, "none", [], "")
        return torch.matmul(x, self.operand)  # (..., I) @ (I, O): one call from Python, folded into one mm


def block(weight: torch.Tensor) -> torch.Tensor:
    """oneDNN's opaque copy of weight (O, I), the same numbers in its blocked layout."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), ROWS_HINT)


# ---------------------------------------------------------------- the packing decision

class Choice(NamedTuple):
    """One (shape, dtype)'s decision, with what it was based on and what it cost the load."""
    shape: tuple[int, int]
    dtype: str
    packed: bool
    plain_s: tuple[float, float] | None  # seconds of one product of 1 row and of VERIFY_ROWS rows; None: not timed
    packed_s: tuple[float, float] | None
    cost_s: float  # time spent deciding, layout included
    why: str
    onednn_rows: int = 0  # plain, with oneDNN's product on the unpacked weight from this many rows (0: never)


def _seconds(product: Product, x: torch.Tensor, repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        product(x)
    return (time.perf_counter() - start) / repeat


@torch.inference_mode()
def measure(weight: torch.Tensor, rows: int = VERIFY_ROWS, reps: int = REPS, decodes: bool = True
            ) -> tuple[Choice, torch.Tensor | None]:
    """Plain against packed on this weight (O, I) for 1 and `rows` rows, interleaved, best of `reps` each (fewer
    for a weight whose product takes milliseconds): packed where faster for `rows` rows and, if the model
    `decodes` (takes 1-row steps), for 1 row too. Returns the decision and the packed layout it timed."""
    start = time.perf_counter()
    name = str(weight.dtype).removeprefix("torch.")
    if not packable(weight):
        return Choice(tuple(weight.shape), name, False, None, None, 0.0, NO_KERNEL), None
    ways = {"plain": Product(weight, False), "packed": Product(weight, True),
            "onednn": Product(weight, False, onednn_rows=rows)}  # its 1-row product is the plain one
    xs = [torch.randn(n, weight.shape[1], generator=torch.Generator().manual_seed(0)).to(weight.dtype)
          for n in (1, rows)]  # (1, I), (rows, I)
    for product in ways.values():  # oneDNN creates its kernel on the first call; the plain path warms its caches
        for x in xs:
            product(x)
    # Repeat each product to about 0.2 ms, so that a small weight's few microseconds are above the timer's noise.
    once = _seconds(ways["plain"], xs[0], 1)
    repeat = max(1, min(64, int(2e-4 / max(once, 1e-7))))
    reps = max(3, min(reps, int(REP_BUDGET_S / (5 * once))))  # E2B's largest weights: a few ms a product
    order = [("plain", 0), ("plain", 1), ("onednn", 1), ("packed", 0), ("packed", 1)]
    best = {key: float("inf") for key in order}
    for rep in range(reps):
        for way, i in order if rep % 2 == 0 else reversed(order):
            best[way, i] = min(best[way, i], _seconds(ways[way], xs[i], repeat))
    onednn_rows = rows if best["onednn", 1] < best["plain", 1] else 0
    plain = (best["plain", 0], min(best["plain", 1], best["onednn", 1]))  # the better plain kernel for many rows
    packed = (best["packed", 0], best["packed", 1])
    faster = packed[1] < plain[1] and (packed[0] < plain[0] or not decodes)
    why = (f"packed takes {packed[0] / plain[0]:.2f}x / {packed[1] / plain[1]:.2f}x the plain time for 1 / {rows} "
           f"rows; oneDNN on the unpacked weight {best['onednn', 1] / best['plain', 1]:.2f}x torch.matmul's for {rows}")
    blocked = ways["packed"].operand if faster else None
    return Choice(tuple(weight.shape), name, faster, plain, packed, time.perf_counter() - start, why,
                  0 if faster else onednn_rows), blocked


def forced(weight: torch.Tensor, pack: bool) -> Choice:
    """A decision taken without timing: `pack` where a packed copy is possible (tests force both branches)."""
    packed = pack and packable(weight)
    return Choice(tuple(weight.shape), str(weight.dtype).removeprefix("torch."), packed, None, None, 0.0,
                  "forced" if packable(weight) else NO_KERNEL)
