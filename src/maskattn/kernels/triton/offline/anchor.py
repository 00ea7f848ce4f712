"""The anchor the offline tools compile beside maskattn's kernels: ``benchmarks/anchor_attention.py`` of the
repository (FlashAttention-2's forward and two-pass backward, written here), or the file ``MASKATTN_ANCHOR`` names."""

from __future__ import annotations

import os
import pathlib
import sys

__all__ = ["load"]


def load():
    """``benchmarks/anchor_attention.py`` (imported from the repository's ``benchmarks`` folder)."""
    import importlib.util
    if "anchor_attention" in sys.modules:
        return sys.modules["anchor_attention"]
    root = pathlib.Path(__file__).resolve().parents[5]  # the repository: src/maskattn/kernels/triton/offline/…
    path = os.environ.get("MASKATTN_ANCHOR", os.path.join(root, "benchmarks", "anchor_attention.py"))
    spec = importlib.util.spec_from_file_location("anchor_attention", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"the anchor kernel is not at {path} (set MASKATTN_ANCHOR)")
    module = importlib.util.module_from_spec(spec)
    sys.modules["anchor_attention"] = module
    spec.loader.exec_module(module)
    return module
