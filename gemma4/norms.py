"""RMSNorm and the GELU of Gemma 4, as every model file here uses them.

Facts a reader must know: RMSNorm multiplies by its weight directly (not 1 + w), and the norm is
taken in fp32 for bf16 and fp32 models (float64 for the tests' float64 models), then cast back once.
The speed layer computes the same numbers in fewer operator calls (gemma4/fast/norms.py)."""

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def wide(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the sensitive steps: fp32 for bf16 and fp32 models (gemma4/README.md §14),
    float64 for tests' float64 models."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def rms_norm(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    """gemma4/README.md §4: x * (mean(x²) + eps)^-1/2 in fp32, times the weight directly (not 1 +
    w), cast back."""
    xf = x.to(wide(x.dtype))  # (..., n)
    out = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    if weight is not None:
        # In fp32, then one rounding.
        out = out * weight.to(xf.dtype)
    return out.to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


def gelu(x: Tensor) -> Tensor:
    return F.gelu(x, approximate="tanh")  # `gelu_pytorch_tanh` in config.json
