"""The process of one grid run, whichever launcher started it: ``python -m maskattn.cli.grid_worker GRID RUN THREADS``
(:data:`WORKER`) runs :func:`run_one` — the run trained to its end by :func:`maskattn.train.resumable.run_to_end` in
its folder (a finished run is not trained again, an interrupted one continues from its ``last.safetensors``).

The worker holds its run while it trains it (``<run>/.grid-worker``, a ``flock``: a run another process holds is
left to it, exit status :data:`BUSY_EXIT`; a run another process finished before this worker took it is left as it
is — nothing recorded, printed or appended to its log —, exit status :data:`DONE_EXIT`, so two ``grid run`` on one
folder never both report it as finished) and records its start and end in ``<run>/worker.json``: ``host``,
``pid``, ``job_id`` (``SLURM_JOB_ID``, or the array's ``<job>_<task>``), ``started``; and once it has stopped,
``ended`` and ``outcome`` (``finished``, ``interrupted``: it keeps its checkpoints, or ``failed`` with ``error``).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..train.resumable import FREE_SETTINGS, read_summary, run_to_end, write_json
from .spec import WORKER_LOCK, WORKER_RECORD, load_grid

if TYPE_CHECKING:
    from ..train.config import RunConfig

__all__ = ["run_one", "thread_env", "WORKER", "BUSY_EXIT", "DONE_EXIT", "PARENT_ENV"]

#: the module a run's process executes: ``python -m <WORKER> GRID RUN THREADS`` (:func:`run_one`)
WORKER = "maskattn.cli.grid_worker"
#: a worker's exit status when another process holds its run
BUSY_EXIT = 75
#: a worker's exit status when its run had finished before it took it (another process trained it meanwhile)
DONE_EXIT = 76
#: the process a worker dies with (its pid): the grid process, or a Slurm job's (``maskattn.cli.grid_worker``)
PARENT_ENV = "MASKATTN_GRID_PARENT"


def thread_env(threads: int) -> dict[str, str]:
    """The environment variables that give a worker ``threads`` intra-op threads."""
    return {name: str(threads) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}


def _train_beside(cfg: RunConfig) -> None:
    """What a process of ``torchrun`` other than the first does for a grid run: the same training as the first
    (:func:`~maskattn.train.resumable.run_to_end`'s choice: nothing when finished, resume from ``last.safetensors``
    or start), leaving the run folder's records to the first."""
    from ..train.trainer import Trainer

    folder = Path(cfg.train.out_dir)
    if read_summary(folder, cfg.train.metric) is not None:
        return
    last = folder / "last.safetensors"
    if last.exists():
        free = {key: getattr(cfg.train, key) for section, key in sorted(FREE_SETTINGS) if section == "train"}
        Trainer.resume(last, train_overrides=free).fit()
    else:
        Trainer(cfg, overwrite=True).fit()


def run_one(grid_folder: str | Path, name: str, threads: int) -> int:
    """Run the run ``name`` of the grid in ``grid_folder`` to its end with ``threads`` threads (module docstring);
    the exit status: 0, :data:`BUSY_EXIT` when another process holds the run, :data:`DONE_EXIT` when it had
    finished already. Under ``torchrun`` the first process holds the run and records it; the others train beside
    it."""
    grid = load_grid(grid_folder)
    run = next((r for r in grid.runs if r.name == name), None)
    if run is None:
        raise ConfigError(f"grid {grid_folder} has no run {name!r}")
    folder = grid.folder / run.name
    folder.mkdir(parents=True, exist_ok=True)
    if int(os.environ.get("RANK", "0")) != 0:  # a process of torchrun beside the first one
        _train_beside(grid.config(run, [f"train.num_threads={threads}"]))
        return 0
    with open(folder / WORKER_LOCK, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return BUSY_EXIT
        if read_summary(folder) is not None:  # finished by another process since this one was started
            return DONE_EXIT
        job = os.environ.get("SLURM_JOB_ID")
        if os.environ.get("SLURM_ARRAY_TASK_ID") and os.environ.get("SLURM_ARRAY_JOB_ID"):
            job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
        record: dict = {"host": socket.gethostname(), "pid": os.getpid(), "job_id": job, "started": time.time()}
        write_json(folder / WORKER_RECORD, record)
        try:
            summary, _ = run_to_end(grid.config(run, [f"train.num_threads={threads}"]))
        except KeyboardInterrupt:
            write_json(folder / WORKER_RECORD, {**record, "ended": time.time(), "outcome": "interrupted"})
            raise
        except BaseException as exc:
            write_json(folder / WORKER_RECORD, {**record, "ended": time.time(), "outcome": "failed",
                                                "error": f"{type(exc).__name__}: {exc}"[:2000]})
            raise
        write_json(folder / WORKER_RECORD, {**record, "ended": time.time(), "outcome": "finished"})
        print(json.dumps(summary))
    return 0
