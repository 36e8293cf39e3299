"""Host reads, counted: every value the host reads back from a tensor is a stall on a GPU (the host waits
for the device to finish everything queued before it). `host_reads()` counts them on any device.

Three counters, each seeing a different part:
- **Tensor methods** (every device): calls of `torch.Tensor.item`, `tolist`, `__int__`, `__bool__`,
  `__float__` and `__index__` (`int(t)`, `if t:`, `float(t)`, `range(t)`, `list[t]`), patched on the class for
  the duration and restored on exit. This is the device-independent count: a CPU run reads the host
  exactly where a CUDA run of the same code would. `.tolist()` is counted here only: on the CPU it reads the
  tensor's memory directly, no ATen operator. A read inside another counted read counts once.
- **Syncing operators** (`profile=True`, torch.profiler, every device): calls of the ATen operators that wait
  for a CUDA device (`SYNCING_OPS`), nested ones included: `aten::_local_scalar_dense`, behind `item`, `int`,
  `bool`, `float` and `__index__` of one element and behind a 0-dim tensor used as an index inside C++
  (which no Python method sees), and `aten::nonzero` (behind a boolean-mask index) and the like, whose
  output size depends on the data. It does not see `tolist` (no operator on the CPU; on CUDA a
  device-to-host copy, `aten::_to_copy`). The profiler makes a decode step of the demo ~20x slower.
- **CUDA synchronisations** (a CUDA `device`): warnings of `torch.cuda.set_sync_debug_mode("warn")`, one
  per synchronising operation: the reads above, `tolist`'s copy, the syncs that read no Python value
  (`nonzero`, a boolean-mask index, `.cpu()`), which the Tensor methods do not see, and every copy that is not
  `non_blocking`, host-to-device ones too (`torch.tensor(ids, device="cuda")`: c10's `memcpy_and_sync`
  waits for the stream). None elsewhere.
  A read of a tensor that lives on the host is no stall: `HostReads.by_device` says which device each
  counted read came from.

Nothing else is changed: the methods, the sync debug mode and the warning filters are put back on exit.
"""

import os
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from gemma4 import Gemma4Model
from gemma4.engine import generate_one
from gemma4.sampling import SamplerConfig
from mtp import DraftLength, Drafter, speculative_one

METHODS = ("item", "tolist", "__int__", "__bool__", "__float__", "__index__")
SYNC_WARNING = "called a synchronizing CUDA operation"
SAMPLED = SamplerConfig(temperature=0.7, top_k=64, top_p=0.95)  # the demo's generation_config at T 0.7
MISSING = object()
# ATen operators that wait for the device on CUDA, whatever the device they are seen on: a scalar read, and the
# operators whose output size depends on the data (a boolean-mask index calls nonzero).
SYNCING_OPS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::equal",
               "aten::is_nonzero", "aten::_unique2", "aten::unique_consecutive")


@dataclass
class HostReads:
    by_method: Counter = field(default_factory=Counter)  # method name -> calls
    by_device: Counter = field(default_factory=Counter)  # the read tensor's device type -> calls
    syncing_ops: Counter | None = None  # profile=True: calls of the ATen operators that synchronise on CUDA
    cuda_syncs: int | None = None  # synchronising CUDA operations (a CUDA device), else None

    @property
    def total(self) -> int:
        return sum(self.by_method.values())


def counting(name: str, original: Callable[..., Any], reads: HostReads, depth: list[int]) -> Callable[..., Any]:
    def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if not depth[0]:
            reads.by_method[name] += 1
            reads.by_device[self.device.type] += 1
        depth[0] += 1
        try:
            return original(self, *args, **kwargs)
        finally:
            depth[0] -= 1
    return read


