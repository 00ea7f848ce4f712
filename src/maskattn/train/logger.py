"""Per-run metrics files: ``metrics.jsonl`` (one JSON object per row, the record) and ``metrics.csv`` (fixed
columns, rebuilt from the record on resume).

Rows are appended one ``write`` at a time; dev and test rows are also ``fsync``-ed (the trainer appends a dev
row before it writes the checkpoints of that step, so the log is never behind a checkpoint). A kill can only
cut the *last* line short: :func:`read_metrics` leaves such a line out, and on resume the logger drops it with
a warning naming the file. Any other unreadable line means the file was damaged otherwise and is a
:class:`~maskattn.errors.DataError` naming the file and line. On resume, rows after the checkpoint's step
(and the previous final test row) are dropped — that work is redone — and both files are rewritten
atomically. A log that was emptied or shortened between runs (it lacks the dev row of the checkpoint's step,
which is always written before the checkpoint) is continued with a warning saying so: the lost rows are not
recomputed.

With ``tensorboard`` (``train.tensorboard``) every row is also written as TensorBoard scalars
(``torch.utils.tensorboard``; the ``tensorboard`` package, ``pip install 'maskattn[tensorboard]'``): the tag
``<split>/<key>`` for every number of the row (``train/loss``, ``train/lr``, ``train/grad_norm``,
``train/examples_per_s`` or ``train/tokens_per_s``, ``dev/accuracy``, ``test/rouge``, …) at the row's step. A
resumed run drops from the folder's event files the scalars after its checkpoint's step and the previous test
point, as from the files above (:func:`purge_events`). TensorBoard is an optional sink: a failure to write its
events (a full disk) is one warning, and the run goes on without it (:class:`TensorBoardWriter`).
"""

from __future__ import annotations

import csv
import io
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

from ..data.text import decode_line, iter_raw_lines
from ..errors import ConfigError, DataError
from ..files import atomic_write

__all__ = ["MetricsLogger", "TensorBoardWriter", "COLUMNS", "read_metrics", "purge_events"]

COLUMNS = ("step", "epoch", "split", "loss", "accuracy", "f1", "lr", "examples_per_s", "elapsed_s", "ppl", "bleu",
           "chrf", "tokens_per_s", "rouge", "rouge1", "rouge2", "rougeL")


def _read_rows(path: Path) -> tuple[list[dict], str | None]:
    """The rows of a ``metrics.jsonl`` file and the text of its last line when that line was cut short
    (``None`` when it was not). Read with the bounded line reader (:func:`~maskattn.data.text.iter_raw_lines`):
    a line that is not UTF-8 or not JSON is a :class:`DataError` naming ``file:line``, unless it is the last one
    and lacks its newline (a kill mid-write can cut a line, even inside a character)."""
    if not path.exists():
        return [], None
    rows: list[dict] = []
    for number, raw, ended in iter_raw_lines(path):
        if not ended:  # the last line: complete, only its newline missing, or cut short
            if not raw.strip():
                break
            try:
                row = json.loads(decode_line(raw, str(path), number))
            except (DataError, json.JSONDecodeError):
                return rows, raw.decode("utf-8", errors="replace")
            rows.append(_row(row, path, number))
            break
        text = decode_line(raw, str(path), number)
        if not text.strip():
            continue
        try:
            rows.append(_row(json.loads(text), path, number))
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{number}: not a JSON row ({exc.msg}); the log was damaged (a killed run can only "
                            "cut its last line short): repair or delete that line") from None
    return rows, None


def _row(row: object, path: Path, number: int) -> dict:
    """A parsed line of the log, checked: an object with an int ``step`` and a text ``split``."""
    if not (isinstance(row, dict) and isinstance(row.get("step"), int) and isinstance(row.get("split"), str)):
        raise DataError(f"{path}:{number}: not a row of a maskattn log (a JSON object with an int 'step' and a "
                        "'split'); the log was edited or damaged: repair or delete that line")
    return row


def read_metrics(path: str | Path) -> list[dict]:
    """Rows of a ``metrics.jsonl`` file; a last line cut short (by a kill, or still being written) is left out."""
    return _read_rows(Path(path))[0]


def _csv_text(rows: list[dict]) -> str:
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


class MetricsLogger:
    """Append rows to ``<out_dir>/metrics.jsonl`` and ``<out_dir>/metrics.csv`` (main process only).

    ``resume_step``: the step of the checkpoint a resumed run starts from (``None``: a new run, empty files);
    ``warn`` receives the message about a dropped cut-short last line."""

    def __init__(self, out_dir: str | Path, *, enabled: bool = True, resume_step: int | None = None,
                 warn: Callable[[str], None] | None = None, tensorboard: str | Path | None = None):
        self.enabled = enabled
        self.jsonl = Path(out_dir) / "metrics.jsonl"
        self.csv = Path(out_dir) / "metrics.csv"
        self.board: TensorBoardWriter | None = None
        if not enabled:
            return
        if tensorboard:
            self.board = TensorBoardWriter(tensorboard, resume_step=resume_step, warn=warn)
        rows: list[dict] = []
        if resume_step is not None:
            rows, torn = _read_rows(self.jsonl)
            if torn is not None and warn is not None:
                warn(f"{self.jsonl}: dropped its last line, cut short when the run was stopped while writing it "
                     f"({torn[:40]!r}…); the resumed run writes it again")
            rows = [r for r in rows if r["step"] <= resume_step and r["split"] != "test"]
            if resume_step and warn is not None and not any(r["step"] == resume_step and r["split"] == "dev"
                                                            for r in rows):
                last = f"its last row is of step {rows[-1]['step']}" if rows else "it holds no row"
                warn(f"{self.jsonl}: {last}, but the checkpoint was written at step {resume_step}, after that step's "
                     "dev row: the file was emptied or shortened since; the rows it lost are not written again (the "
                     "resumed run appends its own after what is left)")
        atomic_write(self.jsonl, ["".join(json.dumps(r) + "\n" for r in rows).encode("utf-8")])
        atomic_write(self.csv, [_csv_text(rows).encode("utf-8")])

    def log(self, **row) -> None:
        """Append ``row``; dev and test rows are flushed to disk before this returns."""
        if not self.enabled:
            return
        with self.jsonl.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
            if row.get("split") in ("dev", "test"):
                f.flush()
                os.fsync(f.fileno())
        with self.csv.open("a", newline="", encoding="utf-8") as f:
            csv.DictWriter(f, COLUMNS, extrasaction="ignore").writerow(row)
        if self.board is not None:
            self.board.log(row)

    def close(self) -> None:
        """Flush and close the TensorBoard writer (the metrics files are closed after every row)."""
        if self.board is not None:
            self.board.close()
            self.board = None


