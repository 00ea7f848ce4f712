"""The Triton DMAN kernels (maskattn.kernels.triton.dman) against the float64 reference of MAN Eq. 4 + 12.

Without a GPU they run under Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1), with 16 × 16 tiles,
so the lengths 37, 70 and 130 cross tile edges, and small distance tables (D = 2, 3) give key tiles wholly beyond
the clip distance on both sides (the kernels' one-gate-per-row path) next to the near tiles."""

import math

import pytest
import torch

from maskattn.functional.dman import dynamic_mask_attention_reference, dynamic_mask_logits
from maskattn.kernels.triton import runtime

pytestmark = pytest.mark.skipif(runtime.device_reason("cuda" if torch.cuda.is_available() else "cpu") is not None,
                                reason="needs triton (CUDA, or its interpreter on CPU)")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GRAD_NAMES = ("q", "k", "v", "a", "P", "U")


def dman_triton(*args, **kwargs):
    from maskattn.kernels.triton.dman import dman_triton as kernel

    return kernel(*args, **kwargs)


def make_inputs(n, m, D, *, B=2, H=2, d_k=8, d_v=8, dtype=torch.float64, param_dtype=None, logit_shift=0.0,
                seed=1):
    g = torch.Generator().manual_seed(seed)
    param_dtype = dtype if param_dtype is None else param_dtype

    def rand(*shape, dt=dtype, shift=0.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) + shift).to(DEVICE, dt).requires_grad_()

    return [rand(B, H, n, d_k), rand(B, H, m, d_k), rand(B, H, m, d_v), rand(B, n, dt=param_dtype, shift=logit_shift),
            rand(2 * D + 1, dt=param_dtype), rand(H, dt=param_dtype)]


def run_both(inputs, *, causal=False, kpm=None, q_offset=0, mask_floor=None):
    """(out, grads) of the kernel and of the float64 reference for the same upstream gradient."""
    out = dman_triton(*inputs, causal=causal, key_padding_mask=kpm, q_offset=q_offset, dropout_p=0.0,
                      mask_floor=mask_floor)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64).to(DEVICE)
    grads = torch.autograd.grad(out, inputs, grad_out.to(out.dtype))
    exact = [x.detach().double().requires_grad_() for x in inputs]  # float64 leaves: float64 gradients
    ref = dynamic_mask_attention_reference(*exact, causal=causal, key_padding_mask=kpm, q_offset=q_offset,
                                           mask_floor=mask_floor)[0]
    ref_grads = torch.autograd.grad(ref, exact, grad_out)
    return out, grads, ref, ref_grads


def assert_matches(inputs, *, atol, rtol, **options):
    out, grads, ref, ref_grads = run_both(inputs, **options)
    assert out.dtype == inputs[0].dtype and out.shape == ref.shape
    torch.testing.assert_close(out.double(), ref, atol=atol, rtol=rtol)
    for name, x, grad, ref_grad in zip(GRAD_NAMES, inputs, grads, ref_grads):
        assert grad.dtype == x.dtype and grad.shape == x.shape, name
        assert torch.isfinite(grad).all(), name
        torch.testing.assert_close(grad.double(), ref_grad, atol=atol, rtol=rtol, msg=lambda s, name=name: f"d{name}: {s}")
    return out, grads


# (n, m, D, causal, q_offset, padding): a covering set — lengths 1/37/70/130, far tiles on both sides (D = 2, 3 with
# n ≫ D), D at and past the sequence length, decoding-like q_offset > 0 with n < m, and key padding
CASES = {
    "single": (1, 1, 2, False, 0, None),
    "far_both_sides": (130, 130, 2, False, 0, None),
    "causal_far": (130, 130, 3, True, 0, None),
    "cross_lengths_padded": (37, 70, 3, False, 0, "tail"),
    "D_past_length": (37, 37, 40, False, 0, None),
    "D_at_edge_causal": (37, 37, 36, True, 0, None),
    "decoding": (5, 70, 3, True, 65, None),
    "offset_not_causal": (20, 50, 4, False, 7, "tail"),
}


def padding(kind, B, m):
    kpm = torch.zeros(B, m, dtype=torch.bool, device=DEVICE)
    if kind == "tail":
        kpm[0, m - 9:] = True
        kpm[1, 3:20] = True
    return kpm if kind else None


