"""The process of one grid run: ``python -m maskattn.cli.grid_worker GRID RUN THREADS`` (started by ``maskattn grid
run``; :func:`maskattn.train.grid.run_one`). A user's mistake is one ``error:`` line in the run's log and exit status
2, Ctrl-C / SIGTERM stop it with its checkpoints kept (130), another process holding the run gives
:data:`~maskattn.train.grid.BUSY_EXIT`."""

from __future__ import annotations

import sys

import typer

from .app import interrupt_exits, sigterm_as_interrupt, user_errors


def main(argv: list[str]) -> int:
    from ..train.grid import run_one

    sigterm_as_interrupt()
    try:
        with user_errors(), interrupt_exits():
            return run_one(argv[0], argv[1], int(argv[2]))
    except typer.Exit as exit_:
        return exit_.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
