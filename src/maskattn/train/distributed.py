"""Data-parallel training with ``torch.distributed`` (DDP; gloo on CPU, NCCL on GPU), its processes started by
``torchrun`` or by Slurm (``srun``: several tasks of one job step, on one node or several).

Every rank draws the same global batch (the batch order depends only on the seed and the epoch) and
keeps every ``world_size``-th example of it; the loss is the sum over the local examples divided by the
global batch's count and multiplied by ``world_size``, so DDP's gradient average equals the gradient of
the global batch's mean loss — the same model as one process on the same global batch.

**Which processes form the group.** ``torchrun``'s environment (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``,
``MASTER_ADDR`` / ``MASTER_PORT``) first, as ``torchrun`` sets it. Without ``WORLD_SIZE``, a process that is one of
several tasks of a Slurm job step (``srun``: ``SLURM_STEP_ID`` set and ``SLURM_NTASKS`` > 1) takes them from Slurm
(:func:`slurm_tasks`), as fairseq and submitit do: rank ``SLURM_PROCID``, world size ``SLURM_NTASKS``, local rank
``SLURM_LOCALID``, the address of the step's first node (the first of ``scontrol show hostnames
$SLURM_STEP_NODELIST``, or of the job's node list; its ``NodeAddr`` when the name does not resolve) and a port derived
from the job id (:func:`derived_port`); ``MASTER_ADDR`` / ``MASTER_PORT`` in the environment replace those two. The
job's batch script itself (no ``SLURM_STEP_ID``: not started by ``srun``) is one process.

**The rendezvous of Slurm's tasks** (:func:`rendezvous`) happens before the run folder is touched, and refuses in one
line (:class:`~maskattn.errors.ArgumentError`): a port that is in use on the first node, a first node the other tasks
cannot reach within the rendezvous timeout (naming the address and port), and tasks that disagree on the world size
(each publishes its ``SLURM_NTASKS`` in the first task's store, and the first task says whether they agree).

**Timeouts.** A collective waits at most :data:`COLLECTIVE_TIMEOUT_S` (10 minutes; ``MASKATTN_DIST_TIMEOUT``
seconds) for the other processes, then fails — a process that was killed, stopped or cut off ends the run instead
of leaving the others waiting forever (a killed one usually sooner: its connections close, and the others' next
collective fails at once). The rendezvous waits at most :data:`RENDEZVOUS_TIMEOUT_S` (5 minutes;
``MASKATTN_RENDEZVOUS_TIMEOUT``) for every task to arrive.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from ..errors import ArgumentError

__all__ = ["DistContext", "SlurmTasks", "init_distributed", "process_rank", "slurm_tasks", "rendezvous", "derived_port",
           "collective_timeout_s", "rendezvous_timeout_s", "collective_failed", "gather_rng", "restore_rank_rng",
           "all_reduce_sum", "barrier",
           "cleanup", "COLLECTIVE_TIMEOUT_S", "RENDEZVOUS_TIMEOUT_S", "PORT_BASE", "PORT_SPAN", "STOP_GRACE_S"]

#: seconds a collective waits for the other processes before it fails (``MASKATTN_DIST_TIMEOUT`` replaces it)
COLLECTIVE_TIMEOUT_S = 600
#: seconds Slurm's tasks wait for each other to join the group (``MASKATTN_RENDEZVOUS_TIMEOUT`` replaces it)
RENDEZVOUS_TIMEOUT_S = 300
#: the derived port of a Slurm job: ``PORT_BASE + SLURM_JOB_ID mod PORT_SPAN`` (20000–59999, as submitit's)
PORT_BASE, PORT_SPAN = 20000, 40000
#: seconds a process whose collective failed waits for its own stop signal (SIGTERM / USR2 reach every task of a
#: job at about the same moment, and the first to stop breaks the others' collective): then it stops as if
#: interrupted, keeping its checkpoints, instead of failing
STOP_GRACE_S = 3.0

#: the store of a Slurm rendezvous, kept while its process group lives
_STORE: list = []


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


@dataclass(frozen=True)
class SlurmTasks:
    """This process's place among the tasks of a Slurm job step (:func:`slurm_tasks`): ``rank`` (``SLURM_PROCID``),
    ``world_size`` (``SLURM_NTASKS``), ``local_rank`` (``SLURM_LOCALID``), the ``node`` that runs rank 0 and the
    ``address`` / ``port`` it listens on; ``port_from`` says where the port came from (for messages)."""

    rank: int
    world_size: int
    local_rank: int
    node: str
    address: str
    port: int
    job_id: str
    port_from: str


def _seconds(name: str, default: int, environ: Mapping[str, str]) -> int:
    text = environ.get(name)
    if text is None or not text.strip():
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ArgumentError(f"{name}={text!r}: expected a whole number of seconds >= 1 (default {default})")
    return value


def collective_timeout_s(environ: Mapping[str, str] = os.environ) -> int:
    """How long a collective waits for the other processes: ``MASKATTN_DIST_TIMEOUT`` seconds, else
    :data:`COLLECTIVE_TIMEOUT_S`."""
    return _seconds("MASKATTN_DIST_TIMEOUT", COLLECTIVE_TIMEOUT_S, environ)


def rendezvous_timeout_s(environ: Mapping[str, str] = os.environ) -> int:
    """How long Slurm's tasks wait for each other to join: ``MASKATTN_RENDEZVOUS_TIMEOUT`` seconds, else
    :data:`RENDEZVOUS_TIMEOUT_S`."""
    return _seconds("MASKATTN_RENDEZVOUS_TIMEOUT", RENDEZVOUS_TIMEOUT_S, environ)


def derived_port(job_id: str) -> int:
    """The port of a Slurm job's rendezvous: ``PORT_BASE + job id mod PORT_SPAN`` — the same for every task of the
    job and for each start of a requeued job (it keeps its id), different for jobs whose ids differ by less than
    :data:`PORT_SPAN`; an array task's ``SLURM_JOB_ID`` is its own."""
    return PORT_BASE + int(job_id) % PORT_SPAN


