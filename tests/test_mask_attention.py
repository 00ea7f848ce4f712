"""Mask attention (MAN Eq. 4) and the DMAN kernel (Eq. 12): every backend against float64 oracles
written straight from the equations (explicit exp, multiply by M, normalise)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from maskattn import masks
from maskattn.functional import (
    dynamic_mask,
    dynamic_mask_attention,
    dynamic_mask_attention_reference,
    mask_attention,
    mask_attention_reference,
    mask_attention_weights,
    relative_distance_index,
)
from maskattn.kernels import dman as dman_kernel

BACKENDS = ("reference", "sdpa", "flex")
TOL = {torch.float32: dict(atol=2e-5, rtol=1e-4), torch.float64: dict(atol=1e-10, rtol=1e-9)}


def eq4_by_hand(q, k, v, m):
    """Eq. 4 for one (batch, head), float64, loops over rows: M_ij exp(q_i·k_j/√d) / Σ_l M_il exp(…)."""
    q, k, v, m = q.double(), k.double(), v.double(), m.double()
    out = torch.zeros(q.shape[0], v.shape[-1], dtype=torch.float64)
    for i in range(q.shape[0]):
        w = m[i] * torch.exp(k @ q[i] / math.sqrt(q.shape[-1]))
        if w.sum() > 0:
            out[i] = (w / w.sum()) @ v
    return out


def eq12_by_hand(a, table, u, t, s, h):
    """Eq. 12 for one entry: sigmoid(a_t + P[clip(t − s)] + U_h)."""
    D = (table.numel() - 1) // 2
    return torch.sigmoid(a[t] + table[max(-D, min(D, t - s)) + D] + u[h])


def qkv(B=2, H=3, n=6, m=None, d=4, dv=5, dtype=torch.float32, grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    m = n if m is None else m
    t = [torch.randn(B, H, n, d, generator=g, dtype=dtype), torch.randn(B, H, m, d, generator=g, dtype=dtype),
         torch.randn(B, H, m, dv, generator=g, dtype=dtype)]
    return [x.requires_grad_(grad) for x in t]


def dman_params(B=2, H=3, n=6, D=2, dtype=torch.float32, grad=False, seed=1):
    g = torch.Generator().manual_seed(seed)
    t = [torch.randn(B, n, generator=g, dtype=dtype), torch.randn(2 * D + 1, generator=g, dtype=dtype),
         torch.randn(H, generator=g, dtype=dtype)]
    return [x.requires_grad_(grad) for x in t]


def run(fn, backend, *args, **kwargs):
    if backend == "flex":  # CPU flex is inference only
        with torch.no_grad():
            return fn(*args, backend=backend, **kwargs)
    return fn(*args, backend=backend, **kwargs)


# --------------------------------------------------------------------------------------------------
# Eq. 4
# --------------------------------------------------------------------------------------------------

def test_float64_oracle_matches_a_loop_over_rows():
    q, k, v = qkv(dtype=torch.float64)
    m = torch.rand(2, 3, 6, 6, dtype=torch.float64)
    m[0, 1, 2] = 0.0  # an all-zero row returns 0
    ref = mask_attention_reference(q, k, v, m)
    for b in range(2):
        for h in range(3):
            torch.testing.assert_close(ref[b, h], eq4_by_hand(q[b, h], k[b, h], v[b, h], m[b, h]))
    assert ref[0, 1, 2].abs().max() == 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_mask_attention_matches_reference(backend, dtype):
    q, k, v = qkv(n=5, m=7, dtype=dtype)
    m = torch.rand(2, 1, 5, 7, dtype=dtype)  # broadcast over heads
    m[..., 3] = 0.0  # a key excluded everywhere
    m[1, 0, 4] = 0.0  # an empty row
    allowed = torch.rand(1, 3, 5, 7) > 0.2
    out = run(mask_attention, backend, q, k, v, m, attn_mask=allowed)
    ref = mask_attention_reference(q, k, v, m, attn_mask=allowed)
    torch.testing.assert_close(out.double(), ref, **TOL[dtype])
    assert out[1, :, 4].abs().max() == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_identity_mask_is_ffn_and_ones_mask_is_san(backend):
    """MAN Eq. 6–8: the all-ones mask is plain attention, the identity mask returns V exactly."""
    q, k, v = qkv(n=6, dtype=torch.float64)
    eye = torch.eye(6, dtype=torch.float64)
    out = run(mask_attention, backend, q, k, v, eye)
    assert torch.equal(out, v)
    ones = run(mask_attention, backend, q, k, v, torch.ones(6, 6, dtype=torch.float64))
    torch.testing.assert_close(ones, F.scaled_dot_product_attention(q, k, v).detach())
    torch.testing.assert_close(run(mask_attention, backend, q, k, v), ones)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mask_predicate_and_scaling_invariance(backend):
    q, k, v = qkv(n=8)
    win = masks.window(2)
    dense = win.materialize(8)
    torch.testing.assert_close(run(mask_attention, backend, q, k, v, attn_mask=win),
                               run(mask_attention, backend, q, k, v, attn_mask=dense))
    # a mask of 0/1 weights is a hard mask; a constant factor on a row cancels in the normalisation
    torch.testing.assert_close(run(mask_attention, backend, q, k, v, dense.float() * 0.5),
                               mask_attention_reference(q, k, v, attn_mask=dense).float(), **TOL[torch.float32])


def test_gradcheck_mask_attention():
    q, k, v = qkv(B=1, H=2, n=4, d=3, dv=2, dtype=torch.float64, grad=True)
    m = (0.1 + 0.8 * torch.rand(1, 2, 4, 4, dtype=torch.float64)).requires_grad_()
    for backend in ("reference", "sdpa"):
        assert torch.autograd.gradcheck(lambda *t, backend=backend: mask_attention(*t, backend=backend), (q, k, v, m),
                                        fast_mode=backend == "sdpa")


def test_sdpa_mask_weight_gradient_equals_reference():
    """On CPU, SDPA's fused path gives no bias gradient; mask_attention must still return the right one."""
    q, k, v = qkv(B=2, H=2, n=16, d=8, dv=8, grad=True)
    m = torch.rand(2, 2, 16, 16).clamp_min(0.05).requires_grad_()
    out = mask_attention(q, k, v, m, backend="sdpa")
    out.square().sum().backward()
    grads = [t.grad.clone() for t in (q, k, v, m)]
    for t in (q, k, v, m):
        t.grad = None
    mask_attention(q, k, v, m, backend="reference").square().sum().backward()
    for g, t in zip(grads, (q, k, v, m)):
        torch.testing.assert_close(g, t.grad, atol=1e-5, rtol=1e-4)


