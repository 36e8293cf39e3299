"""How scripts/benchmark.py times and counts: methods in turns on one clock, the cached forwards it times, and
ATen calls per step.

- A shared machine is noisy, so methods are timed in turns (`interleaved`): every repetition runs every
  method once, the order reversed on every other repetition, after one untimed warm-up; a ratio is the
  median of per-repetition ratios (neighbours in time).
- The clock (`Clock`) is the host's on the CPU. On CUDA a call only queues kernels and returns, so the host
  clock would time the launches: there CUDA events are recorded on the device's stream before and after the
  call and read after a synchronize, which times the call's work on the device, idle gaps included.
- Every tensor is made on the model's device, so the same code runs on the CPU and on CUDA.
- Threads (`section_threads`): each section runs on the threads scripts/cli/threads.py's rule gives the model it
  measures (`--threads N` overrides it), every method of the section alike.
"""

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from bench.show import steps
from cli.threads import use_threads
from gemma4 import RingCache
from gemma4.model import Gemma4Model, ModelOutput
from mtp import Drafter
from gemma4.engine.forward import forward_rows
from mtp.engine.drafts import drafter_inputs, pairs, propose_rows, ring_kv


class Clock:
    """Seconds of one call, and its result: the host clock on the CPU, CUDA events on a CUDA device."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"

    def time(self, run: Callable[[], Any]) -> tuple[float, Any]:
        if not self.cuda:
            start = time.perf_counter()
            out = run()
            return time.perf_counter() - start, out
        stream = torch.cuda.current_stream(self.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        out = run()
        end.record(stream)
        end.synchronize()  # both events have happened: elapsed_time may be read
        return start.elapsed_time(end) / 1e3, out  # milliseconds -> seconds


HOST = Clock("cpu")
TORCH_THREADS = torch.get_num_threads()  # torch's default, read before any section sets its own


def section_threads(hidden_size: int, asked: int | None = None) -> int:
    """Set this process's torch threads for a section whose model has this hidden size, by the one thread rule
    (scripts/cli/threads.py; `asked`: --threads); returns them. torch's default comes back first, so a section
    after a one-thread section runs on the default where the rule says so."""
    torch.set_num_threads(TORCH_THREADS)
    return use_threads(hidden_size, asked)


def median_ratio(a: list[float], b: list[float]) -> float:
    """Median over repetitions of a[i] / b[i]: each ratio compares runs that were neighbours in time."""
    return statistics.median(x / y for x, y in zip(a, b))


def interleaved(runs: dict[str, Callable[[], Any]], reps: int, warm_up: dict[str, Callable[[], Any]],
                clock: Clock = HOST) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Seconds of every run per repetition (order reversed every other repetition), and each one's output; a bar
    of the runs on a terminal (bench/show.py), advanced outside the timed calls."""
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    outputs: dict[str, Any] = {}
    what = f"timing, {len(runs)} runs x {reps} reps{' + warm-up' if warm_up else ''}"
    with steps(what, len(warm_up) + reps * len(runs)) as done:
        for run in warm_up.values():
            run()
            done.update()
        for rep in range(reps):
            for name in (list(runs) if rep % 2 == 0 else list(reversed(runs))):
                s, out = clock.time(runs[name])
                outputs.setdefault(name, []).append(out)
                seconds[name].append(s)
                done.update()
    return seconds, outputs


def aten_calls(prepare: Callable[[], Callable[[], Any]]) -> int:
    """ATen operator calls, nested ones included, in one decode step. `prepare()` prefills a new cache and
    returns the step; one step runs unprofiled first. A small model's decode step is bound by the cost
    per call, not by arithmetic: its time follows this count."""
    from torch.profiler import ProfilerActivity, profile

    os.environ.setdefault("KINETO_LOG_LEVEL", "99")  # the profiler would print its own start/stop lines
    prepare()()
    step = prepare()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    return sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))


def device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def prefilled(target: Gemma4Model, prompt: list[int], room: int) -> tuple[RingCache, ModelOutput]:
    """A new cache holding the prompt's K/V with `room` more positions, and the prefill's output."""
    device = device_of(target)
    cache = RingCache(target.config, len(prompt) + room, dtype=target.embed_tokens.weight.dtype, device=device)
    with torch.inference_mode():
        out = forward_rows(target, torch.tensor([prompt]), cache, num_logits=1)
    cache.length = torch.tensor([len(prompt)])  # every timed forward writes at len(prompt).. and leaves it there
    return cache, out


def our_decode_step(target: Gemma4Model, prompt: list[int]) -> Callable[[], Any]:
    """The prompt prefilled into a new cache, and the cached 1-token forward that follows it, as every
    step of greedy_generate runs it."""
    cache, _ = prefilled(target, prompt, 1)
    ids, at = torch.tensor([prompt[-1:]]), torch.tensor([len(prompt)])  # (1, 1), (1,) on the host, as the loop's
    return torch.inference_mode()(lambda: forward_rows(target, ids, cache, at))


def draft_step_calls(target: Gemma4Model, drafter: Drafter, prompt: list[int]) -> float:
    """ATen calls of one draft step: a round of 3 steps less a round of 1, halved (a round's own setup,
    its RoPE tables and masks, cancels out)."""
    p = len(prompt)
    cache, out = prefilled(target, prompt, 1)
    token, hidden, kv = int(out.logits[0, -1].argmax()), out.hidden[:, -1], ring_kv(cache, target, p)
    rounds = {k: aten_calls(lambda k=k: lambda: propose_rows(drafter, target, [token], hidden, [p], kv, k)[0].tolist())
              for k in (1, 3)}
    return (rounds[3] - rounds[1]) / 2