@pytest.mark.parametrize("case", list(CASES))
def test_matches_float64_reference(case):
    n, m, D, causal, q_offset, pad = CASES[case]
    inputs = make_inputs(n, m, D, B=1 if n >= 130 else 2)
    assert_matches(inputs, causal=causal, q_offset=q_offset, kpm=padding(pad, inputs[0].shape[0], m),
                   atol=1e-10, rtol=1e-8)


def test_rows_without_an_allowed_key_are_zero_with_zero_finite_gradients():
    n = m = 37
    inputs = make_inputs(n, m, 3)
    kpm = torch.zeros(2, m, dtype=torch.bool, device=DEVICE)
    kpm[0, 0] = True  # causal: query 0 of sequence 0 sees only key 0, padded
    kpm[1] = True  # sequence 1: every key padded
    out, grads = assert_matches(inputs, causal=True, kpm=kpm, atol=1e-10, rtol=1e-8)
    assert (out[0, :, 0] == 0).all() and (out[1] == 0).all()
    grad_q, grad_k, grad_v, grad_a = grads[:4]
    assert (grad_q[0, :, 0] == 0).all() and (grad_q[1] == 0).all()
    assert (grad_k[1] == 0).all() and (grad_v[1] == 0).all() and (grad_a[1] == 0).all() and grad_a[0, 0] == 0


def test_strided_inputs_and_head_dims_that_are_not_powers_of_two():
    """q, k, v as views of (B, n, H, d) projections, a a column of a wider tensor, d_k = 5 and d_v = 20 (padded
    to 16 and 32 features), a non-contiguous upstream gradient."""
    B, H, n, D = 2, 2, 37, 3
    g = torch.Generator().manual_seed(3)

    def heads(length, d):
        return torch.randn(B, length, H, d, generator=g, dtype=torch.float64).to(DEVICE).transpose(1, 2)

    q, k, v = heads(n, 5), heads(n, 5), heads(n, 20)
    a = torch.randn(B, n, 3, generator=g, dtype=torch.float64).to(DEVICE)[..., 1]
    P = torch.randn(4 * D + 2, generator=g, dtype=torch.float64).to(DEVICE)[::2]
    U = torch.randn(H, generator=g, dtype=torch.float64).to(DEVICE)
    inputs = [t.requires_grad_() for t in (q, k, v, a, P, U)]
    out = dman_triton(*inputs, causal=True, key_padding_mask=None, q_offset=0, dropout_p=0.0, mask_floor=None)
    grad_out = torch.randn(B, n, H, 20, generator=g, dtype=torch.float64).to(DEVICE).transpose(1, 2)
    grads = torch.autograd.grad(out, inputs, grad_out)
    ref = dynamic_mask_attention_reference(*inputs, causal=True)[0]
    ref_grads = torch.autograd.grad(ref, inputs, grad_out)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-8)
    for name, grad, ref_grad in zip(GRAD_NAMES, grads, ref_grads):
        torch.testing.assert_close(grad, ref_grad, atol=1e-10, rtol=1e-8, msg=lambda s, name=name: f"d{name}: {s}")


def test_empty_sequences():
    for n, m in ((0, 5), (5, 0)):
        inputs = make_inputs(n, m, 2)
        out = dman_triton(*inputs, causal=False, key_padding_mask=None, q_offset=0, dropout_p=0.0, mask_floor=None)
        assert out.shape == (2, 2, n, 8) and (out == 0).all()
        grads = torch.autograd.grad(out.sum(), inputs, allow_unused=True)
        assert all(grad is not None and (grad == 0).all() for grad in grads)


def test_autocast_is_switched_off_inside():
    inputs = make_inputs(17, 17, 2, dtype=torch.float32)
    plain = dman_triton(*inputs, causal=True, key_padding_mask=None, q_offset=0, dropout_p=0.0, mask_floor=None)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        cast = dman_triton(*inputs, causal=True, key_padding_mask=None, q_offset=0, dropout_p=0.0, mask_floor=None)
    assert cast.dtype == torch.float32
    torch.testing.assert_close(cast, plain, atol=0, rtol=0)


