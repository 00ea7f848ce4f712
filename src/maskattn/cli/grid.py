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
    """The grid these options define in ``out``, or with none of them the grid already there — its runs' folders
    checked (:func:`~maskattn.grid.spec.check_run_folders`) either way, with a progress line on stderr every few
    seconds while a large grid is checked. Ctrl-C / SIGTERM meanwhile: a message that nothing was written, then
    ``KeyboardInterrupt`` again."""
    from ..grid.records import read_grid
    from ..grid.spec import check_run_folders, define_grid

    stderr = Console(stderr=True)
    items = ([f"data.dir={data}"] if data is not None else []) + list(overrides or [])
    try:
        if config is None and preset is None and not items and not variants and variants_file is None \
                and seeds is None:
            grid = read_grid(out)  # a damaged grid.json: one error line, not a traceback
            check_run_folders(grid)
            return grid
        return define_grid(out, preset=preset, config=config, overrides=items, variants=list(variants or []),
                           variants_file=variants_file, seeds=seeds,
                           say=lambda line: stderr.print(escape(line), highlight=False, soft_wrap=True))
    except KeyboardInterrupt:  # a console of its own: the interrupt may have cut a progress line's print short
        Console(stderr=True).print(f"[yellow]interrupted[/yellow] while the grid's runs were checked; nothing was "
                                   f"written in {escape(str(out))}", markup=True, highlight=False, soft_wrap=True)
        raise


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
        seeds: str = SEEDS, jobs: int = typer.Option(None, "--jobs", "-j", help="runs at a time (local: default 1; "
                                                    "slurm: the job array's parallelism, default no limit)"),
        threads: int = typer.Option(None, "--threads", help="intra-op threads per run (default: the CPUs / --jobs; "
                                    "slurm: --slurm-cpus-per-task, else 1)"),
        dry_run: bool = typer.Option(False, "--dry-run", help="check every run's configuration, list the runs, "
                                     "train none"),
        launcher: str = typer.Option("local", "--launcher", help="local: processes on this machine, until all end; "
                                     "slurm: one Slurm job per run (a job array), through submitit"),
        wait: bool = typer.Option(False, "--wait", help="slurm: stay until the jobs have ended and report each "
                                  "(default: return once submitted; see maskattn grid status)"),
        slurm_partition: str = typer.Option(None, "--slurm-partition", help="slurm: the partition (sbatch -p)"),
        slurm_time: str = typer.Option(None, "--slurm-time", help="slurm: each job's time limit, in Slurm's spelling "
                                       "(60, 4:00:00, 1-12); a run that reaches it is requeued and continues"),
        slurm_cpus_per_task: int = typer.Option(None, "--slurm-cpus-per-task", help="slurm: CPUs per job (default: "
                                                "--threads, else 1)"),
        slurm_mem: str = typer.Option(None, "--slurm-mem", help="slurm: memory per job (16G)"),
        slurm_gpus_per_task: int = typer.Option(None, "--slurm-gpus-per-task", help="slurm: GPUs per job; N > 1 "
                                                "trains each run with torchrun over N processes (DDP)"),
        slurm_nodes: int = typer.Option(None, "--slurm-nodes", help="slurm: nodes per job; N > 1 trains each run "
                                        "data-parallel over the tasks of N nodes (one job per run)"),
        slurm_tasks_per_node: int = typer.Option(None, "--slurm-tasks-per-node", help="slurm: processes per node "
                                                 "of a job (default: --slurm-gpus-per-node, else 1)"),
        slurm_gpus_per_node: int = typer.Option(None, "--slurm-gpus-per-node", help="slurm: GPUs per node of a job, "
                                                "one process each (NCCL)"),
        slurm_account: str = typer.Option(None, "--slurm-account", help="slurm: the account charged (sbatch -A)"),
        slurm_qos: str = typer.Option(None, "--slurm-qos", help="slurm: the quality of service"),
        slurm_options: list[str] = typer.Option(None, "--slurm-option", help="slurm: any other sbatch option, "
                                                "key=value (constraint=a100, exclusive) (repeatable)"),
        slurm_signal_delay: int = typer.Option(None, "--slurm-signal-delay", help="slurm: seconds before the time "
                                               "limit that a job is told to stop and requeue (default: a twelfth of "
                                               "the limit, 5 to 90; at most (limit - 30 s) / 2: Slurm may warn up "
                                               "to 30 s early, from each start of a job)"),
        tensorboard: Path = typer.Option(None, "--tensorboard", help="TensorBoard event files of every run, each in "
                                         "DIR/<cell>/<seed> (tensorboard --logdir DIR shows the grid; kept for the "
                                         "grid's later runs)")):
    """Train a grid: every combination of the variants, the swept --set values and the seeds, each run in its own
    folder under --out, --jobs at a time. Run again to continue: finished runs are kept, interrupted ones resume;
    `maskattn grid run --out DIR` alone continues the grid in DIR. --launcher slurm submits the runs as Slurm jobs
    (docs/cluster.md); `maskattn grid status DIR` shows where each run is.

    Example: maskattn grid run --preset trec --data ../shared/data/trec --out runs/trec-grid
    --set model.encoder=mtsa,bilstm --seeds 0-4 --jobs 2 --threads 1"""
    from ..grid.launchers import LAUNCHERS
    from ..grid.launchers.slurm import SlurmOptions, parse_slurm_options
    from ..grid.scheduler import run_grid

    console = Console()
    sigterm_as_interrupt()
    with user_errors(), interrupt_exits():
        if launcher not in LAUNCHERS:
            raise ArgumentError(f"--launcher must be one of {', '.join(LAUNCHERS)}, got {launcher!r}")
        slurm = SlurmOptions(partition=slurm_partition, time=slurm_time, cpus_per_task=slurm_cpus_per_task,
                             mem=slurm_mem, gpus_per_task=slurm_gpus_per_task, account=slurm_account, qos=slurm_qos,
                             options=parse_slurm_options(slurm_options or []), signal_delay_s=slurm_signal_delay,
                             nodes=slurm_nodes, tasks_per_node=slurm_tasks_per_node, gpus_per_node=slurm_gpus_per_node)
        given = [name for name, value in (("--slurm-partition", slurm_partition), ("--slurm-time", slurm_time),
                                          ("--slurm-cpus-per-task", slurm_cpus_per_task), ("--slurm-mem", slurm_mem),
                                          ("--slurm-gpus-per-task", slurm_gpus_per_task),
                                          ("--slurm-nodes", slurm_nodes),
                                          ("--slurm-tasks-per-node", slurm_tasks_per_node),
                                          ("--slurm-gpus-per-node", slurm_gpus_per_node),
                                          ("--slurm-account", slurm_account), ("--slurm-qos", slurm_qos),
                                          ("--slurm-option", slurm_options), ("--wait", wait or None),
                                          ("--slurm-signal-delay", slurm_signal_delay)) if value]
        if launcher == "local" and given:
            raise ArgumentError(f"{', '.join(given)}: only with --launcher slurm")
        slurm.check()
        grid = _grid(out, config, preset, data, overrides, variants, variants_file, seeds)
        if tensorboard is not None:
            grid.tensorboard = str(tensorboard)
        if dry_run:
            plan = grid.plan()
            for grid_run, state, detail in plan:
                console.print(f"{escape(grid_run.name)}: {escape(' '.join(grid_run.overrides) or '(base settings)')}"
                              f" — {state}{escape(': ' + detail) if detail else ''}", highlight=False, soft_wrap=True)
            states = [state for _, state, _ in plan]
            console.print(f"{len(grid.runs)} runs; {states.count('new') + states.count('continue')} to train "
                          f"({states.count('new')} new, {states.count('continue')} to continue), "
                          f"{states.count('finished')} finished, {states.count('refused')} refused (another "
                          f"configuration in the folder); fixed settings: {escape(' '.join(grid.fixed) or 'none')}",
                          highlight=False, soft_wrap=True)
            return
        outcome = run_grid(grid, jobs=jobs, threads=threads, launcher=launcher, slurm=slurm, wait=wait,
                           say=lambda line: console.print(escape(line), highlight=False, soft_wrap=True))
    slurm_counts = (f"submitted to Slurm: {len(outcome['submitted'])}, queued or running in Slurm already: "
                    f"{len(outcome['queued'])}, " if launcher == "slurm" or outcome["queued"] else "")
    stopped = f"stopped: {len(outcome['stopped'])}, " if outcome["stopped"] else ""
    console.print(f"{slurm_counts}finished now: {len(outcome['finished'])}, earlier: {len(outcome['done'])}, held by "
                  f"another process: {len(outcome['busy'])}, failed: {len(outcome['failed'])}; {stopped}"
                  + (f"where each run is: maskattn grid status {escape(str(out))}" if outcome["submitted"] and not wait
                     else f"the table: maskattn grid table {escape(str(out))}"), highlight=False, soft_wrap=True)
    if outcome["failed"]:
        raise typer.Exit(code=1)


