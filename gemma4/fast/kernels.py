"""The products the speed layer multiplies by, and how a weight's kernel is chosen: by timing them at load.

- A plain product is one `torch.matmul` on the weight's transpose, a view taken once at load (7 ATen calls;
  `F.linear` on a 3-d input dispatches 11, its transpose among them, on every call).
- A packed product multiplies by oneDNN's copy of the weight in its own blocked layout
  (`_reorder_linear_weight`, then `_linear_pointwise`: the pair torch.compile's CPU backend emits for a
  linear layer). Same sums in another order: about 1e-6 relative in float32.
- oneDNN's product on the *unpacked* weight (`_linear_pointwise` with a plain tensor: no copy) is a third kernel.
- One layout a weight, so the choice is plain (MKL or oneDNN on the unpacked weight, each row count its own) or
  packed (for every row count). Which pays depends on the CPU, the weight and the row count, so `measure` times
  all three on the real weight for 1 row and for K + 1 = `VERIFY_ROWS` rows, alternating, the best of `REPS`
  each (minima: a neighbour's load only ever adds time). `fastest_layout` takes the faster plain kernel for each
  row count, then the layout whose worst slowdown against the fastest kernel of each count is least, over 1 and
  K + 1 rows. A product's time is then
  within that factor of the best kernel's whatever the mix of decode steps and verifies.
  Figures: scripts/benchmark.md; why: gemma4/fast/README.md.

Shape legend: N rows (tokens), I in features, O out features.
"""

import time
from dataclasses import dataclass, fields
from typing import Any

import torch

VERIFY_ROWS = 5  # K + 1 for the default K = 4: the rows of a verify the packing decision is timed for
REPS = 5  # timings of each of the six (kernel, rows) pairs; the minimum of each counts
REP_BUDGET_S = 0.1  # fewer repetitions (at least 3) where 6 x REPS products would take longer: large weights
NO_KERNEL = "no oneDNN kernel for this device or dtype"
KERNELS = ("mkl", "onednn", "packed")  # torch.matmul, oneDNN on the plain weight, oneDNN on its packed copy
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
    """One weight (O, I), or several stacked by rows, prepared once for inference in one layout: plain (the weight
    and its transpose, views) or packed (oneDNN's opaque copy). `onednn` is the kernel per row count: for 1 row
    and for 2 or more, oneDNN's `_linear_pointwise` (True) or `torch.matmul` (False: MKL on a CPU; plain only)."""

    def __init__(self, weight: torch.Tensor, packed: bool, blocked: torch.Tensor | None = None,
                 onednn: tuple[bool, bool] = (False, False), choice: "Choice | None" = None) -> None:
        self.choice = choice  # the decision it was made by, for reports
        self.shape, self.dtype, self.packed = tuple(weight.shape), weight.dtype, packed  # (O, I)
        self.in_features = weight.shape[1]  # I: more input numbers than that is more than 1 row
        self.onednn = (True, True) if packed else onednn  # (1 row, 2 or more rows)
        # oneDNN's operand. Packed: the opaque layout (no views, no autograd, no storage). Plain: the weight (O, I).
        self.weight = (blocked if blocked is not None else block(weight)) if packed else weight
        self.operand = self.weight if packed else weight.t()  # MKL's: the (I, O) transpose, a view

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., I) -> (..., O)."""
        if self.onednn[x.numel() > self.in_features]:  # [0]: 1 row, a decode step; [1]: a verify or a prefill
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, None, "none", [], "")
        return torch.matmul(x, self.operand)  # (..., I) @ (I, O): one call from Python, folded into one mm


def block(weight: torch.Tensor) -> torch.Tensor:
    """oneDNN's opaque copy of weight (O, I), the same numbers in its blocked layout."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), ROWS_HINT)


# ---------------------------------------------------------------- the kernel decision

@dataclass(frozen=True)
class Choice:
    """One (shape, dtype)'s decision, with what it was based on and what it cost the load."""
    shape: tuple[int, int]
    dtype: str
    kernels: tuple[str, str]  # the kernel for 1 row and for 2 or more, each of KERNELS
    seconds: dict[str, tuple[float, float]] | None  # every kernel's seconds for 1 and `rows` rows; None: not timed
    rows: int  # the verify it was timed for: K + 1 rows
    cost_s: float  # time spent deciding, layout included
    why: str

    def __post_init__(self) -> None:
        if self.kernels.count("packed") == 1 or not set(self.kernels) <= set(KERNELS):
            raise ValueError(f"{self.kernels}: each of {KERNELS}, and one layout a weight: packed for every row count "
                             f"or none")

    @property
    def packed(self) -> bool:
        return self.kernels[0] == "packed"

    @property
    def onednn(self) -> tuple[bool, bool]:
        """`Product.onednn`: oneDNN's product for 1 row, for 2 or more."""
        return self.kernels[0] != "mkl", self.kernels[1] != "mkl"

    @property
    def plain_s(self) -> tuple[float, float] | None:
        """Seconds of one product of 1 row and of `rows` rows in the plain layout, by its faster kernel for each."""
        s = self.seconds
        return None if s is None else (min(s["mkl"][0], s["onednn"][0]), min(s["mkl"][1], s["onednn"][1]))

    @property
    def packed_s(self) -> tuple[float, float] | None:
        return None if self.seconds is None else self.seconds["packed"]

    @property
    def onednn_rows(self) -> int:
        """The fewest rows a plain product sends to oneDNN on the unpacked weight (0: none)."""
        return 1 if self.kernels[0] == "onednn" else 2 if self.kernels[1] == "onednn" else 0

    def as_dict(self) -> dict[str, Any]:
        """The fields and what they imply, for a JSON report (scripts/benchmark.py)."""
        return {f.name: getattr(self, f.name) for f in fields(self)} | {
            name: getattr(self, name) for name in ("packed", "plain_s", "packed_s", "onednn_rows")}


