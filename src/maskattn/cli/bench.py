"""``maskattn bench``."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from ..errors import REMOVED_IN, ArgumentError
from ..files import check_output_folder, check_outputs
from .app import app, user_errors, warn


@app.command()
def bench(
    quick: bool = typer.Option(False, "--quick", help="the quick suite: lengths 32,64,128,256, batch 4, width 64, 4 "
                                                      "heads, 2 repeats (under a minute on 2 CPU cores); other options "
                                                      "override it"),
    suite: str = typer.Option(None, "--suite", "-s", help="named settings behind the docs' tables: quick, mtsa "
                                                          "(MTSA Fig. 1), man (DMAN vs SAN), csan (banded vs dense), "
                                                          "gpu (the GPU acceptance run); other options override it"),
    preset: str = typer.Option(None, "--preset", "-p", hidden=True, help="old name of --suite (until 0.3)"),
    mode: str = typer.Option(None, "--mode", help="train (forward + backward, default) or inference (forward, no_grad)"),
    compiled: bool = typer.Option(None, "--compile/--eager", help="run the modules through torch.compile(fullgraph=True) "
                                                                 "(compilation happens in the untimed warm-up)"),
    lengths: str = typer.Option(None, "--lengths", "-n", help="comma-separated sequence lengths (default 64,128,256,512,1024)"),
    batch: int = typer.Option(None, "--batch", "-b", help="batch size (default 8)"),
    width: int = typer.Option(None, "--width", "-d", help="d_model (default 256)"),
    heads: int = typer.Option(None, "--heads", help="attention heads (default 4)"),
    dtype: str = typer.Option(None, "--dtype", help="float32, float64 or bfloat16 (default float32)"),
    mechanisms: str = typer.Option(None, "--mechanisms", "-m",
                                   help="comma-separated registered mechanisms and baselines (torch_mha, bilstm, "
                                        "multi_cnn, mtsa_algorithm1; default all)"),
    backends: str = typer.Option(None, "--backends",
                                 help="comma-separated backends of the registered mechanisms (default: all that "
                                      "can train on the device)"),
    repeats: int = typer.Option(None, "--repeats", "-r", help="timed forward and backward runs per point (default 5)"),
    warmup: int = typer.Option(None, "--warmup", help="untimed training steps per point first (default 1)"),
    device: str = typer.Option(None, "--device", help="auto (CUDA when present, else the CPU), cpu, cuda, or all (the "
                                                      "CPU, plus CUDA when present); default auto"),
    mem_budget_gb: float = typer.Option(None, "--mem-budget-gb",
                                        help="skip points estimated above this many GiB (default: half the available memory)"),
    out: Path = typer.Option(Path("bench-out"), "--out", "-o", help="folder for bench.csv, bench.json, bench.png"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace the bench.csv, bench.json and bench.png "
                                   "that --out holds"),
):
    """Time (forward and backward separately) and peak memory of every mechanism × backend and the baselines
    against sequence length, with FLOPs and the fraction of this machine's matmul rate (docs/bench.md).
    Exit code 1 when a point failed with an error (outputs are still written), 2 for invalid options."""
    from ..bench import (BenchSettings, output_folder, parse_lengths, parse_names, render_tables, run_benchmark,
                        write_csv, write_json, write_outputs)

    console = Console()
    if not console.is_terminal:  # a file or pipe has no width limit: keep the table's rows on one line each
        console = Console(width=160)
    with user_errors():
        given = {key: value for key, value in dict(batch=batch, width=width, heads=heads, dtype=dtype,
                                                   repeats=repeats, warmup=warmup, device=device,
                                                   mem_budget_gb=mem_budget_gb, mode=mode,
                                                   compile=compiled).items() if value is not None}
        if lengths is not None:
            given["lengths"] = parse_lengths(lengths)
        if mechanisms is not None:
            given["mechanisms"] = parse_names(mechanisms, "mechanisms")
        if backends is not None:
            given["backends"] = parse_names(backends, "backends")
        if preset is not None:
            if suite is not None:
                raise ArgumentError("--preset is the old name of --suite; give --suite only")
            warn("--preset is now --suite (a preset is a `maskattn train --preset` file); the old name will be "
                 f"removed in {REMOVED_IN}")
            suite = preset
        if quick and suite not in (None, "quick"):
            raise ArgumentError(f"give either --quick or --suite {suite}, not both")
        suite = "quick" if quick else suite
        settings = BenchSettings.suite(suite, **given) if suite else BenchSettings(**given)
        check_output_folder("--out", out)
        check_outputs({f"--out's {name}": out / name for name in ("bench.csv", "bench.json", "bench.png")},
                      overwrite=overwrite)
        folder = output_folder(out)  # a stopped run keeps the lengths it finished (bench.csv, bench.json)
        result = run_benchmark(settings, log=lambda line: console.print(escape(line), highlight=False),
                               on_length=lambda partial: (write_csv(partial, folder / "bench.csv"),
                                                          write_json(partial, folder / "bench.json")))
        paths = write_outputs(result, out)
    for table in render_tables(result):
        console.print(table)
    console.print(f"wrote {', '.join(str(p) for p in paths.values())} ({result.wall_s:.1f} s)", highlight=False)
    failed = [r for r in result.records if r["status"] == "failed"]
    if failed:
        Console(stderr=True).print(f"[red]error:[/red] {len(failed)} point(s) failed, e.g. {failed[0]['label']} "
                                   f"n={failed[0]['n']}: {escape(failed[0]['reason'])}", markup=True, highlight=False)
        raise typer.Exit(code=1)
