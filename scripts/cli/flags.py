"""The command line of generate.py and chat.py without torch: the parser, the model flags and the names other tools
use for them. A script parses its arguments with these before it imports torch (seconds), so that `--help` and a
mistyped flag answer at once (scripts/cli/options.py checks and runs them after).

- `Parser`: argparse that prints one error line, takes no abbreviations, and answers an unknown flag with the flag
  of ours it most likely means ("did you mean --max-new-tokens?"): `FOREIGN` names what llama.cpp, vLLM, mlx-lm,
  ollama and transformers call our flags, and a near spelling of one of ours is found by `difflib`.
- Aliases that mean exactly what ours mean are accepted, hidden from `--help` (one name an option there):
  `--model`/`-m` for `--target`, `-n`/`--max-tokens` for `--max-new-tokens`, and in generate.py `-p` for `--prompt`
  and a prompt given as plain words (`generate.py "Tell me a story"`).
- The library's choices that the flags offer (`SCHEDULES`, `DRAFTING`, `PREFILL_CHUNK`, `SOFT_TOKEN_CHOICES`) are
  written here again, not imported (importing them imports torch); tests/commands/test_flags.py holds them equal.
"""

import argparse
import difflib
import os
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import NoReturn

USAGE_ERROR = 2
DTYPE_NAMES = ("auto", "float32", "bfloat16", "float16")  # float16 and auto: answered in options.py
SCHEDULES = ("constant", "heuristic", "heuristic_transient", "auto")  # mtp/draft_length.py
DRAFTING = ("argmax", "sample")  # mtp/speculative.py
PREFILL_CHUNK = 512  # gemma4/engine/ring.py
SOFT_TOKEN_CHOICES = (70, 140, 280, 560, 1120)  # gemma4/vision/processor.py
IMAGE_TOKENS_HELP = (f"soft tokens per image at most, one of {', '.join(map(str, SOFT_TOKEN_CHOICES))}: fewer is a "
                     f"smaller image, faster and shorter (default: the target's processor config, 280 in the "
                     f"releases)")

RULES = """\
defaults: a flag changes only itself. The sampling settings come from the target's
generation_config.json (do_sample, temperature, top_k, top_p; the releases sample at T 1, top-k 64,
top-p 0.95, the demo decodes greedy); --temperature 0 is greedy. Every other default is the same for
every model. A flag that would have no effect in the given combination (e.g. --top-k on a greedy run,
--schedule with --no-assistant) is refused with one line and exit status 2.
assistant: without --assistant, ORG/NAME pairs with ORG/NAME-assistant, and DIR with DIR-assistant
beside it (an int4 release X-qat-w4a16-ct with X-qat-q4_0-unquantized-assistant, as a Hub id or a
folder); or else a directory named target with its sibling directory assistant.
aliases: --model/-m is --target, -n/--max-tokens is --max-new-tokens."""

# Flag names other tools use (llama.cpp's llama-cli, vLLM, mlx-lm, ollama, transformers' generate), each with the
# flag of ours that does that; underscores in a given name are read as dashes first (--max_new_tokens).
FOREIGN = {
    "--temp": "--temperature", "-t": "--threads", "--n-predict": "--max-new-tokens", "--max-length": "--max-new-tokens",
    "--num-predict": "--max-new-tokens", "--ctx-size": "--context", "-c": "--context", "--max-model-len": "--context",
    "-s": "--seed", "--model-draft": "--assistant", "-md": "--assistant",
    "--draft-model": "--assistant", "--speculative-model": "--assistant", "--draft-max": "--num-assistant-tokens",
    "--draft": "--num-assistant-tokens", "--num-speculative-tokens": "--num-assistant-tokens",
    "--num-draft-tokens": "--num-assistant-tokens", "--file": "--prompts-file", "-f": "--prompts-file",
    "--prompt-file": "--prompts-file", "--system-prompt": "--system", "-sys": "--system", "--quantization": "--quantize",
    "-q": "--quantize", "--n-gpu-layers": "--device cuda", "-ngl": "--device cuda",
    "--tensor-parallel-size": "--tensor-parallel", "-tp": "--tensor-parallel", "--greedy": "--temperature 0",
    "--interactive": "chat.py", "-i": "chat.py", "-cnv": "chat.py", "--verbose-prompt": "--show-drafts",
}


def launched(args: argparse.Namespace, script: str, argv: list[str]) -> int | None:
    """--tensor-parallel N (N ≥ 2) outside torchrun: the command run on its own N ranks (cli/launch.py), and rank
    0's exit status; None: this process runs it. Refusals of the value are options.py's."""
    n = args.tensor_parallel
    if n is None or n < 2 or "WORLD_SIZE" in os.environ:
        return None
    from cli.launch import launch

    return launch(Path(script), argv, n)


