"""Where each run of a grid is now (``maskattn grid status``), whichever launcher started it: from the run's
records (:mod:`maskattn.grid.records`) and, for a run whose job its launcher can still see, that launcher
(:func:`maskattn.grid.launchers.recorded_jobs`: Slurm's queue)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .launchers import ENDED, QUEUED, RUNNING, recorded_jobs
from .records import is_held, log_tail, read_record, read_summary, result_text
from .spec import LAUNCH_RECORD, WORKER_RECORD, Grid

__all__ = ["RunStatus", "run_status", "STATES"]

STATES = ("finished", "running", "queued", "failed", "stopped", "not started")


@dataclass
class RunStatus:
    """One run's state (:data:`STATES`): ``job`` is its Slurm job (or ``pid@host`` of a local worker), ``detail`` a
    line to show (the test metric; the last lines of the log of a failed run), ``nodes`` where its queued or running
    job is (``on n[1-2]``; ``2 nodes`` while a job of several nodes waits)."""

    name: str
    state: str
    job: str | None = None
    detail: list[str] = field(default_factory=list)
    nodes: str | None = None


def run_status(grid: Grid, lines: int = 3) -> list[RunStatus]:
    """Every run of ``grid``: finished (``summary.json``), running (a worker holds it, or its Slurm job runs),
    queued (its Slurm job waits), failed (its worker's last try failed, or its job ended before the worker
    started), stopped (interrupted or killed: the next ``grid run`` continues it) or not started; a failed run with
    the last ``lines`` lines of its log."""
    jobs = recorded_jobs(grid)
    statuses = []
    for run in grid.runs:
        folder = grid.folder / run.name
        launch, worker = read_record(folder, LAUNCH_RECORD), read_record(folder, WORKER_RECORD)
        job = str(launch["job_id"]) if launch.get("job_id") else None
        local = f"pid {worker.get('pid')} on {worker.get('host')}" if worker.get("pid") else None
        recorded = jobs.get(run.name)
        try:
            summary = read_summary(folder)
        except ValueError as exc:
            statuses.append(RunStatus(run.name, "failed", job, [str(exc)]))
            continue
        if summary is not None:
            result = result_text(summary)
            statuses.append(RunStatus(run.name, "finished", job, [result] if result else []))
        elif recorded is not None and recorded.phase in (QUEUED, RUNNING):
            statuses.append(RunStatus(run.name, recorded.phase, job, nodes=recorded.nodes))
        elif is_held(folder):
            statuses.append(RunStatus(run.name, "running", job or local))
        elif worker.get("outcome") == "failed":
            statuses.append(RunStatus(run.name, "failed", job or local, log_tail(folder, lines, grid.folder)))
        elif worker or (folder / "last.safetensors").exists():
            checkpoint = (folder / "last.safetensors").exists()
            statuses.append(RunStatus(run.name, "stopped", job or local,
                                      ["continues from its last.safetensors" if checkpoint else
                                       "no checkpoint yet: starts again"]))
        elif recorded is not None and recorded.phase == ENDED:
            statuses.append(RunStatus(run.name, "failed", job, log_tail(folder, lines, grid.folder)
                                      or [f"its {recorded.kind} ended before the worker started"]))
        else:
            statuses.append(RunStatus(run.name, "not started"))
    return statuses
