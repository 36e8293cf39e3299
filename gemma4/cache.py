"""KV cache, written by absolute position: full layers keep every position, sliding layers only their window.

- Full layers: slot = position, up to `capacity` (a call's prompt + budget, or the whole context for a conversation).
  `reserve` slots are allocated at first (all unless told); a write past them doubles that layer's buffers (at least
  to the write's end, at most to `capacity`) with one copy, so a conversation on a 128k-context model holds about
  what it has used (1.5x the new size while a layer grows).
- Sliding layers: a ring of `ring = W + slack` slots, slot = position mod ring, grown the same way. `slack` is the
  most positions one forward may write (a prefill chunk, a verify of K + 1 rows). Every slot remembers the absolute
  position it holds (`slot_positions`, -2^40 while empty), so the one mask helper compares query and key positions: a
  slot outside a query's window, a stale one past the length and an empty one are all hidden by the same comparison.
  Why W + slack slots never lose a key a query still reads: gemma4/README.md §15.
- Only non-shared layers own buffers: KV-shared layers (and the MTP drafter) read their source layer's.
- `length` is the number of valid positions. The loop owns it: a forward writes K/V at the positions it is given and
  never moves `length`. Rolling back lowers `length`; later writes overwrite the stale slots. `frontier` is one past
  the newest position written since the sequence last started at 0 (`holds`).
- Rows at different positions (mtp/README.md §12): `length` is a (B,) tensor, row b writes at its own positions,
  every slot past them is stale (the causal mask hides it), and a finished row leaves with `keep`.

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
    rows: torch.Tensor | None  # (B, 1): the row index of every write, for rows at different positions
    positions: torch.Tensor  # (T,) or (B, T): the absolute positions written
    ring: torch.Tensor  # (T,) or (B, T): their slots in a sliding layer's ring
    end: int  # max_b start_b + T: full layers read positions 0..end-1 of every row
    keys: dict[str, int | torch.Tensor]  # type -> the positions of the slots it reads: n (0..n-1) or (S,) / (B, S)


class KV(NamedTuple):
    """One layer's cached keys and values as a reader sees them (the drafter's `shared_kv`)."""
    keys: torch.Tensor  # (B, K, S, D)
    values: torch.Tensor  # (B, K, S, D)
    positions: int | torch.Tensor  # the slots' positions: n (0..n-1, a full layer) or (S,) / (B, S) (a ring)


class KVCache:
    def __init__(
        self, config: TextConfig, capacity: int, batch: int = 1,
        dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", reserve: int | None = None,
        slack: int = ring_slack(PREFILL_CHUNK),
    ) -> None:
        self.capacity = capacity  # the most positions it may hold; buffers grow up to it
        self.slack = slack  # the most positions one forward may write
        self.ring = min(capacity, config.sliding_window + slack)  # slots of a sliding layer
        self.length: int | torch.Tensor = 0  # per row (B,) in a batch whose rows sit at different positions
        self.frontier = 0  # one past the newest position written since the sequence started at 0 (max over rows)
        self.kinds = {i: config.layer_types[i] for i in range(config.first_shared_layer)}
        # layer -> (B, K, S_alloc, D), S_alloc <= capacity (full) or ring (sliding); one pair per non-shared layer
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        for i, kind in self.kinds.items():
            size = self.size(i) if reserve is None else min(reserve, self.size(i))
            shape = (batch, config.kv_heads[i], size, config.head_dims[i])
            self.keys[i] = torch.zeros(shape, dtype=dtype, device=device)
            self.values[i] = torch.zeros(shape, dtype=dtype, device=device)
        self.slot_positions = torch.full((batch, self.ring), EMPTY, dtype=torch.long, device=device)  # (B, R)

    def size(self, layer: int) -> int:
        """The most slots this layer's buffers may hold: every position, or the ring."""
        return self.ring if self.kinds[layer] == SLIDING else self.capacity

    def holds(self, n: int) -> bool:
        """Whether every key a query at position n or later may read is still in the cache once the length is
        lowered to n: nothing ever wrapped, or no stale write since reached past n + slack (§15)."""
        return n == 0 or self.frontier <= max(self.ring, n + self.slack)

    def claim(self, start: int | torch.Tensor, t: int) -> Slots:
        """Slots for T new tokens at start (an int, or (B,) per row), checked once per forward, not per layer;
        records the positions the ring's slots will hold."""
        if t > self.slack:
            raise ValueError(f"a forward of {t} positions does not fit the sliding layers' slack of {self.slack}: "
                             f"run it in chunks of at most {self.slack}")
        device = self.slot_positions.device
        if isinstance(start, int):
            end, rows = start + t, None
            if start > self.length:
                raise ValueError(f"write at position {start} would leave a hole: {self.length} positions are valid")
            positions = torch.arange(start, end, device=device)  # (T,)
        else:
            end, rows = int(start.max()) + t, torch.arange(len(start), device=device)[:, None]  # (B, 1)
            if bool((start > self.length).any()):
                raise ValueError(f"writes at {start.tolist()} would leave a hole: {self.length.tolist()} are valid")
            positions = start[:, None] + torch.arange(t, device=device)  # (B, T)
        if end > self.capacity:
            raise ValueError(f"KV cache holds {self.capacity} positions; position {end - 1} does not fit")
        ring = positions % self.ring  # (T,) or (B, T)
        self.slot_positions[slice(None) if rows is None else rows, ring] = positions  # every row the same, or its own
        self.frontier = end if isinstance(start, int) and start == 0 else max(self.frontier, end)
        n = min(end, self.ring)  # the ring's slots in use: 0..n-1 (all of them once it has wrapped)
        sliding = self.slot_positions[0, :n] if rows is None else self.slot_positions[:, :n]  # (S,) or (B, S)
        return Slots(rows, positions, ring, end, {FULL: end, SLIDING: sliding})

    def write(self, layer: int, slots: Slots, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, K, T, D) at the claimed slots; return views of every slot the layer reads (B, K, S, D)."""
        sliding = self.kinds[layer] == SLIDING
        self.fit(layer, min(slots.end, self.ring) if sliding else slots.end)
        keys, values = self.keys[layer], self.values[layer]
        if slots.rows is not None:  # advanced indices [rows, :, slots] address (B, T, K, D)
            where = slots.ring if sliding else slots.positions  # (B, T)
            keys[slots.rows, :, where] = k.transpose(1, 2)
            values[slots.rows, :, where] = v.transpose(1, 2)
        else:  # every row at the same positions: their slots along dim 2
            keys.index_copy_(2, slots.ring if sliding else slots.positions, k)
            values.index_copy_(2, slots.ring if sliding else slots.positions, v)
        return self.read(layer, slots.end)[:2]

    def read(self, layer: int, end: int) -> KV:
        """What a reader of positions 0..end-1 attends to: views of the slots in use and their positions."""
        if self.kinds[layer] == SLIDING:
            n = min(end, self.ring)
            positions = self.slot_positions[:, :n]  # (B, S)
            return KV(self.keys[layer][:, :, :n], self.values[layer][:, :, :n],
                      positions[0] if isinstance(self.length, int) else positions)
        return KV(self.keys[layer][:, :, :end], self.values[layer][:, :, :end], end)  # (B, K, end, D)

    def fit(self, layer: int, end: int) -> None:
        """Make room for slots 0..end-1 of one layer: double (at least to end, at most to its size)."""
        if self.values[layer].shape[2] >= end:  # the common case, every decode step: values grow last
            return
        for buffers in (self.keys, self.values):  # each checked alone: an interrupt may fall between them
            old = buffers[layer]  # (B, K, S_old, D)
            if old.shape[2] < end:
                size = min(self.size(layer), max(end, 2 * old.shape[2]))
                # Zeros, not empty: stale slots are read under the mask, and NaN * 0 would leak through.
                new = old.new_zeros(old.shape[0], old.shape[1], size, old.shape[3])  # (B, K, S_new, D)
                new[:, :, :old.shape[2]] = old
                buffers[layer] = new

    def keep(self, rows: list[int]) -> None:
        """Keep only these rows, in this order: finished rows leave the batch (a copy per finish, not per step)."""
        index = torch.tensor(rows, device=self.length.device)
        for layer in self.keys:
            self.keys[layer] = self.keys[layer][index]  # (B', K, S_alloc, D)
            self.values[layer] = self.values[layer][index]
        self.slot_positions = self.slot_positions[index]  # (B', R)
        self.length = self.length[index]
