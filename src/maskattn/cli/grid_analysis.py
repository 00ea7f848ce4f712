"""``maskattn grid compare`` (is one cell better than another: the test the replication calls for) and ``maskattn
grid plot`` (learning curves of a grid's cells). Registered on ``grid_app``; scipy and matplotlib are imported
inside the commands, so ``maskattn --help`` does not load them."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from ..errors import ArgumentError
from .app import user_errors
from .grid import grid_app


@grid_app.command("compare")
def compare(
    items: list[str] = typer.Argument(..., metavar="GRID... CELL CELL [CELL...]",
                                      help="grid folders, then the cells to compare as `grid table` names them; "
                                      "GRID:CELL names a cell of a given grid (any trailing part of its path, e.g. "
                                      "table5_vectors/trec:mtsa) or of the folder GRID"),
    metric: str = typer.Option(..., "--metric", "-m", help="the test metric compared (accuracy, f1, rouge, rouge1, "
                               "rouge2, rougeL, bleu, chrf, loss)"),
    output: str = typer.Option("md", "--format", help="md (a Markdown table) or json"),
    samples: int = typer.Option(1000, "--samples", help="bootstrap resamples, 40 to 100,000 (one test set)"),
    seed: int = typer.Option(12345, "--seed", help="the bootstrap's seed, an int >= 0 (sacreBLEU's default)"),
):
    """Compare cells on a test metric: for each pair, the difference of the means (A − B) with its 95 % interval,
    the statistic, p and whether the difference is established at 5 % (p < 0.05, which is the interval excluding
    0). The test follows the replication: seeds → Welch's t (and how many seed pairs each leads); cross-validation
    folds → paired t with the Nadeau–Bengio corrected variance; one test set → also a paired bootstrap over the
    test items per seed pair (needs the runs' test.hyp.txt for ROUGE / BLEU / chrF, test.pred.jsonl for accuracy /
    F1, and the runs' data: the references, the gold labels). Example: maskattn grid compare
    benchmarks/results/table5_vectors/trec --metric accuracy mtsa cnn_nonstatic"""
    from ..grid.compare import (check_bootstrap_options, compare as run_compare, json_report, markdown_report,
                                resolve_cells)

    with user_errors():
        if output not in ("md", "json"):
            raise ArgumentError(f"--format {output!r}: expected md or json")
        check_bootstrap_options(samples, seed)
        grids = [item for item in items if ":" not in item and Path(item).is_dir()]
        cells = [item for item in items if item not in grids]
        reports = run_compare(resolve_cells(cells, grids), metric, samples=samples, seed=seed)
    print(json_report(reports) if output == "json" else markdown_report(reports))


@grid_app.command("plot")
def plot(
    folders: list[Path] = typer.Argument(..., help="grid folders, or any folders holding run folders"),
    out: Path = typer.Option(None, "--out", "-o", help="the files' path without extension: writes OUT.png and "
                             "OUT.svg (default: <first folder>/curves)"),
    metric: str = typer.Option(None, "--metric", help="the dev metric drawn (default: the runs' train.metric)"),
    title: str = typer.Option(None, "--title", help="the figure's title"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace OUT.png and OUT.svg if they exist"),
):
    """Draw a grid's learning curves: per cell, training loss and dev metric against the step, mean ± std over its
    seeds or folds, each run's test score marked at the step of its tested (best) checkpoint; PNG and SVG, written
    atomically (existing files need --overwrite). A run without a metrics log is named and left out; dev values
    that are not finite and logs cut short are named in notes."""
    from ..grid.plot import plot_grid

    with user_errors():
        written, skipped, notes = plot_grid(folders, out or folders[0] / "curves", metric=metric, title=title,
                                            overwrite=overwrite)
    err = Console(stderr=True)
    for line in skipped:
        err.print(f"skipped {escape(line)}", highlight=False, soft_wrap=True)
    for line in notes:
        err.print(f"note: {escape(line)}", highlight=False, soft_wrap=True)
    print("\n".join(str(path) for path in written))
