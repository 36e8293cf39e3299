"""What `train_target.py` and `train_drafter.py` share: the corpus, initialisation, the optimiser, saving.

- The corpus is the standard library of the Python that runs the script (its `.py` files: source,
  docstrings, and pydoc's topic pages in `pydoc_data/topics.py`), so training downloads nothing.
  Test suites, codec tables (`encodings/`) and third-party packages are left out.
- The split is by file and depends only on the file's path inside the library (one file in 20 is
  held out), so it is the same on every machine; the text differs between Python versions, so a
  bit-exact reproduction needs the same version (the demo pair used 3.11.7).
- Every file becomes `<bos> text <eos>` and the files are concatenated into one token stream.
  Training windows start anywhere in the stream but always begin with `<bos>`, as prompts do.
- Models are built with `torch.empty` parameters (the loader assigns them); `init_weights` draws them.
- Checkpoints are written in the official layout: `safetensors` with `{"format": "pt"}` metadata
  (transformers requires it), tied embeddings stored once, no `lm_head`.

Shape legend: B batch, T tokens, N tokens in a stream, V vocab, E width.
"""

import json
import math
import sysconfig
import zlib
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer
from torch import nn

BOS_ID, EOS_ID = 2, 1
SKIPPED_DIRS = {"site-packages", "test", "tests", "idle_test", "encodings", "__pycache__"}
HELD_OUT_ONE_IN = 20


# ---------------------------------------------------------------- corpus

def corpus_files(root: Path | None = None, suffixes: tuple[str, ...] = (".py",)) -> tuple[list[Path], list[Path]]:
    """Text files under `root` (default: the standard library), sorted, split into (training, held-out)
    by a hash of the path."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*") if p.suffix in suffixes and p.is_file()
                   and not SKIPPED_DIRS & set(p.relative_to(root).parts[:-1]))
    if not files:
        raise FileNotFoundError(f"no {'/'.join(suffixes)} files under {root}")
    held = [p for p in files if zlib.crc32(p.relative_to(root).as_posix().encode()) % HELD_OUT_ONE_IN == 0]
    return [p for p in files if p not in held], held


def read_texts(files: list[Path]) -> list[str]:
    return [p.read_text(encoding="utf-8", errors="replace") for p in files]


def token_stream(tokenizer: Tokenizer, texts: list[str]) -> torch.Tensor:
    """(N,) all files as `<bos> ids <eos>`, one after the other."""
    ids: list[int] = []
    for enc in tokenizer.encode_batch(texts, add_special_tokens=False):
        ids += [BOS_ID, *enc.ids, EOS_ID]
    return torch.tensor(ids, dtype=torch.long)


def sample_windows(stream: torch.Tensor, batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """(B, length) windows at random offsets; position 0 is always `<bos>`, as in a prompt."""
    starts = torch.randint(0, len(stream) - length, (batch,), generator=gen)  # (B,)
    windows = stream[starts[:, None] + torch.arange(length - 1)]  # (B, length-1)
    return torch.cat([torch.full((batch, 1), BOS_ID), windows], dim=1)


def held_out_prompts(stream: torch.Tensor, count: int, length: int) -> list[list[int]]:
    """`count` prompts of `<bos>` + `length` tokens, evenly spaced over the held-out stream."""
    step = (len(stream) - length) // count
    return [[BOS_ID] + stream[i * step: i * step + length].tolist() for i in range(count)]


# ---------------------------------------------------------------- initialisation and optimiser

def init_weights(model: nn.Module, seed: int, std: float = 0.02) -> None:
    """Norm weights and layer scalars 1 (Gemma 4 multiplies by the norm weight directly), the rest N(0, std)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:  # every 1-d parameter of Gemma 4 is a norm weight or `layer_scalar`
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * std)


def adamw(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """Decay matrices only: decaying norm weights would pull them towards 0, not towards their init 1."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


def cosine_lr(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warm-up, then a cosine from `peak` down to `peak / 10`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


# ---------------------------------------------------------------- saving

def save_weights(tensors: dict[str, torch.Tensor], path: Path, dtype: torch.dtype) -> None:
    """Floating tensors cast to `dtype`, integer ones (the token ordering) kept as they are."""
    out = {k: (v.to(dtype) if v.is_floating_point() else v).detach().contiguous() for k, v in tensors.items()}
    save_file(out, str(path), metadata={"format": "pt"})


def write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]


def parse_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
