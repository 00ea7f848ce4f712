"""The layout shows the architecture (docs/design.md §7): every package imports only from packages below it,
and no module imports a private (underscore) name or module of another package."""

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
    "viz": 12, "demo": 12,
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
