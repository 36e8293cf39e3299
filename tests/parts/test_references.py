"""Every reference in the project's prose resolves: the Markdown files and the docstrings of gemma4/, mtp/ and
scripts/ name files, modules and attributes that exist. Only text in backticks is read, and only three forms of it:

- a repo path, `gemma4/model.py`, `tests/` or `tests/parts/test_cache.py::test_name` (a trailing `:line` or ` §n`
  is dropped; the names after `::` must be defined in the file): the path exists. Its first part is a top-level
  folder of the repo, or a folder beside the file that names it (tests/README.md's `parity/test_target.py`);
- a dotted name, `gemma4.engine.forward.forward_rows` or `mtp.speculative`: importable, the longest importable
  prefix being the module and the rest attributes of it;
- `Class.attr` or `Class.attr()`: some class of that name in gemma4/, mtp/ or scripts/ (read with ast) defines
  `attr`: a method, property, class attribute or field, a `self.attr =` in its methods, or the same on a base
  class of the repo or on nn.Module and the like. `F.` is torch.nn.functional, `M.` int4.py's placeholder module.

Anything else in backticks (commands, formulas, text with spaces, calls with arguments) is left alone.
"""

import ast
import enum
import importlib
import re
import subprocess
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
TOP_DIRS = ("gemma4", "mtp", "scripts", "tests", ".ci")
CODE_DIRS = ("gemma4", "mtp", "scripts")

SPAN = re.compile(r"`([^`]+)`")
DOTTED = re.compile(r"(?:gemma4|mtp)(?:\.[A-Za-z_]\w*)+")
CLASS_ATTR = re.compile(r"([A-Z]\w*)\.([A-Za-z_]\w*)")
LINE_OR_SECTION = re.compile(r"(?::\d+|\s+§\s*\d+)$")

# Names from outside the repo that the prose writes as `Name.attr`: the module or class they stand for, checked
# like a dotted name (transformers, the parity tests' oracle, for the classes our modules follow). None: a
# placeholder (gemma4/int4.py's quantized module `M`).
OUTSIDE = {
    "F": "torch.nn.functional",
    "Gemma4AudioModel": "transformers.models.gemma4.modeling_gemma4.Gemma4AudioModel",
    "Gemma4UnifiedModel": "transformers.models.gemma4_unified.modeling_gemma4_unified.Gemma4UnifiedModel",
    "M": None,
}
# Bases from outside the repo whose attributes a class of the repo inherits.
OUTSIDE_BASES = {"Module": torch.nn.Module, "NamedTuple": tuple, "Enum": enum.Enum, "IntEnum": enum.IntEnum}


def project_files(*patterns: str) -> list[Path]:
    """Files git tracks or would track (new files not yet added count), that exist in the work tree."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *patterns],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()
    return sorted({ROOT / name for name in listed if (ROOT / name).is_file()})


def python_files() -> list[Path]:
    return project_files(*(f"{d}/*.py" for d in CODE_DIRS))


# ---- where references are written: (file, line of the text's start, text)


def markdown_passages(path: Path) -> Iterator[tuple[Path, int, str]]:
    """The file's text with fenced code blocks blanked (line numbers kept)."""
    lines, fenced = [], False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            line = ""
        lines.append("" if fenced else line)
    yield path, 1, "\n".join(lines)


