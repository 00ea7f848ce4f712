"""The one reader of what a grid's runs left on disk — every command that looks at runs (``grid run`` deciding what
is left to do, ``grid status``, ``table``, ``compare``, ``plot``, ``cost``) reads them here, and every reader is
bounded (a file read whole at most 16 MiB, a line at most the line reader's limit, a log's tail from its end):

* a run's record — its ``config.yaml`` and its summary (``summary.json``, or for a finished ``maskattn train`` run the
  test row its ``metrics.jsonl`` ends with), as a :class:`RunRecord` (:func:`read_run_record`), and the finished
  runs under some folders placed in their grids' cells (:func:`collect_runs`); its metrics log
  (:func:`read_run_metrics`) and the test outputs it was scored on (:func:`read_test_predictions`,
  :func:`read_test_hypotheses`);
* a grid's records — its manifest (:func:`read_grid`) and the costs ``maskattn grid cost`` measured
  (:func:`read_cost`);
* what the grid's processes record in a run's folder — the launcher's ``launch.json`` and the worker's
  ``worker.json`` (:func:`read_record`), whether a worker holds the run now (:func:`is_held`), the last lines of its
  log (:func:`log_tail`).

Whether a run has finished is :func:`read_summary` — the trainer's own reader (:mod:`maskattn.train.resumable`: a
run is trained only when it has no summary, and ``train`` does not import the grid), used from here by the grid.

Damage is one error naming the file: a ``summary.json`` that is cut short, not a JSON object or holds a value of the
wrong type (a metric that is a string, NaN or infinite), a ``config.yaml`` that is not a mapping of sections, a
damaged ``cost.json`` or ``grid.json`` is a :class:`~maskattn.errors.DataError` naming the file and the entry — one
``error:`` line on the command line. The records of the grid's processes are advisory: one that is absent or
unreadable reads as ``{}``.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..data.text import read_text, read_yaml
from ..errors import ArgumentError, ConfigError, DataError
from ..metrics.test_outputs import HYPOTHESES, PREDICTIONS, Prediction, read_hypotheses, read_predictions
from ..sections import is_sections, shown
from ..train.resumable import FREE_SETTINGS, SUMMARY, read_summary
from .spec import LAUNCH_RECORD, MANIFEST, REPLICATE_KEYS, RUN_LOG, WORKER_LOCK, Grid, load_grid

__all__ = ["RunRecord", "read_run_record", "collect_runs", "read_summary", "result_text", "read_run_metrics",
           "read_test_predictions", "read_test_hypotheses", "read_grid", "read_cost", "read_record", "is_held",
           "log_tail", "finite", "tested_metrics", "check_tested", "HOW_KEYS", "SUMMARY", "METRICS", "COST_FILE", "HYPOTHESES",
           "PREDICTIONS", "FRACTION_METRICS", "METRIC_RANGES", "INTERVAL_BOUNDS"]

#: the costs ``maskattn grid cost`` measured, in a grid's folder
COST_FILE = "cost.json"
#: a run's metrics log
METRICS = "metrics.jsonl"
#: keys that say how a run was run, not what it computed
HOW_KEYS = {f"{section}.{key}" for section, key in FREE_SETTINGS} | {"train.out_dir"}
_DATA_KEYS = ("data.source", "data.dir", "data.format", "data.train", "data.dev", "data.test", "data.cv_folds",
              "data.hf_name")
#: the metrics recorded as fractions (shown in %: :data:`maskattn.grid.table.PERCENT_METRICS`)
FRACTION_METRICS = ("accuracy", "f1")
#: the values a metric can take (its interval bounds too): a recorded value outside is damage, refused when read
METRIC_RANGES: dict[str, tuple[float, float]] = {
    **{name: (0.0, 1.0) for name in FRACTION_METRICS},
    **{name: (0.0, 100.0) for name in ("rouge", "rouge1", "rouge2", "rougeL", "bleu", "chrf")},
    "loss": (0.0, math.inf), "ppl": (1.0, math.inf)}
#: the suffixes of a metric's interval bounds in a summary's test metrics (``rouge1_low``): bounds, not metrics
INTERVAL_BOUNDS = ("_low", "_high")
#: the most bytes read of a summary or cost file, and of a launch or worker record (a few hundred bytes each)
_JSON_BYTES = 2**24
_RECORD_BYTES = 2**20
#: the most bytes of a log's end read for its last lines
_TAIL_BYTES = 2**22


# --- a run's record ------------------------------------------------------------------------------------------------

@dataclass
class RunRecord:
    """A finished run: its folder, its flattened configuration (``section.key`` → value), its summary, the preset
    its grid was made from, its grid cell's name and that cell's measured costs (both ``None`` outside a grid)."""

    folder: Path
    config: dict
    summary: dict
    preset: str | None = None
    cell: str | None = None
    cost: dict | None = None
    order: tuple = ()  # (folder given, grid, run): its place in the grid manifests (the rows' order); () outside

    @property
    def identity(self) -> dict:
        """What must be equal for runs to share a table: the preset and the data."""
        return {"preset": self.preset, **{key: self.config.get(key) for key in _DATA_KEYS}}

    @property
    def signature(self) -> str:
        """The cell: every setting but the replicate keys and how the run was run."""
        return json.dumps({k: v for k, v in self.config.items() if k not in HOW_KEYS and k not in REPLICATE_KEYS},
                          sort_keys=True, default=str)


def _flatten(config: dict) -> dict:
    return {f"{section}.{key}": value for section, values in config.items() if isinstance(values, dict)
            for key, value in values.items()}


def finite(value: object) -> bool:
    """Is ``value`` a finite number (not a bool)?"""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _at_least_zero(value: object) -> bool:
    return finite(value) and value >= 0  # type: ignore[operator]


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _test_metrics(value: object) -> bool:  # numbers must be finite; texts (sacreBLEU's signatures) are kept
    return isinstance(value, dict) and all(isinstance(k, str) and (finite(v) or isinstance(v, str) or v is None)
                                           for k, v in value.items())


def _vectors(value: object) -> bool:
    return (isinstance(value, dict) and isinstance(value.get("file"), str) and _at_least_zero(value.get("token_share"))
            and _count(value.get("types_covered")) and _count(value.get("vocab_types")))


#: what each entry of a summary the table reads must be (an entry missing is shown as "–")
_SUMMARY_ENTRIES: dict[str, tuple[Callable[[object], bool], str]] = {
    "metric": (lambda v: isinstance(v, str), "a metric name"),
    "test": (_test_metrics, "an object of test metrics, each a finite number (or a text)"),
    "best_dev": (lambda v: v is None or finite(v), "a finite number (or null)"),
    "best_step": (lambda v: v is None or _count(v), "a step count (or null)"),
    "steps": (_count, "a step count"),
    "epochs": (_at_least_zero, "a finite number >= 0"),
    "wall_s": (_at_least_zero, "seconds, a finite number >= 0"),
    "examples_per_s": (_at_least_zero, "a finite number >= 0"),
    "tokens_per_s": (_at_least_zero, "a finite number >= 0"),
    "parameters": (lambda v: isinstance(v, dict) and all(_count(n) for n in v.values()), "an object of counts"),
    "data": (lambda v: isinstance(v, dict) and ("vectors" not in v or _vectors(v["vectors"])),
             "an object (its 'vectors': file, token_share, types_covered, vocab_types)"),
}
_DAMAGED = "the file was damaged or edited by hand"


def _read_json(path: Path, what: str) -> dict:
    """The JSON object in ``path``, or :class:`DataError` naming it: not UTF-8, cut short, not JSON, not an object."""
    try:
        data = json.loads(read_text(path, what, max_bytes=_JSON_BYTES))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}: cut short?); "
                        f"{_DAMAGED}") from None
    except RecursionError:
        raise DataError(f"{path}: JSON nested too deeply to read; {_DAMAGED}") from None
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected a JSON object, got {type(data).__name__} {shown(data)}; {_DAMAGED}")
    return data


def _check_summary(summary: dict, path: Path) -> dict:
    for key, (accepts, description) in _SUMMARY_ENTRIES.items():
        if key in summary and not accepts(summary[key]):
            raise DataError(f"{path}: entry {key!r} must be {description}, got {shown(summary[key])}; {_DAMAGED} "
                            "(a run of a grid: delete the file and run the grid again to train the run again)")
    metric = summary.get("metric")
    if isinstance(metric, str) and metric in summary.get("test", {}) and not finite(summary["test"][metric]):
        raise DataError(f"{path}: test {metric!r} must be a finite number, got {shown(summary['test'][metric])}; "
                        f"{_DAMAGED}")
    values = [(f"test {name!r}", name, value) for name, value in summary.get("test", {}).items()]
    if isinstance(metric, str) and summary.get("best_dev") is not None:
        values.append(("entry 'best_dev'", metric, summary["best_dev"]))
    for what, name, value in values:
        low, high = METRIC_RANGES.get(_base_metric(name), (-math.inf, math.inf))
        if finite(value) and not low <= value <= high:
            raise DataError(f"{path}: {what} must be in [{low:g}, {high:g}] ({_base_metric(name)}'s range), got "
                            f"{shown(value)}; {_DAMAGED} (a run of a grid: delete the file and run the grid again "
                            "to train the run again)")
    return summary


def _base_metric(name: str) -> str:
    """The metric an interval bound belongs to (``rouge1_low`` → ``rouge1``); any other name is its own."""
    for suffix in INTERVAL_BOUNDS:
        if name.endswith(suffix) and name != suffix:
            return name[:-len(suffix)]
    return name


def tested_metrics(records: Sequence[RunRecord]) -> list[str]:
    """The metrics the runs were tested on, sorted: the finite numbers of their summaries' ``test``, without the
    bounds of an interval beside a metric (``rouge1_low`` / ``rouge1_high`` beside ``rouge1``)."""
    names = {key for r in records for key, value in r.summary.get("test", {}).items() if finite(value)}
    return sorted(name for name in names if _base_metric(name) == name or _base_metric(name) not in names)


def check_tested(names: Sequence[str], records: Sequence[RunRecord]) -> None:
    """Refuse (:class:`ArgumentError`, one line) a ``--metric`` name that is not one of :func:`tested_metrics` —
    one no run was tested on, or the bound of a metric's interval — naming the metrics there are."""
    tested = tested_metrics(records)
    for name in names:
        if name not in tested:
            base = _base_metric(name)
            why = f"a bound of {base}'s 95 % interval, not a metric" if base in tested else "no run was tested on it"
            raise ArgumentError(f"--metric {name}: {why}; the runs' test metrics are {', '.join(tested) or 'none'}")


