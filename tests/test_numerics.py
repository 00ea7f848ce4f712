"""Finite input gives finite output and gradients on every path (docs/design.md §3), empty input gives empty
output, and nothing flows back from padded positions — property tests over the registry × backends."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import maskattn
from maskattn.functional import (banded_attention, dot_product_attention, dynamic_mask_attention, local_attention,
                                 mask_attention, tensorized_attention)
from maskattn import masks as M

D_MODEL = 16
TRAINABLE = [(name, backend) for name in maskattn.list_attentions()
             for backend in maskattn.attention_info(name).backends if backend != "flex"]  # flex: no CPU backward
#: options a mechanism needs for a backend to apply (the tensorized band kernel runs window heads, no dropout)
OPTIONS = {("tensorized", "banded"): {"head_masks": ["window:2"] * 4}}


def build(name, backend, dropout, **extra):
    info = maskattn.attention_info(name)
    options = dict(OPTIONS.get((info.family, backend), {}), **extra)
    if (info.family, backend) == ("tensorized", "banded"):
        dropout = 0.0  # MTSA's band kernel does not apply Appendix A.3's dropout (refused, tested elsewhere)
    return maskattn.create_attention(name, D_MODEL, 2 if name == "disa" else 4, backend=backend, dropout=dropout,
                                     **options)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(TRAINABLE), batch=st.integers(1, 3), length=st.integers(1, 13),
       padded=st.integers(0, 12), junk=st.sampled_from([1.0, 1e3]), scale=st.sampled_from([1.0, 100.0]),
       dropout=st.sampled_from([0.0, 0.3]), dtype=st.sampled_from(["float32", "bfloat16"]),
       seed=st.integers(0, 2**16))
def test_finite_in_finite_out_and_no_gradient_from_padding(case, batch, length, padded, junk, scale, dropout, dtype,
                                                           seed):
    """Inputs ×100, junk ×1e3 at padded positions, dropout, float32 or CPU bfloat16 autocast: the output and every
    gradient are finite, padded outputs are 0, and padded inputs receive exactly no gradient."""
    name, backend = case
    torch.manual_seed(seed)
    module = build(name, backend, dropout).train()
    x = torch.randn(batch, length, D_MODEL) * scale
    kpm = torch.arange(length)[None, :] >= torch.randint(max(1, length - padded), length + 1, (batch, 1))
    x = torch.where(kpm[..., None], x * junk, x).requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
        out = module(x, kpm)
    out.backward(torch.randn_like(out))
    assert torch.isfinite(out).all()
    assert (out[kpm] == 0).all()
    assert torch.isfinite(x.grad).all() and (x.grad[kpm] == 0).all()
    for pname, p in module.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), pname
        assert p.dtype == torch.float32, pname  # parameters stay float32 under autocast


@pytest.mark.parametrize("scale", ["log_sigmoid", "identity"])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_tensorized_padded_key_far_above_the_others_gets_zero_finite_gradient(scale, dropout):
    """Issue: a padded key's source2token score ~100 above the real keys' maximum gave NaN gradients (0 · inf)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 4, requires_grad=True) for _ in range(3))
    s2t = torch.randn(1, 2, 6, 4)
    s2t[:, :, 4:] += 500.0  # padded keys, far above
    s2t.requires_grad_()
    kpm = torch.tensor([[False] * 4 + [True] * 2])
    out = tensorized_attention(q, k, v, s2t, M.per_head([M.forward_mask(), M.backward_mask()]), scale=scale,
                               key_padding_mask=kpm, dropout_p=dropout, training=True)
    out.backward(torch.randn_like(out))
    for t in (q, k, v, s2t):
        assert torch.isfinite(t.grad).all()
    assert (s2t.grad[:, :, 4:] == 0).all() and (v.grad[:, :, 4:] == 0).all()


# --------------------------------------------------------------------------------------------------------- empty


@pytest.mark.parametrize("name", maskattn.list_attentions())
@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (0, 0)])
def test_empty_in_empty_out(name, shape):
    module = build(name, "auto", 0.0)
    x = torch.randn(*shape, D_MODEL, requires_grad=True)
    out = module(x, torch.zeros(shape, dtype=torch.bool))
    assert out.shape == x.shape
    out.sum().backward()
    assert x.grad.shape == x.shape
    assert module.attention_maps(x.detach()).attention.shape[0] == shape[0]


def _functional_calls(B, n):
    q, k, v = (torch.randn(B, 4, n, 8, requires_grad=True) for _ in range(3))
    s2t = torch.randn(B, 4, n, 8)
    a, table, u = torch.randn(B, n), torch.zeros(7), torch.zeros(4)
    return (q, k, v), [
        ("dot_product_attention", lambda: dot_product_attention(q, k, v, M.causal())),
        ("mask_attention", lambda: mask_attention(q, k, v, torch.rand(B, 4, n, n))),
        ("dynamic_mask_attention", lambda: dynamic_mask_attention(q, k, v, a, table, u)),
        ("local_attention", lambda: local_attention(q, k, v, window=3, head_window=3)),
        ("banded_attention", lambda: banded_attention(q, k, v, 2)),
        ("tensorized_attention", lambda: tensorized_attention(q, k, v, s2t, M.forward_mask())),
    ]


@pytest.mark.parametrize("B, n", [(0, 5), (2, 0)])
def test_functional_empty_in_empty_out(B, n):
    inputs, calls = _functional_calls(B, n)
    for name, call in calls:
        out = call()
        assert out.shape == (B, 4, n, 8), name
        out.sum().backward()
        for t in inputs:
            assert t.grad is not None and t.grad.shape == t.shape, name
            t.grad = None


def _triton_calls():
    """(name, call(q, k, v, backend)) for each functional entry point with a Triton kernel."""
    from maskattn.functional import dynamic_mask_attention, local_attention

    def mtsa(q, k, v, backend):
        s2t = torch.linspace(-2, 2, v.numel()).view_as(v)
        return tensorized_attention(q, k, v, s2t, M.per_head([M.forward_mask(), M.backward_mask(), M.window(2), M.full()]),
                                    backend=backend)

    def dman(q, k, v, backend):
        a, table, u = torch.zeros(q.shape[0], q.shape[2]), torch.linspace(-1, 1, 7), torch.zeros(q.shape[1])
        return dynamic_mask_attention(q, k, v, a, table, u, causal=True, backend=backend)

    def csan2d(q, k, v, backend):
        return local_attention(q, k, v, window=3, head_window=3, backend=backend)

    return [("mtsa", mtsa), ("dman", dman), ("csan2d", csan2d)]


@pytest.mark.parametrize("name, call", _triton_calls(), ids=lambda c: c if isinstance(c, str) else "")
@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
def test_triton_adds_no_non_finite_output_to_the_reference(name, call, poison):
    """A non-finite key or value: the Triton kernel's output is non-finite only where the reference's is (the rows
    that attend to it; the reference, which multiplies every value by its — possibly zero — weight, has more) and
    equal wherever the reference is finite: no new NaN from the kernel."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 4, 20, 8) for _ in range(3))
    k[0, 1, 7, 3] = poison
    v[0, 2, 12, 0] = poison
    with torch.no_grad():
        fused, reference = call(q, k, v, "triton"), call(q, k, v, "reference")
    finite = torch.isfinite(reference)
    assert finite.any() and not finite.all()
    assert torch.isfinite(fused[finite]).all()  # nothing non-finite where the reference is finite
    assert not torch.isfinite(fused).all()  # and the poisoned key / value does reach the rows that attend to it
    torch.testing.assert_close(fused[finite], reference[finite], atol=1e-5, rtol=1e-5)