def test_mask_floor_matches_reference_and_stops_gradients():
    n = m = 70
    inputs = make_inputs(n, m, 3, logit_shift=-6.0)
    z = dynamic_mask_logits(*(t.detach() for t in inputs[3:]), kv_len=m)
    floored = torch.sigmoid(z) < 1e-3
    assert 0.05 < floored.float().mean() < 0.95  # some masks below the floor, some above
    assert_matches(inputs, mask_floor=1e-3, atol=1e-10, rtol=1e-8)
    assert_matches(inputs, mask_floor=1e-3, causal=True, atol=1e-10, rtol=1e-8)


def test_gate_that_underflows_in_sigmoid_form_stays_exact():
    """log M enters in log form: logits of −800 (σ underflows to 0 even in float64) still weight the keys."""
    inputs = make_inputs(37, 37, 3)
    with torch.no_grad():
        inputs[3].sub_(800.0)
    out = dman_triton(*inputs, causal=False, key_padding_mask=None, q_offset=0, dropout_p=0.0, mask_floor=None)
    assert torch.isfinite(out).all() and out.abs().sum() > 0
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in inputs)


def test_float32_matches_reference():
    inputs = make_inputs(70, 70, 3, dtype=torch.float32)
    assert_matches(inputs, causal=True, atol=1e-5, rtol=1e-4)


def test_float16_with_float32_parameters_matches_reference():
    inputs = make_inputs(37, 37, 3, dtype=torch.float16, param_dtype=torch.float32)
    out, grads = assert_matches(inputs, atol=2e-2, rtol=2e-2)
    assert out.dtype == torch.float16
    assert [g.dtype for g in grads] == [torch.float16] * 3 + [torch.float32] * 3


def test_gradcheck_float64():
    inputs = make_inputs(20, 20, 2, B=1, H=2, d_k=4, d_v=3)
    kpm = torch.zeros(1, 20, dtype=torch.bool, device=DEVICE)
    kpm[0, 5] = True

    def f(*xs):
        return dman_triton(*xs, causal=True, key_padding_mask=kpm, q_offset=2, dropout_p=0.0, mask_floor=None)

    assert torch.autograd.gradcheck(f, inputs, fast_mode=True)


def test_gradcheck_float64_with_dropout():
    inputs = make_inputs(20, 20, 2, B=1, H=2, d_k=4, d_v=3)

    def f(*xs):
        torch.manual_seed(0)  # every evaluation draws the same keep-mask
        return dman_triton(*xs, causal=False, key_padding_mask=None, q_offset=0, dropout_p=0.3, mask_floor=None)

    assert torch.autograd.gradcheck(f, inputs, fast_mode=True)


def _dropout_run(inputs, p, seed=3):
    torch.manual_seed(seed)
    return dman_triton(*inputs, causal=True, key_padding_mask=None, q_offset=0, dropout_p=p, mask_floor=None)


def test_dropout_keeps_a_stable_fraction_and_matches_reference_with_that_mask():
    n, m, p = 37, 16, 0.5
    inputs = make_inputs(n, m, 3, d_v=16)
    with torch.no_grad():  # v = identity: the output row is the dropped probabilities themselves
        eye = torch.eye(m, dtype=torch.float64, device=DEVICE).expand(2, 2, m, m)
        probe = _dropout_run([*inputs[:2], eye, *inputs[3:]], p)
    ref_out, probs, _ = dynamic_mask_attention_reference(*(t.detach() for t in inputs), causal=True)
    allowed = probs > 0
    keep = probe > 0
    assert not keep[~allowed].any()
    fraction = keep[allowed].double().mean().item()
    assert abs(fraction - (1 - p)) < 0.06  # 1888 allowed scores: ±5 standard deviations
    torch.testing.assert_close(probe[keep], probs[keep] / (1 - p), atol=1e-12, rtol=1e-10)  # inverted dropout

    out = _dropout_run(inputs, p)  # same seed: the same mask
    assert (out.double() - ref_out).abs().max() > 1e-3  # dropout changed the output
    grad_out = torch.randn(out.shape, dtype=torch.float64, device=DEVICE)
    grads = torch.autograd.grad(out, inputs, grad_out)
    ref = dynamic_mask_attention_reference(*inputs, causal=True)[1]
    expected = torch.matmul(ref * keep / (1 - p), inputs[2])
    ref_grads = torch.autograd.grad(expected, inputs, grad_out)
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-8)
    for name, grad, ref_grad in zip(GRAD_NAMES, grads, ref_grads):
        torch.testing.assert_close(grad, ref_grad, atol=1e-10, rtol=1e-8, msg=lambda s, name=name: f"d{name}: {s}")

    other = _dropout_run(inputs, p, seed=4)
    assert not torch.equal(other, out)  # a new seed, a new mask


