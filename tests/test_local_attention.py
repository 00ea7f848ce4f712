"""maskattn.functional.local: CSAN 1D/2D (Eq. 4-9) and the banded kernel, every backend against an
oracle written straight from the paper's equations (explicit union of windows, one softmax)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from maskattn.bench import peak_memory_bytes
from maskattn.functional import banded_attention, local_attention, local_attention_maps
from maskattn.kernels import banded as banded_kernel

BACKENDS = ("reference", "sdpa", "flex", "banded", "triton")  # triton: under its interpreter on the CPU


def oracle(q, k, v, *, left, right, head_window=1, key_padding_mask=None, head_edges="truncate", score_mod=None):
    """CSAN Eq. 4-9 in float64, one query at a time: the keys/values of the window [i-left, i+right]
    (truncated at the edges, padding removed) in each head of the area h-N/2..h+N/2 (truncated or
    wrapped), united, and ONE softmax over all of them."""
    q, k, v = q.double(), k.double(), v.double()
    B, H, n, d = q.shape
    out = torch.zeros(B, H, n, v.shape[-1], dtype=torch.float64)
    half = head_window // 2
    # s[b, h, g, i, j] = score_mod(q^h_i · k^g_j / √d): every query against every key of every head
    s_all = torch.einsum("bhid,bgjd->bhgij", q, k) / math.sqrt(d)
    s_all = score_mod(s_all) if score_mod is not None else s_all
    for b in range(B):
        for h in range(H):
            heads = [h + o for o in range(-half, half + 1)]
            heads = [g % H for g in heads] if head_edges == "circular" else [g for g in heads if 0 <= g < H]
            for i in range(n):
                positions = [j for j in range(max(0, i - left), min(n, i + right + 1))
                             if key_padding_mask is None or not key_padding_mask[b, j]]
                area = [(g, j) for g in heads for j in positions]  # Eq. 7-8: the union over heads
                if not area:
                    continue  # nothing to attend: output 0
                s = torch.stack([s_all[b, h, g, i, j] for g, j in area])
                V = torch.stack([v[b, g, j] for g, j in area])
                out[b, h, i] = torch.softmax(s, 0) @ V  # Eq. 9: one softmax over the area
    return out


def qkv(B=2, H=4, n=9, d=5, d_v=3, dtype=torch.float64, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, H, n, d), (B, H, n, d), (B, H, n, d_v)]
    return [torch.randn(s, generator=g, dtype=dtype).requires_grad_(requires_grad) for s in shapes]


def padding(B, n, lengths):
    return torch.arange(n)[None, :] >= torch.tensor(lengths)[:, None]  # True = padding


def run(fn, backend, *args, **kwargs):
    if backend == "flex":  # eager FlexAttention on CPU is inference-only
        with torch.no_grad():
            return fn(*args, backend=backend, **kwargs)
    return fn(*args, backend=backend, **kwargs)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("head_window,head_edges", [(1, "truncate"), (3, "truncate"), (3, "circular"),
                                                    (5, "circular"), (5, "truncate")])
@pytest.mark.parametrize("n,lengths", [(11, None), (11, [11, 4]), (3, None), (3, [2, 1]), (1, None)])
def test_local_attention_matches_equations(backend, head_window, head_edges, n, lengths):
    q, k, v = qkv(H=5, n=n)
    kpm = None if lengths is None else padding(2, n, lengths)
    out = run(local_attention, backend, q, k, v, window=5, head_window=head_window, key_padding_mask=kpm,
              head_edges=head_edges)
    expected = oracle(q, k, v, left=2, right=2, head_window=head_window, key_padding_mask=kpm, head_edges=head_edges)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("backend", BACKENDS)
def test_float32_matches_float64_oracle(backend):
    q, k, v = qkv(B=2, H=4, n=40, d=8, d_v=8, dtype=torch.float32)
    kpm = padding(2, 40, [40, 23])
    out = run(local_attention, backend, q, k, v, window=7, head_window=3, key_padding_mask=kpm)
    expected = oracle(q, k, v, left=3, right=3, head_window=3, key_padding_mask=kpm)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


def test_window_wider_than_sequence_is_full_attention():
    q, k, v = qkv(n=6)
    out = local_attention(q, k, v, window=101)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))


def test_window_one_returns_values():
    q, k, v = qkv(n=6)
    torch.testing.assert_close(local_attention(q, k, v, window=1), v)


def test_padded_query_rows_with_no_key_are_zero_with_finite_gradients():
    q, k, v = qkv(n=16, requires_grad=True)
    kpm = padding(2, 16, [16, 3])  # batch 1: queries 6.. see only padding within window 5
    for backend in ("banded", "reference", "sdpa", "triton"):
        out = local_attention(q, k, v, window=5, head_window=3, key_padding_mask=kpm, backend=backend)
        assert out[1, :, 6:].abs().max() == 0
        out.sum().backward()
        assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
        for t in (q, k, v):
            t.grad = None


@pytest.mark.parametrize("backend", ["banded", "reference", "sdpa"])
@pytest.mark.parametrize("head_window,head_edges", [(1, "truncate"), (3, "truncate"), (3, "circular")])
def test_gradcheck(backend, head_window, head_edges):
    q, k, v = qkv(B=1, H=3, n=7, d=3, d_v=2, requires_grad=True)
    kpm = padding(1, 7, [5])

    def f(q, k, v):
        return local_attention(q, k, v, window=3, head_window=head_window, key_padding_mask=kpm,
                               head_edges=head_edges, backend=backend)

    assert torch.autograd.gradcheck(f, (q, k, v), fast_mode=True)


def test_gradcheck_banded_with_score_mod():
    q, k, v = qkv(B=1, H=2, n=9, d=3, d_v=2, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k, v: banded_attention(q, k, v, (2, 1), score_mod=F.logsigmoid,
                                                                     backend="banded"), (q, k, v), fast_mode=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("head_window", [1, 3])
def test_padding_invariance(backend, head_window):
    """Real tokens see the same output whether or not padding follows them, whatever the padding holds."""
    q, k, v = qkv(B=1, n=7)
    short = run(local_attention, backend, q, k, v, window=5, head_window=head_window)
    long = [torch.cat([t, 100 * torch.randn(1, 4, 5, t.shape[-1], dtype=t.dtype)], dim=2) for t in (q, k, v)]
    kpm = padding(1, 12, [7])
    padded = run(local_attention, backend, *long, window=5, head_window=head_window, key_padding_mask=kpm)
    torch.testing.assert_close(padded[:, :, :7], short, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------- banded


@pytest.mark.parametrize("backend, score_mod", [(b, mod) for b in BACKENDS for mod in (None, F.logsigmoid)
                                                if not (b == "sdpa" and mod is not None)])  # sdpa: no score_mod
@pytest.mark.parametrize("radius,left,right", [(0, 0, 0), (2, 2, 2), ((3, 0), 3, 0), ((0, 2), 0, 2), (50, 50, 50)])
def test_banded_attention_matches_equations(backend, radius, left, right, score_mod):
    q, k, v = qkv(n=13)
    kpm = padding(2, 13, [13, 6])
    out = run(banded_attention, backend, q, k, v, radius, score_mod=score_mod, key_padding_mask=kpm)
    expected = oracle(q, k, v, left=left, right=right, key_padding_mask=kpm, score_mod=score_mod)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


def test_banded_custom_scale():
    q, k, v = qkv(n=8)
    out = banded_attention(q, k, v, 2, scale=0.5)
    expected = oracle(q * 0.5 * math.sqrt(q.shape[-1]), k, v, left=2, right=2)
    torch.testing.assert_close(out, expected)


class _LargestTensor(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def _largest_tensor(n, head_window):
    q, k, v = qkv(B=1, H=3, n=n, d=4, d_v=4, dtype=torch.float32, requires_grad=True)
    kpm = padding(1, n, [n - 40])
    with _LargestTensor() as probe:
        out = local_attention(q, k, v, window=11, head_window=head_window, key_padding_mask=kpm, backend="banded")
        out.sum().backward()
    return probe.largest


@pytest.mark.parametrize("head_window", [1, 3])
def test_banded_memory_is_linear_in_n(head_window):
    """Forward and backward of the banded path: the largest intermediate grows like n, far below the
    (B·H·n²) of one dense score matrix."""
    small, large = _largest_tensor(512, head_window), _largest_tensor(1024, head_window)
    assert large <= 2.05 * small, (small, large)
    assert large < 3 * 1024 * 1024 / 4, large


def test_auto_backend_is_banded_on_cpu_and_differentiable():
    q, k, v = qkv(n=20, requires_grad=True)
    out = local_attention(q, k, v, window=5, head_window=3)
    out.sum().backward()
    torch.testing.assert_close(out, local_attention(q, k, v, window=5, head_window=3, backend="banded"))


# ---------------------------------------------------------------------------------------------- lean band kernel
# The banded backend runs a custom autograd Function (_BandedAttention) for score_mod None / F.logsigmoid:
# it keeps q, k, v, the output and one log-sum-exp per row, and recomputes each chunk of query blocks in
# backward. CHUNK_ELEMENTS = 1 forces one block per chunk, so tiny inputs cross many chunk boundaries.


@pytest.fixture
def tiny_chunks(monkeypatch):
    monkeypatch.setattr(banded_kernel, "CHUNK_ELEMENTS", 1)


def _seeded(fn, seed=3):
    """``fn`` with the global seed reset before every call: the same dropout mask on every evaluation."""
    def call(*args):
        torch.manual_seed(seed)
        return fn(*args)
    return call


@pytest.mark.parametrize("head_window,head_edges", [(1, "truncate"), (3, "truncate"), (3, "circular")])
@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
def test_lean_banded_gradcheck_several_blocks(tiny_chunks, head_window, head_edges, dropout_p):
    q, k, v = qkv(B=2, H=3, n=37, d=2, d_v=2, requires_grad=True)  # block 16: 3 blocks, one per chunk
    kpm = padding(2, 37, [37, 20])
    kpm[0, 5:9] = True  # a hole of padding inside the sequence

    def f(q, k, v):
        return local_attention(q, k, v, window=5, head_window=head_window, key_padding_mask=kpm,
                               head_edges=head_edges, dropout_p=dropout_p, training=True, backend="banded")

    assert type(f(q, k, v).grad_fn).__name__ == "_BandedAttentionBackward"
    assert torch.autograd.gradcheck(_seeded(f), (q, k, v), fast_mode=True)


@pytest.mark.parametrize("radius", [(2, 1), (0, 4), (20, 20)])
@pytest.mark.parametrize("dropout_p", [0.0, 0.25])
def test_lean_banded_gradcheck_log_sigmoid(tiny_chunks, radius, dropout_p):
    q, k, v = qkv(B=1, H=2, n=35, d=3, d_v=2, requires_grad=True)
    kpm = padding(1, 35, [29])

    def f(q, k, v):
        return banded_attention(q, k, v, radius, score_mod=F.logsigmoid, key_padding_mask=kpm, dropout_p=dropout_p,
                                training=True, backend="banded")

    assert torch.autograd.gradcheck(_seeded(f), (q, k, v), fast_mode=True)


@pytest.mark.parametrize("chunk", [1, 2**20])
@pytest.mark.parametrize("head_window,head_edges", [(1, "truncate"), (3, "truncate"), (5, "circular")])
def test_lean_banded_matches_reference_forward_and_backward(monkeypatch, chunk, head_window, head_edges):
    monkeypatch.setattr(banded_kernel, "CHUNK_ELEMENTS", chunk)
    q, k, v = qkv(B=2, H=5, n=70, d=6, d_v=4, requires_grad=True)
    kpm = padding(2, 70, [70, 31])
    kpm[0, 40:52] = True  # queries 46..: 0 in both batches, window 11 sees only padding around 46
    grad = torch.randn(2, 5, 70, 4, dtype=torch.float64)
    outs, grads = [], []
    for backend in ("banded", "reference"):
        out = local_attention(q, k, v, window=11, head_window=head_window, key_padding_mask=kpm,
                              head_edges=head_edges, backend=backend)
        outs.append(out)
        grads.append(torch.autograd.grad(out, (q, k, v), grad))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-12, atol=1e-12)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("score_mod", [None, F.logsigmoid])
def test_lean_banded_matches_autograd_path_with_score_mod(tiny_chunks, score_mod):
    """The custom Function against the same band kernel under plain autograd (float32, several chunks)."""
    q, k, v = qkv(B=2, H=3, n=90, d=8, d_v=8, dtype=torch.float32, requires_grad=True)
    kpm = padding(2, 90, [90, 50])
    lean = banded_attention(q, k, v, (4, 2), score_mod=score_mod, key_padding_mask=kpm, backend="banded")
    plain = banded_kernel._banded_autograd(q, k, v, 4, 2, None, None, kpm, 8 ** -0.5, score_mod, 0.0)
    torch.testing.assert_close(lean, plain)
    grad = torch.randn_like(lean)
    for a, b in zip(torch.autograd.grad(lean, (q, k, v), grad), torch.autograd.grad(plain, (q, k, v), grad)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_lean_banded_rows_without_keys_are_zero_with_zero_finite_gradients(tiny_chunks):
    q, k, v = qkv(B=2, H=3, n=40, requires_grad=True)
    kpm = padding(2, 40, [40, 5])  # batch 1: queries 8.. see only padding within window 7
    kpm[0, 10:30] = True  # batch 0: queries 13..26 see only padding
    for head_window in (1, 3):
        out = local_attention(q, k, v, window=7, head_window=head_window, key_padding_mask=kpm, backend="banded")
        assert out[1, :, 8:].abs().max() == 0 and out[0, :, 13:27].abs().max() == 0
        dq, dk, dv = torch.autograd.grad(out.square().sum() + out.sum(), (q, k, v))
        assert all(torch.isfinite(t).all() for t in (dq, dk, dv))
        assert dq[1, :, 8:].abs().max() == 0 and dq[0, :, 13:27].abs().max() == 0  # no key: q has no effect
        assert dk[0, :, 10:30].abs().max() == 0 and dv[1, :, 5:].abs().max() == 0  # padding keys get nothing


def test_lean_banded_saves_only_inputs_output_and_row_lse():
    q, k, v = qkv(B=2, H=3, n=50, d=4, d_v=6, requires_grad=True)
    out = local_attention(q, k, v, window=5, head_window=3, backend="banded")
    saved = out.grad_fn.saved_tensors
    assert [tuple(t.shape) for t in saved] == [(2, 3, 50, 4), (2, 3, 50, 4), (2, 3, 50, 6), (2, 3, 50, 6),
                                               (2, 3, 50)]


@pytest.mark.parametrize("head_window", [1, 3])
@pytest.mark.parametrize("dropout_p", [0.0, 0.1])
def test_lean_banded_peak_memory_is_outputs_plus_small_chunks(monkeypatch, head_window, dropout_p):
    """Forward + backward allocate the output and the three input gradients (4 × q's bytes here) plus
    chunk temporaries bounded by CHUNK_ELEMENTS; the peak is read from PyTorch's CPU allocator."""
    monkeypatch.setattr(banded_kernel, "CHUNK_ELEMENTS", 2**12)
    q, k, v = qkv(B=1, H=4, n=1024, d=16, d_v=16, dtype=torch.float32, requires_grad=True)
    grad = torch.randn(1, 4, 1024, 16)

    def fn():
        out = local_attention(q, k, v, window=11, head_window=head_window, dropout_p=dropout_p, training=True,
                              backend="banded")
        return out, torch.autograd.grad(out, (q, k, v), grad)

    floor = 4 * q.numel() * q.element_size()
    assert peak_memory_bytes(fn) < 1.3 * floor  # the autograd band kernel: 2.6× (1D), 8.2× (2D)


def test_lean_banded_dropout_is_reproducible_and_scaled():
    q, k = qkv(B=1, H=2, n=500, d=4)[:2]
    v = torch.ones(1, 2, 500, 1, dtype=torch.float64)
    torch.manual_seed(5)
    a = local_attention(q, k, v, window=11, dropout_p=0.5, training=True, backend="banded")
    torch.manual_seed(5)
    b = local_attention(q, k, v, window=11, dropout_p=0.5, training=True, backend="banded")
    torch.testing.assert_close(a, b)
    assert (a == 0).any() and (a - 1).abs().max() > 0.1  # some rows lose weight, some gain
    assert abs(a.mean().item() - 1.0) < 0.05  # inverted dropout: E[row weight] = 1


def test_other_score_mods_keep_the_autograd_path_and_their_parameters_get_gradients():
    q, k, v = qkv(B=1, H=2, n=30, requires_grad=True)
    w = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    out = banded_attention(q, k, v, 3, score_mod=lambda s: w * s, backend="banded")
    assert type(out.grad_fn).__name__ != "_BandedAttentionBackward"
    out.sum().backward()
    assert w.grad is not None and torch.isfinite(w.grad)
    expected = oracle(q.detach(), k.detach(), v.detach(), left=3, right=3, score_mod=lambda s: 0.7 * s)
    torch.testing.assert_close(out, expected)


# ---------------------------------------------------------------------------------------------- maps, dropout


def test_maps_rows_sum_to_one_and_reproduce_output():
    q, k, v = qkv(H=4, n=10)
    kpm = padding(2, 10, [10, 3])
    for head_window in (1, 3):
        maps = local_attention_maps(q, k, window=3, head_window=head_window, key_padding_mask=kpm)
        assert maps.shape == (2, 4, 10, 4, 10)
        sums = maps.sum((-1, -2))
        has_key = torch.ones_like(sums, dtype=torch.bool)
        has_key[1, :, 4:] = False  # queries 4.. of batch 1 see only padding (keys 3..) within window 3
        torch.testing.assert_close(sums, has_key.double())
        out = torch.einsum("bhigj,bgjd->bhid", maps, v)
        torch.testing.assert_close(out, local_attention(q, k, v, window=3, head_window=head_window,
                                                         key_padding_mask=kpm))
        if head_window == 1:  # 1D: no weight on other heads
            off = maps.clone()
            for h in range(4):
                off[:, h, :, h] = 0
            assert off.abs().max() == 0


@pytest.mark.parametrize("backend", ["banded", "reference", "sdpa"])
def test_dropout_only_when_training(backend):
    q, k, v = qkv(n=12)
    a = local_attention(q, k, v, window=5, dropout_p=0.5, training=False, backend=backend)
    torch.testing.assert_close(a, local_attention(q, k, v, window=5, backend=backend))
    torch.manual_seed(0)
    b = local_attention(q, k, v, window=5, dropout_p=0.5, training=True, backend=backend)
    assert not torch.allclose(a, b)


# ---------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("window,exc", [(4, ValueError), (0, ValueError), (-3, ValueError), (3.0, TypeError),
                                        (True, TypeError), ("11", TypeError)])
