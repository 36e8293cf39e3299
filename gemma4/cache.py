"""KV cache, written by absolute position, grown by doubling.

- `capacity` is the most positions the cache may hold (a call's prompt + budget, or the whole
  context for a conversation); `reserve` is how many it allocates at first (all of them unless told).
  A write past the allocated positions grows that layer's buffers to twice their size (at least to
  the write's end, at most to `capacity`) with one copy of what they held, so a conversation on a
  128k-context model holds about what it has used, and the copies add up to less than the final size.
  Growth copies cost four orders of magnitude less than an E2B decode step (scripts/benchmark.md).
  While a layer grows, its old and new buffers coexist: the peak is 1.5x the new size for that layer.

- Only non-shared layers own buffers: KV-shared layers (and the MTP drafter) read the buffers of
  their source layer (`TextConfig.kv_source`).
- Sliding layers keep full-length buffers too: the window lives in the attention mask, never in the
  storage, so positions never move and a rollback is a single integer.
- `length` is the number of valid positions. The generation loop owns it: a forward writes K/V at the
  positions it is given and never moves `length`; the loop sets it after committing tokens. Rolling
  back means lowering `length`; later writes overwrite the stale slots.
- A batch of rows at different positions (mtp/README.md §12): `length` is then a (B,) tensor, row b's T new
  tokens are written at its own positions length_b.. in one indexed assignment, and every slot past a
  row's own positions is stale: the causal mask hides it. A finished row leaves with `keep`.
"""

from typing import NamedTuple

import torch

from gemma4.config import TextConfig


class RowSlots(NamedTuple):
    """Where one batched forward writes: row b's T new tokens at positions start_b..start_b+T-1."""
    rows: torch.Tensor  # (B, 1): the row index of every slot
    positions: torch.Tensor  # (B, T)
    end: int  # max_b start_b + T: reads cover positions 0..end-1 of every row


class KVCache:
    def __init__(
        self, config: TextConfig, capacity: int, batch: int = 1,
        dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", reserve: int | None = None,
    ) -> None:
        self.capacity = capacity  # the most positions it may hold; buffers grow up to it
        self.length: int | torch.Tensor = 0  # per row (B,) in a batch whose rows sit at different positions
        # layer -> (B, K, S_alloc, D), S_alloc <= capacity; one pair per layer that computes its own K/V
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        size = capacity if reserve is None else min(reserve, capacity)
        for i in range(config.first_shared_layer):
            shape = (batch, config.kv_heads[i], size, config.head_dims[i])
            self.keys[i] = torch.zeros(shape, dtype=dtype, device=device)
            self.values[i] = torch.zeros(shape, dtype=dtype, device=device)

    def row_slots(self, start: torch.Tensor, t: int) -> RowSlots:
        """Per-row positions for T new tokens at start (B,), checked once per forward, not per layer."""
        end = int(start.max()) + t
        if bool((start > self.length).any()):
            raise ValueError(f"writes at positions {start.tolist()} would leave a hole: {self.length.tolist()} are valid")
        if end > self.capacity:
            raise ValueError(f"KV cache holds {self.capacity} positions; position {end - 1} does not fit")
        positions = start[:, None] + torch.arange(t, device=start.device)  # (B, T)
        return RowSlots(torch.arange(len(start), device=start.device)[:, None], positions, end)

    def write(self, layer: int, start: int | RowSlots, k: torch.Tensor, v: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, K, T, D) at positions start..start+T-1; return views of positions 0..start+T-1."""
        if isinstance(start, RowSlots):  # advanced indices [rows, :, positions] address (B, T, K, D)
            self.fit(layer, start.end)
            self.keys[layer][start.rows, :, start.positions] = k.transpose(1, 2)
            self.values[layer][start.rows, :, start.positions] = v.transpose(1, 2)
            return self.read(layer, start.end)
        end = start + k.shape[2]
        if start > self.length:
            raise ValueError(f"write at position {start} would leave a hole: only {self.length} positions are valid")
        if end > self.capacity:
            raise ValueError(f"KV cache holds {self.capacity} positions; position {end - 1} does not fit")
        self.fit(layer, end)
        self.keys[layer][:, :, start:end] = k
        self.values[layer][:, :, start:end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]  # (B, K, end, D) views

    def allocated(self, layer: int) -> int:
        """Positions this layer's buffers hold now (grown on demand up to `capacity`)."""
        return self.keys[layer].shape[2]

    def fit(self, layer: int, end: int) -> None:
        """Make room for positions 0..end-1 of one layer: double (at least to end, at most to capacity)."""
        if self.values[layer].shape[2] >= end:  # the common case, every decode step: values grow last
            return
        for buffers in (self.keys, self.values):  # each checked alone: an interrupt may fall between them
            old = buffers[layer]  # (B, K, S_old, D)
            if old.shape[2] < end:
                size = min(self.capacity, max(end, 2 * old.shape[2]))
                # Zeros, not empty: stale slots are read under the mask, and NaN * 0 would leak through.
                new = old.new_zeros(old.shape[0], old.shape[1], size, old.shape[3])  # (B, K, S_new, D)
                new[:, :, :old.shape[2]] = old
                buffers[layer] = new

    def read(self, layer: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of positions 0..end-1 of one layer: what the drafter attends to."""
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]  # (B, K, end, D)

    def keep(self, rows: list[int]) -> None:
        """Keep only these rows, in this order: finished rows leave the batch (a copy per finish, not per step)."""
        index = torch.tensor(rows, device=self.length.device)
        for layer in self.keys:
            self.keys[layer] = self.keys[layer][index]  # (B', K, S_alloc, D)
            self.values[layer] = self.values[layer][index]
        self.length = self.length[index]
