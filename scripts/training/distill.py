"""What `train_drafter.py` teaches the drafter: the target's distributions, three losses, on-policy data.

At one position let p be the target's distribution and q the drafter's, both warped the same way
(temperature, top-k, top-p). The speculative loop keeps a draft with probability
- sample drafting:  alpha = sum_x min(p(x), q(x)) = 1 - TV(p, q)   (the rejection rule's closed form);
- argmax drafting:  p(argmax q), at most max_x p(x): a ceiling set by the target, not the drafter;
- greedy:           [argmax q == argmax p].
The j-th draft of a round counts only if drafts 1..j-1 were kept, so a round of K drafts emits
1 + sum_j prod_{i<=j} alpha_i tokens per target forward. The losses, per position (summed when combined):
- `ce`: cross-entropy on the target's argmax (a hard label: what greedy decoding needs);
- `kl`: KL(p || q) over the whole vocabulary at T = 1 on the raw logits (DistillSpec's forward KL),
  so that a later warp treats both alike;
- `tv`: 1 - sum min(p, q) with both warped at each training temperature (top-k and top-p as masks),
  averaged over the temperatures: exactly one minus what sample drafting keeps. At temperature 0 p is
  the one-hot of the target's argmax and q the drafter's plain softmax (its argmax has no gradient),
  so the term is 1 - q(argmax p).
The centroid head's classifier learns the cluster mass of the teacher distributions the chosen losses
use (their mean), not one cluster: sample drafting can only draw tokens of the clusters it keeps.

The warps here are the loss side's own: masks are computed without gradients, the kept logits stay
differentiable. They follow the product's order (temperature, top-k, top-p, softmax); top-p is
applied among the top-k tokens only (ties at the k-th logit, rare in float logits, are ignored).

On-policy data: corpus prompts continued by the target itself with the product's keyed sampler, one
temperature per row from a mixture (0: greedy), then teacher-forced by the trainer like any text.

Shape legend: N positions, V vocab, C clusters, B batch, P prompt tokens, G generated tokens.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gemma4.engine import decode
from gemma4.model import Gemma4Model
from gemma4.sampling import SamplerConfig

LOSSES = ("ce", "kl", "tv")
DATA = ("greedy", "sampled")


@dataclass(frozen=True)
class Distill:
    """What the drafter learns from and how: the losses, the data, the sampler of data and `tv`."""
    losses: tuple[str, ...] = ("ce",)  # any of LOSSES, summed
    data: str = "greedy"  # continuations decoded greedily, or sampled at `temperatures`
    temperatures: tuple[float, ...] = (0.0,)  # the sampled data's mixture (one per row in turn); `tv`'s warps
    top_k: int = 64  # the product's sampler settings (Gemma 4's generation_config.json)
    top_p: float = 0.95

    def __post_init__(self) -> None:
        if not self.losses or any(loss not in LOSSES for loss in self.losses):
            raise ValueError(f"losses must be some of {', '.join(LOSSES)} joined by '+', got {'+'.join(self.losses)}")
        if self.data not in DATA:
            raise ValueError(f"data must be one of {', '.join(DATA)}, got {self.data!r}")
        if not self.temperatures or any(not t >= 0 for t in self.temperatures):
            raise ValueError(f"temperatures must be >= 0 (0 is greedy), got {self.temperatures}")


def parse_losses(text: str) -> tuple[str, ...]:
    """'kl+tv' -> ('kl', 'tv')."""
    return tuple(part.strip() for part in text.split("+"))


def parse_temperatures(text: str) -> tuple[float, ...]:
    """'0,0.7,1.0' -> (0.0, 0.7, 1.0)."""
    return tuple(float(part) for part in text.split(","))


# ---------------------------------------------------------------- warps (loss side)

def warped_top(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (N, V), temperature > 0 -> the top-k token ids (N, k) in descending order and their warped
    log-probabilities (N, k), -inf where top-p removed the token (k = V without top-k). Every token
    outside the k has probability 0, so the losses never build a (N, V) tensor per temperature."""
    x = logits.float() / temperature  # (N, V)
    k = top_k if 0 < top_k < x.shape[-1] else x.shape[-1]
    with torch.no_grad():
        ids = x.topk(k, dim=-1).indices  # (N, k), descending
    values = x.gather(1, ids)  # (N, k): the kept logits stay differentiable
    if top_p < 1:
        with torch.no_grad():
            # Removed: tokens whose ascending cumulative mass is <= 1 - top_p, i.e. the tokens that are
            # preceded, in descending order, by at least top_p of mass. The most likely one always stays.
            probs = values.softmax(dim=-1)  # (N, k): the mass after top-k
            keep = probs.cumsum(dim=-1) - probs < top_p  # (N, k): exclusive prefix sums
        values = values.masked_fill(~keep, float("-inf"))
    return ids, values.log_softmax(dim=-1)


