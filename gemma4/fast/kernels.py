"""The products the speed layer multiplies by, and the rule that picks a weight's kernel.

- A plain product is one `torch.matmul` on the weight's transpose, a view taken once at load (7 ATen calls;
  `F.linear` on a 3-d input dispatches 11, its transpose among them, on every call).
- A packed product multiplies by oneDNN's copy of the weight in its own blocked layout
  (`_reorder_linear_weight`, then `_linear_pointwise`: the pair torch.compile's CPU backend emits for a
  linear layer). Same sums in another order: about 1e-6 relative in float32.
- oneDNN's product on the *unpacked* weight (`_linear_pointwise` with a plain tensor: no copy) is a third kernel,
  reached only by forcing it (`make_fast(..., kernels=...)`).
- The rule (`choose`): a weight oneDNN can multiply (`packable`: CPU, float32, or bfloat16 where oneDNN has
  bfloat16 kernels) of `PACK_MIN` elements or more is packed, for every row count; any other weight is plain,
  `torch.matmul` for every row count. It reads the device, the dtype, oneDNN's bfloat16 support and the shape,
  never a timing, so one machine makes the same choices, and so the same float32 sums and tokens, on every
  load. Why this threshold, with the figures of three CPUs: gemma4/fast/README.md.

Shape legend: N rows (tokens), I in features, O out features.
"""

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch

from gemma4.fast.rows import AS_CALLED, by_plan

VERIFY_ROWS = 5  # K + 1 for the default K = 4: the rows of the default verify
PACK_MIN = 2 ** 20  # elements (4 MiB in float32): from here on a packed weight is packed; below it, plain
NO_KERNEL = "no oneDNN kernel for this device or dtype"
# torch.matmul, oneDNN on the plain weight, oneDNN on its packed copy; and for int4 weights (gemma4/fast/int4.py)
# torch's int4 kernel, or the textbook layer dequantizing each call.
KERNELS = ("mkl", "onednn", "packed", "int4", "dequantize")
ROWS_HINT = 8  # the row count oneDNN picks its layout for: verifies multiply 2-9 rows, a decode step 1
# torch hands a CPU bfloat16 `mm` of more multiply-adds than this (N * I * O) to oneDNN, a smaller one to its own
# gemm (aten/src/ATen/native/mkldnn/Matmul.cpp, `mkldnn_gemm_min_size`): a tiny product changes library with N.
MATMUL_ONEDNN_MIN = 16 ** 3
ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def packable(weight: torch.Tensor) -> bool:
    """Can this weight have a packed copy at all? CPU, a build with oneDNN, float32 (or bfloat16 on a CPU with
    oneDNN's bfloat16 kernels: AVX-512 or AVX-NE-CONVERT; AVX2 has none). Whether it gets one is `choose`'s."""
    if not (ONEDNN and weight.device.type == "cpu" and weight.dim() == 2):
        return False
    if weight.dtype == torch.bfloat16:
        return torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return weight.dtype == torch.float32


class Product:
    """One weight (O, I), or several stacked by rows, prepared once for inference in one layout: plain (the weight
    and its transpose, views) or packed (oneDNN's opaque copy). `onednn` is the kernel per row count: for 1 row
    and for 2 or more, oneDNN's `_linear_pointwise` (True) or `torch.matmul` (False: MKL on a CPU; plain only)."""

    def __init__(self, weight: torch.Tensor, packed: bool, onednn: tuple[bool, bool] = (False, False),
                 choice: "Choice | None" = None) -> None:
        self.choice = choice  # the decision it was made by, for reports
        self.shape, self.dtype, self.packed = tuple(weight.shape), weight.dtype, packed  # (O, I)
        self.device = weight.device
        self.in_features = weight.shape[1]  # I: more input numbers than that is more than 1 row
        self.onednn = (True, True) if packed else onednn  # (1 row, 2 or more rows)
        # oneDNN's operand. Packed: the opaque layout (no views, no autograd, no storage). Plain: the weight (O, I).
        self.weight = block(weight) if packed else weight
        self.operand = self.weight if packed else weight.t()  # MKL's: the (I, O) transpose, a view
        self.plan = AS_CALLED  # how a step's rows are cut for row-invariant bits: measured by make_fast (rows.py)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., I) -> (..., O), each row of a step with the bits it has in any other step (`plan`)."""
        return by_plan(self.multiply, x, self.plan, self.shape[0])

    def multiply(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., I) -> (..., O) in one call to the kernel."""
        if self.onednn[x.numel() > self.in_features]:  # [0]: 1 row, a decode step; [1]: a verify or a prefill
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, None, "none", [], "")
        return torch.matmul(x, self.operand)  # (..., I) @ (I, O): one call from Python, folded into one mm


def block(weight: torch.Tensor) -> torch.Tensor:
    """oneDNN's opaque copy of weight (O, I), the same numbers in its blocked layout."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), ROWS_HINT)


