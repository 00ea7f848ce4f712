"""MTSA's Triton kernel (maskattn.kernels.triton.tensorized) against the float64 reference, run on the CPU under
Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1 where there is no CUDA): outputs and every
gradient at lengths that are not multiples of the tile (the interpreter's tiles are 16), per-head bands, key
padding, rows without a key, both scales, dropout, float32 / float16 / float64, torch.compile. On a CUDA machine
(without TRITON_INTERPRET) the same tests run the compiled kernels on cuda tensors, comparing in float32
(tests/_triton_device.py)."""

from __future__ import annotations

import math

import pytest
import torch

from _triton_device import (DEVICE, EXACT, assert_within_roundings, gpu_operand_dtypes, interpreter_only, tol,
                            use_table_tiles)
from maskattn import MTSA, masks as M
from maskattn.functional import tensorized_attention, tensorized_attention_reference
from maskattn.kernels.triton import runtime
from maskattn.kernels.triton.tensorized import tensorized_triton

pytestmark = pytest.mark.skipif(not runtime.installed(), reason="needs the triton package")

HEADS = [M.forward_mask(False), M.backward_mask(), M.window(3), M.full()]  # a strict, a causal-like, a window, everything
STRICT_BANDS = [(math.inf, -1), (0, math.inf), (3, 3), (math.inf, math.inf)]


