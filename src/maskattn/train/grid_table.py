"""The Markdown table of finished runs (``maskattn grid table``): one row per cell — runs whose configurations
differ only in their replicate keys (``train.seed``, ``data.fold``) and in how they were run (folder, threads,
device) — with the test metric of every run, its mean ± sample standard deviation, the mean best dev metric, the
epochs trained, the training throughput, the wall time per run and the parameters without the word embeddings
(MTSA Table 1's |θ|); with the efficiency figures of ``maskattn grid cost`` (``cost.json`` in a grid folder) beside
them.

A run is a folder holding ``config.yaml`` and ``summary.json`` (what a grid run or a cross-validation fold writes),
or ``config.yaml`` and a ``metrics.jsonl`` that ends with its test row (a finished ``maskattn train`` run: its
summary is read from the log, without the parameter count); the folders given are searched for them. Runs of
different presets or data sets (``data.source``, ``dir``, ``format``, ``train`` / ``dev`` / ``test``,
``cv_folds``, and the preset a grid was made from) make no table: refused, naming them.

Every file is read through one validated reader (:func:`read_run_record`, :func:`read_cost`, the grid manifests):
a ``summary.json`` that is cut short, not a JSON object or holds a value of the wrong type (a metric that is a
string, NaN or infinite), a ``config.yaml`` that is not a mapping of sections, a damaged ``cost.json`` or
``grid.json`` is a :class:`~maskattn.errors.DataError` naming the file and the entry — one ``error:`` line on the
command line —, for ``grid table`` and every command that reads runs through :func:`collect_runs`.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..data.text import read_text, read_yaml
from ..errors import ArgumentError, ConfigError, DataError
from ..sections import is_sections, shown
from .grid import MANIFEST, REPLICATE_KEYS, Grid, load_grid
from .resumable import FREE_SETTINGS, SUMMARY

__all__ = ["RunRecord", "collect_runs", "read_run_record", "read_cost", "read_grid", "resolved_records", "table_rows",
           "markdown_table", "COST_FILE"]

COST_FILE = "cost.json"
#: keys that say how a run was run, not what it computed
_HOW = {f"{section}.{key}" for section, key in FREE_SETTINGS} | {"train.out_dir"}
_DATA_KEYS = ("data.source", "data.dir", "data.format", "data.train", "data.dev", "data.test", "data.cv_folds",
              "data.hf_name")
_PERCENT = ("accuracy", "f1")


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
        return json.dumps({k: v for k, v in self.config.items() if k not in _HOW and k not in REPLICATE_KEYS},
                          sort_keys=True, default=str)


def _flatten(config: dict) -> dict:
    return {f"{section}.{key}": value for section, values in config.items() if isinstance(values, dict)
            for key, value in values.items()}


# --- the validated reader of run records ------------------------------------------------------------------------

def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _at_least_zero(value: object) -> bool:
    return _finite(value) and value >= 0  # type: ignore[operator]


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _test_metrics(value: object) -> bool:  # numbers must be finite; texts (sacreBLEU's signatures) are kept
    return isinstance(value, dict) and all(isinstance(k, str) and (_finite(v) or isinstance(v, str) or v is None)
                                           for k, v in value.items())


def _vectors(value: object) -> bool:
    return (isinstance(value, dict) and isinstance(value.get("file"), str) and _at_least_zero(value.get("token_share"))
            and _count(value.get("types_covered")) and _count(value.get("vocab_types")))


#: what each entry of a summary the table reads must be (an entry missing is shown as "–")
_SUMMARY_ENTRIES: dict[str, tuple[Callable[[object], bool], str]] = {
    "metric": (lambda v: isinstance(v, str), "a metric name"),
    "test": (_test_metrics, "an object of test metrics, each a finite number (or a text)"),
    "best_dev": (lambda v: v is None or _finite(v), "a finite number (or null)"),
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
        data = json.loads(read_text(path, what, max_bytes=2**24))
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
    if isinstance(metric, str) and metric in summary.get("test", {}) and not _finite(summary["test"][metric]):
        raise DataError(f"{path}: test {metric!r} must be a finite number, got {shown(summary['test'][metric])}; "
                        f"{_DAMAGED}")
    return summary


def _summary_from_log(folder: Path, config: dict) -> dict | None:
    """The summary of a finished ``maskattn train`` run (no ``summary.json``), from its ``metrics.jsonl``: the test
    row written when it finished, the dev row of that step (the best), the train rows' throughput. ``None`` when the
    log has no test row (not finished)."""
    from .logger import read_metrics

    rows = read_metrics(folder / "metrics.jsonl") if (folder / "metrics.jsonl").is_file() else []
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
        speeds = [r[unit] for r in rows if r.get("split") == "train" and _finite(r.get(unit))]
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
    return None if from_log is None else RunRecord(folder, flat, _check_summary(from_log, folder / "metrics.jsonl"))


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
    """The grid manifest in ``folder`` (:func:`~maskattn.train.grid.load_grid`), any damage a :class:`DataError`."""
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


@dataclass
class Row:
    """One cell of a table: its label and its runs, in replicate order."""

    label: str
    runs: list[RunRecord] = field(default_factory=list)


def resolved_records(records: list[RunRecord]) -> list[RunRecord]:
    """``records`` with their configurations resolved (:func:`~maskattn.train.resumable.resolved_config`: a value and
    the value it stands for — ``model.embed_scale: null`` and 1.0 with pretrained vectors — are one setting), so
    that runs of one configuration make one cell whichever spelling their ``config.yaml`` recorded."""
    from .resumable import resolved_config

    for record in records:
        nested: dict = {}
        for key, value in record.config.items():
            section, _, name = key.partition(".")
            nested.setdefault(section, {})[name] = value
        resolved = resolved_config(nested)
        if resolved is not None:
            record.config = {f"{section}.{key}": value for section, values in resolved.items()
                             for key, value in values.items()}
    return records



def table_rows(records: list[RunRecord]) -> tuple[list[str], list[Row]]:
    """The label columns and the rows (cells) of ``records``, in the order their first run was found. A row is
    labelled by its grid cell's name when every run has one and the names tell the cells apart, else by the settings
    that differ between the cells."""
    signatures = {record.signature for record in records}
    cell_names = {record.cell for record in records}
    if len(signatures) > 1 and (None in cell_names or len(cell_names) < len(signatures)):
        # runs one cell name (or no grid) spreads over several recorded configurations: the same run may be
        # spelled two ways (a default and its value), so compare them resolved (this imports the models: torch)
        records = resolved_records(records)
    cells: dict[str, Row] = {}
    for record in records:
        cells.setdefault(record.signature, Row("")).runs.append(record)
    rows = list(cells.values())
    for row in rows:
        row.runs.sort(key=lambda r: tuple(_number(r.config.get(k)) for k in REPLICATE_KEYS))
    names = [row.runs[0].cell for row in rows]
    if all(name is not None for name in names) and len(set(names)) == len(names):
        for row, name in zip(rows, names):
            row.label = name or "(base)"
        return ["cell"], rows
    differing = sorted({key for key in records[0].config.keys() | {k for r in records for k in r.config}
                        if key not in _HOW and key not in REPLICATE_KEYS
                        and len({json.dumps(row.runs[0].config.get(key), default=str) for row in rows}) > 1})
    for row in rows:
        row.label = ", ".join(f"{key}={_text(row.runs[0].config.get(key))}" for key in differing) or "(one cell)"
    return ["settings"], rows


def _number(value) -> float:
    return value if isinstance(value, (int, float)) else -1


def _text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _mean_std(values: list[float], digits: int) -> str:
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def count_text(count: float) -> str:
    """A count as the table shows it: ``1.23 M``, ``45.6 K``, ``789`` (a tiny model is not "0.00 M")."""
    if count >= 1e6:
        return f"{count / 1e6:.2f} M"
    return f"{count / 1e3:.1f} K" if count >= 1e3 else f"{count:.0f}"


def seconds_text(seconds: float) -> str:
    """Seconds as the table shows them: ``1,234 s``, ``12 s``, ``3.4 s``, ``0.12 s`` (a tiny run is not "0 s")."""
    if seconds >= 10:
        return f"{seconds:,.0f} s"
    return f"{seconds:.1f} s" if seconds >= 1 else f"{seconds:.2f} s"


def bytes_text(count: float) -> str:
    """Bytes in MB (2**20), or KB under 1 MB."""
    return f"{count / 2**20:,.0f} MB" if count >= 2**20 else f"{count / 2**10:,.0f} KB"


def _span(fractions: list[float]) -> str:
    low, high = min(fractions), max(fractions)
    return f"{low:.1%}" if f"{low:.1%}" == f"{high:.1%}" else f"{low:.1%}–{high:.1%}"


def _scaled(metric: str, value: float) -> float:
    return 100 * value if metric in _PERCENT else value


def _tells_apart(record: RunRecord, key: str) -> bool:
    """Whether replicate ``key`` tells ``record`` from its cell's other runs (a fold only in cross-validation)."""
    return key in record.config and (key != "data.fold" or bool(record.config.get("data.cv_folds")))