def test_fully_masked_rows_no_nan_in_forward_or_backward():
    q, k, v = qkv(grad=True)
    m = torch.zeros(2, 3, 6, 6)
    m[0] = 1.0  # batch 1: every weight 0
    for backend in ("reference", "sdpa"):
        out = mask_attention(q, k, v, m, backend=backend)
        out.sum().backward()
        assert torch.isfinite(out).all() and out[1].abs().max() == 0
        assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_mask_attention_weights_rows_sum_to_one_or_zero():
    q, k, _ = qkv()
    m = torch.rand(6, 6)
    m[2] = 0.0
    w = mask_attention_weights(q, k, m)
    sums = w.sum(-1)
    torch.testing.assert_close(sums[:, :, [0, 1, 3, 4, 5]], torch.ones(2, 3, 5))
    assert sums[:, :, 2].abs().max() == 0


@pytest.mark.parametrize("bad, exc, words", [
    (torch.full((6, 6), 1.5), ValueError, ["mask_weights", "[0, 1]", "1.5"]),
    (torch.full((6, 6), -0.1), ValueError, ["mask_weights", "[0, 1]"]),
    (torch.full((6, 6), float("nan")), ValueError, ["mask_weights", "NaN"]),
    (torch.ones(6, 6, dtype=torch.bool), TypeError, ["mask_weights", "torch.bool"]),
    (torch.ones(6, 6, dtype=torch.long), TypeError, ["mask_weights", "int64"]),
    (torch.ones(5, 6), ValueError, ["mask_weights", "(5, 6)", "does not broadcast"]),
    ([[1.0]], TypeError, ["mask_weights", "list"]),
])
def test_bad_mask_weights(bad, exc, words):
    q, k, v = qkv()
    with pytest.raises(exc) as err:
        mask_attention(q, k, v, bad)
    for w in words:
        assert w in str(err.value)


def test_bad_inputs_name_the_argument():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="k has shape"):
        mask_attention(q, k[..., :3], v)
    with pytest.raises(TypeError, match="attn_mask must have dtype torch.bool"):
        mask_attention(q, k, v, attn_mask=torch.ones(6, 6))
    with pytest.raises(ValueError, match="unknown backend"):
        mask_attention(q, k, v, backend="cuda")
    with pytest.raises(ValueError, match="backward only on CUDA"):
        mask_attention(q.requires_grad_(), k, v, backend="flex")


def test_static_window_mask_eq11():
    sm = masks.window(1).materialize(5)
    expected = torch.tensor([[abs(t - s) <= 1 for s in range(5)] for t in range(5)])
    assert torch.equal(sm[0, 0], expected)
    per_seq = masks.sequence_window(torch.tensor([0.0, 1.5])).materialize(4, batch=2)
    assert per_seq.shape == (2, 1, 4, 4)
    assert torch.equal(per_seq[0, 0], torch.eye(4, dtype=torch.bool))
    assert torch.equal(per_seq[1, 0], masks.window(1).materialize(4)[0, 0])


