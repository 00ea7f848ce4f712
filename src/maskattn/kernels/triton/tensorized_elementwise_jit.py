"""Triton kernels of MTSA's per-element work around its attention kernels (docs/design.md §1, §3): each reads and
writes every element once, in one launch, where the eager chain of PyTorch operations (casts, ``amax``, ``exp``,
products, fills, dropout, padding, and autograd's backward of each) read and wrote it about twenty times.

With ``E_jl = exp(S_jl − c_l)`` and ``c_l = max_j S_jl`` over the non-padding keys (0 where that is not finite),
MTSA's feature-wise softmax (Eq. 10–11) is one scalar attention over ``[v ⊙ E ; E]`` and a division (§1). Around
:mod:`.tensorized_jit`'s kernels:

* forward — :func:`tensorized_source_max` (``c``: reads S once), :func:`tensorized_prologue` (reads S and v,
  writes ``v ⊙ E`` and ``E`` in the value dtype, features padded with zeros to the attention kernels' width; padding
  keys get ``E = 0`` exactly; the (key, feature) factor of Appendix A.3's dropout drawn from Philox by position) and,
  after the attention kernel, :func:`tensorized_reliable` (``D`` above the underflow threshold, for the caller);
* backward — :func:`tensorized_output_grads` (FlashAttention-2's pre-pass, per feature: ``dN = dO / D``,
  ``dD = −dN ⊙ out``) and :func:`tensorized_prologue_bwd` (the chain rule from ``d(v ⊙ E)`` and ``dE`` back to
  ``v`` and S, ``E`` recomputed in the accumulator type as forward computed it, the dropout redrawn).

Every kernel computes in ``ACC`` (float32; float64 for float64 inputs) and works on tiles of ``ROWS`` positions of
one (batch, head) pair × the padded feature width (the launcher's ``tensorized.elementwise_rows``): one grid axis of
``tiles × B × H`` programs, as :func:`.runtime.launch` lays out every launch. The feature width is the attention
kernels' layout (:func:`.runtime.feature_width`): a power of two, or a main and a tail block that are
(:func:`.jit_helpers.feature_blocks`; ``BLOCK_DV`` their sum, ``TAIL_DV`` the tail's) — 160 for d 150 as 128 + 32,
each row's 160 features in two blocks, not one of 256.
"""

import triton
import triton.language as tl

from .jit_helpers import dropout_keep, feature_blocks, head_base, load_tile, program_tile, store_tile, tile_pointers

#: never specialised on == 1 (a new length must not recompile); the head widths stay specialised
_SIZES = ["H", "M", "num_tiles"]


