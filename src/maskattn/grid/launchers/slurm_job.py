"""What a Slurm job of a grid runs: :class:`SlurmRun`, pickled by value with this module when the job is submitted
(:func:`maskattn.grid.launchers.slurm.SlurmLauncher.submit`), so that the job's own process needs neither maskattn
nor torch — only the standard library and submitit; the worker it starts imports them, once. Nothing here may
import maskattn."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

__all__ = ["SlurmRun", "FRUITLESS"]

#: the worker's environment variable naming the process it dies with (maskattn.grid.worker.PARENT_ENV)
PARENT_ENV = "MASKATTN_GRID_PARENT"


class SlurmRun:
    """What a Slurm job of a grid runs (pickled by submitit): the run's worker as a child process, its output
    appended to ``<run>/train.log`` — ``torchrun --nproc_per_node N`` around it when the job has N > 1 GPUs. On
    Slurm's ``USR2`` (the time limit is near, or a preemption) submitit calls :meth:`checkpoint`: the worker is
    stopped (``SIGTERM``: it keeps its checkpoints) and the job requeued, unless the run has written no checkpoint
    in its last jobs (then requeueing would not get further). Self-contained on purpose (module docstring).

    A job of ``tasks`` > 1 (``--slurm-nodes`` × ``--slurm-tasks-per-node``) runs this in every task, each with its
    worker: the workers form one process group from Slurm's environment (``maskattn.train.distributed``), the first
    task's (``SLURM_PROCID`` 0, ``RANK`` 0 in its worker's environment) holding the run and its records. submitit
    calls :meth:`checkpoint` in the first task only; on ``USR2`` the others stop their workers too, and end without
    an error (``srun --kill-on-bad-exit``, which ends every task when one fails, would otherwise cut the first
    task's requeue short)."""

    def __init__(self, grid_folder: str, name: str, command: list[str], env: dict[str, str], cwd: str,
                 watch_parent: bool = True, busy_exit: int = 75, fruitless: int = 0, done_exit: int = 76,
                 tasks: int = 1) -> None:
        self.grid_folder, self.name, self.command, self.env, self.cwd = grid_folder, name, command, env, cwd
        self.watch_parent, self.busy_exit, self.done_exit = watch_parent, busy_exit, done_exit
        self.fruitless = fruitless  # jobs in a row, before this one, in which the run wrote no checkpoint
        self.tasks = tasks
        self._process: subprocess.Popen | None = None
        self._started = 0.0
        self._stopping = False

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("_process", "_started", "_stopping")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _process=None, _started=0.0, _stopping=False)
        self.__dict__.setdefault("tasks", 1)

    def __call__(self) -> int:
        folder = os.path.join(self.grid_folder, self.name)
        os.makedirs(folder, exist_ok=True)
        env = {**os.environ, **self.env}
        env.pop(PARENT_ENV, None)
        if self.watch_parent:  # the worker dies with this process (cli/grid_worker.py)
            env[PARENT_ENV] = str(os.getpid())
        rank = os.environ.get("SLURM_PROCID", "0")
        if self.tasks > 1:
            env["RANK"] = rank  # the first task's worker holds the run (maskattn.grid.worker reads RANK)
            env.pop("WORLD_SIZE", None)  # Slurm's tasks, not torchrun's (an exported WORLD_SIZE would win)
            if rank != "0":
                _chain_usr2(self._stop_beside)
        self._started = time.time()
        log = os.path.join(folder, "train.log")
        with open(log, "ab") as handle:
            self._process = subprocess.Popen(self.command, cwd=self.cwd, env=env, stdout=handle,
                                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             preexec_fn=_ignore_usr2)
        while (code := self._process.poll()) is None:  # not wait(): checkpoint() runs in a signal handler meanwhile,
            time.sleep(0.5)  # and Popen's lock, held through wait(), would deadlock it
        if self._stopping:  # a task beside the first, stopped for the requeue the first task asks for
            return code
        if code not in (0, self.busy_exit, self.done_exit):
            last = _last_line(log)
            raise RuntimeError(f"grid run {self.name}: the worker ended with exit status {code}"
                               f"{': ' + last if last else ''} (log: {log})")
        return code

    def checkpoint(self):
        """Stop the worker (it keeps its checkpoints) and return the submission that continues the run, or ``None``
        (no requeue) when the run has finished, or when it has written no checkpoint in this job nor in the
        :data:`FRUITLESS` jobs before it (the time limit is too short to get further)."""
        import submitit

        if self._process is not None:
            _stop(self._process.pid)
        folder = os.path.join(self.grid_folder, self.name)
        if os.path.exists(os.path.join(folder, "summary.json")):
            return None  # finished just now: nothing to continue
        last = os.path.join(folder, "last.safetensors")
        progressed = os.path.exists(last) and os.stat(last).st_mtime >= self._started
        fruitless = 0 if progressed else self.fruitless + 1
        if fruitless > FRUITLESS:
            print(f"grid run {self.name}: not requeued: no checkpoint was written in its last {fruitless} jobs (raise "
                  "--slurm-time or lower train.eval_every)", file=sys.stderr, flush=True)
            return None
        return submitit.helpers.DelayedSubmission(type(self)(self.grid_folder, self.name, self.command, self.env,
                                                             self.cwd, self.watch_parent, self.busy_exit, fruitless,
                                                             self.done_exit, self.tasks))

    def _stop_beside(self) -> None:
        """A task other than the first, on ``USR2``: stop its worker (it keeps nothing of its own: the first task's
        worker writes the checkpoints) so that the job ends cleanly while the first task requeues it."""
        self._stopping = True
        if self._process is not None:
            _stop(self._process.pid)


#: jobs in a row without a new checkpoint after which a run is not requeued
FRUITLESS = 2


def _stop(pid: int, timeout: float = 120) -> None:
    """SIGTERM to the worker ``pid`` and wait (with ``os.waitpid``: this runs in a signal handler) until it has ended;
    SIGKILL after ``timeout`` seconds."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return  # reaped already
        if done:
            return
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            deadline = float("inf")
        time.sleep(0.2)


def _last_line(path: str, span: int = 2**16) -> str:
    """The last non-empty line of the log ``path`` within its last ``span`` bytes, read from its end (a failed
    run's log may be gigabytes; ``maskattn.grid.records.log_tail`` reads it the same way, which this module may
    not import); "" when there is none."""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - span))
            lines = handle.read(span).decode("utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    if size > span:
        lines = lines[1:]  # the line the piece starts inside
    return next((line.strip() for line in reversed(lines) if line.strip()), "")


def _chain_usr2(then) -> None:
    """Call ``then()`` after the ``USR2`` handler submitit installed (which, in a task other than the first, only
    logs the signal)."""
    before = signal.getsignal(signal.SIGUSR2)

    def handler(signum, frame):
        if callable(before):
            before(signum, frame)
        then()

    signal.signal(signal.SIGUSR2, handler)


def _ignore_usr2() -> None:
    """In the worker's process before it starts: Slurm's USR2 reaches every process of the job, and the job's own
    process (submitit) is the one that stops the worker and requeues; SIG_IGN survives exec."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
