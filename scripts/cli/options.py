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
from dataclasses import dataclass, fields
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
from gemma4.vision.processor import SOFT_TOKEN_CHOICES
from gemma4.audio.wav import AudioError
from gemma4.vision.prompt import ImageError
from gemma4.int4 import check_scheme
from gemma4.parallel.plan import Shard
from gemma4.weights import CheckpointError, load_target, resolve_model_dir
from mtp import SCHEDULES, DraftLength, Drafter, Schedule, check_pair, load_drafter
from mtp.auto_schedule import MAX_K
from gemma4.parallel.reduce import is_split
from mtp.loading import check_whole_kv
from mtp.speculative import DRAFTING
from gemma4.engine.forward import forward_rows
from mtp.engine.drafts import drafter_inputs, pairs, propose_rows, ring_kv

from cli.media import IMAGE_TOKENS_HELP
from cli.parallel import leave, lost_ranks, not_joined, others_wait, ranks, refusal
from cli.progress import progress
from cli.threads import use_threads

DEMO_TARGET = Path(__file__).resolve().parent.parent / "demo" / "target"  # scripts/demo/target
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
BUG, USAGE_ERROR, INTERRUPTED, CLOSED_PIPE = 1, 2, 130, 141
DEFAULT_MAX_NEW_TOKENS = 128

RULES = """\
defaults: a flag changes only itself. The sampling settings come from the target's
generation_config.json (do_sample, temperature, top_k, top_p; the releases sample at T 1, top-k 64,
top-p 0.95, the demo decodes greedy); --temperature 0 is greedy. Every other default is the same for
every model. A flag that would have no effect in the given combination (e.g. --seed on a greedy run,
--schedule with --no-assistant) is refused with one line and exit status 2.
assistant: without --assistant, a Hub id ORG/NAME pairs with ORG/NAME-assistant (the int4 release
ORG/X-qat-w4a16-ct with ORG/X-qat-q4_0-unquantized-assistant); a directory DIR with DIR-assistant
beside it, or else (a directory named target) with its sibling directory assistant."""


class UsageError(ValueError):
    """Something on the command line that cannot run; its message says what to change."""


# What a user can get wrong, each raised with a message that says what to change: the command line, a
# checkpoint's files, a prompt the model cannot run. They subclass ValueError, so that a library caller's
# `except ValueError` keeps working; any other ValueError is a bug, and keeps its traceback.
USER_ERRORS = (UsageError, ConfigError, CheckpointError, PromptError, ImageError, AudioError, NonFiniteLogits)


