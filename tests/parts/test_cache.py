"""The KV cache by itself (gemma4/engine/ring.py), on the E2B-like config (sliding window 8): `claim` once per forward,
`write` per layer, `read` what a reader attends to. Full layers keep every position, sliding layers a ring of
W + slack slots, each slot knowing the position it holds; the conversation's growing cache (mtp/extras/growing.py)
grows full layers by doubling up to the capacity and sliding layers the same way up to the ring. Rolling back and rewriting, rows at different positions and `keep`, slot positions after the
ring wraps, the growing cache's `holds` (mtp/extras/growing.py), and `cache_bytes` against what a cache allocates. The
models on this cache: tests/equivalence/test_window.py.
"""

import pytest
import torch

from gemma4.engine.ring import EMPTY, RingCache
from gemma4.extras.memory import cache_bytes
from gemma4.config import FULL, SLIDING
from gemma4.config_file import text_config_from_dict
from gemma4.engine.rows import keep
from mtp.extras.growing import GrowingCache
from tests.checkpoints import SHAPES, target_text_config


def config(shape: str = "e2b"):  # noqa: ANN201
    return text_config_from_dict(target_text_config(shape).to_dict())


C = config()
W = C.sliding_window  # 8
FULL_LAYER, SLIDING_LAYER = C.layer_types.index(FULL), C.layer_types.index(SLIDING)


