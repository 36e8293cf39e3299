"""Train an MTP drafter ("assistant") for any Gemma 4 target checkpoint; the target stays frozen.

    python scripts/train_drafter.py --out /tmp/assistant        # distilled on sampled data (see --help)
    python scripts/train_drafter.py --target DIR --out DIR --corpus TEXTS --hidden 256 --intermediate 2048 \\
        --device cuda --target-dtype bfloat16           # a real Gemma 4 (or a fine-tune) on a GPU

`--out` is required, so a run never overwrites the bundled demo; weights.md has the command that
made the committed one.

What the drafter learns (mtp/README.md §4): from (the target's scaled embedding of a token, a hidden state) and the
target's shared K/V, the target's distribution over the next tokens. Training runs exactly the
inference computation (`Drafter.step`), for every position of a sequence at once and unrolled over
several draft steps, so the drafter trains on the inputs it will see:
- data: corpus windows of `--prompt-len` tokens, continued by the target itself for `--generate`
  tokens (the part a speculative run drafts): greedily (`--data greedy`) or sampled with the product's
  keyed sampler at a mixture of temperatures (`--data sampled --temperatures 0,0.7,1.0`, top-k 64,
  top-p 0.95); then one teacher-forced target forward over the whole sequence gives its distribution
  p[t] over the token at t+1, its post-norm hidden h[t] and its shared K/V;
- step 1 at query position t: token seq[t], hidden h[t-1], keys 0..t-1; teacher p[t];
- step j > 1 at the same position t and the same keys: token seq[t+j-1] (an accepted draft is a draw
  from p, and the sequence's own tokens are such draws), hidden = step j-1's output h'; teacher p[t+j-1].
- the loss (`--loss`, see `training/distill.py` for the math): `ce` on the target's argmax, `kl` = KL(p || q)
  at T = 1, `tv` = 1 - sum min(p, q) at the training temperatures (what sample drafting keeps), or a
  sum such as `kl+tv`.

Heads. The dense head `model.embed_tokens` [V, D] starts from the target's embedding (its principal
components, so a rotation of it when D equals the target's width) and is trained with a full softmax.
The centroid head (`use_ordered_embeddings`, mtp/README.md §6) is built from the target's embedding: the token
ordering is a balanced clustering of the target's embedding rows (recursive bisection along principal
directions: exactly V/C tokens per cluster), and the centroids are trained beside the drafter as a
classifier of clusters, on the drafter's state with gradients stopped, so they
never pull on the drafter itself. Its target is the cluster mass of the teacher distributions (a
soft label), because sample drafting can only draw tokens from the clusters it keeps.

Shape legend: B batch, T sequence, E target width, D drafter width, V vocab, C clusters.
"""

import argparse
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from gemma4.config import FULL, SLIDING, TextConfig
from gemma4.config_file import DEFAULT_ROPE, read_json, text_fields
from gemma4.engine.ring import KV
from gemma4.model import Gemma4Model
from gemma4.weights import load_target
from measure_pair import PROMPT_TOKENS, measure
from mtp.drafter import Drafter
from mtp.loading import drafter_config_from_dict, load_drafter
from gemma4.engine.forward import forward_rows
from mtp.engine.drafts import drafter_inputs, pairs, propose_rows, ring_kv
from training.common import (
    adamw, corpus_files, cosine_lr, dtype_name, held_out_prompts, init_weights, parse_dtype, read_texts,
    sample_windows, save_weights, token_stream, write_json,
)
from training.distill import (
    DATA, Distill, continuations, distill_loss, parse_losses, parse_temperatures, soft_cross_entropy,
)


