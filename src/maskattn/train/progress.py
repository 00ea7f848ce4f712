"""A rich progress bar for training: step count, loss, speed (examples/s or tokens/s) and ETA, and below it a
row for every long job inside the run (decoding the dev or test set: sentences done, ETA)."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn, \
    TimeRemainingColumn

__all__ = ["TrainProgress"]


class TrainProgress:
    """``with TrainProgress(total, console, enabled) as bar: bar.update(step, loss=…, speed=…)``; ``unit``
    labels the speed (``ex`` → "ex/s", ``tok`` → "tok/s"). :meth:`stage` adds a row for a job inside the run."""

    def __init__(self, total: int, *, console: Console | None = None, enabled: bool = True, start: int = 0,
                 description: str = "train", unit: str = "ex"):
        self.enabled, self.unit = enabled, unit
        self.shown = {"loss": "-", "speed": "-"}
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("ETA"),
                                 TimeRemainingColumn(), console=console, transient=False, disable=not enabled)
        self.task = self.progress.add_task(description, total=total, completed=start, info=self._info())

    def _info(self) -> str:
        return f"loss {self.shown['loss']} {self.shown['speed']} {self.unit}/s"

    def __enter__(self) -> TrainProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def update(self, step: int, *, loss: float | None = None, speed: float | None = None) -> None:
        if loss is not None:
            self.shown["loss"] = f"{loss:.4f}"
        if speed is not None:
            self.shown["speed"] = f"{speed:,.0f}"
        self.progress.update(self.task, completed=step, info=self._info())

    def stage(self, description: str, unit: str = "sentences") -> Callable[[int, int], None]:
        """A callback ``progress(done, total)`` for a long job inside the run (``decode dev``): a row under the
        training bar counting ``unit``, removed once ``done`` reaches ``total``."""
        task: TaskID | None = None

        def progress(done: int, total: int) -> None:
            nonlocal task
            if task is None:
                task = self.progress.add_task(description, total=total, info=unit)
            self.progress.update(task, completed=done, total=total)
            if done >= total:
                self.progress.remove_task(task)
                task = None
        return progress
