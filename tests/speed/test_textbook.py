"""The textbook as it runs (tests/textbook_path.py: the files whose functions execute while README.md's first
Python block generates) stays small in code tokens and narrow, holds no kernel code, no engine and none of
the optional features; the textbook loop is one row in few lines and parameters; its seams stay seams: one
shape of positions, no process-wide switch, the speed layer only when asked for."""

import ast
import inspect
import re
import subprocess
import sys

import gemma4
import gemma4.sampling
import mtp
from gemma4.generate import sample_generate
from mtp.speculative import speculative_generate, speculative_rounds
from tests.textbook_path import REPO, WIDTH, loaded, measure

LIMIT = 33_500  # code tokens of the path as it runs
BODY_LINES = 80  # the textbook loop's body, comments included
PARAMETERS = 8
KERNEL_WORDS = ("mkldnn", "onednn", "gemma4.fast", "_linear_pointwise", "packing")
# Speed tricks that change what a reader sees: a hook bypass, operator counting, a branch on the device type.
SPEED_WORDS = ("__call__ = forward", "aten", "device.type", "non_blocking")
# What must not run for README's block: the engine, loaders, media, the speed layer, the other schedules.
OFF_THE_PATH = ("gemma4/fast/", "gemma4/engine/", "gemma4/vision/", "gemma4/parallel/",
                "gemma4/audio/", "gemma4/weights.py", "gemma4/tokenizer.py", "gemma4/config_file.py",
                "mtp/engine/", "mtp/extras/", "mtp/heuristic.py", "mtp/auto_schedule.py",
                "mtp/loading.py")
# The engine's own names: none is an identifier in the path's code.
ENGINE_IDENTIFIERS = {"slack", "slot_positions", "claim", "Slots", "EMPTY", "soft", "both_ways", "media",
                      "non_blocking", "start_pos", "RingCache"}
# The textbook's primitives: one row, so no parameter for rows, media, or a ring's slack.
PRIMITIVES = ("gemma4.model.Gemma4Model.forward", "gemma4.cache.KVCache.__init__", "gemma4.cache.KVCache.write",
              "mtp.drafter.Drafter.propose", "gemma4.sampling.sample", "gemma4.generate.sample_generate",
              "mtp.speculative.speculative_rounds")
ROW_PARAMETERS = ("batch", "rows", "start_pos", "soft", "media", "images", "audio", "slack", "positions",
                  "samplers", "prefill_chunk")
# What the one-row loops know nothing of.
ENGINE_WORDS = ("batch", "pad", "media", "images", "audio", "chunk", "perf_counter", "device")
POSITION_NAMES = ("start", "length", "position", "key_positions", "end")


