"""The Triton DMAN kernels (maskattn.kernels.triton.dman) against the float64 reference of MAN Eq. 4 + 12.

On a CUDA machine (without TRITON_INTERPRET) they run the compiled kernels on cuda tensors, comparing in float32 (the
kernels take no float64 there: tests/_triton_device.py).

Without a GPU they run under Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1), with 16 × 16 tiles,
so the lengths 37, 70 and 130 cross tile edges, and small distance tables (D = 2, 3) give key tiles wholly beyond
the clip distance on both sides (the kernels' one-gate-per-row path) next to the near tiles."""

import math

import pytest
import torch

from _triton_device import (BF16_U, DEVICE, EXACT, assert_within_roundings, gpu_operand_dtypes, interpreter_only,
                            needs_kernels, tol)
from maskattn.errors import ArgumentError
from maskattn.functional.dman import dynamic_mask_attention_reference, dynamic_mask_logits

pytestmark = needs_kernels
GRAD_NAMES = ("q", "k", "v", "a", "P", "U")


def dman_triton(*args, **kwargs):
    from maskattn.kernels.triton.dman import dman_triton as kernel

    return kernel(*args, **kwargs)


def make_inputs(n, m, D, *, B=2, H=2, d_k=8, d_v=8, dtype=EXACT, param_dtype=None, logit_shift=0.0,
                seed=1):
    g = torch.Generator().manual_seed(seed)
    param_dtype = dtype if param_dtype is None else param_dtype

    def rand(*shape, dt=dtype, shift=0.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) + shift).to(DEVICE, dt).requires_grad_()

    return [rand(B, H, n, d_k), rand(B, H, m, d_k), rand(B, H, m, d_v), rand(B, n, dt=param_dtype, shift=logit_shift),
            rand(2 * D + 1, dt=param_dtype), rand(H, dt=param_dtype)]


def run_both(inputs, *, causal=False, kpm=None, q_offset=0, mask_floor=None, reference_logit_shift=0.0):
    """(out, grads) of the kernel and of the float64 reference for the same upstream gradient; the reference's query
    logits ``a`` are the kernel's plus ``reference_logit_shift``."""
    out = dman_triton(*inputs, causal=causal, key_padding_mask=kpm, q_offset=q_offset, dropout_p=0.0,
                      mask_floor=mask_floor)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64).to(DEVICE)
    grads = torch.autograd.grad(out, inputs, grad_out.to(out.dtype))
    exact = [x.detach().double() for x in inputs]
    exact[3] = exact[3] + reference_logit_shift
    exact = [x.requires_grad_() for x in exact]  # float64 leaves: float64 gradients
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
                   atol=tol(1e-10), rtol=tol(1e-8))


def test_rows_without_an_allowed_key_are_zero_with_zero_finite_gradients():
    n = m = 37
    inputs = make_inputs(n, m, 3)
    kpm = torch.zeros(2, m, dtype=torch.bool, device=DEVICE)
    kpm[0, 0] = True  # causal: query 0 of sequence 0 sees only key 0, padded
    kpm[1] = True  # sequence 1: every key padded
    out, grads = assert_matches(inputs, causal=True, kpm=kpm, atol=tol(1e-10), rtol=tol(1e-8))
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
        return torch.randn(B, length, H, d, generator=g, dtype=torch.float64).to(DEVICE, EXACT).transpose(1, 2)

    q, k, v = heads(n, 5), heads(n, 5), heads(n, 20)
    a = torch.randn(B, n, 3, generator=g, dtype=torch.float64).to(DEVICE, EXACT)[..., 1]
    P = torch.randn(4 * D + 2, generator=g, dtype=torch.float64).to(DEVICE, EXACT)[::2]
    U = torch.randn(H, generator=g, dtype=torch.float64).to(DEVICE, EXACT)
    inputs = [t.requires_grad_() for t in (q, k, v, a, P, U)]
    out = dman_triton(*inputs, causal=True, key_padding_mask=None, q_offset=0, dropout_p=0.0, mask_floor=None)
    grad_out = torch.randn(B, n, H, 20, generator=g, dtype=torch.float64).to(DEVICE, EXACT).transpose(1, 2)
    grads = torch.autograd.grad(out, inputs, grad_out)
    ref = dynamic_mask_attention_reference(*inputs, causal=True)[0]
    ref_grads = torch.autograd.grad(ref, inputs, grad_out)
    torch.testing.assert_close(out, ref, atol=tol(1e-10), rtol=tol(1e-8))
    for name, grad, ref_grad in zip(GRAD_NAMES, grads, ref_grads):
        torch.testing.assert_close(grad, ref_grad, atol=tol(1e-10), rtol=tol(1e-8), msg=lambda s, name=name: f"d{name}: {s}")


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
    assert_matches(inputs, mask_floor=1e-3, atol=tol(1e-10), rtol=tol(1e-8))
    assert_matches(inputs, mask_floor=1e-3, causal=True, atol=tol(1e-10), rtol=tol(1e-8))


