"""scripts/benchmark.py's `peer` section (scripts/bench/peer.py, llama_cpp.py) where llama.cpp is not built: the
suite builds no llama.cpp (20-30 minutes). What runs without it: the skip in one line, the tokenizer llama.cpp's
converter is given, and our side's step timing."""

import json
from pathlib import Path

import torch

import benchmark
from bench.llama_cpp import FIRST_ORDINARY, tokenizer
from bench.peer import E2B_HEAD_TOKENS, head_agreement, our_step, peer_table
from gemma4 import load_target


def test_a_folder_that_is_not_llama_cpp_skips_the_section_in_one_line(pair: tuple[Path, Path], tmp_path: Path,
                                                                       capsys) -> None:  # noqa: ANN001
    result = benchmark.main(sections=["peer"], target_dir=pair[0], assistant_dir=pair[1], tokens=4, e2b_tokens=2,
                            reps=1, e2b_reps=1, k=None, e2b_dir=tmp_path, threads=1, copy_mib=4,
                            use_transformers=False, peer_llama=tmp_path)
    reason = result["peer"]["skipped"]
    assert str(tmp_path) in reason and "--peer-llama" in reason and "\n" not in reason
    assert f"peer: skipped: {reason}" in capsys.readouterr().err
    assert benchmark.printed(result).strip().splitlines()[-1] == f"== peer: skipped: {reason}"
    assert not (tmp_path / "bfloat16-full").exists()  # nothing written for a section that cannot run
    assert peer_table({}) == ""


def test_the_tokenizer_has_what_llama_cpps_converter_checks(tmp_path: Path) -> None:
    """gguf-py's LlamaHfVocab takes a BPE with byte fallback and a Sequence decoder, and llama.cpp's loader wants
    merges; Gemma 4's specials at their ids; exactly the model's vocabulary."""
    tokenizer(1024).save(str(tmp_path / "tokenizer.json"))
    saved = json.loads((tmp_path / "tokenizer.json").read_text())
    assert saved["model"]["type"] == "BPE" and saved["model"]["byte_fallback"] is True
    assert saved["decoder"]["type"] == "Sequence"
    vocab = saved["model"]["vocab"]
    assert len(vocab) == 1024 and sorted(vocab.values()) == list(range(1024))
    assert vocab["<pad>"] == 0 and vocab["<eos>"] == 1 and vocab["<bos>"] == 2 and vocab["<turn|>"] == 106
    assert vocab["<0x00>"] == FIRST_ORDINARY and vocab["<0xFF>"] == FIRST_ORDINARY + 255
    merges = [m.split(" ") if isinstance(m, str) else m for m in saved["model"]["merges"]]
    assert merges and all(left in vocab and right in vocab and left + right in vocab for left, right in merges)


def test_our_step_times_a_forward_in_cpu_and_wall_time(pair: tuple[Path, Path]) -> None:
    target = load_target(pair[0], fast=True)
    for rows in (1, 5):
        seconds = our_step(target, [2, 5, 9, 7], rows, 2)
        assert seconds["cpu"] > 0 and seconds["wall"] > 0
    assert torch.is_grad_enabled()  # timed under inference mode, left as it was


def test_head_agreement_compares_the_two_heads_at_every_position(pair: tuple[Path, Path]) -> None:
    """The int4 head's argmax against the bf16 head's on the same hidden states: a share of every position of
    the prompt and its greedy tokens, 1.0 where the two heads are the same product."""
    target = load_target(pair[0], torch.bfloat16, fast=True, quantize="int4")
    got = head_agreement(target, [2, 5, 9, 7], 6, pair, [2, 11, 13], demo_tokens=20)
    assert got["e2b_random"]["positions"] == 4 + E2B_HEAD_TOKENS and got["demo"]["positions"] == 23
    assert all(0.5 <= g["agreement"] <= 1 for g in got.values())  # the same hidden states: mostly the same argmax
