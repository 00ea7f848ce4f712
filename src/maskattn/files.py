"""Files that must survive a kill (a run folder's, what ``maskattn eval`` writes): atomic writes, and the clean-up
of what killed writes leave.

:func:`atomic_write` writes to ``.<name>.tmp-<pid>`` in the target's folder, flushes and ``fsync``-s it, then
``os.replace``-s it over the target and ``fsync``-s the folder: a kill at any moment leaves either the
previous file or the new one, never a partial file. A failed write (disk full, permission) removes its
temporary file and raises ``OSError`` naming the target; the previous file is untouched. A ``SIGKILL``
cannot run that clean-up: :func:`remove_stale_temp_files` deletes the temporary files of processes that no
longer exist (the run folder's next owner calls it when it takes the folder).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

__all__ = ["atomic_write", "remove_stale_temp_files", "temp_path"]

_TEMP = re.compile(r"^\..+\.tmp-(\d+)$")


def temp_path(path: Path) -> Path:
    """The temporary file this process writes ``path`` through."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def atomic_write(path: str | Path, chunks: Iterable[bytes | memoryview]) -> Path:
    """Write the concatenation of ``chunks`` to ``path`` atomically (module docstring). ``OSError`` (e.g.
    ``ENOSPC``) names ``path`` and says that the previous file is unchanged."""
    path = Path(path)
    tmp = temp_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise OSError(exc.errno, f"{reason} while writing it (the previous {path.name}, if any, is unchanged)",
                      str(path)) from exc
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def remove_stale_temp_files(folder: str | Path) -> list[Path]:
    """Delete the ``.<name>.tmp-<pid>`` files in ``folder`` whose process is gone (killed while writing), or
    whose pid is this process's own (left by an earlier process with the same pid: this one is not writing in a
    folder it is only now taking); returns them. Files of other live processes are kept: they may be writing."""
    folder = Path(folder)
    removed = []
    for entry in folder.iterdir() if folder.is_dir() else ():
        match = _TEMP.match(entry.name)
        if match and entry.is_file() and (int(match.group(1)) == os.getpid() or not _alive(int(match.group(1)))):
            entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed
