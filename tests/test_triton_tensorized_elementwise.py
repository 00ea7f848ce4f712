"""MTSA's fused elementwise kernels (maskattn.kernels.triton.tensorized_elementwise_jit; docs/design.md §3) against the
eager chain they replace (maskattn.kernels.tensorized.source2token_weights and the products around it) and their
formulas, under Triton's interpreter: the prologue (``c``, ``E``, ``v ⊙ E``) and its backward with key padding that
holds junk, NaN and underflowing ``E``, Appendix A.3's (key, feature) dropout, backward's ``dN`` / ``dD`` pre-pass
and the ``reliable`` flags, in float64 and with the GPU's bfloat16 operands; and the launches and bytes of one
call as an sm_90 device would run it."""

from __future__ import annotations

import math

import pytest
import torch

from _triton_device import BF16_U, DEVICE, EXACT, gpu_operand_dtypes, interpreter_only
from maskattn.kernels.tensorized import source2token_weights
from maskattn.kernels.triton import runtime
from maskattn.kernels.triton.tensorized import (ELEMENTWISE_BLOCK, ELEMENTWISE_KERNELS, KERNELS, output_gradients,
                                                tensorized_triton)

pytestmark = pytest.mark.skipif(not runtime.installed() or runtime.device_reason(DEVICE) is not None,
                                reason="needs triton (CUDA, or its interpreter on CPU)")

prologue = torch.ops.maskattn.tensorized_prologue


