"""Smoke test of scripts/benchmark.py: every section's code path on tiny checkpoints, the JSON contract,
and that all four decoders produce the same tokens. No timing is asserted: times are the machine's."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import benchmark
from bench import device, timing
from tests.tolerance import RATIO
from bench.random_pair import assistant_config, target_config
from cli.threads import SMALL_HIDDEN
from gemma4 import load_target

PAIR_KEYS = {"target", "assistant", "prompt_tokens", "new_tokens", "reps", "k", "transformers", "methods", "ratios",
             "identical", "aten_calls_per_decode_step", "packing"}


def tiny_e2b_like(vocab: int) -> tuple[dict, dict]:
    """Stands in for the real E2B dimensions: KV sharing, PLE, double-wide MLP, a centroid head."""
    target = target_config(512, layers=7, hidden=32, intermediate=64, heads=2, kv_heads=1, head_dim=16, window=8,
                           shared=2, ple_dim=8, double_wide=True)
    return target, assistant_config(target, hidden=16, intermediate=32, heads=2, num_centroids=16, top_k=4)


def tiny_bench() -> tuple[dict, dict]:
    return tiny_e2b_like(512)


def test_every_section(pair: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(benchmark, "e2b_configs", tiny_e2b_like)
    monkeypatch.setattr(benchmark, "bench_configs", tiny_bench)
    result = benchmark.main(sections=list(benchmark.SECTIONS), target_dir=pair[0], assistant_dir=pair[1], tokens=6,
                            e2b_tokens=4, reps=1, e2b_reps=1, k=None, e2b_dir=tmp_path, threads=1, copy_mib=4,
                            use_transformers=True)
    result = json.loads(json.dumps(result))  # the --json output is exactly this object
    for section in ("demo", "bench", "e2b"):
        r = result[section]
        assert PAIR_KEYS <= set(r), section
        unpacked = {"ours_plain_pack_false"} if section != "e2b" else set()  # a second E2B would not fit
        assert set(r["methods"]) == {"ours_plain", "ours_spec", "tf_plain", "tf_assisted"} | unpacked
        assert ("ours_plain/ours_plain_pack_false" in r["ratios"]) == bool(unpacked)
        packing = r["packing"]
        assert packing["load_s"] > 0 and (packing["load_s_pack_false"] is not None) == bool(unpacked)
        assert packing["target"] and all(set(c) >= {"shape", "dtype", "packed", "kernels", "why"}
                                         for c in packing["target"] + packing["assistant"])
        assert r["identical"] is True, section
        assert r["k"] == 4  # the assistant's num_assistant_tokens
        assert all(m["tokens_per_s"] > 0 for m in r["methods"].values())
        assert 0 <= r["methods"]["ours_spec"]["acceptance_rate"] <= 1
        assert 0 <= r["methods"]["tf_assisted"]["acceptance_rate"] <= 1
        assert {"ours_plain/tf_plain", "ours_spec/tf_assisted"} <= set(r["ratios"])
        calls = r["aten_calls_per_decode_step"]
        assert set(calls) == {"ours", "ours_draft_step", "tf"} and min(calls.values()) > 0
        assert ("host_reads" in r) == (section == "demo")  # scripts/bench/syncs.py, the demo section only
    reads = result["demo"]["host_reads"]
    assert set(reads) == {"plain_step", "spec_round", "sampled_plain_step", "sampled_spec_round",
                          "sample_drafting_round"}
    assert reads["plain_step"] <= 1 and reads["spec_round"] <= 2  # tests/speed/test_syncs.py holds these on every shape
    assert "skipped" not in result  # on the CPU every section runs
    costs = result["costs"]
    assert set(costs["verify_over_decode"]) == {str(k) for k in range(1, benchmark.MAX_K + 1)}  # JSON keys
    assert set(costs["implied_speedup"]) == {"0.5", "0.7", "0.9"}
    assert 0 < costs["draft_step_over_decode"]
    band = result["bandwidth"]
    assert band["copy_bytes_per_s"] > 0 and 0 < band["fraction_decode_step"]
    assert band["ours_plain_tokens_per_s"] == result["e2b"]["methods"]["ours_plain"]["tokens_per_s"]
    tf_plain = result["e2b"]["methods"]["tf_plain"]["tokens_per_s"]
    assert band["ceiling_over_tf_plain"] == pytest.approx(band["bound_tokens_per_s"] / tf_plain)
    plain = band["linear_bytes_per_s_by_rows"]["plain"]  # the tiny weights are too small to be packed
    assert set(plain) == {"1", "2", "5", "9"}  # JSON keys
    assert band["linear_rows_slowdown"]["plain"]["1"] == 1.0 and all(v > 0 for v in plain.values())
    assert band["dtype"] == "float32" and band["fraction_best_decode_step"] >= band["fraction_decode_step"]
    assert band["read_bytes_per_s"] > 0 and band["fraction_paired"] > 0
    bf16 = result["bf16"]
    assert bf16["bandwidth"]["dtype"] == "bfloat16" and bf16["bandwidth"]["bytes_per_token"] < band["bytes_per_token"]
    assert set(bf16["costs"]["verify_over_decode"]) == {str(k) for k in range(1, benchmark.MAX_K + 1)}
    model = load_target(tmp_path / "float32" / "target")  # what the e2b sections ran on
    ple = model.embed_tokens_per_layer.weight  # (V, L*P): one row is read per token, not the table
    everything = sum(p.numel() * p.element_size() for p in model.parameters())
    assert band["bytes_per_token"] == everything - (ple.shape[0] - 1) * ple.shape[1] * ple.element_size()
    assert result["memory"]["dtype"] == "bfloat16" and result["memory_float32"]["dtype"] == "float32"
    for memory in (result["memory"], result["memory_float32"], result["memory_float32_file"]):
        assert memory["load_peak_over_text"] >= 0 and memory["text_weights_mib"] > 0
    # the same weights in float32, but the PLE table stays in its file's dtype: bfloat16 in one of them
    assert result["memory_float32"]["text_weights_mib"] < result["memory_float32_file"]["text_weights_mib"]
    schedule = result["schedule"]  # plain and auto run twice a repetition (ABBA); each repetition is their mean
    for name in ("demo", "random"):
        r = schedule[name]
        assert list(r["tokens_per_s"]) == ["plain", "auto", *(f"K={n}" for n in range(1, 9)), "heuristic"]
        assert [len(s) for s in r["seconds"].values()] == [schedule["reps"]] * 2 and r["identical"] is True
    goals = {g["goal"]: g for g in result["goals"]}
    assert goals["demo: identical tokens (1 = yes)"]["met"] is True
    assert all({"goal", "value", "limit", "at_least", "met"} <= set(g) for g in goals.values())
    assert {"e2b bf16: decode / memory-bandwidth bound", "e2b: implied speedup at acceptance 0.7, best K",
            "first-forward peak / weights as loaded (bf16)", "demo: ATen calls per decode step of the target",
            "bench: plain decode, fast / fast=False", "demo: plain decode, fast / fast=False"} <= set(goals)
    # --threads 1 (threads=1): every section on one thread, each pair section's methods too, as recorded
    assert result["threads"] == dict.fromkeys(benchmark.SECTIONS, 1)
    assert all(result[section]["threads"] == 1 for section in ("demo", "bench", "e2b"))
    printed = benchmark.printed(result)
    assert "torch threads: " + ", ".join(f"{name} 1" for name in benchmark.SECTIONS) in printed
    assert printed.count("timed reps, 1 torch thread;") == 3  # the demo, bench and e2b headers
    # The goals come last, for developers: a row per goal of the result, in its order, with its name, the measured
    # value and the target it is compared with; no verdict in the table (`met` is in the JSON only).
    head, block, rows = printed.rpartition("\n== for developers: ")
    assert head and block and not re.search(r"\bmet\b", printed)
    rows = rows.splitlines()[2:]
    assert len(rows) == len(result["goals"])
    for row, g in zip(rows, result["goals"]):
        measured = "n/a" if g["value"] is None else f"{g['value']:.4g}"
        assert row.strip().startswith(g["goal"] + " "), row
        assert row.rstrip().endswith(f" {measured}  {'>=' if g['at_least'] else '<='} {g['limit']:g}"), row
    assert all(f"{c['shape'][0]}x{c['shape'][1]}" in printed for c in result["demo"]["packing"]["target"])


def tiny_wide() -> tuple[dict, dict]:
    """A tiny pair whose target is as wide as the one thread rule's threshold: a release-sized section's stand-in."""
    target = target_config(512, layers=2, hidden=SMALL_HIDDEN, intermediate=64, heads=2, kv_heads=1, head_dim=16,
                           window=8, shared=0, ple_dim=0, double_wide=False)
    return target, assistant_config(target, hidden=16, intermediate=32, heads=2, num_centroids=16, top_k=4)


def test_threads_by_section_without_transformers(pair: tuple[Path, Path], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Without --threads, each section runs on the threads of the one thread rule (scripts/cli/threads.py) for the
    model it measures: the demo pair on one, a target as wide as the threshold on torch's default (2 here, as a
    2-core machine's), every method of a section alike; said as each section starts, recorded and printed. The run
    says what it writes before writing it, and torch's threads come back as they were."""
    monkeypatch.setattr(benchmark, "bench_configs", tiny_wide)
    monkeypatch.setattr(timing, "TORCH_THREADS", 2)
    plan = benchmark.checkpoints(["demo", "bench"], tmp_path)
    assert list(plan) == [tmp_path / "bench"]
    note = benchmark.disk_note(plan, tmp_path)
    assert note is not None and f"writes {benchmark.plan_bytes(plan) / 1e9:.1f} GB" in note
    result = benchmark.main(sections=["demo", "bench"], target_dir=pair[0], assistant_dir=pair[1], tokens=5,
                            e2b_tokens=4, reps=1, e2b_reps=1, k=2, e2b_dir=tmp_path, copy_mib=4, use_transformers=False)
    assert torch.get_num_threads() == 1  # tests/conftest.py's, given back
    assert result["threads"] == {"demo": 1, "bench": 2}
    assert result["demo"]["threads"] == 1 and result["bench"]["threads"] == 2  # read inside every timed run
    said = capsys.readouterr().err.splitlines()
    assert said.index(note) < min(i for i, line in enumerate(said) if line.startswith("bench:"))
    assert any(line.startswith("demo: ") and line.endswith("(1 torch thread)") for line in said)
    assert any(line.startswith("bench: ") and line.endswith("(2 torch threads)") for line in said)
    assert benchmark.disk_note(plan, tmp_path) is None  # written: a later run reuses it and says nothing
    printed = benchmark.printed(result)
    assert "torch threads: demo 1, bench 2 (scripts/cli/threads.py's rule" in printed
    assert "timed reps, 1 torch thread;" in printed and "timed reps, 2 torch threads;" in printed
    demo = result["demo"]
    assert set(demo["methods"]) == {"ours_plain", "ours_spec", "ours_plain_pack_false"} and demo["identical"] is True
    assert demo["transformers"].startswith("skipped") and demo["k"] == 2
    assert set(demo["aten_calls_per_decode_step"]) == {"ours", "ours_draft_step"}
    assert "n/a" in printed


