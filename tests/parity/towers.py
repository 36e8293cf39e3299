"""What the media-tower parity tests (test_vision_tower.py, test_audio_tower.py) share: a transformers module's
weights drawn again by a rule of the test's own, ours loaded from its state dict, and the two checks by dtype."""

from collections.abc import Callable

import torch
from torch import nn

from tests.tolerance import assert_fp32_parity

SAME_MATH_ABS = 1e-10  # max |ours float64 - transformers float64|; float64 rounding alone stays near 1e-15
Normal = Callable[[torch.Size], torch.Tensor]  # shape -> N(0, 1) values, float64
Uniform = Callable[[torch.Size, float, float], torch.Tensor]  # shape, low, high -> U(low, high) values, float64
Rule = Callable[[str, torch.Tensor, Normal, Uniform], torch.Tensor]  # name, old value, draws -> new value


def redraw(module: nn.Module, seed: int, rule: Rule) -> None:
    """Every tensor of module's state dict drawn again by `rule`, from one generator of `seed`, then rounded through
    float32: the float64 and float32 models hold the same numbers, as one float32 file loaded in both dtypes would."""
    g = torch.Generator().manual_seed(seed)

    def normal(shape: torch.Size) -> torch.Tensor:
        return torch.randn(shape, generator=g, dtype=torch.float64)

    def uniform(shape: torch.Size, low: float, high: float) -> torch.Tensor:
        return low + (high - low) * torch.rand(shape, generator=g, dtype=torch.float64)

    new = {name: rule(name, t, normal, uniform).float().double() for name, t in module.state_dict().items()}
    module.load_state_dict(new, strict=True)


def ours(cls: type[nn.Module], config: object, state: dict[str, torch.Tensor]) -> nn.Module:
    """Our module of `config`, holding `state` (transformers' own, by name, strict) in its dtype."""
    with torch.device("meta"):
        model = cls(config)
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval()


def check(test: str, case: str, got: dict[torch.dtype, torch.Tensor], want: dict[torch.dtype, torch.Tensor],
          depth: int) -> None:
    """got, want: dtype -> output of ours, of transformers'."""
    err64 = float((got[torch.float64] - want[torch.float64]).abs().max())
    assert err64 < SAME_MATH_ABS, f"{test} [{case}]: float64 {err64:.2e}"
    assert_fp32_parity(test, case, got[torch.float32], want[torch.float32], got[torch.float64], want[torch.float64],
                       depth)