def _summary_from_log(folder: Path, config: dict) -> dict | None:
    """The summary of a finished ``maskattn train`` run (no ``summary.json``), from its ``metrics.jsonl``: the test
    row written when it finished, the dev row of that step (the best), the train rows' throughput. ``None`` when the
    log has no test row (not finished)."""
    rows = read_run_metrics(folder) if (folder / METRICS).is_file() else []
    if not rows or rows[-1].get("split") != "test":
        return None
    test_row = rows[-1]
    metric = config.get("train.metric") if isinstance(config.get("train.metric"), str) else "accuracy"
    skip = {"step", "epoch", "split", "elapsed_s", "lr"}
    summary: dict = {"metric": metric, "test": {k: v for k, v in test_row.items() if k not in skip},
                     "best_step": test_row.get("step")}
    dev = next((r for r in reversed(rows) if r.get("split") == "dev" and r.get("step") == test_row.get("step")), None)
    if dev is not None and metric in dev:
        summary["best_dev"] = dev[metric]
    for key, source in (("epochs", "epoch"), ("wall_s", "elapsed_s")):
        if source in test_row:
            summary[key] = test_row[source]
    for unit in ("examples_per_s", "tokens_per_s"):
        speeds = [r[unit] for r in rows if r.get("split") == "train" and finite(r.get(unit))]
        if speeds:
            summary[unit] = statistics.mean(speeds)
    return summary


