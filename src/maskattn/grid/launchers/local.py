"""The local launcher (the default): each run's worker a child process of the grid command, ``--jobs`` at a time with
``--threads`` intra-op threads each, until all have ended. A worker dies with the grid command (``MASKATTN_GRID_PARENT``,
:mod:`maskattn.cli.grid_worker`); Ctrl-C / SIGTERM stop the workers, which keep their checkpoints."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

from ...train.resumable import write_json
from ..spec import LAUNCH_RECORD, RUN_LOG, Grid, GridRun
from ..worker import PARENT_ENV, WORKER, thread_env
from .base import ENDED, RUNNING, Job, Launcher

__all__ = ["LocalLauncher"]


class LocalLauncher(Launcher):
    """Workers on this machine (module docstring). ``jobs``: at a time (default 1); ``threads``: each (default:
    ``OMP_NUM_THREADS`` when it is set, else the CPU count shared out). Its ``launch.json``: ``launcher``,
    ``submitted`` (Unix time), the ``host`` and the worker's ``pid``."""

    name = "local"
    poll_s = 0.2

    def __init__(self, *, jobs: int | None = None, threads: int | None = None,
                 say: Callable[[str], None] = print) -> None:
        jobs = jobs or 1
        if threads is None:  # a thread budget already set for this process (OMP_NUM_THREADS), else the CPUs shared out
            given = os.environ.get("OMP_NUM_THREADS", "")
            threads = int(given) if given.isdigit() and int(given) > 0 else max(1, (os.cpu_count() or 1) // jobs)
        super().__init__(jobs=jobs, threads=threads, say=say)

    def check(self) -> None:
        """Nothing to check: the workers run here."""

    def describe(self, *, pending: int, queued: int, busy: int) -> str:
        return f"{pending} to run, {self.at_once} at a time with {self.threads} thread(s) each"

    def submit(self, grid: Grid, runs: Sequence[GridRun]) -> list[Job]:
        return [self._start(grid, run) for run in runs]

    def _start(self, grid: Grid, run: GridRun) -> Job:
        folder = grid.folder / run.name
        folder.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **thread_env(self.threads), PARENT_ENV: str(os.getpid())}  # it dies with this process
        submitted = time.time()
        with open(folder / RUN_LOG, "ab") as log:
            process = subprocess.Popen([sys.executable, "-m", WORKER, str(grid.folder.resolve()), run.name,
                                        str(self.threads)], cwd=grid.cwd, env=env, stdout=log,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        write_json(folder / LAUNCH_RECORD, {"launcher": self.name, "submitted": submitted,
                                            "host": socket.gethostname(), "pid": process.pid})
        return Job(run.name, self.name, "pid", str(process.pid), RUNNING, process=process)

    def poll(self, jobs: Sequence[Job]) -> bool:
        """Each worker running, or ended with its exit status."""
        for job in jobs:
            if job.process is not None and (code := job.process.poll()) is not None:
                job.phase, job.exit_code = ENDED, code
        return True

    def cancel(self, jobs: Sequence[Job]) -> None:
        """SIGTERM to every worker (each stops like Ctrl-C: its checkpoints stay), and wait until all have ended."""
        running = [job.process for job in jobs if job.process is not None]
        for process in running:
            process.terminate()
        for process in running:
            process.wait()
        self.say(f"grid stopped: {len(jobs)} run(s) interrupted; run the same command again to continue")

    def recorded(self, run: str, launch: dict) -> Job | None:
        """None: a worker is this launcher's job only in the grid command that started it; another command's worker
        is known by the lock it holds (:func:`maskattn.grid.records.is_held`)."""
        return None
