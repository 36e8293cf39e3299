"""Host reads (scripts/bench/syncs.py): a plain greedy decode step reads the device once (the committed token),
a greedy speculative round at most twice (the drafts once, the verify's argmax once, for every row of a batch).
Every read of a tensor's value is a stall on a GPU; the count is the same on every device, so the CPU test holds
the CUDA loop to it. Sampling is counted as a GPU runs it: with the target's rule `WHOLE_ROWS` (the one the speed layer
gives a model off the CPU, gemma4/fast/sampling.py), where nothing waits for the device but the one read of the
tokens."""

import pytest
import torch

from bench.syncs import METHODS, SAMPLED, host_reads, per_step
from gemma4.engine.forward import forward_rows
from gemma4.fast.sampling import WHOLE_ROWS
from gemma4.engine.sampling import TOKEN_STREAM, sample
from gemma4.engine import decode
from mtp import DraftLength, speculative_generate_batch
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


def test_sampling_reads_once_and_picks_nothing_out_as_on_a_gpu(models, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    with host_reads(profile=True) as picked:
        sample(torch.randn(2, 64, generator=torch.Generator().manual_seed(0)), SAMPLED, TOKEN_STREAM, [5, 6])
    assert picked.syncing_ops["aten::nonzero"] >= 2 and picked.total == 1  # the CPU's rule picks ids out: seen
    target, assistant = models["e2b", "echo"]
    monkeypatch.setattr(target, "sampling", WHOLE_ROWS, raising=False)  # the drafter draws with it too; taken off after
    counts = per_step(target, assistant, prompt("long"), 10, k=4, profile=True)  # the profiler is slow: few tokens
    reads, ops = counts["host_reads"], counts["syncing_ops"]
    # A sampled token is read once (plain), and a sampled round reads no more than a greedy one: the drafts, then
    # every verify row's draw at once (argmax drafting) or every row's test, redraw and bonus at once (sample drafting).
    assert reads["sampled_plain_step"] <= 1
    assert reads["sampled_spec_round"] <= 2 and reads["sample_drafting_round"] <= 2, reads
    # And nothing else waits for the device: no `nonzero`, boolean-mask index or scalar read behind an index.
    assert ops["sampled_plain_step"] == ops["sampled_spec_round"] == ops["sample_drafting_round"] == 0, ops


@pytest.mark.parametrize("sampled", [False, True])
def test_a_batch_round_reads_as_one_row_and_its_clocks_run_after_the_read(models, sampled: bool,  # noqa: ANN001
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Greedy: one read of every row's argmax, before any row's schedule reads its clock (`auto` times the round
    from next() to observe(): a clock read before the device finished would time the launch). Sampled (the target's
    rule `WHOLE_ROWS`): one read a row."""
    target, assistant = models["e2b", "echo"]
    monkeypatch.setattr(target, "sampling", WHOLE_ROWS, raising=False)
    prompts = [prompt("long", seed=s) for s in (1, 2, 3)]
    events: list[tuple[str, int]] = []
    with host_reads() as reads:
        def clock() -> float:
            events.append(("clock", reads.total))
            return float(len(events))

        def spy(*a, **kw):  # noqa: ANN002, ANN003, ANN202
            events.append(("verify", reads.total))
            return forward_rows(*a, **kw)
        monkeypatch.setattr("gemma4.engine.rows.forward_rows", spy)  # the prefill
        monkeypatch.setattr("mtp.engine.rows.forward_rows", spy)  # the verifies
        results = speculative_generate_batch(target, assistant, prompts, 12, DraftLength(2, "auto", clock=clock),
                                             samplers=[SAMPLED] * 3 if sampled else None)
    verifies = [i for i, (kind, _) in enumerate(events) if kind == "verify"][len(prompts):]  # the prefill: a row a run
    rounds = max(r.stats.target_forwards for r in results) - 1
    assert len(verifies) == rounds > 4
    for i in verifies:
        after = next(total for kind, total in events[i + 1:] if kind == "clock")  # the round's first observe()
        assert after > events[i][1], events  # something was read from the device in between
    # The loop's reads (tolist): the drafts once (a round that drafts), then the argmax once for all rows (greedy) or
    # each row's draws once (sampled). Not counted here: a batched forward's cache.claim reads its rows' furthest
    # position and checks for a hole (`int`, `bool`): two reads a forward, whatever the rows.
    most = rounds * (1 + (len(prompts) if sampled else 1))
    assert rounds * (2 if sampled else 1) <= reads.by_method["tolist"] <= most, (reads, rounds)


def test_a_plain_batch_step_reads_every_rows_argmax_at_once(models) -> None:  # noqa: ANN001
    target, _ = models["e2b", "echo"]
    prompts = [prompt("long", seed=s) for s in (1, 2, 3)]
    with host_reads() as reads:
        decode(target, prompts, 8)
    assert reads.by_method["tolist"] == 8  # the prefill's first tokens, then 7 steps: one read each, not one a row