def read_run_record(folder: str | Path) -> RunRecord | None:
    """The finished run in ``folder`` as a :class:`RunRecord` (its flattened ``config.yaml`` and its summary, from
    ``summary.json`` or, for a single ``maskattn train`` run, its log), ``None`` when it has not finished, or
    :class:`DataError` naming the file and entry that is damaged (module docstring). Not placed in a grid (see
    :func:`collect_runs`)."""
    folder = Path(folder)
    config_path = folder / "config.yaml"
    try:
        config = read_yaml(config_path, "run configuration", DataError)
    except ConfigError as exc:  # pragma: no cover - read_yaml raises DataError when asked to
        raise DataError(str(exc)) from None
    if not isinstance(config, dict) or not is_sections(config):
        raise DataError(f"{config_path}: expected a run configuration (a mapping of sections: data, model, optim, "
                        f"train), got {shown(config)}; {_DAMAGED}")
    flat = _flatten(config)
    summary_path = folder / SUMMARY
    if summary_path.is_file():
        return RunRecord(folder, flat, _check_summary(_read_json(summary_path, "run summary"), summary_path))
    from_log = _summary_from_log(folder, flat)
    return None if from_log is None else RunRecord(folder, flat, _check_summary(from_log, folder / METRICS))


def result_text(summary: dict) -> str | None:
    """A finished run's test metric as the grid's messages say it (``test accuracy 0.8125``); ``None`` without one."""
    test = summary.get("test", {}).get(summary.get("metric"))
    return f"test {summary.get('metric')} {test:.4f}" if isinstance(test, float) else None