def _int(environ: Mapping[str, str], name: str) -> int:
    text = environ.get(name, "")
    try:
        return int(text)
    except ValueError:
        raise ArgumentError(f"{name}={text!r}: expected an integer, as Slurm sets it (is the environment of this "
                            "Slurm task changed?)") from None


def _hostnames(nodelist: str) -> list[str]:
    """``scontrol show hostnames NODELIST`` (``n[1-2]`` → ``n1``, ``n2``); a list without brackets is read as it
    is when scontrol is not at hand."""
    try:
        answer = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                                timeout=60, stdin=subprocess.DEVNULL)
        names = answer.stdout.split() if answer.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired):
        names = []
    if not names and "[" not in nodelist:
        names = [name for name in nodelist.split(",") if name]
    if not names:
        raise ArgumentError(f"SLURM_STEP_NODELIST / SLURM_JOB_NODELIST {nodelist!r}: scontrol show hostnames could "
                            "not expand it; set MASTER_ADDR to the address of the first task's node")
    return names


def _address(node: str) -> str:
    """Where ``node`` is reached: its name when it resolves, else the ``NodeAddr`` Slurm knows it by (a node whose
    name is not a host name, as on a cluster of several slurmd on one machine)."""
    try:
        socket.getaddrinfo(node, None)
        return node
    except (socket.gaierror, UnicodeError):
        pass
    try:
        answer = subprocess.run(["scontrol", "show", "node", "-o", node], capture_output=True, text=True,
                                timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return node
    for field in answer.stdout.split():
        if field.startswith("NodeAddr="):
            return field.split("=", 1)[1] or node
    return node


def process_rank(environ: Mapping[str, str] = os.environ) -> int:
    """This process's rank among the processes that train one run, from the environment alone (no rendezvous, no
    name lookup): torchrun's ``RANK`` where ``WORLD_SIZE`` is set, ``SLURM_PROCID`` for a task of a step of several
    tasks, else 0 — for what only the first process does after training (the command line's summary)."""
    if "WORLD_SIZE" in environ:
        return int(environ.get("RANK", "0"))
    if "SLURM_STEP_ID" in environ and environ.get("SLURM_NTASKS", "1") not in ("", "1"):
        return int(environ.get("SLURM_PROCID", "0"))
    return 0


def slurm_tasks(environ: Mapping[str, str] = os.environ) -> SlurmTasks | None:
    """This process's place among several tasks of a Slurm job step (module docstring), or ``None``: torchrun's
    ``WORLD_SIZE`` is set, or this is not a task of a step of more than one (one task, the batch script, no
    Slurm). A ``RANK`` set beside Slurm's (the grid's jobs set it for their workers) must be ``SLURM_PROCID``."""
    if "WORLD_SIZE" in environ or "SLURM_STEP_ID" not in environ or "SLURM_PROCID" not in environ:
        return None
    world = _int(environ, "SLURM_NTASKS") if "SLURM_NTASKS" in environ else 1
    if world <= 1:
        return None
    rank, local = _int(environ, "SLURM_PROCID"), _int(environ, "SLURM_LOCALID") if "SLURM_LOCALID" in environ else 0
    if not 0 <= rank < world:
        raise ArgumentError(f"SLURM_PROCID {rank}: expected a rank below SLURM_NTASKS {world}")
    if "RANK" in environ and environ["RANK"] != str(rank):
        raise ArgumentError(f"RANK={environ['RANK']!r} and SLURM_PROCID {rank} disagree (RANK without WORLD_SIZE "
                            "is not torchrun's environment); unset RANK, or set torchrun's whole environment")
    job = environ.get("SLURM_JOB_ID", "")
    if environ.get("MASTER_PORT"):
        port, port_from = _int(environ, "MASTER_PORT"), "set in the environment"
    elif job.isdigit():
        port, port_from = derived_port(job), f"derived from SLURM_JOB_ID {job}: {PORT_BASE} + id mod {PORT_SPAN}"
    else:
        raise ArgumentError(f"SLURM_JOB_ID={job!r}: expected the job's number, from which the rendezvous port is "
                            "derived; or set MASTER_PORT")
    if not 0 < port < 65536:
        raise ArgumentError(f"MASTER_PORT {port}: expected a port from 1 to 65535")
    if environ.get("MASTER_ADDR"):
        node = address = environ["MASTER_ADDR"]
    else:
        nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or ""
        if not nodelist:
            raise ArgumentError("SLURM_STEP_NODELIST and SLURM_JOB_NODELIST are unset: the first task's node is "
                                "unknown; set MASTER_ADDR to its address")
        node = _hostnames(nodelist)[0]
        address = _address(node)
    return SlurmTasks(rank, world, local, node, address, port, job or "0", port_from)


def _where(tasks: SlurmTasks) -> str:
    node = f"the first node {tasks.node} at " if tasks.node != tasks.address else ""
    return f"{node}{tasks.address}:{tasks.port} (MASTER_ADDR:MASTER_PORT; port {tasks.port_from})"


def _check_port_free(tasks: SlurmTasks) -> None:
    """Refuse a port that another process listens on, on the first task's node (before its store takes it)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the store: a closed one's TIME_WAIT is no use
        probe.bind(("", tasks.port))
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        raise ArgumentError(f"MASTER_PORT {tasks.port} ({tasks.port_from}) is in use on {tasks.node}, where the "
                            "first task must listen for the others: another process holds it; set MASTER_PORT to "
                            "a free port for every task (export it before srun)") from None
    finally:
        probe.close()


def _reach(tasks: SlurmTasks, deadline: float) -> None:
    """Wait until the first task's port accepts connections, or refuse naming the address and port."""
    while True:
        try:
            with socket.create_connection((tasks.address, tasks.port), timeout=min(5.0, max(0.1, deadline -
                                                                                                  time.monotonic()))):
                return
        except OSError:
            if time.monotonic() >= deadline:
                raise ArgumentError(f"rank {tasks.rank} could not reach {_where(tasks)} within the rendezvous "
                                    f"timeout of {rendezvous_timeout_s()} s (MASKATTN_RENDEZVOUS_TIMEOUT): is the "
                                    "first task running, and is the port open between the nodes?") from None
            time.sleep(0.5)


def _wait_keys(store, keys: list[str], deadline: float) -> list[str]:
    """The keys of ``keys`` not yet in ``store`` at ``deadline`` (asked every 0.1 s: without the store's own
    timed-out waits, which print C++ warnings)."""
    while True:
        missing = [key for key in keys if not store.check([key])]
        if not missing or time.monotonic() >= deadline:
            return missing
        time.sleep(0.1)


def _verdict(store, tasks: SlurmTasks, prefix: str, deadline: float, timeout_s: int) -> tuple[str, list[int]]:
    """The first task's verdict on the rendezvous — ``"ok"``, or the one line every task stops with — and the ranks
    that arrived."""
    keys = [f"{prefix}/world/{rank}" for rank in range(1, tasks.world_size)]
    missing = _wait_keys(store, keys, deadline)
    claims = {rank: int(store.get(key)) for rank, key in enumerate(keys, 1) if key not in missing}
    differ = {rank: world for rank, world in claims.items() if world != tasks.world_size}
    if differ:
        return (f"the Slurm tasks disagree on the world size: rank 0 has SLURM_NTASKS {tasks.world_size}, "
                + ", ".join(f"rank {rank} has {world}" for rank, world in sorted(differ.items()))
                + "; every task of one srun must see the same SLURM_NTASKS (is the environment changed for some "
                "tasks?)"), list(claims)
    if missing:
        absent = [key.rsplit("/", 1)[1] for key in missing]
        return (f"rank(s) {', '.join(absent[:8])}{', …' if len(absent) > 8 else ''} of {tasks.world_size} did "
                f"not reach {_where(tasks)} within the rendezvous timeout of {timeout_s} s "
                "(MASKATTN_RENDEZVOUS_TIMEOUT): did srun start every task, and is the port open between the "
                "nodes?"), list(claims)
    return "ok", list(claims)


def _hear_verdict(store, tasks: SlurmTasks, prefix: str, deadline: float, timeout_s: int) -> str:
    """A task after the first: its own reading of the first task's world size, then the first task's verdict
    (:func:`_verdict`); says it has heard it (the first task keeps the store up until then)."""
    if _wait_keys(store, [f"{prefix}/world/0"], deadline):
        raise ArgumentError(f"rank {tasks.rank} reached {_where(tasks)} but the first task did not join within "
                            f"the rendezvous timeout of {timeout_s} s (MASKATTN_RENDEZVOUS_TIMEOUT): is another "
                            "program listening on that port?")
    try:
        first = int(store.get(f"{prefix}/world/0"))
        if first != tasks.world_size:
            return (f"the Slurm tasks disagree on the world size: rank {tasks.rank} has SLURM_NTASKS "
                    f"{tasks.world_size}, rank 0 has {first}; every task of one srun must see the same "
                    "SLURM_NTASKS (is the environment changed for some tasks?)")
        if _wait_keys(store, [f"{prefix}/verdict"], deadline + 10):
            raise ArgumentError(f"rank {tasks.rank}: the first task at {_where(tasks)} did not say within the "
                                f"rendezvous timeout of {timeout_s} s whether every task arrived")
        return store.get(f"{prefix}/verdict").decode()
    finally:
        store.set(f"{prefix}/heard/{tasks.rank}", "1")


def rendezvous(tasks: SlurmTasks, timeout_s: int | None = None):
    """The store through which Slurm's tasks form their group (:func:`init_distributed`), hosted by rank 0 — once
    every task has arrived and all agree on the world size; :class:`~maskattn.errors.ArgumentError` otherwise, in
    one line (module docstring)."""
    timeout_s = rendezvous_timeout_s() if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout_s
    if tasks.rank == 0:
        _check_port_free(tasks)
    else:
        _reach(tasks, deadline)
    try:
        store = dist.TCPStore(tasks.address if tasks.rank else "0.0.0.0", tasks.port, None, tasks.rank == 0,
                              timedelta(seconds=timeout_s), wait_for_workers=False)
    except dist.DistNetworkError as exc:  # the port taken between the check and now, or the first task gone
        if tasks.rank == 0:
            raise ArgumentError(f"MASTER_PORT {tasks.port} ({tasks.port_from}): the first task could not listen "
                                f"on it on {tasks.node}: {str(exc).splitlines()[0]}") from None
        raise ArgumentError(f"rank {tasks.rank} could not reach {_where(tasks)}: "
                            f"{str(exc).splitlines()[0]}") from None
    prefix = f"maskattn/{tasks.job_id}"
    store.set(f"{prefix}/world/{tasks.rank}", str(tasks.world_size))
    if tasks.rank == 0:
        text, arrived = _verdict(store, tasks, prefix, deadline, timeout_s)
        store.set(f"{prefix}/verdict", text)
        if text != "ok":
            # the store lives in this process: keep it up until the tasks that arrived have read why they stop
            _wait_keys(store, [f"{prefix}/heard/{rank}" for rank in arrived], time.monotonic() + 10)
    else:
        try:
            text = _hear_verdict(store, tasks, prefix, deadline, timeout_s)
        except dist.DistNetworkError as exc:  # the first task stopped before this one read its verdict
            raise ArgumentError(f"rank {tasks.rank}: the first task at {_where(tasks)} closed the rendezvous before "
                                f"saying why ({str(exc).splitlines()[0]}); its own error says why") from None
    if text != "ok":
        raise ArgumentError(text)
    return store


def _usr2_stops() -> None:
    """USR2 — submitit's and many clusters' warning before a time limit or a preemption, sent to every task —
    stops a Slurm task as SIGTERM does (``KeyboardInterrupt``: the trainer keeps its checkpoints), unless the
    process ignores it (a grid job's worker: the job's own process handles it) or handles it already."""
    if signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL:
        def stop(signum, frame):
            raise KeyboardInterrupt
        signal.signal(signal.SIGUSR2, stop)


def init_distributed(device: torch.device) -> DistContext:
    """Join the process group of torchrun's environment (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR`` /
    ``MASTER_PORT``), or of Slurm's when this process is one of several tasks of a job step (:func:`slurm_tasks`,
    :func:`rendezvous`); a single process otherwise. The collectives time out after :func:`collective_timeout_s`."""
    timeout = timedelta(seconds=collective_timeout_s())
    backend = "nccl" if device.type == "cuda" else "gloo"
    if "WORLD_SIZE" in os.environ:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return DistContext()
        if not dist.is_initialized():
            dist.init_process_group(backend, timeout=timeout)
        return DistContext(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
    tasks = slurm_tasks()
    if tasks is None:
        return DistContext()
    if not dist.is_initialized():
        store = rendezvous(tasks)
        _STORE[:] = [store]
        dist.init_process_group(backend, store=store, rank=tasks.rank, world_size=tasks.world_size, timeout=timeout)
    if threading.current_thread() is threading.main_thread():  # signal handlers are the main thread's
        _usr2_stops()
    return DistContext(tasks.rank, tasks.world_size, tasks.local_rank)


def collective_failed(exc: BaseException, ctx: DistContext) -> None:
    """What a process does when an exception ends its training while it is one of several: a collective broken
    because another process stopped first — SIGTERM / USR2 reach every process at about the same moment — waits up
    to :data:`STOP_GRACE_S` for this process's own stop signal (which then raises ``KeyboardInterrupt`` here: it
    stops as interrupted, keeping its checkpoints); without one, a failed collective becomes a ``RuntimeError``
    saying so in one line. Any other exception is left as it is (returns)."""
    if not ctx.enabled or not isinstance(exc, RuntimeError):
        return
    broken = isinstance(exc, dist.DistError) or any(word in str(exc) for word in ("gloo", "NCCL", "c10d"))
    if not broken:
        return
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline:  # a stop signal arriving now raises KeyboardInterrupt from the sleep
        time.sleep(0.05)
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    raise RuntimeError(f"rank {ctx.rank} of {ctx.world_size}: a collective failed — another process of the run "
                       f"stopped, was killed or did not answer within {collective_timeout_s()} s "
                       f"(MASKATTN_DIST_TIMEOUT): {first[:300]}; the checkpoints written are intact: run the same "
                       "command again to continue") from exc


def gather_rng(ctx: DistContext) -> dict[str, torch.Tensor]:
    """Every process's torch generators (CPU, and its GPU's), gathered on the first process as checkpoint tensors
    ``rng.rank<r>.torch`` / ``rng.rank<r>.cuda``: each process draws its own dropout masks (its share of the batch),
    so an exact resume gives each its own state back (:func:`restore_rank_rng`). Called by every process; empty on
    the others, and for one process."""
    if not ctx.enabled:
        return {}
    mine = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        mine["cuda"] = torch.cuda.get_rng_state()
    states: list | None = [None] * ctx.world_size if ctx.is_main else None
    dist.gather_object(mine, states, dst=0)
    if not ctx.is_main or states is None:
        return {}
    return {f"rng.rank{rank}.{kind}": tensor for rank, state in enumerate(states) for kind, tensor in state.items()}


def restore_rank_rng(tensors: dict[str, torch.Tensor], ctx: DistContext, written_by: int) -> None:
    """Give this process its own generators back from a checkpoint that ``written_by`` processes wrote
    (:func:`gather_rng`); at another number of processes each keeps the first process's (the shares of the batch
    differ anyway)."""
    if not ctx.enabled or written_by != ctx.world_size or f"rng.rank{ctx.rank}.torch" not in tensors:
        return
    torch.set_rng_state(tensors[f"rng.rank{ctx.rank}.torch"])
    cuda = tensors.get(f"rng.rank{ctx.rank}.cuda")
    if cuda is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(cuda)


def all_reduce_sum(value: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    if ctx.enabled:
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value


def barrier(ctx: DistContext) -> None:
    if ctx.enabled:
        dist.barrier()


def cleanup(ctx: DistContext) -> None:
    if ctx.enabled and dist.is_initialized():
        dist.destroy_process_group()
    _STORE.clear()
