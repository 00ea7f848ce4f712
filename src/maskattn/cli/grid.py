"""``maskattn grid run`` (settings × seeds as one resumable job), ``maskattn grid table`` (the Markdown table of
its run folders) and ``maskattn grid cost`` (parameters, time per epoch, inference time and peak memory of its
cells, measured side by side)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from ..errors import ArgumentError
from .app import app, interrupt_exits, sigterm_as_interrupt, user_errors

grid_app = typer.Typer(help="Grids of runs: settings × seeds trained as one resumable job, and their tables.",
                       no_args_is_help=True)
app.add_typer(grid_app, name="grid")


def _grid(out: Path, config: Path | None, preset: str | None, data: Path | None, overrides: list[str] | None,
          variants: list[str] | None, variants_file: Path | None, seeds: str | None):
    """The grid these options define in ``out``, or with none of them the grid already there."""
    from ..train.grid import define_grid, load_grid

    items = ([f"data.dir={data}"] if data is not None else []) + list(overrides or [])
    if config is None and preset is None and not items and not variants and variants_file is None and seeds is None:
        return load_grid(out)
    return define_grid(out, preset=preset, config=config, overrides=items, variants=list(variants or []),
                       variants_file=variants_file, seeds=seeds)


OUT = typer.Option(..., "--out", "-o", help="the grid folder: grid.json and one folder per run")
CONFIG = typer.Option(None, "--config", "-c", help="YAML run configuration (the base of every run)")
PRESET = typer.Option(None, "--preset", "-p", help="a preset shipped with maskattn (the base of every run)")
DATA = typer.Option(None, "--data", help="dataset folder (sets data.dir)")
OVERRIDES = typer.Option(None, "--set", "-s", help="section.key=value, or several values section.key=a,b,c / "
                         "range(start,stop[,step]): one cell each (repeatable; quote a value that holds a comma)")
VARIANTS = typer.Option(None, "--variant", help="a named row of several settings: NAME={section.key: value, ...}, "
                        "or NAME of a variant in --variants (repeatable)")
VARIANTS_FILE = typer.Option(None, "--variants", help="YAML file of named variants (name: {section.key: value}); "
                             "all of them unless --variant NAME picks some")
SEEDS = typer.Option(None, "--seeds", help="train.seed values: 0-4, 0,2,5 (every cell is run with each)")


@grid_app.command("run")
def run(out: Path = OUT, config: Path = CONFIG, preset: str = PRESET, data: Path = DATA,
        overrides: list[str] = OVERRIDES, variants: list[str] = VARIANTS, variants_file: Path = VARIANTS_FILE,
        seeds: str = SEEDS, jobs: int = typer.Option(1, "--jobs", "-j", help="runs at a time"),
        threads: int = typer.Option(None, "--threads", help="intra-op threads per run (default: the CPUs / --jobs)"),
        dry_run: bool = typer.Option(False, "--dry-run", help="check every run's configuration, list the runs, "
                                     "train none")):
    """Train a grid: every combination of the variants, the swept --set values and the seeds, each run in its own
    folder under --out, --jobs at a time. Run again to continue: finished runs are kept, interrupted ones resume;
    `maskattn grid run --out DIR` alone continues the grid in DIR.

    Example: maskattn grid run --preset trec --data ../shared/data/trec --out runs/trec-grid
    --set model.encoder=mtsa,bilstm --seeds 0-4 --jobs 2 --threads 1"""
    from ..train.grid import run_grid

    console = Console()
    sigterm_as_interrupt()
    with user_errors(), interrupt_exits():
        grid = _grid(out, config, preset, data, overrides, variants, variants_file, seeds)
        if dry_run:
            for grid_run in grid.runs:
                console.print(f"{escape(grid_run.name)}: {escape(' '.join(grid_run.overrides) or '(base settings)')}",
                              highlight=False, soft_wrap=True)
            console.print(f"{len(grid.runs)} runs; fixed settings: {escape(' '.join(grid.fixed) or 'none')}",
                          highlight=False, soft_wrap=True)
            return
        outcome = run_grid(grid, jobs=jobs, threads=threads,
                           say=lambda line: console.print(escape(line), highlight=False, soft_wrap=True))
    console.print(f"finished now: {len(outcome['finished'])}, earlier: {len(outcome['done'])}, held by another "
                  f"process: {len(outcome['busy'])}, failed: {len(outcome['failed'])}; the table: maskattn grid table "
                  f"{escape(str(out))}", highlight=False, soft_wrap=True)
    if outcome["failed"]:
        raise typer.Exit(code=1)


@grid_app.command("cost")
def cost(out: Path = OUT, config: Path = CONFIG, preset: str = PRESET, data: Path = DATA,
         overrides: list[str] = OVERRIDES, variants: list[str] = VARIANTS, variants_file: Path = VARIANTS_FILE,
         seeds: str = SEEDS, steps: int = typer.Option(20, "--steps", help="timed training steps per cell and round"),
         warmup: int = typer.Option(2, "--warmup", help="untimed training steps per cell first"),
         rounds: int = typer.Option(3, "--rounds", help="rounds (every cell timed once per round)"),
         memory_batch: int = typer.Option(64, "--memory-batch", help="inputs of the synthetic memory batch"),
         memory_length: int = typer.Option(64, "--memory-length", help="tokens per input of the memory batch"),
         inference: bool = typer.Option(True, "--inference/--no-inference", help="time a pass over the test split"),
         threads: int = typer.Option(1, "--threads", help="intra-op threads (1: steadier figures)"),
         measure: list[str] = typer.Option(None, "--measure-set", help="override for the measurement only, e.g. "
                                           "train.eval_batch_size=128 (repeatable)")):
    """Measure what each cell of a grid costs, side by side on this machine: parameters without embeddings, training
    time per epoch, inference time on the test split, peak memory of a training step (MTSA Table 1's columns).
    Writes <out>/cost.json, which `maskattn grid table` shows beside the accuracies. Trains no run: define the grid
    with the options of `grid run` (or give --out of an existing grid alone)."""
    import torch

    from ..train.cost import cost_table, measure_costs

    console = Console()
    with user_errors(), interrupt_exits():
        grid = _grid(out, config, preset, data, overrides, variants, variants_file, seeds)
        if threads < 1:
            raise ArgumentError(f"--threads must be an int >= 1, got {threads}")
        torch.set_num_threads(threads)
        grid.folder.mkdir(parents=True, exist_ok=True)
        grid.save()
        report = measure_costs(grid, steps=steps, warmup=warmup, rounds=rounds, memory_batch=memory_batch,
                               memory_length=memory_length, inference=inference, extra=list(measure or []),
                               say=lambda line: console.print(escape(line), highlight=False, soft_wrap=True))
    print(cost_table(report))


@grid_app.command("table")
def table(
    folders: list[Path] = typer.Argument(..., help="grid folders, or any folders holding run folders"),
    metric: str = typer.Option(None, "--metric", help="the test metric shown, or several separated by commas "
                               "(rouge1,rouge2,rougeL); default: the runs' train.metric"),
):
    """Print the Markdown table of the finished runs under FOLDERS: one row per cell (runs that differ only in
    train.seed / data.fold), the test metric of each run, mean ± sample std, best dev metric, epochs, training
    examples/s (target tokens/s for seq2seq), wall time per run and parameters without embeddings (and, after
    `maskattn grid cost`, time per epoch, inference time and peak memory). Runs of different presets or data are
    refused."""
    from ..train.grid_table import collect_runs, markdown_table

    with user_errors():
        records, unfinished = collect_runs(folders)
        text = markdown_table(records, metric=metric)
    print(text)
    if unfinished:
        Console(stderr=True).print(f"{len(unfinished)} run folder(s) have not finished and are not in the table: "
                                   f"{escape(', '.join(str(f) for f in unfinished[:5]))}"
                                   f"{', …' if len(unfinished) > 5 else ''}", highlight=False, soft_wrap=True)
