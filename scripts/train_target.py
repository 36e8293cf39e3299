"""Train the demo target: a small Gemma 4 text model and its BPE tokenizer, on the local Python library.

    python scripts/train_target.py --out /tmp/target    # the demo target's settings (about 17 min)
    python scripts/train_target.py --out /tmp/t --steps 20 --layers 10 --hidden 32 --max-files 40  # smoke run

`--out` is required, so a run never overwrites the bundled demo; weights.md has the command that
made the committed one.

Writes `config.json` (the bare `gemma4_text` form that `Gemma4ForCausalLM` saves: tensors under
`model.`), `generation_config.json`, `model.safetensors` and `tokenizer.json`.

Why this shape: on a CPU a one-token decode step costs about the same per *layer* whatever the width
(kernel launches and Python dominate at these sizes), and a (K+1)-token verification costs about as much
as a one-token step. So the target is deep and narrow (24 layers of width 64) and the 4-layer drafter
costs a fraction of a target step: speculation then pays even on two CPU cores. The model still
switches on what makes Gemma 4 Gemma 4: sliding and full layers (4:1, the last one full) with their
own head sizes and RoPE, KV sharing (the last half of the layers read the K/V of layers 9 and 11),
Per-Layer Embeddings, and the final logit softcap.

The tokenizer is a byte-level BPE trained on the same files, with Gemma 4's special tokens at their
real ids (gemma4/README.md §18) and reserved `<unusedN>` tokens filling the ids between them.

Shape legend: B batch, T tokens, V vocab.
"""

import argparse
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from gemma4.config import FULL, SLIDING
from gemma4.config_file import text_config_from_dict
from gemma4.model import Gemma4Model
from gemma4.engine.forward import forward_rows
from training.common import (
    adamw, cosine_lr, dtype_name, init_weights, parse_dtype, read_texts, sample_windows, save_weights,
    corpus_files, token_stream, write_json,
)

# Gemma 4's special tokens at their real ids (gemma4/README.md §18); every other id below 107 is reserved.
SPECIAL_IDS = {
    0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 46: "<|tool>", 47: "<tool|>", 48: "<|tool_call>",
    49: "<tool_call|>", 50: "<|tool_response>", 51: "<tool_response|>", 52: '<|"|>', 98: "<|think|>",
    100: "<|channel>", 101: "<channel|>", 105: "<|turn>", 106: "<turn|>",
}
NUM_SPECIAL = max(SPECIAL_IDS) + 1
STOP_IDS = [1, 106, 50]  # what the official generation_config.json lists


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE (any text encodes, no <unk>) with the special tokens at ids 0..106."""
    specials = [SPECIAL_IDS.get(i, f"<unused{i}>") for i in range(NUM_SPECIAL)]
    tokenizer = Tokenizer(models.BPE())
    # The GPT-2 split keeps runs of spaces together: Python indentation becomes a few tokens.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[AddedToken(s, special=True, normalized=False) for s in specials],
    )
    tokenizer.train_from_iterator(texts, trainer)
    for i, s in SPECIAL_IDS.items():
        assert tokenizer.token_to_id(s) == i, f"{s} landed at {tokenizer.token_to_id(s)}, not {i}"
    return tokenizer


def target_config(vocab_size: int, layers: int, hidden: int, intermediate: int, heads: int, head_dim: int,
                  window: int, ple_dim: int, context: int, dtype: torch.dtype) -> dict[str, Any]:
    """config.json, key for key as transformers writes a `Gemma4ForCausalLM`'s."""
    layer_types = [FULL if (i + 1) % 5 == 0 else SLIDING for i in range(layers)]  # E2B's 4:1 pattern
    layer_types[-1] = FULL  # Gemma 4 forces the last layer to full attention
    return {
        "architectures": ["Gemma4ForCausalLM"],
        "model_type": "gemma4_text",
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": 1,  # as E2B: one kv head, shared by all query heads (GQA)
        "head_dim": head_dim,  # sliding layers
        "global_head_dim": 2 * head_dim,  # full layers: twice as wide, as 256 / 512 in the releases
        "layer_types": layer_types,
        "sliding_window": window,
        "rope_parameters": {
            SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
            FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
        },
        "num_kv_shared_layers": layers // 2,
        "use_double_wide_mlp": False,
        "hidden_size_per_layer_input": ple_dim,
        "vocab_size_per_layer_input": vocab_size,
        "attention_k_eq_v": False,
        "enable_moe_block": False,
        "hidden_activation": "gelu_pytorch_tanh",
        "final_logit_softcapping": 30.0,
        "max_position_embeddings": context,
        "rms_norm_eps": 1e-6,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": True,
        "pad_token_id": 0,
        "eos_token_id": [1, 106],
        "bos_token_id": 2,
        "dtype": dtype_name(dtype),
    }