def test_the_path_as_run_is_small_narrow_and_holds_no_kernel_code() -> None:
    """Within its budget of code tokens, no line wider than 100 columns, no kernel code, no identifier of the
    engine's, and README states its size. No isinstance check on a position, a length, a start or a key set anywhere on it: they are
    tensors. (One test: measuring runs README's block in a fresh interpreter.)"""
    path = measure()
    assert {"gemma4/generate.py", "gemma4/model.py", "gemma4/cache.py", "gemma4/sampling.py", "mtp/speculative.py",
            "mtp/accept.py", "mtp/drafter.py", "mtp/schedule.py"} <= set(path), path
    assert not [name for name in path if name.startswith(OFF_THE_PATH)], path
    assert sum(tokens for _, _, tokens in path.values()) <= LIMIT, path
    assert not {name: wide for name, (_, wide, _) in path.items() if wide}, f"lines wider than {WIDTH}"
    for name in path:
        text = (REPO / name).read_text().lower()
        assert not any(word in text for word in KERNEL_WORDS + SPEED_WORDS), name
    for name in path:  # no name of the engine's is an identifier in the path's code
        tree = ast.parse((REPO / name).read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
            {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} | \
            {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in n.args + n.kwonlyargs}
        assert not names & ENGINE_IDENTIFIERS, (name, names & ENGINE_IDENTIFIERS)
    for name in path:
        for node in ast.walk(ast.parse((REPO / name).read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
                argument = ast.unparse(node.args[0]).lower()
                assert not any(word in argument for word in POSITION_NAMES), (name, ast.unparse(node))
    # README.md states the code tokens `python -m tests.textbook_path` counts, in KB to one decimal.
    readme = (REPO / "README.md").read_text()
    found = re.search(r"([\d.]+) KB of code tokens", readme)
    assert found, "README.md no longer states the path's size"
    assert float(found.group(1)) == round(sum(tokens for _, _, tokens in path.values()) / 1000, 1)
    assert "python -m tests.textbook_path" in readme


def test_the_textbook_primitives_are_one_row() -> None:
    """Structure, not words: the primitives under the textbook loop take no batch, media or slack argument (and
    no name of the engine's is an identifier in the code of the path as it runs: the test above, which runs the
    path once for both)."""
    import importlib
    for dotted in PRIMITIVES:
        parts = dotted.split(".")
        obj = importlib.import_module(".".join(parts[:2]))
        for name in parts[2:]:
            obj = getattr(obj, name)
        params = set(inspect.signature(obj).parameters)
        assert not params & set(ROW_PARAMETERS), (dotted, params & set(ROW_PARAMETERS))


def test_the_textbook_loop_is_one_short_row() -> None:
    """The loop's body (comments included) is at most 80 lines and takes at most 8 parameters; its numbered
    steps are comments on their own lines, in order; it knows no batch, pad, media, chunk, clock or device."""
    source = inspect.getsource(speculative_rounds)
    body = ast.parse(source).body[0].body
    first = body[1] if isinstance(body[0], ast.Expr) else body[0]  # after the docstring
    assert body[-1].end_lineno - first.lineno + 1 <= BODY_LINES
    for function in (speculative_rounds, speculative_generate):
        assert len(inspect.signature(function).parameters) <= PARAMETERS, function
    steps = [int(m.group(1)) for m in re.finditer(r"^\s*# (\d)\. ", source, re.M)]
    assert steps == list(range(8)), steps
    for loop in (speculative_rounds, sample_generate):
        code = re.sub(r'"""[\s\S]*?"""|#.*', "", inspect.getsource(loop)).lower()
        words = re.findall(r"[a-z_]+", code)
        assert not [w for w in words for engine in ENGINE_WORDS if engine in w.split("_")], loop


def test_no_process_wide_switch() -> None:
    """The speed layer and the commands never assign to an attribute of a gemma4 or mtp module (as
    `sampling.X = ...` did): what they change, they change on one model."""
    for path in [*(REPO / "gemma4" / "fast").glob("*.py"), *(REPO / "scripts").rglob("*.py")]:
        tree = ast.parse(path.read_text())
        modules = set()  # the local names bound to a project module in this file
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(("gemma4", "mtp")):
                modules |= {a.asname or a.name for a in node.names if (REPO / node.module.replace(".", "/")
                                                                        / f"{a.name}.py").exists()}
            elif isinstance(node, ast.Import):
                modules |= {a.asname or a.name.split(".")[0] for a in node.names
                            if a.name.startswith(("gemma4", "mtp"))}
        for node in ast.walk(tree):
            for target in node.targets if isinstance(node, ast.Assign) else []:
                owner = target.value if isinstance(target, ast.Attribute) else None
                assert not (isinstance(owner, ast.Name) and owner.id in modules), (path, ast.unparse(node))
    flags = [name for name, value in vars(gemma4.sampling).items() if isinstance(value, bool)]
    assert not flags, flags


def test_the_model_files_import_no_speed_layer_and_gemma4_no_mtp() -> None:
    for name in ("model.py", "norms.py", "moe.py", "cache.py", "generate.py", "sampling.py", "engine/rows.py",
                 "engine/decode.py", "engine/media.py", "engine/forward.py", "engine/ring.py"):
        tree = ast.parse((REPO / "gemma4" / name).read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not any(m and m.startswith(("gemma4.fast", "mtp")) for m in imported), name
    for path in (REPO / "gemma4").rglob("*.py"):
        if path.parent.name != "fast":  # the static steps name the drafter's type, for checking only
            assert not re.search(r"^\s*(from|import) mtp\b", path.read_text(), re.M), path


def test_the_public_names_load_their_modules_on_use() -> None:
    """`import gemma4` and `import mtp` load nothing but themselves; a public name loads its own module;
    `DraftLength(4)` imports neither the auto nor the heuristic schedule."""
    assert loaded("gemma4") == ["gemma4"] and loaded("mtp") == ["mtp"]
    assert {"load_target", "greedy_generate", "KVCache"} <= set(dir(gemma4)), "dir() lists the public names"
    assert {"load_drafter", "speculative_generate", "Conversation"} <= set(dir(mtp))
    assert "gemma4.weights" in loaded("gemma4; gemma4.load_target")
    constant = loaded("mtp; mtp.DraftLength(4)")
    assert "mtp.schedule" in constant and not {"mtp.auto_schedule", "mtp.heuristic"} & set(constant), constant
    assert "mtp.auto_schedule" in loaded("mtp; mtp.DraftLength(4, 'auto')")


def test_the_loaders_build_the_textbook_modules_unless_asked() -> None:
    """What you read is what runs: `load_target` and `load_drafter` give gemma4/model.py's modules (no module
    of the speed layer), `fast=True` the speed layer."""
    code = ("import sys; from gemma4 import load_target; from mtp import load_drafter; "
            "t = load_target('scripts/demo/target'); d = load_drafter('scripts/demo/assistant', target=t); "
            "print(sorted({type(m).__module__ for x in (t, d) for m in x.modules()}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    modules = ast.literal_eval(out.stdout.strip())
    assert not [m for m in modules if m.startswith("gemma4.fast")] and "gemma4.model" in modules, modules
