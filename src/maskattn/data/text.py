"""Reading text: the one line policy of every reader and command (dataset files, ``predict --input``,
``translate -i`` and stdin, ``eval --src/--ref``, ``viz localness --data``, GloVe vectors, YAML configs).

* Files are UTF-8; a UTF-8 byte-order mark at the start is dropped (Windows editors write one), so it never
  ends up inside the first token or label.
* Lines end at ``\\n`` only, as ``wc -l`` counts them; the ``\\r`` of a ``\\r\\n`` ending is dropped. Nothing
  else ends a line: a lone ``\\r``, form feed ``\\f``, vertical tab or the Unicode line / paragraph separators
  stay inside their line (``str.splitlines`` would split there and shift every following line). A final
  newline does not start another line.
* Bytes that are not UTF-8 raise :class:`~maskattn.errors.DataError` naming the file (or ``<stdin>``), the
  1-based line number and the position of the first bad byte.

Files are streamed line by line (:func:`iter_lines`), so a multi-gigabyte vectors file is never held whole.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from ..errors import DataError

__all__ = ["iter_lines", "read_lines", "read_stream_lines", "read_text"]


def _decode(raw: bytes, where: str, number: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{where}:{number}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at byte {exc.start + 1} of the "
                        "line); save the file as UTF-8") from None


def _lines_of(stream: BinaryIO, where: str) -> Iterator[tuple[int, str]]:
    for number, raw in enumerate(stream, start=1):  # binary line iteration splits on b"\n" only
        if number == 1 and raw.startswith(codecs.BOM_UTF8):
            raw = raw[len(codecs.BOM_UTF8):]
        if raw.endswith(b"\n"):
            raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
        yield number, _decode(raw, where, number)


def iter_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of a UTF-8 file, 1-based (module docstring): a regular file, or anything else that
    reads as one (``/dev/stdin``, a named pipe, a shell's ``<(command)``); a missing file or a folder raises
    :class:`DataError`."""
    path = Path(path)
    if not path.exists() or path.is_dir():
        raise DataError(f"data file {path} {'is a folder, not a file' if path.is_dir() else 'does not exist'}")
    with path.open("rb") as stream:
        yield from _lines_of(stream, str(path))


def read_lines(path: str | Path) -> list[str]:
    """Every line of a UTF-8 file, blank ones included (module docstring)."""
    return [line for _, line in iter_lines(path)]


def read_stream_lines(stream: BinaryIO, name: str = "<stdin>") -> list[str]:
    """Every line of a binary stream (e.g. ``sys.stdin.buffer``); ``name`` is used in error messages."""
    return [line for _, line in _lines_of(stream, name)]


def read_text(path: str | Path, what: str = "file") -> str:
    """The whole UTF-8 text of ``path`` (byte-order mark dropped, line endings untouched); ``what`` names the
    file in errors (``"config file"``)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{what} {path} does not exist")
    data = path.read_bytes()
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        offset = exc.start - data.rfind(b"\n", 0, exc.start)  # 1-based, within the line
        raise DataError(f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at byte {offset} of the line); "
                        "save the file as UTF-8") from None
