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

**What is a run's.** A run records every file it writes into the folder, and every sub-folder it uses
(cross-validation's ``fold<i>``), in the folder's manifest ``.run-files.json`` (:meth:`RunFolder.claim`) before
writing them. A folder *holds a run* when an entry of its manifest exists (:meth:`RunFolder.run_entries`), and
``--overwrite`` (:meth:`RunFolder.clear`) deletes exactly those entries — a listed sub-folder through its own
manifest, then the sub-folder itself once it is empty — so anything else in the folder (the user's data, notes,
other tools' files) stays. A run refuses to write over a file it did not write (:meth:`RunFolder.claim`), and a
folder that holds the data a run reads is refused as its run folder (:func:`refuse_inputs_inside`).

A folder written before manifests existed holds a run when it has ``metrics.jsonl`` or ``cv.json`` (every such
run wrote one of them first); its run is :data:`RUN_FILES` by name, and a ``fold<i>`` sub-folder only when that
sub-folder itself holds such a run (then its run files go, and the sub-folder only if it ends up empty).
Taking the folder also removes the temporary files of killed checkpoint writes
(:func:`~maskattn.files.remove_stale_temp_files`).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import socket
import time
from pathlib import Path

from ..errors import RunFolderError
from ..metrics.test_outputs import HYPOTHESES, PREDICTIONS
from ..files import atomic_write, remove_stale_temp_files

__all__ = ["RunFolder", "LOCK_NAME", "MANIFEST_NAME", "RUN_FILES", "refuse_inputs_inside"]

LOCK_NAME = ".lock"
MANIFEST_NAME = ".run-files.json"
#: What a run leaves in its folder (a plain run; `summary.json` and `cv.json`: cross-validation; the last two: what
#: its test was scored on, a seq2seq run's hypotheses or a classifier's predictions).
RUN_FILES = ("config.yaml", "metrics.jsonl", "metrics.csv", "best.safetensors", "last.safetensors", "summary.json",
             "cv.json", HYPOTHESES, PREDICTIONS)
#: The files only a run writes: a folder without a manifest holds a run (of an older maskattn) when it has one.
_LEGACY_MARKERS = ("metrics.jsonl", "cv.json")
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

    # --- what is the run's --------------------------------------------------------------------------------

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST_NAME

    def _manifest(self) -> dict[str, list[str]] | None:
        """The manifest (``{"files": [...], "folders": [...]}``), or ``None`` when the folder has none."""
        path = self.manifest_path
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise RunFolderError(f"{path}: not a run manifest ({exc}); it lists what a run wrote in {self.path}: "
                                 "delete it only if the folder holds no run") from None
        if not (isinstance(data, dict) and all(isinstance(data.get(key, []), list) and
                                               all(_plain_name(n) for n in data.get(key, []))
                                               for key in ("files", "folders"))):
            raise RunFolderError(f"{path}: not a run manifest (expected {{\"files\": [names], \"folders\": [names]}} "
                                 f"of entries in {self.path}); delete it only if the folder holds no run")
        return {"files": list(data.get("files", [])), "folders": list(data.get("folders", []))}

    def _legacy(self) -> bool:
        """Does the folder hold a run written before manifests existed?"""
        return self.path.is_dir() and not self.manifest_path.exists() and \
            any((self.path / name).is_file() for name in _LEGACY_MARKERS)

    def _legacy_folds(self) -> list[Path]:
        return sorted(entry for entry in self.path.iterdir()
                      if _FOLD.match(entry.name) and entry.is_dir() and RunFolder(entry).run_entries())

    def run_entries(self) -> list[Path]:
        """The files and sub-folders of the run in this folder that exist (empty: it holds no run)."""
        if not self.path.is_dir():
            return []
        manifest = self._manifest()
        if manifest is None:  # written before manifests existed, or no run
            files = [self.path / name for name in RUN_FILES if (self.path / name).is_file()] if self._legacy() else []
            return sorted(files + self._legacy_folds())
        return sorted([self.path / name for name in manifest["files"] if (self.path / name).is_file()] +
                      [self.path / name for name in manifest["folders"] if (self.path / name).is_dir()])

    def run_files(self) -> list[Path]:
        """The files of the run in this folder (:meth:`run_entries` that are files, and the manifest that lists
        them): what a command that reads the run may not write over (:func:`maskattn.files.check_outputs`). A
        damaged manifest lists nothing: then every file of :data:`RUN_FILES`'s names is the run's."""
        try:
            entries = self.run_entries()
        except RunFolderError:
            entries = [self.path / name for name in RUN_FILES]
        files = [entry for entry in entries if entry.is_file()]
        return files + [self.manifest_path] if self.manifest_path.is_file() else files

    def claim(self, *files: str, folders: tuple[str, ...] = (), record: bool = True) -> None:
        """Record ``files`` and ``folders`` (names in this folder) in the manifest as the run's, before the run
        writes them; only while holding the lock. A file that exists and is not the run's — neither in the
        manifest nor a :data:`RUN_FILES` name of a run of an older maskattn — is a :class:`RunFolderError`
        (the run would replace a file it did not write), and so is a folder name that exists as a file.
        ``record=False`` only checks."""
        if not self.locked:
            raise RuntimeError(f"claiming files in {self.path} without holding its lock")
        manifest = self._manifest()
        owned = set() if manifest is None else set(manifest["files"])
        legacy = manifest is None and self._legacy()
        foreign = [name for name in files if (self.path / name).exists() and name not in owned
                   and not (legacy and name in RUN_FILES and (self.path / name).is_file())]
        foreign += [name for name in folders if (self.path / name).exists() and not (self.path / name).is_dir()]
        if foreign:
            raise RunFolderError(f"run folder {self.path} holds {', '.join(foreign)}, which no maskattn run wrote "
                                 f"there; the run would replace {'it' if len(foreign) == 1 else 'them'}: move "
                                 f"{'it' if len(foreign) == 1 else 'them'} away, or give this run another folder "
                                 "(--out)")
        if not record:
            return
        manifest = manifest or {"files": [], "folders": []}
        if legacy:  # adopt the older run's files: the manifest now speaks for the folder
            manifest["files"] = [name for name in RUN_FILES if (self.path / name).is_file()]
            manifest["folders"] = [entry.name for entry in self._legacy_folds()]
        new = {"files": sorted(set(manifest["files"]) | set(files)),
               "folders": sorted(set(manifest["folders"]) | set(folders))}
        if new != manifest or not self.manifest_path.exists():
            atomic_write(self.manifest_path, [(json.dumps(new, indent=1) + "\n").encode()])

    def refuse_existing_run(self) -> None:
        """Raise :class:`RunFolderError` when the folder holds a run, saying how to continue or replace it."""
        entries = self.run_entries()
        if not entries:
            return
        last = self.path / "last.safetensors"
        resume = f"continue it with --resume {last}, " if last.is_file() and last in entries else ""
        raise RunFolderError(f"run folder {self.path} already holds a run ({', '.join(e.name for e in entries[:4])}"
                             f"{', …' if len(entries) > 4 else ''}); {resume}replace it with --overwrite (deletes "
                             "what that run wrote, nothing else), or give this run another folder (--out)")

    def clear(self) -> None:
        """Delete the run in this folder (:meth:`run_entries`; a sub-folder through its own run entries, then
        the sub-folder if that leaves it empty) and its manifest; nothing else. Only while holding the lock."""
        if not self.locked:
            raise RuntimeError(f"clearing {self.path} without holding its lock")
        self._clear()

    def _clear(self) -> None:
        for entry in self.run_entries():
            if entry.is_dir():
                with RunFolder(entry) as sub:  # a fold another process trains in is refused, not emptied under it
                    sub._clear()
                if not any(entry.iterdir()):
                    entry.rmdir()
            else:
                entry.unlink()
        self.manifest_path.unlink(missing_ok=True)


def _plain_name(name: object) -> bool:
    """A name of an entry directly inside a folder (a manifest never reaches outside its folder)."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\0" not in name


def refuse_inputs_inside(out_dir: str | Path, inputs: list[Path]) -> None:
    """Raise :class:`RunFolderError` when one of the files or folders a run reads (``inputs``) is the run folder
    ``out_dir`` or lies inside it: a run folder is the run's own (``--overwrite`` empties it)."""
    out = Path(out_dir).resolve()
    for path in inputs:
        resolved = Path(path).resolve()
        if resolved == out or out in resolved.parents:
            raise RunFolderError(f"run folder {out_dir} holds the data this run reads ({path}); give the run a "
                                 "folder of its own (--out), outside the data")