@grid_app.command("status")
def status(folder: Path = typer.Argument(..., help="the grid folder (--out of grid run)"),
           lines: int = typer.Option(3, "--lines", help="log lines shown of a failed run")):
    """Where each run of a grid is — finished, running, queued (its Slurm job), failed (the last lines of its log),
    stopped (interrupted: the next grid run continues it) or not started —, and the counts. Works for both
    launchers."""
    from ..grid.spec import load_grid
    from ..grid.status import STATES, run_status

    console = Console()
    with user_errors():
        grid = load_grid(folder)
        if lines < 1:
            raise ArgumentError(f"--lines must be an int >= 1, got {lines}")
        statuses = run_status(grid, lines=lines)
    for item in statuses:
        nodes = "" if not item.nodes else f" {item.nodes}" if item.nodes.startswith("on ") else f", {item.nodes}"
        where = f" (Slurm job {item.job}{nodes})" if item.job and not item.job.startswith("pid ") else (
            f" ({item.job})" if item.job and item.state == "running" else "")
        detail = item.detail
        text = f"{item.name}: {item.state}{where}" + (f": {detail[0]}" if len(detail) == 1 else "")
        console.print(escape(text), highlight=False, soft_wrap=True)
        if len(detail) > 1:
            for line in detail:
                console.print(escape(f"    {line}"), highlight=False, soft_wrap=True)
    counts = {state: sum(item.state == state for item in statuses) for state in STATES}
    console.print(escape(f"{len(statuses)} runs: " + ", ".join(f"{n} {state}" for state, n in counts.items())),
                  highlight=False, soft_wrap=True)


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

    from ..grid.cost import cost_table, measure_costs

    console = Console()
    sigterm_as_interrupt()
    with user_errors(), interrupt_exits(f"{out / 'cost.json'} was not written (an earlier one is unchanged)"):
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
    from ..grid.records import collect_runs
    from ..grid.table import markdown_table

    sigterm_as_interrupt()
    with user_errors(), interrupt_exits("no table printed"):
        records, unfinished = collect_runs(folders)
        text = markdown_table(records, metric=metric)
    print(text)
    if unfinished:
        Console(stderr=True).print(f"{len(unfinished)} run folder(s) have not finished and are not in the table: "
                                   f"{escape(', '.join(str(f) for f in unfinished[:5]))}"
                                   f"{', …' if len(unfinished) > 5 else ''}", highlight=False, soft_wrap=True)
