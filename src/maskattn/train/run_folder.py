"""A run folder belongs to one process at a time, and a new run never silently replaces a finished one.

:meth:`RunFolder.lock` takes an exclusive ``fcntl.flock`` on ``<folder>/.lock`` without waiting and writes the
holder's pid, host and start time into it. A second process that asks for the same folder fails at once with
:class:`~maskattn.errors.RunFolderError` naming the holder. The lock belongs to the open file: it ends when the
holder unlocks, exits or is killed (even by ``SIGKILL``), so a crashed run never leaves a folder locked (its
``.lock`` file stays, and the next process simply locks it). :meth:`RunFolder.unlock` deletes ``.lock`` while
still holding it, and a folder it created that is still empty; since a process may have opened the old file
just before, :meth:`RunFolder.lock` checks after locking that the path still names the file it locked, and
starts again when it does not.

Limits: ``flock`` locks are reliable on local file systems. On NFS (Linux ≥ 2.6.12 maps ``flock`` to NFS
byte-range locks) it works across machines only where the NFS lock service runs; on some network or FUSE file
systems it is local to one machine, so two machines could both "hold" a folder there.

A folder *holds a run* when it has any of :data:`RUN_FILES` or a ``fold<i>`` sub-folder (cross-validation).
Taking the folder also removes the temporary files of killed checkpoint writes
(:func:`~maskattn.train.files.remove_stale_temp_files`).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import socket
import time
from pathlib import Path

from ..errors import RunFolderError
from .files import remove_stale_temp_files

__all__ = ["RunFolder", "LOCK_NAME", "RUN_FILES"]

LOCK_NAME = ".lock"
#: What a run leaves in its folder (a plain run; the last two: cross-validation).
RUN_FILES = ("config.yaml", "metrics.jsonl", "metrics.csv", "best.safetensors", "last.safetensors", "summary.json",
             "cv.json")
_FOLD = re.compile(r"^fold\d+$")


def _holder(text: str) -> str:
    """The holder recorded in a lock file, for messages."""
    try:
        info = json.loads(text)
        return f"pid {info['pid']} on {info['host']}, started {info['started']}"
    except (ValueError, KeyError, TypeError):
        return "a process that has not written its pid yet"


class RunFolder:
    """The run folder ``path`` and this process's lock on it (see the module docstring)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock_file = None
        self._created = False  # did lock() create the folder?

    @property
    def locked(self) -> bool:
        """Does this object hold the folder's lock?"""
        return self._lock_file is not None

    def lock(self) -> RunFolder:
        """Take the folder (creating it) or raise :class:`RunFolderError` naming the process that holds it;
        then remove stale temporary files. ``OSError`` (e.g. no permission) names the path."""
        self._created = False
        while True:
            if not self.path.is_dir():  # new, or removed by its previous holder since the last attempt
                self.path.mkdir(parents=True, exist_ok=True)
                self._created = True
            handle = self._locked_file()
            if handle is not None:
                break
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "started": time.strftime("%Y-%m-%d %H:%M:%S")}) + "\n")
        handle.flush()
        self._lock_file = handle
        try:
            remove_stale_temp_files(self.path)
        except BaseException:
            self.unlock()
            raise
        return self

    def _locked_file(self):
        """The lock file, opened and locked by this process; ``None`` when the file was deleted or replaced by
        its previous holder in the meantime (try again); :class:`RunFolderError` when another process holds it."""
        path = self.path / LOCK_NAME
        handle = open(path, "a+", encoding="utf-8")  # not truncated before it is ours
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = _holder(handle.read())
            handle.close()
            raise RunFolderError(f"run folder {self.path} is in use by another run ({holder}); wait for it to end, "
                                 "or give this run another folder (--out)") from None
        try:
            current = os.stat(path)
        except FileNotFoundError:
            current = None
        opened = os.fstat(handle.fileno())
        if current is None or (current.st_dev, current.st_ino) != (opened.st_dev, opened.st_ino):
            handle.close()  # we locked a file its previous holder has just deleted
            return None
        return handle

    def unlock(self) -> None:
        """Release the folder (a no-op when it is not held): delete ``.lock`` while still holding it, then the
        folder itself when :meth:`lock` created it and nothing was written into it."""
        if self._lock_file is None:
            return
        (self.path / LOCK_NAME).unlink(missing_ok=True)
        if self._created and not any(self.path.iterdir()):
            try:
                self.path.rmdir()
            except OSError:  # another process has just started to take the folder: it is theirs now
                pass
        fcntl.flock(self._lock_file, fcntl.LOCK_UN)
        self._lock_file.close()
        self._lock_file = None

    def __enter__(self) -> RunFolder:
        return self.lock()

    def __exit__(self, *exc) -> None:
        self.unlock()

    def run_entries(self) -> list[Path]:
        """The files and fold folders of a run in this folder (empty: it holds no run)."""
        if not self.path.is_dir():
            return []
        return sorted(entry for entry in self.path.iterdir()
                      if (entry.name in RUN_FILES and entry.is_file()) or (_FOLD.match(entry.name) and entry.is_dir()))

    def refuse_existing_run(self) -> None:
        """Raise :class:`RunFolderError` when the folder holds a run, saying how to continue or replace it."""
        entries = self.run_entries()
        if not entries:
            return
        last = self.path / "last.safetensors"
        resume = f"continue it with --resume {last}, " if last.is_file() else ""
        raise RunFolderError(f"run folder {self.path} already holds a run ({', '.join(e.name for e in entries[:4])}"
                             f"{', …' if len(entries) > 4 else ''}); {resume}replace it with --overwrite (deletes "
                             "those files), or give this run another folder (--out)")

    def clear(self) -> None:
        """Delete the run in this folder (:meth:`run_entries`); only while holding the lock."""
        if not self.locked:
            raise RuntimeError(f"clearing {self.path} without holding its lock")
        for entry in self.run_entries():
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()