#: failures of tensorboard's writer threads, kept for the writer of the run to warn about (:func:`_quiet_threads`)
_THREAD_FAILURES: list[BaseException] = []


def _quiet_threads() -> None:
    """Keep the failure of a tensorboard writer thread (a full disk) from printing its traceback: it is recorded for
    :class:`TensorBoardWriter`, which says it once as a warning (tensorboard raises it again on the next call
    anyway). Other threads' failures are printed as before. Installed once per process."""
    previous = threading.excepthook
    if getattr(previous, "maskattn_tensorboard", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        if type(args.thread).__module__.startswith("tensorboard.") and isinstance(args.exc_value, Exception):
            _THREAD_FAILURES.append(args.exc_value)
        else:
            previous(args)

    hook.maskattn_tensorboard = True  # type: ignore[attr-defined]
    threading.excepthook = hook


def purge_events(folder: Path, step: int) -> list[Path]:
    """Drop, from the TensorBoard event files in ``folder``, the scalars of steps after ``step`` and every
    ``test/…`` scalar — what a run resumed at ``step`` writes again, as :class:`MetricsLogger` drops the same rows
    from ``metrics.jsonl``; each changed file is rewritten atomically. Returns the files changed."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.record_writer import RecordWriter

    changed = []
    for path in sorted(folder.glob("events.out.tfevents.*")):
        if not path.is_file():
            continue
        records = list(RawEventFileLoader(str(path)).Load())  # a record cut short by a kill is left out
        kept = io.BytesIO()
        writer = RecordWriter(kept)
        dropped = False
        for record in records:
            event = Event.FromString(record)
            if event.HasField("summary") and (event.step > step or
                                              any(v.tag.startswith("test/") for v in event.summary.value)):
                dropped = True
            else:
                writer.write(record)
        if dropped or len(kept.getvalue()) != path.stat().st_size:
            atomic_write(path, [kept.getvalue()])
            changed.append(path)
    return changed


class TensorBoardWriter:
    """A row of the metrics log as TensorBoard scalars ``<split>/<key>`` at the row's step (module docstring).

    An optional sink: a failure to write — a full disk or a removed folder, in tensorboard's writer thread or in a
    call — is said once through ``warn`` and the run goes on without TensorBoard (the metrics files keep every
    row). A resumed run (``resume_step``) first drops the events it writes again (:func:`purge_events`)."""

    def __init__(self, folder: str | Path, *, resume_step: int | None = None,
                 warn: Callable[[str], None] | None = None):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError(f"train.tensorboard {folder}: TensorBoard event files need the tensorboard package "
                              "(pip install 'maskattn[tensorboard]'), which is not installed") from None
        self.folder = Path(folder)
        self._warn = warn
        self.writer = None
        _quiet_threads()
        _THREAD_FAILURES.clear()
        try:
            if resume_step is not None and self.folder.is_dir():
                purge_events(self.folder, resume_step)
            self.writer = SummaryWriter(log_dir=str(folder))
        except Exception as exc:  # noqa: BLE001 (an optional sink: whatever fails, the run goes on)
            self._failed(exc)

    @property
    def active(self) -> bool:
        """Whether events are still written (False after a failure)."""
        return self.writer is not None

    def log(self, row: dict) -> None:
        if self.writer is None:
            return
        split, step = row.get("split", "train"), int(row["step"])
        try:
            for key, value in row.items():
                if key not in ("step", "epoch", "split") and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self.writer.add_scalar(f"{split}/{key}", value, step)
            if split in ("dev", "test"):
                self.writer.flush()
        except Exception as exc:  # noqa: BLE001 (an optional sink)
            self._failed(exc)
            return
        if _THREAD_FAILURES:
            self._failed(_THREAD_FAILURES.pop())

    def close(self) -> None:
        if self.writer is None:
            return
        writer, self.writer = self.writer, None
        try:
            writer.close()
        except Exception as exc:  # noqa: BLE001 (an optional sink)
            self._failed(exc)
        if _THREAD_FAILURES:  # the thread's last writes, which close() does not report
            self._failed(_THREAD_FAILURES.pop())

    def _failed(self, exc: BaseException) -> None:
        """Say once that TensorBoard stopped (``exc``), and stop writing to it."""
        _THREAD_FAILURES.clear()
        writer, self.writer = self.writer, None
        if writer is not None:
            try:
                writer.close()
            except Exception:  # noqa: BLE001, S110 (it failed already; said below)
                pass
        if self._warn is not None:
            reason = f"{exc.filename}: {exc.strerror}" if isinstance(exc, OSError) and exc.strerror else \
                f"{type(exc).__name__}: {exc}"
            self._warn(f"TensorBoard stopped writing to {self.folder} ({reason}); the run goes on without it — the "
                       "metrics files keep every row")
            self._warn = None  # once
