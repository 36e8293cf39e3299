"""The model options shared by scripts/generate.py and scripts/chat.py: flags, checks, defaults, loading.

Two rules hold for every flag here, and both scripts state them in `--help`:
- **A flag changes only itself.** Per-checkpoint defaults come from the checkpoint's own files: the
  sampling settings from the target's `generation_config.json` (`do_sample`, `temperature`, `top_k`,
  `top_p`, as the releases carry them), the drafts per round from the assistant's. Every other default
  is the same for every model. So the run without arguments, `--json` alone and `--seed 1` differ only
  in what was asked. The bundled demo is no mode: it is the default `--target`, and its files say greedy.
- **A flag acts or is refused.** A flag that would have no effect in the given combination (`--seed`
  on a greedy run, `--schedule` without an assistant, ...) ends the run before any work with one line
  naming it, exit status 2. Whether a flag "is given" is read from argparse (its default is None),
  never from its value: `--seed 0` on a greedy run is refused like `--seed 7`.

A script uses them in this order: `add_model_options(parser)`, `flags = ModelFlags.parsed(args)`,
`check_values(flags)`, `load_target_from(flags, say)` (device, dtype, target, tokenizer, sampling
settings, stop ids) and `load_assistant_from(flags, target, ...)`; `sampling_line` is the header line.

The assistant's lookup rule (no `--assistant`): a Hub id ORG/NAME pairs with ORG/NAME-assistant, as the
releases do (an int4 release ORG/X-qat-w4a16-ct with the bf16 ORG/X-qat-q4_0-unquantized-assistant); a directory DIR with DIR-assistant beside it, or else, for a directory named `target`,
with its sibling `assistant` (the demo's layout).
"""

import argparse
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import torch

from gemma4.engine.ring import PREFILL_CHUNK, RingCache, ring_slack
from gemma4.extras.memory import cache_bytes
from gemma4.config import ConfigError
from gemma4.config_file import read_json
from gemma4.fast.static import StaticDrafter, StaticKVCache, StaticTarget, prepare_to_compile
from gemma4.model import Gemma4Model
from gemma4.engine.rows import PromptError
from gemma4.generate import NonFiniteLogits
from gemma4.sampling import SamplerConfig
from gemma4.tokenizer import BOS_ID, Gemma4Tokenizer, chat_template, needs_empty_thought, stop_ids
from gemma4.audio.wav import AudioError
from gemma4.vision.prompt import ImageError
from gemma4.int4 import check_scheme
from gemma4.parallel.plan import Shard
from gemma4.weights import CheckpointError, HubUnreachable, load_target, resolve_model_dir
from mtp import DraftLength, Drafter, Schedule, check_pair, load_drafter
from mtp.auto_schedule import MAX_K
from gemma4.parallel.reduce import is_split
from mtp.loading import check_whole_kv
from gemma4.engine.forward import forward_rows
from mtp.engine.drafts import drafter_inputs, pairs, propose_rows, ring_kv

from cli.compile_cache import CompileFailed, compiling
from cli.flags import RULES, USAGE_ERROR, ModelFlags, Parser, add_model_options  # noqa: F401 (the scripts' names)
from gemma4.parallel.group import world_size
from cli.parallel import leave, lost_ranks, not_joined, others_wait, ranks, refusal
from cli.progress import progress
from cli.threads import use_threads

DEMO_TARGET = Path(__file__).resolve().parent.parent / "demo" / "target"  # scripts/demo/target
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
BUG, INTERRUPTED, CLOSED_PIPE = 1, 130, 141
DEFAULT_MAX_NEW_TOKENS = 128

class UsageError(ValueError):
    """Something on the command line that cannot run; its message says what to change."""


# What a user can get wrong, each raised with a message that says what to change: the command line, a
# checkpoint's files, a prompt the model cannot run. They subclass ValueError, so that a library caller's
# `except ValueError` keeps working; any other ValueError is a bug, and keeps its traceback.
USER_ERRORS = (UsageError, ConfigError, CheckpointError, PromptError, ImageError, AudioError, NonFiniteLogits,
               CompileFailed)


def refuse(flag: str, why: str) -> NoReturn:
    raise UsageError(f"{flag} has no effect here: {why}")


