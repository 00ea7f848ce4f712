"""MTSA's Triton kernel (maskattn.kernels.triton.tensorized) against the float64 reference, run on the CPU under
Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1 where there is no CUDA): outputs and every
gradient at lengths that are not multiples of the tile (the interpreter's tiles are 16), per-head bands, key
padding, rows without a key, both scales, dropout, float32 / float16 / float64, torch.compile. On a CUDA machine
(without TRITON_INTERPRET) the same tests run the compiled kernels on cuda tensors, comparing in float32
(tests/_triton_device.py)."""

from __future__ import annotations

import inspect
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
    is bit-identical (no atomics: the two launches write disjoint heads; under the interpreter, where the programs
    run one after another in one order, only a dropout mask that is not reproduced can fail that:
    tests/test_triton_program_order.py reverses the order)."""
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
    """Two backward passes give the same gradients bit for bit. Under Triton's interpreter the programs of a launch
    run one after another, always in the same order, so on the CPU this fails only on a dropout mask that is not
    reproduced; an ordering dependence shows in tests/test_triton_program_order.py, which runs the programs in
    reversed order too."""
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


# --------------------------------------------------------------------------------------------------
# feature-axis tiling (issue 52): a width that is not a power of two as a main and a tail block
# --------------------------------------------------------------------------------------------------

def test_feature_split_of_the_head_widths():
    """A padded width that is not a power of two is the largest power of two below it and the next power of two (at
    least 16) above the rest: d 150 → 160 = 128 + 32, 72 / 80 → 64 + 16, 96 → 64 + 32, 33 → 48 = 32 + 16; a power
    of two is one block (no tail); and where two blocks would cover as much as the power of two above (208 → 256)
    it stays one. MTSA's tensors are laid out at the blocks' width (``feature_width``: 176 → 192)."""
    split = {150: (128, 32), 160: (128, 32), 72: (64, 16), 80: (64, 16), 96: (64, 32), 33: (32, 16), 176: (128, 64),
             64: (64, 0), 128: (128, 0), 8: (16, 0), 112: (128, 0), 208: (256, 0), 256: (256, 0)}
    for d, blocks in split.items():
        assert runtime.feature_split(runtime.padded_head_dim(d)) == blocks, d
    assert [runtime.feature_width(d) for d in (150, 72, 96, 176, 112, 208, 64)] == [160, 80, 96, 192, 112, 208, 64]
    assert runtime.feature_constants(160, 160) == dict(BLOCK_DK=160, TAIL_DK=32, BLOCK_DV=160, TAIL_DV=32)
    assert runtime.feature_constants(128, 80) == dict(BLOCK_DK=128, BLOCK_DV=80, TAIL_DV=16)


SPLIT_BANDS_MASK = M.per_head([M.forward_mask(False), M.window(3), M.full(), M.backward_mask()])


@interpreter_only  # float64 oracle at the interpreter's 16 × 16 tiles; d 150 runs 128 + 32 features
@pytest.mark.parametrize("d, scale", [(150, "log_sigmoid"), (150, "identity"), (72, "log_sigmoid"),
                                      (80, "identity")])
def test_split_widths_match_float64_reference(d, scale):
    """Heads of 150 (the sentence presets', 128 + 32 feature blocks) and 72 / 80 (64 + 16) features, both scales,
    every kind of head (a narrow launch too), key padding, a length across tiles: outputs and every gradient match
    the float64 reference, as the one-block widths do."""
    q, k, v, s2t = inputs(2, 4, 37, d_k=d, d_v=d)
    kpm = padding(2, 37, (37, 29))
    out = tensorized_attention(q, k, v, s2t, SPLIT_BANDS_MASK, scale=scale, key_padding_mask=kpm, backend="triton")
    expected = tensorized_attention_reference(q, k, v, s2t, SPLIT_BANDS_MASK, scale=scale, key_padding_mask=kpm)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-10)
    for got, want in zip(grads(out, (q, k, v, s2t)), grads(expected, (q, k, v, s2t))):
        torch.testing.assert_close(got, want, atol=1e-11, rtol=1e-9)


@interpreter_only
def test_split_key_and_value_widths_of_their_own():
    """d_k and d_v split (or not) each on its own axis: q, k of 150 features (128 + 32) with values of 64 (one
    block), and q, k of 64 with values of 150."""
    for d_k, d_v in ((150, 64), (64, 150)):
        q, k, v, s2t = inputs(1, 2, 21, d_k=d_k, d_v=d_v, seed=d_k)
        mask = M.per_head([M.forward_mask(), M.window(2)])
        out = tensorized_attention(q, k, v, s2t, mask, backend="triton")
        expected = tensorized_attention_reference(q, k, v, s2t, mask)
        torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-10)
        for got, want in zip(grads(out, (q, k, v, s2t)), grads(expected, (q, k, v, s2t))):
            torch.testing.assert_close(got, want, atol=1e-11, rtol=1e-9)


@pytest.mark.parametrize("cls, scale", [("227K", "log_sigmoid"), ("227K", "identity"), ("163K", "log_sigmoid")])
def test_split_width_with_the_gpus_tiles_matches_float64_and_repeats_bit_for_bit(monkeypatch, cls, scale):
    """d 150 with the tiles a GPU takes at the split width 160 (:data:`runtime.TILE_TABLE`): on the 227 KB class
    (sm_90) 128-query forward tiles and the key pass with its queries along the rows of the scores (``QUERY_ROWS``:
    128 streamed queries × 64 held keys), on the 163 KB class (sm_80) the 64 × 64 forward; with key padding and
    lengths that end inside a tile, against the float64 reference; a second backward is bit-identical (under the
    interpreter, where the programs run one after another in one order, only a dropout mask that is not reproduced
    can fail that: tests/test_triton_program_order.py reverses the order). (A pass
    without a split entry on the class — the 163 KB class's backward — runs one block of 256 with its tiles, as on
    that device: ``runtime.splits_features``.)"""
    if DEVICE == "cuda":
        pytest.skip("the device's own tiles")

    def tiles(kernel, head_dim, device, dtype=torch.float16):
        return runtime.TILE_TABLE.get((kernel, cls, 160)) or runtime.TILE_TABLE[(kernel, cls, 256)]

    monkeypatch.setattr(runtime, "tiles", tiles)
    monkeypatch.setattr(runtime, "splits_features", lambda kernel, *args, **kwargs: (kernel, cls, 160) in runtime.TILE_TABLE)
    q, k, v, s2t = inputs(2, len(GROUPED_BANDS), 150, d_k=150, d_v=150)
    mask = M.per_head([M.forward_mask(False), M.window(3), M.full(), M.band(0, 32), M.band(16, 17)])
    kpm = padding(2, 150, (150, 131))
    out = tensorized_attention(q, k, v, s2t, mask, scale=scale, key_padding_mask=kpm, backend="triton")
    expected = tensorized_attention_reference(q, k, v, s2t, mask, scale=scale, key_padding_mask=kpm)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-10)
    first = grads(out, (q, k, v, s2t))
    for got, want in zip(first, grads(expected, (q, k, v, s2t))):
        torch.testing.assert_close(got, want, atol=1e-11, rtol=1e-9)
    again = tensorized_attention(q, k, v, s2t, mask, scale=scale, key_padding_mask=kpm, backend="triton")
    for a, b in zip(first, grads(again, (q, k, v, s2t))):
        assert torch.equal(a, b)


@interpreter_only
def test_a_split_width_in_one_block_where_a_class_has_no_split_tiles(monkeypatch):
    """Where :data:`runtime.TILE_TABLE` has no split entry for a pass and class (the backward on the mma.sync
    classes), the pass runs the 160 features in one block of 256, masked at the width (``runtime.splits_features``
    False): the same results."""
    monkeypatch.setattr(runtime, "splits_features", lambda *args, **kwargs: False)
    q, k, v, s2t = inputs(1, 3, 37, d_k=150, d_v=150)
    mask = M.per_head([M.forward_mask(), M.window(3), M.full()])
    kpm = padding(1, 37, (30,))
    out = tensorized_attention(q, k, v, s2t, mask, key_padding_mask=kpm, backend="triton")
    expected = tensorized_attention_reference(q, k, v, s2t, mask, key_padding_mask=kpm)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-10)
    for got, want in zip(grads(out, (q, k, v, s2t)), grads(expected, (q, k, v, s2t))):
        torch.testing.assert_close(got, want, atol=1e-11, rtol=1e-9)


@interpreter_only  # gradcheck needs float64
def test_gradcheck_at_a_split_width_with_dropout():
    """d 40 → 48 = 32 + 16 features (a split width small enough for gradcheck), with attention dropout re-seeded
    before each evaluation: backward is the exact gradient of the dropped-out forward, through both blocks."""
    q, k, v, s2t = inputs(1, 2, 6, d_k=40, d_v=40)
    kpm = padding(1, 6, (5,))

    def fn(*tensors):
        torch.manual_seed(0)
        return tensorized_triton(*tensors, [(math.inf, 0), (2, 2)], kpm, scale="log_sigmoid", dropout_p=0.3)[0]

    assert torch.autograd.gradcheck(fn, (q, k, v, s2t), fast_mode=True)


@interpreter_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_split_width_with_the_gpus_operand_dtypes_matches_float64(dtype):
    """issue 52 (deliverable 6): d 150 in bfloat16 and float16 with the GPU's operand dtypes (tests/_triton_device.py
    ``gpu_operand_dtypes``), every pass on its 128 + 32 blocks: within ``2·K·u·max |reference|`` of the float64
    oracle on the same rounded inputs (K = 3 forward, 6 backward, as at the one-block widths)."""
    q, k, v, s2t = inputs(1, 4, 37, d_k=150, d_v=150, dtype=torch.float64)
    with torch.no_grad():
        s2t.mul_(4.0)
    low = [t.detach().to(dtype).requires_grad_() for t in (q, k, v, s2t)]
    kpm = padding(1, 37, (33,))
    with gpu_operand_dtypes():
        out, _ = tensorized_triton(*low, STRICT_BANDS, kpm, scale="log_sigmoid", dropout_p=0.0)
        grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
        got = torch.autograd.grad(out, low, grad_out)
    exact = [t.detach().double().requires_grad_() for t in low]
    expected = tensorized_attention_reference(*exact, M.per_head(HEADS), key_padding_mask=kpm)
    assert_within_roundings(out, expected, 3, "out")
    for name, grad, want in zip(("q", "k", "v", "s2t"), got, torch.autograd.grad(expected, exact, grad_out.double())):
        assert grad.dtype == dtype
        assert_within_roundings(grad, want, 6, f"d{name}")


def _recorded_launches(arch: int, d: int):
    """The attention passes' launches of one bfloat16 call (forward and backward) at head width ``d``, recorded as on
    an ``arch`` device: ``{(kernel, narrow): kwargs}``."""
    with runtime.recording(runtime.TARGETS[arch]) as recorded:
        q, k, v, s2t = (torch.randn(2, 40, 2, d).to(torch.bfloat16).transpose(1, 2).requires_grad_() for _ in range(4))
        out, _ = tensorized_triton(q, k, v, s2t, [(math.inf, -1), (3, 3)], None, scale="log_sigmoid", dropout_p=0.0)
        torch.autograd.grad(out.float().sum(), (q, k, v, s2t))
    return {(la.kernel.fn.__name__, bool(la.kwargs["BAND_START"])): la for la in recorded
            if la.kernel.fn.__name__ in ("tensorized_fwd", "tensorized_bwd_kv", "tensorized_bwd_q")}


@pytest.mark.parametrize("arch", [80, 86, 90, 100])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_power_of_two_widths_launch_exactly_as_before(arch, d):
    """A power-of-two head width takes one feature block: its launches carry the constants they carried before the
    feature-axis tiling — ``BLOCK_DK`` / ``BLOCK_DV`` the width, no ``TAIL_DK`` / ``TAIL_DV`` / ``QUERY_ROWS`` (the
    kernels' defaults: 0, False, under which no tail code is traced) — and the tiles of its own width's entry, so
    its kernels compile to the same code (the SASS of d 64 / 128 / 256 on sm_90 and sm_80 was compared before and
    after: identical; docs/gpu.md, "Feature-axis tiling")."""
    launches = _recorded_launches(arch, d)
    assert len(launches) == 6
    cls = runtime.tile_class(runtime.TARGETS[arch])
    for (kernel, narrow), launch in launches.items():
        assert launch.kwargs["BLOCK_DK"] == launch.kwargs["BLOCK_DV"] == d
        assert not {"TAIL_DK", "TAIL_DV", "QUERY_ROWS"} & set(launch.kwargs), kernel
        tiles = runtime.ARCH_TILES.get((kernel + ("_narrow" if narrow else ""), arch, d)) or \
            runtime.TILE_TABLE[(kernel + ("_narrow" if narrow else ""), cls, d)]
        assert (launch.kwargs["BLOCK_M"], launch.kwargs["BLOCK_N"], launch.kwargs["num_warps"],
                launch.kwargs["num_stages"]) == (tiles.block_m, tiles.block_n, tiles.warps, tiles.stages)
        defaults = {name: p.default for name, p in inspect.signature(launch.kernel.fn).parameters.items()
                    if name in ("TAIL_DK", "TAIL_DV", "QUERY_ROWS")}
        assert defaults == ({"TAIL_DK": 0, "TAIL_DV": 0, "QUERY_ROWS": False} if kernel == "tensorized_bwd_kv"
                            else {"TAIL_DK": 0, "TAIL_DV": 0})


def test_d150_launches_split_blocks_and_the_split_widths_tiles():
    """d 150 on sm_90: every pass runs 160 = 128 + 32 features (``BLOCK_D*`` 160, ``TAIL_D*`` 32, not 256) with the
    table's entries at the split width 160 — the forward 128 × 32 on 8 warps, the query pass 128 × 32, the key pass
    128 streamed queries × 64 held keys with ``QUERY_ROWS`` — and its window heads the narrow entries; on sm_80 the
    forward and the narrow passes split, the full-width backward (no split entry on the 163 KB class) runs one block
    of 256 (``runtime.splits_features``)."""
    launches = _recorded_launches(90, 150)
    for (kernel, narrow), launch in launches.items():
        assert (launch.kwargs["BLOCK_DK"], launch.kwargs["TAIL_DK"], launch.kwargs["BLOCK_DV"],
                launch.kwargs["TAIL_DV"]) == (160, 32, 160, 32), kernel
        tiles = runtime.TILE_TABLE[(kernel + ("_narrow" if narrow else ""), "227K", 160)]
        assert (launch.kwargs["BLOCK_M"], launch.kwargs["BLOCK_N"], launch.kwargs["num_warps"]) == (
            tiles.block_m, tiles.block_n, tiles.warps)
        assert launch.kwargs.get("QUERY_ROWS", False) == (kernel == "tensorized_bwd_kv" and not narrow)
    assert runtime.TILE_TABLE[("tensorized_bwd_kv", "227K", 160)] == runtime.Tiles(128, 64, 8, 1, True)
    for (kernel, narrow), launch in _recorded_launches(80, 150).items():
        split = narrow or kernel == "tensorized_fwd"
        assert launch.kwargs["BLOCK_DK"] == (160 if split else 256) and ("TAIL_DK" in launch.kwargs) == split, kernel
