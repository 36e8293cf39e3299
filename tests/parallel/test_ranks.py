"""Tensor parallelism on gloo (gemma4/parallel/): N processes, each loading only its part of a tiny pair, give
the tokens one process gives. Every family, N = 2, 3 and 4 (12 query heads, widths that 12 divides):
- float32: speculative == plain, greedy and keyed sampling; a speculative batch's rows == their solo runs;
- float64: greedy tokens == the one-process model's, logits within 1e-12 (the split sums in another order).
The suite runs two of these (N = 3, and N = 2 on an int4 file); the rest are marked `parallel` and run by
    python -m pytest -q -n 2 -m parallel tests/parallel
"""

from pathlib import Path

import pytest
import torch

from tests.parallel.harness import run_ranks
from tests.checkpoints import write_assistant
from tests.parallel.pairs import PROMPTS, tp_pair
from tests.parallel.ranks import run

NEW = 16
IN_SUITE = {("e2b", 3)}  # with the int4 file at N = 2 below (and tests/parallel/test_reduce.py at N = 4)
CASES = [pytest.param(family, world, marks=() if (family, world) in IN_SUITE else pytest.mark.parallel,
                      id=f"{family}-N{world}")
         for family in ("e2b", "12b", "moe", "dense") for world in (2, 3, 4)]


def jobs(target: Path, assistant: Path) -> list[dict]:
    common = dict(target=str(target), assistant=str(assistant), fast=True, prompts=PROMPTS, new_tokens=NEW)
    return [common | dict(dtype="float32", runs=["plain", "spec", "sampled", "spec_sampled", "batch", "parts"]),
            common | dict(dtype="float64", runs=["plain", "logits"], prompts=PROMPTS[:1])]


def check(target: Path, assistant: Path, world: int, tmp: Path) -> None:
    work = jobs(target, assistant)
    f32, f64 = run_ranks(world, work, tmp)
    assert f32["spec"] == f32["plain"], "speculative != plain greedy"
    assert f32["spec_sampled"] == f32["sampled"], "speculative != plain keyed sampling"
    assert f32["batch"] == f32["spec"], "a batch row != its solo run"
    assert all(len(t) == NEW for t in f32["plain"])
    whole = run(dict(work[0], runs=["parts"]), None)["parts"]  # each rank holds 1/N of every split weight
    assert f32["parts"].keys() == whole.keys() and whole
    for name, shape in whole.items():
        cut = 0 if name.rsplit(".", 2)[-2] in ("q_proj", "gate_proj") else 1  # by output, or by input
        assert f32["parts"][name][cut] * world == shape[cut] and f32["parts"][name][1 - cut] == shape[1 - cut], name
    one = run(work[1], None)  # the one-process model, float64
    assert f64["plain"] == one["plain"]
    assert torch.allclose(torch.tensor(f64["logits"]), torch.tensor(one["logits"]), rtol=0, atol=1e-12)


@pytest.mark.parametrize(("family", "world"), CASES)
def test_ranks_give_the_one_process_tokens(family: str, world: int, tmp_path_factory: pytest.TempPathFactory) -> None:
    check(*tp_pair(family, tmp_path_factory), world, tmp_path_factory.mktemp(f"tp-{family}-{world}"))


@pytest.mark.parametrize("world", [2, pytest.param(3, marks=pytest.mark.parallel)])
def test_an_int4_file_is_split_by_packed_rows_and_groups(world: int, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The w4a16 layout (tests/int4_checkpoints.py): each rank reads its rows of q/gate/up's packed words and
    scales, and its whole groups of 32 inputs of o/down's."""
    check(*tp_pair("e2b", tmp_path_factory, int4=True), world, tmp_path_factory.mktemp(f"tp-int4-{world}"))


@pytest.mark.parallel
def test_a_drafter_the_ranks_cannot_split_runs_whole_on_each(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The E2B-like pair with a drafter of 2 query heads at N = 4: the drafter is replicated (its target's one kv
    head is whole on every rank), and speculative == plain == the one-process model, greedy and sampled."""
    target, _ = tp_pair("e2b", tmp_path_factory)
    root = tmp_path_factory.mktemp("tp-narrow-drafter")
    assistant = write_assistant(root / "assistant", target, ordered_embeddings=True, echo=True, heads=2,
                                intermediate=96)
    job = dict(target=str(target), assistant=str(assistant), fast=True, prompts=PROMPTS, new_tokens=NEW,
               dtype="float32", runs=["plain", "spec", "sampled", "spec_sampled"])
    [ranks] = run_ranks(4, [job], root)
    one = run(job, None)
    assert ranks["spec"] == ranks["plain"] == one["plain"] == one["spec"]
    assert ranks["spec_sampled"] == ranks["sampled"] == one["sampled"]