def drafter_config(target_dir: Path, target: TextConfig, hidden: int, intermediate: int, heads: int,
                   num_centroids: int, top_k: int, dtype: torch.dtype) -> dict[str, Any]:
    """config.json of a `Gemma4AssistantForCausalLM` whose layers fit the target's two KV sources."""
    src_s, src_f = target.kv_source(SLIDING), target.kv_source(FULL)
    kv_s, kv_f = target.kv_heads[src_s], target.kv_heads[src_f]
    fields, _ = text_fields(read_json(target_dir / "config.json"))
    text = {
        "model_type": "gemma4_text",
        "vocab_size": target.vocab_size,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": 4,
        "layer_types": [SLIDING, SLIDING, SLIDING, FULL],
        "num_attention_heads": heads,
        "num_key_value_heads": kv_s,
        "head_dim": target.head_dims[src_s],
        "global_head_dim": target.head_dims[src_f],
        # A full kv-head count that differs from the sliding one is written as the 26B/31B assistants do.
        "attention_k_eq_v": kv_f != kv_s,
        "num_global_key_value_heads": kv_f if kv_f != kv_s else None,
        "sliding_window": target.sliding_window,
        "rope_parameters": fields.get("rope_parameters") or DEFAULT_ROPE,  # queries must rotate as the keys did
        "num_kv_shared_layers": 4,  # every layer is Q-only: the K/V are the target's
        "hidden_size_per_layer_input": 0,
        "vocab_size_per_layer_input": 0,
        "enable_moe_block": False,
        "use_double_wide_mlp": False,
        "hidden_activation": "gelu_pytorch_tanh",
        "final_logit_softcapping": None,
        "max_position_embeddings": target.max_position_embeddings,
        "rms_norm_eps": target.rms_norm_eps,
        "tie_word_embeddings": True,
        "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2,
    }
    return {
        "architectures": ["Gemma4AssistantForCausalLM"],
        "model_type": "gemma4_assistant",
        "backbone_hidden_size": target.hidden_size,
        "use_ordered_embeddings": True,
        "num_centroids": num_centroids,
        "centroid_intermediate_top_k": top_k,
        "tie_word_embeddings": True,
        "text_config": text,
        "dtype": dtype_name(dtype),
    }


# ---------------------------------------------------------------- heads built from the target's embedding

def head_from_target(embed: torch.Tensor, width: int) -> torch.Tensor:
    """(V, E) -> (V, D): the target's embedding in its first D principal directions (zero-padded if D > E)."""
    _, _, vh = torch.linalg.svd(embed.float(), full_matrices=False)  # vh (E, E): directions, by variance
    head = embed.float() @ vh[:width].T  # (V, min(D, E))
    return F.pad(head, (0, width - head.shape[1]))


