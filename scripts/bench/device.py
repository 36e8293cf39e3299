"""scripts/benchmark.py's `device` section: one run that checks an accelerator end to end.

    python scripts/benchmark.py --only device --device cuda --json > out.json
    python scripts/benchmark.py --only device --device-small --json             # the same checks, tiny, on a CPU

Four random pairs (random_pair.py), written once under `--device-dir` (/dev/shm, or the temp directory when
/dev/shm lacks the room) in bfloat16 with the full 262,144-token vocabulary:
- `e2b`: E2B's dimensions (random_pair.e2b_configs): PLE, KV sharing, the centroid head;
- `31b_layers`: 4 layers of 31B's (gemma4/README.md §16, mtp/README.md §1): hidden 5376, 32 query heads,
  16 kv heads of 256 on the sliding layers and 4 of 512 on the full one, K=V full layers, MLP 21,504,
  window 1024, no PLE or KV sharing; its assistant 1024 wide (MLP 8192, 32 heads) with a dense head.
- `26b_layers`: 4 layers of 26B-A4B's: hidden 2816, 16 query heads, 8 kv heads of 256 sliding and 2 of 512
  full, K=V, dense MLP 2112 beside 128 experts of width 704, top 8; its assistant as 31B's.
- `12b_layers`: 4 layers of the 12B's as a `gemma4_unified_text` file: hidden 3840, 16 query heads, 8 kv heads of
  256 sliding and 1 of 512 full, K=V full layers, MLP 15,360, window 1024, no PLE, MoE or KV sharing; its
  assistant (`gemma4_unified_assistant`) as 31B's.
`--device-small` shrinks them (vocabulary 512, widths 16-64) and the copy, so a CPU runs it in seconds.

Every check is recorded on its own: one that raises records {"error": "Type: message"} and the rest run on.
Device-wide: `copy` (bandwidth of a device-memory copy, read + written, best of the reps) and `keyed_bits`
(gemma4.sampling.keyed_bits on the device == on the CPU, int64 bit for bit). Per pair, on its bfloat16 load
unless stated: `load` (seconds; CUDA memory allocated after loading, its peak while loading and in a first
forward), `rows` (the speed layer's rows with the same bits: the row plans measured at load, and whether a
verify of K + 1 rows gives each row the decode step's logits bits, K = 1, 4, 8), `decode` (a decode step at a fixed position on the device's clock, and greedy_generate, tokens/s
and their fraction of the bound `copy` bandwidth / `decode_bytes`; `compiled`: torch.compile of target.run,
tried only with --device-compile), `costs` (costs.cost_section: (K+1)-token verify / decode for K = 1..8,
draft step / decode), `syncs` (syncs.per_step: host reads and, on CUDA, synchronisations per step and per
round), `equal` (float32 load: speculative == plain greedy, and argmax-drafted keyed sampling == plain
sampling, tokens `==`), on `e2b` `parity` (the first forward's logits against transformers' in
bfloat16, and both against ours in float32) and `int4` (the target quantized at load: the speed layer's int4
kernels against the textbook's int4 layers, logits and greedy tokens, speculative == plain on it, and its decode
step against the bf16 one's) and `tp1` (tensor parallelism on one rank: the pair loaded as a rank of a
torchrun loads it, its tokens and decode step against the one-process pair's), and on `26b_layers` `experts`
(a decode step and a verify of K + 1 rows with the experts gathered on the device, as the loaders give a GPU, against the loop that asks the host for
them, gemma4/fast/experts.py: which one the device should run). `compiled` (with --device-compile) runs the
static-shape decode step of `--compile` (gemma4/fast/static.py; CUDA graphs on CUDA) and records its warm-up.
"""

import gc
import json
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bench.attention import attention_check
from bench.costs import cost_section
from bench.memory import decode_bytes
from bench.random_pair import assistant_config, e2b_configs, pair_bytes, random_prompt, target_config, write_pair
from bench.syncs import SAMPLED, per_step
from bench.timing import Clock, device_of, interleaved, prefilled
from gemma4 import greedy_generate, load_target, sample_generate
from gemma4.fast.apply import choose_attention, kernels_of
from gemma4.fast.experts import GatheredExperts, gather_experts
from gemma4.fast.modules import adopt
from gemma4.fast.static import StaticKVCache, StaticTarget, prepare_to_compile
from gemma4.moe import Experts
from gemma4.parallel import Reduced, Shard
from gemma4.engine.sampling import ACCEPT_STREAM, DRAFT_STREAM, TOKEN_STREAM, exponential_noise, keyed_bits
from mtp import DraftLength, load_drafter, speculative_generate
from gemma4.engine import generate_one
from gemma4.engine.forward import forward_rows
from gemma4.engine.ring import RingCache
from mtp.engine import speculative_one
from mtp.engine.drafts import drafter_inputs, pairs, propose_rows, ring_kv

FULL_VOCAB = 262144
DEVICE_DIR = Path("/dev/shm/gemma4-mtp-device")
BF16, F32 = torch.bfloat16, torch.float32
K = 4  # drafts per round in the equality and sync checks
SEEDS = (0, 1, 2**63 - 1)
POSITIONS = (0, 1, 12_345, 2**31 + 7)


