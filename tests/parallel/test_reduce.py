"""The hazard gemma4/parallel/reduce.py answers: with 3 or more ranks torch.distributed's `all_reduce` may add the
ranks' partials in an order that depends on the tensor's size, so row 0 of a 1-row sum (a decode step) and of a
9-row sum (a verify of K = 8) can differ in the last bits; `exact_sum` gives them the same bits at any N."""

import pytest

from tests.parallel.harness import run_ranks

SEEDS = range(4)


@pytest.mark.parametrize("world", [pytest.param(2, marks=pytest.mark.parallel), 3, 4])
def test_exact_sum_keeps_row_bits_where_all_reduce_does_not(world: int, tmp_path) -> None:
    jobs = [dict(kind="reduce", rows=9, width=4096, seed=s) for s in SEEDS]
    results = run_ranks(world, jobs, tmp_path)
    assert all(r["exact_sum"]["equal"] for r in results), results
    if world >= 3:  # the hazard: some row 0 differs between the 1-row and the 9-row all_reduce
        assert not all(r["all_reduce"]["equal"] for r in results), results
