"""Packages whose API loads on first use (PEP 562), so that a command imports only what it uses: ``maskattn
--help`` or ``maskattn grid table`` need no torch (issue 42, "start-up"). A package lists where each public name
lives; static tools (mypy, the API reference) read the same imports under ``if TYPE_CHECKING:``."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence


def lazy_exports(package: str, homes: Mapping[str, Sequence[str]], submodules: Sequence[str] = ()
                 ) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package``: ``homes`` maps a module (relative to the
    package, ``.config`` / ``..checkpoint``) to the names it provides; ``submodules`` are imported by name."""
    where = {name: home for home, names in homes.items() for name in names}

    def __getattr__(name: str) -> object:
        if name in submodules:
            return importlib.import_module(f".{name}", package)
        if name in where:
            return getattr(importlib.import_module(where[name], package), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *where, *submodules})

    return __getattr__, __dir__
