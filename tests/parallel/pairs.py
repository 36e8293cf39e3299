"""The tiny pairs of the tensor-parallel tests: each family of tests/checkpoints.py with 12 query heads and widths
that 2, 3 and 4 all divide, so one file serves every rank count. Which kv heads each family splits and which it
replicates (fewer kv heads than ranks, gemma4/parallel/plan.py):
- e2b: 1 kv head, replicated at every N; the Per-Layer Embeddings and the KV-shared layers as E2B's.
- 12b: 12 kv heads, split at every N.
- moe: sliding layers 12 kv heads (split), K=V full layers 1 (replicated); the experts' width 48 split.
- dense: the reverse of moe: sliding 1 kv head, K=V full layers 12.
The drafter has 12 query heads and an MLP of 96 too: its rank reads the K/V heads its target rank holds."""

from pathlib import Path

import pytest

from tests.checkpoints import write_assistant, write_target
from tests.int4_checkpoints import to_int4

HEADS = 12
FIELDS = {
    "e2b": dict(num_attention_heads=HEADS, intermediate_size=96),
    "12b": dict(num_attention_heads=HEADS, num_key_value_heads=12, intermediate_size=96),
    "moe": dict(num_attention_heads=HEADS, num_key_value_heads=12, num_global_key_value_heads=1,
                intermediate_size=96, moe_intermediate_size=48),
    "dense": dict(num_attention_heads=HEADS, num_key_value_heads=1, num_global_key_value_heads=12,
                  intermediate_size=96),
}
PROMPTS = [[2, 5, 17, 99, 300, 41, 5, 17, 8, 77, 5, 17], [2, 44, 3]]  # longer and shorter than the window (8)
_written: dict[str, tuple[Path, Path]] = {}


def tp_pair(family: str, factory: pytest.TempPathFactory, int4: bool = False) -> tuple[Path, Path]:
    """(target, assistant) of `family`, written once a test process. int4: the target stored as a w4a16
    release stores it (tests/int4_checkpoints.py), its MLP width 192 so each rank's down_proj inputs at N = 2
    and 3 hold whole groups of 32."""
    key = f"{family}{'-int4' if int4 else ''}"
    if key not in _written:
        root = factory.mktemp(f"tp-{key}")
        fields = FIELDS[family] | (dict(intermediate_size=192) if int4 else {})
        written = write_target(root / "float", family, fields=fields, ple_width=32 if int4 else None)
        target = to_int4(written, root / "target") if int4 else written
        assistant = write_assistant(root / "assistant", written, ordered_embeddings=family == "e2b", echo=True,
                                    heads=HEADS, intermediate=96)
        _written[key] = target, assistant
    return _written[key]
