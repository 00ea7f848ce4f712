"""The process of one grid run: ``python -m maskattn.cli.grid_worker GRID RUN THREADS`` (started by ``maskattn grid
run``'s launcher; :func:`maskattn.grid.worker.run_one`). A user's mistake is one ``error:`` line in the run's log and
exit status 2, Ctrl-C / SIGTERM stop it with its checkpoints kept (130), another process holding the run gives
:data:`~maskattn.grid.worker.BUSY_EXIT`.

The worker dies with the process that started it (``MASKATTN_GRID_PARENT``: the grid process, or a Slurm job's
process): when that one ends, even by ``kill -9``, the worker gets SIGTERM and stops as above — no orphan goes on
training a run that a later ``grid run`` would start again beside it."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import typer

from ..grid.worker import PARENT_ENV, run_one
from .app import interrupt_exits, sigterm_as_interrupt, user_errors

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """SIGTERM to this process when its parent dies (Linux: ``prctl(PR_SET_PDEATHSIG)``; elsewhere a thread that
    watches the parent); a parent already gone (``MASKATTN_GRID_PARENT`` is not the parent any more) raises
    ``KeyboardInterrupt`` at once."""
    parent = os.environ.get(PARENT_ENV, "")
    armed = False
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
    if parent.isdigit() and os.getppid() != int(parent):
        raise KeyboardInterrupt  # the parent died before the line above
    if not armed and parent.isdigit():
        def watch() -> None:
            while os.getppid() == int(parent):
                time.sleep(1)
            os.kill(os.getpid(), signal.SIGTERM)
        threading.Thread(target=watch, name="grid-parent-watch", daemon=True).start()


def main(argv: list[str]) -> int:
    sigterm_as_interrupt()
    try:
        with user_errors(), interrupt_exits():
            die_with_parent()
            return run_one(argv[0], argv[1], int(argv[2]))
    except typer.Exit as exit_:
        return exit_.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
