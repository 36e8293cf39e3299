"""The loop's textbook path: the project modules mtp/speculative.py reaches through its own imports (package
`__init__` re-exports not counted), with their line counts. `types=False` leaves out what is imported only under
`if TYPE_CHECKING:` (the schedules and the image placement, which the loop is handed and calls): the run-time
imports alone. `python -m tests.textbook_path` prints the whole path, those modules marked, and both totals."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
START = "mtp.speculative"
PACKAGES = ("gemma4", "mtp")


def module_file(name: str) -> Path:
    path = REPO.joinpath(*name.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def imports(name: str, types: bool = True) -> set[str]:
    """The project modules `name` imports by name (`from a.b import c` counts a.b, or a.b.c if c is a module);
    with `types`, those imported under `if TYPE_CHECKING:` too."""
    out = set()
    tree = ast.parse(module_file(name).read_text())
    for node in ast.walk(tree) if types else run_time_nodes(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.add(sub if module_file(sub).exists() and not module_file(sub).name == "__init__.py"
                        else node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] in PACKAGES}
    return {m for m in out if module_file(m).name != "__init__.py"}


def run_time_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node but those under `if TYPE_CHECKING:`: what is imported there names a type, never runs."""
    nodes, todo = [], [tree]
    while todo:
        node = todo.pop()
        nodes.append(node)
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            todo += node.orelse
        else:
            todo += ast.iter_child_nodes(node)
    return nodes


def textbook_path(types: bool = True) -> dict[str, int]:
    """Module -> its line count, for every module on the path (`types=False`: run-time imports only)."""
    seen, todo = set(), [START]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += sorted(imports(name, types) - seen)
    return {m: len(module_file(m).read_text().splitlines()) for m in sorted(seen)}


if __name__ == "__main__":
    path, run_time = textbook_path(), textbook_path(types=False)
    for module, lines in path.items():
        mark = "" if module in run_time else "  (imported only as a type)"
        print(f"{lines:5d}  {module_file(module).relative_to(REPO)}{mark}")
    print(f"{sum(path.values()):5d}  total")
    print(f"{sum(run_time.values()):5d}  total of the run-time imports alone")
