"""Where a grid's runs are started, behind one interface (:class:`~.base.Launcher`: ``submit``, ``poll``,
``cancel``): :mod:`.local` (the default: processes of the grid command on this machine) and :mod:`.slurm` (Slurm jobs
through submitit; what a job runs is :mod:`.slurm_job`).

Both start the same worker (:mod:`maskattn.grid.worker`) in the run's folder, and each records in the run's
``launch.json`` where it started the run (``launcher``, ``submitted``, ``host``, and its job), so a grid may be started
with one launcher and continued with the other: the records are the same. :func:`recorded_jobs` asks each launcher,
from those records, where the jobs it started earlier are now (``grid run`` leaves a queued or running job to
itself, ``grid status`` shows it).
"""

from __future__ import annotations

from collections.abc import Callable

from ...errors import ArgumentError, ConfigError
from ..records import read_record
from ..spec import LAUNCH_RECORD, Grid
from .base import ENDED, QUEUED, RUNNING, Job, Launcher
from .local import LocalLauncher
from .slurm import SlurmLauncher, SlurmOptions

__all__ = ["LAUNCHERS", "make_launcher", "recorded_jobs", "Launcher", "Job", "LocalLauncher", "SlurmLauncher",
           "SlurmOptions", "QUEUED", "RUNNING", "ENDED"]

#: the launchers by name (``--launcher``), the default first
LAUNCHERS: dict[str, type[Launcher]] = {"local": LocalLauncher, "slurm": SlurmLauncher}


def make_launcher(name: str, *, jobs: int | None = None, threads: int | None = None,
                  slurm: SlurmOptions | None = None, poll_s: float = 2.0,
                  say: Callable[[str], None] = print) -> Launcher:
    """The launcher ``name`` with the settings of ``grid run``, checked: ``jobs`` and ``threads`` (each launcher's
    defaults when ``None``); ``slurm`` (what the jobs ask for) and ``poll_s`` are the Slurm launcher's."""
    if name not in LAUNCHERS:
        raise ArgumentError(f"--launcher must be one of {', '.join(LAUNCHERS)}, got {name!r}")
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise ConfigError(f"--jobs must be an int >= 1, got {jobs}")
    if threads is not None and threads < 1:
        raise ConfigError(f"--threads must be an int >= 1, got {threads}")
    if name == SlurmLauncher.name:
        return SlurmLauncher(options=slurm, jobs=jobs, threads=threads, poll_s=poll_s, say=say)
    return LocalLauncher(jobs=jobs, threads=threads, say=say)


def recorded_jobs(grid: Grid) -> dict[str, Job]:
    """The jobs the runs of ``grid`` were last started in, as their ``launch.json`` records them (run name → job),
    each polled by its launcher (``phase`` ``None``: the launcher cannot tell now); runs without such a job are
    left out. The launchers are asked once each, and only about jobs of theirs."""
    launchers = {name: launcher() for name, launcher in LAUNCHERS.items()}
    jobs: dict[str, Job] = {}
    for run in grid.runs:
        launch = read_record(grid.folder / run.name, LAUNCH_RECORD)
        name = launch.get("launcher")
        launcher = launchers.get(name) if isinstance(name, str) else None
        if launcher is not None and (job := launcher.recorded(run.name, launch)) is not None:
            jobs[run.name] = job
    for launcher in launchers.values():
        launcher.poll([job for job in jobs.values() if job.launcher == launcher.name])
    return jobs
