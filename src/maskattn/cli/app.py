"""The ``maskattn`` Typer application and what every command shares: the error policy (one line for a user's
mistake, a traceback for a bug) and the handling of Ctrl-C / SIGTERM."""

from __future__ import annotations

import signal
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.console import Console
from rich.markup import escape

from ..errors import Interrupted, MaskattnError, RenamedWarning, UnverifiedCheckpointWarning

__all__ = ["app", "user_errors", "interrupt_exits", "sigterm_as_interrupt", "is_user_error", "warn", "DEVICE_HELP",
           "OVERWRITE_HELP"]

#: the help of every command's --device (one meaning: maskattn.device.resolve_device)
DEVICE_HELP = "auto (CUDA when available, else the CPU), cpu, cuda or cuda:N"
#: the help of every command's --overwrite of output files (the rule: maskattn.files.check_outputs)
OVERWRITE_HELP = "replace output files that exist (never a file the command reads)"

# rich_markup_mode=None: click's plain help. Typer's rich help (0.29) prints a value type after flags that take none
# ("--overwrite <bool>", whereupon "--overwrite true" fails) and breaks docstring paragraphs mid-sentence.
app = typer.Typer(help="maskattn: mask-based self-attention (MTSA, MAN, CSAN) for PyTorch.", no_args_is_help=True,
                  add_completion=False, rich_markup_mode=None)


def _print_version(value: bool) -> None:
    if value:
        from .. import __version__

        typer.echo(f"maskattn {__version__}")
        raise typer.Exit()


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                      help="print the version and exit")) -> None:
    """maskattn: mask-based self-attention (MTSA, MAN, CSAN) for PyTorch."""


def is_user_error(exc: BaseException) -> bool:
    """A mistake the user can fix: one of maskattn's own errors (raised on purpose, naming what was wrong), or an
    ``OSError`` about a file (it carries the file's name: the user's input or output path)."""
    return isinstance(exc, MaskattnError) or (isinstance(exc, OSError) and exc.filename is not None)


def _message(exc: BaseException) -> str:
    """The line printed for a user error: an ``OSError`` as ``path: reason``, anything else as its text."""
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        paths = f"{exc.filename} → {exc.filename2}" if exc.filename2 is not None else str(exc.filename)
        return f"{paths}: {exc.strerror}"
    return str(exc)


def warn(message: str) -> None:
    """``warning: …`` on stderr (one line)."""
    Console(stderr=True).print(f"[yellow]warning:[/yellow] {escape(message)}", markup=True, highlight=False,
                               soft_wrap=True)


@contextmanager
def _warning_lines() -> Iterator[None]:
    """maskattn's own warnings — an old name (:class:`~maskattn.errors.RenamedWarning`, which Python would hide as
    a ``DeprecationWarning``) and an unverified checkpoint — as ``warning: …`` lines, once each; others as usual."""
    with warnings.catch_warnings():
        warnings.simplefilter("default", RenamedWarning)
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if issubclass(category, (RenamedWarning, UnverifiedCheckpointWarning)):
                warn(str(message))
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        yield


def _out_of_memory(exc: BaseException) -> MaskattnError | None:
    """The :class:`~maskattn.errors.MemoryLimitError` advice for an allocation that failed (torch's CPU allocator,
    ``torch.OutOfMemoryError``, Python's ``MemoryError``: :func:`maskattn.device.is_out_of_memory`); ``None`` for
    any other exception (a bug). torch is only looked at when it was imported already."""
    if not isinstance(exc, MemoryError) and "torch" not in sys.modules:
        return None
    from ..device import is_out_of_memory, out_of_memory_error

    return out_of_memory_error(exc) if is_out_of_memory(exc) else None


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn the user errors raised inside (:func:`is_user_error`) into ``error: …`` on stderr and exit code 2, and
    so an allocation that failed (the one-line :class:`~maskattn.errors.MemoryLimitError` advice, not the
    allocator's traceback); anything else keeps its traceback. maskattn's warnings are ``warning: …`` lines
    meanwhile."""
    try:
        with _warning_lines():
            yield
    except (MaskattnError, OSError, RuntimeError, MemoryError) as exc:
        error = exc if is_user_error(exc) else _out_of_memory(exc)
        if error is None:
            raise
        Console(stderr=True).print(f"[red]error:[/red] {escape(_message(error))}", markup=True, highlight=False,
                                   soft_wrap=True)  # one line, whatever the terminal's width: paths stay whole
        raise typer.Exit(code=2) from None


@contextmanager
def interrupt_exits(message: str | None = None) -> Iterator[None]:
    """Ctrl-C / SIGTERM end the command with exit code 130, after ``message`` on stderr (``interrupted: …``, what
    was kept) — unless the code inside has said it (:class:`~maskattn.errors.Interrupted`, as the trainer does;
    ``message`` None: it always does)."""
    try:
        yield
    except KeyboardInterrupt as exc:
        if message is not None and not isinstance(exc, Interrupted):
            Console(stderr=True).print(f"[yellow]interrupted:[/yellow] {escape(message)}", markup=True,
                                       highlight=False, soft_wrap=True)
        raise typer.Exit(code=130) from None


def sigterm_as_interrupt() -> None:
    """SIGTERM (kill) stops training like Ctrl-C: checkpoints already written stay intact."""
    def handler(signum, frame):
        raise KeyboardInterrupt
    if sys.platform != "win32":
        signal.signal(signal.SIGTERM, handler)


