"""llama.cpp, the CPU peer of `benchmark.py --only peer` (bench/peer.py): got, built and fed an E2B-geometry file.

- Getting it (`find`): a llama.cpp source tree given by `--peer-llama DIR`, or the one the PyPI sdist of
  llama-cpp-python vendors (`SDIST`: llama.cpp of 2026-10-01, which converts and runs Gemma 4 and its assistant),
  downloaded by pip without building the binding. Either is built once, in place, with CMake: only the two tools
  the section runs (`TOOLS`), CPU only, tuned for this CPU (`GGML_NATIVE`). No compiler, no CMake or no package
  index: the reason, in one line, and the section is skipped.
- Converting (`gguf_files`): llama.cpp's own `convert_hf_to_gguf.py` reads the random pair's target as a Hugging Face
  folder. It wants a Gemma-shaped `tokenizer.json` for the `gemma4` architecture; the random pair has none, so
  `tokenizer` writes one of the full vocabulary's 262,144 pieces (speed does not depend on the words). Then
  `llama-quantize` makes Q4_0 twice: as llama.cpp does by default (the embedding tables Q6_K) and with the token
  embedding, which is the tied head, kept in bfloat16 as Google's w4a16 releases keep it: the like-for-like file.
- Everything is written once under the section's folder and reused while its inputs are unchanged.

Long steps (the build: about 20-30 minutes on 2 cores; converting and quantizing: minutes) print a line as they
start and a progress line at least every `EVERY` seconds.
"""

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

SDIST = "llama-cpp-python==0.3.36"  # vendors llama.cpp 0c1e570 (2026-10-01): Gemma 4 and `draft-mtp`
TOOLS = ("llama-bench", "llama-quantize")
EVERY = 10  # seconds: the longest a long step stays silent
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
               "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF")
# The files `gguf_files` makes: name -> what llama-quantize is asked for (None: the converter's bf16 file itself).
GGUF = {"bf16": None, "q4_0": ("Q4_0",), "q4_0_bf16_head": ("--token-embedding-type", "bf16", "Q4_0")}

Say = Callable[[str], None]


@dataclass(frozen=True)
class LlamaCpp:
    source: Path  # the tree: convert_hf_to_gguf.py, gguf-py/
    bin: Path  # the built tools

    def tool(self, name: str) -> Path:
        return self.bin / name


def find(given: Path | None, cache: Path, threads: int, say: Say) -> LlamaCpp | str:
    """llama.cpp built and ready, or the one-line reason it cannot be here. `given`: a source tree (built in its
    `build/` when the tools are not there); None: the sdist's tree under `cache`, downloaded and built once."""
    if given is not None:
        source = given.resolve()
        if not (source / "convert_hf_to_gguf.py").is_file():
            return f"{source} is not a llama.cpp source tree (no convert_hf_to_gguf.py): give --peer-llama a checkout"
    else:
        unpacked = f"llama_cpp_python-{SDIST.partition('==')[2]}/vendor/llama.cpp"
        source = cache / unpacked
        if not (source / "convert_hf_to_gguf.py").is_file():
            reason = download(cache, say)
            if reason:
                return reason
    build = source / "build"
    llama = LlamaCpp(source, build / "bin")
    if all(llama.tool(t).is_file() for t in TOOLS):
        return llama
    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    if missing:
        return f"no {' and no '.join(missing)} on this machine to build llama.cpp: install them, or give --peer-llama"
    say(f"peer: building llama.cpp's {', '.join(TOOLS)} under {build} (about 20-30 minutes on 2 cores, once)")
    for step in (["cmake", "-S", str(source), "-B", str(build), *CMAKE_FLAGS],
                 ["cmake", "--build", str(build), "-j", str(threads), "--target", *TOOLS]):
        code, tail = run_saying(step, build.parent / "peer-build.log", say, "peer: building llama.cpp")
        if code:
            return f"building llama.cpp failed ({tail}): see {build.parent / 'peer-build.log'}"
    return llama


def download(cache: Path, say: Say) -> str | None:
    """The sdist, unpacked under `cache`; the reason it could not be, or None."""
    cache.mkdir(parents=True, exist_ok=True)
    say(f"peer: downloading {SDIST}'s source (llama.cpp inside) under {cache}")
    code, tail = run_saying([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                             SDIST, "-d", str(cache)], cache / "peer-download.log", say, "peer: downloading")
    archive = cache / f"llama_cpp_python-{SDIST.partition('==')[2]}.tar.gz"
    if code or not archive.is_file():
        return f"pip could not download {SDIST} ({tail}): give --peer-llama a llama.cpp checkout"
    shutil.unpack_archive(archive, cache)
    return None


