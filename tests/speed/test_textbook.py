"""The loop's textbook path (tests/textbook_path.py: what `import mtp.speculative` loads) stays short, holds no
kernel code and none of the optional features, and its seams stay seams: one shape of positions, no process-wide
switch, a loop of few parameters. The textbook model never imports the speed layer."""

import ast
import inspect
import re

import gemma4.sampling
from mtp.speculative import speculative_rows
from tests.textbook_path import REPO, loaded, module_file, textbook_path

LIMIT = 1500  # lines loaded by `import mtp.speculative`, the packages' __init__s included
KERNEL_WORDS = ("mkldnn", "onednn", "gemma4.fast", "_linear_pointwise", "packing")
# Speed tricks that change what a reader sees: a hook bypass, operator counting, a branch on the device type.
SPEED_WORDS = ("__call__ = forward", "aten", "device.type")
# What the loop must not load: loaders, the tokenizer, the config reader, the conversation and its cache, media,
# the speed layer, the heuristic and auto schedules, batches' settings helper and plain decoding's wrappers.
OFF_THE_PATH = ("gemma4.weights", "mtp.loading", "gemma4.tokenizer", "gemma4.config_file", "mtp.extras",
                "gemma4.vision", "gemma4.media", "gemma4.fast", "mtp.heuristic", "mtp.auto_schedule")
POSITION_NAMES = ("start", "length", "position", "keys", "end")


def test_the_path_is_short_and_holds_no_kernel_code() -> None:
    path = textbook_path()
    assert {"gemma4", "mtp", "mtp.speculative", "mtp.accept", "mtp.drafter", "gemma4.model", "gemma4.cache",
            "mtp.schedule"} <= set(path)
    assert not [m for m in path if m.startswith(OFF_THE_PATH)], path
    assert sum(path.values()) <= LIMIT, path
    for module in path:
        text = module_file(module).read_text().lower()
        assert not any(word in text for word in KERNEL_WORDS), module
        assert not any(word in text for word in SPEED_WORDS), module


def test_the_readme_states_the_measured_length() -> None:
    """README.md states the lines `python -m tests.textbook_path` counts."""
    found = re.search(r"`import mtp.speculative`\s+loads\s+([\d,]+)\s+lines", (REPO / "README.md").read_text())
    assert found, "README.md no longer states the path's length"
    assert int(found.group(1).replace(",", "")) == sum(textbook_path().values())


def test_positions_have_one_shape() -> None:
    """No isinstance check on a position, a length, a start or a key set anywhere on the path: they are tensors."""
    for module in textbook_path():
        for node in ast.walk(ast.parse(module_file(module).read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
                name = ast.unparse(node.args[0]).lower()
                assert not any(word in name for word in POSITION_NAMES), (module, ast.unparse(node))


def test_no_process_wide_switch() -> None:
    """The speed layer and the commands never assign to an attribute of a textbook module (as `sampling.X = ...`
    did): what they change, they change on one model."""
    textbook = set(textbook_path())
    for path in [*(REPO / "gemma4" / "fast").glob("*.py"), *(REPO / "scripts").rglob("*.py")]:
        tree = ast.parse(path.read_text())
        modules = set()  # the local names bound to a textbook module in this file
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                modules |= {a.asname or a.name for a in node.names if f"{node.module}.{a.name}" in textbook}
            elif isinstance(node, ast.Import):
                modules |= {a.asname or a.name.split(".")[0] for a in node.names if a.name in textbook}
        for node in ast.walk(tree):
            for target in node.targets if isinstance(node, ast.Assign) else []:
                owner = target.value if isinstance(target, ast.Attribute) else None
                assert not (isinstance(owner, ast.Name) and owner.id in modules), (path, ast.unparse(node))
    flags = [name for name, value in vars(gemma4.sampling).items() if isinstance(value, bool)]
    assert not flags, flags


def test_the_loop_takes_few_parameters() -> None:
    assert len(inspect.signature(speculative_rows).parameters) <= 8


def test_the_model_files_import_no_speed_layer() -> None:
    for name in ("model.py", "norms.py", "moe.py", "cache.py", "rows.py", "generate.py", "media.py"):
        tree = ast.parse((REPO / "gemma4" / name).read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not any(m and m.startswith("gemma4.fast") for m in imported), name


def test_the_public_names_load_their_modules_on_use() -> None:
    """`import gemma4` and `import mtp` load nothing but themselves; a public name loads its own module."""
    assert loaded("gemma4") == ["gemma4"] and loaded("mtp") == ["mtp"]
    assert "gemma4.weights" in loaded("gemma4; gemma4.load_target")
