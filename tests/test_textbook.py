"""The loop's textbook path (tests/textbook_path.py) stays short and free of kernel code, and the textbook
model never imports the speed layer."""

import ast
import re

from tests.textbook_path import REPO, module_file, textbook_path

KERNEL_WORDS = ("mkldnn", "onednn", "gemma4.fast", "_linear_pointwise", "packing")
# Speed tricks that change what a reader sees: a hook bypass, operator counting, a branch on the device type.
SPEED_WORDS = ("__call__ = forward", "aten", "device.type")


def test_the_path_is_short_and_holds_no_kernel_code() -> None:
    path = textbook_path()
    assert {"mtp.speculative", "mtp.accept", "mtp.drafter", "gemma4.model", "gemma4.cache"} <= set(path)
    assert "gemma4.weights" not in path and "mtp.loading" not in path  # the loaders are off the path
    assert not any(m.startswith(("gemma4.fast", "mtp.extras", "gemma4.extras")) for m in path)
    assert sum(path.values()) <= 1520, path  # the sliding ring and chunked prefill are textbook (§15)
    for module in path:
        text = module_file(module).read_text().lower()
        assert not any(word in text for word in KERNEL_WORDS), module
        assert not any(word in text for word in SPEED_WORDS), module


def test_the_readme_states_the_measured_length() -> None:
    """README.md states the path's total line count, the one `python -m tests.textbook_path` prints."""
    found = re.search(r"These files total ([\d,]+) lines", (REPO / "README.md").read_text())
    assert found, "README.md no longer states the path's length"
    assert int(found.group(1).replace(",", "")) == sum(textbook_path().values())


def test_the_model_files_import_no_speed_layer() -> None:
    for name in ("model.py", "norms.py", "moe.py", "cache.py", "generate.py"):
        tree = ast.parse((REPO / "gemma4" / name).read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not any(m and m.startswith("gemma4.fast") for m in imported), name