def run_saying(command: list[str], log: Path, say: Say, doing: str, cwd: Path | None = None) -> tuple[int, str]:
    """Run `command`, its output to `log`; every EVERY seconds a line: what it is doing and its newest output line.
    Returns the exit status and that line."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
        while process.poll() is None:
            try:
                process.wait(EVERY)
            except subprocess.TimeoutExpired:
                say(f"{doing}, {time.monotonic() - start:.0f} s: {last_line(log)}")
    return process.returncode, last_line(log)


def last_line(log: Path) -> str:
    with open(log, "rb") as f:
        f.seek(max(0, f.seek(0, 2) - 4096))
        lines = [line.strip() for line in f.read().decode(errors="replace").splitlines() if line.strip()]
    return lines[-1][:160] if lines else "(no output yet)"


# ---------------------------------------------------------------- the files llama.cpp reads

TOKENIZER_SCHEME = 2  # `tokenizer`'s scheme: files made with another are made again
SPECIALS = {0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 106: "<turn|>", 105: "<|turn>"}
FIRST_ORDINARY = 107  # the ids under it are specials, as in Gemma 4's vocabulary (gemma4/README.md §18)


def tokenizer(vocab: int) -> Tokenizer:
    """A `tokenizer.json` shaped like Gemma 4's as llama.cpp checks it (the converter: a BPE with byte fallback,
    spaces as ▁, a Sequence decoder; the loader: merges) with exactly `vocab` pieces: the specials at their ids,
    the 256 byte pieces, ▁ and the 26 letters, then every longer piece made by one merge of a shorter piece and a
    letter (a, b, .., aa, ab, ..), as many as fill the vocabulary. Speed does not depend on the words."""
    specials = [SPECIALS.get(i, f"<unused{i}>") for i in range(FIRST_ORDINARY)]
    letters = ["▁", *"abcdefghijklmnopqrstuvwxyz"]
    pieces = specials + [f"<0x{b:02X}>" for b in range(256)] + letters
    merges: list[tuple[str, str]] = []
    shorter = letters  # the pieces the next, one letter longer, are merged from
    while len(pieces) < vocab:
        longer = []
        for left in shorter:
            for right in letters[1:]:
                if len(pieces) == vocab:
                    break
                merges.append((left, right))
                pieces.append(left + right)
                longer.append(left + right)
        shorter = longer
    tok = Tokenizer(models.BPE(vocab={p: i for i, p in enumerate(pieces)}, merges=merges, unk_token="<unk>",
                               byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return tok


def gguf_files(llama: LlamaCpp, target_dir: Path, out: Path, say: Say) -> dict[str, Path]:
    """The target of a random pair as llama.cpp files (`GGUF`), made once under `out`: name -> path. The converter
    reads a folder of links to the target's files beside the tokenizer `tokenizer` writes."""
    weights = target_dir / "model.safetensors"
    stamp = {"target": str(target_dir.resolve()), "bytes": weights.stat().st_size, "mtime": weights.stat().st_mtime,
             "tokenizer": TOKENIZER_SCHEME, "llama.cpp": str(llama.source)}
    if out.is_dir() and (not (out / "made.json").is_file() or json.loads((out / "made.json").read_text()) != stamp):
        shutil.rmtree(out)  # made from other inputs: made again
    out.mkdir(parents=True, exist_ok=True)
    (out / "made.json").write_text(json.dumps(stamp))
    folder = out / "hf"
    folder.mkdir(exist_ok=True)
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        link = folder / name
        if (target_dir / name).is_file() and not link.exists():
            link.symlink_to((target_dir / name).resolve())
    if not (folder / "tokenizer.json").is_file():
        vocab = json.loads((target_dir / "config.json").read_text())["vocab_size"]
        tokenizer(vocab).save(str(folder / "tokenizer.json"))
    files = {name: out / f"target-{name}.gguf" for name in GGUF}
    if not files["bf16"].is_file():
        say(f"peer: converting {target_dir} to {files['bf16']} (llama.cpp's convert_hf_to_gguf.py)")
        partial = files["bf16"].with_suffix(".partial")
        code, tail = run_saying([sys.executable, str(llama.source / "convert_hf_to_gguf.py"), str(folder),
                                 "--outtype", "bf16", "--outfile", str(partial)], out / "convert.log", say,
                                "peer: converting", cwd=llama.source)
        if code:
            raise RuntimeError(f"llama.cpp's converter failed ({tail}): see {out / 'convert.log'}")
        partial.rename(files["bf16"])  # a file that exists is whole: an interrupted run starts it again
    for name, how in GGUF.items():
        if how is None or files[name].is_file():
            continue
        say(f"peer: quantizing to {files[name].name} (llama-quantize {' '.join(how)})")
        partial = files[name].with_suffix(".partial")
        code, tail = run_saying([str(llama.tool("llama-quantize")), *how[:-1], str(files["bf16"]), str(partial),
                                 how[-1]], out / f"quantize-{name}.log", say, "peer: quantizing")
        if code:
            raise RuntimeError(f"llama-quantize failed ({tail}): see {out / f'quantize-{name}.log'}")
        partial.rename(files[name])
    return files
