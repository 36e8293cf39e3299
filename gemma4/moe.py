"""The Mixture-of-Experts block of Gemma 4 26B-A4B: a router and X experts, run beside the dense
MLP.

Facts a reader must know:
- The router normalises the residual without a weight, scales it, and keeps the top k of a softmax
  over X experts, renormalised over those k and scaled per expert; the weights are fp32 (at least).
- Each expert is a gated GELU MLP of width I whose gate and up rows are stored stacked
  (`gate_up_proj`).
- The weighted sum over a token's k experts is taken in fp32 and cast back.

Shape legend: N tokens (B*T), E hidden size, X experts, I expert width, k experts per token, n
tokens of one expert."""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gemma4.config import TextConfig
from gemma4.norms import gelu, rms_norm, wide


class Router(nn.Module):
    def __init__(self, config: TextConfig) -> None:
        super().__init__()
        self.eps, self.top_k = config.rms_norm_eps, config.top_k_experts
        self.root_size = config.hidden_size**-0.5  # a plain float multiplier (gemma4/README.md §14)
        self.proj = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.scale = nn.Parameter(torch.empty(config.hidden_size))
        self.per_expert_scale = nn.Parameter(torch.empty(config.num_experts))

    def forward(self, r: Tensor) -> tuple[Tensor, Tensor]:
        """r (N, E) -> weights (N, k) in fp32 (at least) and expert ids (N, k)."""
        z = rms_norm(r, None, self.eps) * self.scale * self.root_size  # weightless norm, then scale
        # (N, X), fp32 in a bf16 model
        prob = torch.softmax(self.proj(z), dim=-1, dtype=wide(r.dtype))
        weights, experts = torch.topk(prob, self.top_k, dim=-1)  # (N, k)
        weights = weights / weights.sum(dim=-1, keepdim=True)  # renormalise over the chosen k
        return weights * self.per_expert_scale[experts], experts


class Experts(nn.Module):
    def __init__(self, config: TextConfig) -> None:
        super().__init__()
        x, i, e = config.num_experts, config.moe_intermediate_size, config.hidden_size
        self.width = i
        self.gate_up_proj = nn.Parameter(torch.empty(x, 2 * i, e))  # gate rows first, then up
        self.down_proj = nn.Parameter(torch.empty(x, e, i))

    def forward(self, u: Tensor, weights: Tensor, experts: Tensor) -> Tensor:
        """u (N, E), weights/experts (N, k) -> (N, E): each token's weighted sum over its k experts.
        """
        # The weighted sum is fp32 (gemma4/README.md §10 step 5).
        out = torch.zeros_like(u, dtype=weights.dtype)
        # Loop over the experts actually chosen, each taking its tokens in one matmul.
        for expert in experts.unique().tolist():
            token, slot = torch.where(experts == expert)  # (n,), (n,)
            # (n, I) each
            gate, up = F.linear(u[token], self.gate_up_proj[expert]).split(self.width, dim=-1)
            y = F.linear(gelu(gate) * up, self.down_proj[expert])  # (n, E)
            out.index_add_(0, token, y.to(out.dtype) * weights[token, slot, None])
        return out.to(u.dtype)
