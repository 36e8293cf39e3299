"""The textbook path as it runs: every project module whose functions execute during the generation calls of
README.md's first Python block (greedy, sampled, speculative greedy and speculative sampled), found by a
`sys.setprofile` hook in a fresh interpreter, with its size in code tokens.

Code tokens are the bytes of a module's Python tokens, one space between two tokens and one newline ending each
logical line: comments, docstrings and every other run of whitespace cost nothing, so joining lines gains nothing.
`python -m tests.textbook_path` prints each module (lines, lines wider than 100 columns, code tokens) and the total.
"""

import ast
import io
import json
import os
import re
import subprocess
import sys
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("gemma4", "mtp")
GENERATION_CALLS = ("greedy_generate", "sample_generate", "speculative_generate")
WIDTH = 100  # the widest a line on the path may be

# Run in a fresh interpreter at the repository's root: README's block, with the hook counting only what runs
# inside one of its generation calls (loading, the tokenizer and printing are not the path).
HOOK = """
import json, sys
from pathlib import Path
root, calls, seen, depth = Path.cwd().resolve(), set(CALLS), {}, [0]
prefix, looked = str(root), set()  # looked: the files already placed (a path is resolved once, not per call)

def hook(frame, event, arg):
    code = frame.f_code
    if event == "call":
        if code.co_name in calls and code.co_filename.startswith(prefix):
            depth[0] += 1
        if depth[0] and code.co_filename not in looked:
            looked.add(code.co_filename)
            path = Path(code.co_filename).resolve()
            if path.is_relative_to(root) and path.relative_to(root).parts[0] in PACKAGES:
                seen.setdefault(str(path.relative_to(root)), None)
    elif event == "return" and code.co_name in calls and code.co_filename.startswith(prefix):
        depth[0] -= 1

sys.setprofile(hook)
exec(compile(BLOCK, "README.md", "exec"), {"__name__": "__readme__"})
sys.setprofile(None)
print(json.dumps(list(seen)))
"""


def readme_block() -> str:
    """README.md's first Python block, as a reader copies it."""
    found = re.search(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    assert found, "README.md has no Python block"
    return found.group(1)


def run_path() -> list[str]:
    """The project files (relative to the repository) whose functions ran in README's generation calls, in the
    order they first ran."""
    code = HOOK.replace("CALLS", repr(GENERATION_CALLS)).replace("PACKAGES", repr(PACKAGES))
    code = code.replace("BLOCK", repr(readme_block()))
    env = os.environ | {"PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"README.md's first Python block failed:\n{out.stderr}")
    return json.loads(out.stdout.splitlines()[-1])


def loaded(start: str) -> list[str]:
    """The project modules a fresh interpreter holds after `import sys, <start>` (statements may follow
    `start` after a semicolon), in import order."""
    code = f"import sys, {start}; print('\\n'.join(m for m in sys.modules if m.split('.')[0] in {PACKAGES!r}))"
    env = os.environ | {"PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    return out.stdout.split()


def docstrings(tree: ast.Module) -> set[tuple[int, int]]:
    """Where each docstring (module, class, function) starts: (line, column)."""
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    out = set()
    for node in ast.walk(tree):
        first = node.body[0] if isinstance(node, kinds) and node.body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            out.add((first.lineno, first.col_offset))
    return out


def code_tokens(source: str) -> int:
    """The bytes of the source's tokens without comments and docstrings: one space between tokens, one newline
    after each logical line."""
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING, tokenize.ENDMARKER)
    docs, total, first_on_line = docstrings(ast.parse(source)), 0, True
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in skip or (token.type == tokenize.STRING and token.start in docs):
            continue
        if token.type == tokenize.NEWLINE:
            total, first_on_line = total + (not first_on_line), True
            continue
        total += len(token.string.encode()) + (not first_on_line)
        first_on_line = False
    return total


def wide_lines(source: str) -> list[int]:
    return [i for i, line in enumerate(source.splitlines(), 1) if len(line) > WIDTH]


def measure() -> dict[str, tuple[int, int, int]]:
    """File -> (lines, lines wider than WIDTH, code tokens), for every file on the path as run."""
    out = {}
    for name in run_path():
        source = (REPO / name).read_text()
        out[name] = (len(source.splitlines()), len(wide_lines(source)), code_tokens(source))
    return out


if __name__ == "__main__":
    path = measure()
    print(f"{'lines':>6} {'wide':>5} {'code tokens':>12}  file")
    for name, (lines, wide, tokens) in path.items():
        print(f"{lines:6d} {wide:5d} {tokens:12,d}  {name}")
    totals = [sum(v[i] for v in path.values()) for i in range(3)]
    print(f"{totals[0]:6d} {totals[1]:5d} {totals[2]:12,d}  total, {len(path)} files")
