"""The Slurm launcher (``maskattn grid run --launcher slurm``, docs/cluster.md): the runs as Slurm jobs, through
submitit.

Every run that has not finished, is not queued or running already and is not held by another process is submitted
at once, as one job array (``--jobs``: how many of its tasks run at once; ``--slurm-*``: what each job asks Slurm
for, :class:`SlurmOptions`). Each task runs :class:`~maskattn.grid.launchers.slurm_job.SlurmRun`, which starts the
run's worker and, when Slurm signals the coming time limit (or a preemption, ``USR2``), stops it — it keeps its
``last.safetensors`` — and has submitit requeue the job, which continues the run from that checkpoint (the same
bit-exact resume as the local launcher's). The jobs' files (submitit's, and each job's stdout / stderr) are under
``<grid>/slurm/``; a run's ``launch.json`` names its job: ``launcher``, ``job_id``, ``submitted`` (Unix time), the
``host`` that submitted it and the job's ``slurm_folder``. The grid command returns once they are submitted, or
follows them to their end with ``--wait``; Ctrl-C leaves them to Slurm.

**One run on several nodes** (``--slurm-nodes N``, ``--slurm-tasks-per-node``, ``--slurm-gpus-per-node``): each run
is one job of N nodes whose tasks (``srun --kill-on-bad-exit=1``: one that fails ends the others) each run the
worker, forming one process group from Slurm's environment (:mod:`maskattn.train.distributed`); the first task's
worker holds the run. ``launch.json`` adds ``nodes`` and ``tasks_per_node``; ``grid status`` shows where the job is.

What Slurm would refuse is refused before anything is written (:meth:`SlurmLauncher.check`): the controller must
answer (``sinfo``), and one job of the grid's, with every option it asks for, must pass ``sbatch --test-only`` (an
unknown partition, memory no node has, an account or QOS that does not exist — Slurm's own words, one line; more
nodes than the partition has, asked of ``sinfo`` first: :func:`check_nodes`), so a refusal leaves no ``grid.json``,
``.grid-submit`` or submitit files behind.

**The warning before the time limit.** Slurm looks at the running jobs' limits every 30 s (``PERIODIC_TIMEOUT`` in
slurmctld) and sends ``USR2`` at the first look within ``delay + 30`` s of a job's end (its manual: up to 60 s
early) — counted from each start, a requeued job's too (requeueing clears the sent flag). So the warning comes
between ``limit − delay − 30`` and ``limit − delay`` seconds after a job starts, and a delay of ``limit − 30`` s or
more warns every job at the first look after it starts — anywhere in its first 30 s, sometimes 0.1 s after: a
requeued job was stopped before its worker had trained a step, and the run ended "fruitless" (measured:
``tests/test_slurm.py``, a 1-minute job warned 10–40 s after each start with a 20-s delay, 27 and 30 s with 45 s). A delay is therefore at most ``(limit − 30) / 2``
(:func:`max_signal_delay`): every job trains at least as long as the delay before it can be warned. The default,
a twelfth of the limit within 5–90 s, is always inside.
"""

from __future__ import annotations

import contextlib
import getpass
import io
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import ArgumentError
from ...train.resumable import write_json
from ..spec import LAUNCH_RECORD, Grid, GridRun
from ..worker import BUSY_EXIT, DONE_EXIT, WORKER, thread_env
from . import slurm_job
from .base import ENDED, QUEUED, RUNNING, Job, Launcher

__all__ = ["SlurmLauncher", "SlurmOptions", "check_slurm", "slurm_states", "slurm_jobs", "check_nodes",
           "parse_slurm_time", "parse_slurm_options",
           "max_signal_delay", "default_signal_delay", "SLURM_FOLDER", "MAX_REQUEUES", "CHECK_INTERVAL_S"]

#: the folder of the grid that holds submitit's files and the Slurm jobs' stdout / stderr (one folder per job)
SLURM_FOLDER = "slurm"
#: squeue's states of a job waiting to start, and of one started and not yet gone (COMPLETING included: its worker
#: may be requeued still)
_QUEUED = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED", "STOPPED"}
_RUNNING = {"RUNNING", "CONFIGURING", "COMPLETING", "SIGNALING", "STAGE_OUT", "RESIZING"}
#: requeues of one job after time limits or preemptions at most (a job that wrote no checkpoint is not requeued)
MAX_REQUEUES = 100
#: how often slurmctld looks at the running jobs' time limits (PERIODIC_TIMEOUT): how early a warning may come
CHECK_INTERVAL_S = 30


