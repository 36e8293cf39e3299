"""RMSNorm and the GELU of Gemma 4, as every model file here uses them.

Facts a reader must know:
- RMSNorm multiplies by its weight directly (not 1 + w), and the norm is taken in fp32 for bf16 and fp32
  models (float64 for the tests' float64 models), then cast back once.
- Both are called per layer on a decode step's small tensors, where each ATen call costs about as much as
  its arithmetic: see `rms_norm` for the calls and the alternatives measured.
"""

from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn


def wide(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the sensitive steps: fp32 for bf16 and fp32 models (gemma4/README.md §14), float64 for tests' float64 models."""
    return torch.float64 if dtype == torch.float64 else torch.float32  # a plain branch: no dispatcher call


@lru_cache
def eps_tensor(eps: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.tensor(eps, dtype=dtype, device=device)  # made once: a float operand is a new tensor per call


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """gemma4/README.md §4: x * (mean(x²) + eps)^-1/2 in fp32, times the weight directly (not 1 + w), cast back.

    Seven ATen calls (`F.rms_norm` is a composite of 24 on the CPU); a decode step runs ~150 norms. The
    alternatives measured: scripts/benchmark.md.
    """
    dtype = wide(x.dtype)
    xf = x if x.dtype == dtype else x.to(dtype)
    squares = (xf * xf).sum(dim=-1, keepdim=True)  # (..., 1)
    inv_rms = torch.add(eps_tensor(eps, dtype, x.device), squares, alpha=1 / x.shape[-1]).rsqrt_()  # (..., 1)
    out = xf * inv_rms  # (..., n)
    if weight is not None:
        out = out * (weight if weight.dtype == dtype else weight.to(dtype))  # in fp32, then one rounding
    return out if out.dtype == x.dtype else out.to(x.dtype)


# RMSNorm is called ~150 times per decoded token, so directly: nn.Module.__call__ (hook dispatch)
# costs about 2 µs a call. Hooks on it would not run.

class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)

    __call__ = forward  # no hook dispatch, see above


def gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")  # `gelu_pytorch_tanh` in config.json
