"""The PLE table's rows through a pinned staging buffer: for a model on a GPU.

E2B's Per-Layer-Embedding table (262,144 x 8,960, 4.7 GB in bfloat16) stays in host memory, a view of the file
(gemma4/weights.py): a forward reads only its tokens' rows. The textbook's `Gemma4Model.per_layer_rows` looks them
up into ordinary (pageable) host memory and copies that to the device; a copy out of pageable memory goes through
the driver's own staging and can wait for the device's queue. `StagedRows` looks them up straight into pinned
memory of just their size and sends it without blocking. Pinning the table instead would lock 8 GiB (the pinned
allocator rounds 4.7 GB up to a power of two) and read all of it at load.

The buffer is not reused by hand: torch's pinned-memory cache hands a block out again only once the copies queued
out of it have run (it records an event on the copy's stream). Pinned memory held: the largest forward's rows, e.g.
a 512-token prefill chunk of E2B, 512 x 8,960 x 2 bytes = 9.2 MB. The values are the textbook's, bit for bit: the
same rows, moved, cast and scaled in the same order.

Shape legend: B rows, T tokens, L layers, P PLE width."""

import torch
from torch import nn

from gemma4.model import embed_scale


class StagedRows:
    """`model.per_layer_rows`, replaced on the instance by the loaders off the CPU (gemma4/fast/apply.py)."""

    def __init__(self, model: nn.Module, pin: bool = True) -> None:
        self.table = model.embed_tokens_per_layer.weight  # (V_ple, L*P) on the host, the file's dtype
        self.ple_dim, self.pin = model.config.ple_dim, pin  # pin=False: the same steps where no pinning exists
        self.staged_bytes = 0  # the last staging buffer's size

    def __call__(self, ids: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """ids (B, T) on the host -> the table's rows, scaled, (B, T, L*P) on `like`'s device, in its dtype."""
        flat = ids.reshape(-1).to(self.table.device)  # (B*T,)
        staging = torch.empty(flat.shape[0], self.table.shape[1], dtype=self.table.dtype, pin_memory=self.pin)
        torch.index_select(self.table, 0, flat, out=staging)  # (B*T, L*P) looked up straight into pinned memory
        self.staged_bytes = staging.nbytes
        rows = staging.to(like.device, non_blocking=True).to(like.dtype)  # the copy queued, the host goes on
        return rows.view(*ids.shape, -1) * embed_scale(self.ple_dim, like.dtype)
