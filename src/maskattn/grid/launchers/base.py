"""What the scheduler knows of a launcher: the :class:`Launcher` interface and the :class:`Job` it hands back."""

from __future__ import annotations

import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from ..spec import Grid, GridRun

__all__ = ["Launcher", "Job", "QUEUED", "RUNNING", "ENDED"]

#: a job's phases: waiting to start, started, ended (gone from the launcher's queue, or its process exited)
QUEUED, RUNNING, ENDED = "queued", "running", "ended"


@dataclass(eq=False)
class Job:
    """One run as a launcher started it — now (:meth:`Launcher.submit`) or earlier, as its ``launch.json`` records
    (:meth:`Launcher.recorded`). ``kind`` and ``id`` name it in messages (``Slurm job 12_3``); ``phase`` is what
    :meth:`Launcher.poll` saw last (``None``: the launcher cannot tell); an ended job has its ``exit_code`` when it
    was a process of this grid command, and ``ended_as``, the word of the launcher's queue for how it ended when the
    queue still lists it (Slurm's ``CANCELLED``, ``TIMEOUT``, …), and ``nodes`` where it runs."""

    run: str
    launcher: str
    kind: str
    id: str
    phase: str | None = QUEUED
    exit_code: int | None = None
    ended_as: str | None = None
    started: float = field(default_factory=time.perf_counter)
    #: where the job is, as its launcher says (Slurm: ``on n[1-2]`` once started, ``2 nodes`` while a job of several
    #: nodes waits); ``None`` when it does not say
    nodes: str | None = None
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return f"{self.kind} {self.id}"


class Launcher(ABC):
    """Where a grid's runs are started (:mod:`maskattn.grid.launchers`). The scheduler (:func:`maskattn.grid.
    scheduler.run_grid`) builds one by its name and calls only what is here: :meth:`check`, :meth:`describe`,
    :meth:`submit`, :meth:`poll` and :meth:`cancel`.

    ``detached``: False — the jobs are processes of the grid command, ``at_once`` at a time, followed to their end;
    True — a queue outside the command runs them (Slurm): every run is submitted at once (the queue runs ``at_once``
    of them at a time), under the grid folder's submit lock so that two grid commands submit nothing twice, a run
    another process holds is not submitted, and the command follows the jobs only when asked to (``--wait``),
    saying when each leaves the queue."""

    name: ClassVar[str]
    detached: ClassVar[bool] = False
    #: seconds between two looks at the jobs
    poll_s: float = 2.0

    def __init__(self, *, jobs: int | None = None, threads: int = 1, say: Callable[[str], None] = print) -> None:
        self.at_once, self.threads, self.say = jobs, threads, say

    @abstractmethod
    def check(self) -> None:
        """Refuse, in one line (:class:`~maskattn.errors.ArgumentError`), what cannot be launched — before anything
        is written."""

    @abstractmethod
    def describe(self, *, pending: int, queued: int, busy: int) -> str:
        """How this launcher will run the grid's ``pending`` runs (the end of the line the scheduler starts with);
        ``queued``: runs whose jobs are queued or running already, ``busy``: runs another process holds."""

    @abstractmethod
    def submit(self, grid: Grid, runs: Sequence[GridRun]) -> list[Job]:
        """Start ``runs`` (each in its folder, the worker's output appended to its ``train.log``) and record each in
        its ``launch.json``; returns their jobs."""

    @abstractmethod
    def poll(self, jobs: Sequence[Job]) -> bool:
        """Update each job's ``phase`` (an ended one's ``exit_code`` / ``ended_as``) as it is now; False when the
        launcher cannot tell this time (the jobs are left as they were)."""

    @abstractmethod
    def cancel(self, jobs: Sequence[Job]) -> None:
        """What becomes of ``jobs`` when the grid command is interrupted (Ctrl-C, SIGTERM)."""

    @abstractmethod
    def recorded(self, run: str, launch: dict) -> Job | None:
        """The job a run's ``launch.json`` (written by this launcher) describes, for :meth:`poll`; ``None`` when it
        names none."""