def test_bad_window(window, exc):
    q, k, v = qkv()
    with pytest.raises(exc, match=rf"window.*{window!r}" if exc is TypeError else rf"window.*{window}"):
        local_attention(q, k, v, window=window)


@pytest.mark.parametrize("head_window,match", [(2, "head_window.*2"), (5, r"head_window \(5\).*heads \(4\)"),
                                               (-1, "head_window.*-1")])
def test_bad_head_window(head_window, match):
    q, k, v = qkv(H=4)
    with pytest.raises(ValueError, match=match):
        local_attention(q, k, v, head_window=head_window)


@pytest.mark.parametrize("radius,exc", [(-1, ValueError), ((1, -2), ValueError), (1.5, TypeError),
                                        ((1, 2, 3), TypeError), (None, TypeError)])
def test_bad_radius(radius, exc):
    q, k, v = qkv()
    with pytest.raises(exc, match="radius"):
        banded_attention(q, k, v, radius)


def test_bad_shapes_and_options():
    q, k, v = qkv(n=9)
    with pytest.raises(ValueError, match=r"k has shape \(2, 4, 8, 5\)"):
        local_attention(q, k[:, :, :8], v)
    with pytest.raises(ValueError, match=r"v has shape"):
        local_attention(q, k, v[:, :2])
    with pytest.raises(ValueError, match="q must have 4 dimensions"):
        local_attention(q[0], k, v)
    with pytest.raises(TypeError, match="k has dtype torch.float32"):
        local_attention(q, k.float(), v)
    with pytest.raises(ValueError, match=r"key_padding_mask has shape \(2, 8\)"):
        local_attention(q, k, v, key_padding_mask=torch.zeros(2, 8, dtype=torch.bool))
    with pytest.raises(TypeError, match="key_padding_mask must have dtype torch.bool"):
        local_attention(q, k, v, key_padding_mask=torch.zeros(2, 9))
    with pytest.raises(ValueError, match="head_edges 'wrap'"):
        local_attention(q, k, v, head_edges="wrap")
    with pytest.raises(ValueError, match="backend 'fast'"):
        local_attention(q, k, v, backend="fast")
    with pytest.raises(ValueError, match="score_mod"):
        banded_attention(q, k, v, 2, score_mod=F.logsigmoid, backend="sdpa")
    with pytest.raises(TypeError, match="score_mod"):
        banded_attention(q, k, v, 2, score_mod="logsigmoid")
    with pytest.raises(ValueError, match="scale"):
        banded_attention(q, k, v, 2, scale=-1.0)


