"""scripts/media_demo.py: media without the Hub, on the bundled tiny multimodal pair (scripts/demo/media): an image,
a clip and a video's frames go through their towers into one prompt and decode, offline; the run says its words
are noise, and under --json stderr stays quiet."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "media_demo.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--max-new-tokens", "6", *args], capture_output=True,
                          text=True, timeout=300)


def test_every_kind_of_medium_runs_offline() -> None:
    done = run("--json", "--temperature", "0", "--compare", "--ignore-eos")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    result = json.loads(done.stdout)
    assert [m["tokens"] for m in result["images"]] == [63] and [m["tokens"] for m in result["audio"]] == [25]
    assert result["video"]["frames"] == ["00:00", "00:01", "00:02", "00:03"] and result["video"]["tokens"] == 240
    assert len(result["tokens"]) == 6 and result["identical"]  # greedy speculative == plain, media included


def test_it_says_its_words_are_noise() -> None:
    done = run()
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert "its words are noise" in lines[0] and lines[1].startswith("$ python scripts/generate.py --target ")
    assert any(line.startswith("images     picture.png (63 tokens)") for line in lines), done.stderr
    assert any(line.startswith("audio      tone.wav (25 tokens)") for line in lines), done.stderr