def heads(B, H, m, d, dtype=EXACT, seed=0):
    """``(B, H, m, d)`` laid out as a projection's output: ``(B, m, H, d)`` with the heads transposed."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, m, H, d, generator=g, dtype=torch.float64).transpose(1, 2).to(DEVICE, dtype)


def padding(B, m, keep):
    kpm = torch.zeros(B, m, dtype=torch.bool)
    for b, length in enumerate(keep):
        kpm[b, length:] = True
    return kpm.to(DEVICE)


def eager_chain(v, s2t, kpm):
    """``(v ⊙ E, E)`` as the eager PyTorch chain computed them (the specification of the prologue)."""
    pad = None if kpm is None else kpm[:, None, :, None]
    e = source2token_weights(s2t, pad)
    ve = v * e
    return (ve if pad is None else ve.masked_fill(pad, 0.0)), e


def run_prologue(v, s2t, kpm, dropout_p=0.0, seed=None, values=None):
    """The prologue operator on ``v``, ``s2t``: ``(v ⊙ E, E, c)`` with the padded features sliced off."""
    u8 = None if kpm is None else kpm.to(torch.uint8)
    ve, e, c = prologue(v, s2t, u8, seed, dropout_p, values or v.dtype)
    d_v = v.shape[-1]
    assert ve.shape[-1] == e.shape[-1] == runtime.feature_width(d_v) and ve.is_contiguous() and e.is_contiguous()
    assert (ve[..., d_v:] == 0).all() and (e[..., d_v:] == 0).all()  # the attention kernels' zero features
    return ve[..., :d_v], e[..., :d_v], c


@interpreter_only  # float64
@pytest.mark.parametrize("m, d_v, keep", [(37, 12, (37, 30)), (70, 33, (70, 0)), (5, 16, None), (37, 150, (37, 30)),
                                         (21, 72, None)])
def test_prologue_matches_the_eager_chain_and_ignores_what_padding_keys_hold(m, d_v, keep):
    """``E = exp(S − c)`` and ``v ⊙ E`` (features padded with zeros to the attention kernels' width — a multiple of
    16, or main + tail blocks: 150 → 128 + 32, 72 → 64 + 16, 33 → 32 + 16 —, lengths across tiles, a sequence of
    padding only), and the gradients of v and S, equal the eager chain's in float64; padding keys get ``E = 0`` and
    zero gradients exactly, whatever their score and value (±inf, NaN)."""
    v, s2t = heads(2, 3, m, d_v), heads(2, 3, m, d_v, seed=1)
    kpm = None if keep is None else padding(2, m, keep)
    if kpm is not None:  # ±inf, NaN and a score far above the others at the padding keys
        junk = torch.tensor([float("inf"), float("-inf"), float("nan"), 1e30], dtype=v.dtype)
        junk = junk[torch.arange(v.numel()) % 4].view(v.shape)
        v, s2t = (torch.where(kpm[:, None, :, None], junk, t) for t in (v, s2t))
    v, s2t = v.requires_grad_(), s2t.requires_grad_()
    ve, e, c = run_prologue(v, s2t, kpm)
    want_ve, want_e = eager_chain(v, s2t, kpm)
    torch.testing.assert_close(e, want_e, atol=0, rtol=1e-15)
    torch.testing.assert_close(ve, want_ve, atol=0, rtol=1e-15)
    if kpm is not None:
        assert (e[kpm[:, None, :].expand(e.shape[:3])] == 0).all() and (ve[kpm[:, None, :].expand(e.shape[:3])] == 0).all()
    g_ve, g_e = heads(2, 3, m, d_v, seed=2), heads(2, 3, m, d_v, seed=3)
    got = torch.autograd.grad((ve * g_ve + e * g_e).sum(), (v, s2t))
    want = torch.autograd.grad((want_ve * g_ve + want_e * g_e).sum(), (v, s2t))
    for a, b, leaf in zip(got, want, (v, s2t)):
        assert a.stride() == leaf.stride()  # in the input's layout
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, atol=1e-15, rtol=1e-13)


@interpreter_only
def test_nan_scores_propagate_as_the_reference_does_and_underflowing_e_is_zero():
    """A NaN source2token score makes its feature's maximum NaN, so ``c = 0`` there (as the eager chain's
    ``torch.amax``) and only its own ``E`` is NaN; scores 10⁴ below the feature's maximum give ``E = 0`` (it
    underflows) with zero, finite gradients. Through the whole call: NaN wherever the float64 reference has it, and
    the reference's values elsewhere (the underflowed rows recomputed exactly on the CPU: docs/design.md §3)."""
    from maskattn import masks as M
    from maskattn.functional import tensorized_attention, tensorized_attention_reference

    B, H, n, d = 1, 2, 20, 4
    v, s2t = heads(B, H, n, d), heads(B, H, n, d, seed=1)
    s2t[0, 0, 7, 1] = float("nan")
    s2t[0, 1, :, 2] = -1e4
    s2t[0, 1, 3, 2] = 0.0  # one key at the maximum, every other E underflows
    v, s2t = v.requires_grad_(), s2t.requires_grad_()
    ve, e, c = run_prologue(v, s2t, None)
    want_ve, want_e = eager_chain(v, s2t, None)
    assert c[0, 0, 1] == 0 and torch.isnan(e[0, 0, 7, 1]) and torch.isnan(e[0, 0, :, 1]).sum() == 1
    torch.testing.assert_close(e, want_e, atol=0, rtol=1e-15, equal_nan=True)
    torch.testing.assert_close(ve, want_ve, atol=0, rtol=1e-15, equal_nan=True)
    assert (e[0, 1, :, 2] == torch.eye(n, dtype=e.dtype)[3]).all()
    grad_v, grad_s = torch.autograd.grad((ve + e).sum(), (v, s2t))
    assert torch.isfinite(grad_v[0, 1]).all() and (grad_s[0, 1, :, 2] == 0).sum() == n - 1
    q, k = heads(B, H, n, d, seed=4), heads(B, H, n, d, seed=5)
    mask = M.per_head([M.forward_mask(), M.backward_mask()])
    with torch.no_grad():
        out = tensorized_attention(q, k, v, s2t, mask, backend="triton")
        expected = tensorized_attention_reference(q, k, v, s2t, mask)
    assert torch.isnan(expected).any() and torch.isnan(out)[torch.isnan(expected)].all()
    # (the attention kernels carry it further, to the other rows of the query tiles that visit its key tile: a
    # masked weight 0 times E = NaN inside tl.dot — as before the prologue was fused)
    finite = torch.isfinite(out)
    assert finite[:, 1].all() and finite[:, 0, :, [0, 2, 3]].all()
    torch.testing.assert_close(out[finite], expected[finite], atol=1e-12, rtol=1e-10)


