"""The textbook's KV cache: one row, every position kept, slot = position.

- Each layer that computes its own K/V owns a buffer of `capacity` slots (the prompt + the budget).
  KV-shared layers and the MTP drafter own none: they read their source layer's buffer.
- A forward at positions start..start+T-1 writes slots start..start+T-1 and reads slots
  0..start+T-1. Sliding layers read them all too: the mask, which compares positions, hides the keys
  outside their window (gemma4/model.py `attention_mask`).
- `length` is how many positions hold committed K/V. The loop owns it; a forward never moves it.
  Rolling back is lowering it: the slots above are stale, and the next forward overwrites them
  before any query can read them.

The engine's cache keeps only a ring of the window on sliding layers, and many rows
(gemma4/engine/ring.py). It holds the same keys for every query, in another order.

Shape legend: G kv heads, S slots read, T new tokens, D head dim."""

import torch
from torch import Tensor

from gemma4.config import TextConfig

KVPair = tuple[Tensor, Tensor]  # a layer's keys and values, (1, G, S, D) each


class KVCache:
    def __init__(self, config: TextConfig, capacity: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu") -> None:
        self.capacity = capacity
        self.length = 0  # positions 0..length-1 hold committed K/V
        # Layer -> (1, G, capacity, D), for every layer before the first KV-shared one.
        self.keys: dict[int, Tensor] = {}
        self.values: dict[int, Tensor] = {}
        for layer in range(config.first_shared_layer):
            shape = (1, config.kv_heads[layer], capacity, config.head_dims[layer])
            self.keys[layer] = torch.zeros(shape, dtype=dtype, device=device)
            self.values[layer] = torch.zeros(shape, dtype=dtype, device=device)

    def write(self, layer: int, start: int, k: Tensor, v: Tensor) -> KVPair:
        """Store k, v (1, G, T, D) at positions start..start+T-1; return slots 0..start+T-1, which
        the forward's queries read."""
        end = start + k.shape[2]
        if end > self.capacity:
            raise ValueError(f"the KV cache holds {self.capacity} positions; "
                             f"position {end - 1} does not fit")
        self.keys[layer][:, :, start:end] = k
        self.values[layer][:, :, start:end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def read(self, layer: int) -> KVPair:
        """The committed K/V of one layer: positions 0..length-1, (1, G, length, D) each."""
        return self.keys[layer][:, :, :self.length], self.values[layer][:, :, :self.length]