class Parser(argparse.ArgumentParser):
    """argparse, one error line, and no abbreviations: `--image` must not be taken for `--image-tokens`."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})

    def error(self, message: str) -> NoReturn:  # one line, not argparse's usage block
        print(f"error: {message} (see --help)", file=sys.stderr)
        sys.exit(USAGE_ERROR)


@dataclass(frozen=True)
class ModelFlags:
    """The model options as given: None (or False) where the command line left a flag out."""
    target: str | None
    assistant: str | None
    no_assistant: bool
    max_new_tokens: int | None
    num_assistant_tokens: int | None
    schedule: str | None
    ignore_eos: bool
    dtype: str | None
    device: str | None
    threads: int | None
    temperature: float | None
    top_k: int | None
    top_p: float | None
    seed: int | None
    drafting: str | None
    show_drafts: bool
    compile: bool
    reference: bool
    quantize: str | None
    quantize_head: str | None
    prefill_chunk: int | None
    image_tokens: int | None

    @classmethod
    def parsed(cls, args: argparse.Namespace) -> "ModelFlags":
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


def add_model_options(p: argparse.ArgumentParser) -> None:
    """The flags of the model, its drafter and decoding. Every default is None, so that a check can
    tell a flag given from one left out; the help states the value a left-out flag takes."""
    p.add_argument("--target", metavar="PATH_OR_HUB_ID",
                   help="checkpoint directory or Hub id like google/gemma-4-E2B-it (default: the bundled demo, "
                        "scripts/demo/target)")
    p.add_argument("--assistant", metavar="PATH_OR_HUB_ID",
                   help="the drafter's checkpoint directory or Hub id (default: found by the rule below)")
    p.add_argument("--no-assistant", action="store_true",
                   help="no drafter: plain decoding, greedy or sampled as the settings say")
    p.add_argument("--max-new-tokens", metavar="N", type=int,
                   help="at most N new tokens; more than the context holds is cut to what fits (default: 128)")
    p.add_argument("--num-assistant-tokens", metavar="K", type=int,
                   help="drafts per round (default: the assistant's generation_config.json, else 4)")
    p.add_argument("--schedule", choices=SCHEDULES,
                   help="how the drafts per round adapt: constant K; heuristic, K+2 after a fully accepted round "
                        "and K-1 otherwise; heuristic_transient, the same restarting at K every call; auto, the K "
                        "that measured costs and acceptance say is fastest (default: auto for an int4 target, whose verify "
                        "costs grow with its rows, constant otherwise)")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop on the target's stop ids")
    p.add_argument("--dtype", choices=list(DTYPES),
                   help="(default: bfloat16 on CUDA and for an int4 target, whose releases are w4a16; float32 "
                        "otherwise)")
    p.add_argument("--device", metavar="DEVICE", help="cpu, cuda, cuda:1, ... (default: cuda if there is one)")
    p.add_argument("--threads", metavar="N", type=int,
                   help="CPU threads for torch (default: 1 for targets of hidden size below 256, like the demo, "
                        "whose tiny matrices gain nothing from more; else torch's own)")
    p.add_argument("--temperature", metavar="T", type=float,
                   help="0: greedy; above 0: sample, exactly from the target's distribution (default: the "
                        "target's generation_config.json: its temperature if do_sample is true, else 0)")
    p.add_argument("--top-k", metavar="K", type=int,
                   help="sampling: only the K most likely tokens, 0: off (default: generation_config.json's, else 0)")
    p.add_argument("--top-p", metavar="P", type=float,
                   help="sampling: the most likely tokens that hold probability P, 1: off "
                        "(default: generation_config.json's, else 1)")
    p.add_argument("--seed", metavar="N", type=int,
                   help="sampling seed: the token at position n draws noise keyed by (seed, n) only (default: 0)")
    p.add_argument("--drafting", choices=DRAFTING,
                   help="sampling with an assistant: argmax drafts reproduce plain sampling token for token; "
                        "sample draws drafts from the drafter, exact in distribution (default: argmax)")
    p.add_argument("--compile", action="store_true",
                   help="compile the decode step, the verify of K + 1 rows and the draft step (torch.compile, static "
                        "shapes, CUDA graphs on CUDA; other row counts and sample drafting run the same steps eager): "
                        "minutes of warm-up first, the same tokens (default: eager)")
    p.add_argument("--reference", action="store_true",
                   help="run exactly the textbook's modules: both models loaded with fast=False, without the speed "
                        "layer (gemma4/fast/), the same tokens, slower (default: the speed layer)")
    p.add_argument("--quantize", choices=["int4"],
                   help="int4: the target's projections quantized as they load, in the layout and by the recipe of "
                        "Google's w4a16 releases (about 0.28 of their bfloat16 bytes; the drafter stays as it is). "
                        "An int4 checkpoint loads as int4 without it (default: as the checkpoint is)")
    p.add_argument("--quantize-head", choices=["int4"],
                   help="int4: the output head (the tied embedding) multiplied by an int4 copy made at load by the "
                        "same recipe, a third of its bytes a step (E2B's head is 0.8 GB of a 2 GB int4 step). It "
                        "changes logits, so tokens may differ from the checkpoint's; speculative still equals plain "
                        "(default: the head as the checkpoint is)")
    p.add_argument("--prefill-chunk", metavar="C", type=int,
                   help=f"run a prompt (a chat turn's new text) in forwards of at most C positions: a prefill's "
                        f"memory then grows with the prompt only through the full layers' cache "
                        f"(default: {PREFILL_CHUNK})")
    p.add_argument("--image-tokens", metavar="N", type=int, choices=SOFT_TOKEN_CHOICES, help=IMAGE_TOKENS_HELP)
    p.add_argument("--show-drafts", action="store_true",
                   help="mark the drafter's accepted tokens in the streamed text (green on a terminal, "
                        "else between ⟦ and ⟧)")


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
    if a.threads is not None and a.threads < 1:
        raise UsageError(f"--threads must be at least 1, got {a.threads}")
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
        for flag, value in (("--top-k", a.top_k), ("--top-p", a.top_p), ("--seed", a.seed), ("--drafting", a.drafting)):
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
    """The assistant a target pairs with when --assistant is not given, and the rule that chose it."""
    path = Path(target).expanduser()
    if not path.is_dir():
        if target.rstrip("/").endswith(QAT_INT4):  # the int4 release pairs with the bf16 QAT assistant
            return (target.rstrip("/").removesuffix(QAT_INT4) + QAT_ASSISTANT,
                    f"a '{QAT_INT4}' Hub id pairs with '{QAT_ASSISTANT}'")
        return target.rstrip("/") + "-assistant", "the target's Hub id + '-assistant'"
    beside = path.parent / (path.resolve().name + "-assistant")
    if not beside.is_dir() and path.resolve().name == "target" and (path.parent / "assistant").is_dir():
        return str(path.parent / "assistant"), "the target directory's sibling 'assistant'"
    return str(beside), "the target directory + '-assistant'"


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


@dataclass(frozen=True)
class Assistant:
    name: str
    drafter: Drafter
    draft_length: Schedule
    drafting: str


def watched(name: str, quiet: bool) -> Callable:
    """A loader's `progress`: a bar on stderr for each long loop of loading `name` (cli/progress.py)."""
    return lambda items, what, total: progress(items, f"{name}: {what}", total, quiet)