def test_progress(pair: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                  capsys: pytest.CaptureFixture[str]) -> None:
    """On a terminal, bars on stderr: the bytes of each checkpoint written, and each section's timed runs, named
    after the section; none under --json (quiet), where the plain line of each section is still said."""
    monkeypatch.setattr(benchmark, "bench_configs", tiny_bench)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # capsys's stderr, standing in for a terminal
    for quiet, sections in ((False, ["bench", "experts"]), (True, ["experts"])):  # quiet: the cheaper section
        benchmark.main(sections=sections, target_dir=pair[0], assistant_dir=pair[1], tokens=3,
                       e2b_tokens=4, reps=1, e2b_reps=1, k=2, e2b_dir=tmp_path / str(quiet), threads=1, copy_mib=4,
                       use_transformers=False, quiet=quiet)
        err = capsys.readouterr().err
        bars = ("bench: writing bench/target", "bench: writing bench/assistant", "bench: timing, 3 runs x 1 reps",
                "experts: forwards counted")
        assert [bar in err for bar in bars] == [not quiet and bar.split(":")[0] in sections for bar in bars], err
        assert ("%|" in err) == (not quiet)
        assert ("\nbench: the random mid-size pair under" in "\n" + err) == ("bench" in sections)
        assert "\nexperts: unique experts" in "\n" + err