def check_values(a: ModelFlags) -> None:
    """Values that are wrong whatever the checkpoint says, and flags that cancel each other."""
    if a.max_new_tokens is not None and a.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be at least 1, got {a.max_new_tokens}")
    if a.num_assistant_tokens is not None and a.num_assistant_tokens < 1:
        raise UsageError(f"--num-assistant-tokens must be at least 1, got {a.num_assistant_tokens}; "
                         f"for plain decoding use --no-assistant")
    if a.temperature is not None and not (math.isfinite(a.temperature) and a.temperature >= 0):
        raise UsageError(f"--temperature must be a finite number, at least 0 (0 is greedy), got {a.temperature}")
    if a.top_k is not None and a.top_k < 0:
        raise UsageError(f"--top-k must be at least 0 (0 turns it off), got {a.top_k}")
    if a.top_p is not None and not 0 < a.top_p <= 1:  # also refuses NaN
        raise UsageError(f"--top-p must be in (0, 1] (1 turns it off), got {a.top_p}")
    if a.seed is not None and not 0 <= a.seed < 1 << 63:
        raise UsageError(f"--seed must be at least 0, got {a.seed}")
    if a.dtype == "float16":
        raise UsageError("--dtype float16: Gemma 4 is trained and released in bfloat16, and its activations need "
                         "bfloat16's range, which float16 lacks: use --dtype bfloat16")
    if a.threads is not None and a.threads < 1:
        raise UsageError(f"--threads must be at least 1, got {a.threads}")
    if a.tensor_parallel is not None and a.tensor_parallel < 1:
        raise UsageError(f"--tensor-parallel must be at least 1 (1: one process), got {a.tensor_parallel}")
    if a.tensor_parallel is not None and a.tensor_parallel > 1 and world_size() != a.tensor_parallel:
        raise UsageError(f"--tensor-parallel {a.tensor_parallel} starts its own ranks, and this is rank "
                         f"{os.environ.get('RANK', 0)} of {world_size()} of torchrun's: drop one of the two")
    if a.prefill_chunk is not None and a.prefill_chunk < 1:
        raise UsageError(f"--prefill-chunk must be at least 1, got {a.prefill_chunk}")
    if why := refusal(a.compile, a.schedule):
        raise UsageError(why)
    if a.reference and a.quantize_head:
        raise UsageError("--quantize-head is a product of the speed layer and --reference runs the textbook's "
                         "modules: drop one of the two")
    if a.reference and a.compile:
        raise UsageError("--reference runs the textbook's modules and --compile the speed layer's static steps: "
                         "drop one of the two")
    if a.no_assistant:
        for flag, value in (("--assistant", a.assistant), ("--num-assistant-tokens", a.num_assistant_tokens),
                            ("--schedule", a.schedule), ("--drafting", a.drafting),
                            ("--show-drafts", a.show_drafts or None)):
            if value is not None:
                refuse(flag, "it applies to the drafter, and --no-assistant runs without one: drop one of the two")


def pick_device(name: str | None) -> torch.device:
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    hint = "use --device cpu" + (" or cuda" if torch.cuda.is_available() else "")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f"{name!r} is not a device name like cpu, cuda or cuda:1: {hint}") from None
    if device.type == "meta":
        raise UsageError(f"device {name!r} holds no data: {hint}")
    try:
        torch.empty(1, device=device)  # the cheapest proof that the device is there
    except (RuntimeError, AssertionError, NotImplementedError) as e:  # torch's ways of saying "not here"
        reason = str(e).splitlines()[0][:100] if str(e) else type(e).__name__
        raise UsageError(f"device {name!r} is not available here ({reason}): {hint}") from None
    return device


def shown_path(path: Path) -> str:
    """A path as the header shows it: relative to the working directory when it lies below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def has_chat_template(model_dir: Path) -> bool:
    """A chat model ships its template's files: `chat_template.jinja` and `tokenizer_config.json` (every
    Gemma 4 release has both). The demo target, a model of raw Python source, has only tokenizer.json."""
    return (model_dir / "chat_template.jinja").is_file() or (model_dir / "tokenizer_config.json").is_file()


def file_number(file: dict, key: str, kind: type[int] | type[float], path: Path) -> int | float:
    """A generation_config.json value as a number: another type there is the checkpoint's mistake."""
    try:
        return kind(file[key])
    except (TypeError, ValueError):
        raise ConfigError(f"{path}: {key} is {file[key]!r}, not a number: correct the file") from None