def _values(values: list) -> str:
    """``0–9`` for three or more consecutive integers, else the values separated by commas."""
    consecutive = all(isinstance(v, int) for v in values) and values == list(range(values[0], values[-1] + 1))
    return f"{values[0]}–{values[-1]}" if consecutive and len(values) >= 3 else ", ".join(map(str, values))


def _replicate_legend(records: list[RunRecord]) -> str:
    """What the per-run values of a row are, in the order the row lists them (numeric, as :func:`table_rows` sorts
    them): ``folds 0–9 (seed 0)`` when one replicate key varies, else every combination in that order."""
    keys = [key for key in REPLICATE_KEYS if any(_tells_apart(r, key) for r in records)]
    if not keys:
        return ""
    combos = sorted({tuple(r.config.get(key) for key in keys) for r in records},
                    key=lambda combo: tuple(_number(v) for v in combo))
    names = [key.split(".")[-1] for key in keys]
    varying = [i for i in range(len(keys)) if len({combo[i] for combo in combos}) > 1]
    fixed = ", ".join(f"{names[i]} {combos[0][i]}" for i in range(len(keys)) if i not in varying)
    if not varying:
        return fixed
    if len(varying) == 1:
        told = f"{names[varying[0]]}s {_values([combo[varying[0]] for combo in combos])}"
        return f"{told} ({fixed})" if fixed else told
    every = [" ".join(f"{name} {value}" for name, value in zip(names, combo)) for combo in combos]
    return ", ".join(every[:12]) + (", …" if len(every) > 12 else "")


