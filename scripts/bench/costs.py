"""scripts/benchmark.py's `costs` and `bandwidth` sections, on any device: what a draft round and a verify cost
against a decode step, and a decode step against the memory-bandwidth bound.

- `costs`: seconds of a 1-token decode, (K+1)-token verifies and K-step draft rounds at the same position,
  K = 1..MAX_K, and the speedup they imply at acceptance α (i.i.d. acceptance: a round of K drafts commits
  (1 - α^(K+1)) / (1 - α) tokens on average; Leviathan et al. 2023).
- `bandwidth`: a decode step against the bound of weight bytes per step (memory.py `decode_bytes`) over the
  bandwidth of a large copy (read + written; the best copy: one slowed by a neighbour would flatter the
  ratio); and the largest product for 1, 2, 5 and 9 rows, plain and packed (oneDNN: CPU only). On a machine
  whose bandwidth moves with its neighbours' load, a median step against the best copy understates the step:
  `fraction_paired` sets each repetition's step against the faster of that repetition's copy and read (a sum
  over the same buffer, which streams as a decode step does: reads only), and takes the median.
Timed in turns on the clock of the model's device (timing.py).
"""

import statistics
from collections.abc import Callable
from typing import Any

import torch

from bench.memory import decode_bytes
from bench.timing import HOST, Clock, device_of, interleaved, median_ratio, prefilled
from gemma4.fast import Product
from gemma4.fast.apply import groups
from gemma4.fast.kernels import NO_KERNEL, packable
from gemma4.model import Gemma4Model
from mtp import Drafter
from gemma4.engine.forward import forward_rows
from mtp.engine.drafts import drafter_inputs, pairs, propose_rows, ring_kv

ALPHAS = (0.5, 0.7, 0.9)
MAX_K = 8
ROWS = (1, 2, 5, 9)  # a decode step multiplies 1 row, a verify of K drafts K + 1


@torch.inference_mode()
def cost_section(target: Gemma4Model, drafter: Drafter, prompt: list[int], reps: int, clock: Clock = HOST
                 ) -> dict[str, Any]:
    """Seconds of a 1-token decode, (K+1)-token verifies and K-step draft rounds at the same position."""
    p = len(prompt)
    cache, out = prefilled(target, prompt, MAX_K + 1)
    token, hidden, kv = int(out.logits[0, -1].argmax()), out.hidden[:, -1], ring_kv(cache, target, p)
    at = torch.tensor([p])  # (1,) on the host: every forward at position p
    runs: dict[str, Callable[[], Any]] = {"decode": lambda: forward_rows(target, torch.tensor([[token]]), cache, at)}
    for k in range(1, MAX_K + 1):
        runs[f"verify{k + 1}"] = lambda k=k: forward_rows(target, torch.tensor([[token] * (k + 1)]), cache, at)
        runs[f"draft{k}"] = lambda k=k: propose_rows(drafter, target, [token], hidden, [p], kv, k)[0].tolist()
    s, _ = interleaved(runs, reps, runs, clock)
    verify = {k: median_ratio(s[f"verify{k + 1}"], s["decode"]) for k in range(1, MAX_K + 1)}  # K drafts: K+1 rows
    draft = {k: median_ratio(s[f"draft{k}"], s["decode"]) for k in range(1, MAX_K + 1)}
    implied = {}
    for alpha in ALPHAS:
        speedup = {k: (1 - alpha ** (k + 1)) / (1 - alpha) / (draft[k] + verify[k]) for k in verify}
        best = max(speedup, key=speedup.get)
        implied[str(alpha)] = {"best_k": best, "speedup": speedup[best], "by_k": speedup}
    return {"context": p, "decode_s": statistics.median(s["decode"]), "draft_step_over_decode": draft[1],
            "draft_round_over_decode": draft, "verify_over_decode": verify, "implied_speedup": implied}