def sampler_from(a: ModelFlags, target_dir: Path) -> tuple[SamplerConfig, str]:
    """The sampling settings (flags first, then generation_config.json), and the keys the file gave."""
    gen = target_dir / "generation_config.json"
    file = read_json(gen) if gen.is_file() else {}
    temperature = a.temperature
    if temperature is None:
        temperature = 0.0
        if file.get("do_sample"):
            temperature = file_number(file, "temperature", float, gen) if "temperature" in file else 1.0
    taken = [] if a.temperature is not None else ["do_sample"] + (["temperature"] if temperature else [])
    if temperature == 0:  # greedy: flags that only sampling reads would do nothing
        said = f"do_sample {str(file['do_sample']).lower()}" if "do_sample" in file else "no do_sample"
        why = ("--temperature 0 decodes greedy" if a.temperature is not None
               else f"{gen if gen.is_file() else target_dir} says greedy ({said})")
        # --seed is let through: a sweep over T with one seed reaches T = 0 (the header says it does nothing)
        for flag, value in (("--top-k", a.top_k), ("--top-p", a.top_p), ("--drafting", a.drafting)):
            if value is not None:
                refuse(flag, f"it applies to sampling, and {why}: add --temperature T (above 0), or drop {flag}")
        return SamplerConfig(0.0, 0, 1.0, 0), ", ".join(taken)
    top_k, top_p = a.top_k, a.top_p
    if top_k is None and "top_k" in file:
        top_k = file_number(file, "top_k", int, gen)
        taken.append("top_k")
    if top_p is None and "top_p" in file:
        top_p = file_number(file, "top_p", float, gen)
        taken.append("top_p")
    try:  # check_values passed the flags: a value out of range here came from the file
        sampler = SamplerConfig(temperature, 0 if top_k is None else top_k, 1.0 if top_p is None else top_p,
                                0 if a.seed is None else a.seed)
    except ValueError as e:
        raise ConfigError(f"{gen}: {e}: correct the file, or give the flag") from None
    return sampler, ", ".join(taken)


QAT_INT4, QAT_ASSISTANT = "-qat-w4a16-ct", "-qat-q4_0-unquantized-assistant"


def default_assistant(target: str) -> tuple[str, str]:
    """The assistant a target pairs with when --assistant is not given, and the rule that chose it. A folder is
    paired by its name as a Hub id is, so a release downloaded under its own name finds its assistant beside it."""
    path = Path(target).expanduser()
    if not path.is_dir():
        if target.rstrip("/").endswith(QAT_INT4):  # the int4 release pairs with the bf16 QAT assistant
            return (target.rstrip("/").removesuffix(QAT_INT4) + QAT_ASSISTANT,
                    f"a '{QAT_INT4}' Hub id pairs with '{QAT_ASSISTANT}'")
        return target.rstrip("/") + "-assistant", "the target's Hub id + '-assistant'"
    name = path.resolve().name
    found = [(path.parent / (name + "-assistant"), "the target directory + '-assistant'")]
    if name.endswith(QAT_INT4):  # first: the release's own pairing, as for a Hub id
        found.insert(0, (path.parent / (name.removesuffix(QAT_INT4) + QAT_ASSISTANT),
                         f"a '{QAT_INT4}' directory pairs with '{QAT_ASSISTANT}' beside it"))
    if name == "target":
        found.append((path.parent / "assistant", "the target directory's sibling 'assistant'"))
    beside, rule = next(((d, why) for d, why in found if d.is_dir()), found[0])
    return str(beside), rule


def offline_pair(e: HubUnreachable, target: str, a: ModelFlags) -> CheckpointError:
    """The no-Hub error for a target id, naming every repo the run needs: the assistant too, unless none runs."""
    if a.no_assistant or e.repo_id != target:
        return e
    assistant = a.assistant or default_assistant(target)[0]
    if Path(assistant).expanduser().is_dir():
        return e
    local = [r.rsplit("/", 1)[-1] for r in (target, assistant)]
    return CheckpointError(f"{target} and its assistant {assistant} are not on this machine and the Hub cannot be "
                           f"reached: where there is a network, hf download {target} --local-dir {local[0]} and hf "
                           f"download {assistant} --local-dir {local[1]}, then pass --target {local[0]} (its "
                           f"assistant is found beside it)")


