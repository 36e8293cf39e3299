"""Gemma 4's projections, `Linear` and `linear`, and how the loader prepares each weight once: stacked with the
other projections of the same input, and multiplied plain, or through a packed copy where that measures faster.

Facts a reader must know:
- A decode step multiplies every weight by 1 row, a verify of K drafts by K + 1. A small model's step is
  bound by the cost of each call into PyTorch, a large one's by streaming its weights from memory. A plain
  product is one `torch.matmul` on the weight's transpose, a view taken once at load (7 ATen operations;
  `F.linear` on a 3-d input dispatches 11, its transpose among them, on every call).
- Stacking: projections of the same input (q/k/v of a layer that computes its own K/V; gate/up) become one
  (O1 + O2 + .., I) product, so one call and one pass over the input instead of two or three. The stacked
  weight is made once, after loading; the parameters stay the checkpoint's tensors under their own names
  (state_dict, strict loading, training), as views of the stacked rows where the stack is kept plain.
- Packing: oneDNN can lay a weight out once in its own blocked layout (`_reorder_linear_weight`) and
  multiply by it with `_linear_pointwise`: the pair torch.compile's CPU backend emits for a linear layer.
  Whether that beats the plain product depends on the CPU and the weight: on one AVX2 machine it streamed
  a (12288, 1536) float32 weight at ~22 GB/s against ~14 for 1 row, on an AVX-512 one it made mid-size
  (2048, 512) weights 13-20% slower. Same sums in another order: ~1e-6 relative in float32.
- So the rule is a measurement (`measure`): for each distinct (shape, dtype) of a model, the plain and
  the packed product of the real weight are timed for 1 row and for K + 1 = `VERIFY_ROWS` rows, and
  oneDNN's product on the unpacked weight for K + 1 rows (below), the five alternating, each the best
  of `REPS` (minima: a neighbour's load only ever adds time). The packed copy is kept only where it is
  faster than the better plain kernel for every row count the model will multiply: for both by
  default, so a packed model is never slower than `pack=False` beyond the timing noise; for the K + 1
  rows alone where the caller says the model only verifies (`decodes=False`: the target of a
  speculative run multiplies K + 1 rows a round, never 1). Cost: ~10-20 ms a shape for a small weight
  (each timing repeats the product up to ~0.2 ms), 3-5 timings of each product for a large one (~1 s
  for E2B's (32768, 1536) float32 head); the loaders report every decision and its cost (`Choice`,
  the models' `packing`).
- Two kernels on one plain weight: MKL (`torch.matmul`) multiplies 1-3 rows as matrix-vector products,
  at the rate the weight streams from memory, but takes ~2x that time for 4-5 rows and ~3x for 9, at
  every size (on one AVX-512 CPU, 1 thread: E2B's (24576, 1536) 10.1 / 11.2 / 21.8 / 33.6 ms for 1 / 3 /
  5 / 9 rows). oneDNN's product on the same unpacked weight (`_linear_pointwise` with a plain tensor:
  no copy, no cache) takes 14.6 / 17.2 ms for 5 / 9 rows there (packed: 13.4 / 15.6), though no less
  than MKL's on weights the caches hold. So a plain product sends inputs of at least K + 1 rows to
  oneDNN where that measured faster (`Product.onednn_rows`) and keeps MKL below: the decode step is
  untouched. No other plain layout tried came under ~1.9x of 1 row for 5 (`F.linear`, the transpose
  stored contiguous, outputs or inputs split into chunks, MKL's own packed weight).
- Packed, 5 rows cost 1.0-1.2x of 1 row, but 1 row costs 1.1-1.3x the plain time at every size
  (oneDNN's per-call cost, and a layout that streams less well for one row): the same trade on a
  bench-size (4096, 512) weight as on E2B's, so a rule on these timings alone packs both models or
  neither, and keeping both layouts would double the weights' memory: hence the caller's `decodes`.
- A prepared product is made from some parameters and serves only while they are the same tensors, with
  autograd off and an input of its dtype. A plain product multiplies views of them (or they are views of
  its stack), so it follows their in-place changes; a packed copy and a stacked norm weight are copies, so
  an in-place change (an optimizer step, a `copy_`: the version counter moves) retires them. Anything else
  takes `F.linear` on the parameters themselves: the plain fallback.

Shape legend: N rows (tokens), I in features, O out features.
"""

import copy
import time
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

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


def version(t: torch.Tensor) -> int:
    """t's version counter; -1 for a tensor made under inference mode, which has none (and cannot be changed
    in place outside it)."""
    return -1 if t.is_inference() else t._version


def unchanged(sources: tuple[torch.Tensor, ...], made_from: tuple[torch.Tensor, ...], versions: tuple[int, ...] | None
              ) -> bool:
    """Are `sources` the tensors something was made from (and, given their `versions` then, unchanged since),
    with autograd off? Without versions, identity alone: a view of the sources follows their changes."""
    if torch.is_grad_enabled() or len(sources) != len(made_from):
        return False
    for source, mine, made in zip(sources, made_from, versions or made_from):
        if source is not mine or (versions is not None and version(source) != made):
            return False
    return True


