"""A rich progress bar for training: step count, loss, speed (examples/s or tokens/s) and ETA."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

__all__ = ["TrainProgress"]


class TrainProgress:
    """``with TrainProgress(total, console, enabled) as bar: bar.update(step, loss=…, speed=…)``; ``unit``
    labels the speed (``ex`` → "ex/s", ``tok`` → "tok/s")."""

    def __init__(self, total: int, *, console: Console | None = None, enabled: bool = True, start: int = 0,
                 description: str = "train", unit: str = "ex"):
        self.enabled = enabled
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("loss {task.fields[loss]}"),
                                 TextColumn("{task.fields[speed]} " + unit + "/s"),
                                 TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                 console=console, transient=False, disable=not enabled)
        self.task = self.progress.add_task(description, total=total, completed=start, loss="-", speed="-")

    def __enter__(self) -> TrainProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def update(self, step: int, *, loss: float | None = None, speed: float | None = None) -> None:
        fields: dict[str, str] = {}
        if loss is not None:
            fields["loss"] = f"{loss:.4f}"
        if speed is not None:
            fields["speed"] = f"{speed:,.0f}"
        self.progress.update(self.task, completed=step, **fields)  # type: ignore[arg-type]  # task fields are free-form
