"""The ``maskattn`` command line."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(help="maskattn: mask-based self-attention (MTSA, MAN, CSAN) for PyTorch.", no_args_is_help=True,
                  add_completion=False)


@app.command()
def demo(steps: int = typer.Option(300, min=1, help="training steps of the order task")):
    """Build MTSA, check every backend against the float64 reference, and train it on an order task."""
    from .demo import run_demo

    run_demo(steps=steps)


@app.command("list")
def list_mechanisms():
    """List the registered attention mechanisms and their backends."""
    from . import attention_info, list_attentions

    table = Table(title="attention mechanisms")
    for column in ("name", "class", "backends", "description"):
        table.add_column(column)
    for name in list_attentions():
        info = attention_info(name)
        table.add_row(name, info.cls.__name__, ", ".join(info.backends), info.description)
    Console().print(table)


if __name__ == "__main__":  # pragma: no cover
    app()