# --------------------------------------------------------------------------------------------------
# Eq. 12
# --------------------------------------------------------------------------------------------------

def test_relative_distance_index_clips_and_never_overflows():
    idx = relative_distance_index(6, 6, 2)
    assert idx.min() == 0 and idx.max() == 4
    assert idx[5, 0] == 4 and idx[0, 5] == 0 and idx[3, 3] == 2 and idx[3, 2] == 3
    long = relative_distance_index(1, 5000, 2, q_offset=4999)
    assert long.max() <= 4 and long.min() >= 0


def test_dynamic_mask_matches_eq12_entrywise():
    a, table, u = dman_params(B=2, H=3, n=6, D=2, dtype=torch.float64)
    kpm = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    m = dynamic_mask(a, table, u, key_padding_mask=kpm)
    mc = dynamic_mask(a, table, u, causal=True)
    for b in range(2):
        for h in range(3):
            for t in range(6):
                for s in range(6):
                    expected = eq12_by_hand(a[b], table, u, t, s, h)
                    assert torch.isclose(m[b, h, t, s], expected * (not kpm[b, s]))
                    assert torch.isclose(mc[b, h, t, s], expected * (s <= t))


@pytest.mark.parametrize("backend", BACKENDS + ("sdpa-fused",))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dman_backends_match_eq12_oracle(monkeypatch, backend, causal, dtype):
    if backend == "sdpa-fused":  # the per-chunk F.scaled_dot_product_attention forward, even at this size
        monkeypatch.setattr(dman_kernel, "SDPA_MIN_ELEMENTS", 0)
        backend = "sdpa"
    B, H, n = 2, 3, 9
    q, k, v = qkv(B, H, n, dtype=dtype)
    a, table, u = dman_params(B, H, n, D=3, dtype=dtype)
    kpm = torch.zeros(B, n, dtype=torch.bool)
    kpm[1, 6:] = True
    out = run(dynamic_mask_attention, backend, q, k, v, a, table, u, causal=causal, key_padding_mask=kpm)
    ref, probs, mask = dynamic_mask_attention_reference(q, k, v, a, table, u, causal=causal, key_padding_mask=kpm)
    torch.testing.assert_close(out.double(), ref, **TOL[dtype])
    # the oracle itself is Eq. 4 with M of Eq. 12
    torch.testing.assert_close(ref, mask_attention_reference(q, k, v, mask))


@pytest.mark.parametrize("chunk_min, sdpa_min", [(1, 1 << 15), (1 << 16, 0)])
def test_dman_sdpa_gradcheck_on_w_p_u(monkeypatch, chunk_min, sdpa_min):
    """The fused backward of the chunked kernel (several chunks when chunk_min=1) is exact; sdpa_min=0
    sends the forward through F.scaled_dot_product_attention even at this size."""
    monkeypatch.setattr(dman_kernel, "CHUNK_MIN_ELEMENTS", chunk_min)
    monkeypatch.setattr(dman_kernel, "SDPA_MIN_ELEMENTS", sdpa_min)
    B, H, n = 2, 2, 5
    q, k, v = qkv(B, H, n, d=3, dv=2, dtype=torch.float64, grad=True)
    a, table, u = dman_params(B, H, n, D=2, dtype=torch.float64, grad=True)
    kpm = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    for causal in (False, True):
        fn = lambda *t, causal=causal: dynamic_mask_attention(*t, causal=causal, key_padding_mask=kpm, backend="sdpa")  # noqa: E731
        assert torch.autograd.gradcheck(fn, (q, k, v, a, table, u), fast_mode=True)


@pytest.mark.parametrize("sdpa_min", [0, 1 << 15])
def test_dman_sdpa_gradients_equal_reference_float32(monkeypatch, sdpa_min):
    monkeypatch.setattr(dman_kernel, "CHUNK_MIN_ELEMENTS", 64)  # several chunks
    monkeypatch.setattr(dman_kernel, "SDPA_MIN_ELEMENTS", sdpa_min)
    B, H, n = 2, 4, 24
    q, k, v = qkv(B, H, n, d=8, dv=8, grad=True)
    params = dman_params(B, H, n, D=5, grad=True)
    kpm = torch.zeros(B, n, dtype=torch.bool)
    kpm[0, 20:] = True
    grads = {}
    for backend in ("sdpa", "reference"):
        inputs = (q, k, v, *params)
        out = dynamic_mask_attention(*inputs, causal=True, key_padding_mask=kpm, backend=backend)
        grads[backend] = torch.autograd.grad(out.sin().sum(), inputs)
    for g_fast, g_ref in zip(grads["sdpa"], grads["reference"]):
        torch.testing.assert_close(g_fast, g_ref, atol=2e-5, rtol=1e-4)



