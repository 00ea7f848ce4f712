"""Outputs of a benchmark run: CSV, JSON, a PNG plot (one panel per mechanism family against multi-head
attention) and a rich terminal table."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from ..errors import ArgumentError
from ..files import atomic_savefig, atomic_write
from .runner import FIELDS, BenchResult

__all__ = ["write_outputs", "write_csv", "write_json", "plot", "figure", "render_tables"]


def write_csv(result: BenchResult, path: Path) -> Path:
    """One row per record, the columns of :data:`maskattn.bench.FIELDS`; written atomically
    (:func:`~maskattn.files.atomic_write`, as every output here)."""
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=list(FIELDS))
    writer.writeheader()
    for record in result.records:
        writer.writerow({k: "" if v is None else v for k, v in record.items()})
    return atomic_write(path, [text.getvalue().encode("utf-8")])


def write_json(result: BenchResult, path: Path) -> Path:
    """Machine, settings, field and module descriptions, notes, wall time and the records."""
    return atomic_write(path, [json.dumps(result.to_dict(), indent=1).encode("utf-8")])


#: The panels of the plot: one per mechanism family, each drawn against the references.
PLOT_FAMILIES = {
    "MTSA / Fast-DiSA / DiSA": ("mtsa", "fast_disa", "disa", "mtsa_algorithm1"),
    "MAN: DMAN, SMAN": ("dman", "sman"),
    "CSAN 1D / 2D": ("csan1d", "csan2d"),
    "RNN / CNN baselines": ("bilstm", "multi_cnn"),
}
#: Drawn in every panel (grey): multi-head attention, the baseline of every paper here.
PLOT_REFERENCES = ("mha", "torch_mha")


def _panel_rows(labels_by_mechanism: dict[str, list[str]]) -> list[tuple[str, list[str]]]:
    """(title, labels) of each family with results, then the mechanisms no family names."""
    named = {m for members in PLOT_FAMILIES.values() for m in members} | set(PLOT_REFERENCES)
    rows = [(title, [label for m in members for label in labels_by_mechanism.get(m, [])])
            for title, members in PLOT_FAMILIES.items()]
    rows.append(("other", [label for m, labels in labels_by_mechanism.items() if m not in named for label in labels]))
    return [(title, labels) for title, labels in rows if labels]


def plot(result: BenchResult, path: Path) -> Path:
    """Write :func:`figure` of ``result`` to ``path`` (PNG)."""
    import matplotlib.pyplot as plt

    fig = figure(result)
    try:
        return atomic_savefig(fig, path, dpi=110, bbox_inches="tight")
    finally:
        plt.close(fig)


def figure(result: BenchResult):
    """Per device, one row of panels per mechanism family (:data:`PLOT_FAMILIES`), each against multi-head
    attention (:data:`PLOT_REFERENCES`, grey): forward + backward time and peak memory against sequence length
    (log-log; MTSA Fig. 1's axes). Skipped and failed points are left out, so a line stops where its points
    stop fitting. A matplotlib ``Figure`` with constrained layout (the title above the panels, never on them)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in result.records if r["status"] == "ok"]
    devices = list(dict.fromkeys(r["device"] for r in result.records))
    labels_by_mechanism: dict[str, list[str]] = {}
    for r in result.records:
        labels = labels_by_mechanism.setdefault(r["mechanism"], [])
        if r["label"] not in labels:
            labels.append(r["label"])
    rows = _panel_rows(labels_by_mechanism)
    references = [label for m in PLOT_REFERENCES for label in labels_by_mechanism.get(m, [])]
    inference = result.settings.get("mode") == "inference"
    panels = (("time_ms", "forward time (ms)" if inference else "forward + backward time (ms)"),
              ("peak_mib", "peak memory (MiB)"))
    grid = [(device, title, labels) for device in devices for title, labels in rows] or \
        [(device, "multi-head attention", []) for device in devices]
    fig, axes = plt.subplots(len(grid), len(panels), figsize=(11, 3.6 * len(grid)), squeeze=False,
                             layout="constrained")
    colours, markers = plt.get_cmap("tab10"), "os^vD<>pPX"
    for (device, title, labels), row in zip(grid, axes):
        drawn = [(label, dict(color=colours(i % 10), marker=markers[i % len(markers)], linestyle="-"))
                 for i, label in enumerate(labels)]
        drawn += [(label, dict(color=str(0.35 + 0.25 * i), marker=".", linestyle="--"))
                  for i, label in enumerate(references)]
        for label, style in drawn:
            points = sorted((r for r in ok if r["device"] == device and r["label"] == label), key=lambda r: r["n"])
            if not points:
                continue
            values = {"time_ms": [r["fwd_ms_median"] + (r["bwd_ms_median"] or 0.0) for r in points],
                      "peak_mib": [r["peak_mib"] for r in points]}
            for ax, (key, _) in zip(row, panels):
                ax.plot([r["n"] for r in points], [max(v, 1e-6) for v in values[key]], label=label, markersize=4,
                        **style)
        lengths = sorted({r["n"] for r in result.records if r["device"] == device})
        for ax, (_, axis_title) in zip(row, panels):
            ax.set_xscale("log", base=2)
            ax.set_xticks(lengths, [str(n) for n in lengths])
            ax.minorticks_off()
            ax.set_yscale("log")
            ax.set_xlabel("sequence length n")
            ax.set_ylabel(axis_title)
            ax.set_title(f"{title} ({device})")
            ax.grid(True, which="both", alpha=0.3)
        if row[-1].get_legend_handles_labels()[0]:
            row[-1].legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    s = result.settings
    fig.suptitle(f"maskattn bench: batch {s['batch']}, width {s['width']}, {s['heads']} heads, {s['dtype']}, "
                 f"{s.get('mode', 'train')}{', compiled' if s.get('compile') else ''}; multi-head attention in grey")
    return fig


