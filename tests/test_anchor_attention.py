"""The offline report's anchor (``benchmarks/anchor_attention.py``: FlashAttention-2's forward and two-pass
backward) against float64 softmax attention — under Triton's CPU interpreter here, the compiled kernels on a CUDA
machine (tests/_triton_device.py). Its per-score counts are only worth comparing if it computes attention: whole
tiles (``EVEN``, unmasked loads) and ragged ones, with and without the causal mask, output and every gradient."""

import math

import pytest
import torch

from _triton_device import DEVICE, needs_kernels
from maskattn.kernels.triton.offline import anchor as anchor_source

pytestmark = needs_kernels


def _reference(q, k, v, causal):
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[-2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n, d, even", [(32, 16, True), (37, 24, False)])
def test_the_anchor_computes_softmax_attention_and_its_gradients(n, d, even, causal):
    anchor = anchor_source.load()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, d, generator=g, dtype=torch.float64).to(DEVICE).requires_grad_() for _ in "qkv")
    assert anchor._constants("anchor_fwd", q, causal)["EVEN"] is even
    grad = torch.randn(2, 3, n, d, generator=g, dtype=torch.float64).to(DEVICE)
    out = anchor.attention(q.float(), k.float(), v.float(), causal)
    got = torch.autograd.grad(out, (q, k, v), grad.float())
    want_out = _reference(q, k, v, causal)
    want = torch.autograd.grad(want_out, (q, k, v), grad)
    torch.testing.assert_close(out.double(), want_out, atol=2e-5, rtol=2e-5)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, atol=5e-5, rtol=5e-5)
