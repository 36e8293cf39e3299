"""The loop's textbook path (tests/textbook_path.py) stays short and free of kernel code, and the textbook
model never imports the speed layer."""

import ast
import os
import re
import subprocess
import sys

from tests.textbook_path import REPO, module_file, textbook_path

KERNEL_WORDS = ("mkldnn", "onednn", "gemma4.fast", "_linear_pointwise", "packing")
# Speed tricks that change what a reader sees: a hook bypass, operator counting, a branch on the device type.
SPEED_WORDS = ("__call__ = forward", "aten", "device.type")


def test_the_path_is_short_and_holds_no_kernel_code() -> None:
    path = textbook_path(types=False)  # the run-time imports: what runs, the limit below
    assert {"mtp.speculative", "mtp.accept", "mtp.drafter", "gemma4.model", "gemma4.cache"} <= set(path)
    assert "gemma4.weights" not in path and "mtp.loading" not in path  # the loaders are off the path
    assert not any(m.startswith(("gemma4.fast", "mtp.extras", "gemma4.extras")) for m in path)
    # batches joined the path at 1,500 lines; images (the both-ways mask, the soft tokens, the prefill's chunks, the soft-token check) at
    # 1,520; sampling that never waits for a GPU (FREE_READS: no `nonzero`, a verify's draws read at once) and one
    # argmax read a batch round or step at 1,543 (with a bfloat16 head capped in float32)
    assert sum(path.values()) <= 1543, path
    for module in path:
        text = module_file(module).read_text().lower()
        assert not any(word in text for word in KERNEL_WORDS), module
        assert not any(word in text for word in SPEED_WORDS), module


def test_the_readme_states_the_measured_length() -> None:
    """README.md states the whole path's line count, the total `python -m tests.textbook_path` prints first."""
    found = re.search(r"These files total ([\d,]+) lines", (REPO / "README.md").read_text())
    assert found, "README.md no longer states the path's length"
    assert int(found.group(1).replace(",", "")) == sum(textbook_path().values())


def test_the_model_files_import_no_speed_layer() -> None:
    for name in ("model.py", "norms.py", "moe.py", "cache.py", "generate.py"):
        tree = ast.parse((REPO / "gemma4" / name).read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not any(m and m.startswith("gemma4.fast") for m in imported), name


def test_importing_the_loop_loads_no_speed_layer() -> None:
    """In a fresh interpreter, `import mtp.speculative` (and with it the `gemma4` and `mtp` packages' re-exports)
    loads no gemma4.fast module: the loaders import it when they apply it."""
    code = "import sys, mtp.speculative; print(sorted(m for m in sys.modules if m.startswith('gemma4.fast')))"
    env = os.environ | {"PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
