"""scripts/benchmark.py's `tp` section (scripts/bench/parallel.py) at --tp-small sizes: the ranks give the one
process's tokens, every load is measured, and the fit R + S/N is made of the three loads."""

import json
from pathlib import Path

import pytest

import benchmark


@pytest.mark.parallel
def test_tp_section_small(tmp_path: Path) -> None:
    result = benchmark.main(sections=["tp"], target_dir=tmp_path, assistant_dir=tmp_path, tokens=6, e2b_tokens=4,
                            reps=1, e2b_reps=1, k=2, e2b_dir=tmp_path, threads=1, copy_mib=4, use_transformers=False,
                            tp_ranks=2, tp_small=True, quiet=True)
    t = json.loads(json.dumps(result))["tp"]
    s, m = t["speed"], t["memory"]
    assert s["ranks_equal_one"] is True and s["reps"] == 3 and s["ranks plain"] > 0 and s["one spec"] > 0
    assert set(m["runs"]) == {"1", "2", "4"} and [len(r) for r in m["runs"].values()] == [1, 2, 4]
    assert m["fit_4_gib"] == pytest.approx(m["replicated_gib"] + m["sharded_gib"] / 4)
    assert not (tmp_path / "tp-31b-small").exists()  # deleted after
    assert "== tp: tensor parallelism on gloo" in benchmark.tp_table(result)
