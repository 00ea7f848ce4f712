"""The narrow-band experiment (``benchmarks/diagonal_band.py``, docs/gpu/offline-perf.md "Narrow bands"): its two
FMA forward kernels compute band attention (float64 oracle, Triton's interpreter), and compiled for a GPU they
compute only the band's scores and none on the tensor cores (the premise of the comparison with the tiles)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from maskattn.kernels.triton import runtime

pytestmark = pytest.mark.skipif(not runtime.installed(), reason="needs triton")

PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "diagonal_band.py")


def _module():
    spec = importlib.util.spec_from_file_location("diagonal_band", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _reference(q, k, v, left, right):
    """``(out, lse in log₂ units)`` of band attention in float64, from CSAN Eq. 9's definition."""
    n = q.shape[-2]
    offset = torch.arange(n)[None, :] - torch.arange(n)[:, None]
    scores = q.double() @ k.double().transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill((offset < -left) | (offset > right), float("-inf"))
    return torch.softmax(scores, -1) @ v.double(), torch.logsumexp(scores, -1) / math.log(2)


@pytest.mark.parametrize("scheme", ["online", "exact"])
@pytest.mark.parametrize("n, left, right", [(37, 5, 5), (16, 3, 3), (23, 0, 6), (9, 4, 0)])
def test_diagonal_kernels_match_the_float64_band_attention(scheme, n, left, right):
    """Both schemes, centred and one-sided bands, lengths that end inside a block and bands wider than the
    sequence: outputs and log-sum-exps equal the oracle's."""
    diagonal = _module()
    torch.manual_seed(n + left)
    q, k, v = (torch.randn(2, 3, n, 16) for _ in range(3))
    out, lse = diagonal.forward(q, k, v, left, right, scheme)
    ref_out, ref_lse = _reference(q, k, v, left, right)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)


def test_bad_shapes_and_bands_are_refused():
    diagonal = _module()
    q = torch.randn(1, 1, 8, 16)
    with pytest.raises(ValueError, match="power of two"):
        diagonal.forward(torch.randn(1, 1, 8, 24), torch.randn(1, 1, 8, 24), torch.randn(1, 1, 8, 24), 1, 1)
    with pytest.raises(ValueError, match="left and right"):
        diagonal.forward(q, q, q, -1, 1)
    with pytest.raises(ValueError, match="scheme"):
        diagonal.forward(q, q, q, 1, 1, "tiles")


_QUICK = f"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("diagonal_band", {PATH!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
json.dump([module.measure(s, 11, 64, 80, n=256) for s in module.SCHEMES], sys.stdout)
"""


@pytest.mark.slow  # two compilations in a fresh process: ~15 s idle
def test_compiled_diagonal_kernels_compute_only_band_scores_off_the_tensor_cores():
    """Compiled for sm_80 (d = 64, window 11, n = 256): every computed score is inside the band but at the sequence
    ends, no tensor-core instruction, no spill; the online scheme spends two ``exp2`` per score, the exact one one
    (and at least one per score: rows of a block can share no ``MUFU``)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    done = subprocess.run([sys.executable, "-c", _QUICK], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    online, exact = json.loads(done.stdout)
    for row in (online, exact):
        assert row["in_band"] > 0.97 and row["tensor_flops"] == 0 and row["spill_bytes"] == 0
        assert row["issue"] > 0 and row["registers"] > 0
    assert online["mufu"] > exact["mufu"] >= 1.0