def int4_note(model: torch.nn.Module, target_dir: Path) -> str:
    """The header's word on int4 layers: how many, and whether the file or --quantize made them."""
    layers = sum(hasattr(module, "weight_packed") for module in model.modules())
    if not layers:
        return ""
    return f", {layers} int4 layers{'' if check_scheme(read_json(target_dir / 'config.json')) else ' quantized at load'}"


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
    target_dir = resolve_model_dir(name)  # a Hub id is downloaded here
    dtype = DTYPES[a.dtype or default_dtype(dev, int4_target(a, target_dir))]
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
        f"{int4_note(model, target_dir)}{', the head int4' if a.quantize_head else ''}{', --reference: the textbook modules' if a.reference else ''}"
        f"{f', tensor-parallel on {shard.world} ranks' if shard else ''})")
    target = Target(name, target_dir, model, tokenizer, chat=has_chat_template(target_dir),
                    empty_thought=needs_empty_thought(model.config, chat_template(target_dir)), stops=stops,
                    sampler=sampler, from_file=from_file, shard=shard)
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
    int4 = a.quantize_head or any(hasattr(module, "weight_packed") for module in target.model.modules())
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
    if assistant is not None and not s.greedy:
        how += f", {assistant.drafting} drafting"
    return f"decoding   {how}" + (f" ({target.from_file} from generation_config.json)" if target.from_file else "")


def one_line(e: BaseException) -> str:
    return "error: " + " ".join(str(e).split())  # one line, whatever the message holds


def guarded(run: Callable[[], int]) -> int:
    """A script's whole run (`outcome`); under torchrun the rank then ends at once (cli/parallel.py `leave`)."""
    return leave(outcome(run))


def outcome(run: Callable[[], int]) -> int:
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
