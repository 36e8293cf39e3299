"""scripts/benchmark.py's batch sections: throughput of batched decoding, and the MoE expert-reuse claim.

- `batch`: tokens/s of plain and speculative decoding of B = 1, 2, 4, 8 prompts as one batch
  (gemma4/engine/decode.py `decode`, mtp/engine/batch.py) and of the same prompts run one after another, on the demo pair.
  The demo pair is bound by the cost of each call into PyTorch, which a batch shares across its rows.
- `experts`: the Gemma docs say verifying drafts "can require loading additional expert weights; at
  higher batch sizes there is more overlap in activated experts". Counted here: the unique experts
  each MoE layer's forward touches, for a 1-token decode, a (K+1)-token verify and batches, beside the
  uniform-routing expectation E = X·(1 − (1 − k/X)^n) for n tokens each picking k of X experts. The
  checkpoint is random, with the 26B-A4B's routing (X = 128, k = 8) and tiny widths: random weights
  route near-uniformly, so this measures the uniform case; a trained router's tokens of one context
  share experts more often, so a real model touches fewer.

Shape legend: B rows, T tokens per row, X experts, k experts per token.
"""

import statistics
from collections.abc import Callable
from typing import Any

import torch

from bench.show import steps
from gemma4 import RingCache, greedy_generate
from gemma4.engine import decode
from gemma4.config_file import text_config_from_dict
from gemma4.model import Gemma4Model
from gemma4.weights import target_weight_table
from mtp import DraftLength, Drafter, speculative_generate
from mtp.engine.batch import speculative_generate_batch
from gemma4.engine.forward import forward_rows

BATCHES = (1, 2, 4, 8)
# Eight openings of Python source for the demo pair (a model of the standard library's code).
DEMO_PROMPTS = [
    "import os\n\n\ndef read_config(path):\n    ", "class Error(Exception):\n    ",
    '    def __repr__(self):\n        return "', "for name in sorted(names):\n    ",
    "def main(argv=None):\n    ", "    def __init__(self, name, value):\n        ",
    "try:\n    import json\nexcept ImportError:\n    ", "    @property\n    def size(self):\n        ",
]
EXPERTS, TOP_K = 128, 8  # the 26B-A4B's router
MOE_HIDDEN = 64  # the expert count's random target: tiny but for its router
VERIFY_KS = tuple(range(1, 9))
EXPERT_BATCHES = (1, 4, 8)


def batch_section(target: Gemma4Model, drafter: Drafter, prompts: list[list[int]], tokens: int, reps: int, k: int,
                  interleaved: Callable) -> dict[str, Any]:
    """Each B: the four ways to decode the first B prompts, timed in turns (benchmark.interleaved)."""
    by_batch = {}
    for b in BATCHES:
        rows = prompts[:b]
        runs = {
            "plain_batch": lambda: [r.tokens for r in decode(target, rows, tokens)],
            "spec_batch": lambda: [r.tokens for r in speculative_generate_batch(target, drafter, rows, tokens,
                                                                                DraftLength(k))],
            "plain_sequential": lambda: [greedy_generate(target, p, tokens) for p in rows],
            "spec_sequential": lambda: [speculative_generate(target, drafter, p, tokens, DraftLength(k)).tokens
                                        for p in rows],
        }
        seconds, outputs = interleaved(runs, reps, warm_up=runs if b == 1 else {})
        speed = {name: [b * tokens / s for s in secs] for name, secs in seconds.items()}  # all rows' tokens
        by_batch[b] = {
            "tokens_per_s": {name: b * tokens / statistics.median(secs) for name, secs in seconds.items()},
            "ratios": {f"{x}/{y}": statistics.median(p / q for p, q in zip(speed[x], speed[y]))
                       for x, y in (("spec_batch", "spec_sequential"), ("plain_batch", "plain_sequential"),
                                    ("spec_batch", "plain_sequential"))},
            "identical": len({tuple(map(tuple, out)) for outs in outputs.values() for out in outs}) == 1,
        }
    return {"new_tokens_per_row": tokens, "k": k, "reps": reps, "prompt_tokens": [len(p) for p in prompts],
            "by_batch": by_batch}


def random_moe_target(seed: int = 0) -> Gemma4Model:
    """A 4-layer random target with the 26B-A4B's router (128 experts, top 8), MOE_HIDDEN wide, in memory."""
    config = text_config_from_dict({
        "model_type": "gemma4_text", "vocab_size": 512, "hidden_size": MOE_HIDDEN, "intermediate_size": 128,
        "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
        "global_head_dim": 64, "layer_types": ["sliding_attention"] * 3 + ["full_attention"], "sliding_window": 16,
        "num_kv_shared_layers": 0, "hidden_size_per_layer_input": 0, "enable_moe_block": True,
        "num_experts": EXPERTS, "top_k_experts": TOP_K, "moe_intermediate_size": 16,
        "final_logit_softcapping": 30.0, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
    })
    gen = torch.Generator().manual_seed(seed)
    # Matrices N(0, 1/fan_in) (the router's logits then have std ~1: near-uniform routing), vectors near 1.
    state = {name: torch.randn(shape, generator=gen) / shape[-1] ** 0.5 if len(shape) > 1
             else 0.5 + torch.rand(shape, generator=gen) for name, shape in target_weight_table(config).items()}
    with torch.device("meta"):
        model = Gemma4Model(config)
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval().requires_grad_(False)


