"""Running a grid (``maskattn grid run``): :func:`run_grid` decides what is left to do and has a launcher
(:mod:`maskattn.grid.launchers`, by its name) run it, without knowing which launcher it has.

Every run is run to its end by its own worker process (:mod:`maskattn.grid.worker`): a finished run (its
``summary.json``) is not run again, an interrupted one resumes from its ``last.safetensors``, and a run whose job
is queued or running already (its ``launch.json``) is left to it. Several grid processes may share one grid folder:
each run is held by the worker that trains it, and a run another process holds is left to it. The local launcher's
workers run ``jobs`` at a time, followed here until all have ended; a detached launcher's (Slurm's) are submitted at
once, under the grid folder's submit lock (two grid commands submit nothing twice), and followed only when asked to
(``wait``).
"""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from .launchers import ENDED, QUEUED, RUNNING, Job, Launcher, SlurmOptions, make_launcher, recorded_jobs
from .records import is_held, log_tail, read_record, read_summary, result_text
from .spec import RUN_LOG, WORKER_RECORD, Grid, GridRun
from .worker import BUSY_EXIT, DONE_EXIT

__all__ = ["run_grid", "OUTCOMES"]

#: what became of each run in :func:`run_grid`
OUTCOMES = ("finished", "done", "busy", "failed", "queued", "submitted", "stopped")
_SUBMIT_LOCK = ".grid-submit"


def run_grid(grid: Grid, *, jobs: int | None = None, threads: int | None = None,
             say: Callable[[str], None] = print, launcher: str = "local", slurm: SlurmOptions | None = None,
             wait: bool = False, poll_s: float = 2.0) -> dict[str, list[str]]:
    """Run every unfinished run of ``grid`` (module docstring). ``launcher="local"``: ``jobs`` at a time (default 1)
    with ``threads`` threads each (default: ``OMP_NUM_THREADS`` when it is set, else the CPU count shared out), here,
    until all have ended; ``launcher="slurm"``: as Slurm jobs (:mod:`maskattn.grid.launchers.slurm`; ``slurm``: what
    they ask for; ``jobs``: how many run at once, default no limit; ``threads``: default ``cpus_per_task``, else 1),
    returning once they are submitted unless ``wait`` (then the queue is looked at every ``poll_s`` seconds).
    Returns the run names by outcome (:data:`OUTCOMES`): ``finished`` now, ``done`` earlier, ``busy`` in another
    process, ``queued`` (or running) in Slurm already, left to it, ``submitted`` to Slurm now, ``failed``,
    ``stopped`` (a Slurm job that ended before its run finished). Ctrl-C / SIGTERM stop the local runs, which keep
    their checkpoints (``KeyboardInterrupt`` is raised again once they have stopped); Slurm jobs go on."""
    chosen = make_launcher(launcher, jobs=jobs, threads=threads, slurm=slurm, poll_s=poll_s, say=say)
    chosen.check()
    grid.folder.mkdir(parents=True, exist_ok=True)
    grid.save()
    outcome: dict[str, list[str]] = {name: [] for name in OUTCOMES}
    with _submit_lock(grid.folder) if chosen.detached else contextlib.nullcontext():
        earlier = {name: job for name, job in recorded_jobs(grid).items() if job.phase in (QUEUED, RUNNING)}
        pending: list[GridRun] = []
        for run in grid.runs:
            folder = grid.folder / run.name
            if read_summary(folder) is not None:
                outcome["done"].append(run.name)
            elif run.name in earlier:
                outcome["queued"].append(run.name)
            elif chosen.detached and is_held(folder):  # its job would find it held
                outcome["busy"].append(run.name)
            else:
                pending.append(run)
        say(f"grid {grid.folder}: {len(grid.runs)} runs, {len(outcome['done'])} finished earlier, "
            + chosen.describe(pending=len(pending), queued=len(outcome["queued"]), busy=len(outcome["busy"])))
        for name in outcome["queued"]:
            say(f"{name}: {earlier[name].phase} in {earlier[name].name}, left to it")
        for name in outcome["busy"]:
            say(f"{name}: held by another process, left to it")
        running = chosen.submit(grid, pending) if chosen.detached and pending else []
    if chosen.detached:
        outcome["submitted"], pending = [job.run for job in running], []
    if wait or not chosen.detached:
        running += [earlier[name] for name in outcome["queued"] if earlier[name].launcher == chosen.name]
        _follow(grid, chosen, pending, running, outcome, say)
    return outcome


