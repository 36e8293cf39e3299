"""Smoke test of scripts/benchmark.py's batch sections (scripts/bench/batch.py) on a tiny pair:
the JSON contract, identical tokens in all four ways of decoding, and the expert counts' bounds.
No timing is asserted."""

import json
from pathlib import Path

import pytest

import benchmark
from bench.batch import EXPERTS, TOP_K, batch_table, uniform_expectation


def test_batch_and_expert_sections(make_pair, tmp_path: Path) -> None:  # noqa: ANN001 (conftest.py)
    target_dir, assistant_dir = make_pair("dense", ordered_embeddings=False, echo=True)  # a MoE-free, dense-head pair
    result = benchmark.main(sections=["batch", "experts"], target_dir=target_dir, assistant_dir=assistant_dir, tokens=5,
                            e2b_tokens=4, reps=1, e2b_reps=1, k=2, e2b_dir=tmp_path, threads=1, copy_mib=4,
                            use_transformers=False)
    result = json.loads(json.dumps(result))  # the --json output is exactly this object
    batch = result["batch"]
    assert set(batch["by_batch"]) == {"1", "2", "4", "8"} and batch["k"] == 2
    for row in batch["by_batch"].values():
        assert row["identical"] is True  # batched and one-by-one, plain and speculative: the same tokens
        assert set(row["tokens_per_s"]) == {"plain_batch", "spec_batch", "plain_sequential", "spec_sequential"}
        assert all(v > 0 for v in row["tokens_per_s"].values())
    experts = {row["case"]: row for row in result["experts"]["rows"]}
    assert experts["1-token decode"]["unique"] == TOP_K  # one token: exactly its k distinct experts
    for row in experts.values():
        assert TOP_K <= row["unique"] <= min(EXPERTS, TOP_K * row["tokens"])
        assert row["uniform"] == pytest.approx(uniform_expectation(row["tokens"]))
    assert experts["batch 8, verify K=4"]["unique"] > experts["verify K=4"]["unique"]  # 40 tokens vs 5
    goals = {g["goal"]: g for g in result["goals"]}
    assert "demo: B=8 speculative batch / one after another" in goals
    assert "== batches on the demo pair" in batch_table(result) and "uniform E" in batch_table(result)
