"""The RMSNorm of gemma4/norms.py in fewer operator calls, for the speed layer.

A decode step runs ~150 norms on tensors so small that each ATen call costs about as much as its arithmetic:
the textbook `rms_norm` makes 8 calls (`F.rms_norm` is a composite of 24 on the CPU), `fast_rms_norm` 7 and
skips the casts that would do nothing; `FastRMSNorm` also skips nn.Module's hook dispatch (about 2 µs a
call), so hooks on it do not run. The numbers are the textbook's (tests/speed/test_fast.py compares them). The
alternatives measured: scripts/benchmark.md.
"""

from functools import lru_cache

import torch
from torch import nn

from gemma4.norms import RMSNorm, wide


@lru_cache
def eps_tensor(eps: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.tensor(eps, dtype=dtype, device=device)  # made once: a float operand is a new tensor per call


def fast_rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    dtype = wide(x.dtype)
    xf = x if x.dtype == dtype else x.to(dtype)
    squares = (xf * xf).sum(dim=-1, keepdim=True)  # (..., 1)
    inv_rms = torch.add(eps_tensor(eps, dtype, x.device), squares, alpha=1 / x.shape[-1]).rsqrt_()  # (..., 1)
    out = xf * inv_rms  # (..., n)
    if weight is not None:
        out = out * (weight if weight.dtype == dtype else weight.to(dtype))  # in fp32, then one rounding
    return out if out.dtype == x.dtype else out.to(x.dtype)


class FastRMSNorm(nn.Module):
    """An RMSNorm's weight (the same Parameter), normed by `fast_rms_norm`, called without hook dispatch."""

    def __init__(self, plain: RMSNorm) -> None:
        super().__init__()
        self.eps, self.weight = plain.eps, plain.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fast_rms_norm(x, self.weight, self.eps)

    __call__ = forward  # no hook dispatch, see above