@contextlib.contextmanager
def _submit_lock(grid_folder: Path) -> Iterator[None]:
    """Held while a ``grid run`` decides what to submit and submits it: two at once submit nothing twice."""
    with open(grid_folder / _SUBMIT_LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _follow(grid: Grid, launcher: Launcher, pending: list[GridRun], running: list[Job],
            outcome: dict[str, list[str]], say: Callable[[str], None]) -> None:
    """Start the ``pending`` runs, ``launcher.at_once`` jobs running at a time, and look at the jobs every
    ``launcher.poll_s`` seconds until all have ended, reporting each (:func:`_report`); a detached launcher's jobs
    also when they start. Interrupted: the launcher cancels what is its to cancel."""
    told = set()  # the jobs whose start was said
    try:
        while pending or running:
            free = (launcher.at_once or len(pending)) - len(running)
            if pending and free > 0:
                starting = _unfinished(grid, pending[:free], outcome, say)
                del pending[:free]
                running += launcher.submit(grid, starting) if starting else []
                if not starting:
                    continue
            time.sleep(launcher.poll_s)
            if not launcher.poll(running):
                continue  # the launcher cannot tell this time
            for job in list(running):
                if launcher.detached and job.phase == RUNNING and job not in told:
                    told.add(job)
                    say(f"{job.run}: running ({job.name})")
                if job.phase == ENDED:
                    running.remove(job)
                    _report(grid, job, outcome, say)
    except KeyboardInterrupt:
        launcher.cancel(running)
        raise


def _unfinished(grid: Grid, runs: list[GridRun], outcome: dict[str, list[str]],
                say: Callable[[str], None]) -> list[GridRun]:
    """``runs`` less those another process has finished since the grid was planned (``done``, said so)."""
    left = []
    for run in runs:
        if read_summary(grid.folder / run.name) is None:
            left.append(run)
        else:
            _finished_elsewhere(run.name, outcome, say)
    return left


def _finished_elsewhere(name: str, outcome: dict[str, list[str]], say: Callable[[str], None]) -> None:
    outcome["done"].append(name)
    say(f"{name}: finished by another process meanwhile")


def _report(grid: Grid, job: Job, outcome: dict[str, list[str]], say: Callable[[str], None]) -> None:
    """How the run of an ended job ended: ``busy`` (its worker found it held), ``done`` (its worker found it
    finished by another process), ``finished`` (its summary is there,
    and its worker exited 0 if this process saw it exit), ``failed`` (a worker that exited otherwise, or whose
    record says so, or that never recorded itself but wrote to the log), else ``stopped`` (interrupted: the next
    ``grid run`` continues it)."""
    name, folder = job.run, grid.folder / job.run
    if job.exit_code == BUSY_EXIT:
        outcome["busy"].append(name)
        say(f"{name}: held by another process, left to it")
        return
    if job.exit_code == DONE_EXIT:
        _finished_elsewhere(name, outcome, say)
        return
    summary = read_summary(folder)
    worker = read_record(folder, WORKER_RECORD)
    if summary is not None and job.exit_code is None and worker.get("job_id") not in (None, job.id):
        _finished_elsewhere(name, outcome, say)  # a queue's job that found its run finished by another's worker
        return
    if summary is not None and job.exit_code in (None, 0):
        outcome["finished"].append(name)
        took = f"({job.name})" if job.exit_code is None else f"in {time.perf_counter() - job.started:.0f} s"
        say(f"{name}: finished {took}, {result_text(summary) or 'no test split'}")
        return
    tail = log_tail(folder, 1, grid.folder)
    if job.exit_code is not None or worker.get("outcome") == "failed" or (not worker and tail):
        outcome["failed"].append(name)
        why = job.name if job.exit_code is None else f"exit status {job.exit_code}"
        say(f"{name}: failed ({why}): {tail[-1] if tail else 'no output'} (log: {folder / RUN_LOG})")
    else:
        outcome["stopped"].append(name)
        say(f"{name}: stopped ({job.name} ended{' ' + job.ended_as.lower() if job.ended_as else ''}) before it "
            "finished; run the grid again to continue it")
