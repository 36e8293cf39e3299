"""The loop's textbook path: every project module that `import mtp.speculative` loads (its `sys.modules` in a fresh
interpreter, the packages' `__init__`s included), with their line counts, in the order they were first imported.
`python -m tests.textbook_path` prints each and the total."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
START = "mtp.speculative"
PACKAGES = ("gemma4", "mtp")
LIST = f"import sys, {START}; print('\\n'.join(m for m in sys.modules if m.split('.')[0] in {PACKAGES!r}))"


def module_file(name: str) -> Path:
    path = REPO.joinpath(*name.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def loaded(start: str = START) -> list[str]:
    """The project modules a fresh interpreter holds after importing `start`, in import order."""
    env = os.environ | {"PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    code = LIST.replace(START, start)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    return out.stdout.split()


def textbook_path() -> dict[str, int]:
    """Module -> its line count, for every module on the path."""
    return {m: len(module_file(m).read_text().splitlines()) for m in loaded()}


if __name__ == "__main__":
    path = textbook_path()
    for module, lines in path.items():
        print(f"{lines:5d}  {module_file(module).relative_to(REPO)}")
    print(f"{sum(path.values()):5d}  total")