@torch.no_grad()
def held_out_loss(model: Gemma4Model, stream: torch.Tensor, seq_len: int, batches: int = 8) -> float:
    gen = torch.Generator().manual_seed(1234)
    losses = []
    for _ in range(batches):
        x = sample_windows(stream, 8, seq_len + 1, gen)  # (B, T+1)
        logits = forward_rows(model, x[:, :-1]).logits  # (B, T, V)
        losses.append(F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten()).item())
    return sum(losses) / len(losses)


def main(*, out: Path, steps: int, batch: int, seq_len: int, lr: float, vocab_size: int, layers: int, hidden: int,
         intermediate: int, heads: int, head_dim: int, window: int, ple_dim: int, context: int, seed: int,
         max_files: int | None, minutes: float | None, dtype: torch.dtype, threads: int) -> None:
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    start = time.time()
    train_files, held_files = corpus_files()
    train_files, held_files = train_files[:max_files], held_files[:max_files]
    train_texts = read_texts(train_files)
    tokenizer = train_tokenizer(train_texts, vocab_size)
    train_stream = token_stream(tokenizer, train_texts)  # (N,)
    held_stream = token_stream(tokenizer, read_texts(held_files))
    print(f"corpus: {len(train_files)} files, {len(train_stream):,} tokens; held out {len(held_files)} files, "
          f"{len(held_stream):,} tokens; tokenizer {time.time() - start:.0f}s")

    raw = target_config(tokenizer.get_vocab_size(), layers, hidden, intermediate, heads, head_dim, window,
                        ple_dim, context, dtype)
    model = Gemma4Model(text_config_from_dict(raw))
    init_weights(model, seed)
    print(f"target: {sum(p.numel() for p in model.parameters()):,} parameters")
    opt = adamw(model, lr, weight_decay=0.1)
    gen = torch.Generator().manual_seed(seed)
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = cosine_lr(step, steps, lr, warmup=max(1, steps // 20))
        x = sample_windows(train_stream, batch, seq_len + 1, gen)  # (B, T+1)
        logits = forward_rows(model, x[:, :-1]).logits  # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 50 == 0 or step == steps - 1:
            print(f"step {step:5d}  loss {loss.item():.3f}  {time.time() - start:6.0f}s", flush=True)
        if minutes is not None and time.time() - start > 60 * minutes:
            print(f"stopping at step {step}: the {minutes}-minute budget is spent (schedule cut short)")
            break
    model.eval()
    print(f"held-out loss {held_out_loss(model, held_stream, seq_len):.3f}")

    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "config.json", raw)
    write_json(out / "generation_config.json", {"bos_token_id": 2, "eos_token_id": STOP_IDS, "pad_token_id": 0,
                                               "do_sample": False})
    save_weights({"model." + k: v for k, v in model.state_dict().items()}, out / "model.safetensors", dtype)
    tokenizer.save(str(out / "tokenizer.json"))
    print(f"wrote {out} in {time.time() - start:.0f}s")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", type=Path, required=True,
                   help="directory to write the target to (required: training never overwrites the demo)")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch", type=int, default=12)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--intermediate", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=32, help="sliding layers; full layers get twice this")
    p.add_argument("--window", type=int, default=128, help="sliding window")
    p.add_argument("--ple-dim", type=int, default=16, help="Per-Layer Embedding width (0: off)")
    p.add_argument("--context", type=int, default=1024, help="max_position_embeddings")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-files", type=int, default=None, help="use only the first N files (smoke tests)")
    p.add_argument("--minutes", type=float, default=None, help="stop early after this many minutes")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="dtype of the saved weights")
    p.add_argument("--threads", type=int, default=1, help="1 is fastest while anything else runs")
    a = p.parse_args()
    main(out=a.out, steps=a.steps, batch=a.batch, seq_len=a.seq_len, lr=a.lr, vocab_size=a.vocab_size,
         layers=a.layers, hidden=a.hidden, intermediate=a.intermediate, heads=a.heads, head_dim=a.head_dim,
         window=a.window, ple_dim=a.ple_dim, context=a.context, seed=a.seed, max_files=a.max_files,
         minutes=a.minutes, dtype=parse_dtype(a.dtype), threads=a.threads)