@dataclass(frozen=True)
class Target:
    """The loaded target and what the run takes from its files."""
    name: str  # as given: a path or a Hub id
    dir: Path
    model: Gemma4Model
    tokenizer: Gemma4Tokenizer | None
    chat: bool  # has a chat template: user text goes into Gemma 4's turns
    empty_thought: bool  # the generation prompt ends in an empty thought block (12B, 26B-A4B, 31B)
    stops: list[int]
    sampler: SamplerConfig
    from_file: str  # the sampling keys generation_config.json supplied, for the header line
    shard: Shard | None = None  # this process's rank of a tensor-parallel run (cli/parallel.py); None: alone
    greedy_seed: int | None = None  # a --seed given to a greedy run: accepted, said to do nothing


@dataclass(frozen=True)
class Assistant:
    name: str
    drafter: Drafter
    draft_length: Schedule
    drafting: str


def watched(name: str, quiet: bool) -> Callable:
    """A loader's `progress`: a bar on stderr for each long loop of loading `name` (cli/progress.py)."""
    return lambda items, what, total: progress(items, f"{name}: {what}", total, quiet)


def int4_note(model: torch.nn.Module, target_dir: Path, asked: bool = False) -> str:
    """The header's word on int4 layers: how many, and whether the file or --quantize (`asked`) made them."""
    layers = sum(hasattr(module, "weight_packed") for module in model.modules())
    if not layers:
        return ""
    if not check_scheme(read_json(target_dir / "config.json")):
        return f", {layers} int4 layers quantized at load"
    return f", {layers} int4 layers{' (int4 already: --quantize int4 changes nothing)' if asked else ''}"


def int4_target(a: ModelFlags, target_dir: Path) -> bool:
    """Whether the target multiplies by int4 weights: an int4 file, --quantize int4 or --quantize-head int4."""
    config = target_dir / "config.json"  # none: the loader says so
    return bool(a.quantize or a.quantize_head or (config.is_file() and check_scheme(read_json(config))))


def default_dtype(dev: torch.device, int4: bool) -> str:
    """bfloat16 on CUDA, and for an int4 target anywhere: the releases are w4a16, 16-bit activations, and torch's
    CPU int4 kernel has a vector path for bfloat16 activations alone (float32 takes a scalar loop, many times
    slower a product: gemma4/fast/int4.py). float32 otherwise on the CPU."""
    return "bfloat16" if dev.type == "cuda" or int4 else "float32"


def load_target_from(a: ModelFlags, say: Callable[[str], None], demo_target: Path = DEMO_TARGET,
                     raw: bool = False, quiet: bool = False) -> tuple[Target, torch.device, torch.dtype]:
    """Device, dtype and the target, with the sampling settings resolved and checked. `say` prints one
    header line (to stderr, or nowhere). `raw`: --raw was given, refused here for a target without a chat
    template, before the weights load. `quiet` (--json): no progress bar while it loads."""
    dev = pick_device(a.device)
    name = a.target or shown_path(demo_target)
    if a.target is None and not demo_target.is_dir():
        raise UsageError(f"the demo pair is missing from {demo_target.parent}: restore it from git, or pass --target")
    try:
        target_dir = resolve_model_dir(name)  # a Hub id is downloaded here
    except HubUnreachable as e:
        raise offline_pair(e, name, a) from None
    dtype = DTYPES[a.dtype if a.dtype not in (None, "auto") else default_dtype(dev, int4_target(a, target_dir))]
    sampler, from_file = sampler_from(a, target_dir)  # before the weights load: a refusal costs nothing
    if raw and not has_chat_template(target_dir):
        refuse("--raw", f"{name} has no chat template, so --prompt is sent as it is already: drop --raw")
    shard = ranks(dev)  # under torchrun: this rank's part of the model (cli/parallel.py)
    model = load_target(target_dir, dtype, dev, fast=not a.reference, progress=watched(name, quiet),
                        quantize=a.quantize, shard=shard, quantize_head=a.quantize_head)
    use_threads(model.config.hidden_size, a.threads)  # the one thread rule (cli/threads.py)
    tokenizer = Gemma4Tokenizer(target_dir / "tokenizer.json") if (target_dir / "tokenizer.json").is_file() else None
    stops = [] if a.ignore_eos else stop_ids(target_dir)
    say(f"target     {name} ({str(dtype).removeprefix('torch.')} on {dev}, {torch.get_num_threads()} "
        f"thread{'s' if torch.get_num_threads() > 1 else ''}{'' if has_chat_template(target_dir) else ', no chat template'}"
        f"{int4_note(model, target_dir, a.quantize is not None)}{', the head int4' if a.quantize_head else ''}{', --reference: the textbook modules' if a.reference else ''}"
        f"{f', tensor-parallel on {shard.world} ranks' if shard else ''})")
    target = Target(name, target_dir, model, tokenizer, chat=has_chat_template(target_dir),
                    empty_thought=needs_empty_thought(model.config, chat_template(target_dir)), stops=stops,
                    sampler=sampler, from_file=from_file, shard=shard, greedy_seed=a.seed if sampler.greedy else None)
    return target, dev, dtype


