"""Preallocated KV cache, written by absolute position.

- Only non-shared layers own buffers: KV-shared layers (and the MTP drafter) read the buffers of
  their source layer (`TextConfig.kv_source`).
- Sliding layers keep full-length buffers too: the window lives in the attention mask, never in the
  storage, so positions never move and a rollback is a single integer.
- `length` is the number of valid positions. The generation loop owns it: a forward writes K/V at the
  positions it is given and never moves `length`; the loop sets it after committing tokens. Rolling
  back means lowering `length`; later writes overwrite the stale slots.
"""

import torch

from gemma4.config import TextConfig


class KVCache:
    def __init__(
        self, config: TextConfig, capacity: int, batch: int = 1,
        dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
    ) -> None:
        self.capacity = capacity
        self.length = 0
        # layer -> (B, K, S_max, D); one pair per layer that computes its own K/V
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        for i in range(config.first_shared_layer):
            shape = (batch, config.kv_heads[i], capacity, config.head_dims[i])
            self.keys[i] = torch.zeros(shape, dtype=dtype, device=device)
            self.values[i] = torch.zeros(shape, dtype=dtype, device=device)

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, K, T, D) at positions start..start+T-1; return views of positions 0..start+T-1."""
        end = start + k.shape[2]
        if start > self.length:
            raise ValueError(f"write at position {start} would leave a hole: only {self.length} positions are valid")
        if end > self.capacity:
            raise ValueError(f"KV cache holds {self.capacity} positions; position {end - 1} does not fit")
        self.keys[layer][:, :, start:end] = k
        self.values[layer][:, :, start:end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]  # (B, K, end, D) views

    def read(self, layer: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of positions 0..end-1 of one layer: what the drafter attends to."""
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]  # (B, K, end, D)
