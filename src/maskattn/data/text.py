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

Files are streamed line by line (:func:`iter_lines`), so a multi-gigabyte vectors file is never held whole, and
no line is held past :func:`max_line_bytes` (16 MiB, or ``MASKATTN_MAX_LINE_BYTES``): a longer line — a file with
no line breaks, a sparse or binary file — is a :class:`~maskattn.errors.DataError` naming the file and line,
raised after reading at most that many bytes of it. :func:`read_text` (a whole small file: a configuration, a
summary) reads at most ``max_bytes`` (16 MiB by default) and refuses a longer file the same way.
"""

from __future__ import annotations

import codecs
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from ..errors import ConfigError, DataError
from ..files import MAX_TEXT_BYTES, read_text, size_text as _size
from ..sections import MAX_YAML_BYTES, parse_yaml

__all__ = ["read_yaml", "iter_lines", "iter_raw_lines", "decode_line", "read_lines", "read_stream_lines", "read_text", "max_line_bytes", "MAX_LINE_BYTES",
           "MAX_LINE_ENV", "MAX_TEXT_BYTES"]

#: the longest line any reader holds, in bytes, unless :data:`MAX_LINE_ENV` says otherwise
MAX_LINE_BYTES = 16 * 2**20
#: the environment variable that changes :data:`MAX_LINE_BYTES` (bytes, or with a unit: ``64M``, ``1G``)
MAX_LINE_ENV = "MASKATTN_MAX_LINE_BYTES"
_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20, "mib": 2**20,
          "g": 2**30, "gb": 2**30, "gib": 2**30}


def max_line_bytes() -> int:
    """The longest line a reader holds: ``MASKATTN_MAX_LINE_BYTES`` when set (bytes, or ``64M``, ``1G``, …), else
    :data:`MAX_LINE_BYTES`; a value that is not a size is a :class:`DataError`."""
    text = os.environ.get(MAX_LINE_ENV, "").strip().lower()
    if not text:
        return MAX_LINE_BYTES
    number, unit = text.rstrip("abcdefghijklmnopqrstuvwxyz").strip(), text.lstrip("0123456789. ").strip()
    try:
        value = int(float(number) * _UNITS[unit])
    except (ValueError, KeyError):
        value = 0
    if value < 1:
        raise DataError(f"{MAX_LINE_ENV}={os.environ[MAX_LINE_ENV]!r} is not a size; expected bytes with an optional "
                        "unit, e.g. 64M or 1G")
    return value


def decode_line(raw: bytes, where: str, number: int) -> str:
    """``raw`` (line ``number`` of ``where``) as text; bytes that are not UTF-8 are a :class:`DataError` naming the
    file, the line and the first bad byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{where}:{number}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at byte {exc.start + 1} of the "
                        "line); save the file as UTF-8") from None


def _raw_lines(stream: BinaryIO, where: str) -> Iterator[tuple[int, bytes, bool]]:
    limit = max_line_bytes()
    number = 0
    while raw := stream.readline(limit + 3):  # splits on b"\n" only; never more than the limit (+ BOM, \r\n) held
        number += 1
        cut = len(raw) == limit + 3 and not raw.endswith(b"\n")  # the line goes on past what was read
        if number == 1 and raw.startswith(codecs.BOM_UTF8):
            raw = raw[len(codecs.BOM_UTF8):]
        ended = raw.endswith(b"\n")
        if ended:
            raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
        if cut or len(raw) > limit:
            raise DataError(f"{where}:{number}: a line longer than {_size(limit)} (no line break in its first "
                            f"{limit:,} bytes); maskattn reads text one line at a time: is this a text file with one "
                            f"item per line? (to hold longer lines, set {MAX_LINE_ENV}, e.g. {MAX_LINE_ENV}=256M)")
        yield number, raw, ended


def _lines_of(stream: BinaryIO, where: str) -> Iterator[tuple[int, str]]:
    for number, raw, _ in _raw_lines(stream, where):
        yield number, decode_line(raw, where, number)


def _opened(path: Path):
    """``path`` opened for reading bytes; a missing file or a folder raises :class:`DataError`."""
    if not path.exists() or path.is_dir():
        raise DataError(f"data file {path} {'is a folder, not a file' if path.is_dir() else 'does not exist'}")
    return path.open("rb")


def iter_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of a UTF-8 file, 1-based (module docstring): a regular file, or anything else that
    reads as one (``/dev/stdin``, a named pipe, a shell's ``<(command)``); a missing file or a folder raises
    :class:`DataError`."""
    with _opened(Path(path)) as stream:
        yield from _lines_of(stream, str(path))


def iter_raw_lines(path: str | Path) -> Iterator[tuple[int, bytes, bool]]:
    """``(line number, bytes, ended)`` of a file, as :func:`iter_lines` reads it (bounded, ``\\n`` only, the
    ending dropped) but not decoded (:func:`decode_line`): for a reader that treats a last line without its
    ``\\n`` (``ended`` False), cut short by a kill mid-write, apart from the others (a metrics log)."""
    with _opened(Path(path)) as stream:
        yield from _raw_lines(stream, str(path))


def read_lines(path: str | Path) -> list[str]:
    """Every line of a UTF-8 file, blank ones included (module docstring)."""
    return [line for _, line in iter_lines(path)]


def read_stream_lines(stream: BinaryIO, name: str = "<stdin>") -> list[str]:
    """Every line of a binary stream (e.g. ``sys.stdin.buffer``); ``name`` is used in error messages."""
    return [line for _, line in _lines_of(stream, name)]


def read_yaml(path, what: str = "file", error: type[Exception] = ConfigError) -> object:
    """The value of the YAML file ``path`` (:func:`maskattn.sections.parse_yaml`: size, aliases and nesting bounded;
    ``what`` names the file in errors: ``"variants file"``), read with :func:`read_text` (UTF-8, at most
    :data:`~maskattn.sections.MAX_YAML_BYTES`); a missing, unreadable or oversized file raises ``error`` too."""
    try:
        text = read_text(path, what, max_bytes=MAX_YAML_BYTES)
    except DataError as exc:
        if error is DataError:
            raise
        raise error(str(exc)) from None
    return parse_yaml(text, f"{what} {path}", error)