def load_assistant_from(a: ModelFlags, target: Target, dev: torch.device, dtype: torch.dtype,
                        say: Callable[[str], None], quiet: bool = False) -> Assistant | None:
    """The drafter, checked against the target, and its drafts per round; None with --no-assistant."""
    if a.no_assistant:
        return None
    name, rule = (a.assistant, "") if a.assistant is not None else default_assistant(target.name)
    try:
        assistant_dir = resolve_model_dir(name)
    except CheckpointError as e:
        if not rule:
            raise
        raise UsageError(f"{e} (the assistant defaults to {rule}: pass --assistant, or --no-assistant for "
                         f"plain decoding)") from None
    drafter = load_drafter(assistant_dir, dtype, dev, fast=not a.reference, progress=watched(name, quiet),
                           shard=target.shard)
    # Under torchrun, a drafter whose heads the ranks cannot split runs whole on every rank.
    whole = target.shard is not None and not is_split(drafter)
    if whole:
        check_whole_kv(target.model.config, drafter.config, target.shard.world)
    check_pair(target.model.config, drafter.config, target.name, name)
    k = a.num_assistant_tokens
    if k is None:  # the release's own choice, as transformers reads it
        gen = assistant_dir / "generation_config.json"
        file = read_json(gen) if gen.is_file() else {}
        k = file_number(file, "num_assistant_tokens", int, gen) if "num_assistant_tokens" in file else 4
        if k < 1:
            raise ConfigError(f"{gen}: num_assistant_tokens is {k}, at least 1 drafts a round: correct the file, "
                              f"or give --num-assistant-tokens")
    schedule = a.schedule or default_schedule(a, target)
    copies = (f", whole on every rank: its {drafter.config.text.num_heads} query heads do not split across "
              f"{target.shard.world}") if whole else ""
    why = ", the default for an int4 target" if schedule == "auto" and a.schedule is None else ""
    say(f"assistant  {name} ({k} drafts per round, {schedule} schedule{why}{copies})")
    # auto chooses K in 0..max_k: at least the default 8, or the K asked for
    length = DraftLength(k, schedule, max_k=max(MAX_K, k)) if schedule == "auto" else DraftLength(k, schedule)
    return Assistant(name, drafter, length, a.drafting or "argmax")


def default_schedule(a: ModelFlags, target: Target) -> str:
    """`auto` for a target with int4 products, `constant` otherwise. Torch's CPU int4 kernel dequantizes its
    weights once per 4 rows, so a verify's cost grows with its rows (at E2B a 5-row verify costs about 1.8 decode
    steps, a 4-row one 1.3: scripts/benchmark.md): the K that pays is measured, not taken from the release.
    Not under --compile (each K is a step compiled before the run) nor tensor-parallel (ranks that time
    differently would draft differently)."""
    int4 = int4_target(a, target.dir)  # the rule that chose its dtype
    return "auto" if int4 and not a.compile and target.shard is None else "constant"


@dataclass(frozen=True)
class Compiled:
    """--compile: the target and the drafter as compiled static-shape steps (gemma4/fast/static.py) on one cache."""
    target: StaticTarget
    drafter: StaticDrafter | None
    cache: StaticKVCache
    seconds: float  # the warm-up: every step compiled (and recorded, on CUDA) before the run


