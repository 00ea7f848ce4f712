"""Softmax attention over a band ``i − left <= j <= i + right`` in O(n · band) time and memory.

Queries are processed in blocks of ``C``; each block attends to the ``C + width − 1`` keys it can reach (an
``unfold`` view of the halo of keys), laid out side by side for the heads of a CSAN 2D area, in one batched
matmul. :class:`_BandedAttention` walks the blocks in chunks of at most :data:`CHUNK_ELEMENTS` and keeps
only q, k, v, the output and one log-sum-exp per row for backward, recomputing the band scores there
(FlashAttention's memory profile on a band). No ``n × n`` tensor exists in forward or backward.

This is the kernel of every static local mask of the library: CSAN 1D/2D (CSAN Eq. 4–9), SMAN with a
fixed radius (MAN Eq. 11) and MTSA's window heads (``score_mod = F.logsigmoid``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .precision import in_working_precision
from .random import keep_mask, new_seed, seeded_generator
from .softmax import masked_softmax

__all__ = ["banded_kernel", "gather_heads", "halo_rows", "rows_with_key", "unsupported", "CHUNK_ELEMENTS"]


def unsupported(*, band: bool) -> list[str]:
    """Why the band kernel cannot run a call (an empty list when it can): ``band`` — the mask is one fixed band
    ``i − left <= j <= i + right`` on every head, over a whole sequence (queries and keys from position 0)."""
    if band:
        return []
    return ["needs a mask that is a fixed band i - left <= j <= i + right on every head over a whole sequence (a "
            "window with a fixed radius; not a per-sentence radius, a directional mask or a decoding step)"]


def gather_heads(t: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    """(B, H, n, d) → (B, H, A, n, d) with ``out[:, h, a] = t[:, index[h, a]]``; ``index`` None = every head
    sees itself only (CSAN 1D: a view, no copy)."""
    if index is None:
        return t.unsqueeze(2)
    return t[:, index]


def rows_with_key(kpm: torch.Tensor | None, n: int, left: int, right: int) -> torch.Tensor | None:
    """(B, 1, n, 1) bool: does query i have a non-padding key in ``[i − left, i + right]`` (prefix counts of
    the kept keys)? None when every row has one (no padding and the band holds the query itself)."""
    if kpm is None:
        return None
    keep = (~kpm).to(torch.int32)
    cs = F.pad(keep.cumsum(-1), (1, 0))  # (B, n + 1): cs[:, t] = keys kept among positions < t
    i = torch.arange(n, device=kpm.device)
    hi = (i + right + 1).clamp(min=0, max=n)
    lo = (i - left).clamp(min=0, max=n)
    return ((cs[:, hi] - cs[:, lo]) > 0)[:, None, :, None]


def block_size(width: int) -> int:
    """Queries per block: the band of one block spans ``C + width − 1`` keys, so the wasted share of
    the score block is ``(C − 1) / (C + width − 1)``; 16–64 keeps matmuls efficient. Independent of the
    sequence length (shorter sequences are padded to one block), so a compiled graph serves every length.

    Under ``torch.compile`` :func:`_banded_autograd` adds one block of padding: with a single block (every
    length up to ``C``) the traced graph specialised on the block count being 1 (a reshape skips a size-1
    dimension) and recompiled at length ``C + 1``; with at least two blocks for every length, the graph traced
    at the second length serves every later one (``tests/test_compile.py``, lengths from 1 up). The extra
    block costs ``C`` padded query rows per call."""
    return max(16, min(64, width))


def banded_kernel(q, k, v, left, right, index, valid, kpm, scale, score_mod, drop):
    """Softmax attention of q ``(B, H, n, d_k)`` over the band ``i − left <= j <= i + right`` of the keys of the
    head area (``index`` ``(H, A)``: head ``h`` sees the keys of heads ``index[h]``, None = its own;
    ``valid`` ``(H, A)``: which area entries exist, None = all), non-padding keys (``kpm`` ``(B, n)``, True =
    padding) only, with ``score_mod`` applied to the scaled score and dropout ``drop``. Returns (B, H, n, d_v);
    rows with no allowed key are 0.

    The memory-lean custom-autograd path for ``score_mod`` None or ``F.logsigmoid``
    (:class:`_BandedAttention`, computed in float32 for half-precision inputs), plain autograd through
    :func:`_banded_autograd` for any other callable (whose parameters, if it has any, must receive gradients)
    and under ``torch.compile``."""
    if score_mod is None or score_mod is F.logsigmoid:
        if torch.compiler.is_compiling():  # the same blocks under plain autograd: traceable for any length
            return in_working_precision(_banded_autograd, q, k, v, left=left, right=right, index=index, valid=valid,
                                        kpm=kpm, scale=scale, score_mod=score_mod, drop=drop)
        return in_working_precision(lambda q, k, v: _BandedAttention.apply(
            q, k, v, left, right, index, valid, kpm, scale, score_mod is F.logsigmoid, drop), q, k, v)
    return _banded_autograd(q, k, v, left, right, index, valid, kpm, scale, score_mod, drop)


def _banded_autograd(q, k, v, left, right, index, valid, kpm, scale, score_mod, drop):
    """Blocked band kernel under plain autograd: O(n · width · head_window) time and memory, forward and
    backward, but autograd keeps every block's scores, probabilities and band copies of k and v."""
    B, H, n, d_k = q.shape
    d_v = v.shape[-1]
    A = 1 if index is None else index.shape[1]
    width = left + right + 1
    C = block_size(width)
    nb = -(-n // C) + int(torch.compiler.is_compiling())  # compiled: never one block (block_size)
    n_pad = nb * C
    L = C + width - 1  # keys reachable from one query block
    tail = right + n_pad - n

    # contiguous inputs: a pad of 0 rows (n % C == 0) may alias a transposed head view, and a compiled graph
    # traced at another length would then view it with the wrong strides
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    q_blocks = F.pad(q, (0, 0, 0, n_pad - n)).reshape(B, H, nb, C, d_k)  # (B, H, nb, C, d_k)
    k_area = gather_heads(F.pad(k, (0, 0, left, tail)), index)  # (B, H, A, n_pad + width − 1, d_k)
    v_area = gather_heads(F.pad(v, (0, 0, left, tail)), index)
    k_band = k_area.unfold(3, L, C)  # (B, H, A, nb, d_k, L) overlapping view
    v_band = v_area.unfold(3, L, C)  # (B, H, A, nb, d_v, L)
    k_band = k_band.permute(0, 1, 3, 4, 2, 5).reshape(B, H, nb, d_k, A * L)  # keys of the area side by side
    v_band = v_band.permute(0, 1, 3, 2, 5, 4).reshape(B, H, nb, A * L, d_v)

    scores = torch.matmul(q_blocks, k_band).mul_(scale)  # (B, H, nb, C, A·L); in place: matmul saves no output
    if score_mod is not None:
        scores = score_mod(scores)
    probs = masked_softmax(scores, band_allowed(B, H, n, C, L, left, 0, nb, A, valid, kpm, q.device))
    if drop > 0:
        probs = F.dropout(probs, drop, training=True)
    out = torch.matmul(probs, v_band)  # (B, H, nb, C, d_v)
    out = out.view(B, H, n_pad, d_v)
    if torch.compiler.is_compiling():  # a slice's layout depends on n == n_pad, which would guard the graph on n % C
        return out.index_select(2, torch.arange(n, device=out.device))
    return out[:, :, :n]


def band_allowed(B, H, n, C, L, left, j0, nbc, A, valid, kpm, device):
    """(B|1, H|1, nbc, C, A·L) bool for query blocks ``j0 … j0 + nbc − 1``: slot ``l`` of block ``j`` is
    key ``j·C + l − left``; allowed when inside the band of its row, inside the sequence, not padding and
    (2D) of a head inside the area (``valid`` ``(H, A)``, None = every area entry exists)."""
    width = L - C + 1
    c = torch.arange(C, device=device)[:, None]
    slot = torch.arange(L, device=device)[None, :]
    in_band = (slot - c >= 0) & (slot - c < width)  # (C, L)
    key_pos = torch.arange(j0, j0 + nbc, device=device)[:, None] * C + slot - left  # (nbc, L)
    key_ok = ((key_pos >= 0) & (key_pos < n))[None]  # (1, nbc, L)
    if kpm is not None:
        a = j0 * C - left
        keep = halo_rows(~kpm, a, a + nbc * C + width - 1, value=False, dim=1)  # (B, nbc·C + width − 1)
        key_ok = key_ok & keep.unfold(1, L, C)  # (B, nbc, L)
    allowed = in_band[None, None, :, None, :] & key_ok[:, :, None, None, :]  # (B|1, nbc, C, 1, L)
    if valid is None:  # the same mask for every head
        return allowed.expand(-1, -1, -1, A, -1).reshape(allowed.shape[0], 1, nbc, C, A * L)
    allowed = allowed[:, None] & valid[None, :, None, None, :, None]  # (B|1, H, nbc, C, A, L)
    return allowed.reshape(allowed.shape[0], H, nbc, C, A * L)


def halo_rows(t: torch.Tensor, a: int, b: int, value=0.0, dim: int = 2) -> torch.Tensor:
    """Rows ``a … b − 1`` of ``t`` along ``dim`` (the sequence axis), zero- (``value``-) filled where the
    range leaves ``[0, n)``: a halo slice without a padded copy of the whole tensor."""
    n = t.shape[dim]
    lo, hi = max(a, 0), min(b, n)
    x = t.narrow(dim, lo, hi - lo)
    if lo == a and hi == b and not torch.compiler.is_compiling():  # compiled: no guard on the lengths' relation
        return x
    pad = [0, 0] * (t.dim() - 1 - dim) + [lo - a, b - hi]
    return F.pad(x, pad, value=value)


# Elements of the largest per-chunk temporary of the custom band kernel (a band copy of k or v, or a
# block of scores): 2**18 = 1 MiB in float32. Tests lower it to run several chunks on tiny inputs.
CHUNK_ELEMENTS = 2**18


class _BandedAttention(torch.autograd.Function):
    """Band attention with FlashAttention-style memory: forward and backward walk the query blocks in
    chunks of bounded size; only q, k, v, the output and one log-sum-exp per row are kept for backward,
    where each chunk's scores and probabilities are recomputed (one extra ``q·kᵀ`` matmul).

    Per chunk of query blocks ``[j0, j1)`` (queries ``j0·C … j1·C − 1``) the keys and values of the halo
    ``[j0·C − left, j1·C + right)`` are sliced (zero-filled at the edges), gathered over the head area and
    laid out as ``(…, nbc, d, A·L)`` band blocks. Backward (``P`` the probabilities, ``dO`` the output
    gradient, ``Δ_i = dO_i·O_i``)::

        dV_band = P_dropᵀ dO        dP = (dO V_bandᵀ) ⊙ keep / (1 − p)        dS = P ⊙ (dP − Δ) ⊙ f'(s)
        dQ = scale · dS K_band      dK_band = scale · dSᵀ Q

    and the band gradients are overlap-added back to positions (and, in 2D, index-added to their heads).
    ``f`` is the score_mod (identity or log-sigmoid, ``f' = sigmoid(−s)``). Dropout masks are drawn from
    a generator seeded per chunk and redrawn in backward. Rows with no allowed key get ``lse = +inf``:
    probability 0, output 0, zero and finite gradients. Not twice differentiable."""

    @staticmethod
    def forward(ctx, q, k, v, left, right, index, valid, kpm, scale, log_sigmoid, drop):
        B, H, n, d_k = q.shape
        d_v = v.shape[-1]
        A = 1 if index is None else index.shape[1]
        C = block_size(left + right + 1)
        L = C + left + right
        out = q.new_empty(B, H, n, d_v)
        lse = q.new_empty(B, H, n)
        seed = new_seed() if drop > 0 else 0
        for j0, nbc, kb, vb, allowed in _band_chunks(k, v, left, right, index, valid, kpm, C, L, n, A):
            lo, hi = j0 * C, min(n, (j0 + nbc) * C)
            qc = halo_rows(q, lo, (j0 + nbc) * C).reshape(B, H, nbc, C, d_k)
            s = torch.matmul(qc, kb).mul_(scale)  # (B, H, nbc, C, A·L)
            if log_sigmoid:
                s = F.logsigmoid(s)
            s.masked_fill_(~allowed, float("-inf"))
            m = s.amax(-1, keepdim=True)
            m.masked_fill_(m == float("-inf"), 0.0)  # rows with no allowed key
            p = s.sub_(m).exp_()
            total = p.sum(-1, keepdim=True)
            empty = total == 0
            p.div_(total.masked_fill(empty, 1.0))
            lse_c = (m + total.log()).masked_fill_(empty, float("inf")).view(B, H, nbc * C)
            lse[:, :, lo:hi] = lse_c[:, :, :hi - lo]
            if drop > 0:
                p.mul_(_chunk_keep_mask(p, drop, seed, j0))
            o = torch.matmul(p, vb).view(B, H, nbc * C, d_v)
            out[:, :, lo:hi] = o[:, :, :hi - lo]
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (left, right, index, valid, kpm, scale, log_sigmoid, drop, seed, C, L)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        left, right, index, valid, kpm, scale, log_sigmoid, drop, seed, C, L = ctx.args
        B, H, n, d_k = q.shape
        d_v = v.shape[-1]
        A = 1 if index is None else index.shape[1]
        width = left + right + 1
        grad_out = grad_out.contiguous()
        dq = torch.empty_like(q)
        dk = torch.zeros_like(k)
        dv = torch.zeros_like(v)
        for j0, nbc, kb, vb, allowed in _band_chunks(k, v, left, right, index, valid, kpm, C, L, n, A):
            lo, top = j0 * C, (j0 + nbc) * C
            hi = min(n, top)
            qc = halo_rows(q, lo, top).reshape(B, H, nbc, C, d_k)
            doc = halo_rows(grad_out, lo, top).reshape(B, H, nbc, C, d_v)
            delta = (doc * halo_rows(out, lo, top).reshape(B, H, nbc, C, d_v)).sum(-1, keepdim=True)
            lse_c = halo_rows(lse, lo, top, value=float("inf")).reshape(B, H, nbc, C, 1)
            s = torch.matmul(qc, kb).mul_(scale)
            slope = torch.sigmoid(-s) if log_sigmoid else None  # d logsigmoid(s) / ds
            f = F.logsigmoid(s) if log_sigmoid else s
            p = f.sub_(lse_c).masked_fill_(~allowed, float("-inf")).exp_()  # (B, H, nbc, C, A·L)
            dp = torch.matmul(doc, vb.transpose(-1, -2))
            if drop > 0:
                keep = _chunk_keep_mask(p, drop, seed, j0)
                dp.mul_(keep)
                dvb = torch.matmul((p * keep).transpose(-1, -2), doc)  # (B, H, nbc, A·L, d_v)
            else:
                dvb = torch.matmul(p.transpose(-1, -2), doc)
            ds = dp.sub_(delta).mul_(p)
            if slope is not None:
                ds.mul_(slope)
            ds.mul_(scale)
            dqc = torch.matmul(ds, kb.transpose(-1, -2)).view(B, H, nbc * C, d_k)
            dq[:, :, lo:hi] = dqc[:, :, :hi - lo]
            dkb = torch.matmul(ds.transpose(-1, -2), qc)  # (B, H, nbc, A·L, d_k)
            a = lo - left
            _scatter_band(dk, dkb, a, nbc, C, L, width, index, valid)
            _scatter_band(dv, dvb, a, nbc, C, L, width, index, valid)
        return dq, dk, dv, None, None, None, None, None, None, None, None


def _chunk_keep_mask(p: torch.Tensor, drop: float, seed: int, j0: int) -> torch.Tensor:
    """The dropout keep-mask of the chunk starting at block ``j0``: the same values in forward and backward
    (a generator seeded with ``seed + j0``)."""
    return keep_mask(p, drop, seeded_generator(p.device, seed + j0))


def _band_chunks(k, v, left, right, index, valid, kpm, C, L, n, A):
    """Yield ``(j0, nbc, k_band, v_band, allowed)`` for chunks of query blocks whose largest temporary
    stays under ``CHUNK_ELEMENTS``: ``k_band`` ``(B, H, nbc, d_k, A·L)``, ``v_band``
    ``(B, H, nbc, A·L, d_v)``, ``allowed`` ``(B|1, H|1, nbc, C, A·L)``."""
    B, H, _, d_k = k.shape
    d_v = v.shape[-1]
    width = left + right + 1
    nb = -(-n // C)
    per_block = B * H * A * L * max(C, d_k, d_v)
    step = max(1, min(nb, CHUNK_ELEMENTS // per_block))
    step = -(-nb // -(-nb // step))  # equal chunks
    for j0 in range(0, nb, step):
        nbc = min(step, nb - j0)
        a = j0 * C - left
        b = a + nbc * C + width - 1
        kc = gather_heads(halo_rows(k, a, b), index)  # (B, H, A, T, d_k)
        vc = gather_heads(halo_rows(v, a, b), index)
        kb = kc.unfold(3, L, C).permute(0, 1, 3, 4, 2, 5).reshape(B, H, nbc, d_k, A * L)
        vb = vc.unfold(3, L, C).permute(0, 1, 3, 2, 5, 4).reshape(B, H, nbc, A * L, d_v)
        yield j0, nbc, kb, vb, band_allowed(B, H, n, C, L, left, j0, nbc, A, valid, kpm, k.device)


def _scatter_band(grad, band, a, nbc, C, L, width, index, valid):
    """Add ``band`` ``(B, H, nbc, A·L, d)`` — gradients of the band blocks of keys ``j·C + a + l`` in the
    area heads ``index[h]`` — into ``grad`` ``(B, H, n, d)``: overlap-add along positions (the windows
    of neighbouring blocks overlap by ``width − 1`` keys), index-add over heads, drop the halo rows."""
    B, H, n, d = grad.shape
    A = 1 if index is None else index.shape[1]
    T = nbc * C + width - 1
    pieces = -(-L // C)
    band = band.view(B, H, nbc, A, L, d)
    acc = band.new_zeros(B, H, A, (nbc + pieces) * C, d)
    for piece in range(pieces):
        r0, r1 = piece * C, min(L, piece * C + C)
        target = acc[:, :, :, r0:r0 + nbc * C].view(B, H, A, nbc, C, d)[:, :, :, :, :r1 - r0]
        target.add_(band[:, :, :, :, r0:r1].permute(0, 1, 3, 2, 4, 5))
    acc = acc[:, :, :, :T]
    if index is None:
        per_head = acc[:, :, 0]
    else:
        per_head = acc.new_zeros(B, H, T, d).index_add_(1, index.reshape(-1), acc.reshape(B, H * A, T, d))
    lo, hi = max(a, 0), min(a + T, n)
    grad[:, :, lo:hi] += per_head[:, :, lo - a:hi - a]