def max_signal_delay(minutes: int) -> int:
    """The longest ``--slurm-signal-delay`` that works for a ``minutes`` time limit (module docstring): every job
    trains at least as long as the delay before Slurm may warn it."""
    return (minutes * 60 - CHECK_INTERVAL_S) // 2


def default_signal_delay(minutes: int) -> int:
    """The delay without ``--slurm-signal-delay``: a twelfth of the limit, 5 to 90 s (within
    :func:`max_signal_delay` for any limit of a minute or more)."""
    return min(90, max(5, minutes * 60 // 12))


# --- the options and the controller --------------------------------------------------------------------------------

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
    and requeue (default: a twelfth of the limit, 5 to 90 s; at most :func:`max_signal_delay`: Slurm may send it
    up to 30 s earlier, module docstring)."""

    partition: str | None = None
    time: str | None = None
    cpus_per_task: int | None = None
    mem: str | None = None
    gpus_per_task: int | None = None
    account: str | None = None
    qos: str | None = None
    options: dict[str, str] = field(default_factory=dict)
    signal_delay_s: int | None = None
    nodes: int | None = None
    tasks_per_node: int | None = None
    gpus_per_node: int | None = None

    @property
    def tasks_per_node_or_default(self) -> int:
        """Tasks (processes) per node of a job: ``tasks_per_node``, else one per GPU of ``gpus_per_node``, else 1."""
        return self.tasks_per_node or self.gpus_per_node or 1

    @property
    def tasks(self) -> int:
        """The processes that train one run together: nodes × tasks per node (1: the job's one task, with
        ``torchrun`` inside it for ``gpus_per_task`` > 1)."""
        return (self.nodes or 1) * self.tasks_per_node_or_default

    def check(self) -> None:
        for name in ("cpus_per_task", "gpus_per_task", "nodes", "tasks_per_node", "gpus_per_node"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ArgumentError(f"--slurm-{name.replace('_', '-')} must be an int >= 1, got {value!r}")
        if self.gpus_per_node is not None and self.gpus_per_task is not None:
            raise ArgumentError(f"--slurm-gpus-per-node {self.gpus_per_node} and --slurm-gpus-per-task "
                                f"{self.gpus_per_task}: give one of them (per node: one process per GPU, "
                                "--slurm-tasks-per-node of them on each of --slurm-nodes; per task: one job of one "
                                "task, torchrun over its GPUs)")
        if self.tasks > 1 and (self.gpus_per_task or 0) > 1:
            raise ArgumentError(f"--slurm-gpus-per-task {self.gpus_per_task} with {self.tasks} tasks per job "
                                f"(--slurm-nodes {self.nodes or 1} × --slurm-tasks-per-node "
                                f"{self.tasks_per_node_or_default}): a job of several tasks runs one process per "
                                "GPU; ask for --slurm-gpus-per-node G instead (G tasks per node by default)")
        if self.gpus_per_node is not None and self.tasks_per_node_or_default > self.gpus_per_node:
            raise ArgumentError(f"--slurm-tasks-per-node {self.tasks_per_node}: at most --slurm-gpus-per-node "
                                f"{self.gpus_per_node} (one process per GPU)")
        delay = self.signal_delay_s
        if delay is not None and (isinstance(delay, bool) or not isinstance(delay, int) or delay < 1):
            raise ArgumentError(f"--slurm-signal-delay must be an int >= 1, got {delay!r}")
        if self.time is not None:
            self.check_delay(parse_slurm_time(self.time))
        if self.mem is not None and not re.fullmatch(r"\d+[KMGT]?B?", self.mem.strip(), flags=re.IGNORECASE):
            raise ArgumentError(f"--slurm-mem {self.mem!r}: expected Slurm's memory spelling, e.g. 16G or 4000M")

    def check_delay(self, minutes: int) -> None:
        """Refuse a ``signal_delay_s`` longer than :func:`max_signal_delay` of a ``minutes`` time limit."""
        delay, most = self.signal_delay_s, max_signal_delay(minutes)
        if delay is not None and delay > most:
            where = f"--slurm-time {self.time}" if self.time is not None else "the partition's default time limit"
            raise ArgumentError(f"--slurm-signal-delay {delay}: at most {most} s with a {minutes}-minute time limit "
                                f"({where}): Slurm sends the warning up to {CHECK_INTERVAL_S} s before the delay "
                                "asks, from each start of a job, so a longer delay stops jobs (requeued ones too) "
                                "before they have trained as long as the delay; give a shorter delay or a longer "
                                "--slurm-time")

    def limit_minutes(self) -> int:
        """The jobs' time limit in minutes: ``time``, else the partition's default (or maximum)."""
        return parse_slurm_time(self.time) if self.time else _default_minutes(self.partition)


def check_nodes(options: SlurmOptions) -> None:
    """Refuse (one line) a job of more nodes than its partition has (``sinfo``; sbatch itself says only "Requested
    node configuration is not available")."""
    if not options.nodes or options.nodes <= 1:
        return
    try:
        answer = _run_quietly(["sinfo", "-h", "-N", "-o", "%N|%P"])
    except (subprocess.TimeoutExpired, OSError):
        return  # sbatch --test-only refuses it next
    pairs = [line.strip().partition("|")[::2] for line in answer.stdout.splitlines() if "|" in line]
    partition = options.partition or next((part.rstrip("*") for _, part in pairs if part.endswith("*")), None)
    nodes = sorted({node for node, part in pairs if part.rstrip("*") == partition})
    if nodes and options.nodes > len(nodes):
        raise ArgumentError(f"--slurm-nodes {options.nodes}: the partition {partition} has {len(nodes)} node"
                            f"{'s' if len(nodes) != 1 else ''} ({', '.join(nodes[:8])}{', …' if len(nodes) > 8 else ''})"
                            f"; ask for at most {len(nodes)}")


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
    missing = [name for name in ("sbatch", "squeue", "scontrol", "sinfo") if shutil.which(name) is None]
    if missing:
        raise ArgumentError(f"--launcher slurm: {', '.join(missing)} not found on PATH (Slurm's client commands are "
                            "needed on the machine that submits the grid)")
    try:  # sinfo asks the controller (squeue -j 0 did not: it refused the job id itself, controller or not)
        answer = _run_quietly(["sinfo", "-h", "-o", "%P"], timeout=30)
        down = answer.returncode != 0
        reason = answer.stderr.strip().splitlines()[-1] if answer.stderr.strip() else f"exit status {answer.returncode}"
    except subprocess.TimeoutExpired:
        down, reason = True, "no answer in 30 s"
    if down:
        raise ArgumentError(f"--launcher slurm: the Slurm controller does not answer (sinfo: {reason})")


def slurm_states() -> dict[str, str] | None:
    """The state of every job of this user that Slurm knows (``"123"`` or ``"123_4"`` for a task of an array →
    ``PENDING``, ``RUNNING``, …), or ``None`` when Slurm cannot be asked."""
    jobs = slurm_jobs()
    return None if jobs is None else {job: state for job, (state, _) in jobs.items()}


def slurm_jobs() -> dict[str, tuple[str, str | None]] | None:
    """Every job of this user that Slurm knows → its state (:func:`slurm_states`) and where it is, as ``grid status``
    shows it: the nodes of a started job (``on n[1-2]``), how many a waiting job of several nodes waits for
    (``2 nodes``), else ``None``; ``None`` when Slurm cannot be asked."""
    if shutil.which("squeue") is None:
        return None
    try:
        answer = _run_quietly(["squeue", "-h", "-r", "-u", getpass.getuser(), "-o", "%i|%T|%D|%N"], timeout=60)
    except (subprocess.TimeoutExpired, OSError):
        return None
    if answer.returncode != 0:
        return None
    jobs: dict[str, tuple[str, str | None]] = {}
    for line in answer.stdout.splitlines():
        job, state, count, nodelist = (line.strip().split("|") + ["", "", ""])[:4]
        if not job:
            continue
        state, count, nodelist = state.strip().upper(), count.strip(), nodelist.strip()
        where = None
        if state in _RUNNING and nodelist and nodelist != "(null)":
            where = f"on {nodelist}"
        elif state in _QUEUED and count.isdigit() and int(count) > 1:
            where = f"{count} nodes"
        jobs[job] = (state, where)
    return jobs


# --- the launcher --------------------------------------------------------------------------------------------------

class SlurmLauncher(Launcher):
    """Slurm jobs (module docstring). ``options``: what the jobs ask for; ``jobs``: the array's parallelism (default:
    no limit); ``threads``: each run's (default ``options.cpus_per_task``, else 1); ``poll_s``: seconds between two
    looks at the queue while the jobs are followed."""

    name = "slurm"
    detached = True

    def __init__(self, *, options: SlurmOptions | None = None, jobs: int | None = None, threads: int | None = None,
                 poll_s: float = 2.0, say: Callable[[str], None] = print) -> None:
        self.options = options or SlurmOptions()
        super().__init__(jobs=jobs, threads=threads or self.options.cpus_per_task or 1, say=say)
        self.poll_s = poll_s

    def check(self) -> None:
        """The options (:meth:`SlurmOptions.check`), submitit and the controller (:func:`check_slurm`), the signal
        delay against the jobs' time limit, and one job with every option the grid's jobs ask for through ``sbatch
        --test-only`` (module docstring): all before anything is written."""
        self.options.check()
        check_slurm()
        check_nodes(self.options)
        minutes = self.options.limit_minutes()
        self.options.check_delay(minutes)
        _test_submission(self.options, threads=self.threads, minutes=minutes)

    def describe(self, *, pending: int, queued: int, busy: int) -> str:
        options = self.options
        spread = (f"{options.nodes or 1} node(s) × {options.tasks_per_node_or_default} task(s) each, "
                  if options.tasks > 1 else "")
        return (f"{queued} queued or running in Slurm, {busy} held by another process, {pending} to submit "
                f"({spread}{self.threads} thread(s) each{f', {self.at_once} at a time' if self.at_once else ''})")

    def submit(self, grid: Grid, runs: Sequence[GridRun]) -> list[Job]:
        """Submit ``runs`` as one job array (one job when there is one run) and say so."""
        ids = _submit(grid, runs, self.options, threads=self.threads, parallelism=self.at_once)
        self.say(f"submitted {len(ids)} run(s): Slurm job{'s' if len(ids) > 1 else ''} {ids[0]}"
                 f"{f' … {ids[-1]}' if len(ids) > 1 else ''}; their files: {grid.folder / SLURM_FOLDER}")
        return [Job(run.name, self.name, "Slurm job", job_id) for run, job_id in zip(runs, ids)]

    def poll(self, jobs: Sequence[Job]) -> bool:
        """The jobs' states in ``squeue`` (asked once, and not at all for no job); False when it does not answer."""
        if not jobs:
            return True
        known = slurm_jobs()
        if known is None:
            return False
        for job in jobs:
            state, where = known.get(job.id, (None, None))
            job.phase = QUEUED if state in _QUEUED else RUNNING if state in _RUNNING else ENDED
            job.ended_as = state if job.phase == ENDED else None
            job.nodes = where if job.phase != ENDED else None
        return True

    def cancel(self, jobs: Sequence[Job]) -> None:
        """Nothing: a Slurm job is not the grid command's — it goes on without it (``maskattn grid status`` follows
        it, ``scancel`` ends it)."""

    def recorded(self, run: str, launch: dict) -> Job | None:
        return Job(run, self.name, "Slurm job", str(launch["job_id"]), None) if launch.get("job_id") else None


# --- submitting ----------------------------------------------------------------------------------------------------

def _slurm_run(grid: Grid, run: GridRun, threads: int, gpus: int, tasks: int = 1) -> slurm_job.SlurmRun:
    """The :class:`~maskattn.grid.launchers.slurm_job.SlurmRun` of ``run``: the worker's command (under torchrun for
    ``gpus`` > 1 GPUs of one task; one worker per task of a job of ``tasks`` > 1, which join one process group from
    Slurm's environment: :mod:`maskattn.train.distributed`) and settings."""
    worker = ["-m", WORKER, str(grid.folder.resolve()), run.name, str(threads)]
    command = [sys.executable, *worker]
    if gpus > 1 and tasks <= 1:  # data-parallel over the job's GPUs (docs/cluster.md)
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(gpus),
                   *worker]
    return slurm_job.SlurmRun(str(grid.folder.resolve()), run.name, command, thread_env(threads), grid.cwd,
                              watch_parent=gpus <= 1 or tasks > 1, busy_exit=BUSY_EXIT, done_exit=DONE_EXIT,
                              tasks=tasks)


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
        ("cpus-per-task", options.cpus_per_task, ("cpu", "processor")),
        ("nodes", options.nodes, ("node count",)), ("gpus-per-node", options.gpus_per_node, ("gres", "gpu")))
        if value is not None and any(word in lower for word in words)]
    named += [f"--slurm-option {key}" for key in options.options if key in lower]
    if not named and "node configuration is not available" in lower:  # no node has what a job asks for
        named = [f"--slurm-{name} {value}" for name, value in (
            ("mem", options.mem), ("cpus-per-task", options.cpus_per_task), ("gpus-per-task", options.gpus_per_task),
            ("nodes", options.nodes), ("tasks-per-node", options.tasks_per_node),
            ("gpus-per-node", options.gpus_per_node))
            if value is not None] + [f"--slurm-option {key}" for key in options.options]
        if named:
            named = [f"no node has what {' and '.join(named)} ask{'s' if len(named) == 1 else ''} for"]
    return f"--launcher slurm: sbatch refused the jobs: {line}" + (f" ({', '.join(named)})" if named else "")