@contextmanager
def host_reads(profile: bool = False, device: torch.device | str = "cpu") -> Iterator[HostReads]:
    """Count the host reads of the block. `profile`: also count SYNCING_OPS with torch.profiler; a CUDA
    `device`: also count synchronising CUDA operations. The counts are final when the block ends."""
    reads, depth = HostReads(), [0]
    saved = {name: torch.Tensor.__dict__.get(name, MISSING) for name in METHODS}  # MISSING: inherited
    cuda = torch.device(device).type == "cuda"
    prof = None
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as profiler

        os.environ.setdefault("KINETO_LOG_LEVEL", "99")  # the profiler would print its own start/stop lines
        prof = profiler(activities=[ProfilerActivity.CPU])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # every synchronisation, not once per line
        mode = torch.cuda.get_sync_debug_mode() if cuda else None
        for name in METHODS:
            setattr(torch.Tensor, name, counting(name, getattr(torch.Tensor, name), reads, depth))
        try:
            if cuda:
                torch.cuda.set_sync_debug_mode("warn")
            if prof is not None:
                with prof:
                    yield reads
            else:
                yield reads
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode(mode)
            for name, original in saved.items():
                if original is MISSING:
                    delattr(torch.Tensor, name)
                else:
                    setattr(torch.Tensor, name, original)
    if prof is not None:
        reads.syncing_ops = Counter({e.key: e.count for e in prof.key_averages() if e.key in SYNCING_OPS})
    if cuda:
        reads.cuda_syncs = sum(SYNC_WARNING in str(w.message) for w in caught)
    for w in caught:  # the block's own warnings go on as they would have
        if SYNC_WARNING not in str(w.message):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def per_step(target: Gemma4Model, drafter: Drafter, prompt: list[int], tokens: int, k: int,
             device: torch.device | str = "cpu", profile: bool = False) -> dict[str, dict[str, float] | None]:
    """The engine's host reads (gemma4/engine/, mtp/engine/: the loops the commands run; the textbook loops read
    the host as often as is clearest) per plain decode step and per speculative round (K drafts, argmax drafting), greedy and
    sampled (SAMPLED): a run of `tokens` less a run of 1 token (the prefill and the first token, no step or
    round), over the steps (tokens - 1) or the rounds (target forwards - 1) between them, after a first run
    that fills the caches of values computed once. Returns three counts, each keyed plain_step, spec_round,
    sampled_plain_step, sampled_spec_round, sample_drafting_round (`sample` drafting): `host_reads` (the Tensor
    methods), `syncing_ops` (SYNCING_OPS seen by the profiler; None without `profile`: it makes a decode step of
    the demo ~20x slower) and `cuda_syncs` (None off CUDA)."""
    def count(run: Callable[[int], int]) -> dict[str, float | None]:
        """run(n) decodes n tokens and returns its steps or rounds."""
        run(1)  # uncounted: values computed once and cached (model.py's embed_scale reads one)
        with host_reads(profile, device) as first:
            run(1)
        with host_reads(profile, device) as whole:
            steps = run(tokens)
        syncs = None if whole.cuda_syncs is None else (whole.cuda_syncs - first.cuda_syncs) / steps
        ops = None if whole.syncing_ops is None else \
            (sum(whole.syncing_ops.values()) - sum(first.syncing_ops.values())) / steps
        return {"host_reads": (whole.total - first.total) / steps, "syncing_ops": ops, "cuda_syncs": syncs}

    def spec(sampler: SamplerConfig | None, drafting: str = "argmax") -> Callable[[int], int]:
        return lambda n: speculative_one(target, drafter, prompt, n, DraftLength(k), sampler=sampler,
                                         drafting=drafting).stats.target_forwards - 1
    runs = {"plain_step": lambda n: len(generate_one(target, prompt, n)) - 1,
            "spec_round": spec(None),
            "sampled_plain_step": lambda n: len(generate_one(target, prompt, n, SAMPLED)) - 1,
            "sampled_spec_round": spec(SAMPLED),
            "sample_drafting_round": spec(SAMPLED, "sample")}
    counted = {name: count(run) for name, run in runs.items()}
    return {kind: None if counted["plain_step"][kind] is None else {name: c[kind] for name, c in counted.items()}
            for kind in ("host_reads", "syncing_ops", "cuda_syncs")}
