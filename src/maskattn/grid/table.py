"""The Markdown table of finished runs (``maskattn grid table``): one row per cell — runs whose configurations
differ only in their replicate keys (``train.seed``, ``data.fold``) and in how they were run (folder, threads,
device) — with the test metric of every run, its mean ± sample standard deviation, the mean best dev metric, the
epochs trained, the training throughput, the wall time per run and the parameters without the word embeddings
(MTSA Table 1's |θ|); with the efficiency figures of ``maskattn grid cost`` (``cost.json`` in a grid folder) beside
them. The rows (:func:`table_rows`) are also the cells that ``grid compare`` and ``grid plot`` name. Two runs of
one cell with the same replicate values (the same seed, and fold) are one run counted twice — a copy of a grid
inside the folders given (``runs/gc`` beside its backup ``runs/gc.bak``) would double a cell's runs and its seed
pairs: refused, naming both folders.

A run is a folder holding ``config.yaml`` and ``summary.json`` (what a grid run or a cross-validation fold writes),
or ``config.yaml`` and a ``metrics.jsonl`` that ends with its test row (a finished ``maskattn train`` run: its
summary is read from the log, without the parameter count); the folders given are searched for them
(:func:`maskattn.grid.records.collect_runs`, which reads every file through the validated readers: damage is one
``error:`` line naming the file and the entry). Runs of different presets or data sets (``data.source``, ``dir``,
``format``, ``train`` / ``dev`` / ``test``, ``cv_folds``, and the preset a grid was made from) make no table:
refused, naming them.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import ArgumentError
from .records import FRACTION_METRICS, HOW_KEYS, RunRecord, check_tested, finite, tested_metrics
from .spec import REPLICATE_KEYS

__all__ = ["Row", "resolved_records", "table_rows", "markdown_table", "count_text", "seconds_text", "bytes_text",
           "shown_value", "PERCENT_METRICS"]

#: the metrics shown in % (recorded as fractions)
PERCENT_METRICS = FRACTION_METRICS


@dataclass
class Row:
    """One cell of a table: its label and its runs, in replicate order."""

    label: str
    runs: list[RunRecord] = field(default_factory=list)


def resolved_records(records: list[RunRecord]) -> list[RunRecord]:
    """``records`` with their configurations resolved (:func:`~maskattn.train.resumable.resolved_config`: a value and
    the value it stands for — ``model.embed_scale: null`` and 1.0 with pretrained vectors — are one setting), so
    that runs of one configuration make one cell whichever spelling their ``config.yaml`` recorded."""
    from ..train.resumable import resolved_config

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
        _refuse_copies(rows)
        return ["cell"], rows
    differing = sorted({key for key in records[0].config.keys() | {k for r in records for k in r.config}
                        if key not in HOW_KEYS and key not in REPLICATE_KEYS
                        and len({json.dumps(row.runs[0].config.get(key), default=str) for row in rows}) > 1})
    for row in rows:
        row.label = ", ".join(f"{key}={_text(row.runs[0].config.get(key))}" for key in differing) or "(one cell)"
    _refuse_copies(rows)
    return ["settings"], rows


def _refuse_copies(rows: list[Row]) -> None:
    """Refuse two runs of one row with the same replicate values (module docstring), naming both folders."""
    for row in rows:
        seen: dict[tuple, RunRecord] = {}
        for record in row.runs:
            replicate = tuple(record.config.get(key) for key in REPLICATE_KEYS)
            if replicate in seen:
                told = ", ".join(f"{key.split('.')[-1]} {value}" for key, value in zip(REPLICATE_KEYS, replicate)
                                 if _tells_apart(record, key))
                raise ArgumentError(f"{seen[replicate].folder} and {record.folder} are the same run of cell "
                                    f"{row.label} ({told or 'the same settings'}), counted twice: a copy of a run or "
                                    "of a grid (a backup?) among the folders given; move one of them out, or give "
                                    "the grid folders themselves")
            seen[replicate] = record


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


def shown_value(metric: str, value: float) -> float:
    """A metric's value as the grid's tables and figures show it: :data:`PERCENT_METRICS` in %."""
    return 100 * value if metric in PERCENT_METRICS else value


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
    if tested_metrics(records):  # a table of runs without test scores shows "–"
        check_tested(metrics, records)
    _, rows = table_rows(records)
    with_cost = any(r.cost for r in records)
    # training throughput in the task's unit: examples (classifiers) or target tokens (seq2seq); one task per table
    speed_key = next((key for key in ("examples_per_s", "tokens_per_s") if key in records[0].summary), "examples_per_s")
    header = ["cell", "runs"]
    for name in metrics:
        unit = " (%)" if name in PERCENT_METRICS else ""
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
            digits = 1 if name in PERCENT_METRICS else 2
            tests = [shown_value(name, r.summary["test"][name]) for r in runs
                     if finite(r.summary.get("test", {}).get(name))]
            cells += [" / ".join(f"{v:.{digits}f}" for v in tests) or "–", _mean_std(tests, digits)]
        dev_metric = runs[0].summary.get("metric", metrics[0])
        devs = [shown_value(str(r.summary.get("metric", metrics[0])), r.summary["best_dev"]) for r in runs
                if finite(r.summary.get("best_dev"))]
        speeds = [r.summary[speed_key] for r in runs if speed_key in r.summary]
        walls = [r.summary["wall_s"] for r in runs if "wall_s" in r.summary]
        epochs = [r.summary["epochs"] for r in runs if "epochs" in r.summary]
        params = runs[0].summary.get("parameters", {}).get("without_embeddings")
        cells += [_mean_std(devs, 1 if dev_metric in PERCENT_METRICS else 2),
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