def most_drafts(length: Schedule) -> int:
    """The most drafts a round of this schedule asks for: `auto` chooses in 0..max_k; `heuristic` grows without
    bound, so it gets max(MAX_K, initial) and a round past that runs its step eagerly (`eager_rounds`)."""
    return length.max_k if length.schedule == "auto" else (
        length.initial if length.schedule == "constant" else max(MAX_K, length.initial))


def draft_room(budget: int, prefill_chunk: int | None) -> int:
    """The most drafts any round of a run can hold, whatever the schedule asks: the loop drafts within the budget
    (the first token comes from the prefill, and a round commits one token after its drafts: budget - 2) and within
    one verify of the cache's slack (slack - 1, mtp/engine/rows.py step 1)."""
    return max(0, min(budget - 2, ring_slack(PREFILL_CHUNK if prefill_chunk is None else prefill_chunk) - 1))


def cut_drafts_note(length: Schedule | None, room: int, budget: int) -> str | None:
    """The note line for a schedule that asks for more drafts a round than the run can hold, else None."""
    if length is None or length.initial <= room:
        return None
    why = f"--max-new-tokens {budget}" if room == max(0, budget - 2) else "one verify of the prefill chunk's slack"
    return f"note: {length.initial} drafts a round is cut to {room}: that is the most {why} holds"


def verify_rows(length: Schedule, room: int) -> tuple[int, ...]:
    """The row counts of every step a schedule may run within `room` drafts (`draft_room`): 1 (a decode, a K = 0
    round) and K + 1 for each K it may choose, the rounds the budget cuts short included."""
    return tuple(range(1, min(most_drafts(length), room) + 2))


def compile_steps(target: Target, assistant: Assistant | None, capacity: int, say: Callable[[str], None],
                  prefill_chunk: int | None = None, room: int = MAX_K, quiet: bool = False) -> Compiled:
    """Wrap the loaded pair, size the static cache to `capacity` positions (its sliding rings to the prefill's
    chunks), compile the steps the run takes: a decode (1 row) and, with an assistant, a verify of every row
    count its schedule may choose within `room` drafts (`verify_rows`) and the draft step, all before the run."""
    model = target.model
    rows = tuple(t for t in verify_rows(assistant.draft_length, room) if t <= capacity) if assistant else (1,)
    say(f"compile    {len(rows)} step{'s' if len(rows) > 1 else ''}{' and the draft step' if assistant else ''} "
        f"before the run: a first compile takes from seconds to minutes")
    start = time.perf_counter()
    with compiling():  # its own cache folder; a failure inside torch.compile is one line (cli/compile_cache.py)
        prepare_to_compile(model, model.embed_tokens.weight, max(rows))  # in place: this run only compiles from here
        static = StaticTarget(model, compiled_rows=rows, context=capacity)  # the loops stop where the cache ends
        drafter = None
        if assistant is not None:
            prepare_to_compile(assistant.drafter, assistant.drafter.model.embed_tokens.weight)
            drafter = StaticDrafter(assistant.drafter, compile=True)
        w = model.embed_tokens.weight
        cache = StaticKVCache(model.config, capacity, w.dtype, w.device,
                              slack=ring_slack(PREFILL_CHUNK if prefill_chunk is None else prefill_chunk))
        static.warm_up(cache, watched("torch.compile", quiet))
        if drafter is not None:
            drafter.warm_up(static, cache)
    seconds = time.perf_counter() - start
    verifies = f" and verify ({rows[1]}{f'-{rows[-1]}' if len(rows) > 2 else ''} rows)" if len(rows) > 1 else ""
    steps = f"decode (1 row){verifies}"
    say(f"compile    {steps}{', draft' if drafter else ''} steps in {seconds:.1f} s (torch.compile"
        f"{', CUDA graphs' if static.cudagraphs else ''}); a static cache of {capacity} positions")
    return Compiled(static, drafter, cache, seconds)


@torch.inference_mode()
def warm_up(model: Gemma4Model, assistant: Assistant | None, room: int) -> None:
    """One-time costs paid before any clock starts: a forward of every row count the run may take (1, and K + 1 for
    each K its schedule may choose within `room` drafts: kernels and buffers are made per shape on first use) and a
    draft step, on a scratch cache. Timed runs, and both sides of --compare, then pay for their work alone."""
    rows = verify_rows(assistant.draft_length, room) if assistant else (1,)
    w = model.embed_tokens.weight
    cache = RingCache(model.config, max(rows), dtype=w.dtype, device=w.device, slack=ring_slack(max(rows)))
    for t in rows:
        out = forward_rows(model, torch.full((1, t), BOS_ID), cache)
    if assistant is not None:
        cache.length = torch.tensor([max(rows)])
        propose_rows(assistant.drafter, model, [BOS_ID], out.hidden[:, -1], [max(rows)], ring_kv(cache, model, max(rows)),
                                  1)