def test_flex_backward_on_cpu_is_refused():
    q, k, v = qkv(requires_grad=True)
    with pytest.raises(ValueError, match="backward only on CUDA"):
        local_attention(q, k, v, backend="flex")
    with pytest.raises(ValueError, match="dropout"):
        with torch.no_grad():
            local_attention(q, k, v, backend="flex", dropout_p=0.1, training=True)


# ---------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["flex", "banded", "sdpa"])
def test_cuda_matches_reference_with_backward(backend):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    q, k, v = (t.cuda() for t in qkv(B=2, H=4, n=300, d=16, d_v=16, dtype=torch.float32))
    for t in (q, k, v):
        t.requires_grad_(True)
    kpm = padding(2, 300, [300, 170]).cuda()
    out = local_attention(q, k, v, window=11, head_window=3, key_padding_mask=kpm, backend=backend)
    ref = local_attention(q.double(), k.double(), v.double(), window=11, head_window=3, key_padding_mask=kpm,
                          backend="reference")
    torch.testing.assert_close(out.double(), ref, rtol=2e-3, atol=2e-3)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    ref_grads = torch.autograd.grad(ref.sum(), (q, k, v))
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g.double(), r.double(), rtol=2e-3, atol=2e-3)


# --- a band wider than the sequence costs what full attention costs (issue 32 item 2) ----------------------