# ---------------------------------------------------------------- the kernel decision

@dataclass(frozen=True)
class Choice:
    """One (shape, dtype)'s decision and the reason for it."""
    shape: tuple[int, int]
    dtype: str
    kernels: tuple[str, str]  # the kernel for 1 row and for 2 or more, each of KERNELS
    why: str
    rows: str = ""  # how a step's rows are cut so that each gets the same bits (rows.py), once measured

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

    def as_dict(self) -> dict[str, Any]:
        """The fields and what they imply, for a JSON report (scripts/benchmark.py)."""
        return {f.name: getattr(self, f.name) for f in fields(self)} | {"packed": self.packed}


def library_of(choice: Choice, dtype: torch.dtype, device: torch.device) -> Callable[[int], str]:
    """n -> the library a call of n rows of `choice`'s product runs in, as far as the dispatch is known: its
    kernel for 1 row or for more; and a `torch.matmul` (or the dequantizing layer's `F.linear`) in bfloat16 of at
    most MATMUL_ONEDNN_MIN multiply-adds in torch's own gemm, a larger one in oneDNN. The two round alike so often
    that measuring alone could miss it: rows.py `measure` keeps a plan's calls in the 1-row call's library."""
    out_features, in_features = choice.shape
    onednn_bf16 = (dtype == torch.bfloat16 and device.type == "cpu" and torch.backends.mkldnn.is_available()
                   and torch.ops.mkldnn._is_mkldnn_bf16_supported())

    def library(n: int) -> str:
        kernel = choice.kernels[n > 1]
        if kernel in ("mkl", "dequantize") and onednn_bf16 and n * in_features * out_features > MATMUL_ONEDNN_MIN:
            return "onednn"
        return kernel
    return library


def _described(weight: torch.Tensor) -> tuple[tuple[int, int], str]:
    return tuple(weight.shape), str(weight.dtype).removeprefix("torch.")


def choose(weight: torch.Tensor) -> Choice:
    """The loaders' rule for weight (O, I): packed where oneDNN can multiply it and it has `PACK_MIN` elements or
    more, else `torch.matmul` for every row count. A function of the device, dtype and shape alone."""
    shape, name = _described(weight)
    if not packable(weight):
        return Choice(shape, name, ("mkl", "mkl"), NO_KERNEL)
    if weight.numel() < PACK_MIN:
        return Choice(shape, name, ("mkl", "mkl"), f"{weight.numel()} elements, under {PACK_MIN}: plain")
    return Choice(shape, name, ("packed", "packed"), f"{weight.numel()} elements, {PACK_MIN} or more: packed")


def forced(weight: torch.Tensor, kernels: tuple[str, str]) -> Choice:
    """A decision taken by the caller: `kernels` (1 row, 2 or more) where oneDNN can, else MKL's (tests force
    every choice)."""
    shape, name = _described(weight)
    if not packable(weight):
        return Choice(shape, name, ("mkl", "mkl"), NO_KERNEL)
    return Choice(shape, name, kernels, "forced")
