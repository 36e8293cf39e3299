"""The MoE experts without a host read: for a GPU, and for a compiled step on any device.

`Experts.forward` (gemma4/moe.py) asks the host which experts the router chose (`experts.unique().tolist()`),
then multiplies each one's tokens by its weights. On a GPU that read waits for every kernel queued before it, once
per MoE layer, and a graph cannot hold a loop whose length depends on the data. `GatheredExperts` computes the
same sum with shapes fixed by the row count alone:
- Few (token, slot) pairs (N * k < X: a decode step, a verify): each pair's expert weights are gathered by the
  device's own indices (`weight[experts]`, (N*k, 2I, E)) and multiplied in one batched product. The gather copies
  k experts a token (26B-A4B: 95 MB a layer in bfloat16, tens of microseconds on a GPU) against a stall a layer; on
  a CPU, where a read costs nothing, the copy would be the cost alone, so eager CPU models keep the loop
  (`gather_experts` is applied by the loaders off the CPU; scripts/benchmark.md has both measured on a CPU).
  A compiled step gathers for its row counts, whatever X is.
- Many (a prefill): the loop of `Experts.forward`. Its one read a layer is spread over many tokens, and the
  gather would copy more expert weights than there are experts.
Same products as the loop, token by token, summed over the k slots in another order: equal to about 1e-7
relative in float32 (gemma4/fast/README.md).

On the CPU the loop stays, and `TokenExperts` runs it token by token within a step: a token's expert products then
have one row, as in a decode step, so a verify or batch row gets the decode step's bits (gemma4/fast/rows.py).

Shape legend: N tokens (B*T), E hidden size, X experts, I expert width, k experts per token.
"""

import torch
from torch import nn

from gemma4.fast.modules import adopt
from gemma4.fast.rows import STEP_ROWS
from gemma4.moe import Experts
from gemma4.norms import gelu


class GatheredExperts(Experts):
    rows: int  # tokens up to which it gathers whatever X is (a compiled step's); past them, from X pairs on, the loop

    def forward(self, u: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """u (N, E), weights/experts (N, k) -> (N, E), as Experts.forward, reading nothing below X pairs."""
        n, k = experts.shape
        if n > self.rows and n * k >= self.gate_up_proj.shape[0]:  # on shapes alone: a compiled step traces one side
            return super().forward(u, weights, experts)
        chosen = experts.flatten()  # (N*k,): token 0's k experts, then token 1's, ...
        x = u.repeat_interleave(k, dim=0)[:, :, None]  # (N*k, E, 1)
        gate, up = torch.bmm(self.gate_up_proj[chosen], x).squeeze(-1).split(self.width, dim=-1)  # (N*k, I) each
        y = torch.bmm(self.down_proj[chosen], (gelu(gate) * up)[:, :, None]).view(n, k, -1)  # (N, k, E)
        return (y.to(weights.dtype) * weights[:, :, None]).sum(dim=1).to(u.dtype)  # fp32 sum, as the loop's


class TokenExperts(Experts):
    """`Experts.forward`'s loop for one token at a time in a step of up to STEP_ROWS tokens; a prefill loops as one."""

    def forward(self, u: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        n = u.shape[0]
        if n == 1 or n > STEP_ROWS:
            return Experts.forward(self, u, weights, experts)
        rows = [Experts.forward(self, u[i:i + 1], weights[i:i + 1], experts[i:i + 1]) for i in range(n)]
        return torch.cat(rows)  # (N, E)


def by_token(model: nn.Module) -> None:
    """Swap every `Experts` of `model` for a `TokenExperts` holding the same parameters (the eager CPU model's)."""
    for name, module in list(model.named_modules()):
        if type(module) is Experts:
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, adopt(TokenExperts, module))


def gather_experts(model: nn.Module, rows: int = 0) -> list[tuple[str, Experts]]:
    """Swap every `Experts` of `model` for a `GatheredExperts` holding the same parameters, gathering below X
    (token, slot) pairs and for up to `rows` tokens whatever X is (a compiled step's row counts: a graph cannot
    hold the loop). Returns (name, the module replaced), so a caller can put them back."""
    replaced = []
    for name, module in list(model.named_modules()):
        if isinstance(module, Experts):
            gathered = adopt(GatheredExperts, module)  # the same parameters; a GatheredExperts gets a new threshold
            gathered.rows = rows
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, gathered)
            replaced.append((name, module))
    return replaced