def kv(b: int, t: int, seed: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random K and V (B, K, T, D) of one layer's shape."""
    g = torch.Generator().manual_seed(seed)
    shape = (b, C.kv_heads[layer], t, C.head_dims[layer])
    return torch.randn(shape, generator=g), torch.randn(shape, generator=g)


def growing(capacity: int, slack: int) -> GrowingCache:
    return GrowingCache(C, capacity, dtype=torch.float32, device="cpu", slack=slack)


def at(n: int) -> torch.Tensor:
    """One row's start or length: a (1,) host tensor."""
    return torch.tensor([n])


def forward(cache: RingCache, start: int | torch.Tensor, t: int, seed: int) -> dict[int, tuple]:
    """What one model forward does to the cache: claim once, write every layer; returns layer -> (k, v, views)."""
    slots = cache.claim(at(start) if isinstance(start, int) else start, t)
    b = cache.keys[0].shape[0]
    out = {}
    for layer in cache.keys:
        k, v = kv(b, t, seed + 100 * layer, layer)
        out[layer] = (k, v, cache.write(layer, slots, k, v))
    return out


def test_grows_by_doubling_to_capacity_and_to_the_ring() -> None:
    """A cache that starts empty holds what a preallocated one holds after every write; full layers double up to the
    capacity, sliding layers up to their ring; a forward past the capacity or past the slack is refused."""
    grown, full = growing(40, slack=8), RingCache(C, 40, slack=8)
    assert grown.ring == full.ring == W + 8 and grown.keys[FULL_LAYER].shape[2] == grown.keys[SLIDING_LAYER].shape[2] == 0
    sizes = []
    for start, t in [(0, 5), (5, 1), (6, 4), (10, 1), (11, 8), (19, 8), (27, 8), (35, 5)]:  # prefill chunks, steps
        grown.length, full.length = at(start), at(start)
        a, b = forward(grown, start, t, start), forward(full, start, t, start)
        for layer in grown.keys:
            assert all(torch.equal(x, y) for x, y in zip(a[layer][2], b[layer][2]))
        sizes.append((grown.keys[FULL_LAYER].shape[2], grown.keys[SLIDING_LAYER].shape[2]))
    # the write's end, then doubled; never past the capacity (40) or the ring (16)
    assert [s[0] for s in sizes] == [5, 10, 10, 20, 20, 40, 40, 40]
    assert [s[1] for s in sizes] == [5, 10, 10, 16, 16, 16, 16, 16]
    assert full.keys[FULL_LAYER].shape[2] == 40 and full.keys[SLIDING_LAYER].shape[2] == 16
    grown.length = at(40)
    with pytest.raises(ValueError, match="holds 40 positions"):
        grown.claim(at(40), 1)
    grown.length = at(20)
    with pytest.raises(ValueError, match="slack of 8"):
        grown.claim(at(20), 9)
    with pytest.raises(ValueError, match="hole"):
        grown.claim(at(21), 1)


def test_rollback_then_rewrite() -> None:
    """Lowering the length and writing again: the new K/V replace the stale ones, the older ones stay, in a full
    layer and in a sliding layer's ring after it wrapped (the stale slots past the length keep their positions,
    which the mask hides)."""
    cache = RingCache(C, 64, slack=8)
    first = forward(cache, 0, 6, 1)
    cache.length = at(3)  # roll back: positions 3..5 are stale
    again = forward(cache, 3, 2, 2)
    keys, values = again[FULL_LAYER][2]
    k, v = again[FULL_LAYER][:2]
    assert keys.shape[2] == 5 and torch.equal(keys[:, :, 3:], k) and torch.equal(values[:, :, 3:], v)
    assert torch.equal(keys[:, :, :3], first[FULL_LAYER][0][:, :, :3])

    ring = cache.ring  # 16: positions 16..23 wrap onto slots 0..7
    cache.length = at(5)
    forward(cache, 5, 8, 3)
    cache.length = at(13)
    forward(cache, 13, 8, 4)  # positions 13..20: slots 13, 14, 15, 0..4
    cache.length = at(17)  # keep 0..16; 17..20 are stale
    new = forward(cache, 17, 2, 5)  # positions 17, 18: slots 1, 2
    keys, values = new[SLIDING_LAYER][2]
    assert keys.shape[2] == ring and torch.equal(keys[:, :, 1:3], new[SLIDING_LAYER][0])
    assert torch.equal(values[:, :, 1:3], new[SLIDING_LAYER][1])
    assert cache.slot_positions[0].tolist() == [16, 17, 18, 19, 20] + list(range(5, 16))
    assert cache.read(SLIDING_LAYER, 19).positions.tolist() == cache.slot_positions.tolist()  # (1, R)


def test_batch_rows_at_different_positions_and_keep() -> None:
    """Rows write at their own positions (a (B,) start) in one claim; each row's ring slots record its own
    positions; `keep` drops and reorders rows, slot positions and lengths with them."""
    cache = RingCache(C, 32, batch=3, slack=4)  # ring 12
    cache.length = torch.tensor([0, 0, 0])
    first = forward(cache, cache.length, 4, 3)
    cache.length = torch.tensor([4, 2, 3])  # rows at different positions
    step = forward(cache, cache.length, 1, 4)
    keys, _ = step[FULL_LAYER][2]
    assert cache.keys[FULL_LAYER].shape[2] == 32 and keys.shape[2] == 5  # every slot made; views of 0..max end
    for b, p in enumerate([4, 2, 3]):
        assert torch.equal(keys[b, :, p], step[FULL_LAYER][0][b, :, 0])
        assert torch.equal(keys[b, :, :p], first[FULL_LAYER][0][b, :, :p])
    assert cache.slot_positions[:, :5].tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 3, EMPTY], [0, 1, 2, 3, EMPTY]]
    for _ in range(3):  # every row crosses the ring (12) at its own step
        cache.length = cache.length + 4
        forward(cache, cache.length, 4, 5)
    assert cache.slot_positions.tolist() == [[12 + s if s < 8 else s for s in range(12)],
                                             [12 + s if s < 6 else s for s in range(12)],
                                             [12 + s if s < 7 else s for s in range(12)]]
    assert cache.read(SLIDING_LAYER, 20).positions.shape == (3, 12)  # per row, once the length is per row
    sliding = cache.keys[SLIDING_LAYER].clone()
    keep(cache, [2, 0])
    assert cache.length.tolist() == [15, 16]
    assert torch.equal(cache.keys[SLIDING_LAYER], sliding[[2, 0]])
    assert torch.equal(cache.keys[FULL_LAYER][1, :, :4], first[FULL_LAYER][0][0])
    assert cache.slot_positions.tolist()[0] == [12 + s if s < 7 else s for s in range(12)]


