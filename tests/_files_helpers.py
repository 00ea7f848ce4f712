"""A folder nothing can be written into, even by root (the tests run as root, whom ``chmod`` does not stop)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def read_only_folder(path: Path) -> Iterator[Path]:
    """``path``, created and made immutable (``chattr +i``: no file can be created, removed or renamed in it, by
    anyone, root included) for the ``with`` block; skips the test where the file system or tools cannot do it."""
    path.mkdir(parents=True, exist_ok=True)
    if shutil.which("chattr") is None:
        pytest.skip("chattr is not installed: no folder is read-only for root here")
    done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"chattr +i is not supported here ({done.stderr.strip()})")
    try:
        yield path
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)