def balanced_clusters(embed: torch.Tensor, num_clusters: int) -> torch.Tensor:
    """(V,) token ordering: row-major [C, V/C], each row one cluster of exactly V/C tokens.

    Recursive bisection: sort every group along its principal direction and cut it in half, until there
    are C groups. Tokens with similar output embeddings (similar contexts) end up in the same cluster.
    """
    v, e = embed.shape
    if num_clusters & (num_clusters - 1) or v % num_clusters:
        raise ValueError(f"num_centroids={num_clusters} must be a power of two that divides vocab_size={v}")
    order, groups = torch.arange(v), 1
    while groups < num_clusters:
        points = embed.float()[order].view(groups, v // groups, e)  # (G, V/G, E)
        points = points - points.mean(dim=1, keepdim=True)
        _, _, vh = torch.linalg.svd(points, full_matrices=False)  # vh (G, E, E)
        projection = (points @ vh[:, 0, :, None]).squeeze(-1)  # (G, V/G) along each group's first direction
        order = order.view(groups, -1).gather(1, projection.argsort(dim=1, stable=True)).flatten()
        groups *= 2  # the next view cuts every sorted group in two halves
    return order


def init_drafter(drafter: Drafter, target: Gemma4Model, seed: int, init: Path | None = None) -> torch.Tensor:
    """Draw the weights, build both heads from the target's embedding (or copy every tensor of the
    assistant in `init`, which must have the same shape); return cluster id per token (V,)."""
    cfg = drafter.config
    if init is not None:
        drafter.load_state_dict(load_drafter(init, fast=False).state_dict(), strict=True)
        order = drafter.masked_embedding.token_ordering
    else:
        init_weights(drafter, seed)
        head = head_from_target(target.embed_tokens.weight, cfg.text.hidden_size)  # (V, D)
        order = balanced_clusters(target.embed_tokens.weight, cfg.num_centroids)  # (V,)
        with torch.no_grad():
            drafter.model.embed_tokens.weight.copy_(head)
            drafter.masked_embedding.token_ordering.copy_(order)
            centroids = head[order].view(cfg.num_centroids, -1, head.shape[1]).mean(1)  # (C, D)
            drafter.masked_embedding.centroids.weight.copy_(centroids)
    cluster_of = torch.empty_like(order)
    cluster_of[order] = torch.arange(len(order)) // (len(order) // cfg.num_centroids)
    return cluster_of


# ---------------------------------------------------------------- the unrolled loss

def unrolled_loss(drafter: Drafter, target: Gemma4Model, seq: torch.Tensor, steps: int, cluster_of: torch.Tensor,
                  cfg: Distill = Distill()) -> tuple[torch.Tensor, list[float]]:
    """Mean over draft steps of the chosen losses against the target's distribution, plus the centroid
    classifier's loss; and the dense head's top-1 agreement with the target's argmax per step.

    Step j at query position t reads the token seq[t+j-1] (step 1: seq[t]) and, for j > 1, step j-1's
    next hidden; its teacher is the target's distribution at t+j-1 (over the token at t+j), taken
    from one teacher-forced target forward. A step that passes the end of the sequence does not count.
    """
    with torch.no_grad():
        out = forward_rows(target, seq)  # teacher-forced over the whole sequence: logits (B, T, V)
    b, t = seq.shape
    # (B, K, T, D) each, at positions (1, T) 0..T-1
    kv = {k: KV(key.float(), value.float(), positions) for k, (key, value, positions) in out.source_kv.items()}
    inputs = drafter_inputs(drafter, torch.arange(1, t, device=seq.device)[None], kv, torch.float32)  # queries 1..T-1
    tokens = F.pad(seq, (0, steps))  # (B, T+steps): seq[t+j-1] for every query t and step j (pads never count)
    hidden = out.hidden[:, :-1].float()  # (B, T-1, E): h[t-1] for step 1
    head = drafter.model.embed_tokens.weight  # (V, D)
    centroids = drafter.masked_embedding.centroids
    num_clusters = centroids.out_features
    loss, accuracy = torch.zeros((), device=seq.device), []
    for j in range(1, steps + 1):
        token = tokens[:, j: j + t - 1]  # (B, T-1)
        hn, hidden = drafter.step(target.embed(token).float(), hidden, inputs, pairs(kv))  # (B, T-1, D), (B, T-1, E)
        n = t - j  # queries 1..T-j have a teacher at t+j-1 <= T-1
        q_logits = F.linear(hn[:, :n], head).flatten(0, 1)  # (B*n, V): the dense head, full softmax in training
        p_logits = out.logits[:, j: j + n].flatten(0, 1)  # (B*n, V)
        per_position, clusters = distill_loss(q_logits, p_logits, cfg, cluster_of, num_clusters)  # (B*n,), (B*n, C)
        classifier = soft_cross_entropy(centroids(hn[:, :n].detach()).flatten(0, 1), clusters)  # (B*n,)
        loss = loss + per_position.mean() + classifier.mean()
        accuracy.append(float((q_logits.argmax(-1) == p_logits.argmax(-1)).float().mean()))
    return loss / steps, accuracy


def main(*, target_dir: Path, out: Path, corpus: Path | None, steps: int, batch: int, prompt_len: int,
         generate: int, gen_batches: int, draft_steps: int, lr: float, hidden: int, intermediate: int, heads: int,
         num_centroids: int, top_k: int, num_assistant_tokens: int, seed: int, max_files: int | None,
         dtype: torch.dtype, target_dtype: torch.dtype, device: str, threads: int, eval_prompts: int,
         distill: Distill = Distill(), init: Path | None = None) -> None:
    """`top_k` is the centroid head's (centroid_intermediate_top_k); the sampler's is `distill.top_k`."""
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    start = time.time()
    target = load_target(target_dir, dtype=target_dtype, device=device, fast=True)  # frozen: eval mode, no gradients
    tokenizer = Tokenizer.from_file(str(target_dir / "tokenizer.json"))
    suffixes = (".py",) if corpus is None else (".py", ".txt", ".md", ".rst")
    train_files, held_files = corpus_files(corpus, suffixes)
    stream = token_stream(tokenizer, read_texts(train_files[:max_files])).to(device)  # (N,)
    print(f"corpus: {len(stream):,} tokens; target {target_dir}; {distill}", flush=True)

    raw = drafter_config(target_dir, target.config, hidden, intermediate, heads, num_centroids, top_k, dtype)
    drafter = Drafter(drafter_config_from_dict(raw)).to(device)
    cluster_of = init_drafter(drafter, target, seed, init).to(device)
    print(f"drafter: {sum(p.numel() for p in drafter.parameters()):,} parameters", flush=True)
    opt = adamw(drafter, lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed)
    data_seconds = 0.0
    for step in range(steps):
        if step % gen_batches == 0:  # one decode loop makes the data of the next `gen_batches` steps
            t0 = time.time()
            prompts = sample_windows(stream.cpu(), batch * gen_batches, prompt_len, gen).to(device)  # (R*B, P)
            rows_seed = seed * 1_000_003 + step * batch  # every row of the run gets its own sampler seed
            sequences = continuations(target, prompts, generate, distill, rows_seed) if generate else prompts
            data_seconds += time.time() - t0  # (R*B, P+G)
        seq = sequences[(step % gen_batches) * batch:][:batch]  # (B, P+G)
        for group in opt.param_groups:
            group["lr"] = cosine_lr(step, steps, lr, warmup=max(1, steps // 20))
        loss, accuracy = unrolled_loss(drafter, target, seq, draft_steps, cluster_of, distill)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 10 == 0 or step == steps - 1:
            acc = " ".join(f"{a:.2f}" for a in accuracy)
            print(f"step {step:5d}  loss {loss.item():.3f}  top-1 per draft step {acc}  {time.time() - start:6.0f}s",
                  flush=True)
    train_seconds = time.time() - start
    print(f"data {data_seconds:.0f}s, training steps {train_seconds - data_seconds:.0f}s "
          f"({(train_seconds - data_seconds) / max(1, steps):.2f} s/step)", flush=True)

    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "config.json", raw)
    write_json(out / "generation_config.json", {
        "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
        "num_assistant_tokens": num_assistant_tokens, "num_assistant_tokens_schedule": "constant",
    })
    save_weights(drafter.state_dict(), out / "model.safetensors", dtype)
    print(f"wrote {out} in {time.time() - start:.0f}s", flush=True)
    if eval_prompts:
        held = token_stream(tokenizer, read_texts(held_files[:max_files]))
        prompts = held_out_prompts(held, eval_prompts, PROMPT_TOKENS)
        trained = load_drafter(out, device=device, fast=True)
        for temperature in (0.0, 0.7):  # the greedy row and one sampled row; measure_pair.py has the rest
            row = measure(target, trained, prompts, temperature, seeds=1, k=num_assistant_tokens, new_tokens=64,
                          top_k=distill.top_k, top_p=distill.top_p)
            cells = [("argmax", row.argmax)] + ([("sample", row.sample)] if row.sample else [])
            print(f"held-out acceptance at K={num_assistant_tokens}, {row.setting}: " + ", ".join(
                f"{name} drafting {c.acceptance:.3f} ({c.per_forward:.2f} tokens per target forward)"
                for name, c in cells), flush=True)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parse_distill(a: argparse.Namespace, p: argparse.ArgumentParser) -> Distill:
    """The flags as a Distill, or one line on stderr and exit 2 (argparse's `error`)."""
    try:
        return Distill(parse_losses(a.loss), a.data, parse_temperatures(a.temperatures), a.sample_top_k,
                       a.sample_top_p)
    except ValueError as e:
        p.error(f"{e}: e.g. --loss kl+tv --data sampled --temperatures 0,0.7,1.0")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    demo = Path(__file__).parent / "demo"
    p.add_argument("--target", type=Path, default=demo / "target", help="target checkpoint directory")
    p.add_argument("--out", type=Path, required=True,
                   help="directory to write the assistant to (required: training never overwrites the demo)")
    p.add_argument("--corpus", type=Path, default=None,
                   help="directory of .py/.txt/.md/.rst files (None: this Python's standard library)")
    p.add_argument("--loss", default="kl+tv", help="ce, kl, tv, or a sum of them such as kl+tv")
    p.add_argument("--data", default="sampled", choices=DATA,
                   help="continuations the target decodes greedily, or samples at --temperatures")
    p.add_argument("--temperatures", default="0,0.7,1.0",
                   help="the sampled data's mixture, one per sequence in turn (0: greedy), and tv's warps")
    p.add_argument("--sample-top-k", type=int, default=64, help="the sampler's top-k (data and tv)")
    p.add_argument("--sample-top-p", type=float, default=0.95, help="the sampler's top-p (data and tv)")
    p.add_argument("--steps", type=positive_int, default=300)
    p.add_argument("--batch", type=positive_int, default=16)
    p.add_argument("--prompt-len", type=positive_int, default=64, help="corpus tokens per sequence")
    p.add_argument("--generate", type=int, default=32, help="target tokens appended to each sequence")
    p.add_argument("--gen-batches", type=positive_int, default=4,
                   help="generate the sequences of this many steps in one batch (a CPU decode step costs "
                        "about the same for 16 or 64 sequences)")
    p.add_argument("--draft-steps", type=positive_int, default=4, help="draft steps unrolled in training")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--init", type=Path, default=None,
                   help="start from this assistant's weights (same shape) instead of the target's embedding")
    p.add_argument("--hidden", type=int, default=64, help="drafter width D")
    p.add_argument("--intermediate", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--num-centroids", type=int, default=64)
    p.add_argument("--centroid-top-k", type=int, default=8, help="centroid_intermediate_top_k")
    p.add_argument("--num-assistant-tokens", type=int, default=4, help="K written to generation_config.json")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-files", type=int, default=None, help="use only the first N files (smoke tests)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="dtype of the saved weights")
    p.add_argument("--target-dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="1 is fastest while anything else runs")
    p.add_argument("--eval-prompts", type=int, default=10, help="held-out prompts for the final acceptance (0: skip)")
    a = p.parse_args()
    d = parse_distill(a, p)
    main(target_dir=a.target, out=a.out, corpus=a.corpus, steps=a.steps, batch=a.batch, prompt_len=a.prompt_len,
         generate=a.generate, gen_batches=a.gen_batches, draft_steps=a.draft_steps, lr=a.lr, hidden=a.hidden,
         intermediate=a.intermediate, heads=a.heads, num_centroids=a.num_centroids, top_k=a.centroid_top_k,
         num_assistant_tokens=a.num_assistant_tokens, seed=a.seed, max_files=a.max_files,
         dtype=parse_dtype(a.dtype), target_dtype=parse_dtype(a.target_dtype), device=a.device, threads=a.threads,
         eval_prompts=a.eval_prompts, distill=d, init=a.init)
