"""``maskattn list`` and ``maskattn demo``."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .app import app


@app.command()
def demo(steps: int = typer.Option(300, min=1, help="training steps of the order task")):
    """Build MTSA, check every backend against the float64 reference, and train it on an order task."""
    from ..demo import run_demo

    run_demo(steps=steps)


@app.command("list")
def list_mechanisms(
    backends: bool = typer.Option(False, "--backends", help="print the backend registry: each kernel family's "
                                                           "backends, what backend='auto' runs in each situation, "
                                                           "and what each backend cannot run"),
):
    """List the registered attention mechanisms, the models and context-fusion baselines, and the presets."""
    from .. import attention_info, backend_limits_table, backend_table, backend_table_rows, list_attentions
    from ..models import list_fusions, list_models
    from ..train.config import PRESETS_DIR, list_presets

    console = Console()
    if backends:
        print(backend_table())
        print()
        for row in backend_table_rows():
            print(f"{row['family']}: {row['why']}")
        print()
        print(backend_limits_table())
        return
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
                  + "; anything else is a layer recipe, e.g. 'mtsa', 'csan2d x3, mha x3', 'dman>san>ffn x6'",
                  soft_wrap=True)
    console.print(f"presets ({PRESETS_DIR}): " + (", ".join(list_presets()) or "(none found)"), soft_wrap=True)