@pytest.mark.parametrize("grows", [False, True], ids=["kvcache", "growing"])
@pytest.mark.parametrize("chunks", [(7,) * 5, (5,) * 7 + (2,), (1,) * 30 + (7, 7)])
def test_slot_positions_after_a_wrap(chunks: tuple[int, ...], grows: bool) -> None:
    """After positions 0..n-1 are written (any chunking), slot s holds the newest p < n with p = s mod ring, and a
    slot never written is EMPTY; a sliding read returns the slots in use with those positions, a full read 0..n-1;
    the growing cache's frontier is n."""
    cache = growing(64, slack=7) if grows else RingCache(C, 64, slack=7)  # ring 15
    start = 0
    for n in chunks:
        written = forward(cache, start, n, start)
        start += n
        cache.length = at(start)
        assert cache.slot_positions[0].tolist() == [max([p for p in range(start) if p % cache.ring == s], default=EMPTY)
                                                     for s in range(cache.ring)]
        kv_sliding = cache.read(SLIDING_LAYER, start)
        assert kv_sliding.positions.tolist() == cache.slot_positions[:, :min(start, cache.ring)].tolist()
        assert kv_sliding.keys.shape[2] == min(start, cache.ring) and torch.equal(cache.read(FULL_LAYER, start).positions,
                                                                                     torch.arange(start)[None])
        newest = torch.tensor(range(start - n, start)) % cache.ring  # the slots this write went to
        assert torch.equal(cache.keys[SLIDING_LAYER][:, :, newest], written[SLIDING_LAYER][0])
    assert start > 2 * cache.ring and (not grows or cache.frontier == start)


def test_holds() -> None:
    """`holds(n)`: before the ring wraps every length may be lowered; after, only to n with frontier <= n + slack
    (stale writes past n + slack would have overwritten keys a query at n reads); the frontier never falls on a
    rollback, and starts again with a write at position 0."""
    cache = growing(64, slack=4)  # ring 12
    assert cache.holds(0) and cache.holds(30)
    for start in range(0, 12, 4):
        cache.length = at(start)
        cache.claim(at(start), 4)
    assert cache.frontier == cache.ring == 12 and all(cache.holds(n) for n in range(13))
    cache.length = at(12)
    cache.claim(at(12), 4)  # wraps: positions 12..15 take the slots of 0..3
    cache.length = at(13)
    assert cache.frontier == 16 and [n for n in range(17) if cache.holds(n)] == [0] + list(range(12, 17))
    cache.length = at(5)  # a rollback does not lower the frontier
    cache.claim(at(5), 1)
    assert cache.frontier == 16 and not cache.holds(6)
    cache.length = at(0)
    cache.claim(at(0), 3)  # the sequence starts again
    assert cache.frontier == 3 and cache.holds(1)


@pytest.mark.parametrize("shape", SHAPES)
def test_cache_bytes_is_what_a_full_cache_allocates(shape: str) -> None:
    c = config(shape)
    for positions, slack, batch, dtype in [(5, 4, 1, torch.float32), (40, 4, 2, torch.bfloat16),
                                           (40, 64, 1, torch.float16), (200, 512, 3, torch.float32)]:
        cache = RingCache(c, positions, batch=batch, dtype=dtype, slack=slack)
        allocated = sum(b[i].nbytes for b in (cache.keys, cache.values) for i in cache.keys)
        assert cache_bytes(c, positions, slack, batch, dtype) == allocated, (positions, slack)
    # slack >= positions: every layer keeps every position
    every = sum(2 * c.kv_heads[i] * 40 * c.head_dims[i] * 4 for i in range(c.first_shared_layer))
    assert cache_bytes(c, 40, 40, 1, torch.float32) == every > cache_bytes(c, 40, 4, 1, torch.float32)