@pytest.mark.parametrize("backend", ["reference", "sdpa", "banded"])
@pytest.mark.parametrize("name, wide, full", [
    ("csan1d", {"window": 8193}, {"window": 15}),
    ("csan2d", {"window": 8193}, {"window": 15}),
    ("sman", {"radius": 4096}, {"radius": 7}),
    ("mtsa", {"head_masks": ["window:4096"] * 4}, {"head_masks": ["window:7"] * 4}),
])
def test_a_band_wider_than_the_sentence_costs_full_attention_at_its_length(name, wide, full, backend):
    """Radius 2,048 on 8 tokens took 1.5 GB against 0.57 GB for radius 4 (and radius 10**6 tried to allocate
    64 GB): every band is clipped to the sequence. Here 4,096 on 8 tokens (tens of MB before) against n − 1."""
    import maskattn

    torch.manual_seed(0)
    x = torch.randn(2, 8, 16, requires_grad=True)

    def peak(options):
        torch.manual_seed(0)
        module = maskattn.create_attention(name, 16, 4, backend=backend, **options)
        return peak_memory_bytes(lambda: module(x).sum().backward()), module(x)

    (wide_peak, wide_out), (full_peak, full_out) = peak(wide), peak(full)
    torch.testing.assert_close(wide_out, full_out)
    assert wide_peak <= 1.1 * full_peak


@pytest.mark.parametrize("name, options", [("csan1d", {"window": 10**30 + 1}), ("sman", {"radius": 10**30}),
                                           ("sman", {"radius": math.inf}), ("csan2d", {"window": 10**9 + 1})])
def test_a_band_past_any_length_is_full_attention(name, options):
    import maskattn

    torch.manual_seed(0)
    module = maskattn.create_attention(name, 16, 4, **options)
    x = torch.randn(2, 5, 16)
    torch.manual_seed(0)
    local = maskattn.create_attention(name, 16, 4, **{key: 9 for key in options})  # 9 > 2·4: the whole sentence
    torch.testing.assert_close(module(x), local(x))
