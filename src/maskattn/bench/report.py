"""Outputs of a benchmark run: CSV, JSON, PNG plots (MTSA Fig. 1 style) and a rich terminal table."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from .runner import FIELDS, BenchResult

__all__ = ["write_outputs", "write_csv", "write_json", "plot", "render_tables"]


def write_csv(result: BenchResult, path: Path) -> Path:
    """One row per record, the columns of :data:`maskattn.bench.FIELDS`."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(FIELDS))
        writer.writeheader()
        for record in result.records:
            writer.writerow({k: "" if v is None else v for k, v in record.items()})
    return path


def write_json(result: BenchResult, path: Path) -> Path:
    """Machine, settings, field and module descriptions, notes, wall time and the records."""
    path.write_text(json.dumps(result.to_dict(), indent=1), encoding="utf-8")
    return path


def plot(result: BenchResult, path: Path) -> Path:
    """Per device, three panels against sequence length (log-log): peak memory (MTSA Fig. 1a), forward
    time and backward time (Fig. 1b, split); one line per mechanism/backend, baselines dashed. Skipped
    and failed points are left out, so a line stops where its points stop fitting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    devices = list(dict.fromkeys(r["device"] for r in result.records))
    labels = list(dict.fromkeys(r["label"] for r in result.records))
    colours = plt.get_cmap("tab20")
    markers = "os^vD<>pPX*h"
    panels = (("peak_mib", "peak memory (MiB)"), ("fwd_ms_median", "forward time (ms)"),
              ("bwd_ms_median", "backward time (ms)"))
    fig, axes = plt.subplots(len(devices), len(panels), figsize=(15, 4.2 * len(devices)), squeeze=False)
    for row, device in zip(axes, devices):
        for i, label in enumerate(labels):
            points = sorted((r for r in result.records
                             if r["device"] == device and r["label"] == label and r["status"] == "ok"),
                            key=lambda r: r["n"])
            if not points:
                continue
            style = dict(color=colours(i % 20), marker=markers[i % len(markers)], markersize=4, label=label,
                         linestyle="--" if points[0]["kind"] == "baseline" else "-")
            for ax, (key, _) in zip(row, panels):
                ax.plot([r["n"] for r in points], [max(r[key], 1e-6) for r in points], **style)
        lengths = sorted({r["n"] for r in result.records if r["device"] == device})
        for ax, (_, title) in zip(row, panels):
            ax.set_xscale("log", base=2)
            ax.set_xticks(lengths, [str(n) for n in lengths])
            ax.minorticks_off()
            ax.set_yscale("log")
            ax.set_xlabel("sequence length n")
            ax.set_ylabel(title)
            ax.set_title(f"{title}, {device}")
            ax.grid(True, which="both", alpha=0.3)
    s = result.settings
    fig.suptitle(f"maskattn bench: batch {s['batch']}, width {s['width']}, {s['heads']} heads, {s['dtype']}, "
                 f"forward + backward measured separately")
    legend = {}  # label → line, over every panel (a label may have points on one device only)
    for ax in axes.flat:
        legend.update(zip(*reversed(ax.get_legend_handles_labels())))
    fig.legend(list(legend.values()), list(legend), loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def write_outputs(result: BenchResult, out_dir: Path | str) -> dict[str, Path]:
    """Write ``bench.csv``, ``bench.json`` and ``bench.png`` into ``out_dir`` (created if missing)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"out must be a folder (bench.csv, bench.json and bench.png go there), but {out_dir} "
                         "is a file")
    out_dir.mkdir(parents=True, exist_ok=True)
    return {"csv": write_csv(result, out_dir / "bench.csv"), "json": write_json(result, out_dir / "bench.json"),
            "png": plot(result, out_dir / "bench.png")}


def _ms(record, phase: str) -> str:
    return (f"{record[f'{phase}_ms_median']:.2f} "
            f"[{record[f'{phase}_ms_min']:.2f}-{record[f'{phase}_ms_max']:.2f}]")


def render_tables(result: BenchResult) -> list[Table]:
    """One table per device: a row per (mechanism/backend, n), grouped by mechanism/backend."""
    tables = []
    for device in dict.fromkeys(r["device"] for r in result.records):
        s = result.settings
        table = Table(title=escape(f"{device}: batch {s['batch']}, width {s['width']}, {s['heads']} heads, "
                                   f"{s['dtype']}; time = median [min-max] of {s['repeats']}"))
        for column in ("mechanism/backend", "n", "fwd ms", "bwd ms", "peak MiB", "GFLOP", "GFLOP/s",
                       "matmul GFLOP/s", "% matmul", "status"):
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
                              f"{100 * r['matmul_fraction']:.1f}", "ok"]
                else:
                    cells += [""] * 7 + [f"{r['status']}: {r['reason']}"]
                table.add_row(*(escape(cell) for cell in cells), end_section=i == len(group) - 1)
        tables.append(table)
    return tables