def _executor(folder: Path, options: SlurmOptions, *, threads: int, minutes: int, name: str, parallelism: int):
    """submitit's executor of the grid's jobs, in ``folder``, with every sbatch option they ask for."""
    import submitit

    executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=MAX_REQUEUES)
    extra: dict = dict(options.options)
    for key, value in (("partition", options.partition), ("account", options.account), ("qos", options.qos),
                       ("mem", options.mem), ("gpus-per-task", options.gpus_per_task)):
        if value is not None:
            extra[key] = value
    delay = options.signal_delay_s if options.signal_delay_s is not None else default_signal_delay(minutes)
    spread: dict = {}
    if options.tasks > 1:  # one job of several tasks per run; a task that fails ends the others (no hang)
        spread = {"nodes": options.nodes or 1, "ntasks_per_node": options.tasks_per_node_or_default,
                  "srun_args": ["--kill-on-bad-exit=1"]}
    if options.gpus_per_node is not None:
        spread["gpus_per_node"] = options.gpus_per_node
    executor.update_parameters(time=minutes, cpus_per_task=options.cpus_per_task or threads, signal_delay_s=delay,
                               job_name=name, array_parallelism=parallelism, additional_parameters=extra, **spread)
    return executor


def _test_submission(options: SlurmOptions, *, threads: int, minutes: int) -> None:
    """One job as the grid's are submitted, given to ``sbatch --test-only`` (Slurm checks it and submits nothing),
    its files in a temporary folder; what sbatch refuses is an :class:`ArgumentError` naming the option."""
    import tempfile

    from submitit.slurm.slurm import _make_sbatch_string

    with tempfile.TemporaryDirectory(prefix="maskattn-sbatch-") as folder:
        executor = _executor(Path(folder), options, threads=threads, minutes=minutes, name="grid:test-only",
                             parallelism=1)
        script = Path(folder) / "test-only.sh"
        parameters = {key: value for key, value in executor.parameters.items() if key != "array_parallelism"}
        script.write_text(_make_sbatch_string(command="true", folder=folder, **parameters), encoding="utf-8")
        try:
            answer = _run_quietly(["sbatch", "--test-only", str(script)], timeout=60)
        except subprocess.TimeoutExpired:
            raise ArgumentError("--launcher slurm: sbatch --test-only did not answer in 60 s (is the Slurm "
                                "controller reachable?)") from None
    if answer.returncode != 0:
        raise ArgumentError(_refusal(answer.stderr or answer.stdout, options))