@interpreter_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_bfloat16_operands_are_rounded_once(dtype):
    """With the GPU's operand dtypes (``E``, ``v ⊙ E``, ``dN``, ``dD`` in bfloat16; v, S and their gradients in the
    inputs' dtype), each stored value is the float64 result on the same rounded inputs rounded once: within twice
    bfloat16's unit roundoff of it (the interpreter casts float32 to bfloat16 by truncation, the GPU rounds to
    nearest: one unit roundoff; float16's, for v's and S's gradients in float16, is smaller)."""
    once = 2 * BF16_U
    v, s2t = heads(2, 2, 45, 24, dtype), (4 * heads(2, 2, 45, 24, seed=1)).to(dtype)  # E over a wide range
    kpm = padding(2, 45, (45, 40))
    with gpu_operand_dtypes():
        leaves = [t.requires_grad_() for t in (v, s2t)]
        ve, e, _ = run_prologue(*leaves, kpm, values=torch.bfloat16)
        assert ve.dtype == e.dtype == torch.bfloat16
        g_ve, g_e = heads(2, 2, 45, 24, torch.bfloat16, seed=2), heads(2, 2, 45, 24, torch.bfloat16, seed=3)
        got = torch.autograd.grad((ve * g_ve).float().sum() + (e * g_e).float().sum(), leaves)
    exact = [t.detach().double().requires_grad_() for t in (v, s2t)]
    want_ve, want_e = eager_chain(*exact, kpm)
    for name, a, b in (("E", e, want_e), ("v⊙E", ve, want_ve)):
        assert ((a.double() - b).abs() <= once * b.abs()).all(), name
    want = torch.autograd.grad((want_ve * g_ve.double() + want_e * g_e.double()).sum(), exact)
    for name, a, b in zip(("dv", "dS"), got, want):
        assert a.dtype == dtype
        # one rounding of the stored gradient, on a float32 sum of two products (dS) at float32's precision
        assert ((a.double() - b).abs() <= once * b.abs() + 1e-6 * b.abs().max()).all(), name
    out, grad_out = heads(2, 2, 45, 24, dtype, seed=4), heads(2, 2, 45, 24, dtype, seed=5)
    den = heads(2, 2, 45, 24, torch.float32, seed=6).abs()
    with gpu_operand_dtypes():
        d_num, d_den = output_gradients(grad_out, out, runtime.pad_features(den, 32).contiguous(), torch.bfloat16)
    want_num = grad_out.double() / den.double()
    for name, a, b in (("dN", d_num, want_num), ("dD", d_den, -want_num * out.double())):
        assert a.dtype == torch.bfloat16 and (a[..., 24:] == 0).all()
        assert ((a[..., :24].double() - b).abs() <= once * b.abs()).all(), name


@interpreter_only
def test_output_gradients_and_reliable_flags_treat_underflow_and_nan_as_the_reference():
    """``dN = dO / D``, ``dD = −dN ⊙ out`` are 0 where ``D`` underflowed (at most ``tiny / eps``) and NaN where it is
    NaN (a NaN is not underflow: it propagates); features past the output's are 0. ``reliable`` is False exactly
    where ``D`` underflowed — one elementwise kernel behind the attention kernel, from its own ``D``."""
    B, H, n, d_v = 2, 3, 37, 12
    grad_out, out = heads(B, H, n, d_v), heads(B, H, n, d_v, seed=1)
    den = heads(B, H, n, d_v, seed=2).abs() + 0.5
    threshold = torch.finfo(den.dtype).tiny / torch.finfo(den.dtype).eps
    den[0, 1, 3] = threshold
    den[1, 2, 30, :4] = 1e-300
    den[0, 0, 36, 5] = float("nan")
    d_num, d_den = output_gradients(grad_out, out, runtime.pad_features(den, 16).contiguous(), EXACT)
    underflow = den <= threshold
    want_num = torch.where(underflow, 0.0, grad_out / den)
    torch.testing.assert_close(d_num[..., :d_v], want_num, atol=0, rtol=0, equal_nan=True)
    torch.testing.assert_close(d_den[..., :d_v], -want_num * out, atol=0, rtol=0, equal_nan=True)
    assert (d_num[..., d_v:] == 0).all() and (d_den[..., d_v:] == 0).all()
    assert torch.isnan(d_num[0, 0, 36, 5]) and (d_num[0, 1, 3] == 0).all()

    # reliable, from the operator's own denominators: S spread ±10⁴ makes most of them underflow
    q, k = (runtime.pad_features(heads(B, H, n, 8, seed=seed), 16) for seed in (3, 4))
    v = heads(B, H, n, d_v, seed=5)
    s2t = torch.rand(B, H, n, d_v, generator=torch.Generator().manual_seed(6), dtype=EXACT) * 2e4 - 1e4
    ve, e, _ = prologue(v, s2t, None, None, 0.0, EXACT)
    bands = [-(1 << 30), -1, 0, 1 << 30, -3, 3]
    _, reliable, den, _ = torch.ops.maskattn.tensorized_triton(q, k, ve, e, None, bands, None, False, 0.0,
                                                               8 ** -0.5, d_v)
    assert reliable.dtype == torch.bool and reliable.shape == (B, H, n, d_v) and reliable.is_contiguous()
    assert torch.equal(reliable, ~(den[..., :d_v] <= threshold))
    assert (~reliable).any() and reliable.any()


