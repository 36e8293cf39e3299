"""The device check's `attention` row: which scaled-dot-product attention kernel runs each call the models make.

The models call `F.scaled_dot_product_attention` with scale 1, grouped kv heads and, on most steps, an additive
mask (gemma4/model.py `attend`). Which kernel torch picks for a call depends on the device, dtype, head size, rows
and mask; on CUDA the loaders turn cuDNN's off (gemma4/fast/apply.py `choose_attention`). This times the default
choice and each backend forced alone, so a GPU run says which one the default is, and what the others would cost.
"""

import contextlib
import functools
import itertools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench.timing import Clock, interleaved

BF16, F32 = torch.bfloat16, torch.float32


BACKENDS = {"default": None, "flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}


def attention_check(device: torch.device, small: bool, reps: int, clock: Clock) -> dict[str, Any]:
    """Which scaled-dot-product attention kernel runs each call the models make, and its seconds: per head size
    (256 sliding, 512 full), query rows (1 decode, 5 a verify of K = 4) and mask (none, or the additive mask the
    loops pass), each backend forced alone (an error says it refuses the call) and the default's choice with the
    switches as loaded (`choose_attention`: cuDNN off on CUDA). bfloat16 on CUDA, float32 elsewhere."""
    dtype = BF16 if device.type == "cuda" else F32
    keys, heads = (40, 2) if small else (1000, 8)  # a key length no power of two, as a sliding ring's or a prefix
    out: dict[str, Any] = {"keys": keys, "heads": heads, "dtype": str(dtype).removeprefix("torch."),
                           "cudnn_sdp_enabled": torch.backends.cuda.cudnn_sdp_enabled()}
    for d, rows, masked in itertools.product((16, 32) if small else (256, 512), (1, 5), (False, True)):
        q = torch.randn(1, heads, rows, d, device=device, dtype=dtype)  # (B, H, T, D)
        k, v = (torch.randn(1, heads // 2, keys, d, device=device, dtype=dtype) for _ in range(2))  # (B, K, S, D)
        mask = torch.zeros(1, 1, rows, keys, device=device, dtype=dtype) if masked else None  # (B, 1, T, S) additive
        attend = functools.partial(F.scaled_dot_product_attention, q, k, v, attn_mask=mask, scale=1.0, enable_gqa=True)
        case = {name: timed(attend, backend, reps, clock) for name, backend in BACKENDS.items()}
        seconds = {n: t for n, t in case.items() if n != "default" and isinstance(t, float)}
        if isinstance(case["default"], float) and seconds:  # the forced backend whose time the default's is nearest
            case["default_is_like"] = min(seconds, key=lambda n: abs(seconds[n] - case["default"]))
        out[f"d{d}_rows{rows}_{'mask' if masked else 'nomask'}"] = case
    return out


def timed(attend: Callable[[], torch.Tensor], backend: SDPBackend | None, reps: int, clock: Clock
          ) -> float | dict[str, str]:
    """The median seconds of `attend` with `backend` alone allowed (None: torch's own choice), or the error with
    which the backend refuses the call."""
    try:
        with sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext():
            seconds, _ = interleaved({"a": attend}, reps, {"a": attend}, clock)
    except RuntimeError as e:
        return {"error": f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"}
    return sorted(seconds["a"])[len(seconds["a"]) // 2]