def _submit(grid: Grid, runs: Sequence[GridRun], options: SlurmOptions, *, threads: int,
            parallelism: int | None) -> list[str]:
    """Submit ``runs`` as one job array (one job when there is one run), at most ``parallelism`` running at a time,
    and record each job in its run's ``launch.json``; returns the job ids."""
    import cloudpickle
    import submitit

    options.check()
    executor = _executor(grid.folder.resolve() / SLURM_FOLDER / "%j", options, threads=threads,
                         minutes=options.limit_minutes(), name=f"grid:{grid.folder.name}",
                         parallelism=parallelism or len(runs))
    gpus = options.gpus_per_task or 0
    tasks = options.tasks
    now = time.time()  # submitted: before sbatch
    cloudpickle.register_pickle_by_value(slurm_job)  # the job's process needs neither maskattn nor torch
    try:
        with contextlib.redirect_stderr(io.StringIO()) as said:  # submitit prints sbatch's refusal too: one line
            try:
                with executor.batch():
                    jobs = [executor.submit(_slurm_run(grid, run, threads, gpus, tasks)) for run in runs]
            except submitit.core.utils.FailedJobError as exc:
                raise ArgumentError(_refusal(str(exc) or said.getvalue(), options)) from None
    finally:
        cloudpickle.unregister_pickle_by_value(slurm_job)
    host = socket.gethostname()
    for run, job in zip(runs, jobs):
        job_folder = Path(str(job.paths.folder))
        (grid.folder / run.name).mkdir(parents=True, exist_ok=True)
        spread = {"nodes": options.nodes or 1, "tasks_per_node": options.tasks_per_node_or_default} \
            if tasks > 1 else {}
        write_json(grid.folder / run.name / LAUNCH_RECORD,
                   {"launcher": SlurmLauncher.name, "job_id": str(job.job_id), "submitted": now, "host": host,
                    "slurm_folder": str(job_folder.relative_to(grid.folder.resolve())), **spread})
    return [str(job.job_id) for job in jobs]
