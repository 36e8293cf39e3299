"""The speed layer's int4 product: torch's int4 matrix kernels multiply by the packed weights directly, so no
floating-point copy of a weight is ever formed (the textbook's `Int4Linear`, gemma4/int4.py, forms one per call).

- Both kernels compute x @ ((u − 8) · scale + zero).T per group of 32 inputs, u the stored nibble 0..15: with
  zero 0 that is exactly the textbook's q · s, summed in another order (float32: about 1e-6 relative).
- CPU: `_convert_weight_to_int4pack_for_cpu(u, 1)` takes u as int32 (O, I) and returns its own packed layout,
  half a byte a weight; `_weight_int4pack_mm_for_cpu(x, packed, 32, sz)` multiplies, x (N, I) in float32 or
  bfloat16, sz (G, O, 2) = (scale, zero) in x's dtype. Needs O a multiple of 16 and I of 32.
- CUDA: `_convert_weight_to_int4pack(b, tiles)` takes b uint8 (O, I/2), two nibbles a byte with the *earlier*
  element in the high nibble (the file's words put it in the low one), and `_weight_int4pack_mm` multiplies
  bfloat16 activations only. Needs O a multiple of 8 and I of 16 · tiles (tiles 8, 4 or 2).
- Elsewhere (other sizes, float32 on CUDA, another device) the layer stays the textbook's, which dequantizes
  each call; the decision and its reason are among those `make_fast` returns and `kernels_of` lists.
- Bytes: the packed copy is half a byte a weight, and sz holds a zero beside every scale in x's dtype:
  0.125 bytes a weight in bfloat16 (all told 0.31 of bfloat16's two bytes), 0.25 in float32 (0.375). The
  textbook's buffers stay as the loader left them: on the CPU unread views of the file's pages, which the
  product is made from through a mapping of its own (gemma4/fast/apply.py).

Shape legend: N rows (tokens), I in features, O out features, G = I/32 groups.
"""

import torch
from torch import Tensor, nn

from gemma4.fast.kernels import Choice
from gemma4.fast.rows import AS_CALLED, by_plan
from gemma4.int4 import GROUP, Int4Linear, unpack

OFFSET = 8  # the stored nibble is q + 8


def int4_kernel(out_features: int, in_features: int, dtype: torch.dtype, device: torch.device) -> str | None:
    """Which kernel multiplies an (O, I) int4 weight for activations of `dtype` on `device`, or why none does."""
    if device.type == "cpu":
        if out_features % 16 or in_features % GROUP:
            return None
        return "cpu" if dtype in (torch.float32, torch.bfloat16) else None
    if device.type == "cuda":
        if dtype != torch.bfloat16 or out_features % 8 or in_features % 32:
            return None
        return "cuda"
    return None


def inner_tiles(in_features: int) -> int:
    """The CUDA layout's inner k tiles: the most of 8, 4, 2 whose 16 · tiles divides I."""
    return next(t for t in (8, 4, 2) if in_features % (16 * t) == 0)


class Int4Product:
    """One int4 weight (O, I), or several stacked by rows, prepared once in a kernel's layout. `__call__` as
    `Product`'s: x (..., I) -> (..., O)."""

    def __init__(self, words: Tensor, scales: Tensor, dtype: torch.dtype, choice: Choice) -> None:
        self.choice = choice
        o, i = words.shape[0], words.shape[1] * 8
        self.shape, self.dtype, self.in_features, self.device = (o, i), dtype, i, words.device
        self.kernel = int4_kernel(o, i, dtype, words.device)  # "cpu" or "cuda"
        # Not oneDNN's: nothing for `--compile`'s preparation to make plain (gemma4/fast/static.py).
        self.packed, self.onednn = False, (False, False)
        stored = unpack(words).to(torch.int32) + OFFSET  # (O, I) the nibbles again, 0..15
        # (G, O, 2): each group's scale, and a zero of 0 (the scheme is symmetric).
        sz = torch.stack([scales.t(), torch.zeros_like(scales.t())], dim=-1).to(dtype).contiguous()
        if self.kernel == "cpu":
            self.layout = torch.ops.aten._convert_weight_to_int4pack_for_cpu(stored, 1)
        else:
            pairs = (stored[:, ::2] << 4 | stored[:, 1::2]).to(torch.uint8)  # (O, I/2): element 2j high, 2j+1 low
            self.layout = torch.ops.aten._convert_weight_to_int4pack(pairs, inner_tiles(i))
        self.sz = sz
        self.plan = AS_CALLED  # how a step's rows are cut for row-invariant bits: measured by make_fast (rows.py)

    def __call__(self, x: Tensor) -> Tensor:
        """x (..., I) -> (..., O), each row of a step with the bits it has in any other step (`plan`)."""
        return by_plan(self.multiply, x, self.plan, self.shape[0])

    def multiply(self, x: Tensor) -> Tensor:
        """x (..., I) -> (..., O) in one call to the kernel."""
        rows = x.reshape(-1, self.in_features)  # (N, I)
        if self.kernel == "cpu":
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.layout, GROUP, self.sz)
        else:
            out = torch.ops.aten._weight_int4pack_mm(rows, self.layout, GROUP, self.sz)
        return out.view(*x.shape[:-1], self.shape[0])  # (N, O) -> (..., O)

    def nbytes(self) -> int:
        """The bytes this product holds: the packed weight and its scales and zeros."""
        return self.layout.numel() * self.layout.element_size() + self.sz.numel() * self.sz.element_size()


def int4_product(words: Tensor, scales: Tensor, dtype: torch.dtype) -> tuple[Int4Product | None, Choice]:
    """words (O, I/8), scales (O, G), the activations' dtype -> the product (None: the textbook layer stays) and
    the decision, with its reason."""
    o, i = words.shape[0], words.shape[1] * 8
    name = str(dtype).removeprefix("torch.")
    kernel = int4_kernel(o, i, dtype, words.device)
    if kernel is None:
        why = (f"no int4 kernel for ({o}, {i}) in {name} on {words.device.type}: the textbook layer dequantizes "
               f"each call")
        return None, Choice((o, i), "int4 " + name, ("dequantize", "dequantize"), why)
    choice = Choice((o, i), "int4 " + name, ("int4", "int4"), f"torch's int4 kernel on {words.device.type}")
    return Int4Product(words, scales, dtype, choice), choice


class PlannedInt4Linear(Int4Linear):
    """An int4 layer no kernel takes (its sizes): the textbook's dequantize-then-multiply, a step's rows cut by a
    measured row plan (gemma4/fast/rows.py) as every product of the speed layer is. Still an `Int4Linear`."""

    def forward(self, x: Tensor) -> Tensor:
        return by_plan(super().forward, x, self.plan, self.out_features)  # (..., I) -> (..., O)


class FastInt4Linear(nn.Module):
    """Replaces an `Int4Linear`: the same buffers (the state dict is the checkpoint's), multiplied by the kernel."""

    def __init__(self, plain: Int4Linear, product: Int4Product) -> None:
        super().__init__()
        self.in_features, self.out_features = plain.in_features, plain.out_features
        for name in ("weight_packed", "weight_scale", "weight_shape"):
            self.register_buffer(name, getattr(plain, name))
        self.product = product

    def forward(self, x: Tensor) -> Tensor:
        return self.product(x)  # (..., I) -> (..., O)

    __call__ = forward  # no hook dispatch, as FastLinear
