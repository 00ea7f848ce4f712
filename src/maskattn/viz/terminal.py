"""A quick look in the terminal: each :class:`~maskattn.viz.panels.Heatmap` as a block of unicode shade
characters (`` ░▒▓█``, two per cell), coloured when the terminal has colour, with row labels and column
indices; a highlighted cell (CSAN's query) is red (``[]`` when empty)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.console import Console, Group
from rich.text import Text

from .panels import Heatmap

__all__ = ["SHADES", "shade_index", "panel_text", "print_grid"]

SHADES = " ░▒▓█"
_LABEL_WIDTH = 12


def shade_index(value: float, vmin: float, vmax: float) -> int:
    """The :data:`SHADES` index of ``value`` on the ``[vmin, vmax]`` scale: blank only at ``vmin`` (a masked
    key stays visibly apart from a small weight), then the quarter of the range, up to a full block."""
    t = (float(value) - vmin) / (vmax - vmin)
    return 0 if t <= 0 else min(len(SHADES) - 1, math.ceil(t * (len(SHADES) - 1)))


def _colour(level: int) -> str:
    """Light grey-blue (low) to dark blue (high)."""
    t = level / (len(SHADES) - 1)
    r, g, b = (round(220 - t * 190), round(225 - t * 160), round(235 - t * 60))
    return f"rgb({r},{g},{b})"


def _label(text: str) -> str:
    return text if len(text) <= _LABEL_WIDTH else text[: _LABEL_WIDTH - 1] + "…"


def panel_text(panel: Heatmap) -> Text:
    """The panel as text: a title line, a header of column indices (last digit), then one line per row."""
    rows, cols = panel.values.shape
    title = panel.title.replace("\n", " · ")
    out = Text(f"{title}  [{panel.vmin:g}..{panel.vmax:.3g}]\n", style="bold")
    out.append(" " * (_LABEL_WIDTH + 1) + "".join(f"{j % 10:<2}" for j in range(cols)) + "\n", style="dim")
    for i in range(rows):
        out.append(f"{_label(panel.row_labels[i]):>{_LABEL_WIDTH}} ")
        for j in range(cols):
            level = shade_index(float(panel.values[i, j]), panel.vmin, panel.vmax)
            if (i, j) == panel.highlight:
                out.append("[]" if level == 0 else SHADES[level] * 2, style="bold red")
            else:
                out.append(SHADES[level] * 2, style=_colour(level))
        out.append("\n")
    if panel.col_labels not in (panel.row_labels, tuple(str(j) for j in range(cols))):
        out.append("columns: " + " ".join(f"{j}={c}" for j, c in enumerate(panel.col_labels)) + "\n", style="dim")
    return out


def print_grid(rows: Sequence[Sequence[Heatmap]], console: Console | None = None) -> None:
    """Print every panel of ``rows``, row by row."""
    console = console or Console()
    console.print(Group(*(panel_text(panel) for row in rows for panel in row)))