def teacher_at(p_logits: torch.Tensor, temperature: float, top_k: int, top_p: float
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's warped distribution as (ids (N, k), probabilities (N, k)); temperature 0 is the
    argmax's one-hot (k = 1)."""
    if temperature == 0:
        ids = p_logits.argmax(dim=-1, keepdim=True)  # (N, 1)
        return ids, torch.ones(ids.shape, device=p_logits.device)
    ids, log_p = warped_top(p_logits, temperature, top_k, top_p)
    return ids, log_p.exp()


# ---------------------------------------------------------------- losses, per position

def ce_loss(q_logits: torch.Tensor, p_logits: torch.Tensor) -> torch.Tensor:
    """(N, V), (N, V) -> (N,) cross-entropy on the target's argmax."""
    return F.cross_entropy(q_logits.float(), p_logits.argmax(dim=-1), reduction="none")


def kl_loss(q_logits: torch.Tensor, p_logits: torch.Tensor) -> torch.Tensor:
    """(N, V), (N, V) -> (N,) KL(p || q) at T = 1, full vocabulary: sum_x p (log p - log q) >= 0."""
    log_p = p_logits.float().log_softmax(dim=-1)
    log_q = q_logits.float().log_softmax(dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(dim=-1)


def tv_loss(q_logits: torch.Tensor, p_logits: torch.Tensor, temperature: float, top_k: int, top_p: float
            ) -> torch.Tensor:
    """(N, V), (N, V) -> (N,) 1 - sum_x min(p(x), q(x)), both warped alike; the sum runs over p's kept
    tokens only (elsewhere p = 0). At temperature 0: 1 - q(argmax p), q the plain softmax."""
    with torch.no_grad():
        p_ids, p = teacher_at(p_logits, temperature, top_k, top_p)  # (N, k) each
    if temperature == 0:
        q_dense = q_logits.float().softmax(dim=-1)  # (N, V)
    else:
        q_ids, log_q = warped_top(q_logits, temperature, top_k, top_p)  # (N, k) each
        q_dense = torch.zeros_like(q_logits, dtype=torch.float32).scatter(1, q_ids, log_q.exp())  # (N, V)
    return 1 - torch.minimum(p, q_dense.gather(1, p_ids)).sum(dim=-1)


def distill_loss(q_logits: torch.Tensor, p_logits: torch.Tensor, cfg: Distill, cluster_of: torch.Tensor,
                 num_clusters: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, V), (N, V) -> the summed losses per position (N,), and what the centroids learn (N, C): the
    cluster mass of the mean of the distributions the chosen losses compare q with."""
    n, device = q_logits.shape[0], q_logits.device
    loss = torch.zeros(n, device=device)
    mass = torch.zeros(n, num_clusters, device=device)  # (N, C)
    for name in cfg.losses:
        with torch.no_grad():
            if name == "ce":
                mass[torch.arange(n, device=device), cluster_of[p_logits.argmax(dim=-1)]] += 1
            elif name == "kl":
                mass += cluster_mass(p_logits.float().softmax(dim=-1), cluster_of, num_clusters)
            else:
                for t in cfg.temperatures:
                    ids, p = teacher_at(p_logits, t, cfg.top_k, cfg.top_p)  # (N, k) each
                    mass.scatter_add_(1, cluster_of[ids], p / len(cfg.temperatures))
        if name == "ce":
            loss = loss + ce_loss(q_logits, p_logits)
        elif name == "kl":
            loss = loss + kl_loss(q_logits, p_logits)
        else:
            terms = [tv_loss(q_logits, p_logits, t, cfg.top_k, cfg.top_p) for t in cfg.temperatures]
            loss = loss + torch.stack(terms).mean(dim=0)
    return loss, mass / len(cfg.losses)


def cluster_mass(probs: torch.Tensor, cluster_of: torch.Tensor, num_clusters: int) -> torch.Tensor:
    """(N, V) -> (N, C): the probability of each cluster (the sum over its tokens)."""
    return probs.new_zeros(probs.shape[0], num_clusters).index_add_(1, cluster_of, probs)


def soft_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(N, C), (N, C) rows summing to 1 -> (N,) cross-entropy against a distribution."""
    return -(target * logits.float().log_softmax(dim=-1)).sum(dim=-1)


# ---------------------------------------------------------------- on-policy data

def row_samplers(rows: int, cfg: Distill, seed: int) -> list[SamplerConfig]:
    """Row b samples at temperatures[b % len] with its own seed (the CLI's rule: seed + b); greedy
    data is temperature 0 on every row."""
    temperatures = cfg.temperatures if cfg.data == "sampled" else (0.0,)
    return [SamplerConfig(temperature=temperatures[b % len(temperatures)], top_k=cfg.top_k, top_p=cfg.top_p,
                          seed=seed + b) for b in range(rows)]


def continuations(target: Gemma4Model, prompts: torch.Tensor, n: int, cfg: Distill, seed: int) -> torch.Tensor:
    """(B, P) -> (B, P + n): each prompt continued by the target, all rows in one batched decode."""
    rows = prompts.tolist()
    new = [r.tokens for r in decode(target, rows, n, row_samplers(len(rows), cfg, seed))]  # no stop ids: n each
    return torch.cat([prompts, torch.tensor(new, device=prompts.device)], dim=1)  # (B, P+n)