def read_run_metrics(folder: str | Path) -> list[dict]:
    """The rows of a run's ``metrics.jsonl`` (:func:`maskattn.train.logger.read_metrics`: a last line cut short by a
    kill is left out; damage is a :class:`DataError`)."""
    from ..train.logger import read_metrics  # imported where a log is read: grid table reads summaries

    return read_metrics(Path(folder) / METRICS)


def read_test_predictions(folder: str | Path) -> list[Prediction]:
    """A classifier run's test predictions with their gold labels (``test.pred.jsonl``,
    :func:`maskattn.metrics.test_outputs.read_predictions`)."""
    return read_predictions(Path(folder) / PREDICTIONS)


def read_test_hypotheses(folder: str | Path, count: int) -> list[str]:
    """A seq2seq run's test hypotheses (``test.hyp.txt``), which must be ``count``
    (:func:`maskattn.metrics.test_outputs.read_hypotheses`)."""
    return read_hypotheses(Path(folder) / HYPOTHESES, count)


# --- a grid's records ----------------------------------------------------------------------------------------------

def read_cost(grid_folder: str | Path) -> dict | None:
    """The cells of ``<grid>/cost.json`` (``maskattn grid cost``), each checked, or ``None`` when there is none."""
    path = Path(grid_folder) / COST_FILE
    if not path.is_file():
        return None
    cells = _read_json(path, "cost file").get("cells")
    if not isinstance(cells, dict) or not all(isinstance(c, dict) for c in cells.values()):
        raise DataError(f"{path}: entry 'cells' must be an object of cells, got {shown(cells)}; {_DAMAGED} (measure "
                        "again: maskattn grid cost)")
    for cell, values in cells.items():
        for key in ("epoch_s", "inference_s", "peak_memory_bytes"):
            if key in values and not _at_least_zero(values[key]):
                raise DataError(f"{path}: cell {cell!r}: {key} must be a finite number >= 0, got "
                                f"{shown(values[key])}; {_DAMAGED} (measure again: maskattn grid cost)")
    return cells


def read_grid(folder: str | Path) -> Grid:
    """The grid manifest in ``folder`` (:func:`~maskattn.grid.spec.load_grid`), any damage a :class:`DataError`."""
    try:
        return load_grid(folder)
    except ConfigError as exc:
        raise DataError(str(exc)) from None


