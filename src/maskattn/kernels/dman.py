"""DMAN attention (MAN Eq. 4 with the dynamic mask of Eq. 12) in tiles, with exact gradients of the mask.

``log M[b, h, t, s] = logsigmoid(a[b, t] + U[h] + P[t − s])`` enters the scores as a bias. The kernel keeps
q, k, v, a, P, U, the output and one log-sum-exp per row for backward; it works on tiles of (batch·head
pairs) × (query rows) × (all keys) and recomputes the probabilities tile by tile in backward, from which it
returns the gradients of q, k, v *and* of a, P and U (a fused formula — it does not rely on SDPA returning a
bias gradient, which CPU SDPA only does on its math path). See :class:`_DynamicMaskAttention`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..masks import causal as causal_mask
from .random import keep_mask, new_seed, seeded_generator

__all__ = ["dynamic_mask_kernel", "CHUNK_MIN_ELEMENTS", "CHUNK_FRACTION", "SDPA_MIN_ELEMENTS"]


#: the chunked DMAN kernel works on tiles of (batch·head pairs) × (query rows) × (all keys). Backward's
#: workspace for one tile — two skewed buffers of ``rows × (keys + rows − 1)`` per pair (see
#: :func:`_skew_view`) — is at most max(CHUNK_MIN_ELEMENTS, CHUNK_FRACTION × size of k) elements, so it
#: stays of the order of q, k, v (plain attention's own footprint). Tiles take whole heads when they fit
#: (long contractions for the gradient matmuls), else as many query rows of one head as fit.
CHUNK_MIN_ELEMENTS = 1 << 16
CHUNK_FRACTION = 1.0

#: tiles smaller than this (elements of the bias) use the explicit softmax instead of one fused
#: attention call (incremental decoding steps, small test shapes).
SDPA_MIN_ELEMENTS = 1 << 15

_LOG2E = 1.0 / math.log(2.0)  # exp(x) = exp2(x · log2 e); torch's CPU exp2 is several times faster than exp


def _tile_plan(BH, n, m, d) -> tuple[int, int]:
    """(pairs per tile, query rows per tile), balanced so that the tiles are of (nearly) equal size."""
    budget = max(CHUNK_MIN_ELEMENTS, int(CHUNK_FRACTION * BH * m * d))
    per_pair = 2 * n * (m + n - 1)  # backward's two skewed buffers for one whole head
    if per_pair <= budget:
        pairs = min(BH, budget // per_pair)
        return -(-BH // -(-BH // pairs)), n
    # 2 c (m + c − 1) <= budget for c query rows of one head
    rows = max(1, min(n, int((math.sqrt((m - 1) ** 2 + 2 * budget) - (m - 1)) / 2)))
    return 1, -(-n // -(-n // rows))


def _skew_view(buf, rows, m):
    """The ``(G, rows, m)`` view of ``buf`` ``(G, rows, W = m + rows − 1)`` with row stride ``W − 1``:
    element ``[g, i, s]`` is ``buf[g, i, s − i + rows − 1]``. Column ``k`` of ``buf`` therefore holds
    one relative distance ``t − s`` for every row, so ``log M`` (a function of the row and ``t − s``)
    is built column-block-wise from a ``(G, rows, 2D + 1)`` table, and gradients are summed the same way."""
    G, _, W = buf.shape
    return buf.as_strided((G, rows, m), (rows * W, W - 1, 1), buf.storage_offset() + rows - 1)


def _distance_columns(D, t0, rows, m):
    """For a tile of ``rows`` queries starting at absolute position ``t0``: ``(ulo, w, k_a)`` such that
    column ``k`` of the skewed buffer uses the reversed-table entry ``u = clip(k + D − t0 − rows + 1, 0, 2D)``,
    ``u ∈ [ulo, ulo + w)``; columns ``< k_a`` use ``ulo``, the next ``w − 2`` use ``ulo + 1 …`` in order, the
    rest ``ulo + w − 1`` (reversed table: ``Prev[u] = P[2D − u]``, distance ``t − s = D − u``)."""
    off = D - t0 - rows + 1
    W = m + rows - 1
    ulo, uhi = min(max(off, 0), 2 * D), min(max(W - 1 + off, 0), 2 * D)
    return ulo, uhi - ulo + 1, ulo - off + 1


def _scatter_columns(buf, small, k_a):
    """``buf[..., k] = small[..., column(k)]`` (see :func:`_distance_columns`): two broadcast fills, one copy."""
    w = small.shape[-1]
    if w == 1:
        buf.copy_(small.expand_as(buf))
        return buf
    left, mid = buf[..., :k_a], buf[..., k_a:k_a + w - 2]
    right = buf[..., k_a + w - 2:]
    left.copy_(small[..., :1].expand_as(left))
    mid.copy_(small[..., 1:w - 1])
    right.copy_(small[..., w - 1:].expand_as(right))
    return buf


def _gather_columns(buf, k_a, w):
    """Adjoint of :func:`_scatter_columns`: ``(G, rows, w)`` sums of ``buf`` over the columns of each entry."""
    if w == 1:
        return buf.sum(-1, keepdim=True)
    return torch.cat([buf[..., :k_a].sum(-1, keepdim=True), buf[..., k_a:k_a + w - 2],
                      buf[..., k_a + w - 2:].sum(-1, keepdim=True)], dim=-1)


def _log_mask(buf, neg_z, k_a, rows, m, *, negated=False, shift=None, ceiling=None):
    """The tile's ``log M = −softplus(−z)`` (``negated``: ``−log M``, plus ``shift`` ``(G, rows, 1)`` where
    that is free; ``ceiling``: ``−log M`` capped there, the mask floor) in the skewed ``(G, rows, m)`` view of
    ``buf``, from the ``(G, rows, w)`` table of ``−z``.
    The transcendental runs on the table when it is narrower than the tile (long sequences: at most
    ``2D + 1`` distances per row), else on the view itself (short sequences, where the table covers more
    distances than a row has keys). Returns ``(view, shift_applied)``."""
    if neg_z.shape[-1] <= m:
        values = F.softplus(neg_z)
        if ceiling is not None:
            values.clamp_(max=ceiling)
        if not negated:
            values.neg_()
        elif shift is not None:
            values.add_(shift)
        return _skew_view(_scatter_columns(buf, values, k_a), rows, m), negated and shift is not None
    view = _skew_view(_scatter_columns(buf, neg_z, k_a), rows, m)
    torch.ops.aten.softplus.out(view, 1, 20, out=view)
    if ceiling is not None:
        view.clamp_(max=ceiling)
    return (view if negated else view.neg_()), False


def _fused_attention(q_c, k, v, bias, scale):
    """One tile through a fused kernel: (out, logsumexp or None)."""
    if (q_c.device.type == "cpu" and q_c.shape[-1] == v.shape[-1] and q_c.dtype in (torch.float32, torch.float64)
            and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")):
        # the CPU flash kernel (what F.scaled_dot_product_attention runs here) also returns the row
        # log-sum-exp, which backward reuses instead of renormalising; it reads the mask through its
        # strides, so the skewed log M view goes in without a copy
        try:
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q_c, k, v, 0.0, False, attn_mask=bias,
                                                                             scale=scale)
        except RuntimeError:  # pragma: no cover - a constraint of this torch build
            pass
    return F.scaled_dot_product_attention(q_c, k, v, attn_mask=bias, scale=scale), None


def _softmax2_(s):
    """In-place base-2 softmax over the last dim of ``s = log2e · logits``; returns (p, natural
    logsumexp of the logits). Rows with no allowed key are all 0 (logsumexp 0, as flash)."""
    row_max = s.amax(-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    p = s.sub_(row_max).exp2_()
    total = p.sum(-1, keepdim=True)
    p.div_(total.clamp_min(torch.finfo(p.dtype).tiny))
    lse = torch.where(total > 0, (total.log2() + row_max) / _LOG2E, torch.zeros_like(total))
    return p, lse.squeeze(-1)


def _tile_allowed(g0, g1, H, rows, m, t0, causal, kpm, device):
    """(G|1, rows, m) bool for the pairs g0 … g1 − 1 (pair g = b·H + h), or None."""
    allowed = causal_mask().shifted(t0).materialize(rows, m, device=device)[0] if causal else None  # (1, rows, m)
    if kpm is not None:
        keep = ~kpm[torch.arange(g0, g1, device=device) // H][:, None, :]  # (G, 1, m)
        allowed = keep if allowed is None else allowed & keep
    return allowed


class _DynamicMaskAttention(torch.autograd.Function):
    """Chunked, recomputing DMAN attention (MAN Eq. 4 + 12).

    Saves q, k, v, a, P, U, the output and the row log-sum-exp only, and works on tiles of (batch·head
    pairs) × (query rows) × (all keys). ``log M = logsigmoid(a_t + U_h + P[t − s])`` takes at most
    ``2D + 1`` values per row, so the transcendental functions run on a ``(pairs, rows, 2D + 1)`` table and
    the tile's bias is spread from it into a buffer whose columns are relative distances (a skewed
    view, :func:`_skew_view`), which the fused attention kernel reads in place. Backward rebuilds the
    bias with ``− lse`` folded in, ``p = exp2(log2e · (scores + log M − lse))``, ``dS = p ⊙ (dp − rowsum(dO ⊙
    O))`` — written into the same skewed buffer, so the gradient of ``log M`` summed per relative distance
    is a handful of column-block sums — and returns the gradients of q, k, v and, through ``dz = dS ⊙ (1 −
    M)``, of ``a``, ``P`` and ``U`` (exact; it does not rely on SDPA returning a bias gradient).
    """

    @staticmethod
    def forward(ctx, q, k, v, a, table, u, kpm, causal, q_offset, drop_p, seed, ceiling):
        B, H, n, d_k = q.shape
        m, d_v = k.shape[2], v.shape[-1]
        BH = B * H
        scale = 1.0 / math.sqrt(d_k)
        D = (table.numel() - 1) // 2
        pairs, rows = _tile_plan(BH, n, m, max(d_k, d_v))
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()  # saved instead of the strided views
        q3, k3, v3 = q.view(BH, n, d_k), k.view(BH, m, d_k), v.view(BH, m, d_v)
        neg_row_bias = (a[:, None, :] + u[None, :, None]).reshape(BH, n).neg_()  # −(a_t + U_h)
        neg_rev_table = table.flip(0).neg_()  # −P[D − u]: column u of a tile's table is the distance D − u
        out = q.new_empty(B, H, n, d_v)
        out3 = out.view(BH, n, d_v)
        lse = q.new_empty(BH, n)
        gen = seeded_generator(q.device, seed) if drop_p > 0 else None
        fused_lse = True
        buf = None  # the tile's skewed log M buffer, reused while the tile shape stays
        for g0 in range(0, BH, pairs):
            g1 = min(BH, g0 + pairs)
            for i0 in range(0, n, rows):
                i1 = min(n, i0 + rows)
                c, t0 = i1 - i0, q_offset + i0
                ulo, w, k_a = _distance_columns(D, t0, c, m)
                allowed = _tile_allowed(g0, g1, H, c, m, t0, causal, kpm, q.device)
                if buf is None or buf.shape[:2] != (g1 - g0, c):
                    buf = q.new_empty(g1 - g0, c, m + c - 1)
                neg_z = neg_row_bias[g0:g1, i0:i1, None] + neg_rev_table[ulo:ulo + w]  # (G, c, w): −z
                fused = gen is None and (g1 - g0) * c * m >= SDPA_MIN_ELEMENTS
                bias, _ = _log_mask(buf, neg_z, k_a, c, m, negated=not fused, ceiling=ceiling)  # (G, c, m) view
                q_t = q3[g0:g1, i0:i1]
                if fused:
                    if allowed is not None:  # -inf where not allowed; empty rows get a finite bias, zeroed below
                        bias = torch.where(allowed, bias, float("-inf"))
                        bias = torch.where(allowed.any(-1, keepdim=True), bias, 0.0)
                    o_t, lse_t = _fused_attention(q_t[:, None], k3[g0:g1, None], v3[g0:g1, None], bias[:, None],
                                                  scale)
                    out3[g0:g1, i0:i1] = o_t[:, 0]
                    if lse_t is None:
                        fused_lse = False
                    else:
                        lse[g0:g1, i0:i1] = lse_t[:, 0]
                else:  # small tiles (one fused call costs more than it saves) and dropout: explicit softmax
                    s = torch.baddbmm(bias, q_t, k3[g0:g1].transpose(-1, -2), beta=-_LOG2E, alpha=scale * _LOG2E)
                    if allowed is not None:
                        s.masked_fill_(~allowed, float("-inf"))
                    p, lse[g0:g1, i0:i1] = _softmax2_(s)
                    if gen is not None:
                        p.mul_(keep_mask(p, drop_p, gen))
                    if c == n or g1 - g0 == 1:  # a contiguous slice of out
                        torch.bmm(p, v3[g0:g1], out=out3[g0:g1, i0:i1])
                    else:
                        out3[g0:g1, i0:i1] = torch.bmm(p, v3[g0:g1])
                if allowed is not None:
                    out3[g0:g1, i0:i1].masked_fill_(~allowed.any(-1, keepdim=True), 0.0)
                del bias
        del buf
        ctx.save_for_backward(q, k, v, a, table, u, out, lse if fused_lse else torch.empty(0),
                              kpm if kpm is not None else torch.empty(0))
        ctx.has_kpm, ctx.causal, ctx.q_offset, ctx.drop_p, ctx.seed, ctx.tiles, ctx.ceiling = (
            kpm is not None, causal, q_offset, drop_p, seed, (pairs, rows), ceiling)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        q, k, v, a, table, u, out, lse, kpm = ctx.saved_tensors
        kpm = kpm if ctx.has_kpm else None
        lse = lse if lse.numel() else None
        B, H, n, d_k = q.shape
        m, d_v = k.shape[2], v.shape[-1]
        BH = B * H
        scale = 1.0 / math.sqrt(d_k)
        D = (table.numel() - 1) // 2
        pairs, rows = ctx.tiles
        q3, k3, v3 = q.view(BH, n, d_k), k.view(BH, m, d_k), v.view(BH, m, d_v)
        neg_row_bias = (a[:, None, :] + u[None, :, None]).reshape(BH, n).neg_()  # −(a_t + U_h)
        neg_rev_table = table.flip(0).neg_()
        grad_q = torch.empty_like(q, memory_format=torch.contiguous_format)
        grad_k = torch.zeros_like(k, memory_format=torch.contiguous_format)
        grad_v = torch.zeros_like(v, memory_format=torch.contiguous_format)
        grad_q3, grad_k3, grad_v3 = grad_q.view(BH, n, d_k), grad_k.view(BH, m, d_k), grad_v.view(BH, m, d_v)
        grad_row = a.new_empty(BH, n)  # Σ_s dz per (pair, query): the gradient of a_t + U_h
        grad_rev_table = torch.zeros_like(table)
        gen = seeded_generator(q.device, ctx.seed) if ctx.drop_p > 0 else None
        g3 = grad_out.contiguous().view(BH, n, d_v)
        neg_row_dot = (g3 * out.view(BH, n, d_v)).sum(-1, keepdim=True).neg_()  # −D_i = −dO_i · O_i
        buffers = {}  # per tile shape: the skewed buffers of p and of dS (dS's gaps stay 0: only the view is written)
        for g0 in range(0, BH, pairs):
            g1 = min(BH, g0 + pairs)
            kt_t = k3[g0:g1].transpose(-1, -2)
            # [v_s, 1]: dp − D_i = [dO_i, −D_i] · [v_s, 1] in one matmul (no broadcast pass)
            vt_aug = torch.cat([v3[g0:g1], v3.new_ones(g1 - g0, m, 1)], dim=-1).transpose(-1, -2) if gen is None \
                else v3[g0:g1].transpose(-1, -2)
            for i0 in range(0, n, rows):
                i1 = min(n, i0 + rows)
                G, c, t0 = g1 - g0, i1 - i0, ctx.q_offset + i0
                q_t, g_t = q3[g0:g1, i0:i1], g3[g0:g1, i0:i1]
                if (G, c) not in buffers:
                    buffers.clear()
                    buffers[G, c] = (q.new_empty(G, c, m + c - 1), q.new_zeros(G, c, m + c - 1))
                buf_p, buf_ds = buffers[G, c]
                ulo, w, k_a = _distance_columns(D, t0, c, m)
                neg_z = neg_row_bias[g0:g1, i0:i1, None] + neg_rev_table[ulo:ulo + w]  # (G, c, w): −z
                # −log M + lse (−log M = softplus(−z)) in the skewed view of buf_p
                lse_t = lse[g0:g1, i0:i1, None] if lse is not None else None
                p, shifted = _log_mask(buf_p, neg_z, k_a, c, m, negated=True, shift=lse_t, ceiling=ctx.ceiling)
                floored = None if ctx.ceiling is None else F.softplus(neg_z) > ctx.ceiling  # M below the floor
                one_minus_m = neg_z.sigmoid_()  # 1 − M = sigmoid(−z) = d log M / dz
                if floored is not None:
                    one_minus_m.masked_fill_(floored, 0.0)  # a floored log M is constant
                p.baddbmm_(q_t, kt_t, beta=-_LOG2E, alpha=scale * _LOG2E)  # in place: log2e · (scores + log M [− lse])
                if lse_t is not None and not shifted:
                    p.sub_(lse_t * _LOG2E)
                allowed = _tile_allowed(g0, g1, H, c, m, t0, ctx.causal, kpm, q.device)
                if allowed is not None:
                    p.masked_fill_(~allowed, float("-inf"))
                p = _softmax2_(p)[0] if lse is None else p.exp2_()  # p = exp(scores + log M − lse)
                ds = _skew_view(buf_ds, c, m)
                neg_d = neg_row_dot[g0:g1, i0:i1]
                if gen is None:
                    torch.bmm(torch.cat([g_t, neg_d], dim=-1), vt_aug, out=ds)  # dp − D_i
                    grad_v3[g0:g1].baddbmm_(p.transpose(-1, -2), g_t)
                else:
                    keep = keep_mask(p, ctx.drop_p, gen)
                    torch.bmm(g_t, vt_aug, out=ds).mul_(keep).add_(neg_d)  # dp ⊙ keep − D_i
                    grad_v3[g0:g1].baddbmm_((p * keep).transpose(-1, -2), g_t)
                    del keep
                ds.mul_(p)  # gradient of the scores (and of log M)
                del p
                if c == n or G == 1:
                    torch.baddbmm(grad_q3[g0:g1, i0:i1], ds, k3[g0:g1], beta=0, alpha=scale,
                                  out=grad_q3[g0:g1, i0:i1])
                else:
                    grad_q3[g0:g1, i0:i1] = torch.bmm(ds, k3[g0:g1]).mul_(scale)
                grad_k3[g0:g1].baddbmm_(ds.transpose(-1, -2), q_t, alpha=scale)
                dz = _gather_columns(buf_ds, k_a, w).mul_(one_minus_m)  # (G, c, w): Σ dS ⊙ (1 − M) per distance
                del ds, one_minus_m
                grad_row[g0:g1, i0:i1] = dz.sum(-1)
                grad_rev_table[ulo:ulo + w] += dz.sum((0, 1))
        grad_row = grad_row.view(B, H, n)
        return (grad_q, grad_k, grad_v, grad_row.sum(1), grad_rev_table.flip(0), grad_row.sum((0, 2)),
                None, None, None, None, None, None)


def dynamic_mask_kernel(q, k, v, query_logit, distance_bias, head_bias, *, key_padding_mask, causal: bool,
                        q_offset: int, dropout_p: float, mask_floor: float | None = None) -> torch.Tensor:
    """DMAN attention of q ``(B, H, n, d_k)``, k ``(B, H, m, d_k)``, v ``(B, H, m, d_v)`` with the mask
    ``M = sigmoid(a_t + P[clip(t − s)] + U_h)``: ``query_logit`` a ``(B, n)``, ``distance_bias`` P
    ``(2D + 1,)``, ``head_bias`` U ``(H,)``; queries at absolute positions ``q_offset …``; ``causal``
    hides later keys; ``key_padding_mask`` ``(B, m)`` True = padding. Rows with no allowed key are 0.
    ``mask_floor`` ``ε``: ``log max(M, ε)`` instead of ``log M`` (no gradient where ``M < ε``)."""
    seed = new_seed() if dropout_p > 0 else 0
    ceiling = None if mask_floor is None else -math.log(mask_floor)  # the cap on −log M
    return _DynamicMaskAttention.apply(q, k, v, query_logit, distance_bias, head_bias, key_padding_mask, bool(causal),
                                       int(q_offset), float(dropout_p), seed, ceiling)