class Parser(argparse.ArgumentParser):
    """argparse, one error line, no abbreviations (`--image` must not be taken for `--image-tokens`), and a hint at
    the flag an unknown one most likely means."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})

    def error(self, message: str) -> NoReturn:  # one line, not argparse's usage block
        print(f"error: {message} (see --help)", file=sys.stderr)
        sys.exit(USAGE_ERROR)

    def parse_args(self, args: list[str] | None = None, namespace: object = None) -> argparse.Namespace:  # type: ignore[override]
        given = sys.argv[1:] if args is None else args
        for arg in given:  # llama-cli's -ngl, -md, -sys, ...: argparse would read -ngl as -n with the value "gl"
            flag = arg.split("=", 1)[0]
            if flag in FOREIGN and not flag.startswith("--") and flag not in self._option_string_actions:
                self.error(self.unknown([flag]))
        # Intermixed: words of a prompt may come before and after the flags (`generate.py Tell me -n 20 more`).
        parsed, unknown = self.parse_known_intermixed_args(args, namespace)
        if unknown:
            self.error(self.unknown(unknown))
        return parsed

    def unknown(self, given: list[str]) -> str:
        """The error for arguments no option takes: the first flag among them with our flag it likely means, or
        the text that no option took."""
        flag = next((a.split("=", 1)[0] for a in given if a.startswith("-")), None)
        if flag is None:
            return f"unrecognized arguments: {' '.join(given)}"
        hint = self.meant(flag)
        return f"unrecognized argument {flag}" + (f": did you mean {hint}?" if hint else "")

    def meant(self, flag: str) -> str | None:
        """Our flag (or the command) that `flag` most likely means, or None."""
        ours = [s for s, action in self._option_string_actions.items() if action.help != argparse.SUPPRESS]
        dashed = flag[:2] + flag[2:].replace("_", "-") if flag.startswith("--") else flag
        if dashed in ours:
            return dashed
        if (theirs := FOREIGN.get(dashed, FOREIGN.get(flag))) and (theirs.split()[0] in ours or theirs == "chat.py"):
            return theirs
        close = difflib.get_close_matches(dashed, [s for s in ours if s.startswith("--")], n=1, cutoff=0.75)
        return close[0] if close else None


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
    tensor_parallel: int | None

    @classmethod
    def parsed(cls, args: argparse.Namespace) -> "ModelFlags":
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


def add_model_options(p: argparse.ArgumentParser) -> None:
    """The flags of the model, its drafter and decoding. Every default is None, so that a check can
    tell a flag given from one left out; the help states the value a left-out flag takes."""
    p.add_argument("--target", metavar="PATH_OR_HUB_ID",
                   help="checkpoint directory or Hub id like google/gemma-4-E2B-it (default: the bundled demo, "
                        "scripts/demo/target)")
    p.add_argument("--model", "-m", dest="target", help=argparse.SUPPRESS)  # vLLM's, mlx-lm's, llama-cli's
    p.add_argument("--assistant", metavar="PATH_OR_HUB_ID",
                   help="the drafter's checkpoint directory or Hub id (default: found by the rule below)")
    p.add_argument("--no-assistant", action="store_true",
                   help="no drafter: plain decoding, greedy or sampled as the settings say")
    p.add_argument("--max-new-tokens", metavar="N", type=int,
                   help="at most N new tokens; more than the context holds is cut to what fits (default: 128)")
    p.add_argument("-n", "--max-tokens", dest="max_new_tokens", type=int, help=argparse.SUPPRESS)  # llama-cli, mlx-lm
    p.add_argument("--num-assistant-tokens", metavar="K", type=int,
                   help="drafts per round (default: the assistant's generation_config.json, else 4)")
    p.add_argument("--schedule", choices=SCHEDULES,
                   help="how the drafts per round adapt: constant K; heuristic, K+2 after a fully accepted round "
                        "and K-1 otherwise; heuristic_transient, the same restarting at K every call; auto, the K "
                        "that measured costs and acceptance say is fastest (default: auto for an int4 target, "
                        "whose verify costs grow with its rows, constant otherwise)")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop on the target's stop ids")
    p.add_argument("--dtype", choices=DTYPE_NAMES,
                   help="the weights' and activations' dtype; auto: the default, bfloat16 on CUDA and for an int4 "
                        "target, whose releases are w4a16, float32 otherwise; float16 is refused (Gemma 4 is "
                        "trained in bfloat16, whose range float16 lacks)")
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
                   help="sampling seed: the token at position n draws noise keyed by (seed, n) only; accepted with "
                        "greedy decoding, where it has no effect (default: 0)")
    p.add_argument("--drafting", choices=DRAFTING,
                   help="sampling with an assistant: argmax drafts reproduce plain sampling token for token; "
                        "sample draws drafts from the drafter, exact in distribution, and is kept more often "
                        "(default: argmax)")
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
    p.add_argument("--tensor-parallel", metavar="N", type=int,
                   help="split the target (and the drafter, where its heads split) across N processes on this "
                        "machine, started by the command itself; torchrun is for several machines (default: one "
                        "process)")
