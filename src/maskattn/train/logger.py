"""Per-run metrics files: ``metrics.jsonl`` (one JSON object per row) and ``metrics.csv`` (fixed columns).
On resume, rows after the checkpoint's step (and the previous final test row) are dropped — that work is
redone."""

from __future__ import annotations

import csv
import json
from pathlib import Path

__all__ = ["MetricsLogger", "COLUMNS", "read_metrics"]

COLUMNS = ("step", "epoch", "split", "loss", "accuracy", "f1", "lr", "examples_per_s", "elapsed_s", "ppl", "bleu",
           "chrf", "tokens_per_s")


def read_metrics(path: str | Path) -> list[dict]:
    """Rows of a ``metrics.jsonl`` file."""
    path = Path(path)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


class MetricsLogger:
    """Append rows to ``<out_dir>/metrics.jsonl`` and ``<out_dir>/metrics.csv`` (main process only)."""

    def __init__(self, out_dir: str | Path, *, enabled: bool = True, resume_step: int | None = None):
        self.enabled = enabled
        self.jsonl = Path(out_dir) / "metrics.jsonl"
        self.csv = Path(out_dir) / "metrics.csv"
        if not enabled:
            return
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        rows = [r for r in read_metrics(self.jsonl) if r["step"] <= resume_step and r["split"] != "test"] \
            if resume_step is not None else []
        self.jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
        with self.csv.open("w", newline="") as f:
            writer = csv.DictWriter(f, COLUMNS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)

    def log(self, **row) -> None:
        if not self.enabled:
            return
        with self.jsonl.open("a") as f:
            f.write(json.dumps(row) + "\n")
        with self.csv.open("a", newline="") as f:
            csv.DictWriter(f, COLUMNS, extrasaction="ignore").writerow(row)