class Prepared:
    """A tensor the loader derived once from some parameters (a stacked norm weight): valid while `unchanged`."""

    def __init__(self, sources: tuple[torch.Tensor, ...], value: torch.Tensor) -> None:
        self.sources, self.value = sources, value
        self.versions = tuple(version(s) for s in sources)

    def serves(self, sources: tuple[torch.Tensor, ...]) -> bool:
        return unchanged(sources, self.sources, self.versions)

    def __deepcopy__(self, memo: dict) -> "Prepared":
        return Prepared(copy.deepcopy(self.sources, memo), copy.deepcopy(self.value, memo))


class Product:
    """One weight (O, I), or several stacked by rows, prepared once for inference: plain (its transpose, a view)
    or packed (oneDNN's opaque copy). Serves while its `sources` are the same tensors, unchanged.

    `onednn_rows` (plain only; 0: never): inputs of at least that many rows go to oneDNN's product on the
    same unpacked weight, where `measure` found it faster than `torch.matmul` for that many (K + 1); fewer
    rows stay with `torch.matmul` (MKL multiplies 1-3 rows as matrix-vector products, at streaming speed)."""

    def __init__(self, sources: tuple[torch.Tensor, ...], weight: torch.Tensor, packed: bool,
                 blocked: torch.Tensor | None = None, onednn_rows: int = 0) -> None:
        self.sources = sources
        self.versions = tuple(version(s) for s in sources)  # bumped by every in-place change to a source
        self.shape, self.dtype, self.packed = tuple(weight.shape), weight.dtype, packed  # (O, I)
        self.out_features = weight.shape[0]
        self.onednn_rows = 0 if packed else onednn_rows
        # Packed: the opaque layout (no views, no autograd, no storage; `blocked` if one was already made).
        # Plain: the (I, O) transpose, a view made once rather than per call.
        self.operand = (blocked if blocked is not None else block(weight)) if packed else weight.t()

    def serves(self, x: torch.Tensor, sources: tuple[torch.Tensor, ...]) -> bool:
        # A plain operand is a view of the parameters (or they of it): it follows every in-place change. A
        # packed copy is a copy: an in-place change retires it.
        return x.dtype == self.dtype and unchanged(sources, self.sources, self.versions if self.packed else None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., I) -> (..., O)."""
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.operand, None, "none", [], "")
        if self.onednn_rows and x.numel() >= self.onednn_rows * x.shape[-1]:  # many rows: the weight (O, I) as it is
            return torch.ops.mkldnn._linear_pointwise(x, self.operand.t(), None, "none", [], "")
        return torch.matmul(x, self.operand)  # (..., I) @ (I, O): one call from Python, folded into one mm

    def __deepcopy__(self, memo: dict) -> "Product":
        # The opaque tensor cannot be copied (it has no storage) and need not be: it is never written. The
        # copy serves the copied parameters, which deepcopy makes once and finds in `memo`; a plain operand
        # is a view of one of them (or of their stack), copied with its base.
        twin = object.__new__(Product)
        twin.__dict__ = {k: v if k == "operand" and self.packed else copy.deepcopy(v, memo)
                         for k, v in self.__dict__.items()}
        twin.versions = tuple(version(s) for s in twin.sources)  # the copies' own counters
        return twin


def block(weight: torch.Tensor) -> torch.Tensor:
    """oneDNN's opaque copy of weight (O, I), the same numbers in its blocked layout."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), ROWS_HINT)


def linear(x: torch.Tensor, weights: torch.Tensor | tuple[torch.Tensor, ...], product: Product | None = None
           ) -> torch.Tensor:
    """x (..., I) @ weight (O, I).T -> (..., O); a tuple of weights is stacked by rows: (..., O1 + O2 + ..).
    Through the loader's product when it serves (see above), else `F.linear` on the parameters."""
    weights = weights if isinstance(weights, tuple) else (weights,)
    if product is not None and product.serves(x, weights):
        return product(x)
    # A weight kept in its file's dtype beside a packed copy (weights.py) is cast per call, as PLE rows are.
    weight = torch.cat(weights) if len(weights) > 1 else weights[0]  # per call: training, or an unprepared model
    return F.linear(x, weight if weight.dtype == x.dtype else weight.to(x.dtype))


class Linear(nn.Linear):
    """All of Gemma 4's projections: no bias (`attention_bias` is false in every release).

    Called ~150 times per decoded token, so directly: nn.Module.__call__ (hook dispatch) costs ≈ 2 µs a
    call. Hooks on it would not run; on layers and larger modules they do.
    """

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__(in_features, out_features, bias=False)
        self.product: Product | None = None  # set by weights.prepare_weights; not a parameter, not in state_dict

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.product)

    __call__ = forward  # no hook dispatch, see above


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
    ways = {"plain": Product((), weight, False), "packed": Product((), weight, True),
            "onednn": Product((), weight, False, onednn_rows=rows)}  # its 1-row product is the plain one
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
