"""Throughput on a shared machine (issue 23, item 5): OpenMP threads spin only briefly before they sleep unless
the user says otherwise, and the benchmark's "% of matmul" is a fraction of the machine's dense matmul rate,
printed only where it means something."""

from __future__ import annotations

import os
import subprocess
import sys

from typer.testing import CliRunner

from maskattn.bench import runner
from maskattn.bench.report import _percent
from maskattn.cli import app


def _openmp_env(**env: str) -> list[str]:
    """OMP_WAIT_POLICY and GOMP_SPINCOUNT as a fresh process sees them after ``import maskattn`` (neither set
    beforehand unless ``env`` sets it)."""
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    code = "import os, maskattn, torch; print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**clean, **env},
                          timeout=300, check=True)
    return done.stdout.split()


def test_importing_maskattn_keeps_openmp_threads_from_spinning():
    # libgomp's default spin (300,000) ran `maskattn train --preset trec` at 74-85 examples/s beside a busy process
    assert _openmp_env() == ["None", "1000"]
    assert _openmp_env(OMP_WAIT_POLICY="ACTIVE") == ["ACTIVE", "None"]  # the user's choice wins
    assert _openmp_env(GOMP_SPINCOUNT="50000") == ["None", "50000"]


def test_the_matmul_reference_is_one_square_matmul_per_device(tmp_path, monkeypatch):
    calls = []

    def fake_rate(matrices, n, d, *, dtype, device, repeats=5):
        calls.append((matrices, n, d, device))
        return 1000.0

    monkeypatch.setattr(runner, "matmul_gflops_per_s", fake_rate)
    result = CliRunner().invoke(app, ["bench", "--batch", "2", "--width", "8", "--heads", "2", "--warmup", "0",
                                      "--device", "cpu", "--repeats", "1", "--lengths", "8,16", "--mechanisms", "mha",
                                      "--backends", "sdpa", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    # was: one (B·H, n, d_h) bmm per length, whose overhead-bound rate made modules look 65x faster than matmul
    assert calls == [(1, runner.REFERENCE_MATMUL["cpu"], runner.REFERENCE_MATMUL["cpu"], "cpu")]


def test_a_fraction_above_the_matmul_rate_is_not_printed():
    assert _percent(0.42) == "42.0"
    assert _percent(65.07) == "–" and _percent(None) == "–"
