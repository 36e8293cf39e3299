"""The KV cache grows by doubling: same contents as a preallocated one, capped at its capacity,
for one row written by position and for a batch written by RowSlots (and `keep` after growing)."""

import pytest
import torch

from gemma4.cache import KVCache
from gemma4.config_file import text_config_from_dict
from tests.checkpoints import target_text_config


def config():  # noqa: ANN201
    return text_config_from_dict(target_text_config("e2b").to_dict())


def kv(b: int, t: int, seed: int, d: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, 1, t, d, generator=g), torch.randn(b, 1, t, d, generator=g)  # (B, K, T, D)


def test_grows_by_doubling_to_capacity() -> None:
    c = config()
    grown, full = KVCache(c, 40, reserve=0), KVCache(c, 40)
    sizes = []
    for start, t in [(0, 5), (5, 1), (6, 4), (10, 1), (11, 9), (20, 20)]:  # a prefill, then steps and chunks
        grown.length = full.length = start
        for layer in grown.keys:
            k, v = kv(1, t, start + layer, d=c.head_dims[layer])
            views = zip(grown.write(layer, start, k, v), full.write(layer, start, k, v))
            assert all(torch.equal(a, b) for a, b in views)
        sizes.append(grown.allocated(0))
    assert sizes == [5, 10, 10, 20, 20, 40]  # the write's end, then doubled; never past the capacity
    assert full.allocated(0) == 40
    grown.length = 40
    with pytest.raises(ValueError, match="holds 40 positions"):
        grown.write(0, 40, *kv(1, 1, 0))


def test_rollback_then_rewrite_after_growth() -> None:
    c = config()
    cache = KVCache(c, 64, reserve=4)
    cache.write(0, 0, *kv(1, 6, 1))
    cache.length = 3  # roll back: positions 3.. are stale
    k, v = kv(1, 2, 2)
    keys, values = cache.write(0, 3, k, v)
    assert keys.shape[2] == 5 and torch.equal(keys[:, :, 3:], k) and torch.equal(values[:, :, 3:], v)
    assert torch.equal(keys[:, :, :3], kv(1, 6, 1)[0][:, :, :3])


def test_batch_rows_grow_and_keep() -> None:
    c = config()
    cache = KVCache(c, 32, batch=3, reserve=2)
    cache.length = torch.tensor([0, 0, 0])
    first = kv(3, 4, 3)
    cache.write(0, cache.row_slots(cache.length, 4), *first)
    cache.length = torch.tensor([4, 2, 3])  # rows at different positions
    step = kv(3, 1, 4)
    keys, _ = cache.write(0, cache.row_slots(cache.length, 1), *step)
    assert cache.allocated(0) == 8 and keys.shape[2] == 5  # 2 -> 4 (the prefill's end) -> 8
    for b, p in enumerate([4, 2, 3]):
        assert torch.equal(keys[b, :, p], step[0][b, :, 0])
        assert torch.equal(keys[b, :, :p], first[0][b, :, :p])
    cache.keep([2, 0])
    assert cache.length.tolist() == [3, 4] and torch.equal(cache.keys[0][1, :, :4], first[0][0])
