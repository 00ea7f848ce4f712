"""``maskattn demo``: build MTSA, check every backend against the float64 reference on generated data,
then run the embedded default job of ``maskattn train`` on a small order task that attention without
positions cannot solve.

The task (:class:`maskattn.data.OrderTask`, also the embedded default of ``maskattn train``): a sequence of
random tokens holds two marker tokens ``A`` and ``B``; the label says whether ``A`` comes before ``B``.
Without positional encodings plain multi-head attention is permutation invariant and stays at chance;
MTSA's forward/backward head masks encode order.
"""

from __future__ import annotations

import tempfile

import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .attention import MTSA
from .functional import tensorized_attention, tensorized_attention_reference
from .train.default_job import run_default_job

__all__ = ["run_demo"]


def run_demo(steps: int = 300, console: Console | None = None) -> dict[str, dict]:
    """Print the backend check; return the default job's run summaries, keyed "mtsa" and "mha"."""
    console = console or Console()
    torch.manual_seed(0)
    model = MTSA(64, 4)
    n_params = sum(p.numel() for p in model.parameters())
    console.print(f"[bold]maskattn demo[/bold]: MTSA(d_model=64, num_heads=4) — {n_params:,} parameters, "
                  f"heads: {escape(model.mask.name)}")

    x = torch.randn(8, 40, 64)
    pad = torch.arange(40)[None, :] >= torch.randint(10, 41, (8,))[:, None]
    with torch.no_grad():
        q, k, v, s2t = model.project(x)
        expected = tensorized_attention_reference(q, k, v, s2t, model.mask, key_padding_mask=pad)
        table = Table(title="tensorized attention on generated data (8 × 40 tokens, padded) vs float64 reference")
        table.add_column("backend")
        table.add_column("max |error|", justify="right")
        for backend in ("sdpa", "flex", "reference"):
            out = tensorized_attention(q, k, v, s2t, model.mask, backend=backend, key_padding_mask=pad)
            table.add_row(backend, f"{(out.double() - expected).abs().max().item():.2e}")
        extreme = tensorized_attention(q, k, v, s2t * 1e4, model.mask, key_padding_mask=pad)
        table.add_row("sdpa, source2token scores × 1e4", "finite" if torch.isfinite(extreme).all() else "NOT FINITE")
    console.print(table)

    # the training half is the toolkit's own embedded default job (`maskattn train`), into a scratch folder
    with tempfile.TemporaryDirectory() as scratch:
        return run_default_job(scratch, max_steps=steps, progress=False, console=console)
