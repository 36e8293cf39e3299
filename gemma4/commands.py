"""The commands `pip install -e .` puts on the PATH (pyproject.toml, [project.scripts]): `gemma4-generate`,
`gemma4-chat` and `gemma4-benchmark` run this checkout's scripts/generate.py, chat.py and benchmark.py, exactly as
`python scripts/NAME.py` does, with the same flags. The scripts live beside the packages, not in them: an install
from a wheel, which has no scripts/, says so in one line."""

import runpy
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def run(name: str) -> None:
    script = SCRIPTS / f"{name}.py"
    if not script.is_file():
        print(f"error: {script} is not here: the gemma4-* commands run the scripts of a source checkout; install "
              f"with pip install -e . in a clone of the project", file=sys.stderr)
        sys.exit(2)
    sys.path.insert(0, str(SCRIPTS))  # the scripts import their helpers (cli/, bench/) as `python scripts/...` does
    sys.argv[0] = str(script)
    runpy.run_path(str(script), run_name="__main__")


def generate() -> None:
    run("generate")


def chat() -> None:
    run("chat")


def benchmark() -> None:
    run("benchmark")