def inputs(B, H, n, d_k=8, d_v=12, dtype=EXACT, m=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    m = n if m is None else m
    shapes = ((B, H, n, d_k), (B, H, m, d_k), (B, H, m, d_v), (B, H, m, d_v))
    return [torch.randn(*shape, generator=g, dtype=torch.float64).to(DEVICE, dtype).requires_grad_()
            for shape in shapes]


def padding(B, n, keep):
    kpm = torch.zeros(B, n, dtype=torch.bool)
    for b, length in enumerate(keep):
        kpm[b, length:] = True
    return kpm.to(DEVICE)


def grads(out, tensors, seed=1):
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(out.device,
                                                                                                     out.dtype)
    return torch.autograd.grad(out, tensors, g)


@pytest.mark.parametrize("n, H, mask_kind, keep", [
    (1, 2, "directional", None),          # one position: every strict row is empty
    (37, 4, "multi", (37, 30)),           # 3 tiles, padding in the second sequence
    (70, 2, "directional", (70, 0)),      # a sequence that is all padding
    (130, 1, "window", (130, 129)),       # 9 tiles, the band skips most of them
])
@pytest.mark.parametrize("scale", ["log_sigmoid", "identity"])
def test_outputs_and_gradients_match_float64_reference(n, H, mask_kind, keep, scale):
    q, k, v, s2t = inputs(2, H, n)
    mask = {"directional": M.per_head([M.forward_mask(False)] * (H // 2 or 1) + [M.backward_mask(False)] * (H - (H // 2 or 1)))
            if H > 1 else M.forward_mask(False),
            "multi": M.per_head(HEADS), "window": M.window(5)}[mask_kind]
    kpm = None if keep is None else padding(2, n, keep)
    out = tensorized_attention(q, k, v, s2t, mask, scale=scale, key_padding_mask=kpm, backend="triton")
    expected = tensorized_attention_reference(q, k, v, s2t, mask, scale=scale, key_padding_mask=kpm)
    torch.testing.assert_close(out, expected, atol=tol(1e-12), rtol=tol(1e-10))
    for got, want in zip(grads(out, (q, k, v, s2t)), grads(expected, (q, k, v, s2t))):
        torch.testing.assert_close(got, want, atol=tol(1e-11), rtol=tol(1e-9))
    if keep is not None and keep[1] == 0:
        assert (out[1] == 0).all()


# heads of every kind: strict forward, a window(3), everything, a window of 33 positions (the widest narrow band) and
# one of 34 (too wide for the narrow tiles)
GROUPED_BANDS = [(math.inf, -1), (3, 3), (math.inf, math.inf), (0, 32), (16, 17)]


def test_window_heads_take_a_narrow_launch_of_their_own():
    """MTSA's heads share their launch's tiles: heads whose band spans at most NARROW_BAND positions (windows) run in
    a launch of their own of every pass with the table's narrow tiles (16 rows), their key (query) tiles starting
    where the band starts, so a window(3) head computes 32 keys per 16 queries instead of the directional heads'
    64–128-row tiles (docs/gpu/offline-perf.md); the other heads keep the wide tiles. Every head is in exactly one
    launch of each pass, and each launch has one program per tile, batch and head of its own."""
    from maskattn.kernels.triton.tensorized import head_groups, head_offsets

    assert head_groups(head_offsets(GROUPED_BANDS)) == [("", [0, 2, 4]), ("_narrow", [1, 3])]
    assert head_groups(head_offsets([(math.inf, 0)] * 2)) == [("", [0, 1])]
    assert head_groups(head_offsets([(2, 2)])) == [("_narrow", [0])]
    B, H, n = 2, len(GROUPED_BANDS), 96
    with runtime.recording(runtime.TARGETS[90]) as recorded:
        q, k, v, s2t = (torch.randn(B, n, H, 64).to(torch.bfloat16).transpose(1, 2).requires_grad_()
                        for _ in range(4))
        out, _ = tensorized_triton(q, k, v, s2t, GROUPED_BANDS, None, scale="log_sigmoid", dropout_p=0.0)
        torch.autograd.grad(out.float().sum(), (q, k, v, s2t))
    for kernel in ("tensorized_fwd", "tensorized_bwd_kv", "tensorized_bwd_q"):
        launches = [la for la in recorded if la.kernel.fn.__name__ == kernel]
        assert sorted(bool(la.kwargs["BAND_START"]) for la in launches) == [False, True], kernel
        for launch in launches:
            narrow = launch.kwargs["BAND_START"]
            tiles = runtime.TILE_TABLE[(kernel + ("_narrow" if narrow else ""), "227K", 64)]
            assert (launch.kwargs["BLOCK_M"], launch.kwargs["BLOCK_N"], launch.kwargs["num_warps"]) == (
                tiles.block_m, tiles.block_n, tiles.warps), (kernel, narrow)
            heads = dict(zip(launch.kernel.arg_names, launch.args))["HEADS"].tolist()
            assert heads == ([1, 3] if narrow else [0, 2, 4]), (kernel, narrow)
            held = tiles.block_n if kernel == "tensorized_bwd_kv" else tiles.block_m
            assert launch.grid == (runtime.cdiv(n, held) * B * len(heads),), (kernel, narrow)


@pytest.mark.parametrize("scale, width", [("log_sigmoid", 64), ("identity", 64), ("log_sigmoid", 128)])
def test_heads_in_two_launches_with_the_gpus_tiles_match_float64_reference(monkeypatch, scale, width):
    """The launches of :func:`test_window_heads_take_a_narrow_launch_of_their_own` with the tiles sm_90 runs at head
    width ``width`` (64 — wide: 64 × 64, 32 × 128 and 64 × 64; narrow: 16 × 32 started at the band start, 32 queries
    × 16 keys; 128 — the key pass holds 128 keys and streams 16 queries) under the interpreter: outputs and every
    gradient match the float64 reference, with key padding and lengths that end inside a tile; and a second backward
    is bit-identical (no atomics: the two launches write disjoint heads)."""
    use_table_tiles(monkeypatch, "tensorized", "227K", width)
    q, k, v, s2t = inputs(2, len(GROUPED_BANDS), 70)
    mask = M.per_head([M.forward_mask(False), M.window(3), M.full(), M.band(0, 32), M.band(16, 17)])
    kpm = padding(2, 70, (70, 61))
    out = tensorized_attention(q, k, v, s2t, mask, scale=scale, key_padding_mask=kpm, backend="triton")
    expected = tensorized_attention_reference(q, k, v, s2t, mask, scale=scale, key_padding_mask=kpm)
    torch.testing.assert_close(out, expected, atol=tol(1e-12), rtol=tol(1e-10))
    first = grads(out, (q, k, v, s2t))
    for got, want in zip(first, grads(expected, (q, k, v, s2t))):
        torch.testing.assert_close(got, want, atol=tol(1e-11), rtol=tol(1e-9))
    again = tensorized_attention(q, k, v, s2t, mask, scale=scale, key_padding_mask=kpm, backend="triton")
    for a, b in zip(first, grads(again, (q, k, v, s2t))):
        assert torch.equal(a, b)


def test_rows_without_a_key_are_zero_with_zero_finite_gradients():
    q, k, v, s2t = inputs(2, 2, 20, dtype=torch.float32)
    kpm = padding(2, 20, (20, 0))
    out = tensorized_attention(q, k, v, s2t, M.per_head([M.forward_mask(False), M.backward_mask(False)]), key_padding_mask=kpm,
                               backend="triton")
    assert (out[0, 0, 0] == 0).all() and (out[0, 1, -1] == 0).all()  # strict masks: the first / last row
    assert (out[1] == 0).all()  # every key is padding
    out.square().sum().backward()
    for t in (q, k, v, s2t):
        assert torch.isfinite(t.grad).all()
    assert (q.grad[1] == 0).all() and (k.grad[1] == 0).all() and (v.grad[1] == 0).all()


def test_cross_lengths_and_wide_heads():
    """n ≠ m (queries against a longer key sequence) and head dims that are not powers of two."""
    q, k, v, s2t = inputs(1, 2, 19, d_k=20, d_v=33, m=45)
    mask = M.per_head([M.forward_mask(), M.window(4)])
    out = tensorized_attention(q, k, v, s2t, mask, backend="triton")
    torch.testing.assert_close(out, tensorized_attention_reference(q, k, v, s2t, mask), atol=tol(1e-12), rtol=tol(1e-10))


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-5), (torch.float16, 4e-3)])
def test_float32_and_float16_match_the_reference(dtype, tol):
    q, k, v, s2t = inputs(2, 4, 45)
    with torch.no_grad():
        s2t.mul_(4.0)  # spread the source2token scores: float16's range ends ~10 below the maximum
    kpm = padding(2, 45, (45, 40))
    mask = M.per_head(HEADS)
    low = [t.detach().to(dtype).requires_grad_() for t in (q, k, v, s2t)]
    exact = [t.detach().double().requires_grad_() for t in low]  # the same (rounded) inputs, in float64
    out = tensorized_attention(*low, mask, key_padding_mask=kpm, backend="triton")
    assert out.dtype == dtype
    expected = tensorized_attention_reference(*exact, mask, key_padding_mask=kpm)
    torch.testing.assert_close(out.double(), expected, atol=tol, rtol=tol)
    for got, want in zip(grads(out, low), grads(expected, exact)):
        torch.testing.assert_close(got.double(), want, atol=20 * tol, rtol=20 * tol)