def test_gate_that_underflows_in_sigmoid_form_stays_exact():
    """log M enters in log form: with logits near −800 (σ underflows to 0 even in float64) the kernel weights the
    keys as the float64 reference does 200 higher, near −600, where σ is still a float64 number — log σ(z) = z to
    rounding at both, and a shift of the query logit ``a`` is one constant per row, which each row's normalisation
    cancels (output and every gradient equal)."""
    inputs = make_inputs(37, 37, 3, logit_shift=-800.0)
    logits = dynamic_mask_logits(*(x.detach().double() for x in inputs[3:]))
    assert (torch.sigmoid(logits) == 0).all() and (torch.sigmoid(logits + 200.0) > 0).all()
    # on CUDA the kernel rounds z ≈ −800 in float32 (ulp 6·10⁻⁵), which moves each weight by that much relatively
    atol = 1e-10 if EXACT == torch.float64 else 1e-3
    assert_matches(inputs, reference_logit_shift=200.0, atol=atol, rtol=atol)
    assert_matches(inputs, reference_logit_shift=200.0, causal=True, atol=atol, rtol=atol)


def test_float32_matches_reference():
    inputs = make_inputs(70, 70, 3, dtype=torch.float32)
    assert_matches(inputs, causal=True, atol=1e-5, rtol=1e-4)


def test_float16_with_float32_parameters_matches_reference():
    inputs = make_inputs(37, 37, 3, dtype=torch.float16, param_dtype=torch.float32)
    out, grads = assert_matches(inputs, atol=2e-2, rtol=2e-2)
    assert out.dtype == torch.float16
    assert [g.dtype for g in grads] == [torch.float16] * 3 + [torch.float32] * 3


@interpreter_only  # gradcheck needs float64
def test_gradcheck_float64():
    inputs = make_inputs(20, 20, 2, B=1, H=2, d_k=4, d_v=3)
    kpm = torch.zeros(1, 20, dtype=torch.bool, device=DEVICE)
    kpm[0, 5] = True

    def f(*xs):
        return dman_triton(*xs, causal=True, key_padding_mask=kpm, q_offset=2, dropout_p=0.0, mask_floor=None)

    assert torch.autograd.gradcheck(f, inputs, fast_mode=True)


@interpreter_only
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
        eye = torch.eye(m, dtype=EXACT, device=DEVICE).expand(2, 2, m, m)
        probe = _dropout_run([*inputs[:2], eye, *inputs[3:]], p)
    ref_out, probs, _ = dynamic_mask_attention_reference(*(t.detach() for t in inputs), causal=True)
    allowed = probs > 0
    keep = probe > 0
    assert not keep[~allowed].any()
    fraction = keep[allowed].double().mean().item()
    assert abs(fraction - (1 - p)) < 0.06  # 1888 allowed scores: ±5 standard deviations
    torch.testing.assert_close(probe[keep], probs[keep] / (1 - p), atol=tol(1e-12), rtol=tol(1e-10))  # inverted dropout

    out = _dropout_run(inputs, p)  # same seed: the same mask
    assert (out.double() - ref_out).abs().max() > 1e-3  # dropout changed the output
    grad_out = torch.randn(out.shape, dtype=EXACT, device=DEVICE)
    grads = torch.autograd.grad(out, inputs, grad_out)
    ref = dynamic_mask_attention_reference(*inputs, causal=True)[1]
    expected = torch.matmul(ref * keep / (1 - p), inputs[2])
    ref_grads = torch.autograd.grad(expected, inputs, grad_out)
    torch.testing.assert_close(out, expected, atol=tol(1e-10), rtol=tol(1e-8))
    for name, grad, ref_grad in zip(GRAD_NAMES, grads, ref_grads):
        torch.testing.assert_close(grad, ref_grad, atol=tol(1e-10), rtol=tol(1e-8), msg=lambda s, name=name: f"d{name}: {s}")

    other = _dropout_run(inputs, p, seed=4)
    assert not torch.equal(other, out)  # a new seed, a new mask