@torch.inference_mode()
def bandwidth_section(target: Gemma4Model, prompt: list[int], reps: int, mib: int,
                      plain: dict[str, float | None], clock: Clock = HOST) -> dict[str, Any]:
    """A decode step against `dst.copy_(src)` on `mib` MiB (bytes read + written), measured in turns;
    and how fast the largest product (a stack of q/k/v or gate/up weights, or one weight) streams its weight
    when it multiplies 1, 2, 5 or 9 rows, plain and packed (where oneDNN can), whichever the loader chose.

    `plain` holds the plain-generate tokens/s of the e2b section, ours and transformers': set against
    the bound, transformers' figure caps the speedup any float32 implementation can have over it here.
    """
    p, device = len(prompt), device_of(target)
    cache, _ = prefilled(target, prompt, 1)
    src = torch.ones(mib * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    dtype = target.embed_tokens.weight.dtype
    keys = max((keys for _, keys in groups(target)), key=lambda ks: sum(target.get_parameter(k).numel() for k in ks))
    weight = torch.cat([target.get_parameter(k).to(dtype) for k in keys])  # (O, I), as the product multiplies it
    runs: dict[str, Callable[[], Any]] = {
        "decode": lambda: forward_rows(target, torch.tensor([[prompt[-1]]]), cache, torch.tensor([p])),
        "copy": lambda: dst.copy_(src), "read": lambda: src.sum()}
    ways = {"plain": Product(weight, False)} | ({"packed": Product(weight, True)} if packable(weight) else {})
    x = {m: torch.ones(1, m, weight.shape[1], dtype=dtype, device=device) for m in ROWS}
    for way, product in ways.items():
        runs |= {f"{way}{m}": lambda m=m, product=product: product(x[m]) for m in ROWS}
    s, _ = interleaved(runs, reps, runs, clock)
    per_token = decode_bytes(target)
    # The bound's bandwidth is the best copy: a copy that a neighbour slowed down would flatter the ratio.
    bandwidth = 2 * src.nbytes / min(s["copy"])
    bound = bandwidth / per_token
    paired = [per_token / decode / max(2 * src.nbytes / copy, src.nbytes / read)
              for decode, copy, read in zip(s["decode"], s["copy"], s["read"])]  # each repetition's own bound
    weight_bytes = weight.numel() * weight.element_size()
    out = {"dtype": str(x[1].dtype).removeprefix("torch."), "copy_bytes_per_s": bandwidth, "copy_mib": mib,
           "bytes_per_token": per_token, "bound_tokens_per_s": bound,
           "decode_step_tokens_per_s": 1 / statistics.median(s["decode"]),
           "fraction_decode_step": 1 / statistics.median(s["decode"]) / bound,
           "fraction_best_decode_step": 1 / min(s["decode"]) / bound,
           "read_bytes_per_s": src.nbytes / min(s["read"]), "fraction_paired": statistics.median(paired),
           "linear_weight_shape": list(weight.shape),
           "linear_bytes_per_s_by_rows": {way: {m: weight_bytes / statistics.median(s[f"{way}{m}"]) for m in ROWS}
                                          for way in ways},
           "linear_rows_slowdown": {way: {m: median_ratio(s[f"{way}{m}"], s[f"{way}1"]) for m in ROWS}
                                    for way in ways}}
    if "packed" not in ways:
        out["linear_packed"] = f"not measured: {NO_KERNEL} ({device.type}, {out['dtype']})"
    for name in ("ours_plain", "tf_plain"):
        tokens_per_s = plain.get(name)
        out[f"{name}_tokens_per_s"] = tokens_per_s
        out[f"fraction_{name}"] = None if tokens_per_s is None else tokens_per_s / bound
    # The bound is every implementation's: no float32 decoder here is faster than bound / transformers'.
    out["ceiling_over_tf_plain"] = None if plain.get("tf_plain") is None else bound / plain["tf_plain"]
    return out
