"""The wheel ships every resource of the package: every file under ``src/maskattn`` (code, YAML presets, any data
file) must be in the wheel built from this checkout. Exit code 1 names the files that are missing.

    python scripts/check_wheel.py dist/maskattn-*.whl
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "maskattn"


def package_files() -> set[str]:
    """The files of the source package, as paths inside a wheel (``maskattn/...``)."""
    return {f"maskattn/{path.relative_to(PACKAGE).as_posix()}" for path in PACKAGE.rglob("*")
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python scripts/check_wheel.py WHEEL", file=sys.stderr)
        return 2
    with zipfile.ZipFile(argv[0]) as wheel:
        shipped = set(wheel.namelist())
    missing = sorted(package_files() - shipped)
    if missing:
        print(f"{argv[0]} lacks {len(missing)} file(s) of src/maskattn: {', '.join(missing)} — declare them in "
              "pyproject.toml ([tool.setuptools.package-data])", file=sys.stderr)
        return 1
    print(f"{Path(argv[0]).name}: all {len(package_files())} files of src/maskattn are in the wheel")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
