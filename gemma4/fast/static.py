"""Static-shape steps for `torch.compile`: a cache written at device positions, masks over every slot, and the
decode, verify and draft steps as functions of fixed shapes (gpt-fast's design). The engine loops of
gemma4/engine/decode.py and mtp/engine/rows.py run them unchanged: `StaticTarget` and `StaticDrafter` stand in for the model and the
drafter, and the caller passes a `StaticKVCache` (`cache=`).

Facts a reader must know:
- Every step sees the whole cache: K/V buffers (B, K, S, D) with S = capacity on full layers and the ring's
  W + slack slots on sliding ones (gemma4/engine/ring.py), written with `index_copy_` at the step's positions (mod the
  ring), a (T,) device tensor, never sliced by a Python int. The ring's slot positions are a static buffer too,
  written once per step. The mask hides what a query must not see (keys past its position, and outside the
  window on sliding layers): stale slots and unwritten zeros get weight 0.
- The steps call the model's own embedding, Per-Layer Embeddings, layer stack (`Gemma4Model.stack`) and head
  (fast modules included); only RoPE and the masks are built here, from the device positions.
- A prefill runs in chunks of at most the cache's slack (gemma4/engine/rows.py `prefill`): no step writes more
  positions than the ring can take without losing a key that a query still reads.
- One graph per row count: T = 1 decodes, T = K + 1 verifies; the drafter's step is one graph. A prefill
  (`num_logits` given) runs the same function eagerly: its length changes every call.
- Outside the graph: the PLE table's rows (the table stays in host memory: rows are looked up from the host ids
  and passed in), the cache's bounds checks, moving the positions to the device, choosing tokens.
- The embedding's scale is a Python float made once here (`StaticTarget.embed`): inside a graph, `embed_scale`'s
  `float(tensor)` would end it (Dynamo traces through its lru_cache). The numbers are `Gemma4Model.embed`'s.
- CUDA: `mode="reduce-overhead"` (CUDA graphs). The cache buffers are marked static, so a graph writes them in
  place; a step's outputs live in the graphs' memory until the next replay, so they are cloned out.

Shape legend: B batch (1), T new tokens, S cache capacity, K kv heads, D head dim, E hidden, V vocab,
L layers, P PLE width.
"""

import dataclasses
import warnings
from collections.abc import Collection
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from gemma4.engine.ring import KV, PREFILL_CHUNK, RingCache, Slots, ring_slack
from gemma4.config import FULL, SLIDING, TextConfig
from gemma4.fast.apply import products
from gemma4.fast.experts import gather_experts
from gemma4.fast.kernels import Product
from gemma4.fast.modules import FastHead, FastLinear, StackedAttention, StackedMLP
from gemma4.model import (
    Gemma4Model, LayerInputs, additive_mask, attention_mask, embed_scale, rope_cos_sin, rope_frequencies,
)
from gemma4.moe import Experts
from gemma4.engine.forward import RowsOutput, as_pads
from gemma4.engine.sampling import Sampling, rule_of
from gemma4.sampling import SamplerConfig

if TYPE_CHECKING:  # gemma4 never imports mtp at run time: the drafter is only named here
    from gemma4.weights import Progress
    from mtp.drafter import Drafter

GRAPHS = 64  # graphs one step function may hold: a row count each (Dynamo's own limit is 8)
# Key lengths a step reads are multiples of this: the efficient attention kernel (the only fused one for head size 512)
# may refuse, under inductor, a key length that is not a multiple of 8. The extra slots are never written: the
# masks hide them, as they hide every slot past a query's position.
ALIGN = 64