def markdown_table(records: list[RunRecord], *, metric: str | Sequence[str] | None = None) -> str:
    """The Markdown table of ``records`` (module docstring); ``metric``: the test metric shown, or several (a list,
    or names separated by commas: ``rouge1,rouge2,rougeL``), each with its per-run and mean ± std columns (default:
    the runs' ``train.metric``). Accuracy and F1 are in %. A metric no run was tested on raises
    :class:`ArgumentError` naming those they were."""
    names = metric.split(",") if isinstance(metric, str) else list(metric or [])
    metrics = [name.strip() for name in names if name.strip()] or [records[0].summary.get("metric", "accuracy")]
    tested = sorted({key for r in records for key, value in r.summary.get("test", {}).items() if _finite(value)})
    unknown = [name for name in metrics if name not in tested]
    if unknown and tested:
        raise ArgumentError(f"--metric {', '.join(unknown)}: no run was tested on it; the runs' test metrics are "
                            f"{', '.join(tested)}")
    _, rows = table_rows(records)
    with_cost = any(r.cost for r in records)
    # training throughput in the task's unit: examples (classifiers) or target tokens (seq2seq); one task per table
    speed_key = next((key for key in ("examples_per_s", "tokens_per_s") if key in records[0].summary), "examples_per_s")
    header = ["cell", "runs"]
    for name in metrics:
        unit = " (%)" if name in _PERCENT else ""
        header += [f"test {name}{unit}, per run", f"test {name}"]
    header += [f"best dev {records[0].summary.get('metric', metrics[0])}", "epochs",
               f"train {speed_key.removesuffix('_per_s')}/s", "wall time / run", "parameters (without embeddings)"]
    if with_cost:
        header += ["time / epoch", "inference (test set)", "peak memory (training step)"]
    lines = ["| " + " | ".join(header) + " |", "|---|---:|" + "---|---:|" * len(metrics) + "---:|" * 5
             + ("---:|---:|---:|" if with_cost else "")]
    for row in rows:
        runs = row.runs
        cells = [row.label.replace("|", "\\|"), str(len(runs))]
        for name in metrics:
            digits = 1 if name in _PERCENT else 2
            tests = [_scaled(name, r.summary["test"][name]) for r in runs
                     if _finite(r.summary.get("test", {}).get(name))]
            cells += [" / ".join(f"{v:.{digits}f}" for v in tests) or "–", _mean_std(tests, digits)]
        dev_metric = runs[0].summary.get("metric", metrics[0])
        devs = [_scaled(str(r.summary.get("metric", metrics[0])), r.summary["best_dev"]) for r in runs
                if _finite(r.summary.get("best_dev"))]
        speeds = [r.summary[speed_key] for r in runs if speed_key in r.summary]
        walls = [r.summary["wall_s"] for r in runs if "wall_s" in r.summary]
        epochs = [r.summary["epochs"] for r in runs if "epochs" in r.summary]
        params = runs[0].summary.get("parameters", {}).get("without_embeddings")
        cells += [_mean_std(devs, 1 if dev_metric in _PERCENT else 2),
                  f"{statistics.mean(epochs):.1f}" if epochs else "–",
                  f"{statistics.median(speeds):,.0f}" if speeds else "–",
                  seconds_text(statistics.mean(walls)) if walls else "–",
                  count_text(params) if isinstance(params, int) else "–"]
        if with_cost:
            cost = runs[0].cost or {}
            cells += [seconds_text(cost["epoch_s"]) if "epoch_s" in cost else "–",
                      seconds_text(cost["inference_s"]) if "inference_s" in cost else "–",
                      bytes_text(cost["peak_memory_bytes"]) if "peak_memory_bytes" in cost else "–"]
        lines.append("| " + " | ".join(cells) + " |")
    coverage = [r.summary["data"]["vectors"] for r in records if "vectors" in r.summary.get("data", {})]
    if coverage:
        shares = [c["token_share"] for c in coverage]
        types = [c["types_covered"] / max(1, c["vocab_types"]) for c in coverage]
        lines += ["", f"Pretrained vectors ({len(coverage)} of {len(records)} runs, {coverage[0]['file']}): "
                      f"{_span(types)} of the training vocabulary types, {_span(shares)} of the training tokens."]
    legend = _replicate_legend(records)
    # a row without some of the replicates (runs not finished, or not defined for its cell) says which it has
    partial = [f"{row.label}: {own}" for row in rows if legend and (own := _replicate_legend(row.runs)) != legend]
    lines.append("")
    lines.append(f"Per run: {legend}{' (' + '; '.join(partial) + ')' if partial else ''}, in that order; mean ± "
                 "sample standard deviation over the runs of a row."
                 if legend else "Mean ± sample standard deviation over the runs of a row.")
    return "\n".join(lines)