def test_json_is_alone_on_stdout() -> None:
    """--json: stdout is the JSON object alone; what the run says goes to stderr."""
    out = subprocess.run([sys.executable, str(Path(benchmark.__file__)), "--only", "experts", "--json"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["threads"] == {"experts": 1} and result["experts"]["rows"]
    assert "\nexperts: unique experts per MoE layer" in "\n" + out.stderr and "(1 torch thread)" in out.stderr


def test_help_shows_the_defaults() -> None:
    out = subprocess.run([sys.executable, str(Path(benchmark.__file__)), "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    assert "(default: 64)" in out.stdout and "(default: 7)" in out.stdout and "bench" in out.stdout
    # --device-dir states what the device section writes: its four pairs' bytes, computed as the code writes them
    pairs = [device.e2b_configs(device.FULL_VOCAB)] + [configs(device.FULL_VOCAB, False) for configs in (
        device.l31b_configs, device.l26b_configs, device.l12b_configs)]
    total = sum(device.pair_bytes(*pair, torch.bfloat16) for pair in pairs)
    words = " ".join(out.stdout.split())
    assert f"its four random bfloat16 pairs once (≈ {total / 1e9:.1f} GB" in words
    # A run of every section: what it writes under --e2b-dir, said in the description, --e2b-dir's help, the
    # docstring and benchmark.md's first paragraph
    every = [(benchmark.bench_configs(), torch.float32), (benchmark.e2b_configs(benchmark.E2B_VOCAB), torch.float32),
             (benchmark.e2b_configs(benchmark.E2B_VOCAB), torch.bfloat16),
             (benchmark.e2b_configs(benchmark.FULL_VOCAB), torch.bfloat16)]
    gb = round(sum(device.pair_bytes(*configs, dtype) for configs, dtype in every) / 1e9)
    assert gb == round(benchmark.plan_bytes(benchmark.checkpoints(benchmark.SECTIONS, Path("anywhere"))) / 1e9)
    assert f"A run of every section (no --only) writes ≈ {gb} GB of random checkpoints once, under --e2b-dir" in words
    assert f"≈ {gb} GB for a run of every section" in words
    assert f"writes about {gb} GB of random checkpoints once, under `--e2b-dir`" in " ".join(benchmark.__doc__.split())
    first = (Path(benchmark.__file__).parent / "benchmark.md").read_text().split("\n\n")[1]
    assert f"about {gb} GB" in first and "--e2b-dir" in first
    # --threads points to the rule rather than restating it
    assert "scripts/cli/threads.py" in words.partition("--threads THREADS")[2]


DEVICE_CHECKS = {"load", "rows", "decode", "costs", "syncs", "equal"}


def test_device_section_small_on_the_cpu(tmp_path: Path) -> None:
    """The device section (scripts/bench/device.py) at --device-small sizes: every check runs and records its
    figures, none an error; float32 speculative decoding equals plain, greedy and keyed sampling."""
    result = benchmark.main(sections=["device"], target_dir=tmp_path, assistant_dir=tmp_path, tokens=8, e2b_tokens=4,
                            reps=2, e2b_reps=1, k=None, e2b_dir=tmp_path, threads=1, copy_mib=4,
                            use_transformers=True, device="cpu", device_dir=tmp_path / "device", device_small=True,
                            out_dir=tmp_path / "out")
    d = json.loads(json.dumps(result))["device"]
    assert json.loads((tmp_path / "out" / "device.json").read_text()) == d  # --out: the last write is the whole
    assert d["small"] is True and d["vocab"] == 512 and d["written_under"] == str(tmp_path / "device" / "small")
    assert d["copy"]["bytes_per_s"] > 0 and d["keyed_bits"]["equal"] is True and d["keyed_bits"]["cases"] == 36
    pairs = ("e2b", "31b_layers", "26b_layers", "12b_layers")
    assert set(d["seconds"]) == {"copy", "keyed_bits", "attention", *pairs, *(f"write_{name}" for name in pairs)}
    attention = d["attention"]  # every call shape timed by the default and by each backend that takes it
    assert len([c for c in attention.values() if isinstance(c, dict)]) == 8
    assert all(isinstance(c["default"], float) and isinstance(c["math"], float) for c in attention.values()
               if isinstance(c, dict))
    e2b = d["e2b"]  # the rounds at full acceptance, cuDNN's switch, and generate.py end to end
    assert e2b["full_acceptance"]["acceptance_rate"] == 1.0
    assert e2b["full_acceptance"]["identical"] is True and set(e2b["full_acceptance"]["over_plain"]) == {
        f"K={k}" for k in range(1, 9)}
    assert e2b["cudnn"]["identical_off"] is True and e2b["cudnn"]["identical_on"] is True
    assert e2b["generate"]["identical"] is True and e2b["generate"]["eager_rounds"] is None, e2b["generate"]
    # Quantized at load: the int4 kernel errs, against the same weights in float32, as the textbook's bf16 layers
    # do (within tests/tolerance.py's ratio); their bf16 tokens part at near ties (a random pair has many).
    int4 = e2b["int4"]
    assert "error" not in int4 and "int4" in int4["kernels"] and int4["speculative_equal_plain"] is True, int4
    assert int4["error_over_textbook_error"] <= RATIO, int4
    tp1 = e2b["tp1"]  # one rank through the tensor-parallel path: the one-process tokens, every o/down reduced
    assert tp1["greedy_equal_one_process"] is True and tp1["speculative_equal_plain"] is True, tp1
    assert tp1["reduced_modules"] > 0 and tp1["step_tokens_per_s"]["tp1"] > 0, tp1
    for name in pairs:
        p = d[name]
        assert DEVICE_CHECKS | {"seconds"} <= set(p) and not any("error" in p[c] for c in DEVICE_CHECKS), p
        assert p["equal"]["greedy"] is True and p["equal"]["sampled"] is True and p["equal"]["tokens"] == 8
        assert p["load"]["after_load"] is None  # CUDA memory: none on the CPU
        # The speed layer's rows on this device (the CPU here): a verify's row i has the decode step's bits.
        assert all(p["rows"][f"k{k}"]["equal"] for k in (1, 4, 8)) and p["rows"]["plans"], p["rows"]
        decode = p["decode"]
        assert decode["bound_tokens_per_s"] == pytest.approx(d["copy"]["bytes_per_s"] / decode["bytes_per_step"])
        assert 0 < decode["eager"]["fraction_step"] and decode["compiled"]["step_tokens_per_s"] is None
        assert set(p["costs"]["verify_over_decode"]) == {str(k) for k in range(1, benchmark.MAX_K + 1)}
        reads = p["syncs"]["host_reads"]
        moe_layers = 4 if name == "26b_layers" else 0  # on the CPU the experts' loop reads once a MoE layer
        assert reads["plain_step"] <= 1 + moe_layers and p["syncs"]["cuda_syncs"] is None
        # A verify's tokens go through the experts' loop one by one on the CPU (gemma4/fast/experts.py
        # `TokenExperts`, for the decode step's bits): a read per token of the verify, per MoE layer.
        assert reads["spec_round"] <= 2 + moe_layers * (benchmark.MAX_K + 1)
    experts = d["26b_layers"]["experts"]  # gathered on the device, as a GPU loads it, against the loop
    assert experts["gathered"]["host_reads"]["plain_step"] <= 1 and experts["gathered_modules"] == 0  # CPU: the loop
    assert experts["loop"]["host_reads"]["plain_step"] == 1 + 4
    assert experts["gathered_over_loop"]["decode_s"] > 0 and experts["gathered_over_loop"]["verify_s"] > 0
    assert not any("experts" in d[name] for name in ("e2b", "31b_layers", "12b_layers"))
    parity = d["e2b"]["parity"]  # transformers is installed wherever the tests run
    assert parity["argmax_agree"] == 1.0 and parity["max_abs_logit_diff"] <= parity["ours_vs_f32"]
    assert "parity" not in d["31b_layers"]
    target = load_target(tmp_path / "device" / "small" / "31b_layers" / "target")
    assert target.config.attention_k_eq_v and target.config.kv_heads == (2, 2, 2, 1)  # 31B's geometry, tiny
    printed = benchmark.device_table(result)
    assert "== device: cpu" in printed and "ERROR" not in printed and "speculative == plain greedy True" in printed


def test_device_section_leaves_out_pairs_that_do_not_fit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Free space is checked before any pair is written: with room for the e2b pair alone (and the 1 GiB spare),
    the other three are left out, said, and the checks run on the e2b pair."""
    e2b = device.pair_bytes(*device.small_e2b_configs(512), torch.bfloat16)
    usage = type(shutil.disk_usage(tmp_path))
    monkeypatch.setattr(device.shutil, "disk_usage", lambda path: usage(10**12, 10**12 - e2b, 2**30 + e2b + 1))
    said: list[str] = []
    d = device.device_section("cpu", tmp_path / "device", True, 4, 1, 4, False, said.append)
    assert d["pairs_left_out"] == ["12b_layers", "26b_layers", "31b_layers"] and "e2b" in d
    assert not any(name in d for name in d["pairs_left_out"]) and not d["e2b"].get("error")
    assert any("left out" in line for line in said)


def test_out_keeps_every_finished_check(tmp_path: Path) -> None:
    """--out writes after every check: a pair cut off by an error keeps the checks it finished, and the error."""
    result: dict = {}
    save = device.saver(result, tmp_path)
    device.attempt(result, "copy", lambda: {"bytes_per_s": 1.0}, save)
    assert json.loads((tmp_path / "device.json").read_text())["copy"] == {"bytes_per_s": 1.0}
    result["e2b"] = {}

    def pair() -> dict:
        device.attempt(result["e2b"], "load", lambda: {"seconds": 2.0}, save)
        raise RuntimeError("cut off")
    device.attempt(result, "e2b", pair, save)
    saved = json.loads((tmp_path / "device.json").read_text())
    assert saved["e2b"]["load"] == {"seconds": 2.0} and saved["e2b"]["error"] == "RuntimeError: cut off"
    assert not (tmp_path / "device.json.part").exists()


def test_context_section_small(pair: tuple[Path, Path], tmp_path: Path) -> None:
    """The context section (scripts/bench/context.py) at --context-small sizes: the cache bytes split into full
    layers (every position) and sliding rings (flat past W + slack), a measured prefill on each geometry in both
    ways, and decoding after long prompts in which speculative decoding gives the plain tokens."""
    result = benchmark.main(sections=["context"], target_dir=pair[0], assistant_dir=pair[1], tokens=6, e2b_tokens=4,
                            reps=1, e2b_reps=1, k=None, e2b_dir=tmp_path, threads=1, copy_mib=4,
                            use_transformers=False, context_small=True)
    c = json.loads(json.dumps(result))["context"]
    cache = c["cache_bytes"]
    assert set(cache["families"]) == {"E2B", "E4B", "12B", "26B-A4B", "31B"} and cache["slack"] == 512
    for name, f in cache["families"].items():
        full, ring = f["full_bytes_per_position"], f["sliding_bytes_per_slot"]
        for key, n in f["lengths"].items():
            assert f["before"][key] == (full + ring) * n, (name, key)
            assert f["after"][key] == full * n + ring * min(n, f["ring_slots"]) <= f["before"][key], (name, key)
        assert f["after"]["128k"] - f["after"]["32k"] == full * (131072 - 32768)  # the rings stay flat
    big = cache["families"]["31B"]  # 10 full layers of 4 kv heads of 512, 50 sliding of 16 kv heads of 256: K and V
    assert (big["full_bytes_per_position"], big["sliding_bytes_per_slot"], big["ring_slots"]) == (81920, 819200, 1536)
    assert big["lengths"]["max"] == 262144 and cache["families"]["E2B"]["lengths"]["max"] == 131072
    rss = c["prefill_rss"]
    assert set(rss["geometries"]) == {"e2b", "31b"}
    for name, g in rss["geometries"].items():
        for n, run in g["runs"].items():
            after, before = run["after"], run["before"]  # before: every position, after: a ring of 8 + 64
            assert after["cache_bytes"] < before["cache_bytes"], (name, n)
            assert len(after["tokens"]) == len(before["tokens"]) == rss["new_tokens"]
            assert after["loaded_rss_bytes"] > 0 and after["seconds"] > 0
    assert rss["goal"]["short"] < rss["goal"]["long"] and rss["goal"]["growth_bytes"]["before"] is not None
    decode = c["decode"]
    assert set(decode["contexts"]) == {"100", "300"} and decode["trained_context"] is not None
    for x in decode["contexts"].values():
        assert x["identical"] is True and x["speedup"] > 0 and 0 <= x["acceptance_rate"] <= 1
    goal = next(g for g in result["goals"] if g["goal"].startswith("context: 31b prefill peak"))
    assert goal["limit"] == 0.6 and goal["at_least"] is False
    printed = benchmark.context_table(result)
    assert "== context: K/V cache bytes" in printed and "236.223 / 22.733" in printed  # 31B at 262144 positions


def test_decode_bytes_reads_the_routed_experts_only(models) -> None:  # noqa: ANN001
    """The bound's bytes a step: a MoE layer reads the top-k experts the token is routed to, not all of them."""
    from bench.memory import decode_bytes
    target = models["moe", "echo"][0]
    c = target.config
    every = sum(p.numel() * p.element_size() for p in target.parameters())
    experts = sum(p.numel() * p.element_size() for layer in target.layers if layer.moe
                  for p in (layer.experts.gate_up_proj, layer.experts.down_proj))
    assert 0 < c.top_k_experts < c.num_experts and experts
    assert decode_bytes(target) == every - experts * (c.num_experts - c.top_k_experts) // c.num_experts


def test_audio_section_small(tmp_path: Path) -> None:
    """The audio section (scripts/bench/audio.py) at --audio-small sizes on a 2 s clip: 25 soft tokens a second of
    audio, both dtypes timed and their figures consistent, one encode's peak memory measured in a fresh process."""
    from bench import audio
    result = benchmark.main(sections=["audio"], target_dir=tmp_path, assistant_dir=tmp_path, tokens=4, e2b_tokens=4,
                            reps=1, e2b_reps=1, k=None, e2b_dir=tmp_path, threads=1, copy_mib=4,
                            use_transformers=False, audio_seconds=2, audio_reps=1, audio_small=True)
    a = json.loads(json.dumps(result))["audio"]
    assert "audio" in benchmark.ON_REQUEST and "audio" not in benchmark.SECTIONS  # only when named
    assert a["soft_tokens"] == 50 and a["soft_tokens_per_audio_s"] == 25 and a["clip_seconds"] == 2
    assert a["geometry"] == "small" and a["features_s"] > 0 and a["reps"] == 1
    assert set(a["dtypes"]) == {"bfloat16", "float32"} and set(a["memory"]) == {"bfloat16", "float32"}
    for name, r in a["dtypes"].items():
        assert r["vectors"] == [50, a["config"]["text_hidden_size"]] and r["finite"] is True, name
        assert r["encode_s"] == pytest.approx(a["features_s"] + r["tower_s"]) and r["tower_s"] > 0
        assert r["audio_s_per_s"] == pytest.approx(2 / r["encode_s"])
        assert r["soft_tokens_per_s"] == pytest.approx(50 / r["encode_s"])
        m = a["memory"][name]
        assert m["soft_tokens"] == 50 and m["weights_mib"] * 2**20 == r["weights_bytes"] and m["encode_peak_mib"] >= 0
    assert a["dtypes"]["float32"]["weights_bytes"] == 2 * a["dtypes"]["bfloat16"]["weights_bytes"]
    real = audio.geometry(small=False)  # E2B's: the values gemma4/audio/tower.py's docstring counts
    assert sum(torch.Size(s).numel() for s in audio.weight_table(real).values()) == 304_825_088
    assert (real.hidden_size, real.num_layers, real.output_proj_dims, real.text_hidden_size) == (1024, 12, 1536, 1536)
    printed = benchmark.audio_table(result)
    assert "== audio: the small audio tower" in printed and "soft tokens 50 (25 a second of audio)" in printed
    with pytest.raises(ValueError, match="audio-seconds"):
        audio.audio_section(31, 1, True, 1)  # more than the tower reads


def test_int4_section_small(pair: tuple[Path, Path], tmp_path: Path) -> None:
    """The int4 section (scripts/bench/int4.py) at --int4-small sizes, its 31B part included: the int4 file is
    read by the int4 kernel, a step's int4 bytes are fewer than the bf16 model's, float32 speculative decoding on
    the demo target quantized at load gives the plain tokens, and both 31B-geometry loads decode."""
    result = benchmark.main(sections=["int4"], target_dir=pair[0], assistant_dir=pair[1], tokens=6, e2b_tokens=4,
                            reps=1, e2b_reps=1, k=None, e2b_dir=tmp_path, threads=1, copy_mib=4,
                            use_transformers=True, int4_small=True, int4_31b=True, int4_31b_tokens=2)
    i = json.loads(json.dumps(result))["int4"]
    e = i["e2b"]
    assert e["int4_kernels"] == ["int4"] and e["int4"]["tokens_per_s"] > 0 and e["tf_tokens_per_s"] > 0
    assert 0 < e["int4_bound"]["int4_bytes"] and e["int4_bound"]["bytes_per_step"] < e["bf16_bound"]["bytes_per_step"]
    assert e["transformers"].startswith("5.22.2") and e["ours_tf_common_prefix"] >= 1
    for dtype in ("float32", "bfloat16"):
        d = i["demo"][dtype]
        assert "int4" in d["int4_kernels"] and d["int4"]["acceptance_rate"] >= 0  # narrow layers: "dequantize"
    assert i["demo"]["float32"]["int4"]["identical"] is True and i["demo"]["float32"]["float"]["identical"] is True
    runs = i["31b"]["runs"]
    assert set(runs) == {"textbook", "fast"} and not (tmp_path / "31b-int4-small").exists()  # deleted after
    for name, run in runs.items():
        assert run["stopped"] is None and len(run["tokens"]) == 2 and run["after_load"]["VmRSS"] > 0, (name, run)
    assert runs["fast"]["int4_product_bytes"] > 0 == runs["textbook"]["int4_product_bytes"]
    goals = {g["goal"] for g in result["goals"] if g["goal"].startswith("int4:")}
    assert len(goals) == 5
    printed = benchmark.int4_table(result)
    assert "== int4: w4a16 targets" in printed and "31B geometry" in printed