@pytest.mark.parametrize("chunk_min, D", [(900, 2), (900, 40), (300, 2), (300, 40), (1, 3)])
@pytest.mark.parametrize("causal", [False, True])
def test_dman_sdpa_tiles_equal_reference_float64(monkeypatch, chunk_min, D, causal):
    """Every tiling of the kernel — several heads per tile (900), query rows of one head (300, 1) — with the
    log M table narrower than the tile (D = 2, 3) or wider (D = 40), padding and a query offset."""
    monkeypatch.setattr(dman_kernel, "CHUNK_MIN_ELEMENTS", chunk_min)
    monkeypatch.setattr(dman_kernel, "CHUNK_FRACTION", 0.0)
    monkeypatch.setattr(dman_kernel, "SDPA_MIN_ELEMENTS", 0)
    B, H, n, m = 2, 3, 9, 12
    pairs, rows = dman_kernel._tile_plan(B * H, n, m, 4)
    assert (pairs, rows) == {900: (2, 9), 300: (1, 5), 1: (1, 1)}[chunk_min]
    q = torch.randn(B, H, n, 4, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(B, H, m, 4, dtype=torch.float64, requires_grad=True) for _ in range(2))
    params = dman_params(B, H, n, D=D, dtype=torch.float64, grad=True)
    kpm = torch.zeros(B, m, dtype=torch.bool)
    kpm[1, 8:] = True
    grads = {}
    for backend in ("sdpa", "reference"):
        inputs = (q, k, v, *params)
        out = dynamic_mask_attention(*inputs, causal=causal, key_padding_mask=kpm, q_offset=3, backend=backend)
        grads[backend] = (out, *torch.autograd.grad(out.sin().sum(), inputs))
    for fast, ref in zip(grads["sdpa"], grads["reference"]):
        torch.testing.assert_close(fast, ref, atol=1e-10, rtol=1e-9)

def test_dman_dropout_is_consistent_between_forward_and_backward():
    """With dropout the kernel regenerates the same keep-mask in backward: gradcheck under a fixed seed."""
    B, H, n = 1, 2, 4
    q, k, v = qkv(B, H, n, d=3, dv=2, dtype=torch.float64, grad=True)
    a, table, u = dman_params(B, H, n, D=1, dtype=torch.float64, grad=True)

    def fn(*t):
        torch.manual_seed(0)
        return dynamic_mask_attention(*t, backend="sdpa", dropout_p=0.3, training=True)

    assert torch.autograd.gradcheck(fn, (q, k, v, a, table, u))
    torch.manual_seed(0)
    dropped = dynamic_mask_attention(q, k, v, a, table, u, backend="sdpa", dropout_p=0.3, training=True)
    assert not torch.allclose(dropped, dynamic_mask_attention(q, k, v, a, table, u, backend="sdpa"))


def test_dman_q_offset_equals_slice_of_full():
    B, H, n = 2, 2, 7
    q, k, v = qkv(B, H, n)
    a, table, u = dman_params(B, H, n, D=2)
    full = dynamic_mask_attention(q, k, v, a, table, u, causal=True, backend="sdpa")
    for backend in BACKENDS:
        part = run(dynamic_mask_attention, backend, q[:, :, 4:], k, v, a[:, 4:], table, u, causal=True, q_offset=4)
        torch.testing.assert_close(part, full[:, :, 4:])


@pytest.mark.parametrize("backend", BACKENDS)
def test_dman_fully_padded_sequence_is_zero_and_finite(backend):
    q, k, v = qkv(grad=backend != "flex")
    a, table, u = dman_params(grad=backend != "flex")
    kpm = torch.zeros(2, 6, dtype=torch.bool)
    kpm[1] = True
    out = run(dynamic_mask_attention, backend, q, k, v, a, table, u, key_padding_mask=kpm)
    assert torch.isfinite(out).all() and out[1].abs().max() == 0
    if backend != "flex":
        out.sum().backward()
        assert all(torch.isfinite(t.grad).all() for t in (q, k, v, a, table, u))


def test_dman_bad_parameters():
    q, k, v = qkv()
    a, table, u = dman_params()
    with pytest.raises(ValueError, match="distance_bias must have 2·max_distance \\+ 1 entries"):
        dynamic_mask_attention(q, k, v, a, table[:4], u)
    with pytest.raises(ValueError, match="head_bias has 2 entries but there are 3 heads"):
        dynamic_mask_attention(q, k, v, a, table, u[:2])
    with pytest.raises(ValueError, match="query_logit has shape"):
        dynamic_mask_attention(q, k, v, a[:, :3], table, u)
    with pytest.raises(ValueError, match="q_offset must be an int >= 0"):
        dynamic_mask_attention(q, k, v, a, table, u, q_offset=-1)