def output_folder(out_dir: Path | str) -> Path:
    """``out_dir`` as a folder for the outputs, created if missing (``ValueError`` if it is a file)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ArgumentError(f"out must be a folder (bench.csv, bench.json and bench.png go there), but {out_dir} "
                         "is a file")
    out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir


def write_outputs(result: BenchResult, out_dir: Path | str) -> dict[str, Path]:
    """Write ``bench.csv``, ``bench.json`` and ``bench.png`` into ``out_dir`` (created if missing)."""
    out_dir = output_folder(out_dir)
    return {"csv": write_csv(result, out_dir / "bench.csv"), "json": write_json(result, out_dir / "bench.json"),
            "png": plot(result, out_dir / "bench.png")}


def _ms(record, phase: str) -> str:
    if record[f"{phase}_ms_median"] is None:
        return "–"
    return (f"{record[f'{phase}_ms_median']:.2f} "
            f"[{record[f'{phase}_ms_min']:.2f}-{record[f'{phase}_ms_max']:.2f}]")


def _percent(fraction: float | None) -> str:
    """A fraction of the machine's matmul rate as a percentage; ``–`` where it is not meaningful (missing, or above
    100 %: the reference rate was measured while the machine was busier than during the module's run)."""
    return "–" if fraction is None or fraction > 1.0 else f"{100 * fraction:.1f}"


def render_tables(result: BenchResult) -> list[Table]:
    """One table per device: a row per (mechanism/backend, n), grouped by mechanism/backend."""
    tables = []
    for device in dict.fromkeys(r["device"] for r in result.records):
        s = result.settings
        table = Table(title=escape(f"{device}: batch {s['batch']}, width {s['width']}, {s['heads']} heads, "
                                   f"{s['dtype']}, {s.get('mode', 'train')}{', compiled' if s.get('compile') else ''}"
                                   f"; time = median [min-max] of {s['repeats']}"))
        for column in ("mechanism/backend", "n", "fwd ms", "bwd ms", "peak MiB", "GFLOP", "GFLOP/s",
                       "matmul GFLOP/s", "% matmul", "attn TFLOP/s", "status"):
            table.add_column(column, justify="left" if column in ("mechanism/backend", "status") else "right")
        rows = [r for r in result.records if r["device"] == device]
        labels = list(dict.fromkeys(r["label"] for r in rows))
        for label in labels:
            group = [r for r in rows if r["label"] == label]
            for i, r in enumerate(group):
                cells = [label if i == 0 else "", str(r["n"])]
                if r["status"] == "ok":
                    cells += [_ms(r, "fwd"), _ms(r, "bwd"), f"{r['peak_mib']:.1f}", f"{r['gflop']:.3g}",
                              f"{r['achieved_gflops']:.2f}", f"{r['matmul_gflops']:.1f}",
                              _percent(r["matmul_fraction"]),
                              "–" if r.get("attention_tflops") is None else f"{r['attention_tflops']:.3g}", "ok"]
                else:
                    cells += [""] * 8 + [f"{r['status']}: {r['reason']}"]
                table.add_row(*(escape(cell) for cell in cells), end_section=i == len(group) - 1)
        tables.append(table)
    return tables