def test_backward_is_deterministic():
    inputs = make_inputs(70, 70, 3, B=1, dtype=torch.float32)
    kpm = padding("tail", 2, 70)[:1]

    def grads():
        torch.manual_seed(5)
        out = dman_triton(*inputs, causal=False, key_padding_mask=kpm, q_offset=0, dropout_p=0.2, mask_floor=None)
        return torch.autograd.grad(out, inputs, torch.ones_like(out))

    first, second = grads(), grads()
    for name, a, b in zip(GRAD_NAMES, first, second):
        assert torch.equal(a, b), name


def test_compiles_fullgraph_dynamic_once_over_lengths():
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")

    def f(q, k, v, a, P, U, q_offset):
        return dman_triton(q, k, v, a, P, U, causal=True, key_padding_mask=None, q_offset=q_offset, dropout_p=0.0,
                           mask_floor=1e-4)

    compiled = torch.compile(f, fullgraph=True, dynamic=True, backend=counter)
    for n, q_offset in ((17, 0), (37, 3), (50, 20)):  # queries after a cache of q_offset keys
        inputs = make_inputs(n, n + q_offset, 3, B=1, dtype=torch.float32)
        out = compiled(*inputs, q_offset)
        grads = torch.autograd.grad(out, inputs, torch.ones_like(out))
        eager = f(*inputs, q_offset)
        eager_grads = torch.autograd.grad(eager, inputs, torch.ones_like(eager))
        torch.testing.assert_close(out, eager, atol=0, rtol=0)
        for name, a, b in zip(GRAD_NAMES, grads, eager_grads):
            torch.testing.assert_close(a, b, atol=0, rtol=0, msg=lambda s, name=name: f"d{name}: {s}")
    assert counter.frame_count <= 2, counter.frame_count


def test_unsupported_reasons():
    from maskattn.kernels.triton.dman import unsupported

    assert unsupported(device=DEVICE, dtype=torch.float32, head_dims={"d_k": 64, "d_v": 64}) == []
    wide = unsupported(device=DEVICE, dtype=torch.float32, head_dims={"d_k": 512, "d_v": 64})
    assert len(wide) == 1 and "d_k = 512" in wide[0]
    assert unsupported(device="mps", dtype=torch.float32, head_dims={"d_k": 64, "d_v": 64})
    assert unsupported(device=DEVICE, dtype=torch.int32, head_dims={"d_k": 64, "d_v": 64})


def test_distance_gradient_reduction_maps_slots_to_clipped_buckets():
    """_distance_gradient against a direct scatter of the same diagonal sums (q_offset not a tile multiple)."""
    from maskattn.kernels.triton.dman import _distance_gradient, near_offsets

    block, D, q_offset = 4, 5, 3
    r_lo, r_hi = near_offsets(D, q_offset, block)
    slots = r_hi - r_lo + 1
    g = torch.Generator().manual_seed(0)
    near = torch.randn(3, 2, slots, 2 * block, generator=g, dtype=torch.float64)
    near[..., -1] = 0  # the padding column
    far = torch.randn(3, 2, 2, generator=g, dtype=torch.float64)
    expected = torch.zeros(2 * D + 1, dtype=torch.float64)
    totals = near.sum((0, 1))
    for slot in range(slots):
        r = r_lo + slot
        lowest = r * block + q_offset - (block - 1)
        assert lowest < D and lowest + 2 * block - 2 > -D  # every slot is near: a distance inside (−D, D)
        for c in range(2 * block - 1):
            expected[min(max(lowest + c, -D), D) + D] += totals[slot, c]
    expected[2 * D] += far.sum((0, 1))[0]
    expected[0] += far.sum((0, 1))[1]
    torch.testing.assert_close(_distance_gradient(near, far, r_lo, q_offset, D, block), expected)
    assert math.isclose(float(expected.sum()), float(totals.sum() + far.sum()), rel_tol=1e-12)