@triton.jit
def _max_nan(a, b):
    """``max(a, b)``, NaN if either is (as ``torch.amax``)."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _row_program(num_tiles, H, ROWS: tl.constexpr, BLOCK_DV: tl.constexpr, TAIL_DV: tl.constexpr):
    """``(b, h, bh, start, idx, feats)`` of a program of the row kernels: its batch, head and pair ``b·H + h``, and
    its tile — rows ``start + idx`` (``ROWS``) × the feature blocks ``feats`` (:func:`.jit_helpers.feature_blocks`
    of ``BLOCK_DV`` and ``TAIL_DV``: one block, or a main and a tail block)."""
    tile, bh = program_tile(num_tiles)
    return bh // H, bh % H, bh, tile * ROWS, tl.arange(0, ROWS), feature_blocks(BLOCK_DV, TAIL_DV)


@triton.jit
def _source_weights(V, S, KPM, C, b, h, bh, j0, idx, feats, svb, svh, svn, svd, ssb, ssh, ssn, ssd, M, D_V,
                    HAS_KPM: tl.constexpr, ACC: tl.constexpr):
    """``(v, E, valid)`` of keys ``j0 + idx`` × features ``feats`` in ACC: ``E = exp(S − c)`` where ``valid`` (a key
    below M that is not padding, a feature below D_V) and exactly 0 elsewhere — whatever S holds there."""
    rows = j0 + idx
    valid = (rows < M)[:, None] & (feats < D_V)[None, :]
    if HAS_KPM:
        valid = valid & (tl.load(KPM + b.to(tl.int64) * M + rows, mask=rows < M, other=1) == 0)[:, None]
    s = load_tile(head_base(S, b, h, ssb, ssh), j0, ssn, ssd, idx, feats, M, D_V).to(ACC)
    c = tl.load(C + bh.to(tl.int64) * D_V + feats, mask=feats < D_V, other=0.0)
    e = tl.where(valid, tl.exp(tl.where(valid, s - c[None, :], 0.0)), 0.0)
    v = load_tile(head_base(V, b, h, svb, svh), j0, svn, svd, idx, feats, M, D_V).to(ACC)
    return v, e, valid


@triton.jit
def _value_keep(SEED, bh, j0, idx, f0, M, D_V, drop_p, ROWS: tl.constexpr, WIDTH: tl.constexpr):
    """The keep-mask of the (key, feature) dropout factor of MTSA Appendix A.3 (on ``v ⊙ E``) over features
    ``f0 … f0 + WIDTH − 1``: one Philox number per element at ``(bh·M + key)·D_V + feature`` under the second seed
    (``SEED[1]``; the weights' factor draws from ``SEED[0]``), so forward and backward — whatever their feature
    blocks — draw the same mask."""
    return dropout_keep(tl.load(SEED + 1), bh, j0 + idx, f0, M, D_V, drop_p, ROWS, WIDTH)


@triton.jit
def _block_keep(SEED, bh, j0, idx, feats, i: tl.constexpr, M, D_V, drop_p, ROWS: tl.constexpr):
    """:func:`_value_keep` over feature block ``i`` of ``feats`` (the main block starts at feature 0, the tail where
    the main block ends)."""
    if i == 0:
        return _value_keep(SEED, bh, j0, idx, 0, M, D_V, drop_p, ROWS, feats[0].shape[0])
    else:
        return _value_keep(SEED, bh, j0, idx, feats[0].shape[0], M, D_V, drop_p, ROWS, feats[1].shape[0])


@triton.jit(do_not_specialize=_SIZES)
def tensorized_source_max(S, KPM, C, ssb, ssh, ssn, ssd, H, M, D_V, num_tiles,
                          HAS_KPM: tl.constexpr, ACC: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """``num_tiles · B · H`` programs, one block of ``BLOCK_D`` features of one (batch, head) pair each, looping over
    its keys: ``c_l = max_j S_jl`` over the keys that are not padding, in ACC, NaN if any of them is NaN, then 0
    where it is not finite (no key, ``±inf``, NaN: ``maskattn.kernels.tensorized.source2token_weights``). C is
    contiguous ``(B·H, D_V)``."""
    tile, bh = program_tile(num_tiles)
    b, h = bh // H, bh % H
    feats = tile * BLOCK_D + tl.arange(0, BLOCK_D)
    idx = tl.arange(0, ROWS)
    base = head_base(S, b, h, ssb, ssh)
    kpm_row = KPM + b.to(tl.int64) * M
    best = tl.full((ROWS, BLOCK_D), float("-inf"), ACC)
    for j0 in range(0, M, ROWS):
        rows = j0 + idx
        keep = rows < M
        if HAS_KPM:
            keep = keep & (tl.load(kpm_row + rows, mask=rows < M, other=1) == 0)
        mask = keep[:, None] & (feats < D_V)[None, :]
        s = tl.load(tile_pointers(base, j0, ssn, ssd, idx, feats), mask=mask, other=float("-inf"))
        best = _max_nan(best, s.to(ACC))
    c = tl.reduce(best, 0, _max_nan)
    tl.store(C + bh.to(tl.int64) * D_V + feats, tl.where(tl.abs(c) < float("inf"), c, 0.0), mask=feats < D_V)


@triton.jit
def _prologue_block(V, S, KPM, C, SEED, VE, E, b, h, bh, j0, idx, feats, i: tl.constexpr, svb, svh, svn, svd, ssb,
                    ssh, ssn, ssd, M, D_V, D_P, drop_p, HAS_KPM: tl.constexpr, DROPOUT: tl.constexpr,
                    ACC: tl.constexpr, ROWS: tl.constexpr):
    """:func:`tensorized_prologue` over feature block ``i``."""
    v, e, valid = _source_weights(V, S, KPM, C, b, h, bh, j0, idx, feats[i], svb, svh, svn, svd, ssb, ssh, ssn, ssd,
                                  M, D_V, HAS_KPM, ACC)
    ve = tl.where(valid, v * e, 0.0)  # junk values at padding keys cannot reach the sums
    if DROPOUT:
        ve = tl.where(_block_keep(SEED, bh, j0, idx, feats, i, M, D_V, drop_p, ROWS), ve * (1.0 / (1.0 - drop_p)), 0.0)
    base = bh.to(tl.int64) * M * D_P
    store_tile(VE + base, j0, D_P, 1, idx, feats[i], M, D_P, ve.to(VE.dtype.element_ty))
    store_tile(E + base, j0, D_P, 1, idx, feats[i], M, D_P, e.to(E.dtype.element_ty))


@triton.jit(do_not_specialize=_SIZES)
def tensorized_prologue(V, S, KPM, C, SEED, VE, E, svb, svh, svn, svd, ssb, ssh, ssn, ssd,
                        H, M, D_V, D_P, drop_p, num_tiles, HAS_KPM: tl.constexpr, DROPOUT: tl.constexpr,
                        ACC: tl.constexpr, ROWS: tl.constexpr, BLOCK_DV: tl.constexpr, TAIL_DV: tl.constexpr = 0):
    """``num_tiles · B · H`` programs, ``ROWS`` keys of one (batch, head) pair each: ``v ⊙ E`` (its dropout factor
    applied: kept elements scaled by ``1 / (1 − drop_p)``) and ``E`` stored in VE's and E's dtype, contiguous
    ``(B·H, M, D_P)`` — features ``D_V … D_P − 1`` zero (the attention kernels' padded width)."""
    b, h, bh, j0, idx, feats = _row_program(num_tiles, H, ROWS, BLOCK_DV, TAIL_DV)
    for i in tl.static_range(len(feats)):
        _prologue_block(V, S, KPM, C, SEED, VE, E, b, h, bh, j0, idx, feats, i, svb, svh, svn, svd, ssb, ssh, ssn,
                        ssd, M, D_V, D_P, drop_p, HAS_KPM, DROPOUT, ACC, ROWS)


@triton.jit(do_not_specialize=["N", "num_tiles"])
def tensorized_reliable(DEN, RELIABLE, N, D_V, D_P, threshold, num_tiles,
                        ROWS: tl.constexpr, BLOCK_DV: tl.constexpr, TAIL_DV: tl.constexpr = 0):
    """``num_tiles · B · H`` programs, ``ROWS`` queries each: ``RELIABLE = not (D <= threshold)`` (a NaN denominator
    is not underflow: it propagates, as on the reference) for DEN contiguous ``(B·H, N, D_P)`` into RELIABLE
    contiguous ``(B·H, N, D_V)``."""
    _, _, bh, i0, idx, feats = _row_program(num_tiles, 1, ROWS, BLOCK_DV, TAIL_DV)
    for i in tl.static_range(len(feats)):
        den = load_tile(DEN + bh.to(tl.int64) * N * D_P, i0, D_P, 1, idx, feats[i], N, D_V)
        store_tile(RELIABLE + bh.to(tl.int64) * N * D_V, i0, D_V, 1, idx, feats[i], N, D_V, ~(den <= threshold))


@triton.jit
def _output_grads_block(DO, OUT, DEN, DN, DD, b, h, bh, i0, idx, feats, sgb, sgh, sgn, sgd, sob, soh, son, sod, N,
                        D_V, D_P, threshold, ACC: tl.constexpr):
    """:func:`tensorized_output_grads` over the features ``feats`` (one block)."""
    grad = load_tile(head_base(DO, b, h, sgb, sgh), i0, sgn, sgd, idx, feats, N, D_V).to(ACC)
    out = load_tile(head_base(OUT, b, h, sob, soh), i0, son, sod, idx, feats, N, D_V).to(ACC)
    base = bh.to(tl.int64) * N * D_P
    den = load_tile(DEN + base, i0, D_P, 1, idx, feats, N, D_V)  # 0 past D_V: underflow, so dN = 0 there
    underflow = den <= threshold
    d_num = tl.where(underflow, 0.0, grad / tl.where(underflow, 1.0, den))
    d_den = -d_num * out
    store_tile(DN + base, i0, D_P, 1, idx, feats, N, D_P, d_num.to(DN.dtype.element_ty))
    store_tile(DD + base, i0, D_P, 1, idx, feats, N, D_P, d_den.to(DD.dtype.element_ty))


@triton.jit(do_not_specialize=["H", "N", "num_tiles"])
def tensorized_output_grads(DO, OUT, DEN, DN, DD, sgb, sgh, sgn, sgd, sob, soh, son, sod, H, N, D_V, D_P, threshold,
                            num_tiles, ACC: tl.constexpr, ROWS: tl.constexpr, BLOCK_DV: tl.constexpr,
                            TAIL_DV: tl.constexpr = 0):
    """``num_tiles · B · H`` programs, ``ROWS`` queries each: backward's pre-pass (FlashAttention-2's Δ, per
    feature) ``dN = dO / D`` and ``dD = −dN ⊙ out``, 0 where ``D`` underflowed (NaN is not underflow), from DO and
    OUT ``(B, H, N, D_V)`` (any strides) and DEN contiguous ``(B·H, N, D_P)`` in ACC, into DN and DD contiguous
    ``(B·H, N, D_P)`` (features ``D_V …`` zero)."""
    b, h, bh, i0, idx, feats = _row_program(num_tiles, H, ROWS, BLOCK_DV, TAIL_DV)
    for i in tl.static_range(len(feats)):
        _output_grads_block(DO, OUT, DEN, DN, DD, b, h, bh, i0, idx, feats[i], sgb, sgh, sgn, sgd, sob, soh, son, sod,
                            N, D_V, D_P, threshold, ACC)


@triton.jit
def _prologue_bwd_block(DVE, DE, V, S, KPM, C, SEED, DV, DS, b, h, bh, j0, idx, feats, i: tl.constexpr, sgb, sgh,
                        sgn, sgd, seb, seh, sen, sed, svb, svh, svn, svd, ssb, ssh, ssn, ssd, sdvb, sdvh, sdvn, sdvd,
                        sdsb, sdsh, sdsn, sdsd, M, D_V, drop_p, HAS_KPM: tl.constexpr, DROPOUT: tl.constexpr,
                        ACC: tl.constexpr, ROWS: tl.constexpr):
    """:func:`tensorized_prologue_bwd` over feature block ``i``."""
    v, e, valid = _source_weights(V, S, KPM, C, b, h, bh, j0, idx, feats[i], svb, svh, svn, svd, ssb, ssh, ssn, ssd,
                                  M, D_V, HAS_KPM, ACC)
    grad_ve = load_tile(head_base(DVE, b, h, sgb, sgh), j0, sgn, sgd, idx, feats[i], M, D_V).to(ACC)
    grad_e = load_tile(head_base(DE, b, h, seb, seh), j0, sen, sed, idx, feats[i], M, D_V).to(ACC)
    if DROPOUT:
        grad_ve = tl.where(_block_keep(SEED, bh, j0, idx, feats, i, M, D_V, drop_p, ROWS),
                           grad_ve * (1.0 / (1.0 - drop_p)), 0.0)
    grad_v = tl.where(valid, grad_ve * e, 0.0)
    grad_s = tl.where(valid, (grad_e + grad_ve * v) * e, 0.0)
    store_tile(head_base(DV, b, h, sdvb, sdvh), j0, sdvn, sdvd, idx, feats[i], M, D_V, grad_v.to(DV.dtype.element_ty))
    store_tile(head_base(DS, b, h, sdsb, sdsh), j0, sdsn, sdsd, idx, feats[i], M, D_V, grad_s.to(DS.dtype.element_ty))


@triton.jit(do_not_specialize=_SIZES)
def tensorized_prologue_bwd(DVE, DE, V, S, KPM, C, SEED, DV, DS, sgb, sgh, sgn, sgd, seb, seh, sen, sed,
                            svb, svh, svn, svd, ssb, ssh, ssn, ssd, sdvb, sdvh, sdvn, sdvd, sdsb, sdsh, sdsn, sdsd,
                            H, M, D_V, drop_p, num_tiles, HAS_KPM: tl.constexpr, DROPOUT: tl.constexpr,
                            ACC: tl.constexpr, ROWS: tl.constexpr, BLOCK_DV: tl.constexpr, TAIL_DV: tl.constexpr = 0):
    """``num_tiles · B · H`` programs, ``ROWS`` keys each: the gradients of v and S from those of ``v ⊙ E`` (DVE)
    and ``E`` (DE) — with ``g = d(v ⊙ E)`` times the dropout factor, ``dv = g ⊙ E`` and
    ``dS = (dE + g ⊙ v) ⊙ E`` (``∂E/∂S = E``; ``c`` carries no gradient: it cancels) — exactly 0 at padding keys
    (their E is 0 whatever S holds, so an infinite v or S there cannot make ``0 · ∞``). Every tensor
    ``(B, H, M, ·)`` with strides of its own; DV and DS in their own dtypes."""
    b, h, bh, j0, idx, feats = _row_program(num_tiles, H, ROWS, BLOCK_DV, TAIL_DV)
    for i in tl.static_range(len(feats)):
        _prologue_bwd_block(DVE, DE, V, S, KPM, C, SEED, DV, DS, b, h, bh, j0, idx, feats, i, sgb, sgh, sgn, sgd, seb,
                            seh, sen, sed, svb, svh, svn, svd, ssb, ssh, ssn, ssd, sdvb, sdvh, sdvn, sdvd, sdsb, sdsh,
                            sdsn, sdsd, M, D_V, drop_p, HAS_KPM, DROPOUT, ACC, ROWS)
