"""The engine's KV cache, written by absolute position: full layers keep every position, sliding
layers only a ring of their window. The textbook's cache (gemma4/cache.py) keeps every position of
one row; this one serves many rows and long contexts.

- Full layers: slot = position, up to `capacity` (a call's prompt + budget).
- Sliding layers: a ring of `ring = W + slack` slots, slot = position mod ring. `slack` is the most
  positions one forward may write (the prompt's forward, a verify of K + 1 rows). Every slot
  remembers the absolute position it holds (`slot_positions`, -2^40 while empty), so the one mask
  helper compares query and key positions: a slot outside a query's window, a stale one past the
  length and an empty one are all hidden by the same comparison. Why W + slack slots never lose a
  key a query still reads: gemma4/README.md §15.
- Only non-shared layers own buffers: KV-shared layers (and the MTP drafter) read their source
  layer's.
- `length` (B,) is the number of valid positions of each row, on the host. The loop owns it: a
  forward writes K/V at the positions it is given and never moves `length`. Rolling back lowers it;
  later writes overwrite the stale slots. One prompt is the batch of one row; rows of a batch sit at
  their own positions (gemma4/engine/rows.py).

Shape legend: B batch, G kv heads, T new tokens, S slots read, D head dim, R ring slots."""

import copy
from typing import NamedTuple

import torch
from torch import Tensor

from gemma4.config import FULL, SLIDING, TextConfig

# The positions the engine's prefill runs in one forward unless told (gemma4/README.md §15).
PREFILL_CHUNK = 512
# A ring always has room for a verify of 64 rows (63 drafts), whatever the prompt's forward.
MIN_SLACK = 64
# The position of a slot never written: outside every query's window.
EMPTY = -(2**40)


def ring_slack(forward: int) -> int:
    """The slack a cache needs for forwards of this many positions and verifies of up to MIN_SLACK
    rows."""
    return max(forward, MIN_SLACK)


class Slots(NamedTuple):
    """Where one forward writes and which keys its layers read: made once per forward by
    `RingCache.claim`."""
    batch_index: Tensor  # (B, 1): the batch row of every write
    positions: Tensor  # (B, T): the absolute positions written
    ring: Tensor  # (B, T): their slots in a sliding layer's ring
    end: int  # max_b start_b + T: full layers read positions 0..end-1 of every row
    # Layer type -> the positions of the slots it reads, (1, S) or (B, S).
    key_positions: dict[str, Tensor]
    # Each row's first position on the host, for the speed layer's attention query by query (gemma4/fast/
    # attention.py); None where only the device has them (a compiled step's).
    starts: tuple[int, ...] | None = None


class KV(NamedTuple):
    """One layer's cached keys and values as a reader sees them (the drafter's `shared_kv`)."""
    keys: Tensor  # (B, G, S, D)
    values: Tensor  # (B, G, S, D)
    positions: Tensor  # the slots' positions: (1, S) 0..S-1 on a full layer, (B, S) a ring's


class RingCache:
    def __init__(self, config: TextConfig, capacity: int, batch: int = 1,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 slack: int = ring_slack(PREFILL_CHUNK)) -> None:
        # The most positions it holds, the most one forward writes, and the slots of a sliding
        # layer.
        self.capacity, self.slack = capacity, slack
        self.ring = min(capacity, config.sliding_window + slack)
        self.length = torch.zeros(batch, dtype=torch.long)  # (B,) on the host
        self.kinds = {i: config.layer_types[i] for i in range(config.first_shared_layer)}
        # Layer -> (B, G, S_alloc, D), one pair per non-shared layer: S_alloc = capacity (full) or
        # ring.
        self.keys: dict[int, Tensor] = {}
        self.values: dict[int, Tensor] = {}
        for i in self.kinds:
            shape = (batch, config.kv_heads[i], self.allocate(i), config.head_dims[i])
            self.keys[i] = torch.zeros(shape, dtype=dtype, device=device)
            self.values[i] = torch.zeros(shape, dtype=dtype, device=device)
        self.slot_positions = torch.full((batch, self.ring), EMPTY, device=device)  # (B, R)

    def row(self, b: int) -> "RingCache":
        """Batch row b as a one-row cache whose buffers are views of this one's: what a forward writes through
        it lands in row b. Its `length` is its own (the loop sets this cache's)."""
        one = copy.copy(self)
        one.keys = {i: k[b:b + 1] for i, k in self.keys.items()}  # (1, G, S_alloc, D) views
        one.values = {i: v[b:b + 1] for i, v in self.values.items()}
        one.slot_positions = self.slot_positions[b:b + 1]  # (1, R)
        one.length = self.length[b:b + 1].clone()
        return one

    def allocate(self, layer: int) -> int:
        """The slots a layer's buffers get at first: all it may hold, the ring or the capacity (a
        growing cache starts with none: mtp/extras/growing.py)."""
        return self.ring if self.kinds[layer] == SLIDING else self.capacity

    def claim(self, start: Tensor, t: int) -> Slots:
        """Slots for T new tokens of every row b at start[b].. (start (B,) on the host), checked
        once per forward, not per layer; records the positions the ring's slots will hold."""
        if t > self.slack:
            raise ValueError(f"a forward of {t} positions does not fit the sliding layers' slack "
                             f"of {self.slack}: run it in chunks of at most {self.slack}")
        # Host memory, read as numpy: no device is asked (a GPU tensor would raise).
        starts, lengths = start.numpy(), self.length.numpy()
        if (starts > lengths).any():
            raise ValueError(f"writes at {starts.tolist()} would leave a hole: "
                             f"{lengths.tolist()} are valid")
        end = int(starts.max()) + t
        if end > self.capacity:
            raise ValueError(f"KV cache holds {self.capacity} positions; position {end - 1} "
                             "does not fit")
        device = self.slot_positions.device
        positions = (start[:, None] + torch.arange(t)).to(device)  # (B, T)
        # (B, 1), (B, T)
        index, ring = torch.arange(len(start), device=device)[:, None], positions % self.ring
        self.slot_positions[index, ring] = positions
        # Full layers read positions 0..end-1, the same for every row; sliding ones the ring's slots
        # in use.
        full = torch.arange(end, device=device)[None]  # (1, S)
        sliding = self.slot_positions[:, :min(end, self.ring)]  # (B, S)
        return Slots(index, positions, ring, end, {FULL: full, SLIDING: sliding}, tuple(starts.tolist()))

    def write(self, layer: int, slots: Slots, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store k, v (B, G, T, D) at the claimed slots; return views of every slot the layer reads
        (B, G, S, D)."""
        where = slots.ring if self.kinds[layer] == SLIDING else slots.positions  # (B, T)
        # Advanced indices [batch row, :, where] address (B, T, K, D): every row at its own slots.
        self.keys[layer][slots.batch_index, :, where] = k.transpose(1, 2)
        self.values[layer][slots.batch_index, :, where] = v.transpose(1, 2)
        # S: the slots this layer's type reads, claimed once a forward.
        s = slots.key_positions[self.kinds[layer]].shape[-1]
        return self.keys[layer][:, :, :s], self.values[layer][:, :, :s]

    def read(self, layer: int, end: int) -> KV:
        """What a reader of positions 0..end-1 attends to: views of the slots in use and their
        positions."""
        if self.kinds[layer] == SLIDING:
            s = min(end, self.ring)
            positions = self.slot_positions[:, :s]  # (B, S)
        else:
            s, positions = end, torch.arange(end, device=self.slot_positions.device)[None]  # (1, S)
        # (B, G, n, D) x 2
        return KV(self.keys[layer][:, :, :s], self.values[layer][:, :, :s], positions)