def _seconds(product: Product, x: torch.Tensor, repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        product(x)
    return (time.perf_counter() - start) / repeat


def fastest_layout(seconds: dict[str, tuple[float, float]]) -> tuple[tuple[str, str], str]:
    """The kernels (1 row, 2 or more) of the layout whose worst slowdown against the fastest kernel of each row count
    is least, over 1 and K + 1 rows. Plain takes its faster
    kernel for each count; a tie stays plain (no copy). Returns them and why, the slowdowns."""
    fastest = [min(s[i] for s in seconds.values()) for i in (0, 1)]
    plain = tuple(min(("mkl", "onednn"), key=lambda k: seconds[k][i]) for i in (0, 1))
    slowdown = {ks: [seconds[k][i] / fastest[i] for i, k in enumerate(ks)] for ks in (plain, ("packed", "packed"))}
    kernels = min(slowdown, key=lambda ks: max(slowdown[ks]))
    why = "; ".join(f"{'/'.join(dict.fromkeys(ks))} {s[0]:.2f}x / {s[1]:.2f}x" for ks, s in slowdown.items())
    return kernels, f"time over the fastest kernel's for 1 / K + 1 rows: {why}"


@torch.inference_mode()
def measure(weight: torch.Tensor, rows: int = VERIFY_ROWS, reps: int = REPS) -> tuple[Choice, torch.Tensor | None]:
    """Every kernel on this weight (O, I) for 1 and `rows` rows, interleaved, best of `reps` each (fewer for a
    weight whose product takes milliseconds), and the layout `fastest_layout` picks on those times. Returns the
    decision and the packed layout it timed, if packed."""
    start = time.perf_counter()
    shape, name = tuple(weight.shape), str(weight.dtype).removeprefix("torch.")
    if not packable(weight):
        return Choice(shape, name, ("mkl", "mkl"), None, rows, 0.0, NO_KERNEL), None
    ways = {"mkl": Product(weight, False), "onednn": Product(weight, False, onednn=(True, True)),
            "packed": Product(weight, True)}
    xs = [torch.randn(n, weight.shape[1], generator=torch.Generator().manual_seed(0)).to(weight.dtype)
          for n in (1, rows)]  # (1, I), (rows, I)
    order = [(way, i) for way in ways for i in (0, 1)]
    for way, i in order:  # oneDNN creates its kernel on the first call; the plain path warms its caches
        ways[way](xs[i])
    once = {(way, i): _seconds(ways[way], xs[i], 1) for way, i in order}
    # Repeat each product to about 0.2 ms, so that a small weight's few microseconds are above the timer's noise.
    repeat = {key: max(1, min(64, int(2e-4 / max(t, 1e-7)))) for key, t in once.items()}
    reps = max(3, min(reps, int(REP_BUDGET_S / sum(max(t, 2e-4) for t in once.values()))))  # E2B's largest: ms each
    best = {key: float("inf") for key in order}
    for rep in range(reps):
        for way, i in order if rep % 2 == 0 else reversed(order):
            best[way, i] = min(best[way, i], _seconds(ways[way], xs[i], repeat[way, i]))
    seconds = {way: (best[way, 0], best[way, 1]) for way in ways}
    kernels, why = fastest_layout(seconds)
    blocked = ways["packed"].weight if kernels[0] == "packed" else None
    return Choice(shape, name, kernels, seconds, rows, time.perf_counter() - start, why), blocked


def forced(weight: torch.Tensor, kernels: tuple[str, str]) -> Choice:
    """A decision taken without timing: `kernels` (1 row, 2 or more) where oneDNN can, else MKL's (tests force
    every choice)."""
    shape, name = tuple(weight.shape), str(weight.dtype).removeprefix("torch.")
    if not packable(weight):
        return Choice(shape, name, ("mkl", "mkl"), None, VERIFY_ROWS, 0.0, NO_KERNEL)
    return Choice(shape, name, kernels, None, VERIFY_ROWS, 0.0, "forced")