def l31b_configs(vocab: int, small: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """4 layers (sliding x3, full) of 31B's target and its assistant; tiny widths when `small`."""
    if small:
        dims = dict(hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16, window=8)
        full_kv, drafter = 1, dict(hidden=32, intermediate=64, heads=4)
    else:
        dims = dict(hidden=5376, intermediate=21504, heads=32, kv_heads=16, head_dim=256, window=1024)
        full_kv, drafter = 4, dict(hidden=1024, intermediate=8192, heads=32)
    k_eq_v = {"attention_k_eq_v": True, "num_global_key_value_heads": full_kv}  # values: the raw key rows
    target = target_config(vocab, layers=4, shared=0, ple_dim=0, double_wide=False, **dims) | k_eq_v
    target["max_position_embeddings"] = 262_144
    assistant = assistant_config(target, num_centroids=1, top_k=1, **drafter)
    assistant["use_ordered_embeddings"] = False  # 26B/31B assistants: a dense head
    assistant["text_config"] |= k_eq_v  # its full layer reads the target's 4 kv heads of 512
    return target, assistant


def l26b_configs(vocab: int, small: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """4 layers (sliding x3, full) of 26B-A4B's target, its MoE block included, and an assistant like 31B's."""
    if small:
        dims = dict(hidden=64, intermediate=96, heads=4, kv_heads=2, head_dim=16, window=8)
        full_kv, moe, drafter = 1, dict(num_experts=16, top_k_experts=4, moe_intermediate_size=32), \
            dict(hidden=32, intermediate=64, heads=4)
    else:
        dims = dict(hidden=2816, intermediate=2112, heads=16, kv_heads=8, head_dim=256, window=1024)
        full_kv, moe, drafter = 2, dict(num_experts=128, top_k_experts=8, moe_intermediate_size=704), \
            dict(hidden=1024, intermediate=8192, heads=32)
    k_eq_v = {"attention_k_eq_v": True, "num_global_key_value_heads": full_kv}
    target = target_config(vocab, layers=4, shared=0, ple_dim=0, double_wide=False, **dims) | k_eq_v
    target |= {"enable_moe_block": True, "max_position_embeddings": 262_144} | moe
    assistant = assistant_config(target, num_centroids=1, top_k=1, **drafter)
    assistant["use_ordered_embeddings"] = False
    assistant["text_config"] |= k_eq_v
    return target, assistant


def l12b_configs(vocab: int, small: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """4 layers (sliding x3, full) of the 12B's target as a `gemma4_unified_text` file, and an assistant like 31B's."""
    if small:
        dims = dict(hidden=64, intermediate=96, heads=4, kv_heads=2, head_dim=16, window=8)
        drafter = dict(hidden=32, intermediate=64, heads=4)
    else:  # as released (gemma4/README.md §16)
        dims = dict(hidden=3840, intermediate=15360, heads=16, kv_heads=8, head_dim=256, window=1024)
        drafter = dict(hidden=1024, intermediate=8192, heads=32)
    k_eq_v = {"attention_k_eq_v": True, "num_global_key_value_heads": 1}  # one kv head of 512 on full layers
    target = target_config(vocab, layers=4, shared=0, ple_dim=0, double_wide=False, **dims) | k_eq_v
    for key in ("hidden_size_per_layer_input", "vocab_size_per_layer_input", "enable_moe_block"):
        del target[key]  # the unified text model has no such fields
    target |= {"architectures": ["Gemma4UnifiedForCausalLM"], "model_type": "gemma4_unified_text",
               "max_position_embeddings": 262_144}
    assistant = assistant_config(target | {"hidden_size_per_layer_input": 0}, num_centroids=1, top_k=1, **drafter)
    assistant |= {"architectures": ["Gemma4UnifiedAssistantForCausalLM"], "model_type": "gemma4_unified_assistant",
                  "use_ordered_embeddings": False}
    for key in ("hidden_size_per_layer_input", "vocab_size_per_layer_input"):
        del assistant["text_config"][key]
    assistant["text_config"]["model_type"] = "gemma4_unified_text"
    assistant["text_config"] |= k_eq_v
    return target, assistant


def small_e2b_configs(vocab: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """E2B's structure (KV sharing, PLE, double-wide MLP, centroid head) at tiny widths."""
    target = target_config(vocab, layers=7, hidden=32, intermediate=64, heads=2, kv_heads=1, head_dim=16, window=8,
                           shared=2, ple_dim=8, double_wide=True)
    return target, assistant_config(target, hidden=16, intermediate=32, heads=2, num_centroids=16, top_k=4)


def error_text(e: Exception) -> str:
    """Its type and the first line of its message (the traceback goes to stderr)."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:300] if lines else ''}"


def one_rank(device: torch.device) -> bool:
    """A process group of one rank for the `tp1` check, unless one is running; True when this started it."""
    if dist.is_initialized():
        return False
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0,
                            world_size=1, device_id=device if device.type == "cuda" else None)
    return True


def attempt(out: dict[str, Any], name: str, check: Callable[[], Any], save: Callable[[], None] | None = None) -> None:
    """out[name] = check(), or {"error": ...} if it raised (added to what a check filled in place, if it did): one
    failed check never stops the others. The seconds each check took go to out["seconds"], to size the run.
    `save` (--out) is called after every check, so a run cut off keeps every finished one."""
    start = time.perf_counter()
    try:
        out[name] = check()
    except Exception as e:  # noqa: BLE001 (any failure is a finding to record, not a reason to stop)
        partial = out.get(name)
        out[name] = (partial if isinstance(partial, dict) else {}) | {"error": error_text(e)}
        traceback.print_exc()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # an out-of-memory error leaves its blocks cached
    out.setdefault("seconds", {})[name] = time.perf_counter() - start
    if save is not None:
        save()


def saver(result: dict[str, Any], out_dir: Path | None) -> Callable[[], None] | None:
    """--out DIR: write `result` to DIR/device.json, whole, by a rename (a reader never sees half a file)."""
    if out_dir is None:
        return None
    out_dir.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        part = out_dir / "device.json.part"
        part.write_text(json.dumps(result, indent=1, default=str))
        part.replace(out_dir / "device.json")
    return save


def memory(device: torch.device) -> dict[str, int] | None:
    if device.type != "cuda":
        return None
    return {"allocated": torch.cuda.memory_allocated(device), "peak": torch.cuda.max_memory_allocated(device)}


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


# ---------------------------------------------------------------- device-wide checks


def copy_check(device: torch.device, mib: int, reps: int, clock: Clock) -> dict[str, Any]:
    src = torch.ones(mib * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    s, _ = interleaved({"copy": lambda: dst.copy_(src)}, reps, {"copy": lambda: dst.copy_(src)}, clock)
    return {"mib": mib, "reps": reps, "bytes_per_s": 2 * src.nbytes / min(s["copy"]),
            "median_bytes_per_s": 2 * src.nbytes / sorted(s["copy"])[len(s["copy"]) // 2]}


def keyed_bits_check(device: torch.device, vocab: int) -> dict[str, Any]:
    """The 64 noise bits of every token at a few (seed, stream, position), on the device and on the CPU."""
    ids = torch.arange(vocab)
    cases = [(seed, stream, n) for seed in SEEDS for stream in (TOKEN_STREAM, DRAFT_STREAM, ACCEPT_STREAM)
             for n in POSITIONS]
    equal = [torch.equal(keyed_bits(*c, ids.to(device)).cpu(), keyed_bits(*c, ids)) for c in cases]
    noise = max(float((exponential_noise(*c, ids.to(device)).cpu() / exponential_noise(*c, ids) - 1).abs().max())
                for c in cases[:3])  # -log u in the device's float64: may differ in the last bits
    return {"cases": len(cases), "ids": vocab, "equal": all(equal), "unequal_cases": [c for c, e in zip(cases, equal)
                                                                                    if not e],
            "noise_max_rel_diff": noise}


# ---------------------------------------------------------------- per pair


class AlwaysRight:
    """A drafter that is always right: it runs the real drafter's step (so a round costs what it costs) and proposes
    the plain greedy continuation instead, known beforehand. Real round timing at full acceptance."""

    def __init__(self, drafter: Any, sequence: list[int]) -> None:
        self.drafter, self.config, self.sequence = drafter, drafter.config, sequence  # prompt + plain continuation

    def propose_rows(self, target: Any, tokens: list[int], hidden: torch.Tensor, positions: list[int], shared_kv: Any,
                     k: int, samplers: Any = None) -> tuple[torch.Tensor, None]:
        drafts, _ = propose_rows(self.drafter, target, tokens, hidden, positions, shared_kv, k)  # (B, k), the cost
        right = [self.sequence[p + 1:p + 1 + k] for p in positions]  # the tokens at positions n+1..n+k
        right = [r + [0] * (k - len(r)) for r in right]  # past the known run: anything (the budget ends first)
        return torch.tensor(right, device=drafts.device), None


@torch.inference_mode()
def rows_check(target: Any, prompt: list[int]) -> dict[str, Any]:
    """The speed layer's rule for rows with the same bits (gemma4/fast/rows.py, attention.py) on this device, as
    loaded: the row plans measured at load, and whether a verify of K + 1 rows gives row i the logits bits of the
    decode step at that position (K = 1, 4, 8), with the first row that differs and by how much."""
    device = device_of(target)
    prompt_ids = torch.tensor([prompt])  # (1, T)
    block = torch.tensor([prompt[:8] * 2])[:, :9]  # (1, 9): the next ids of every verify, any ids will do
    out: dict[str, Any] = {"plans": sorted({c.rows for c in kernels_of(target)})}
    for k in (1, 4, 8):
        logits = []
        for steps in (False, True):
            cache = RingCache(target.config, len(prompt) + k + 1, dtype=target.embed_tokens.weight.dtype,
                              device=device)
            forward_rows(target, prompt_ids, cache, num_logits=1)
            cache.length = torch.tensor([len(prompt)])
            if steps:  # k + 1 decode steps, each at its position
                rows = []
                for i in range(k + 1):
                    rows.append(forward_rows(target, block[:, i:i + 1], cache, torch.tensor([len(prompt) + i]),
                                             1).logits)
                    cache.length = torch.tensor([len(prompt) + i + 1])
                logits.append(torch.cat(rows, dim=1))  # (1, k + 1, V)
            else:
                logits.append(forward_rows(target, block[:, :k + 1], cache, torch.tensor([len(prompt)]),
                                           k + 1).logits)
        verified, stepped = logits
        equal = [bool(torch.equal(verified[0, i], stepped[0, i])) for i in range(k + 1)]
        out[f"k{k}"] = {"equal": all(equal), "first_differing_row": None if all(equal) else equal.index(False),
                        "max_abs_diff": float((verified.float() - stepped.float()).abs().max())}
    return out


def generate_command(t_dir: Path, a_dir: Path, prompt: list[int], tokens: int, device: torch.device,
                     compile: bool, threads: int | None = None) -> dict[str, Any]:
    """scripts/generate.py end to end, as a user runs it (a process of its own): its --json, and its wall time.
    `threads`: the benchmark's --threads, passed on (else generate.py applies the one thread rule itself)."""
    args = [sys.executable, str(Path(__file__).resolve().parent.parent / "generate.py"), "--target", str(t_dir),
            "--assistant", str(a_dir), "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", str(tokens),
            "--temperature", "0", "--device", str(device), "--compare", "--json"] + (["--compile"] if compile else [])
    args += [] if threads is None else ["--threads", str(threads)]
    start = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, timeout=1200)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:] or ['']}"[:300])
    r = json.loads(done.stdout)
    return {"wall_seconds": wall, "tokens_per_s": r["stats"]["tokens_per_second"], "identical": r["identical"],
            "plain_tokens_per_s": r["plain"]["tokens_per_second"], "speedup": r["speedup"],
            "acceptance_rate": r["stats"]["acceptance_rate"], "eager_rounds": r["stats"]["eager_rounds"],
            "warm_up_seconds": (r.get("compile") or {}).get("warm_up_seconds")}


def pair_checks(out: dict[str, Any], name: str, t_dir: Path, a_dir: Path, device: torch.device, clock: Clock,
                copy: dict[str, Any], tokens: int, reps: int, compile_step: bool, parity: bool, moe: bool = False,
                save: Callable[[], None] | None = None, threads: int | None = None) -> dict[str, Any]:
    """Every check of one pair, recorded into `out` (the section's entry for it) as each ends."""
    out |= {"target": str(t_dir), "assistant": str(a_dir)}
    prompt = random_prompt(t_dir, 16)
    models: dict[str, Any] = {}
    logits: dict[str, torch.Tensor] = {}  # the first forward's, for `parity`

    def pair(dtype: torch.dtype) -> tuple[Any, Any]:
        if dtype not in models:
            raise RuntimeError(f"the {dtype} pair did not load (see `load`)")
        return models[dtype]

    def load() -> dict[str, Any]:
        reset_peak(device)
        start = time.perf_counter()
        models[BF16] = (load_target(t_dir, BF16, device, fast=True), load_drafter(a_dir, BF16, device, fast=True))
        seconds, loaded = time.perf_counter() - start, memory(device)
        weights = sum(p.numel() * p.element_size() for m in models[BF16] for p in m.parameters())
        reset_peak(device)
        with torch.inference_mode():
            logits["ours"] = forward_rows(models[BF16][0], torch.tensor([prompt])).logits[0].float()  # (T, V)
        forward = memory(device)
        return {"seconds": seconds, "weight_bytes": weights, "after_load": loaded, "first_forward": forward,
                "note": None if loaded else "CUDA memory only: on the CPU see the `memory` section"}

    def decode() -> dict[str, Any]:
        target, _ = pair(BF16)
        cache, _ = prefilled(target, prompt, 1)
        ids, at = torch.tensor([prompt[-1:]]), torch.tensor([len(prompt)])  # (1, 1), (1,) on the host, as the loops'
        step = torch.inference_mode()(lambda: forward_rows(target, ids, cache, at))
        s, _ = interleaved({"step": step}, reps, {"step": step}, clock)
        gen, _ = clock.time(lambda: greedy_generate(target, prompt, tokens))
        step_bytes = decode_bytes(target)
        bound = copy["bytes_per_s"] / step_bytes if "bytes_per_s" in copy else None
        step_tps, gen_tps = 1 / sorted(s["step"])[len(s["step"]) // 2], tokens / gen
        return {"bytes_per_step": step_bytes, "bound_tokens_per_s": bound,
                "eager": {"step_tokens_per_s": step_tps, "generate_tokens_per_s": gen_tps,
                          "fraction_step": bound and step_tps / bound, "fraction_generate": bound and gen_tps / bound},
                "compiled": compiled(target, cache, ids, at, step) if compile_step else
                {"step_tokens_per_s": None, "reason": "no --compile yet (--device-compile tries torch.compile)"}}

    def compiled(target: Any, cache: Any, ids: torch.Tensor, at: torch.Tensor, eager: Callable[[], Any]
                 ) -> dict[str, Any]:
        """`--compile`'s decode step (a static cache, CUDA graphs on CUDA) at the same position; fails soft."""
        try:
            start = time.perf_counter()
            prepare_to_compile(target, target.embed_tokens.weight, 1)  # in place: later checks of this pair run
            # its products plain, the same numbers (on CUDA nothing is packed anyway)
            static = StaticTarget(target, compiled_rows=(1,))
            slots = StaticKVCache(target.config, len(prompt) + 8, dtype=BF16, device=device)
            static.warm_up(slots)
            warm_up = time.perf_counter() - start
            with torch.inference_mode():
                forward_rows(static, torch.tensor([prompt]), slots, num_logits=1)
            slots.length = torch.tensor([len(prompt)])
            step = torch.inference_mode()(lambda: forward_rows(static, ids, slots, at))  # eager's step, compiled
            diff = float((step().logits.float() - eager().logits.float()).abs().max())
            s, _ = interleaved({"step": step}, reps, {"step": step}, clock)
            return {"step_tokens_per_s": 1 / sorted(s["step"])[len(s["step"]) // 2], "max_abs_logit_diff": diff,
                    "warm_up_seconds": warm_up}
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            return {"step_tokens_per_s": None, "reason": f"torch.compile failed: {error_text(e)}"}

    def equal() -> dict[str, Any]:
        gc.collect()  # the bfloat16 pair is gone: the float32 one takes its place
        if device.type == "cuda":
            torch.cuda.empty_cache()
        target, drafter = load_target(t_dir, F32, device, fast=True), load_drafter(a_dir, F32, device, fast=True)
        plain = greedy_generate(target, prompt, tokens)
        spec = speculative_generate(target, drafter, prompt, tokens, DraftLength(K))
        sampled = sample_generate(target, prompt, tokens, SAMPLED)
        spec_sampled = speculative_generate(target, drafter, prompt, tokens, DraftLength(K), sampler=SAMPLED)
        if "ours" in logits:
            with torch.inference_mode():
                logits["f32"] = forward_rows(target, torch.tensor([prompt])).logits[0].float()
        return {"tokens": tokens, "k": K, "greedy": spec.tokens == plain, "sampled": spec_sampled.tokens == sampled,
                "sampler": "T 0.7, top-k 64, top-p 0.95, seed 0", "acceptance_rate": spec.stats.acceptance_rate,
                "float32_matmul_precision": torch.get_float32_matmul_precision(),  # "highest": no TF32
                "sampled_acceptance_rate": spec_sampled.stats.acceptance_rate}

    def full_acceptance() -> dict[str, Any]:
        """Rounds of K = 1..8 drafts all kept (AlwaysRight), against plain decoding, in bfloat16: what each K is
        worth when the drafter is right, on this device."""
        target, drafter = pair(BF16)
        plain = generate_one(target, prompt, tokens)  # the engine's loops, as the commands run them
        right = AlwaysRight(drafter, prompt + plain)
        runs = {"plain": lambda: generate_one(target, prompt, tokens)}
        runs |= {f"K={k}": lambda k=k: speculative_one(target, right, prompt, tokens, DraftLength(k)).tokens
                 for k in range(1, 9)}
        seconds, outputs = interleaved(runs, reps, runs, clock)
        rate = {name: tokens / sorted(s)[len(s) // 2] for name, s in seconds.items()}
        kept = speculative_one(target, right, prompt, tokens, DraftLength(K)).stats.acceptance_rate
        return {"tokens_per_s": rate, "identical": all(o == plain for r in outputs.values() for o in r),
                "acceptance_rate": kept, "over_plain": {name: r / rate["plain"] for name, r in rate.items()
                                                        if name != "plain"}}

    def cudnn() -> dict[str, Any]:
        """Speculative and plain decoding with cuDNN's attention allowed and not (choose_attention)."""
        target, drafter = pair(BF16)
        result: dict[str, Any] = {}
        try:
            for on in (False, True):
                choose_attention(on)
                runs = {"plain": lambda: greedy_generate(target, prompt, tokens),
                        "speculative": lambda: speculative_generate(target, drafter, prompt, tokens,
                                                                    DraftLength(K)).tokens}
                seconds, outputs = interleaved(runs, reps, runs, clock)
                result["on" if on else "off"] = {name: tokens / sorted(s)[len(s) // 2] for name, s in seconds.items()}
                result[f"identical_{'on' if on else 'off'}"] = outputs["plain"][0] == outputs["speculative"][0]
        finally:
            choose_attention(False)  # as loaded
        return result

    def step_rates(targets: dict[str, Any]) -> dict[str, float]:
        """Decode steps a second at the prompt's end, each target's median of `reps` on the device's clock."""
        rates = {}
        for name, target in targets.items():
            cache, _ = prefilled(target, prompt, 1)
            ids, at = torch.tensor([prompt[-1:]]), torch.tensor([len(prompt)])
            step = torch.inference_mode()(lambda target=target, cache=cache, ids=ids, at=at: forward_rows(target, ids, cache, at))
            s, _ = interleaved({"step": step}, reps, {"step": step}, clock)
            rates[name] = 1 / sorted(s["step"])[len(s["step"]) // 2]
        return rates

    def int4() -> dict[str, Any]:
        """The target quantized at load (`quantize="int4"`) in bfloat16: the speed layer's int4 products on this
        device (gemma4/fast/int4.py) against the textbook's layers, and its decode step against the bf16 one's.
        Both bf16 runs are measured against the same int4 weights run in float32: the kernel's error over the
        textbook's, near 1 where the kernel rounds as the textbook does (their tokens part at near ties)."""
        plain_target, drafter = pair(BF16)
        fast = load_target(t_dir, BF16, device, fast=True, quantize="int4")
        textbook = load_target(t_dir, BF16, device, quantize="int4")
        reference = load_target(t_dir, torch.float32, device, quantize="int4")  # the same q and scales
        with torch.inference_mode():
            ids = torch.tensor([prompt])
            ours, theirs = forward_rows(fast, ids).logits.float(), forward_rows(textbook, ids).logits.float()
            exact = forward_rows(reference, ids).logits
        diff = (ours - theirs).abs().max()
        error_ratio = float((ours - exact).abs().max() / (theirs - exact).abs().max().clamp_min(1e-30))
        del reference
        kernels = sorted({c.kernels[0] for c in kernels_of(fast)})
        tokens_fast, tokens_textbook = greedy_generate(fast, prompt, tokens), greedy_generate(textbook, prompt, tokens)
        spec = speculative_generate(fast, drafter, prompt, tokens, DraftLength(K))
        del textbook
        rates = step_rates({"bf16": plain_target, "int4": fast})
        return {"kernels": kernels, "max_abs_logit_diff_vs_textbook": float(diff),
                "error_over_textbook_error": error_ratio,
                "greedy_equal_textbook": tokens_fast == tokens_textbook,
                "speculative_equal_plain": spec.tokens == tokens_fast,
                "step_tokens_per_s": rates, "int4_over_bf16": rates["int4"] / rates["bf16"]}

    def tp1() -> dict[str, Any]:
        """Tensor parallelism on one rank (gemma4/parallel/): a process group of one (NCCL on CUDA, gloo on the
        CPU), the pair loaded as a rank loads it (`shard=Shard(0, 1)`: slices read, o/down reduced by `exact_sum`),
        its tokens against the one-process pair's and its decode step against theirs. More ranks need more
        devices: scripts/benchmark.md."""
        plain_target, _ = pair(BF16)
        started = one_rank(device)
        try:
            target = load_target(t_dir, BF16, device, fast=True, shard=Shard(0, 1))
            drafter = load_drafter(a_dir, BF16, device, fast=True, target=target, shard=Shard(0, 1))
            tokens_tp = greedy_generate(target, prompt, tokens)
            tokens_one = greedy_generate(plain_target, prompt, tokens)
            spec = speculative_generate(target, drafter, prompt, tokens, DraftLength(K))
            rates = step_rates({"one_process": plain_target, "tp1": target})
        finally:
            if started:
                dist.destroy_process_group()
        return {"greedy_equal_one_process": tokens_tp == tokens_one,
                "speculative_equal_plain": spec.tokens == tokens_tp,
                "reduced_modules": sum(isinstance(m, Reduced) for m in target.modules()),
                "step_tokens_per_s": rates, "tp1_over_one_process": rates["tp1"] / rates["one_process"]}

    def experts() -> dict[str, Any]:
        """Seconds of a decode step and a verify of K + 1 rows, and host reads a plain step, experts gathered
        (as loaded off the CPU) and looped (as on a CPU)."""
        target, drafter = pair(BF16)
        layers = [layer for layer in target.layers if layer.moe]
        cache, _ = prefilled(target, prompt, K + 1)
        at = torch.tensor([len(prompt)])  # (1,) on the host
        runs = {rows: torch.inference_mode()(lambda rows=rows: forward_rows(target, torch.tensor([prompt[-1:] * rows]), cache,
                                                                          at)) for rows in (1, K + 1)}
        result: dict[str, Any] = {"k": K}
        for way in ("gathered", "loop"):
            for layer in layers:
                layer.experts = adopt(Experts, layer.experts)  # the textbook loop, the same parameters
            if way == "gathered":
                gather_experts(target)
            s, _ = interleaved(runs, reps, runs, clock)
            reads = per_step(target, drafter, prompt, 8, K, device)
            result[way] = {"decode_s": sorted(s[1])[reps // 2], "verify_s": sorted(s[K + 1])[reps // 2],
                           "host_reads": reads["host_reads"], "cuda_syncs": reads["cuda_syncs"]}
        if device.type != "cpu":
            gather_experts(target)  # as loaded
        result["gathered_over_loop"] = {kind: result["gathered"][kind] / result["loop"][kind]
                                        for kind in ("decode_s", "verify_s")}
        result["gathered_modules"] = sum(isinstance(layer.experts, GatheredExperts) for layer in layers)
        return result

    attempt(out, "load", load, save)
    attempt(out, "rows", lambda: rows_check(pair(BF16)[0], prompt), save)
    attempt(out, "decode", decode, save)
    attempt(out, "costs", lambda: cost_section(*pair(BF16), prompt, reps, clock), save)
    attempt(out, "syncs", lambda: per_step(*pair(BF16), prompt, tokens, K, device), save)
    if moe:
        attempt(out, "experts", experts, save)
    if parity:
        attempt(out, "parity", lambda: transformers_logits(t_dir, prompt, device, logits), save)
    if parity:  # the e2b pair: the rounds at full acceptance, cuDNN's attention on and off (bfloat16)
        attempt(out, "full_acceptance", full_acceptance, save)
        attempt(out, "cudnn", cudnn, save)
        attempt(out, "int4", int4, save)
        attempt(out, "tp1", tp1, save)
    models.pop(BF16, None)  # freed before the float32 pair loads
    attempt(out, "equal", equal, save)
    if parity:  # and the command end to end, in a process of its own
        attempt(out, "generate", lambda: generate_command(t_dir, a_dir, prompt, tokens, device, False, threads), save)
        if compile_step:
            attempt(out, "generate_compile", lambda: generate_command(t_dir, a_dir, prompt, tokens, device, True,
                                                                      threads), save)
    if parity and isinstance(out["parity"], dict) and "theirs" in logits:
        out["parity"] |= {name: float((logits[a] - logits["f32"]).abs().max()) if "f32" in logits else None
                          for name, a in (("ours_vs_f32", "ours"), ("theirs_vs_f32", "theirs"))}
    return out


def transformers_logits(t_dir: Path, prompt: list[int], device: torch.device, logits: dict[str, torch.Tensor]
                        ) -> dict[str, Any]:
    """The first forward of the bfloat16 file through transformers' Gemma4ForCausalLM, against ours."""
    try:
        import transformers
        from transformers import Gemma4ForCausalLM
    except ImportError as e:
        return {"skipped": f"transformers does not import ({e})"}
    if "ours" not in logits:
        raise RuntimeError("our first forward did not run (see `load`)")
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    model = Gemma4ForCausalLM.from_pretrained(t_dir, dtype=BF16).to(device).eval()
    ids = torch.tensor([prompt], device=device)  # (1, T)
    with torch.inference_mode():
        logits["theirs"] = model(ids, attention_mask=torch.ones_like(ids)).logits[0].float()  # (T, V)
    del model
    diff = (logits["ours"] - logits["theirs"]).abs()
    return {"transformers": transformers.__version__, "positions": len(prompt), "max_abs_logit_diff": float(diff.max()),
            "max_abs_logit": float(logits["theirs"].abs().max()),
            "argmax_agree": float((logits["ours"].argmax(-1) == logits["theirs"].argmax(-1)).float().mean())}


# ---------------------------------------------------------------- the section


def device_section(device: str, root: Path, small: bool, tokens: int, reps: int, copy_mib: int,
                   compile_step: bool, say: Callable[..., None], out_dir: Path | None = None,
                   threads: int | None = None) -> dict[str, Any]:
    """`threads`: --threads, passed on to generate.py's run (the section's own threads are set by its caller)."""
    dev = torch.device(device)
    clock = Clock(dev)
    vocab = 512 if small else FULL_VOCAB
    pairs = {"e2b": small_e2b_configs(vocab) if small else e2b_configs(vocab), "31b_layers": l31b_configs(vocab, small),
             "26b_layers": l26b_configs(vocab, small), "12b_layers": l12b_configs(vocab, small)}
    out: dict[str, Any] = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type,
                           "torch": torch.__version__, "small": small, "vocab": vocab, "tokens": tokens, "reps": reps}
    save = saver(out, out_dir)
    size = "small" if small else "full"  # a small run never overwrites the full pairs
    sizes = {name: pair_bytes(*configs, BF16) for name, configs in pairs.items()}

    def to_write(base: Path) -> dict[str, int]:  # the pairs not written there yet (reused as they are)
        return {name: n for name, n in sizes.items() if not (base / size / name / "pair.json").is_file()}

    def free(base: Path) -> int:
        return shutil.disk_usage(next(p for p in (base, *base.parents) if p.exists())).free  # /dev/shm may be missing
    fallback = Path(tempfile.gettempdir()) / "gemma4-mtp-device"
    if sum(to_write(root).values()) > free(root) and free(fallback) - sum(to_write(fallback).values()) > \
            free(root) - sum(to_write(root).values()):
        say(f"device: {root} has less than {sum(to_write(root).values()) / 1e9:.2f} GB free: writing under {fallback}")
        root = fallback
    missing, room, dropped = to_write(root), free(root) - 2**30, []  # 1 GiB spare
    while sum(missing[n] for n in pairs if n in missing) > room:  # drop the last pairs (e2b first kept) until it fits
        name = [n for n in pairs if n in missing][-1]
        dropped.append(name)
        del pairs[name], missing[name]
    if dropped:
        say(f"device: {room / 1e9:.1f} GB free under {root}: the {', '.join(dropped)} pair(s) left out")
    root = root / size
    out["written_under"], out["pair_bytes"], out["pairs_left_out"] = str(root), sum(sizes.values()), dropped
    dirs: dict[str, tuple[Path, Path]] = {}
    for name, configs in pairs.items():
        say(f"device: writing or reusing the {name} pair under {root / name}")
        attempt(out, f"write_{name}", lambda name=name, configs=configs: [
            str(d) for d in dirs.setdefault(name, write_pair(root / name, *configs, BF16, device=dev))], save)
    say(f"device: copy bandwidth and keyed bits on {dev}")
    attempt(out, "copy", lambda: copy_check(dev, copy_mib, max(reps, 5), clock), save)
    attempt(out, "keyed_bits", lambda: keyed_bits_check(dev, vocab), save)
    attempt(out, "attention", lambda: attention_check(dev, small, max(reps, 5), clock), save)
    copy = out["copy"]
    for name, (t_dir, a_dir) in dirs.items():
        say(f"device: the {name} pair on {dev}")
        out[name] = {}  # filled check by check: what --out writes holds every finished one
        attempt(out, name, lambda t_dir=t_dir, a_dir=a_dir, name=name: pair_checks(
            out[name], name, t_dir, a_dir, dev, clock, copy, tokens, reps, compile_step, parity=name == "e2b",
            moe=name == "26b_layers", save=save, threads=threads), save)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return out


def device_table(result: dict[str, Any]) -> str:
    """The device section's figures, one line per check; an error in place of a check that failed."""
    d = result.get("device")
    if not d:
        return ""

    def line(label: str, r: Any, text: Callable[[Any], str]) -> str:
        if isinstance(r, dict) and "error" in r:
            return f"   {label:<24}ERROR {r['error']}"
        return f"   {label:<24}{text(r)}"

    gb = 1e9
    lines = ["", f"== device: {d['device']}, torch {d['torch']}{', small sizes' if d['small'] else ''}, "
                 f"vocabulary {d['vocab']}, {d['tokens']} tokens, {d['reps']} reps; pairs under {d['written_under']}",
             line("copy bandwidth", d.get("copy"), lambda c: f"{c['bytes_per_s'] / gb:.1f} GB/s (read + written, "
                                                           f"{c['mib']} MiB, best)"),
             line("keyed bits == CPU", d.get("keyed_bits"), lambda k: (
                 f"{k['equal']} ({k['cases']} cases x {k['ids']} ids; noise rel. diff "
                 f"{k['noise_max_rel_diff']:.1e})"))]
    for case, c in (d.get("attention") or {}).items():
        if isinstance(c, dict):  # the default's time, and the forced backend it is like
            lines.append(line(f"sdpa {case}", c, lambda c: f"default {c['default'] * 1e6:.0f} us (like "
                              f"{c.get('default_is_like')}); " + ", ".join(
                                  f"{n} {t * 1e6:.0f}" if isinstance(t, float) else f"{n} refuses"
                                  for n, t in c.items() if n not in ("default", "default_is_like"))))
    for name in ("e2b", "31b_layers", "26b_layers", "12b_layers"):
        p = d.get(name)
        if p is None:
            continue
        lines.append(f"   -- {name}")
        if "error" in p:
            lines.append(line("pair", p, str))
            continue
        lines += [
            line("load", p["load"], lambda m: f"{m['seconds']:.1f} s, weights {m['weight_bytes'] / gb:.2f} GB" + (
                f"; allocated {m['after_load']['allocated'] / gb:.2f} GB (peak {m['after_load']['peak'] / gb:.2f}), "
                f"first forward peak {m['first_forward']['peak'] / gb:.2f} GB" if m["after_load"] else "")),
            line("verify == decode bits", p.get("rows", {"error": "not run"}), lambda r: ", ".join(
                f"K={k[1:]} {v['equal']}" + ("" if v["equal"] else f" (row {v['first_differing_row']}, "
                                                                   f"{v['max_abs_diff']:.2g})")
                for k, v in r.items() if k != "plans") + f"; plans: {'; '.join(r['plans'])}"),
            line("decode, eager", p["decode"], lambda x: (
                f"step {x['eager']['step_tokens_per_s']:.1f} tokens/s, generate "
                f"{x['eager']['generate_tokens_per_s']:.1f}"
                + ("" if x["bound_tokens_per_s"] is None else
                   f"; bound {x['bound_tokens_per_s']:.1f} ({x['bytes_per_step'] / gb:.2f} GB a step): "
                   f"{x['eager']['fraction_step']:.0%} / {x['eager']['fraction_generate']:.0%}"))),
            line("decode, compiled", p["decode"], lambda x: (
                f"step {x['compiled']['step_tokens_per_s']:.1f} tokens/s (warm-up "
                f"{x['compiled']['warm_up_seconds']:.0f} s)" if x["compiled"]["step_tokens_per_s"]
                else x["compiled"]["reason"])),
            line("verify / decode", p["costs"], lambda c: " ".join(f"K={k}: {v:.2f}" for k, v in
                                                                  c["verify_over_decode"].items())),
            line("draft step / decode", p["costs"], lambda c: f"{c['draft_step_over_decode']:.3f}"),
            line("host reads", p["syncs"], lambda s: ", ".join(f"{k} {v:.2f}" for k, v in s["host_reads"].items())),
            line("CUDA syncs", p["syncs"], lambda s: "n/a (not CUDA)" if s["cuda_syncs"] is None else
                 ", ".join(f"{k} {v:.2f}" for k, v in s["cuda_syncs"].items())),
            line("float32 equal", p["equal"], lambda e: f"speculative == plain greedy {e['greedy']}, keyed sampling "
                                                       f"{e['sampled']} ({e['tokens']} tokens, K = {e['k']})")]
        if "experts" in p:
            lines.append(line("experts gathered / loop", p["experts"], lambda x: (
                f"decode {x['gathered_over_loop']['decode_s']:.2f}x, verify of {x['k'] + 1} rows "
                f"{x['gathered_over_loop']['verify_s']:.2f}x; host reads a step "
                f"{x['gathered']['host_reads']['plain_step']:.0f} / {x['loop']['host_reads']['plain_step']:.0f}")))
        if "full_acceptance" in p:
            lines.append(line("all drafts kept / plain", p["full_acceptance"], lambda f: " ".join(
                f"{k} {v:.2f}x" for k, v in f["over_plain"].items())))
            lines.append(line("cuDNN attention off, on", p["cudnn"], lambda c: (
                f"speculative {c['off']['speculative']:.1f}, {c['on']['speculative']:.1f} tokens/s; plain "
                f"{c['off']['plain']:.1f}, {c['on']['plain']:.1f}")))
        if "int4" in p:
            lines.append(line("int4 (quantized at load)", p["int4"], lambda q: (
                f"kernels {', '.join(q['kernels'])}; error {q['error_over_textbook_error']:.2f}x the textbook int4's, "
                f"tokens == textbook int4 {q['greedy_equal_textbook']}, speculative == plain "
                f"{q['speculative_equal_plain']}; decode step {q['int4_over_bf16']:.2f}x bf16's")))
        if "tp1" in p:
            lines.append(line("TP = 1 (one rank)", p["tp1"], lambda t: (
                f"tokens == one process {t['greedy_equal_one_process']}, speculative == plain "
                f"{t['speculative_equal_plain']}; decode step {t['tp1_over_one_process']:.2f}x one process's")))
        for key in ("generate", "generate_compile"):
            if key in p:
                lines.append(line(f"generate.py{' --compile' if 'compile' in key else ''}", p[key], lambda g: (
                    f"{g['tokens_per_s']:.1f} tokens/s, {g['speedup']:.2f}x plain, identical {g['identical']}, "
                    f"{g['wall_seconds']:.0f} s in all" + (f", warm-up {g['warm_up_seconds']:.0f} s, eager rounds "
                                                             f"{g['eager_rounds']}" if g["warm_up_seconds"] else ""))))
        if "parity" in p:
            lines.append(line("bf16 vs transformers", p["parity"], lambda q: q.get("skipped") or (
                f"max |logit diff| {q['max_abs_logit_diff']:.3g} (max |logit| {q['max_abs_logit']:.3g}); vs float32: "
                f"ours {q.get('ours_vs_f32') or float('nan'):.3g}, "
                f"theirs {q.get('theirs_vs_f32') or float('nan'):.3g}")))
    return "\n".join(lines)
