"""A conversation's KV cache (mtp/extras/conversation.py): sized to the whole context, it grows as it fills, and it
says whether a prefix it held is still whole when a turn reuses it (`holds`).

- Full layers: no slot is made at first; a write past the slots made doubles that layer's buffers (at least to the
  write's end, at most to the capacity) with one copy, so a conversation on a 128k-context model holds about what
  it has used (1.5x the new size while a layer grows). Sliding layers' rings grow the same way.
- `frontier` is one past the newest position written since the sequence last started at 0. Once a ring has
  wrapped, a rollback to n keeps every key a query at n or later may read only while no stale write since
  reached past n + slack (gemma4/README.md §15).

Shape legend: B batch (1), K kv heads, S slots, D head dim."""

import torch

from gemma4.engine.ring import RingCache, Slots
from gemma4.config import SLIDING, TextConfig


class GrowingCache(RingCache):
    def __init__(self, config: TextConfig, capacity: int, dtype: torch.dtype, device: torch.device | str,
                 slack: int) -> None:
        super().__init__(config, capacity, dtype=dtype, device=device, slack=slack)
        self.frontier = 0  # one past the newest position written since the sequence started at 0

    def allocate(self, layer: int) -> int:
        return 0  # every layer grows on its first write

    def holds(self, n: int) -> bool:
        """Whether every key a query at position n or later may read is still in the cache once the length is
        lowered to n: nothing ever wrapped, or no stale write since reached past n + slack."""
        return n == 0 or self.frontier <= max(self.ring, n + self.slack)

    def claim(self, start: torch.Tensor, t: int) -> Slots:
        slots = super().claim(start, t)
        self.frontier = slots.end if int(start[0]) == 0 else max(self.frontier, slots.end)
        return slots

    def write(self, layer: int, slots: Slots, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.fit(layer, min(slots.end, self.ring) if self.kinds[layer] == SLIDING else slots.end)
        return super().write(layer, slots, k, v)

    def fit(self, layer: int, end: int) -> None:
        """Make room for slots 0..end-1 of one layer: double (at least to end, at most to its size)."""
        if self.values[layer].shape[2] >= end:  # the common case, every decode step: values grow last
            return
        for buffers in (self.keys, self.values):  # each checked alone: an interrupt may fall between them
            old = buffers[layer]  # (B, K, S_old, D)
            if old.shape[2] < end:
                size = min(RingCache.allocate(self, layer), max(end, 2 * old.shape[2]))  # at most all
                # Zeros, not empty: stale slots are read under the mask, and NaN * 0 would leak through.
                new = old.new_zeros(old.shape[0], old.shape[1], size, old.shape[3])  # (B, K, S_new, D)
                new[:, :, :old.shape[2]] = old
                buffers[layer] = new
