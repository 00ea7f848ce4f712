"""Files that must survive a kill (a run folder's, what ``maskattn eval`` writes): atomic writes, the clean-up
of what killed writes leave, and the one rule every command's output paths go through.

:func:`atomic_write` writes to ``.<name>.tmp-<pid>`` in the target's folder, flushes and ``fsync``-s it, then
``os.replace``-s it over the target and ``fsync``-s the folder: a kill at any moment leaves either the
previous file or the new one, never a partial file. A failed write (disk full, permission) removes its
temporary file and raises ``OSError`` naming the target; the previous file is untouched. A ``SIGKILL``
cannot run that clean-up: :func:`remove_stale_temp_files` deletes the temporary files of processes that no
longer exist (the run folder's next owner calls it when it takes the folder).

:func:`check_outputs` is what every command checks its output paths with, before any work: an output may not be
— or resolve to, through symbolic or hard links — a file the command reads (its inputs, and the files of a run
folder it reads); an existing output is refused unless the user says ``--overwrite``; an output that cannot be
written (a folder, a file where its folder should be, a read-only place) is refused. Missing folders on the way
are created when the output is written. :func:`check_output_folder` is the same for an output folder.

:func:`read_text` is the bounded whole-file reader (a configuration, a summary, a report's rows: at most 16 MiB
unless its caller says), here below every package that reads such a file (``maskattn.data.text`` re-exports it
beside the bounded line readers).
"""

from __future__ import annotations

import codecs
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from .errors import ArgumentError, DataError

__all__ = ["atomic_write", "atomic_savefig", "remove_stale_temp_files", "temp_path", "check_outputs",
           "check_output_folder", "read_text", "size_text", "MAX_TEXT_BYTES"]

#: the largest file :func:`read_text` reads whole by default
MAX_TEXT_BYTES = 16 * 2**20

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


def atomic_savefig(figure, path: str | Path, **options) -> Path:
    """A matplotlib ``figure`` written to ``path`` atomically (:func:`atomic_write`): drawn into memory in the
    format of ``path``'s suffix (``figure.savefig(…, **options)``), then written whole — a full disk keeps the
    previous image."""
    import io

    path = Path(path)
    image = io.BytesIO()
    figure.savefig(image, format=path.suffix.lstrip(".").lower(), **options)
    return atomic_write(path, [image.getbuffer()])


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


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are one existing file (through symbolic and hard links)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (or cannot be reached): not one existing file
        return False


def _check_writable(option: str, path: Path) -> None:
    """Refuse ``path`` (an output file or folder, existing or not) when nothing can be written there: the nearest
    folder that exists on its way must be a folder this process may write into."""
    place = path if path.is_dir() else path.parent
    while not place.exists() and not place.is_symlink() and place != place.parent:
        place = place.parent
    if not place.is_dir():
        raise ArgumentError(f"{option} {path}: {place} is a file, not a folder; give a path in a folder")
    if not os.access(place, os.W_OK | os.X_OK):
        raise ArgumentError(f"{option} {path}: folder {place} is not writable (read-only, or no permission); give "
                            "a place this process may write to")


def check_outputs(outputs: Mapping[str, str | Path | None], *,
                  inputs: Iterable[tuple[str, str | Path | None]] = (), overwrite: bool = False) -> None:
    """Refuse, with an :class:`~maskattn.errors.ArgumentError` naming the option and the path, an output file a
    command is about to write (module docstring). ``outputs``: option (``--predictions``) → path, ``None`` when
    not given. ``inputs``: ``(what, path)`` of each file the command reads — ``what`` names it in the message
    (``"the --checkpoint file"``, ``"a file of the run in runs/x"``). An existing output
    is refused unless ``overwrite``; two options naming one file are refused."""
    given = {option: Path(path) for option, path in outputs.items() if path is not None}
    read = [(what, Path(path)) for what, path in inputs if path is not None and str(path) != "-"]
    seen: list[tuple[str, Path]] = []
    for option, path in given.items():
        for what, source in read:
            if _same_file(path, source) or path.resolve() == source.resolve():
                raise ArgumentError(f"{option} {path} is {what} ({source}), which this command reads: writing there "
                                    "would replace it; give another file")
        for other, earlier in seen:
            if path.resolve() == earlier.resolve() or _same_file(path, earlier):
                raise ArgumentError(f"{other} and {option} name the same file ({path}); give each its own file")
        seen.append((option, path))
        if path.is_dir():
            raise ArgumentError(f"{option} {path} is a folder; give a file name (in that folder, or elsewhere)")
        if path.exists() and not overwrite:
            raise ArgumentError(f"{option} {path} exists; pass --overwrite to replace it, or give another file")
        _check_writable(option, path)


def check_output_folder(option: str, path: str | Path) -> Path:
    """Refuse (:class:`~maskattn.errors.ArgumentError`, naming ``option`` and the path) an output folder that is a
    file, or lies where nothing can be written (module docstring); it may not exist yet (it is created when
    written to). Returns it as a ``Path``."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ArgumentError(f"{option} {path} is a file, not a folder; give a folder (it is created if missing)")
    _check_writable(option, path)
    return path


def size_text(count: int) -> str:
    """``count`` bytes in words (``16 MiB``), for messages."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= size:
            return f"{count / size:g} {unit}"
    return f"{count} bytes"


def read_text(path: str | Path, what: str = "file", *, max_bytes: int | None = None) -> str:
    """The whole UTF-8 text of ``path`` (byte-order mark dropped, line endings untouched); ``what`` names the
    file in errors (``"config file"``). At most ``max_bytes`` (default :data:`MAX_TEXT_BYTES`) are read: a longer
    file is a :class:`DataError` (a configuration or a summary is a few KiB; a larger file is the wrong one)."""
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{what} {path} is a folder, not a file")
    if not path.exists():
        raise DataError(f"{what} {path} does not exist")
    limit = MAX_TEXT_BYTES if max_bytes is None else max_bytes
    with path.open("rb") as stream:
        data = stream.read(limit + 1)
    if len(data) > limit:
        raise DataError(f"{what} {path} is larger than {size_text(limit)}, more than such a file holds; is it the "
                        "right file?")
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        offset = exc.start - data.rfind(b"\n", 0, exc.start)  # 1-based, within the line
        raise DataError(f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at byte {offset} of the line); "
                        "save the file as UTF-8") from None
