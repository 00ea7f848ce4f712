"""Draw :class:`~maskattn.viz.panels.Heatmap` grids with matplotlib's Agg canvas (no pyplot, no display,
no global state): one row of panels per grid row, as the rows of MTSA Fig. 3."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from ..errors import ArgumentError, ArgumentTypeError
from ..files import atomic_savefig
from ..validation import describe
from .panels import Heatmap

__all__ = ["draw_grid", "save_grid", "IMAGE_SUFFIXES"]

IMAGE_SUFFIXES = (".png", ".svg", ".pdf")
_MAX_TICK_LABELS = 40  # beyond this many rows / columns, tick labels would overlap


def _check_grid(rows) -> list[list[Heatmap]]:
    if isinstance(rows, Heatmap) or not isinstance(rows, Sequence) or not rows:
        raise ArgumentTypeError(f"rows must be a non-empty list of rows of Heatmap panels, got {describe(rows)}")
    for i, row in enumerate(rows):
        if not isinstance(row, Sequence) or not row or not all(isinstance(p, Heatmap) for p in row):
            raise ArgumentTypeError(f"rows[{i}] must be a non-empty list of Heatmap panels, got {describe(row)}")
    return [list(row) for row in rows]


def _draw_panel(ax, panel: Heatmap) -> None:
    rows, cols = panel.values.shape
    image = ax.imshow(panel.values.numpy(), cmap=panel.cmap, vmin=panel.vmin, vmax=panel.vmax,
                      interpolation="nearest", aspect="equal")
    if panel.highlight is not None:
        row, col = panel.highlight
        ax.add_patch(Rectangle((col - 0.5, row - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=1.5))
    ax.set_title(panel.title, fontsize=8)
    ax.set_xlabel(panel.xlabel, fontsize=7)
    ax.set_ylabel(panel.ylabel, fontsize=7)
    for set_ticks, set_labels, labels, count, rotation in (
            (ax.set_xticks, ax.set_xticklabels, panel.col_labels, cols, 90),
            (ax.set_yticks, ax.set_yticklabels, panel.row_labels, rows, 0)):
        if count <= _MAX_TICK_LABELS:
            set_ticks(range(count))
            set_labels(labels, fontsize=6, rotation=rotation)
        else:
            set_ticks([])
    ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.02).ax.tick_params(labelsize=6)


def draw_grid(rows: Sequence[Sequence[Heatmap]], *, title: str | None = None, cell_inches: float = 0.22) -> Figure:
    """A matplotlib :class:`~matplotlib.figure.Figure` (on an Agg canvas) with one axes per panel, row by
    row; ``fig.axes`` lists the panel axes first, in order, and each panel's ``values`` are exactly the
    array of its image (``ax.images[0].get_array()``)."""
    grid = _check_grid(rows)
    if not (isinstance(cell_inches, (int, float)) and not isinstance(cell_inches, bool) and cell_inches > 0):
        raise ArgumentError(f"cell_inches must be a positive number, got {describe(cell_inches)}")
    ncols = max(len(row) for row in grid)
    largest = max(max(p.values.shape) for row in grid for p in row)
    side = max(3.0, min(6.0, largest * cell_inches + 1.4))  # inches per panel, labels included
    fig = Figure(figsize=(side * ncols, side * len(grid)), layout="constrained")
    FigureCanvasAgg(fig)
    panel_axes = []
    for r, row in enumerate(grid):
        for c, panel in enumerate(row):
            ax = fig.add_subplot(len(grid), ncols, r * ncols + c + 1)
            panel_axes.append((ax, panel))
    for ax, panel in panel_axes:
        _draw_panel(ax, panel)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def save_grid(rows: Sequence[Sequence[Heatmap]], path: str | Path, *, title: str | None = None,
              dpi: int = 110) -> Path:
    """Draw ``rows`` (see :func:`draw_grid`) and write the image to ``path`` (``.png``, ``.svg`` or ``.pdf``;
    parent folders are created) atomically (:func:`~maskattn.files.atomic_savefig`: a failed write keeps the
    previous file)."""
    path = Path(path)
    if path.suffix.lower() not in IMAGE_SUFFIXES:
        raise ArgumentError(f"output file {path} must end in one of {', '.join(IMAGE_SUFFIXES)}")
    return atomic_savefig(draw_grid(rows, title=title), path, dpi=dpi)
