"""Experiments: grids of runs — settings × seeds — defined, run, followed and analysed (``maskattn grid``). One run is
:mod:`maskattn.train`'s; this package, above it, is about many (``train`` never imports it).

* :mod:`.spec` — a grid's definition: its sweep grammar, its runs, its manifest (``grid.json``), its plan;
* :mod:`.records` — the one reader of what the runs left on disk (summaries, configurations, metrics, test outputs,
  launch and worker records, log tails), every reader bounded;
* :mod:`.worker` — the process of one run; :mod:`.launchers` — where the workers are started, behind one interface
  (local processes, Slurm jobs); :mod:`.scheduler` — :func:`run_grid`: what is left to do, and its launcher doing it;
* the analyses: :mod:`.status` (where each run is), :mod:`.table` (the Markdown table), :mod:`.compare` (is one cell
  better than another), :mod:`.plot` (learning curves), :mod:`.cost` (what each cell costs, measured side by side).
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from ..lazy import lazy_exports

if _TYPE_CHECKING:  # what static tools see; at run time the names are imported on first use (maskattn/lazy.py)
    from .cost import cost_table, measure_costs
    from .launchers import LAUNCHERS, Launcher, SlurmOptions
    from .plot import plot_grid
    from .records import RunRecord, collect_runs, read_run_record
    from .scheduler import run_grid
    from .spec import Grid, GridRun, define_grid, load_grid
    from .status import RunStatus, run_status
    from .table import markdown_table
    from .worker import run_one

__all__ = [
    "Grid", "GridRun", "define_grid", "load_grid", "run_grid", "run_one", "LAUNCHERS", "Launcher", "SlurmOptions",
    "run_status", "RunStatus", "RunRecord", "read_run_record", "collect_runs", "markdown_table", "plot_grid",
    "measure_costs", "cost_table",
]

__getattr__, __dir__ = lazy_exports(__name__, {
    ".spec": ("Grid", "GridRun", "define_grid", "load_grid"), ".scheduler": ("run_grid",), ".worker": ("run_one",),
    ".launchers": ("LAUNCHERS", "Launcher", "SlurmOptions"), ".status": ("run_status", "RunStatus"),
    ".records": ("RunRecord", "read_run_record", "collect_runs"), ".table": ("markdown_table",),
    ".plot": ("plot_grid",), ".cost": ("measure_costs", "cost_table"),
})
