"""tensorized_attention (MTSA Eq. 10–12) against a float64 oracle written from the paper's tensor form."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from maskattn import masks as M
from maskattn.kernels.sigmoid import _MaskedSigmoidAttention, masked_sigmoid_attention
from maskattn.functional import tensorized_attention, tensorized_attention_maps

BACKENDS = ["reference", "sdpa", "flex"]
#: the backends that take MTSA's masks as bands per head (the Triton kernel, run here under its interpreter)
BAND_BACKENDS = BACKENDS + ["triton"]
SCALES = ["log_sigmoid", "identity"]


def oracle(q, k, v, s2t, allowed, scale):
    """Eq. 10–12 on the explicit (B, H, n, m, d_v) tensor, in float64, one (query, feature) at a time
    as the paper writes it: f_ijl = σ_t(q_i·k_j/√d) + S_jl + M_ij, p = softmax_j f, o_il = Σ_j p_ijl v_jl.
    ``allowed``: (B, H, n, m) bool. A query with no allowed key gives 0."""
    q, k, v, s2t = (t.double() for t in (q, k, v, s2t))
    sigma = F.logsigmoid if scale == "log_sigmoid" else (lambda r: r)
    t2t = sigma(torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(q.shape[-1]))
    f = t2t[..., None] + s2t[:, :, None, :, :]  # (B, H, n, m, d_v)
    f = f.masked_fill(~allowed[..., None], -math.inf)
    fmax = f.amax(dim=3, keepdim=True)
    fmax = torch.where(torch.isfinite(fmax), fmax, torch.zeros_like(fmax))
    w = torch.exp(f - fmax)
    den = w.sum(dim=3)
    num = (w * v[:, :, None]).sum(dim=3)
    return torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(num))


def make_inputs(B=2, H=4, n=9, d_k=5, d_v=6, dtype=torch.float32, s2t_scale=2.0, requires_grad=False):
    g = torch.Generator().manual_seed(1)
    ts = [torch.randn(B, H, n, d, generator=g, dtype=torch.float64) for d in (d_k, d_k, d_v)]
    ts.append(torch.randn(B, H, n, d_v, generator=g, dtype=torch.float64) * s2t_scale)
    return [t.to(dtype).requires_grad_(requires_grad) for t in ts]


MASKS = {
    "none": None,
    "forward": M.forward_mask(),
    "backward_strict": M.backward_mask(False),
    "window": M.window(1),
    "multi": M.per_head([M.forward_mask(False), M.backward_mask(), M.window(2), M.full()]),
    "dense": "dense",
}


def dense_allowed(mask, kpm, B, H, n):
    allowed = torch.ones(B, H, n, n, dtype=torch.bool)
    if isinstance(mask, M.Mask):
        allowed = allowed & mask.materialize(n, heads=H)
    elif isinstance(mask, torch.Tensor):
        allowed = allowed & mask
    if kpm is not None:
        allowed = allowed & ~kpm[:, None, None, :]
    return allowed


def random_dense_mask(B, H, n):
    g = torch.Generator().manual_seed(3)
    return torch.rand(B, H, n, n, generator=g) > 0.4


def run(backend, *args, **kw):
    if backend == "flex":  # FlexAttention has no backward on CPU: inference only
        with torch.no_grad():
            return tensorized_attention(*args, backend=backend, **kw)
    return tensorized_attention(*args, backend=backend, **kw)


def tol(dtype):
    return {torch.float64: 1e-10, torch.float32: 2e-5, torch.bfloat16: 6e-2}[dtype]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("mask_name", MASKS)
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_oracle(backend, scale, mask_name, padded, dtype):
    q, k, v, s2t = make_inputs(dtype=dtype)
    B, H, n = q.shape[:3]
    mask = MASKS[mask_name]
    if mask == "dense":
        mask = random_dense_mask(B, H, n)
    kpm = None
    if padded:
        kpm = torch.zeros(B, n, dtype=torch.bool)
        kpm[1, 5:] = True
    out = run(backend, q, k, v, s2t, mask, scale=scale, key_padding_mask=kpm)
    expected = oracle(q, k, v, s2t, dense_allowed(mask, kpm, B, H, n), scale)
    assert out.shape == expected.shape and out.dtype == dtype
    torch.testing.assert_close(out.double(), expected, atol=tol(dtype), rtol=tol(dtype))


@pytest.mark.parametrize("backend", BACKENDS)
def test_auto_and_mask_broadcasting(backend):
    q, k, v, s2t = make_inputs(dtype=torch.float64)
    n = q.shape[2]
    mask2d = torch.ones(n, n, dtype=torch.bool).tril()  # (n, n) broadcasts over batch and heads
    out = run(backend, q, k, v, s2t, mask2d)
    expected = oracle(q, k, v, s2t, mask2d.expand(2, 4, n, n), "log_sigmoid")
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(tensorized_attention(q, k, v, s2t, mask2d), expected)


def test_cross_attention_shapes():
    q = torch.randn(2, 3, 4, 5, dtype=torch.float64)
    k, v, s2t = torch.randn(2, 3, 7, 5, dtype=torch.float64), torch.randn(2, 3, 7, 2, dtype=torch.float64), \
        torch.randn(2, 3, 7, 2, dtype=torch.float64)
    out = tensorized_attention(q, k, v, s2t, backend="sdpa")
    torch.testing.assert_close(out, oracle(q, k, v, s2t, torch.ones(2, 3, 4, 7, dtype=torch.bool), "log_sigmoid"))


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
@pytest.mark.parametrize("scale", SCALES)
def test_gradcheck(backend, scale):
    q, k, v, s2t = make_inputs(B=2, H=2, n=5, d_k=3, d_v=2, dtype=torch.float64, requires_grad=True)
    mask = M.per_head([M.forward_mask(), M.backward_mask(False)])
    kpm = torch.tensor([[False] * 5, [False, False, False, True, True]])
    fn = lambda *a: tensorized_attention(*a, mask, scale=scale, backend=backend, key_padding_mask=kpm)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v, s2t))


def test_sigmoid_kernel_gradcheck_with_dropout():
    """With a fixed seed the dropout of the blocked kernel is deterministic, so its backward can be checked."""
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 2, 6, 3, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    x = torch.randn(2, 2, 6, 4, generator=g, dtype=torch.float64, requires_grad=True)
    mask = M.forward_mask().materialize(6, heads=2)
    fn = lambda q, k, x: _MaskedSigmoidAttention.apply(q, k, x, mask, 0.5, 2, 0.3, 1234)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, x))


def test_sigmoid_kernel_blocks_match_unblocked(monkeypatch):
    from maskattn.kernels import sigmoid as sigmoid_kernel

    q, k, x = torch.randn(3, 2, 37, 4), torch.randn(3, 2, 37, 4), torch.randn(3, 2, 37, 5)
    for t in (q, k, x):
        t.requires_grad_(True)
    mask = M.window(3).materialize(37)
    whole = masked_sigmoid_attention(q, k, x, mask, 0.5)
    grads = torch.autograd.grad(whole.square().sum(), (q, k, x))
    monkeypatch.setattr(sigmoid_kernel, "CHUNK_ELEMENTS", 100)
    monkeypatch.setattr(sigmoid_kernel, "QUERY_CHUNK", 5)
    assert len(list(sigmoid_kernel._tiles(3, 2, 37, 37))) > 3
    blocked = masked_sigmoid_attention(q, k, x, mask, 0.5)
    torch.testing.assert_close(blocked, whole)
    for a, b in zip(torch.autograd.grad(blocked.square().sum(), (q, k, x)), grads):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_dropout_keeps_denominator_and_expectation(backend):
    q, k, v, s2t = make_inputs(B=1, H=2, n=6, dtype=torch.float64)
    clean = tensorized_attention(q, k, v, s2t, M.forward_mask(), backend=backend)
    samples = torch.stack([tensorized_attention(q, k, v, s2t, M.forward_mask(), backend=backend, dropout_p=0.5,
                                                training=True) for _ in range(400)])
    assert not torch.allclose(samples[0], samples[1])
    # inverted dropout on both numerator factors leaves the expectation unchanged
    torch.testing.assert_close(samples.mean(0), clean, atol=0.25, rtol=0.0)
    # not training: no dropout
    torch.testing.assert_close(tensorized_attention(q, k, v, s2t, M.forward_mask(), backend=backend, dropout_p=0.5), clean)


def test_dropout_on_numerator_only():
    """Algorithm 1 step 7 with dropout: Dropout(E_X) Dropout(E_R) / (E_S E_R) — the denominator
    columns of the kernel output are the undropped ones."""
    q, k, x = torch.randn(1, 2, 8, 3), torch.randn(1, 2, 8, 3), torch.rand(1, 2, 8, 6)
    plain = masked_sigmoid_attention(q, k, x, None, 0.5)
    dropped = masked_sigmoid_attention(q, k, x, None, 0.5, n_drop=3, drop_p=0.5)
    torch.testing.assert_close(dropped[..., 3:], plain[..., 3:])
    assert not torch.allclose(dropped[..., :3], plain[..., :3])


@pytest.mark.parametrize("backend", BAND_BACKENDS)
def test_forward_mask_no_leakage(backend):
    q, k, v, s2t = make_inputs(B=1, H=2, n=8, dtype=torch.float64)
    base = run(backend, q, k, v, s2t, M.forward_mask())
    t = 4
    q2, k2, v2, s2 = (x.clone() for x in (q, k, v, s2t))
    for x in (q2, k2, v2, s2):
        x[:, :, t + 1:] = torch.randn_like(x[:, :, t + 1:]) * 10
    changed = run(backend, q2, k2, v2, s2, M.forward_mask())
    torch.testing.assert_close(changed[:, :, :t + 1], base[:, :, :t + 1])
    assert not torch.allclose(changed[:, :, t + 1:], base[:, :, t + 1:])


@pytest.mark.parametrize("backend", BAND_BACKENDS)
def test_padding_invariance(backend):
    q, k, v, s2t = make_inputs(B=2, H=2, n=8, dtype=torch.float64)
    kpm = torch.zeros(2, 8, dtype=torch.bool)
    kpm[0, 5:] = True
    base = run(backend, q, k, v, s2t, M.full(), key_padding_mask=kpm)
    k2, v2, s2 = k.clone(), v.clone(), s2t.clone()
    for x in (k2, v2, s2):
        x[0, :, 5:] = torch.randn_like(x[0, :, 5:]) * 100
    changed = run(backend, q, k2, v2, s2, M.full(), key_padding_mask=kpm)
    torch.testing.assert_close(changed, base)
    # the same sequence without padding gives the same outputs at its real positions
    short = run(backend, q[:1, :, :5], k[:1, :, :5], v[:1, :, :5], s2t[:1, :, :5], M.full())
    torch.testing.assert_close(base[:1, :, :5], short)


# ---------------------------------------------------------------------------------------------- numerics

@pytest.mark.parametrize("backend", BAND_BACKENDS)
@pytest.mark.parametrize("scale", SCALES)
def test_scores_spanning_50_match_in_float32(backend, scale):
    """Algorithm 1 of the paper takes exp(S) unshifted and overflows near 88 in float32."""
    q, k, v, s2t = make_inputs(B=2, H=2, n=16, dtype=torch.float64, s2t_scale=1.0)
    s2t = (torch.rand_like(s2t) * 100 - 50)  # uniform in [-50, 50]
    mask = M.per_head([M.forward_mask(), M.backward_mask()])
    expected = oracle(q, k, v, s2t, dense_allowed(mask, None, 2, 2, 16), scale)
    out = run(backend, *(t.float() for t in (q, k, v, s2t)), mask, scale=scale)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("backend", BAND_BACKENDS)
@pytest.mark.parametrize("scale", SCALES)
def test_extreme_scores_are_recomputed_exactly(backend, scale):
    q, k, v, s2t = make_inputs(B=2, H=2, n=12, dtype=torch.float64, s2t_scale=1.0)
    s2t = (torch.rand_like(s2t) * 2e4 - 1e4)  # ±1e4: almost every denominator underflows after the shift
    q = q * 30  # token2token scores large too
    mask = M.per_head([M.forward_mask(False), M.backward_mask()])
    kpm = torch.zeros(2, 12, dtype=torch.bool)
    kpm[1, 9:] = True
    expected = oracle(q, k, v, s2t, dense_allowed(mask, kpm, 2, 2, 12), scale)
    out = run(backend, *(t.float() for t in (q, k, v, s2t)), mask, scale=scale, key_padding_mask=kpm)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), expected, atol=1e-4, rtol=1e-4)


def test_extreme_scores_have_finite_gradients():
    q, k, v, s2t = make_inputs(B=1, H=2, n=10, dtype=torch.float32, requires_grad=True)
    with torch.no_grad():
        s2t.mul_(5e3)
    out = tensorized_attention(q, k, v, s2t, M.per_head([M.forward_mask(), M.backward_mask()]), backend="sdpa")
    out.sum().backward()
    for t in (q, k, v, s2t):
        assert torch.isfinite(t.grad).all()


@pytest.mark.parametrize("backend", BAND_BACKENDS)
def test_empty_rows_and_all_padding_give_zero(backend):
    q, k, v, s2t = make_inputs(B=2, H=2, n=5, dtype=torch.float32, requires_grad=backend != "flex")
    kpm = torch.zeros(2, 5, dtype=torch.bool)
    kpm[1] = True  # a padding-only sequence
    out = run(backend, q, k, v, s2t, M.forward_mask(False), key_padding_mask=kpm)
    assert torch.isfinite(out).all()
    assert (out[1] == 0).all()  # no allowed key anywhere
    assert (out[0, :, 0] == 0).all()  # strict forward: the first query sees nothing
    assert (out[0, :, 1:] != 0).any()
    if backend != "flex":
        out.sum().backward()
        assert all(torch.isfinite(t.grad).all() for t in (q, k, v, s2t))


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_bfloat16_runs(backend):
    q, k, v, s2t = make_inputs(B=2, H=2, n=8, dtype=torch.float64)
    mask = M.per_head([M.forward_mask(), M.backward_mask()])
    out = tensorized_attention(*(t.bfloat16() for t in (q, k, v, s2t)), mask, backend=backend)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), oracle(q, k, v, s2t, dense_allowed(mask, None, 2, 2, 8), "log_sigmoid"),
                               atol=tol(torch.bfloat16), rtol=tol(torch.bfloat16))


@pytest.mark.parametrize("backend, compiled", [("sdpa", False), ("sdpa", True), ("flex", False), ("banded", False),
                                               ("banded", True), ("triton", False), ("triton", True)])
# compiled CPU flex: tests/test_compile.py
def test_float16_keeps_rows_whose_keys_lie_far_below_the_maximum(backend, compiled):
    """float16's range ends ~10 below the maximum source2token score (exp(−9.7) ≈ its smallest normal): rows whose
    allowed keys all lie there (here: forward windows at the start, scores spread ±12) must still be exact, not 0
    — the factorised form runs in float32 and returns float16 (docs/design.md §3). Compiled, no eager recompute of
    underflowed rows can hide a loss (as on CUDA, where an H100 run found it: docs/gpu.md)."""
    q, k, v, s2t = make_inputs(B=2, H=2, n=8, dtype=torch.float64)
    s2t = s2t / s2t.abs().amax() * 12
    mask = M.band(2, 0) if backend == "banded" else M.per_head([M.forward_mask(), M.backward_mask()])
    attend = torch.compile(tensorized_attention, backend="aot_eager", fullgraph=True) if compiled \
        else tensorized_attention
    with torch.no_grad():  # flex: no CPU backward
        out = attend(*(t.half() for t in (q, k, v, s2t)), mask, backend=backend)
    assert out.dtype == torch.float16
    dense = dense_allowed(mask, None, 2, 2, 8)
    torch.testing.assert_close(out.double(), oracle(q, k, v, s2t, dense, "log_sigmoid"), atol=4e-3, rtol=4e-3)


@settings(max_examples=25, deadline=None)
@given(B=st.integers(1, 3), H=st.integers(1, 3), n=st.integers(1, 12), d_k=st.integers(1, 6),
       d_v=st.integers(1, 6), seed=st.integers(0, 2**31 - 1), scale=st.sampled_from(SCALES),
       density=st.floats(0.0, 1.0), pad=st.integers(0, 12))
def test_property_fast_path_equals_oracle(B, H, n, d_k, d_v, seed, scale, density, pad):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, H, n, d_k, generator=g), torch.randn(B, H, n, d_k, generator=g)
    v, s2t = torch.randn(B, H, n, d_v, generator=g), torch.randn(B, H, n, d_v, generator=g) * 5
    mask = torch.rand(B, H, n, n, generator=g) < density
    kpm = torch.arange(n).expand(B, n) >= n - min(pad, n)
    out = tensorized_attention(q, k, v, s2t, mask, scale=scale, backend="sdpa", key_padding_mask=kpm)
    expected = oracle(q, k, v, s2t, dense_allowed(mask, kpm, B, H, n), scale)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


def test_maps_reproduce_the_feature_wise_probabilities():
    q, k, v, s2t = make_inputs(B=2, H=2, n=7, dtype=torch.float64)
    mask = M.per_head([M.forward_mask(), M.backward_mask()])
    kpm = torch.zeros(2, 7, dtype=torch.bool)
    kpm[1, 4:] = True
    t2t, s2t_p = tensorized_attention_maps(q, k, s2t, mask, key_padding_mask=kpm)
    assert t2t.shape == (2, 2, 7, 7) and s2t_p.shape == (2, 2, 7, 6)
    real = dense_allowed(mask, kpm, 2, 2, 7).any(-1)  # rows with an allowed key (padded backward rows have none)
    assert not real.all()
    torch.testing.assert_close(t2t.sum(-1)[real], torch.ones(int(real.sum()), dtype=torch.float64))
    assert (t2t.sum(-1)[~real] == 0).all()
    torch.testing.assert_close(s2t_p.sum(-2), torch.ones(2, 2, 6, dtype=torch.float64))
    assert (s2t_p[1, :, 4:] == 0).all()
    assert (t2t[:, 0].triu(1) == 0).all() and (t2t[:, 1].tril(-1) == 0).all()
    # p_ijl ∝ t2t_ij · s2t_jl (Eq. 11 factorised) reproduces the output
    w = t2t[..., None] * s2t_p[:, :, None]
    p = w / w.sum(3, keepdim=True)
    out = tensorized_attention(q, k, v, s2t, mask, key_padding_mask=kpm)
    torch.testing.assert_close((p * v[:, :, None]).sum(3)[real], out[real])


# ------------------------------------------------------------------------------------------- bad input

def test_bad_input_messages():
    q, k, v, s2t = make_inputs(B=2, H=2, n=4)
    with pytest.raises(ValueError, match=r"q must have 4 dimensions"):
        tensorized_attention(q[0], k, v, s2t)
    with pytest.raises(TypeError, match=r"k must be a torch.Tensor"):
        tensorized_attention(q, k.numpy(), v, s2t)
    with pytest.raises(ValueError, match=r"k has shape \(2, 2, 4, 3\)"):
        tensorized_attention(q, k[..., :3], v, s2t)
    with pytest.raises(ValueError, match=r"v has shape"):
        tensorized_attention(q, k, v[:, :, :3], s2t)
    with pytest.raises(ValueError, match=r"s2t has shape"):
        tensorized_attention(q, k, v, s2t[..., :2])
    with pytest.raises(TypeError, match=r"mask must have dtype torch.bool"):
        tensorized_attention(q, k, v, s2t, torch.ones(4, 4))
    with pytest.raises(ValueError, match=r"mask has shape \(3, 4, 4\)"):
        tensorized_attention(q, k, v, s2t, torch.ones(3, 4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"unknown scale 'tanh'"):
        tensorized_attention(q, k, v, s2t, scale="tanh")
    with pytest.raises(ValueError, match=r"unknown backend 'cuda'"):
        tensorized_attention(q, k, v, s2t, backend="cuda")
    with pytest.raises(ValueError, match=r"key_padding_mask has shape \(2, 5\)"):
        tensorized_attention(q, k, v, s2t, key_padding_mask=torch.zeros(2, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"key_padding_mask must have dtype torch.bool"):
        tensorized_attention(q, k, v, s2t, key_padding_mask=torch.zeros(2, 4))
    with pytest.raises(TypeError, match=r"s2t has dtype torch.float64"):
        tensorized_attention(q, k, v, s2t.double())
    with pytest.raises(TypeError, match=r"floating-point"):
        tensorized_attention(q.long(), k, v, s2t)
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\)"):
        tensorized_attention(q, k, v, s2t, dropout_p=1.0)


def test_flex_backward_on_cpu_is_refused_with_advice():
    q, k, v, s2t = make_inputs(B=1, H=1, n=4, requires_grad=True)
    with pytest.raises(ValueError, match="backward only on CUDA"):
        tensorized_attention(q, k, v, s2t, backend="flex")


@pytest.mark.gpu
@pytest.mark.parametrize("scale", SCALES)
def test_flex_training_on_gpu(scale):
    q, k, v, s2t = (t.cuda().requires_grad_(True) for t in make_inputs(B=2, H=4, n=128, d_k=16, d_v=16))
    mask = M.per_head([M.forward_mask(), M.backward_mask(), M.window(4), M.full()])
    out = tensorized_attention(q, k, v, s2t, mask, scale=scale, backend="flex")
    ref = tensorized_attention(q, k, v, s2t, mask, scale=scale, backend="reference")
    torch.testing.assert_close(out, ref, atol=1e-3, rtol=1e-3)
    g_flex = torch.autograd.grad(out.sum(), (q, k, v, s2t))
    g_ref = torch.autograd.grad(ref.sum(), (q, k, v, s2t))
    for a, b in zip(g_flex, g_ref):
        torch.testing.assert_close(a, b, atol=1e-3, rtol=1e-3)