def docstring_passages(path: Path) -> Iterator[tuple[Path, int, str]]:
    """The module's, classes' and functions' docstrings, as written (before indentation is stripped)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(getattr(first.value, "value", None), str):
                yield path, first.value.lineno, first.value.value


def references() -> Iterator[tuple[str, str, Path]]:
    """(file:line, the text in backticks, the file) of every backticked span."""
    passages = [p for md in project_files("*.md") for p in markdown_passages(md)]
    passages += [p for py in python_files() for p in docstring_passages(py)]
    for path, start, text in passages:
        for span in SPAN.finditer(text):
            line = start + text.count("\n", 0, span.start())
            yield f"{path.relative_to(ROOT)}:{line}", span.group(1), path


# ---- (a) paths


def path_reference(ref: str, writer: Path) -> tuple[Path, str, list[str]] | None:
    """(folder it is relative to, path, names after `::`) if `ref` is a path of the repo, else None."""
    ref = LINE_OR_SECTION.sub("", ref)
    if "/" not in ref or any(c.isspace() for c in ref):
        return None
    path, *names = ref.split("::")
    first = path.split("/")[0]
    if first in TOP_DIRS:
        return ROOT, path, names
    if first and writer.parent != ROOT and (writer.parent / first).is_dir():
        return writer.parent, path, names
    return None


def check_path(base: Path, path: str, names: list[str]) -> str | None:
    found = sorted(base.glob(path.rstrip("/"))) if "*" in path else [base / path]
    if not found or not found[0].exists():
        return "no such path"
    if path.endswith("/") and not found[0].is_dir():
        return "not a folder"
    if not names:
        return None
    defined = {node.name for node in ast.walk(ast.parse(found[0].read_text())) if hasattr(node, "name")}
    missing = [name for name in names if name not in defined]
    return f"{path} defines no {', '.join(missing)}" if missing else None


# ---- (b) dotted names


def check_dotted(ref: str) -> str | None:
    parts = ref.split(".")
    for end in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:end]))
        except ModuleNotFoundError as e:
            if not ref.startswith(e.name or ""):  # the module exists but a package it imports does not
                raise
            continue
        for i, attr in enumerate(parts[end:], start=end):
            if not hasattr(obj, attr):
                return f"{'.'.join(parts[:i])} has no attribute {attr}"
            obj = getattr(obj, attr)
        return None
    return "no such module"


# ---- (c) Class.attr


def base_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):  # Generic[T] and the like
        return base_name(node.value)
    return None


def assigned_names(target: ast.expr, self_only: bool) -> Iterator[str]:
    """Names a target assigns: `x` (class body) or `self.x` (methods)."""
    if isinstance(target, (ast.Tuple, ast.List)):
        for t in target.elts:
            yield from assigned_names(t, self_only)
    elif isinstance(target, ast.Name) and not self_only:
        yield target.id
    elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
        yield target.attr


def class_attributes(cls: ast.ClassDef) -> set[str]:
    """What a class's body defines, and what its methods assign to `self`."""
    names = set()
    for stmt in cls.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(stmt.name)
        elif isinstance(stmt, ast.Assign):
            names.update(n for t in stmt.targets for n in assigned_names(t, self_only=False))
        elif isinstance(stmt, ast.AnnAssign):
            names.update(assigned_names(stmt.target, self_only=False))
    for method in cls.body:
        if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(method):
                if isinstance(node, ast.Assign):
                    names.update(n for t in node.targets for n in assigned_names(t, self_only=True))
                elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                    names.update(assigned_names(node.target, self_only=True))
                elif (  # self.register_buffer("name", ...), register_parameter, register_module
                    isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr.startswith("register_") and node.args
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                ):
                    names.add(node.args[0].value)
    return names


@cache
def classes() -> dict[str, list[tuple[set[str], list[str]]]]:
    """Class name -> (attributes, base names) of every class of that name in gemma4/, mtp/, scripts/. A module's
    instance of one (`NOW = Now()`) is listed under its own name, with the class as its base."""
    found: dict[str, list[tuple[set[str], list[str]]]] = {}
    for path in python_files():
        module = ast.parse(path.read_text())
        for node in ast.walk(module):
            if isinstance(node, ast.ClassDef):
                bases = [b for b in map(base_name, node.bases) if b]
                found.setdefault(node.name, []).append((class_attributes(node), bases))
        for node in module.body:  # NOW = Now()
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                made_by = base_name(node.value.func)
                for target in node.targets:
                    if isinstance(target, ast.Name) and made_by:
                        found.setdefault(target.id, []).append((set(), [made_by]))
    return found


def defines(cls: str, attr: str, seen: frozenset[str] = frozenset()) -> bool:
    if cls in OUTSIDE_BASES:
        return hasattr(OUTSIDE_BASES[cls], attr)
    if cls in seen:
        return False
    return any(
        attr in names or any(defines(b, attr, seen | {cls}) for b in bases)
        for names, bases in classes().get(cls, [])
    )


def check_class_attr(cls: str, attr: str) -> str | None:
    if cls in OUTSIDE:
        return OUTSIDE[cls] and check_dotted(f"{OUTSIDE[cls]}.{attr}")
    if cls not in classes():
        return f"no class {cls} in {', '.join(d + '/' for d in CODE_DIRS)}"
    return None if defines(cls, attr) else f"{cls} defines no {attr}"


# ---- the test


def checker(ref: str, writer: Path) -> Callable[[], str | None] | None:
    """How to check a backticked text, or None if it is none of the three forms."""
    if path := path_reference(ref, writer):
        return lambda: check_path(*path)
    bare = ref.removesuffix("()")
    if DOTTED.fullmatch(bare):
        return lambda: check_dotted(bare)
    if m := CLASS_ATTR.fullmatch(bare):
        return lambda: check_class_attr(*m.groups())
    return None


def test_every_reference_resolves() -> None:
    checked, failures = 0, []
    for where, ref, writer in references():
        check = checker(ref, writer)
        if check is None:
            continue
        checked += 1
        if reason := check():
            failures.append(f"{where}: `{ref}`: {reason}")
    assert checked > 300, f"only {checked} references found: is the scan reading the files?"
    assert not failures, f"{len(failures)} of {checked} references do not resolve:\n" + "\n".join(failures)