def aligned(n: int, align: int = ALIGN) -> int:
    return -(-n // align) * align


class StaticKVCache(RingCache):
    """A RingCache whose buffers hold all their slots from the start (every position on full layers, the ring on
    sliding ones), written at device positions. `length` (1,) stays on the host: the loop owns the position and
    rolls back by setting it. Both sizes are rounded up to a multiple of `align` slots (the run's context, where
    the loops stop, is StaticTarget's; align=1 keeps them as given, as the tests of small rings do)."""

    def __init__(self, config: TextConfig, capacity: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", slack: int = ring_slack(PREFILL_CHUNK), align: int = ALIGN) -> None:
        slack = aligned(config.sliding_window + slack, align) - config.sliding_window  # the ring: W + slack slots
        super().__init__(config, aligned(capacity, align), batch=1, dtype=dtype, device=device, slack=slack)
        for buffers in (self.keys, self.values):
            for buffer in buffers.values():
                torch._dynamo.mark_static_address(buffer)  # CUDA graphs write it in place, never copy it in
        torch._dynamo.mark_static_address(self.slot_positions)
        self.full_positions = torch.arange(self.capacity, device=device)[None]  # (1, S): every full slot's position
        self.frontier = 0  # one past the newest position written since the sequence started at 0

    def holds(self, n: int) -> bool:
        """A conversation's reuse rule (mtp/extras/growing.py `GrowingCache.holds`), for a compiled chat's cache."""
        return n == 0 or self.frontier <= max(self.ring, n + self.slack)

    def check(self, start: int, t: int) -> None:
        """RingCache.claim's checks, on the host: a graph cannot raise, and a write past the end is a device fault."""
        if start > int(self.length[0]):
            raise ValueError(f"write at position {start} would leave a hole: only {int(self.length[0])} positions "
                             f"are valid")
        if start + t > self.capacity:
            raise ValueError(f"the static KV cache holds {self.capacity} positions; position {start + t - 1} does "
                             f"not fit")
        if t > self.slack:
            raise ValueError(f"a forward of {t} positions does not fit the sliding layers' slack of {self.slack}: "
                             f"run it in chunks of at most {self.slack}")
        self.frontier = start + t if start == 0 else max(self.frontier, start + t)

    def slots(self, positions: torch.Tensor) -> Slots:
        """A step's slots at device positions (T,): the ring's slot positions recorded, once per step, before any
        layer writes; every slot is read (`key_positions`)."""
        ring = positions % self.ring  # (T,)
        self.slot_positions.index_copy_(1, ring, positions[None])  # (1, R)
        return Slots(None, positions, ring, self.capacity, self.key_positions())  # one row: no row index

    def write(self, layer: int, slots: Slots, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, K, T, D) at the slots' positions (a sliding layer: their ring slots); return the whole
        buffers (B, K, S, D)."""
        where = slots.ring if self.kinds[layer] == SLIDING else slots.positions  # (T,)
        self.keys[layer].index_copy_(2, where, k)
        self.values[layer].index_copy_(2, where, v)
        return self.keys[layer], self.values[layer]

    def read(self, layer: int, end: int) -> KV:
        """The whole buffers (B, K, S, D) and their slots' positions (1, S): the reader's mask hides those >= end."""
        return KV(self.keys[layer], self.values[layer], self.key_positions()[self.kinds[layer]])

    def key_positions(self) -> dict[str, torch.Tensor]:
        """Layer type -> the positions (1, S) of every slot a step reads (`layer_inputs`' keys)."""
        return {FULL: self.full_positions, SLIDING: self.slot_positions}


def static_inputs(c: TextConfig, positions: torch.Tensor, keys: dict[str, torch.Tensor], dtype: torch.dtype,
                  freqs: dict[str, torch.Tensor], shift: int = 0) -> dict[str, LayerInputs]:
    """`layer_inputs` over every slot: RoPE at positions (T,) of the one row, masks (1, 1, T, S) from query and key
    positions alone (keys[type]: (1, S), a full layer's 0..S-1 or a ring's slot positions). shift 1 is the drafter's
    (its query at t sees keys 0..t-1, its sliding layers W_d + 1 of them: mtp §5)."""
    out = {}
    for kind, f in freqs.items():
        window = c.sliding_window + shift if kind == SLIDING else None
        mask = additive_mask(attention_mask(positions[None] - shift, keys[kind], window), dtype)  # (1, 1, T, S)
        cos, sin = rope_cos_sin(positions[None], f, dtype)  # (1, T, 1, D) each
        out[kind] = LayerInputs(cos, sin, mask)
    return out


def frequencies(c: TextConfig, device: torch.device) -> dict[str, torch.Tensor]:
    """Layer type -> RoPE frequencies (D/2,), made once, outside any graph."""
    return {kind: rope_frequencies(c.rope[kind], c.head_dims[c.layer_types.index(kind)], device)
            for kind in dict.fromkeys(c.layer_types)}


def plain_products(model: nn.Module, head: torch.Tensor) -> None:
    """Make every product of a fast model that calls oneDNN (a packed weight; or many rows on an unpacked one) a
    plain `torch.matmul`, from the parameters a packed one was made of (`head`: the tied head's embedding): inductor
    lowers oneDNN's product only on weights it packed itself, and fails on the op given to it. The same numbers,
    summed in another order (gemma4/fast/README.md)."""
    for module in model.modules():
        kinds = ((StackedAttention, "qkv"), (StackedMLP, "gate_up"), (FastLinear, "product"), (FastHead, "product"))
        name = next((attribute for kind, attribute in kinds if isinstance(module, kind)), None)  # GateLinear too
        # int4 products (gemma4/fast/int4.py) are torch's own int4 op, which inductor lowers as it is.
        if name is None or not (getattr(module, name).packed or any(getattr(module, name).onednn)):
            continue
        if isinstance(module, StackedAttention):
            weights = [module.q_proj.weight, module.k_proj.weight] + ([module.v_proj.weight] if module.has_v_proj
                                                                       else [])
        elif isinstance(module, StackedMLP):
            weights = [module.gate_proj.weight, module.up_proj.weight]
        else:
            weights = [module.weight if isinstance(module, FastLinear) else head]
        product = getattr(module, name)
        if product.packed:  # its parameters may still be the file's dtype: cast to the product's
            stacked = torch.cat(weights) if len(weights) > 1 else weights[0]  # (O1 + O2 + .., I)
            setattr(module, name, Product(stacked.to(product.dtype), False, choice=product.choice))
        elif any(product.onednn):  # the same weight (O, I), every row count through torch.matmul
            setattr(module, name, Product(product.weight, False, choice=product.choice))


def prepare_to_compile(model: nn.Module, head: torch.Tensor, rows: int = 0) -> None:
    """Rewrite `model` in place for `torch.compile`, as its caller's explicit step before wrapping it in a
    StaticTarget or StaticDrafter: every oneDNN product plain (`plain_products`; `head`: the tied head's
    embedding) and, with `rows` (the most rows a compiled step takes), MoE experts gathered for that many tokens
    (a graph cannot hold the experts' loop; gemma4/fast/experts.py). The numbers are the same."""
    plain_products(model, head)
    if rows:
        gather_experts(model, rows)


def ready_to_compile(model: nn.Module, rows: int = 0) -> bool:
    """Whether `prepare_to_compile(model, ..., rows)` has nothing left to do."""
    if any(p.packed or any(p.onednn) for p in products(model)):
        return False
    return all(getattr(m, "rows", 0) >= rows for m in model.modules() if isinstance(m, Experts))


def compiled(fn, device: torch.device):  # noqa: ANN001, ANN201 (a function and its compiled form)
    """One graph per input shape, or an error: no graph breaks, no dynamic shapes. CUDA graphs on CUDA."""
    return torch.compile(fn, fullgraph=True, dynamic=False, mode="reduce-overhead" if device.type == "cuda" else None)


def call(step, cudagraphs: bool, *args) -> tuple[torch.Tensor, ...]:  # noqa: ANN001
    """Run a step; with CUDA graphs, start a new replay step and clone its outputs out of the graphs' memory."""
    if cudagraphs:
        torch.compiler.cudagraph_mark_step_begin()
    with torch._dynamo.config.patch(recompile_limit=GRAPHS), warnings.catch_warnings():
        # Dynamo warns that it traces through fast_rms_norm's lru_cache: it makes the eps tensor in the graph, as wanted.
        warnings.filterwarnings("ignore", "Dynamo detected a call to a `functools.lru_cache`", UserWarning)
        out = step(*args)
    return tuple(x.clone() for x in out) if cudagraphs else out


class StaticTarget:
    """The target as the loops and `prefill` use it (`config`, `embed_tokens`, `embed`, `logits`, `run`), run
    through static-shape steps on a `StaticKVCache`. `compiled_rows`: the row counts whose step is compiled
    (1 decodes, K + 1 verifies K drafts); any other count runs the same step eagerly (a prefill, a round the budget
    cuts short), so no compile happens in the middle of a run. `context`: the positions a run may reach, at most
    the model's (`config.max_position_embeddings`, where the loops and a Conversation stop): the cache's capacity."""

    def __init__(self, model: Gemma4Model, compiled_rows: Collection[int] = (), context: int | None = None) -> None:
        c = model.config
        if context is not None:  # what the loops cut at: a static cache's capacity, read whole every step
            c = dataclasses.replace(c, max_position_embeddings=min(context, c.max_position_embeddings))
        self.model, self.config = model, c
        self.embed_tokens, self.logits = model.embed_tokens, model.logits  # the loops read the weight's device, dtype
        w = model.embed_tokens.weight
        self.device, self.dtype = w.device, w.dtype
        self.scale = embed_scale(c.hidden_size, w.dtype)
        self.freqs = frequencies(c, self.device)
        self.compiled_rows = frozenset(compiled_rows)
        self.cudagraphs = bool(compiled_rows) and self.device.type == "cuda"
        if compiled_rows and not ready_to_compile(model, max(compiled_rows)):
            raise ValueError("compiling needs plain products and gathered experts: call "
                             "prepare_to_compile(model, model.embed_tokens.weight, max(compiled_rows)) first")
        self.step = compiled(self.forward, self.device) if compiled_rows else self.forward
        self.inputs: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}  # T -> arange, positions, ids
        self.eager_steps = 0  # decode and verify steps that ran uncompiled: a row count outside compiled_rows

    @property
    def sampling(self) -> Sampling:
        """The model's rule: how the loops draw its tokens."""
        return rule_of(self.model)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (B, T) -> (B, T, E): Gemma4Model.embed, its scale a float made once."""
        return F.embedding(ids, self.embed_tokens.weight) * self.scale

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor | None, cache: StaticKVCache,
                num_logits: int) -> tuple[torch.Tensor, torch.Tensor]:
        """ids (B, T) on the device at positions (T,), the PLE table's rows (looked up outside, in host memory)
        -> logits (B, n, V) of the last n, hidden (B, T, E). gemma4/engine/forward.py's inputs and the model's `stack`, with K/V
        written at `positions` and masks over every slot."""
        m = self.model
        x = self.embed(ids)  # (B, T, E)
        ple = None if rows is None else m.per_layer_inputs(rows, x)  # (B, T, L, P)
        slots = cache.slots(positions)
        inputs = static_inputs(self.config, positions, slots.key_positions, x.dtype, self.freqs)
        hidden, _ = m.stack(x, ple, inputs, cache, slots)  # (B, T, E)
        return m.logits(hidden[:, hidden.shape[1] - num_logits:]), hidden  # (B, n, V)

    def upload(self, ids: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Host ids (1, T) and start -> the step's ids (1, T) and positions start..start+T-1 (T,), written into the
        same device tensors every call of T rows (the positions by one kernel, not a copy from the host)."""
        t = ids.shape[1]
        if t not in self.inputs:
            self.inputs[t] = (torch.arange(t, device=self.device), torch.empty(t, dtype=torch.long, device=self.device),
                              torch.empty(1, t, dtype=torch.long, device=self.device))
        steps, positions, device_ids = self.inputs[t]
        return device_ids.copy_(ids, non_blocking=True), torch.add(steps, start, out=positions)  # no queue wait

    @torch.inference_mode()
    def forward_rows(self, input_ids: torch.Tensor, cache: RingCache, start_pos: torch.Tensor | None = None,
                     num_logits: int | None = None, soft: None = None) -> RowsOutput:
        """gemma4/engine/forward.py `forward_rows` on a StaticKVCache: host ids (1, T) at start_pos[0]..start_pos[0]+T-1 (start_pos (1,) on
        the host; None: 0). `num_logits` None (a decode step or a verify): the step of T rows, compiled if asked;
        given (a prefill): the same step, eager. `source_kv` holds the source layers' whole buffers. Text only."""
        c = self.config
        if not isinstance(cache, StaticKVCache):
            raise ValueError("a static target runs on a StaticKVCache: pass cache=StaticKVCache(...)")
        if input_ids.shape[0] != 1 or soft is not None:
            raise ValueError("a static target runs one row of text")
        t, start_pos = input_ids.shape[1], 0 if start_pos is None else int(start_pos[0])
        cache.check(start_pos, t)
        input_ids = as_pads(input_ids, c.media_token_ids)  # as forward_rows
        rows = self.model.per_layer_rows(input_ids, self.embed_tokens.weight) if c.ple_dim else None  # host lookup
        args = (*self.upload(input_ids, start_pos), rows, cache)
        if num_logits is None and t in self.compiled_rows:
            logits, hidden = call(self.step, self.cudagraphs, *args, t)
        else:
            if num_logits is None and self.compiled_rows:  # a step that could have been compiled: counted
                self.eager_steps += 1
            logits, hidden = self.forward(*args, t if num_logits is None else num_logits)
        kv = {kind: cache.read(c.kv_source(kind), start_pos + t) for kind in self.freqs}
        return RowsOutput(logits, hidden, kv)

    def warm_up(self, cache: StaticKVCache, progress: "Progress | None" = None) -> None:
        """Compile (and, on CUDA, record) the step of each compiled row count now, on cache slots 0..T-1: they are
        stale until the next prefill overwrites them (the cache's length is not moved). `progress`: a wrapper to
        watch the row counts go by (gemma4/weights.py `Progress`)."""
        rows = sorted(self.compiled_rows)
        for t in rows if progress is None else progress(rows, "compiling the steps of 1..K+1 rows", len(rows)):
            for _ in range(3 if self.cudagraphs else 1):  # CUDA graphs record on the third call
                self.forward_rows(torch.zeros(1, t, dtype=torch.long), cache)


class StaticDrafter:
    """The drafter as the speculative loop uses it (`propose`), its greedy step static-shape over the target's whole
    K/V buffers; `compile=True` compiles it. Sampled drafting runs `Drafter.propose` itself on views of keys
    0..t-1 (eager: it warps a full-vocabulary row per draft anyway)."""

    def __init__(self, drafter: "Drafter", compile: bool = False) -> None:
        self.drafter, self.config = drafter, drafter.config
        w = drafter.pre_projection.weight
        self.device = w.device
        self.freqs = frequencies(drafter.config.text, self.device)
        self.cudagraphs = compile and self.device.type == "cuda"
        if compile and not ready_to_compile(drafter):
            raise ValueError("compiling needs plain products: call "
                             "prepare_to_compile(drafter, drafter.model.embed_tokens.weight) first")
        self.step = compiled(self.forward, self.device) if compile else self.forward
        self.inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # position, token, hidden

    def forward(self, target: StaticTarget, token: torch.Tensor, hidden: torch.Tensor, position: torch.Tensor,
                shared_kv: dict[str, KV]) -> tuple[torch.Tensor, torch.Tensor]:
        """One greedy draft step (mtp §4): token (1, 1), hidden (1, 1, E) at position (1,) over the target's buffers
        (1, K, S, D) -> the drafted token (1, 1) and the next hidden (1, 1, E)."""
        keys = {kind: kv.positions for kind, kv in shared_kv.items()}
        inputs = static_inputs(self.config.text, position, keys, hidden.dtype, self.freqs, shift=1)
        pairs = {kind: (kv.keys, kv.values) for kind, kv in shared_kv.items()}
        hn, h = self.drafter.step(target.embed(token), hidden, inputs, pairs)  # (1, 1, U), (1, 1, E)
        return self.drafter.greedy_token(hn[:, 0])[:, None], h

    @torch.inference_mode()
    def propose_rows(self, target: StaticTarget, tokens: list[int], hidden: torch.Tensor, positions: list[int],
                shared_kv: dict[str, KV], k: int, samplers: list[SamplerConfig] | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Drafter.propose of one row on the target's whole buffers (`target_kv` of a StaticKVCache): the mask hides
        keys >= positions[0]. hidden (1, E) -> drafts (1, k) on the device, and q (sampled drafting) or None."""
        if samplers is not None:  # the same whole buffers: their positions mask them
            from mtp.engine.drafts import propose_rows  # gemma4 imports mtp only where it runs the drafter
            return propose_rows(self.drafter, target, tokens, hidden, positions, shared_kv, k, samplers)
        if self.inputs is None:  # the same device tensors every round: (1,), (1, 1), (1, 1, E)
            self.inputs = (torch.empty(1, dtype=torch.long, device=self.device),
                           torch.empty(1, 1, dtype=torch.long, device=self.device),
                           torch.empty(1, 1, hidden.shape[-1], dtype=hidden.dtype, device=self.device))
        position, ids, h = self.inputs[0].fill_(positions[0]), self.inputs[1].fill_(tokens[0]), self.inputs[2].copy_(hidden[:, None])
        drafted = []  # on the device: the caller reads them once
        for _ in range(k):
            ids, h = call(self.step, self.cudagraphs, target, ids, h, position, shared_kv)
            drafted.append(ids)
        return torch.cat(drafted, dim=1), None  # (1, k)

    def warm_up(self, target: StaticTarget, cache: StaticKVCache) -> None:
        """Compile (and record) the draft step now, reading slot 0 of the cache."""
        c = target.config
        kv = {kind: cache.read(c.kv_source(kind), 1) for kind in (SLIDING, FULL)}
        hidden = torch.zeros(1, c.hidden_size, dtype=target.dtype, device=target.device)
        self.propose_rows(target, [0], hidden, [1], kv, 3 if self.cudagraphs else 1)