@interpreter_only
def test_value_dropout_is_drawn_by_position_under_its_own_seed():
    """Appendix A.3's (key, feature) factor on ``v ⊙ E``: each element dropped with probability ``p`` and the kept
    ones scaled by ``1 / (1 − p)``; drawn from ``seed[1]`` only (the weights' factor, in the attention kernels, draws
    from ``seed[0]``), so a call repeats it and backward redraws it: the gradients are those of the eager chain
    times the mask the forward drew (with padding keys). (``c`` carries no gradient — it cancels in ``N / D`` — so
    the operator alone is no function gradcheck could check; tests/test_triton_tensorized.py gradchecks the whole
    call with dropout.)"""
    B, H, m, d = 2, 2, 70, 16
    ones, zeros = torch.ones(B, H, m, d, dtype=EXACT), torch.zeros(B, H, m, d, dtype=EXACT)
    seed = torch.tensor([11, 22])
    p = 0.3
    ve, e, _ = run_prologue(ones, zeros, None, p, seed)
    assert (e == 1).all()
    kept = ve != 0
    assert set(ve.unique().tolist()) == {0.0, 1 / (1 - p)}
    assert abs(kept.double().mean().item() - (1 - p)) < 0.03
    assert torch.equal(run_prologue(ones, zeros, None, p, torch.tensor([99, 22]))[0], ve)  # seed[0]: not ours
    assert not torch.equal(run_prologue(ones, zeros, None, p, torch.tensor([11, 23]))[0], ve)

    v, s2t = heads(2, 3, 37, 12).requires_grad_(), heads(2, 3, 37, 12, seed=1).requires_grad_()
    kpm = padding(2, 37, (37, 30))
    ve, e, _ = run_prologue(v, s2t, kpm, p, seed)
    want_ve, want_e = eager_chain(v, s2t, kpm)
    keep = ve != 0  # v ⊙ E is not 0 anywhere else
    assert keep[~kpm[:, None, :].expand(keep.shape[:3])].double().mean() > 0.6
    want_ve = torch.where(keep, want_ve / (1 - p), 0.0)
    torch.testing.assert_close(ve, want_ve, atol=0, rtol=1e-15)
    g_ve, g_e = heads(2, 3, 37, 12, seed=2), heads(2, 3, 37, 12, seed=3)
    got = torch.autograd.grad((ve * g_ve + e * g_e).sum(), (v, s2t))
    for a, b in zip(got, torch.autograd.grad((want_ve * g_ve + want_e * g_e).sum(), (v, s2t))):
        torch.testing.assert_close(a, b, atol=1e-15, rtol=1e-13)


def test_one_call_launches_the_fused_kernels_and_moves_39_bytes_per_element():
    """bfloat16, d = 64, launches recorded for sm_90 (not run): forward is ``c``, the prologue, the attention pass
    and the ``reliable`` flags; backward the ``dN`` / ``dD`` pre-pass, the two attention passes and the prologue's
    backward — no PyTorch work per element in between (``offline.time_model.wrapper_bytes`` counts it: ~0). The
    elementwise kernels' tiles are 2048 elements (rows × the feature width), and the tensors they read and write
    come to 39 bytes per (position × feature): 15 forward (S twice, v, ``v ⊙ E`` and ``E`` in bfloat16, D and the
    flags), 24 backward (dO, out, D → dN, dD; d(v⊙E), dE, v, S → dv, dS) — the eager chain moved 195."""
    B, H, n, d = 1, 2, 64, 64
    with runtime.recording(runtime.TARGETS[90]) as recorded:
        q, k, v, s2t = (torch.randn(B, n, H, d).to(torch.bfloat16).transpose(1, 2).requires_grad_()
                        for _ in range(4))
        out, _ = tensorized_triton(q, k, v, s2t, [(math.inf, -1), (-1, math.inf)], None, scale="log_sigmoid",
                                   dropout_p=0.0)
        torch.autograd.grad(out, (q, k, v, s2t), torch.randn_like(out))
    names = [launch.kernel.fn.__name__ for launch in recorded]
    assert names == ["tensorized_source_max", "tensorized_prologue", "tensorized_fwd", "tensorized_reliable",
                     "tensorized_output_grads", "tensorized_bwd_kv", "tensorized_bwd_q", "tensorized_prologue_bwd"]
    assert set(names) == set(ELEMENTWISE_KERNELS) | set(KERNELS[:3])
    moved = 0
    for launch in recorded:
        if launch.kernel.fn.__name__ not in ELEMENTWISE_KERNELS:
            continue
        assert launch.kwargs["ROWS"] * launch.kwargs.get("BLOCK_DV", launch.kwargs.get("BLOCK_D")) == ELEMENTWISE_BLOCK
        moved += sum(t.numel() * t.element_size() for t in launch.args if isinstance(t, torch.Tensor) and t.numel() > 1)
    per_element = moved / (B * H * n * d)
    assert per_element == 39 + 12 / n  # and c: 4 bytes per feature and (batch, head), written once, read twice


