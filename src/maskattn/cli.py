"""The ``maskattn`` command line: ``train``, ``eval``, ``predict``, ``list``, ``demo``.

``maskattn train`` with no arguments runs the embedded default job (the synthetic order task, MTSA vs
multi-head attention). Multi-process data-parallel training: ``torchrun --nproc_per_node N -m maskattn.cli
train --config …``.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

app = typer.Typer(help="maskattn: mask-based self-attention (MTSA, MAN, CSAN) for PyTorch.", no_args_is_help=True,
                  add_completion=False)


def _fail(exc: Exception) -> None:
    Console(stderr=True).print(f"[red]error:[/red] {exc}", markup=True, highlight=False)
    raise typer.Exit(code=2)


def _sigterm_as_interrupt() -> None:
    """SIGTERM (kill) stops training like Ctrl-C: checkpoints already written stay intact."""
    def handler(signum, frame):
        raise KeyboardInterrupt
    if sys.platform != "win32":
        signal.signal(signal.SIGTERM, handler)


@app.command()
def train(
    config: Path = typer.Option(None, "--config", "-c", help="YAML run configuration (sections data, model, optim, train)"),
    preset: str = typer.Option(None, "--preset", "-p", help="a preset shipped with maskattn (see `maskattn list`)"),
    data: Path = typer.Option(None, "--data", help="dataset folder (sets data.dir)"),
    out: Path = typer.Option(None, "--out", "-o", help="run folder for checkpoints and metrics (train.out_dir)"),
    seed: int = typer.Option(None, "--seed", help="train.seed"),
    max_steps: int = typer.Option(None, "--max-steps", help="train.max_steps"),
    device: str = typer.Option(None, "--device", help="train.device: auto, cpu, cuda"),
    resume: Path = typer.Option(None, "--resume", help="continue the run of this last.safetensors checkpoint"),
    overrides: list[str] = typer.Option(None, "--set", "-s", help="override: section.key=value (repeatable)"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="show the progress bar"),
):
    """Train a model. With no arguments: the embedded default job (order task, MTSA vs multi-head)."""
    from .train import api, default_job
    from .train.config import apply_overrides, load_config, preset_path

    flags = [f"{key}={value}" for key, value in (("data.dir", data), ("train.out_dir", out), ("train.seed", seed),
                                                  ("train.max_steps", max_steps), ("train.device", device))
             if value is not None] + list(overrides or [])
    _sigterm_as_interrupt()
    try:
        if resume is not None:
            if config or preset or data:
                raise ValueError("--resume continues a run with its own configuration; drop --config/--preset/--data "
                                 "(train.* settings may be overridden)")
            extra = apply_overrides({}, flags)
            if set(extra) - {"train"}:
                raise ValueError(f"with --resume only train.* settings may change, got sections {sorted(extra)}")
            summary = api.resume(resume, train_overrides={**extra.get("train", {}),
                                                          **({} if progress else {"progress": False})})
        elif config is None and preset is None and data is None and not overrides and seed is None and device is None:
            default_job.run_default_job(str(out or "runs/default"), max_steps=max_steps, progress=progress)
            return
        else:
            if config and preset:
                raise ValueError("give either --config or --preset, not both")
            path = config or (preset_path(preset) if preset else None)
            summary = api.train(load_config(path, flags + ([] if progress else ["train.progress=false"])))
    except KeyboardInterrupt:
        raise typer.Exit(code=130) from None
    except (ValueError, TypeError, FloatingPointError) as exc:
        _fail(exc)
    Console().print_json(json.dumps(summary))


@app.command("eval")
def eval_(
    checkpoint: Path = typer.Option(..., "--checkpoint", "-k", help="a .safetensors checkpoint"),
    data: Path = typer.Option(..., "--data", help="labelled file to evaluate on"),
    format: str = typer.Option(None, "--format", help="tsv, trec, trec_fine, nli, conll (default: the checkpoint's)"),
    device: str = typer.Option("cpu", "--device"),
):
    """Evaluate a checkpoint on a labelled file; prints the metrics as JSON."""
    from .train.api import evaluate_file

    try:
        metrics = evaluate_file(checkpoint, data, format=format, device=device)
    except (ValueError, TypeError) as exc:
        _fail(exc)
    Console().print_json(json.dumps(metrics))


@app.command()
def predict(
    checkpoint: Path = typer.Option(..., "--checkpoint", "-k", help="a .safetensors checkpoint"),
    texts: list[str] = typer.Argument(None, help="sentences (pair models: 'premise ||| hypothesis')"),
    input: Path = typer.Option(None, "--input", "-i", help="file with one sentence per line"),
    device: str = typer.Option("cpu", "--device"),
):
    """Predict labels for sentences: one line per input, the label (tags for a tagger)."""
    from .train.api import predict as run_predict

    try:
        lines = list(texts or [])
        if input is not None:
            if not input.is_file():
                raise ValueError(f"--input file {input} does not exist")
            lines += [line for line in input.read_text(encoding="utf-8").splitlines() if line.strip()]
        if not lines:
            raise ValueError("no input: pass sentences as arguments or --input FILE")
        labels = run_predict(checkpoint, lines, device=device)
    except (ValueError, TypeError) as exc:
        _fail(exc)
    for label in labels:
        typer.echo(" ".join(label) if isinstance(label, list) else label)


@app.command()
def demo(steps: int = typer.Option(300, min=1, help="training steps of the order task")):
    """Build MTSA, check every backend against the float64 reference, and train it on an order task."""
    from .demo import run_demo

    run_demo(steps=steps)


@app.command("list")
def list_mechanisms():
    """List the registered attention mechanisms, the models and context-fusion baselines, and the presets."""
    from . import attention_info, list_attentions
    from .models import list_fusions, list_models
    from .train.config import PRESETS_DIR, list_presets

    console = Console()
    table = Table(title="attention mechanisms (recipe names; also 'san' = mha, 'ffn')")
    for column in ("name", "class", "backends", "description"):
        table.add_column(column)
    for name in list_attentions():
        info = attention_info(name)
        table.add_row(name, info.cls.__name__, ", ".join(info.backends), escape(info.description))
    console.print(table)
    table = Table(title="models (model.type)")
    table.add_column("type")
    table.add_column("description")
    for name, description in list_models().items():
        table.add_row(name, escape(description))
    console.print(table)
    console.print("context-fusion baselines (model.encoder): " + ", ".join(list_fusions())
                  + "; anything else is a layer recipe, e.g. 'mtsa', 'csan2d x3, mha x3', 'dman>san>ffn x6'")
    console.print(f"presets ({PRESETS_DIR}): " + (", ".join(list_presets()) or "(none found)"))


if __name__ == "__main__":  # pragma: no cover
    app()
