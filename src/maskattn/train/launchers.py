"""Where a grid's runs are started — local processes (the default) or Slurm jobs through submitit — and what each run
is doing now (``maskattn grid status``).

Both launchers run the same worker, ``python -m maskattn.cli.grid_worker GRID RUN THREADS``
(:func:`maskattn.train.grid.run_one`: :func:`~maskattn.train.resumable.run_to_end` in the run's folder, its output
appended to ``<run>/train.log``), so a grid may be started with one launcher and continued with the other: the records
are the same. Two small files in a run's folder say where it was started and how its worker ended:

* ``launch.json`` — written by the launcher: ``launcher`` (``local`` / ``slurm``), ``submitted`` (Unix time), the
  ``host`` that submitted it, and ``job_id`` plus ``slurm_folder`` (submitit's files and the job's stdout/stderr,
  under ``<grid>/slurm/``) for Slurm; ``pid`` for a local worker;
* ``worker.json`` — written by the worker: ``host``, ``pid``, ``job_id`` (``SLURM_JOB_ID``, or the array's
  ``<job>_<task>``), ``started``; and once it has stopped, ``ended`` and ``outcome`` (``finished``, ``interrupted``:
  it keeps its checkpoints, or ``failed`` with ``error``).

The Slurm launcher (:func:`submit_slurm`) submits every run that has not finished and is not queued or running
already as one job array (``--jobs``: how many of its tasks run at once); each task runs :class:`SlurmRun`, which
starts the worker and, when Slurm signals the coming time limit (or a preemption, ``USR2``), stops it — it keeps
its ``last.safetensors`` — and has submitit requeue the job, which continues the run from that checkpoint (the
same bit-exact resume as the local launcher's).
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ArgumentError
from .resumable import read_summary, write_json

if TYPE_CHECKING:
    from .grid import Grid, GridRun

__all__ = ["LAUNCHERS", "SlurmOptions", "SlurmRun", "RunStatus", "run_status", "submit_slurm", "follow_slurm",
           "check_slurm", "slurm_states", "parse_slurm_time", "parse_slurm_options", "LAUNCH_RECORD",
           "WORKER_RECORD", "SLURM_FOLDER", "is_held", "read_record", "log_tail"]

LAUNCHERS = ("local", "slurm")
LAUNCH_RECORD = "launch.json"
WORKER_RECORD = "worker.json"
#: the folder of the grid that holds submitit's files and the Slurm jobs' stdout / stderr (one folder per job)
SLURM_FOLDER = "slurm"
_LOCK = ".grid-worker"  # the lock a worker holds on its run (maskattn.train.grid._WORKER_LOCK)
_SUBMIT_LOCK = ".grid-submit"
#: squeue's states of a job waiting to start, and of one started and not yet gone (COMPLETING included: its worker
#: may be requeued still)
_QUEUED = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED", "STOPPED"}
_RUNNING = {"RUNNING", "CONFIGURING", "COMPLETING", "SIGNALING", "STAGE_OUT", "RESIZING"}
#: requeues of one job after time limits or preemptions at most (a job that wrote no checkpoint is not requeued)
MAX_REQUEUES = 100


def read_record(folder: Path, name: str) -> dict:
    """A run's ``launch.json`` / ``worker.json`` (module docstring), ``{}`` when absent or unreadable."""
    try:
        data = json.loads((folder / name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def is_held(folder: Path) -> bool:
    """Whether a worker holds the run in ``folder`` now (its ``flock``; seen from any machine where flock reaches)."""
    lock = folder / _LOCK
    if not lock.exists():
        return False
    try:
        with open(lock, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(handle, fcntl.LOCK_UN)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False


def log_tail(folder: Path, lines: int = 3, grid_folder: Path | None = None) -> list[str]:
    """The last non-empty lines of a run's ``train.log``, or of its Slurm job's stderr when the log has none."""
    paths = [folder / "train.log"]
    launch = read_record(folder, LAUNCH_RECORD)
    if grid_folder is not None and launch.get("slurm_folder"):
        job_folder = grid_folder / launch["slurm_folder"]
        paths += sorted(job_folder.glob("*_log.err")) + sorted(job_folder.glob("*_log.out"))
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        found = [line.rstrip() for line in text.splitlines() if line.strip()]
        if found:
            return found[-lines:]
    return []


# --- Slurm: the options and the controller -----------------------------------------------------------------------

_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_slurm_time(text: str) -> int:
    """Slurm's time spellings (``minutes``, ``minutes:seconds``, ``hours:minutes:seconds``, ``days-hours``,
    ``days-hours:minutes``, ``days-hours:minutes:seconds``) → whole minutes (rounded up)."""
    match = _TIME.match(text.strip())
    if not match:
        raise ArgumentError(f"--slurm-time {text!r}: expected Slurm's time spelling: minutes (60), hours:minutes:"
                            "seconds (4:00:00) or days-hours[:minutes[:seconds]] (1-12)")
    days, a, b, c = (int(g) if g is not None else None for g in match.groups())
    if days is not None:  # days-hours[:minutes[:seconds]]
        seconds = days * 86400 + (a or 0) * 3600 + (b or 0) * 60 + (c or 0)
    elif c is not None:  # hours:minutes:seconds
        seconds = (a or 0) * 3600 + (b or 0) * 60 + c
    elif b is not None:  # minutes:seconds
        seconds = (a or 0) * 60 + b
    else:
        seconds = (a or 0) * 60
    if seconds <= 0:
        raise ArgumentError(f"--slurm-time {text!r}: a time limit must be more than 0")
    return -(-seconds // 60)


def parse_slurm_options(items: Sequence[str]) -> dict[str, str]:
    """``--slurm-option key=value`` items → sbatch's options (``constraint=a100`` → ``#SBATCH --constraint=a100``;
    ``exclusive`` alone → ``--exclusive``)."""
    options: dict[str, str] = {}
    for item in items:
        key, equals, value = item.partition("=")
        key = key.strip().lstrip("-")
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", key):
            raise ArgumentError(f"--slurm-option {item!r}: expected key=value with an sbatch option as the key, "
                                "e.g. constraint=a100 or mail-type=END")
        options[key.replace("_", "-")] = value.strip() if equals else True  # type: ignore[assignment]
    return options


@dataclass
class SlurmOptions:
    """What the jobs of ``maskattn grid run --launcher slurm`` ask Slurm for (``--slurm-*``); ``None``: the cluster's
    default. ``time``: Slurm's spelling (:func:`parse_slurm_time`); ``options``: more sbatch options
    (``--slurm-option key=value``); ``signal_delay_s``: how long before the time limit the job is told to stop
    and requeue (default: a twelfth of the limit, 5 to 90 s; Slurm may send it up to 60 s earlier)."""

    partition: str | None = None
    time: str | None = None
    cpus_per_task: int | None = None
    mem: str | None = None
    gpus_per_task: int | None = None
    account: str | None = None
    qos: str | None = None
    options: dict[str, str] = field(default_factory=dict)
    signal_delay_s: int | None = None

    def check(self) -> None:
        for name in ("cpus_per_task", "gpus_per_task"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ArgumentError(f"--slurm-{name.replace('_', '-')} must be an int >= 1, got {value!r}")
        minutes = parse_slurm_time(self.time) if self.time is not None else None
        delay = self.signal_delay_s
        if delay is not None and (isinstance(delay, bool) or not isinstance(delay, int) or delay < 1
                                  or (minutes is not None and delay >= minutes * 60)):
            limit = f" and below the time limit ({minutes * 60} s)" if minutes is not None else ""
            raise ArgumentError(f"--slurm-signal-delay must be an int >= 1{limit}, got {delay!r}")
        if self.mem is not None and not re.fullmatch(r"\d+[KMGT]?B?", self.mem.strip(), flags=re.IGNORECASE):
            raise ArgumentError(f"--slurm-mem {self.mem!r}: expected Slurm's memory spelling, e.g. 16G or 4000M")


def _run_quietly(command: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def _have_submitit() -> bool:
    """Whether submitit can be imported (without importing it: it sets up its logging to stderr on import)."""
    import importlib.util

    try:
        return importlib.util.find_spec("submitit") is not None
    except (ImportError, ValueError):
        return False


def check_slurm() -> None:
    """Raises :class:`~maskattn.errors.ArgumentError` (one line) unless submitit is installed, Slurm's commands are
    on ``PATH`` and the controller answers: before anything is submitted."""
    if not _have_submitit():
        raise ArgumentError("--launcher slurm needs submitit: pip install 'maskattn[slurm]' (or pip install "
                            "submitit)")
    missing = [name for name in ("sbatch", "squeue", "scontrol") if shutil.which(name) is None]
    if missing:
        raise ArgumentError(f"--launcher slurm: {', '.join(missing)} not found on PATH (Slurm's client commands are "
                            "needed on the machine that submits the grid)")
    try:
        answer = _run_quietly(["squeue", "-h", "-o", "%i", "-j", "0"], timeout=30)
        down = answer.returncode != 0 and "Invalid job id" not in answer.stderr
        reason = answer.stderr.strip().splitlines()[-1] if answer.stderr.strip() else f"exit status {answer.returncode}"
    except subprocess.TimeoutExpired:
        down, reason = True, "no answer in 30 s"
    if down:
        raise ArgumentError(f"--launcher slurm: the Slurm controller does not answer (squeue: {reason})")


def slurm_states() -> dict[str, str] | None:
    """The state of every job of this user that Slurm knows (``"123"`` or ``"123_4"`` for a task of an array →
    ``PENDING``, ``RUNNING``, …), or ``None`` when Slurm cannot be asked."""
    if shutil.which("squeue") is None:
        return None
    try:
        answer = _run_quietly(["squeue", "-h", "-r", "-u", getpass.getuser(), "-o", "%i|%T"], timeout=60)
    except (subprocess.TimeoutExpired, OSError):
        return None
    if answer.returncode != 0:
        return None
    states = {}
    for line in answer.stdout.splitlines():
        job, _, state = line.strip().partition("|")
        if job:
            states[job] = state.strip().upper()
    return states


def _live_state(launch: dict, states: dict[str, str] | None) -> str | None:
    """``queued`` / ``running`` when the run's Slurm job is waiting or started, else ``None``."""
    if launch.get("launcher") != "slurm" or not launch.get("job_id") or states is None:
        return None
    state = states.get(str(launch["job_id"]))
    if state in _QUEUED:
        return "queued"
    if state in _RUNNING:
        return "running"
    return None


# --- Slurm: the job ------------------------------------------------------------------------------------------------

class SlurmRun:
    """What a Slurm job of a grid runs (pickled by submitit): the run's worker as a child process, its output
    appended to ``<run>/train.log`` — ``torchrun --nproc_per_node N`` around it when the job has N > 1 GPUs. On
    Slurm's ``USR2`` (the time limit is near, or a preemption) submitit calls :meth:`checkpoint`: the worker is
    stopped (``SIGTERM``: it keeps its checkpoints) and the job requeued, unless the run has written no checkpoint
    in its last jobs (then requeueing would not get further).

    Self-contained on purpose (the standard library and submitit only; :func:`submit_slurm` pickles it by value): the
    job's own process does not import maskattn or torch — the worker does, once."""

    def __init__(self, grid_folder: str, name: str, command: list[str], env: dict[str, str], cwd: str,
                 watch_parent: bool = True, busy_exit: int = 75, fruitless: int = 0) -> None:
        self.grid_folder, self.name, self.command, self.env, self.cwd = grid_folder, name, command, env, cwd
        self.watch_parent, self.busy_exit = watch_parent, busy_exit
        self.fruitless = fruitless  # jobs in a row, before this one, in which the run wrote no checkpoint
        self._process: subprocess.Popen | None = None
        self._started = 0.0

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("_process", "_started")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _process=None, _started=0.0)

    def __call__(self) -> int:
        folder = os.path.join(self.grid_folder, self.name)
        os.makedirs(folder, exist_ok=True)
        env = {**os.environ, **self.env}
        env.pop("MASKATTN_GRID_PARENT", None)
        if self.watch_parent:  # the worker dies with this process (cli/grid_worker.py)
            env["MASKATTN_GRID_PARENT"] = str(os.getpid())
        self._started = time.time()
        log = os.path.join(folder, "train.log")
        with open(log, "ab") as handle:
            self._process = subprocess.Popen(self.command, cwd=self.cwd, env=env, stdout=handle,
                                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             preexec_fn=_ignore_usr2)
        while (code := self._process.poll()) is None:  # not wait(): checkpoint() runs in a signal handler meanwhile,
            time.sleep(0.5)  # and Popen's lock, held through wait(), would deadlock it
        if code not in (0, self.busy_exit):
            with open(log, encoding="utf-8", errors="replace") as handle:
                lines = [line.strip() for line in handle if line.strip()]
            raise RuntimeError(f"grid run {self.name}: the worker ended with exit status {code}"
                               f"{': ' + lines[-1] if lines else ''} (log: {log})")
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
                                                             self.cwd, self.watch_parent, self.busy_exit, fruitless))


def _slurm_run(grid: Grid, run: GridRun, threads: int, gpus: int) -> SlurmRun:
    """The :class:`SlurmRun` of ``run``: the worker's command (under torchrun for ``gpus`` > 1) and settings."""
    from .grid import BUSY_EXIT, WORKER

    worker = ["-m", WORKER, str(grid.folder.resolve()), run.name, str(threads)]
    command = [sys.executable, *worker]
    if gpus > 1:  # data-parallel over the job's GPUs (docs/cluster.md)
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(gpus),
                   *worker]
    env = {name: str(threads) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    return SlurmRun(str(grid.folder.resolve()), run.name, command, env, grid.cwd, watch_parent=gpus <= 1,
                    busy_exit=BUSY_EXIT)


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


def _ignore_usr2() -> None:
    """In the worker's process before it starts: Slurm's USR2 reaches every process of the job, and the job's own
    process (submitit) is the one that stops the worker and requeues; SIG_IGN survives exec."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


# --- Slurm: submitting and following -------------------------------------------------------------------------------

def _default_minutes(partition: str | None) -> int:
    """The time limit of a job without ``--slurm-time``: the partition's default time, else its maximum, else a
    year (what submitit tracks to tell a time limit from a preemption; Slurm applies its own limits)."""
    try:
        answer = _run_quietly(["sinfo", "-h", "-o", "%P|%L|%l", *(["-p", partition] if partition else [])])
    except (subprocess.TimeoutExpired, OSError):
        return 525600
    for line in answer.stdout.splitlines():
        name, _, rest = line.partition("|")
        if partition is None and not name.endswith("*"):
            continue
        for value in rest.split("|"):
            try:
                return parse_slurm_time(value.strip())
            except ArgumentError:
                continue  # infinite, n/a
    return 525600


def _refusal(text: str, options: SlurmOptions) -> str:
    """Slurm's refusal of a submission as one line, naming the option it is about."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    line = next((ln for ln in lines if "error" in ln.lower()), lines[-1] if lines else "no message")
    line = re.sub(r"^s?batch: error: ", "", line)
    lower = line.lower()
    named = [f"--slurm-{name} {value}" for name, value, words in (
        ("partition", options.partition, ("partition",)), ("time", options.time, ("time limit", "time")),
        ("account", options.account, ("account",)), ("qos", options.qos, ("qos",)),
        ("mem", options.mem, ("memory", "mem")), ("gpus-per-task", options.gpus_per_task, ("gres", "gpu")),
        ("cpus-per-task", options.cpus_per_task, ("cpu", "processor")))
        if value is not None and any(word in lower for word in words)]
    named += [f"--slurm-option {key}" for key in options.options if key in lower]
    return f"--launcher slurm: sbatch refused the jobs: {line}" + (f" ({', '.join(named)})" if named else "")


def submit_slurm(grid: Grid, runs: Sequence[GridRun], options: SlurmOptions, *, threads: int,
                 parallelism: int | None) -> dict[str, str]:
    """Submit ``runs`` as one job array (one job when there is one run), at most ``parallelism`` running at a time,
    and record each job in its run's ``launch.json``; returns run name → job id."""
    import cloudpickle
    import submitit

    options.check()
    minutes = parse_slurm_time(options.time) if options.time else _default_minutes(options.partition)
    executor = submitit.SlurmExecutor(folder=grid.folder.resolve() / SLURM_FOLDER / "%j", max_num_timeout=MAX_REQUEUES)
    extra: dict = dict(options.options)
    for key, value in (("partition", options.partition), ("account", options.account), ("qos", options.qos),
                       ("mem", options.mem), ("gpus-per-task", options.gpus_per_task)):
        if value is not None:
            extra[key] = value
    delay = options.signal_delay_s if options.signal_delay_s is not None else min(90, max(5, minutes * 60 // 12))
    executor.update_parameters(time=minutes, cpus_per_task=options.cpus_per_task or threads, signal_delay_s=delay,
                               job_name=f"grid:{grid.folder.name}", array_parallelism=parallelism or len(runs),
                               additional_parameters=extra)
    gpus = options.gpus_per_task or 0
    module = sys.modules[__name__]
    now = time.time()  # submitted: before sbatch
    cloudpickle.register_pickle_by_value(module)  # the job's process needs neither maskattn nor torch (SlurmRun)
    try:
        with contextlib.redirect_stderr(io.StringIO()) as said:  # submitit prints sbatch's refusal too: one line
            try:
                with executor.batch():
                    jobs = [executor.submit(_slurm_run(grid, run, threads, gpus)) for run in runs]
            except submitit.core.utils.FailedJobError as exc:
                raise ArgumentError(_refusal(str(exc) or said.getvalue(), options)) from None
    finally:
        cloudpickle.unregister_pickle_by_value(module)
    submitted, host = {}, socket.gethostname()
    for run, job in zip(runs, jobs):
        job_folder = Path(str(job.paths.folder))
        (grid.folder / run.name).mkdir(parents=True, exist_ok=True)
        write_json(grid.folder / run.name / LAUNCH_RECORD,
                   {"launcher": "slurm", "job_id": str(job.job_id), "submitted": now, "host": host,
                    "slurm_folder": str(job_folder.relative_to(grid.folder.resolve()))})
        submitted[run.name] = str(job.job_id)
    return submitted


def follow_slurm(grid: Grid, jobs: dict[str, str], outcome: dict[str, list[str]], say: Callable[[str], None],
                 poll_s: float = 2.0) -> None:
    """Wait until the jobs of ``jobs`` (run name → job id) have left the queue, saying when each starts and how each
    ends (``outcome``: ``finished`` / ``failed`` / ``stopped``)."""
    waiting, started = dict(jobs), set()
    while waiting:
        time.sleep(poll_s)
        states = slurm_states()
        if states is None:
            continue  # the controller did not answer this time
        for name, job in list(waiting.items()):
            state = states.get(job)
            if state in _RUNNING and name not in started:
                started.add(name)
                say(f"{name}: running (Slurm job {job})")
            if state in _QUEUED or state in _RUNNING:
                continue
            del waiting[name]
            folder = grid.folder / name
            summary = read_summary(folder)
            if summary is not None:
                outcome["finished"].append(name)
                test = summary.get("test", {}).get(summary.get("metric"))
                result = f"test {summary.get('metric')} {test:.4f}" if isinstance(test, float) else "no test split"
                say(f"{name}: finished (Slurm job {job}), {result}")
                continue
            worker = read_record(folder, WORKER_RECORD)
            tail = log_tail(folder, 1, grid.folder)
            if worker.get("outcome") == "failed" or (not worker and tail):
                outcome["failed"].append(name)
                say(f"{name}: failed (Slurm job {job}): {tail[-1] if tail else 'no output'} "
                    f"(log: {folder / 'train.log'})")
            else:
                outcome["stopped"].append(name)
                say(f"{name}: stopped (Slurm job {job} ended{' ' + state.lower() if state else ''}) before it "
                    "finished; run the grid again to continue it")


# --- the status of every run ---------------------------------------------------------------------------------------

STATES = ("finished", "running", "queued", "failed", "stopped", "not started")


@dataclass
class RunStatus:
    """One run's state (:data:`STATES`): ``job`` is its Slurm job (or ``pid@host`` of a local worker), ``detail`` a
    line to show (the test metric; the last lines of the log of a failed run)."""

    name: str
    state: str
    job: str | None = None
    detail: list[str] = field(default_factory=list)


def run_status(grid: Grid, states: dict[str, str] | None = None, lines: int = 3) -> list[RunStatus]:
    """Every run of ``grid``: finished (``summary.json``), running (a worker holds it, or its Slurm job runs),
    queued (its Slurm job waits), failed (its worker's last try failed), stopped (interrupted or killed: the next
    ``grid run`` continues it) or not started; a failed run with the last ``lines`` lines of its log."""
    if states is None and any(read_record(grid.folder / run.name, LAUNCH_RECORD).get("launcher") == "slurm"
                              for run in grid.runs):
        states = slurm_states()
    statuses = []
    for run in grid.runs:
        folder = grid.folder / run.name
        launch, worker = read_record(folder, LAUNCH_RECORD), read_record(folder, WORKER_RECORD)
        job = str(launch["job_id"]) if launch.get("job_id") else None
        local = f"pid {worker.get('pid')} on {worker.get('host')}" if worker.get("pid") else None
        try:
            summary = read_summary(folder)
        except ValueError as exc:
            statuses.append(RunStatus(run.name, "failed", job, [str(exc)]))
            continue
        if summary is not None:
            test = summary.get("test", {}).get(summary.get("metric"))
            detail = [f"test {summary.get('metric')} {test:.4f}"] if isinstance(test, float) else []
            statuses.append(RunStatus(run.name, "finished", job, detail))
        elif (live := _live_state(launch, states)) is not None:
            statuses.append(RunStatus(run.name, live, job))
        elif is_held(folder):
            statuses.append(RunStatus(run.name, "running", job or local))
        elif worker.get("outcome") == "failed":
            statuses.append(RunStatus(run.name, "failed", job or local, log_tail(folder, lines, grid.folder)))
        elif worker or (folder / "last.safetensors").exists():
            checkpoint = (folder / "last.safetensors").exists()
            statuses.append(RunStatus(run.name, "stopped", job or local,
                                      ["continues from its last.safetensors" if checkpoint else
                                       "no checkpoint yet: starts again"]))
        elif launch.get("launcher") == "slurm" and states is not None:
            statuses.append(RunStatus(run.name, "failed", job, log_tail(folder, lines, grid.folder)
                                      or ["its Slurm job ended before the worker started"]))
        else:
            statuses.append(RunStatus(run.name, "not started"))
    return statuses


@contextlib.contextmanager
def submit_lock(grid_folder: Path):
    """Held while a ``grid run`` decides what to submit and submits it: two at once submit nothing twice."""
    grid_folder.mkdir(parents=True, exist_ok=True)
    with open(grid_folder / _SUBMIT_LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
