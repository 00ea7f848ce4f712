"""The layout shows the architecture (docs/design.md §7): every package imports only from packages below it, no
module imports a private (underscore) name or module of another package, and no import cycle exists between the
package's modules (``python tests/test_layout.py`` prints the import graph's figures)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "maskattn"

#: bottom first; a package may import from the packages of lower rank only (equal rank: unrelated)
RANKS = {
    "errors": 0, "lazy": 0,
    "validation": 1, "files": 1,
    "masks": 2, "sections": 2, "device": 2,
    "configuration": 3,  # the old name of sections (a shim that warns, until 0.3)
    "kernels": 3, "data": 3, "checkpoint": 3,
    "backends": 4,
    "functional": 5,
    "attention": 6,
    "layers": 7, "hf": 7,
    "models": 8,
    "metrics": 9, "analysis": 9,
    "inference": 10, "bench": 10,
    "train": 11,
    "grid": 12, "viz": 12, "demo": 12,
    "cli": 13, "__init__": 13,
}


def _imports():
    """(importing package, imported package, imported name, file) for every relative import in the package."""
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC)
        package = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and node.level):
                continue
            here = list(rel.parts[:-1])
            base = here[:len(here) - (node.level - 1)] if node.level > 1 else here
            target = base + (node.module.split(".") if node.module else [])
            for alias in node.names:
                imported = target[0] if target else alias.name
                module_path = target[1:] + ([] if target else [])
                yield package, imported, alias.name, module_path, rel


def test_every_package_has_a_rank():
    packages = {p.stem if p.is_file() else p.name for p in SRC.iterdir()
                if (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists()))}
    assert packages <= set(RANKS), sorted(packages - set(RANKS))


@pytest.mark.parametrize("package", sorted(RANKS))
def test_imports_point_down(package):
    wrong = sorted({f"{rel}: imports {imported}" for importer, imported, _, _, rel in _imports()
                    if importer == package and imported != package and imported in RANKS
                    and RANKS[imported] >= RANKS[package]})
    assert not wrong, wrong


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))  # __version__ is public


def test_no_private_name_or_module_crosses_a_package():
    private = sorted({f"{rel}: {'.'.join([imported, *path])}.{name}" for importer, imported, name, path, rel in _imports()
                      if importer != imported and (_is_private(name) or _is_private(imported)
                                                   or any(_is_private(part) for part in path))})
    assert not private, private


# --- the module import graph ------------------------------------------------------------------------------------

def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_graph() -> dict[str, set[str]]:
    """Every module of ``maskattn`` → the modules of ``maskattn`` it imports. Counted: every ``import maskattn.x`` and
    ``from … import …`` statement of the package, wherever it stands — at module level, inside a function (the
    imports made on first use) or under ``if TYPE_CHECKING:`` —, relative (``from ..train import config``) or absolute
    (``from maskattn.grid import spec``). An import names the module it imports from, or the submodule when the name
    imported is one (``from . import config``); a package's ``__init__`` is a module of its own, and importing a
    submodule is not counted as importing its package's ``__init__``. Names a package loads on first use
    (``maskattn.lazy.lazy_exports``) are not imports."""
    paths = {_module_name(path): path for path in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(package[:len(package) - node.level + 1] + [node.module or ""]) if node.level \
                    else node.module or ""
                base = base.strip(".")
                imported |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths else base
                             for alias in node.names}
        graph[name] = {module for module in imported if module in paths and module != name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or not (the strongly connected components of more
    than one module; Tarjan's algorithm), each as a cycle through its modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while (member := stack.pop()) != module:
                group.append(member)
            if group:
                groups.append(_cycle_through([module, *group], graph))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return groups


def _cycle_through(group: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One cycle inside a strongly connected ``group``, from its first module back to it (a breadth-first path)."""
    members, start = set(group), group[0]
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for module in frontier:
            for other in sorted(graph[module] & members):
                if other == start:
                    path = [module]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if other not in came_from:
                    came_from[other] = module
                    following.append(other)
        frontier = following
    return group  # pragma: no cover - a strongly connected group always has a cycle through its first module


def test_no_module_imports_itself_back():
    """No import cycle anywhere in the package (issue 54: ``train.grid`` and ``train.launchers`` imported each other):
    every module reads from the top without coming back to one that imports it."""
    cycles = import_cycles(module_graph())
    assert not cycles, [" → ".join(cycle) for cycle in cycles]


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert import_cycles(graph) == [["a", "b", "c", "a"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_counts_relative_absolute_and_local_imports():
    graph = module_graph()
    assert "maskattn.train.resumable" in graph["maskattn.grid.spec"]  # from ..train.resumable import … (top level)
    assert "maskattn.train.config" in graph["maskattn.grid.spec"]  # from ..train.config import … (in a function)
    assert "maskattn.train.config" in graph["maskattn.train"]  # from . import config (a submodule, TYPE_CHECKING)
    assert "maskattn.grid.records" in graph["maskattn.grid.launchers"]
    assert not any(module.startswith("maskattn.grid") for module in graph["maskattn.train.resumable"])


def test_the_design_shows_every_module():
    """docs/design.md §7 draws the layout as one tree, one line per module: every module of the package is there,
    and nothing that is not."""
    text = (SRC.parents[1] / "docs" / "design.md").read_text(encoding="utf-8")
    section = text[text.index("## §7"):text.index("## §8")]
    drawn, folders = set(), []
    for line in section.splitlines():
        if not line.startswith("      ") or not line.split()[0].endswith((".py", "/")):
            continue  # prose, the root line, or a description's second line
        depth, name = (len(line) - len(line.lstrip()) - 6) // 2, line.split()[0]
        folders[depth:] = [name] if name.endswith("/") else []
        drawn.add("".join(folders) if name.endswith("/") else "".join(folders[:depth]) + name)
    modules = {str(path.relative_to(SRC)) for path in SRC.rglob("*.py")}
    packages = {path.replace("__init__.py", "") for path in modules if path.endswith("__init__.py")} - {""}
    expected = {path for path in modules if not path.endswith("__init__.py")} | packages - {"__init__.py"}
    assert sorted(expected - drawn) == [] and sorted(drawn - expected) == []


if __name__ == "__main__":
    graph = module_graph()
    cycles = import_cycles(graph)
    print(f"maskattn: {len(graph)} modules, {sum(map(len, graph.values()))} import edges, {len(cycles)} import "
          f"cycle(s){': ' if cycles else ''}" + "; ".join(" → ".join(cycle) for cycle in cycles))