def collect_runs(paths: Sequence[str | Path]) -> tuple[list[RunRecord], list[Path]]:
    """The finished runs under ``paths`` (folders), and the run folders that have not finished. Every file is read
    through the validated readers (module docstring): a damaged one is a :class:`DataError` naming it."""
    records, unfinished, seen = [], [], set()
    for root_number, root in enumerate(map(Path, paths)):
        if not root.is_dir():
            raise ArgumentError(f"{root} is not a folder of runs")
        above = [folder / MANIFEST for folder in [root.resolve(), *root.resolve().parents][:4]]
        grids = {p.parent.resolve(): read_grid(p.parent) for p in [*above, *root.rglob(MANIFEST)] if p.is_file()}
        places = {(grid_folder / run.name).resolve(): (number, index, grid_folder, grid, run)
                  for number, (grid_folder, grid) in enumerate(grids.items()) for index, run in enumerate(grid.runs)}
        costs: dict[Path, dict | None] = {}
        for config_path in sorted(root.rglob("config.yaml")):
            folder = config_path.parent.resolve()
            if folder in seen:
                continue
            seen.add(folder)
            record = read_run_record(folder)
            if record is None:
                unfinished.append(folder)
                continue
            config = record.config
            if folder in places:
                number, index, grid_folder, grid, run = places[folder]
                record.preset, record.cell = grid.base.get("preset"), run.cell
                record.order = (root_number, number, index)
                if isinstance(config.get("data.dir"), str) and not Path(config["data.dir"]).is_absolute():
                    config["data.dir"] = str((Path(grid.cwd) / config["data.dir"]).resolve())
                if grid_folder not in costs:
                    costs[grid_folder] = read_cost(grid_folder)
                record.cost = (costs[grid_folder] or {}).get(run.cell)
            records.append(record)
    records.sort(key=lambda r: (r.order or (len(paths), 0, 0), str(r.folder)))
    if not records:
        raise ArgumentError(f"no finished runs (folders with config.yaml and {SUMMARY}) under {', '.join(map(str, paths))}"
                            + (f"; {len(unfinished)} unfinished" if unfinished else ""))
    _check_one_task(records)
    return records, unfinished


def _check_one_task(records: list[RunRecord]) -> None:
    identities: dict[str, RunRecord] = {}
    for record in records:
        identities.setdefault(json.dumps(record.identity, sort_keys=True, default=str), record)
    if len(identities) > 1:
        described = "; ".join(f"{r.folder}: preset {r.preset or '(none recorded)'}, " + ", ".join(
            f"{key}={r.identity[key]}" for key in _DATA_KEYS if r.identity[key] not in (None, 0)) for r in identities.values())
        raise ArgumentError(f"the runs are of {len(identities)} different presets or data sets, which make no table "
                            f"together: {described}")


# --- what the grid's processes record in a run's folder ------------------------------------------------------------

def read_record(folder: Path, name: str) -> dict:
    """A run's ``launch.json`` / ``worker.json`` (module docstring), ``{}`` when absent or unreadable."""
    try:
        data = json.loads(read_text(folder / name, "grid record", max_bytes=_RECORD_BYTES))
    except (DataError, OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def is_held(folder: Path) -> bool:
    """Whether a worker holds the run in ``folder`` now (its ``flock``; seen from any machine where flock reaches)."""
    lock = folder / WORKER_LOCK
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
    """The last non-empty lines of a run's ``train.log``, or of its Slurm job's stderr (then stdout) when the log has
    none; each log is read from its end, at most its last 4 MiB."""
    paths = [folder / RUN_LOG]
    launch = read_record(folder, LAUNCH_RECORD)
    if grid_folder is not None and launch.get("slurm_folder"):
        job_folder = grid_folder / launch["slurm_folder"]
        paths += sorted(job_folder.glob("*_log.err")) + sorted(job_folder.glob("*_log.out"))
    for path in paths:
        try:
            found = _last_lines(path, lines)
        except OSError:
            continue
        if found:
            return found
    return []


def _last_lines(path: Path, count: int) -> list[str]:
    """The last ``count`` non-empty lines of ``path``, right-stripped: a growing piece of its end is read (64 KiB,
    then four times more, up to :data:`_TAIL_BYTES`) until it holds them; the line the piece starts inside is not
    one of them."""
    with open(path, "rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        span = min(size, 2**16)
        while True:
            handle.seek(size - span)
            pieces = handle.read(span).decode("utf-8", errors="replace").splitlines()
            if span < size:
                pieces = pieces[1:]
            found = [line.rstrip() for line in pieces if line.strip()]
            if len(found) >= count or span >= min(size, _TAIL_BYTES):
                return found[-count:]
            span = min(size, _TAIL_BYTES, span * 4)
