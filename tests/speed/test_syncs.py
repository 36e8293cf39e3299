"""Host reads (scripts/bench/syncs.py): a plain greedy decode step reads the device once (the committed token),
a greedy speculative round at most twice (the drafts once, the verify's argmax once). Every read of a tensor's
value is a stall on a GPU; the count is the same on every device, so the CPU test holds the CUDA loop to it."""

import pytest
import torch

from bench.syncs import METHODS, host_reads, per_step
from tests.pairs import DRAFTERS, prompt
from tests.checkpoints import SHAPES

TOKENS = 24


# The MoE shape is counted in tests/speed/test_gathered_experts.py, with the experts a model gets off the CPU: the eager
# CPU model's loop (gemma4/moe.py) asks the host for its experts in every MoE layer, where a read costs nothing.
@pytest.mark.parametrize("shape", [s for s in SHAPES if s != "moe"])
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_reads_per_step_and_round(models: dict, shape: str, drafter: str) -> None:
    target, assistant = models[shape, drafter]
    reads = per_step(target, assistant, prompt("long"), TOKENS, k=4)["host_reads"]
    assert reads["plain_step"] <= 1
    assert reads["spec_round"] <= 2
    # Keyed sampling (T 0.7, top-k 64, top-p 0.95) reads its token once a step, like greedy. A round reads the
    # drafts once and then one token per verify row it draws (up to the first mismatch), so its count,
    # 1 + (accepted + 1), is not held to 2 here.
    assert reads["sampled_plain_step"] <= 1


def test_counts_each_method_and_restores_them() -> None:
    x = torch.tensor([1.5, 2.0])
    with host_reads() as reads:
        x[0].item(), int(x[1]), x.tolist(), bool(x[0]), float(x[0]), [7, 8, 9][torch.tensor(1)]
        f"{x[0]}"  # Tensor.__format__ reads through .item(): one read
    assert reads.by_method == {"item": 2, "tolist": 1, "__int__": 1, "__bool__": 1, "__float__": 1, "__index__": 1}
    assert reads.by_device == {"cpu": 7} and reads.total == 7
    assert not any(name in torch.Tensor.__dict__ for name in METHODS)  # inherited again, as before
    with pytest.raises(RuntimeError), host_reads():
        raise RuntimeError("inside the block")
    assert not any(name in torch.Tensor.__dict__ for name in METHODS)


def test_the_profiler_sees_scalar_reads_but_not_tolist() -> None:
    x = torch.tensor([1.5, 2.0])
    with host_reads(profile=True) as reads:
        int(x[1]), x.tolist(), x[x > 1.6]  # a boolean-mask index: nonzero, a sync on CUDA
    assert reads.total == 2 and reads.syncing_ops["aten::_local_scalar_dense"] == 1
    assert reads.syncing_ops["aten::nonzero"] == 1 and reads.cuda_syncs is None
