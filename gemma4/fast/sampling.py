"""Sampling that never waits for a GPU: the rule the speed layer gives a model off the CPU (gemma4/fast/apply.py).

The textbook's rule (gemma4/sampling.py `Sampling`) picks a row's candidates out with `nonzero`, and a verify's keyed
draws are taken one row at a time, stopping at the first draft the target does not draw. Each is a read of the
device: free on the CPU, a wait for the queue to drain on a GPU. `WholeRows` keeps every id of a row instead (p = 0
never wins a draw, so the tokens are the same up to float32 rounding of the probabilities: a near tie may then
draw another token), and draws every row of a verify at once, read in one go. It is one model's rule: another
model in the same process keeps its own."""

from collections.abc import Iterator

import torch

from gemma4.engine.sampling import Sampling
from gemma4.sampling import SamplerConfig


class WholeRows(Sampling):
    def support(self, x: torch.Tensor) -> torch.Tensor:
        """Every index of x (M,): no `nonzero`, which would wait for the device."""
        return torch.arange(x.shape[0], device=x.device)

    def draws(self, logits: torch.Tensor, cfg: SamplerConfig, stream: int, positions: list[int]) -> Iterator[int]:
        """Every row drawn on the device, all read at once: those past the first mismatch are then discarded."""
        return iter(self.sample(logits, cfg, stream, positions))


WHOLE_ROWS = WholeRows()