def test_backward_is_deterministic():
    """Two backward passes with the same dropout seed give bit-identical gradients (no atomics). Under Triton's
    interpreter the programs of a launch run one after another, always in the same order, so on the CPU this fails
    only on a dropout mask that is not reproduced; an ordering dependence shows in tests/test_triton_program_order.py,
    which runs the programs in reversed order too."""
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


@pytest.mark.parametrize("block_m, block_n", [(4, 4), (8, 4), (16, 4)])
def test_distance_gradient_reduction_maps_slots_to_clipped_buckets(block_m, block_n):
    """_distance_gradient against a direct scatter of the same diagonal sums (q_offset not a tile multiple), with
    the slots :func:`square_offsets` gives square tiles and query tiles of several squares (whose outer squares may
    lie wholly beyond ``±D``: their sums go to the edge entries)."""
    from maskattn.kernels.triton.dman import _distance_gradient, square_offsets

    D, q_offset = 5, 3
    r_lo, r_hi = square_offsets(D, q_offset, block_m, block_n)
    slots = r_hi - r_lo + 1
    g = torch.Generator().manual_seed(0)
    near = torch.randn(3, 2, slots, 2 * block_n, generator=g, dtype=torch.float64)
    near[..., -1] = 0  # the padding column
    far = torch.randn(3, 2, 2, generator=g, dtype=torch.float64)
    expected = torch.zeros(2 * D + 1, dtype=torch.float64)
    totals = near.sum((0, 1))
    for slot in range(slots):
        lowest = (r_lo + slot) * block_n + q_offset - (block_n - 1)
        if block_m == block_n:  # square tiles: every slot is a near tile's (a distance inside (−D, D))
            assert lowest < D and lowest + 2 * block_n - 2 > -D
        for c in range(2 * block_n - 1):
            expected[min(max(lowest + c, -D), D) + D] += totals[slot, c]
    expected[2 * D] += far.sum((0, 1))[0]
    expected[0] += far.sum((0, 1))[1]
    torch.testing.assert_close(_distance_gradient(near, far, r_lo, q_offset, D, block_n), expected)
    assert math.isclose(float(expected.sum()), float(totals.sum() + far.sum()), rel_tol=1e-12)