def uniform_expectation(n: int, x: int = EXPERTS, k: int = TOP_K) -> float:
    """Expected unique experts when n tokens each pick k of x uniformly (each expert missed w.p. (1 - k/x)^n)."""
    return x * (1 - (1 - k / x) ** n)


@torch.inference_mode()
def experts_section(draws: int = 8, context: int = 24) -> dict[str, Any]:
    """Mean unique experts per MoE layer and forward, over `draws` random contexts and new tokens."""
    model = random_moe_target()
    counts: list[int] = []
    hooks = [layer.experts.register_forward_hook(lambda m, args, out: counts.append(int(args[2].unique().numel())))
             for layer in model.layers]
    gen = torch.Generator().manual_seed(1)

    def unique(rows: int, t: int) -> float:
        """A forward of t new tokens in each of `rows` rows, after ragged prompts, as a verify runs."""
        seen = []
        for _ in range(draws):
            lengths = torch.randint(context // 2, context + 1, (rows,), generator=gen)  # (B,) ragged
            cache = RingCache(model.config, context + t, batch=rows)
            cache.length = torch.zeros(rows, dtype=torch.long)
            prompt = torch.randint(3, 512, (rows, context), generator=gen)  # (B, T'); past each length: stale
            forward_rows(model, prompt, cache, start_pos=cache.length, num_logits=0)
            cache.length = lengths
            counts.clear()
            forward_rows(model, torch.randint(3, 512, (rows, t), generator=gen), cache, start_pos=cache.length)
            seen += counts
        return statistics.mean(seen)

    scenarios = [("1-token decode", 1, 1)] + [(f"verify K={k}", 1, k + 1) for k in VERIFY_KS]
    scenarios += [(f"batch {b}, decode", b, 1) for b in EXPERT_BATCHES if b > 1]
    scenarios += [(f"batch {b}, verify K=4", b, 5) for b in EXPERT_BATCHES]
    rows = []
    with steps("forwards counted", len(scenarios)) as done:
        for name, b, t in scenarios:
            rows.append({"case": name, "tokens": b * t, "unique": unique(b, t), "uniform": uniform_expectation(b * t)})
            done.update()
    for hook in hooks:
        hook.remove()
    return {"experts": EXPERTS, "top_k": TOP_K, "moe_layers": len(model.layers), "draws": draws, "rows": rows,
            "note": "random weights route near-uniformly: the uniform case, an upper bound for a trained router"}


def batch_goal(result: dict[str, Any]) -> list[dict[str, Any]]:
    row = result.get("batch", {}).get("by_batch", {})
    row = row.get(8) or row.get("8")  # int keys, or str keys in a run read back from --json
    if not row:
        return []
    value = row["ratios"]["spec_batch/spec_sequential"]
    return [{"goal": "demo: B=8 speculative batch / one after another", "value": value, "limit": 3.0,
             "at_least": True, "met": value >= 3.0}]


def batch_table(result: dict[str, Any]) -> str:
    lines = []
    r = result.get("batch")
    if r:
        lines += ["", f"== batches on the demo pair: {r['new_tokens_per_row']} new tokens per row, K = {r['k']}, "
                      f"{r['reps']} timed reps, tokens/s of all rows together",
                  f"   {'B':>3}{'plain batch':>14}{'spec batch':>13}{'plain 1-by-1':>15}{'spec 1-by-1':>14}"
                  f"{'spec batch/1-by-1':>20}{'identical':>11}"]
        for b, row in r["by_batch"].items():
            s = row["tokens_per_s"]
            lines.append(f"   {b:>3}{s['plain_batch']:>14.1f}{s['spec_batch']:>13.1f}{s['plain_sequential']:>15.1f}"
                         f"{s['spec_sequential']:>14.1f}{row['ratios']['spec_batch/spec_sequential']:>19.2f}x"
                         f"{'yes' if row['identical'] else 'NO':>11}")
    e = result.get("experts")
    if e:
        lines += ["", f"== unique experts per MoE layer and forward: X = {e['experts']}, k = {e['top_k']}, "
                      f"{e['moe_layers']} layers x {e['draws']} draws; {e['note']}",
                  f"   {'case':<24}{'tokens':>7}{'measured':>10}{'uniform E':>11}{'per token':>11}"]
        for row in e["rows"]:
            lines.append(f"   {row['case']:<24}{row['tokens']:>7}{row['unique']:>10.1f}{row['uniform']:>11.1f}"
                         f"{row['unique'] / row['tokens']:>11.2f}")
    return "\n".join(lines)