@interpreter_only
def test_a_split_width_runs_in_two_feature_blocks_and_draws_the_same_dropout():
    """d 150 (issue 52's presets): the elementwise kernels tile the features as the attention kernels do — 128 + 32,
    ``BLOCK_DV`` 160 with ``TAIL_DV`` 32, not one block of 256 — and the (key, feature) dropout of ``v ⊙ E``, drawn by
    position, is the same mask bit for bit whether the features run in two blocks or in one (the launcher's blocks
    replaced by a single power-of-two one), forward and backward."""
    from maskattn.kernels.triton import tensorized

    assert tensorized._feature_blocks(150) == (128, 32) and tensorized._feature_blocks(160) == (128, 32)
    assert tensorized._feature_blocks(72) == (64, 16) and tensorized._feature_blocks(64) == (64, 0)
    v, s2t = heads(1, 2, 37, 150).requires_grad_(), heads(1, 2, 37, 150, seed=1).requires_grad_()
    seed = torch.tensor([5, 6])
    kpm = padding(1, 37, (33,))
    ve, e, _ = run_prologue(v, s2t, kpm, 0.3, seed)
    grads = torch.autograd.grad((ve * e).sum(), (v, s2t))
    blocks = tensorized._feature_blocks
    tensorized._feature_blocks = lambda width: (max(16, runtime.next_power_of_2(runtime.feature_width(width))), 0)
    try:
        one_ve, one_e, _ = run_prologue(v, s2t, kpm, 0.3, seed)
        one_grads = torch.autograd.grad((one_ve * one_e).sum(), (v, s2t))
    finally:
        tensorized._feature_blocks = blocks
    assert torch.equal(ve, one_ve) and torch.equal(e, one_e)
    for a, b in zip(grads, one_grads):
        assert torch.equal(a, b)


def test_elementwise_launches_at_a_split_width():
    """The elementwise kernels' launches at d 150 (sm_90, recorded): ``BLOCK_DV`` 160 = 128 + 32 (``TAIL_DV``) and
    2,048 elements of the main block per program (16 rows); at d 64 one block, no ``TAIL_DV`` — the launch of
    before."""
    for d, tail in ((150, 32), (64, None)):
        with runtime.recording(runtime.TARGETS[90]) as recorded:
            q, k, v, s2t = (torch.randn(1, 32, 2, d).to(torch.bfloat16).transpose(1, 2).requires_grad_()
                            for _ in range(4))
            out, _ = tensorized_triton(q, k, v, s2t, [(math.inf, -1), (-1, math.inf)], None, scale="log_sigmoid",
                                       dropout_p=0.0)
            torch.autograd.grad(out, (q, k, v, s2t), torch.randn_like(out))
        rows = [la for la in recorded if la.kernel.fn.__name__ in ELEMENTWISE_KERNELS
                and la.kernel.fn.__name__ != "tensorized_source_max"]
        assert len(rows) == 4
        for launch in rows:
            assert launch.kwargs.get("TAIL_DV") == tail
            main = launch.kwargs["BLOCK_DV"] - (tail or 0)
            assert launch.kwargs["BLOCK_DV"] == runtime.feature_width(d) and launch.kwargs["ROWS"] * main == ELEMENTWISE_BLOCK
