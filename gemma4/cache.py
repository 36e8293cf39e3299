"""KV cache, written by absolute position: full layers keep every position, sliding layers only their window.

- Full layers: slot = position, up to `capacity` (a call's prompt + budget).
- Sliding layers: a ring of `ring = W + slack` slots, slot = position mod ring. `slack` is the most positions one
  forward may write (a prefill chunk, a verify of K + 1 rows). Every slot remembers the absolute position it holds
  (`slot_positions`, -2^40 while empty), so the one mask helper compares query and key positions: a slot outside a
  query's window, a stale one past the length and an empty one are all hidden by the same comparison. Why W + slack
  slots never lose a key a query still reads: gemma4/README.md §15.
- Only non-shared layers own buffers: KV-shared layers (and the MTP drafter) read their source layer's.
- `length` (B,) is the number of valid positions of each row, kept on the host so that reading it never waits for a
  device. The loop owns it: a forward writes K/V at the positions it is given and never moves `length`. Rolling
  back lowers it; later writes overwrite the stale slots. Rows sit at different positions (mtp/README.md §12): row
  b writes at its own positions, every slot past them is stale (the causal mask hides it), and a finished row
  leaves with `keep`. One prompt is the batch of one row.

Shape legend: B batch, K kv heads, T new tokens, S slots read, D head dim, R ring slots."""

from typing import NamedTuple

import torch

from gemma4.config import FULL, SLIDING, TextConfig

PREFILL_CHUNK = 512  # positions a prefill runs in one forward unless told (gemma4/README.md §15)
MIN_SLACK = 64  # a ring always has room for a verify of 64 rows (63 drafts), whatever the prefill chunk
EMPTY = -(2**40)  # the position of a slot never written: outside every query's window


def ring_slack(prefill_chunk: int) -> int:
    """The slack a cache needs for prefill chunks of this size and verifies of up to MIN_SLACK rows."""
    return max(prefill_chunk, MIN_SLACK)


class Slots(NamedTuple):
    """Where one forward writes and which keys its layers read: made once per forward by `KVCache.claim`."""
    batch_index: torch.Tensor  # (B, 1): the batch row of every write
    positions: torch.Tensor  # (B, T): the absolute positions written
    ring: torch.Tensor  # (B, T): their slots in a sliding layer's ring
    end: int  # max_b start_b + T: full layers read positions 0..end-1 of every row
    keys: dict[str, torch.Tensor]  # type -> the positions of the slots it reads, (1, S) (every row's) or (B, S)


class KV(NamedTuple):
    """One layer's cached keys and values as a reader sees them (the drafter's `shared_kv`)."""
    keys: torch.Tensor  # (B, K, S, D)
    values: torch.Tensor  # (B, K, S, D)
    positions: torch.Tensor  # the slots' positions: (1, S) 0..S-1 on a full layer, (B, S) a ring's


class KVCache:
    def __init__(
        self, config: TextConfig, capacity: int, batch: int = 1,
        dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", slack: int = ring_slack(PREFILL_CHUNK),
    ) -> None:
        self.capacity = capacity  # the most positions it may hold
        self.slack = slack  # the most positions one forward may write
        self.ring = min(capacity, config.sliding_window + slack)  # slots of a sliding layer
        self.length = torch.zeros(batch, dtype=torch.long)  # (B,) on the host
        self.kinds = {i: config.layer_types[i] for i in range(config.first_shared_layer)}
        # layer -> (B, K, S_alloc, D): S_alloc = capacity (full) or ring (sliding); one pair per non-shared layer
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        for i in self.kinds:
            shape = (batch, config.kv_heads[i], self.allocate(i), config.head_dims[i])
            self.keys[i] = torch.zeros(shape, dtype=dtype, device=device)
            self.values[i] = torch.zeros(shape, dtype=dtype, device=device)
        self.slot_positions = torch.full((batch, self.ring), EMPTY, dtype=torch.long, device=device)  # (B, R)

    def size(self, layer: int) -> int:
        return self.ring if self.kinds[layer] == SLIDING else self.capacity  # the most slots its buffers may hold

    def allocate(self, layer: int) -> int:
        return self.size(layer)  # the slots made at first: all (a growing cache makes fewer: mtp/extras/growing.py)

    def claim(self, start: torch.Tensor, t: int) -> Slots:
        """Slots for T new tokens of every row b at start[b].. (start (B,) on the host), checked once per forward, not
        per layer; records the positions the ring's slots will hold."""
        if t > self.slack:
            raise ValueError(f"a forward of {t} positions does not fit the sliding layers' slack of {self.slack}: "
                             f"run it in chunks of at most {self.slack}")
        starts, lengths = start.numpy(), self.length.numpy()  # host memory, read without a device (a GPU's raises)
        if (starts > lengths).any():
            raise ValueError(f"writes at {starts.tolist()} would leave a hole: {lengths.tolist()} are valid")
        end = int(starts.max()) + t
        if end > self.capacity:
            raise ValueError(f"KV cache holds {self.capacity} positions; position {end - 1} does not fit")
        device = self.slot_positions.device
        positions = (start[:, None] + torch.arange(t)).to(device, non_blocking=True)  # (B, T), the host need not wait
        index, ring = torch.arange(len(start), device=device)[:, None], positions % self.ring  # (B, 1), (B, T)
        self.slot_positions[index, ring] = positions
        full = torch.arange(end, device=device)[None]  # (1, S): positions 0..end-1, the same for every row
        return Slots(index, positions, ring, end, {FULL: full, SLIDING: self.slot_positions[:, :min(end, self.ring)]})

    def write(self, layer: int, slots: Slots, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, K, T, D) at the claimed slots; return views of every slot the layer reads (B, K, S, D)."""
        where = slots.ring if self.kinds[layer] == SLIDING else slots.positions  # (B, T)
        # Advanced indices [batch row, :, where] address (B, T, K, D): every row at its own slots.
        self.keys[layer][slots.batch_index, :, where] = k.transpose(1, 2)
        self.values[layer][slots.batch_index, :, where] = v.transpose(1, 2)
        s = slots.keys[self.kinds[layer]].shape[-1]  # S: the slots this layer's kind reads, claimed once a forward
        return self.keys[layer][:, :, :s], self.values[layer][:, :, :s]  # no key positions made per layer

    def read(self, layer: int, end: int) -> KV:
        """What a reader of positions 0..end-1 attends to: views of the slots in use and their positions."""
        sliding = self.kinds[layer] == SLIDING
        n = min(end, self.ring) if sliding else end
        positions = self.slot_positions[:, :n] if sliding else torch.arange(n, device=self.slot_positions.device)[None]
        return KV(self.keys[layer][:, :, :n], self.values[layer][:, :, :n], positions)  # (B, K, n, D), (B or 1, n)

    def keep(self, kept: list[int]) -> None:
        """Keep only these batch rows, in this order: finished rows leave (a copy per finish, not per step)."""
        index = torch.tensor(kept, device=self.slot_positions.device)
        for layer in self.keys:
            self.keys[layer] = self.keys[layer][index]  # (B', K, S_alloc, D)
            self.values[layer] = self.values[layer][index]
        self.slot_positions = self.slot_positions[index]  # (B', R)
        self.length = self.length[kept]
