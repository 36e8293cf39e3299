"""Media without the Hub: `generate.py --image`, `--audio` and `--video-frames` on the bundled tiny multimodal
pair in scripts/demo/media (an E2B-shaped target with a vision tower, an audio tower, a chat template and a
tokenizer, and its assistant), written with random weights: its words are noise. What it shows is the path
a release takes: each file read, turned into its soft tokens by its tower, placed in the prompt's turn,
decoded with the drafter. Images need Pillow (`pip install -e ".[images]"`).

    python scripts/media_demo.py [generate.py's flags, e.g. --max-new-tokens 32 --json]
"""

import os
import shlex
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MEDIA = HERE / "demo" / "media"


def shown(path: Path) -> str:
    """A path as the text demo shows its own: relative to the working directory when it lies below it."""
    return os.path.relpath(path) if path.is_relative_to(Path.cwd()) else str(path)


def command(extra: list[str]) -> list[str]:
    """The generate.py command line this demo runs (generate.py prints its paths as given)."""
    return [sys.executable, shown(HERE / "generate.py"), "--target", shown(MEDIA / "target"),
            "--assistant", shown(MEDIA / "assistant"), "--image", shown(MEDIA / "picture.png"),
            "--audio", shown(MEDIA / "tone.wav"), "--video-frames", shown(MEDIA / "frames"),
            "--prompt", "Describe the picture, the clip and the video.",
            *([] if "--max-new-tokens" in extra else ["--max-new-tokens", "24"]), *extra]


def main(extra: list[str]) -> int:
    if "--json" not in extra:  # --json keeps stderr quiet
        print("note: scripts/demo/media is a tiny multimodal pair with random weights: its words are noise. It "
              "shows an image, a clip and a video's frames read, turned into soft tokens by their towers and "
              "decoded, offline.", file=sys.stderr)
        print("$ " + shlex.join(["python", *command(extra)[1:]]), file=sys.stderr)
    return subprocess.run(command(extra)).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