def available_bytes(device: torch.device) -> int | None:
    """Memory a new allocation can take now: the GPU's free memory, or the host's MemAvailable (Linux); None if
    this system does not say."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return None


def check_cache_fits(model: Gemma4Model, positions: int, prefill_chunk: int | None, rows: int = 1) -> None:
    """Refuse, before any work, a run whose KV cache (`positions` per row, grown as it fills) cannot fit the memory
    the loaded model leaves."""
    w = model.embed_tokens.weight
    needed = cache_bytes(model.config, positions, ring_slack(PREFILL_CHUNK if prefill_chunk is None else prefill_chunk),
                         rows, w.dtype)
    free = available_bytes(w.device)
    if free is not None and needed > free:
        raise PromptError(f"the KV cache of {positions} positions{f' x {rows} rows' if rows > 1 else ''} needs "
                          f"{needed / 1e9:.2f} GB and {free / 1e9:.2f} GB are available: shorten the prompt or "
                          f"--max-new-tokens")


def sampling_line(target: Target, assistant: Assistant | None) -> str:
    s = target.sampler
    how = "greedy" if s.greedy else f"temperature {s.temperature:g}, top-k {s.top_k}, top-p {s.top_p:g}, seed {s.seed}"
    if target.greedy_seed is not None:
        how += f", --seed {target.greedy_seed} has no effect"
    if assistant is not None and not s.greedy:
        how += f", {assistant.drafting} drafting"
    return f"decoding   {how}" + (f" ({target.from_file} from generation_config.json)" if target.from_file else "")


def one_line(e: BaseException) -> str:
    return "error: " + " ".join(str(e).split())  # one line, whatever the message holds


def guarded(run: Callable[[], int], quiet: bool = False) -> int:
    """A script's whole run (`outcome`); under torchrun the rank then ends at once (cli/parallel.py `leave`).
    `quiet` (--json): Ctrl-C ends without a word on stderr, as the run's own endings do under --json."""
    return leave(outcome(run, quiet))


def outcome(run: Callable[[], int], quiet: bool = False) -> int:
    """A script's whole run: what the user got wrong ends as one line and exit status 2, Ctrl-C as
    "interrupted" and 130, a reader of stdout that went away (`| head`) quietly with 141, as a Unix tool
    ends on SIGPIPE; anything else is a bug in the code and prints its traceback, exit status 1."""
    try:
        return run()
    except BrokenPipeError:
        # Python would complain once more flushing stdout at exit: point it at nothing first.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):  # a stdout with no file behind it (a test's capture)
            pass
        return CLOSED_PIPE
    except KeyboardInterrupt:  # while loading (a running decode catches its own, to print what it made)
        if not quiet:
            print("\ninterrupted", file=sys.stderr)
        return INTERRUPTED
    except torch.OutOfMemoryError:
        print("error: out of memory: try --dtype bfloat16, a smaller model, or another --device", file=sys.stderr)
        return USAGE_ERROR
    except USER_ERRORS as e:
        print(one_line(e), file=sys.stderr)
        others_wait()  # under torchrun: rank 0's line first
        return USAGE_ERROR
    except OSError as e:
        # A file the user named that the system will not open (no permission, a directory), or a reader of
        # stdout that went away: the user's to fix. An OSError about no file comes from inside: a bug.
        if e.filename is None:
            traceback.print_exc()
            return BUG
        print(one_line(e), file=sys.stderr)
        return USAGE_ERROR
    except Exception as e:  # noqa: BLE001 (a bug: what Python itself would print, as a status the caller gets)
        if line := not_joined(e):  # under torchrun, a rank stopped before the run began: its output says why
            print(line, file=sys.__stderr__)
            return USAGE_ERROR
        if line := lost_ranks(e):  # under torchrun, another rank stopped: its own output says why
            print(line, file=sys.__stderr__)
            return BUG
        traceback.print_exc()
        return BUG
