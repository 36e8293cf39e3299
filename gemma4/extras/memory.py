"""What a KV cache will hold, in bytes, before it is made: the command-line tools refuse a run whose cache cannot
fit the memory left (scripts/cli/options.py), and the benchmark tabulates it per release (scripts/bench/context.py)."""

import torch

from gemma4.engine.ring import PREFILL_CHUNK, ring_slack
from gemma4.config import SLIDING, TextConfig


def cache_bytes(config: TextConfig, positions: int, slack: int = ring_slack(PREFILL_CHUNK), batch: int = 1,
                dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes of the K/V buffers of a cache holding `positions` positions: what a RingCache of that capacity
    allocates once full (its slot positions, 8 bytes a ring slot, not counted). slack >= positions gives the
    cache that keeps every position of every layer."""
    ring = min(positions, config.sliding_window + slack)
    size = dtype.itemsize if hasattr(dtype, "itemsize") else torch.empty((), dtype=dtype).element_size()
    total = 0
    for i in range(config.first_shared_layer):
        slots = ring if config.layer_types[i] == SLIDING else positions
        total += 2 * batch * config.kv_heads[i] * slots * config.head_dims[i] * size  # K and V
    return total