@pytest.mark.parametrize("block_m, block_n", [(16, 16), (32, 16), (64, 16), (128, 32)])
@pytest.mark.parametrize("D, q_offset", [(1, 0), (3, 0), (5, 3), (20, 7), (40, 70)])
def test_square_offsets_cover_exactly_the_squares_of_near_tiles(block_m, block_n, D, q_offset):
    """The query pass writes the diagonal sums of every square of ``block_n`` queries in each near tile at slot
    ``square − key tile − r_min``: :func:`square_offsets` bounds those offsets tightly — over query and key tiles
    of a long sequence, near as the kernel decides (some distance ``t − s`` inside ``(−D, D)``), the smallest and
    largest offsets are exactly ``r_lo`` and ``r_hi``."""
    from maskattn.kernels.triton.dman import square_offsets

    r_lo, r_hi = square_offsets(D, q_offset, block_m, block_n)
    offsets = set()
    for qt in range(40):
        i0 = qt * block_m
        for kt in range(40 * block_m // block_n + 10):
            j0 = kt * block_n
            lowest, highest = q_offset + i0 - j0 - (block_n - 1), q_offset + i0 - j0 + block_m - 1
            if lowest < D and highest > -D:
                offsets.update(qt * (block_m // block_n) + g - kt for g in range(block_m // block_n))
    assert (min(offsets), max(offsets)) == (r_lo, r_hi)


@pytest.mark.parametrize("q_offset", [0, 7, 40])
def test_a_clip_distance_below_one_is_refused(q_offset):
    """issue 41 §1.5: the kernels' far tiles (every distance ``>= D`` or every one ``<= −D``) skip the causal mask
    assuming ``D >= 1``; with ``D = 0`` (a one-entry table) and a query offset later keys reached a row. The
    functional API refuses such a table; the kernel does too, with the same kind of error, naming the argument."""
    inputs = make_inputs(20, 20 + q_offset, 0, dtype=EXACT)
    with pytest.raises(ArgumentError, match=r"distance_bias must be .*max_distance >= 1.*got shape \(1,\)"):
        dman_triton(*inputs, causal=True, key_padding_mask=None, q_offset=q_offset, dropout_p=0.0, mask_floor=None)
    with pytest.raises(ArgumentError, match=r"got shape \(4,\)"):
        dman_triton(*inputs[:4], torch.zeros(4, dtype=EXACT, device=DEVICE), inputs[5], causal=True,
                    key_padding_mask=None, q_offset=q_offset, dropout_p=0.0, mask_floor=None)


@pytest.mark.parametrize("q_offset", [0, 7, 40])
def test_clip_distance_one_with_a_query_offset_leaks_no_later_key(q_offset):
    """``D = 1``, the smallest table, with queries after a cache of ``q_offset`` keys: every tile but the diagonal
    ones is far; outputs and gradients match the reference, and changing only later keys changes no row."""
    n, m = 20, 20 + q_offset
    inputs = make_inputs(n, m, 1, dtype=EXACT)
    assert_matches(inputs, causal=True, q_offset=q_offset, atol=tol(1e-10), rtol=tol(1e-8))
    q, k, v, *params = (t.detach() for t in inputs)
    out = dman_triton(q, k, v, *params, causal=True, key_padding_mask=None, q_offset=q_offset, dropout_p=0.0,
                      mask_floor=None)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, q_offset + 5:] += 3.0  # the keys after query 5 (absolute position q_offset + 5)
    v2[:, :, q_offset + 5:] -= 2.0
    changed = dman_triton(q, k2, v2, *params, causal=True, key_padding_mask=None, q_offset=q_offset, dropout_p=0.0,
                          mask_floor=None)
    torch.testing.assert_close(changed[:, :, :5], out[:, :, :5], atol=0, rtol=0)  # rows 0 … 4 see none of them


@interpreter_only
@pytest.mark.parametrize("causal, q_offset, pad", [(True, 0, None), (False, 5, "tail")])
def test_bfloat16_with_the_gpus_operand_dtypes_matches_float64(monkeypatch, causal, q_offset, pad):
    """issue 41 §1.6: bfloat16 as the GPU computes it (tests/_triton_device.py ``gpu_operand_dtypes``: bfloat16
    tensors, loads, stores and casts; every ``tl.dot`` operand bfloat16, products exact, float32 accumulation)
    against the float64 oracle on the same bfloat16 inputs and upstream gradient (:func:`_check_gpu_operand_dtypes`)."""
    _check_gpu_operand_dtypes(monkeypatch, causal, q_offset, pad)


def _check_gpu_operand_dtypes(monkeypatch, causal, q_offset, pad, d_k=8, d_v=8):
    """A bfloat16 call with the GPU's operand dtypes (heads of ``d_k`` / ``d_v`` features) against the float64
    oracle on the same bfloat16 inputs and upstream gradient.

    Tolerance, from bfloat16's unit roundoff u = 2⁻⁸: ``|error| <= 2·K·u·scale`` with K the bfloat16 roundings on
    the longest path — forward K = 2 (the probabilities before ``P·V``, the stored output); backward K = 4 (the
    recomputed probabilities before ``Pᵀ·dO``, ``dS`` before ``dS·K`` / ``dSᵀ·Q``, the stored output that
    ``Δ = dO·O`` reads, the stored gradient). ``scale`` is ``max |reference|`` for the outputs and q, k, v's
    gradients (normalised rows); the gradients of a, P, U are sums of ``dz`` over many scores, whose errors add up
    with the terms, not with the sum: there ``scale`` is the same sum of ``|dz|``, per entry — plus float32's
    accumulation where ``dz`` cancels to 0 (a row with one allowed key: ``dP = Δ``): ``dP = dO·vᵀ`` (the kernel's
    ``tl.dot``) and ``Δ = dO·O`` (the wrapper's sum) add up ``d_v`` products each in orders of their own, so what is
    left is their rounding, at most ``d_v·2⁻²⁴`` times the sum of the products' magnitudes per head (at d 150 a few
    10⁻⁷)."""
    from maskattn.functional import dman as functional_dman

    n, m = 37, 37 + q_offset
    inputs = make_inputs(n, m, 3, d_k=d_k, d_v=d_v, dtype=torch.bfloat16, param_dtype=torch.float32)
    kpm = padding(pad, 2, m)
    options = dict(causal=causal, key_padding_mask=kpm, q_offset=q_offset, dropout_p=0.0, mask_floor=None)
    with gpu_operand_dtypes():
        out = dman_triton(*inputs, **options)
        grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
        grads = torch.autograd.grad(out, inputs, grad_out)
    logits = []  # the oracle's z = a + P[clip] + U, to weigh the parameters' sums by |dz|
    monkeypatch.setattr(functional_dman, "dynamic_mask_logits",
                        lambda *args, _f=functional_dman.dynamic_mask_logits, **kw: logits.append(_f(*args, **kw))
                        or logits[-1])
    exact = [x.detach().double().requires_grad_() for x in inputs]
    ref = dynamic_mask_attention_reference(*exact, causal=causal, key_padding_mask=kpm, q_offset=q_offset)[0]
    z = logits[-1]
    *ref_grads, dz = torch.autograd.grad(ref, [*exact, z], grad_out.double(), retain_graph=True)
    sums = torch.autograd.grad(z, exact[3:], dz.abs())  # Σ |dz| per entry of a, P, U
    assert out.dtype == torch.bfloat16
    assert_within_roundings(out, ref, 2, "out")
    for name, grad, ref_grad in zip(GRAD_NAMES[:3], grads, ref_grads):
        assert_within_roundings(grad, ref_grad, 4, f"d{name}")
    heads, magnitudes = inputs[0].shape[1], inputs[2].abs().max().double() + out.abs().max().double()
    accumulation = heads * d_v * 2.0**-24 * (grad_out.double().abs().sum(-1) * magnitudes).max()
    for name, grad, ref_grad, total in zip(GRAD_NAMES[3:], grads[3:], ref_grads[3:], sums):
        error = (grad.double() - ref_grad).abs()
        assert (error <= 2 * 4 * BF16_U * total + accumulation).all(), f"d{name}: {(error / total).max():.3g}"
    float32_path = dman_triton(*inputs, **options)  # the interpreter's usual bfloat16-as-float32 computation
    assert not torch.equal(float32_path, out)  # the hook changed what ran


# --------------------------------------------------------------------------------------------------
# feature-axis tiling (issue 52): heads of 145–160 features as 128 + 32 feature blocks, not one block of 256
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("d_k, d_v, causal, q_offset, pad", [
    (150, 150, False, 0, "tail"),  # the sentence presets' heads: 160 = 128 + 32 on both axes
    (150, 150, True, 0, None),
    (150, 72, True, 5, "tail"),  # values of their own width: 80 = 64 + 16
    (64, 150, False, 7, None),  # one key block, split values
])
def test_split_widths_match_float64_reference(d_k, d_v, causal, q_offset, pad):
    """Heads whose padded width is not a power of two run as a main and a tail feature block (under the interpreter
    every such width splits: ``runtime.splits_features``; d 150 as 128 + 32): far tiles on both sides (D = 3),
    lengths across the 16 × 16 tiles, key padding, a query offset — outputs and every gradient (q, k, v, a, P, U)
    match the float64 reference, as at one-block widths."""
    n = 37
    m = n + q_offset
    inputs = make_inputs(n, m, 3, d_k=d_k, d_v=d_v)
    assert_matches(inputs, causal=causal, q_offset=q_offset, kpm=padding(pad, 2, m), atol=tol(1e-10),
                   rtol=tol(1e-8))


@interpreter_only
@pytest.mark.parametrize("causal, q_offset, pad", [(True, 0, None), (False, 5, "tail")])
def test_split_width_with_the_gpus_operand_dtypes_matches_float64(monkeypatch, causal, q_offset, pad):
    """issue 52 (deliverable 6): d 150 in bfloat16 with the GPU's operand dtypes, every pass on its 128 + 32
    feature blocks — within the one-block widths' bounds of the float64 oracle (:func:`_check_gpu_operand_dtypes`)."""
    _check_gpu_operand_dtypes(monkeypatch, causal, q_offset, pad, d_k=150, d_v=150)


@interpreter_only  # gradcheck needs float64
def test_gradcheck_at_a_split_width_with_dropout():
    """d 40 → 48 = 32 + 16 features (a split width small enough for gradcheck), attention dropout re-seeded before
    each evaluation, key padding and a query offset: backward is the exact gradient of the dropped-out forward
    through both blocks."""
    inputs = make_inputs(6, 9, 2, B=1, d_k=40, d_v=40)
    kpm = torch.zeros(1, 9, dtype=torch.bool, device=DEVICE)
    kpm[0, 7] = True

    def fn(*tensors):
        torch.manual_seed(0)
        return dman_triton(*tensors, causal=True, key_padding_mask=kpm, q_offset=3, dropout_p=0.3, mask_floor=None)

    assert torch.autograd.gradcheck(fn, tuple(inputs), fast_mode=True)