@interpreter_only  # gradcheck needs float64
def test_gradcheck_float64():
    q, k, v, s2t = inputs(2, 2, 6, d_k=3, d_v=2)
    kpm = padding(2, 6, (6, 4))
    for scale in ("log_sigmoid", "identity"):
        fn = lambda *t, scale=scale: tensorized_triton(*t, STRICT_BANDS[:2], kpm, scale=scale, dropout_p=0.0)[0]  # noqa: E731
        assert torch.autograd.gradcheck(fn, (q, k, v, s2t), fast_mode=True)


@interpreter_only  # gradcheck needs float64
def test_gradcheck_with_dropout_redraws_the_same_mask():
    """Re-seeded before every evaluation, the kernel draws the same masks (Philox by position inside, and the
    (key, feature) mask of v ⊙ E), so backward must be the exact gradient of the dropped-out forward."""
    q, k, v, s2t = inputs(1, 2, 7, d_k=3, d_v=2)

    def fn(*tensors):
        torch.manual_seed(0)
        return tensorized_triton(*tensors, [(math.inf, 0), (2, 2)], None, scale="log_sigmoid", dropout_p=0.4)[0]

    assert torch.autograd.gradcheck(fn, (q, k, v, s2t), fast_mode=True)


def test_dropout_drops_the_numerator_only_and_keeps_the_expectation():
    q, k, v, s2t = inputs(1, 2, 10, d_k=4, d_v=3)
    bands = [(math.inf, 0), (0, math.inf)]
    with torch.no_grad():
        clean, _ = tensorized_triton(q, k, v, s2t, bands, None, scale="log_sigmoid", dropout_p=0.0)
        samples = torch.stack([tensorized_triton(q, k, v, s2t, bands, None, scale="log_sigmoid", dropout_p=0.5)[0]
                               for _ in range(150)])
        # with v = 1 the numerator (dropped) and the denominator (not dropped) differ only by the dropout
        ones, _ = tensorized_triton(q, k, torch.ones_like(v), s2t, bands, None, scale="log_sigmoid", dropout_p=0.5)
    assert not torch.allclose(samples[0], samples[1])
    torch.testing.assert_close(samples.mean(0), clean, atol=0.3, rtol=0.0)
    assert not torch.allclose(ones, torch.ones_like(ones))  # dropout reached the numerator…
    assert (ones >= 0).all()  # …and nothing else: numerator ≥ 0 over an undropped, positive denominator


def test_repeated_backward_is_bit_identical():
    q, k, v, s2t = inputs(1, 2, 40, dtype=torch.float32)
    mask = M.per_head([M.forward_mask(), M.backward_mask()])
    first = grads(tensorized_attention(q, k, v, s2t, mask, backend="triton"), (q, k, v, s2t))
    second = grads(tensorized_attention(q, k, v, s2t, mask, backend="triton"), (q, k, v, s2t))
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@interpreter_only  # on CUDA those rows are left at 0 (no host synchronisation)
def test_underflowed_rows_are_recomputed_exactly_on_the_cpu():
    """Source2token scores spread ±1e4: after the shift by the feature's maximum almost every denominator
    underflows; eager on the CPU those rows are recomputed in log space (docs/design.md §3), as on sdpa."""
    q, k, v, s2t = inputs(2, 2, 12, dtype=torch.float64)
    with torch.no_grad():
        s2t.copy_(torch.rand_like(s2t) * 2e4 - 1e4)
    mask = M.per_head([M.forward_mask(False), M.backward_mask()])
    out = tensorized_attention(*(t.float() for t in (q, k, v, s2t)), mask, backend="triton")
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), tensorized_attention_reference(q, k, v, s2t, mask), atol=1e-4, rtol=1e-4)


def test_compiles_into_one_graph_for_every_length():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    # a window head too: its narrow launch of its own (head_groups) runs inside the same custom op
    mask = M.per_head([M.forward_mask(), M.backward_mask(False), M.window(3)])
    compiled = torch.compile(lambda *t: tensorized_attention(*t, mask, backend="triton"), fullgraph=True,
                             dynamic=True, backend="aot_eager")
    for n in (5, 17, 23):
        q, k, v, s2t = inputs(1, 3, n, d_k=4, d_v=4, dtype=torch.float32, seed=n)
        out = compiled(q, k, v, s2t)
        eager = tensorized_attention(q, k, v, s2t, mask, backend="triton")
        torch.testing.assert_close(out, eager)
        for a, b in zip(grads(out, (q, k, v, s2t)), grads(eager, (q, k, v, s2t))):
            torch.testing.assert_close(a, b)
    assert counters["stats"]["unique_graphs"] <= 2


def test_bfloat16_autocast_runs_through_the_kernel():
    """Under CPU bf16 autocast the projections give bfloat16; the interpreter computes it in float32 (its bf16
    tl.dot is wrong) and the kernel returns bfloat16 with gradients in the inputs' dtypes, close to float32."""
    module = MTSA(32, 4, backend="triton").to(DEVICE)
    x = torch.randn(2, 21, 32).to(DEVICE).requires_grad_()
    kpm = padding(2, 21, (21, 15))
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        out = module(x, kpm)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    out.float().square().sum().backward()
    assert all(p.dtype == torch.float32 and torch.isfinite(p.grad).all() for p in module.parameters())
    reference = MTSA(32, 4, backend="reference").to(DEVICE)
    reference.load_state_dict(module.state_dict())
    expected = reference(x.detach(), kpm)
    assert (out.float() - expected).norm() <= 0.02 * expected.norm()


@interpreter_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scale", ["log_sigmoid", "identity"])
def test_half_precision_with_the_gpus_operand_dtypes_matches_float64(dtype, scale):
    """issue 41 §1.6: bfloat16 and float16 inputs as the GPU computes them (tests/_triton_device.py
    ``gpu_operand_dtypes``): q, k in the inputs' dtype and ``E``, ``v ⊙ E``, the weights and ``dN = dO / D``,
    ``dD = −dN ⊙ out`` in bfloat16 (:func:`maskattn.kernels.triton.runtime.value_dtype`: float16's range ends ~10
    below the largest score), products exact, float32 accumulation — against the float64 oracle on the same
    rounded inputs and upstream gradient, with source2token scores spread ×4 (E over a range float16 could not
    hold).

    Tolerance, from bfloat16's unit roundoff u = 2⁻⁸ (float16's, 2⁻¹¹, is smaller; bfloat16's bounds both):
    ``max |error| <= 2·K·u·max |reference|`` with K the roundings on the longest path — forward K = 3 (``E`` /
    ``v ⊙ E``, the weights before ``W·[v⊙E; E]``, the stored output); backward K = 6 (``dN`` / ``dD``, the stored
    output that ``dD`` reads, the recomputed weights, ``dR`` before ``dR·K`` / ``dRᵀ·Q``, ``E`` / ``v ⊙ E``, the
    stored gradient)."""
    q, k, v, s2t = inputs(2, 4, 45, dtype=torch.float64)
    with torch.no_grad():
        s2t.mul_(4.0)
    low = [t.detach().to(dtype).requires_grad_() for t in (q, k, v, s2t)]
    kpm = padding(2, 45, (45, 40))
    with gpu_operand_dtypes():
        out, _ = tensorized_triton(*low, STRICT_BANDS, kpm, scale=scale, dropout_p=0.0)
        grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
        got = torch.autograd.grad(out, low, grad_out)
    exact = [t.detach().double().requires_grad_() for t in low]
    expected = tensorized_attention_reference(*exact, M.per_head(HEADS), scale=scale, key_padding_mask=kpm)
    assert out.dtype == dtype
    assert_within_roundings(out, expected, 3, "out")
    for name, grad, want in zip(("q", "k", "v", "s2t"), got, torch.autograd.grad(expected, exact, grad_out.double())):
        assert grad.dtype == dtype
        assert_within_roundings(grad, want, 6, f"d{name}")
    float32_path, _ = tensorized_triton(*low, STRICT_BANDS, kpm, scale=scale, dropout_p=0.0)
    assert not torch.equal(float32_path, out)  # the hook changed what ran
