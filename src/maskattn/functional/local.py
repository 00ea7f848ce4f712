"""Local (windowed) self-attention: CSAN 1D / 2D and a banded kernel whose cost grows with n·window.

CSAN (Yang et al., NAACL 2019) restricts the query ``q_i^h`` of head ``h`` to the keys and values of a
window of ``M + 1`` positions centred on ``i`` (Eq. 4–6)::

    K̂^h = {k^h_{i-M/2}, …, k^h_i, …, k^h_{i+M/2}}                  (4)
    V̂^h = {v^h_{i-M/2}, …, v^h_i, …, v^h_{i+M/2}}                  (5)
    o^h_i = Att(q^h_i, K̂^h) V̂^h                                     (6)

and, in 2D, to the union of those windows over the ``N + 1`` heads centred on ``h`` (Eq. 7–9)::

    K̃^h = ∪[K̂^{h-N/2}, …, K̂^h, …, K̂^{h+N/2}]                       (7)
    Ṽ^h = ∪[V̂^{h-N/2}, …, V̂^h, …, V̂^{h+N/2}]                       (8)
    o^h_i = Att(q^h_i, K̃^h) Ṽ^h                                     (9)

with ONE softmax over the whole ``(N+1) × (M+1)`` area. Windows are truncated at the sequence edges;
the head area is truncated at the first and last heads (``head_edges="truncate"``, the paper) or
wraps around for keys *and* values (``head_edges="circular"``). The authors' code wraps the keys but
not the values; that mismatched form is deliberately not offered.

Backends (``backend=``):

* ``"banded"``    — pure-torch blocked band: queries in blocks of ``C``, each block against the
  ``C + window − 1`` keys it can reach (an ``unfold`` view of the padded keys), one batched matmul.
  Time and memory are O(n · window) forward *and* backward; no ``n × n`` tensor exists. CPU and GPU.
  A custom autograd Function (:class:`_BandedAttention`) walks the blocks in bounded chunks and saves
  only q, k, v, the output and one log-sum-exp per row, recomputing the band scores in backward.
* ``"flex"``      — FlexAttention with a block mask that skips empty blocks (O(n · window) on CUDA;
  eager and inference-only on CPU).
* ``"sdpa"``      — dense masked ``F.scaled_dot_product_attention`` (O(n²); the baseline).
* ``"reference"`` — the explicit gathered-keys form of DESIGN.md §1: keys of heads ``h−N/2 … h+N/2``
  stacked along the key axis (``(B, H, n, (N+1)·n)`` scores), float64-capable; the specification.
* ``"auto"``      — ``flex`` on CUDA (without dropout), ``banded`` otherwise.

:func:`banded_attention` is the same band kernel for any static local mask of the library (SMAN's
radius, MTSA window heads): softmax attention over ``i − left ≤ j ≤ i + right`` with an optional
elementwise ``score_mod`` applied to the scaled score before the softmax.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .._validation import (
    check_choice,
    check_key_padding_mask,
    check_probability,
    check_qkv,
    describe,
)
from ..backends import flex_attention_call, flex_available, resolve_backend
from ..masks import Mask

LOCAL_BACKENDS = ("reference", "sdpa", "flex", "banded")
LOCAL_BACKEND_CHOICES = ("auto",) + LOCAL_BACKENDS
HEAD_EDGES = ("truncate", "circular")

ScoreMod = Callable[[torch.Tensor], torch.Tensor]

__all__ = [
    "local_attention",
    "local_attention_maps",
    "banded_attention",
    "check_window",
    "check_head_window",
    "LOCAL_BACKENDS",
    "LOCAL_BACKEND_CHOICES",
    "HEAD_EDGES",
]


# --------------------------------------------------------------------------------------------------
# argument checks
# --------------------------------------------------------------------------------------------------

def check_window(window, name: str = "window") -> int:
    """An odd positive int ``M + 1`` (the number of positions centred on the query)."""
    if isinstance(window, bool) or not isinstance(window, int):
        raise TypeError(f"{name} must be an odd positive int (M+1 positions centred on the query), "
                        f"got {describe(window)}")
    if window < 1 or window % 2 == 0:
        raise ValueError(f"{name} must be an odd positive int (M+1 positions centred on the query), got {window}")
    return window


def check_head_window(head_window, num_heads: int) -> int:
    """An odd positive int ``N + 1`` no larger than ``num_heads``."""
    check_window(head_window, "head_window")
    if head_window > num_heads:
        raise ValueError(f"head_window ({head_window}) must not exceed the number of heads ({num_heads}); "
                         "CSAN's area spans N+1 <= H heads")
    return head_window


def _check_radius(radius) -> tuple[int, int]:
    """``radius`` as ``(left, right)``: an int ``r >= 0`` means ``(r, r)``."""
    pair = radius if isinstance(radius, tuple) else (radius, radius)
    if len(pair) != 2 or any(isinstance(r, bool) or not isinstance(r, int) for r in pair):
        raise TypeError(f"radius must be an int >= 0 or a tuple (left, right) of ints >= 0, got {describe(radius)}")
    if pair[0] < 0 or pair[1] < 0:
        raise ValueError(f"radius must be >= 0 (|i - j| <= radius), got {radius}")
    return pair


def _check_qkv(q, k, v, key_padding_mask):
    B, H, n, _ = check_qkv(q, k, v, self_attention=True)
    kpm = check_key_padding_mask(key_padding_mask, "key_padding_mask", B, n, f"q has batch {B} and {n} positions")
    if kpm is not None and kpm.device != q.device:
        raise ValueError(f"key_padding_mask is on {kpm.device} but q is on {q.device}")
    return kpm


def _check_scale(scale, d_k: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(d_k)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise ValueError(f"scale must be a positive float or None (1/sqrt(d_k)), got {describe(scale)}")
    return float(scale)


def _resolve(backend: str, device: torch.device, needs_grad: bool, drop: float, score_mod) -> str:
    check_choice(backend, "backend", LOCAL_BACKEND_CHOICES)
    if backend == "auto":
        return "flex" if device.type == "cuda" and drop == 0.0 and flex_available() else "banded"
    if backend == "sdpa" and score_mod is not None:
        raise ValueError("backend='sdpa' cannot apply a score_mod; use backend='banded', 'flex' or 'reference'")
    if backend == "banded":
        return backend
    return resolve_backend(backend, device=device, needs_grad=needs_grad, flex_ok=drop == 0.0)


# --------------------------------------------------------------------------------------------------
# the head area of CSAN 2D
# --------------------------------------------------------------------------------------------------

def _head_area(num_heads: int, head_window: int, head_edges: str, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(index, valid)``, both ``(H, head_window)``: head ``h``'s area holds heads ``index[h, a]``
    (offsets ``−N/2 … N/2``); ``valid`` is False where a truncated area falls off the head axis."""
    offsets = torch.arange(head_window, device=device) - head_window // 2  # (A,)
    source = torch.arange(num_heads, device=device)[:, None] + offsets[None, :]  # (H, A)
    if head_edges == "circular":
        return source % num_heads, torch.ones_like(source, dtype=torch.bool)
    valid = (source >= 0) & (source < num_heads)
    return source.clamp(0, num_heads - 1), valid


def _gather_heads(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """(B, H, n, d) → (B, H, A, n, d) with ``out[:, h, a] = t[:, index[h, a]]``."""
    if index.shape[1] == 1 and bool((index[:, 0] == torch.arange(t.shape[1], device=t.device)).all()):
        return t.unsqueeze(2)  # 1D: the area of head h is head h itself (a view, no copy)
    return t[:, index]


def _rows_with_key(kpm, n: int, left: int, right: int):
    """(B, 1, n, 1) bool: does query i have a non-padding key in ``[i − left, i + right]``? None when every
    row has one (no padding: the diagonal is always in the band)."""
    if kpm is None:
        return None
    keep = (~kpm).to(torch.int32)
    cs = F.pad(keep.cumsum(-1), (1, 0))  # (B, n + 1): cs[:, t] = keys kept among positions < t
    i = torch.arange(n, device=kpm.device)
    hi = (i + right + 1).clamp(max=n)
    lo = (i - left).clamp(min=0)
    return ((cs[:, hi] - cs[:, lo]) > 0)[:, None, :, None]


def _masked_softmax(scores: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis restricted to ``allowed``; rows with no allowed entry give 0 (and
    finite gradients: such rows are filled with 0 before the softmax, then zeroed)."""
    row_any = allowed.any(-1, keepdim=True)
    if bool(row_any.all()):
        return torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    fill = torch.where(row_any, float("-inf"), 0.0).to(scores.dtype)
    probs = torch.softmax(torch.where(allowed, scores, fill), dim=-1)
    return probs * row_any


# --------------------------------------------------------------------------------------------------
# backends
# --------------------------------------------------------------------------------------------------

def _block_size(n: int, width: int) -> int:
    """Queries per block: the band of one block spans ``C + width − 1`` keys, so the wasted share of
    the score block is ``(C − 1) / (C + width − 1)``; 16–64 keeps matmuls efficient."""
    return max(1, min(n, max(16, min(64, width))))


def _banded(q, k, v, left, right, index, valid, kpm, scale, score_mod, drop):
    """The band kernel: the memory-lean custom-autograd path for ``score_mod`` None or ``F.logsigmoid``
    (:class:`_BandedAttention`), plain autograd through :func:`_banded_autograd` for any other callable
    (whose parameters, if it has any, must receive gradients)."""
    if score_mod is None or score_mod is F.logsigmoid:
        return _BandedAttention.apply(q, k, v, left, right, index, valid, kpm, scale,
                                      score_mod is F.logsigmoid, drop)
    return _banded_autograd(q, k, v, left, right, index, valid, kpm, scale, score_mod, drop)


def _banded_autograd(q, k, v, left, right, index, valid, kpm, scale, score_mod, drop):
    """Blocked band kernel under plain autograd: O(n · width · head_window) time and memory, forward and
    backward, but autograd keeps every block's scores, probabilities and band copies of k and v."""
    B, H, n, d_k = q.shape
    d_v = v.shape[-1]
    A = index.shape[1]
    width = left + right + 1
    C = _block_size(n, width)
    nb = -(-n // C)
    n_pad = nb * C
    L = C + width - 1  # keys reachable from one query block
    tail = right + n_pad - n

    q_blocks = (F.pad(q, (0, 0, 0, n_pad - n)) if n_pad > n else q).reshape(B, H, nb, C, d_k)  # (B, H, nb, C, d_k)
    k_area = _gather_heads(F.pad(k, (0, 0, left, tail)), index)  # (B, H, A, n_pad + width - 1, d_k)
    v_area = _gather_heads(F.pad(v, (0, 0, left, tail)), index)
    k_band = k_area.unfold(3, L, C)  # (B, H, A, nb, d_k, L) overlapping view
    v_band = v_area.unfold(3, L, C)  # (B, H, A, nb, d_v, L)
    k_band = k_band.permute(0, 1, 3, 4, 2, 5).reshape(B, H, nb, d_k, A * L)  # keys of the area side by side
    v_band = v_band.permute(0, 1, 3, 2, 5, 4).reshape(B, H, nb, A * L, d_v)

    scores = torch.matmul(q_blocks, k_band).mul_(scale)  # (B, H, nb, C, A·L); in place: matmul saves no output
    if score_mod is not None:
        scores = score_mod(scores)
    probs = _masked_softmax(scores, _band_allowed(B, H, n, C, L, left, 0, nb, valid, kpm, q.device))
    if drop > 0:
        probs = F.dropout(probs, drop, training=True)
    out = torch.matmul(probs, v_band)  # (B, H, nb, C, d_v)
    return out.view(B, H, n_pad, d_v)[:, :, :n]


def _band_allowed(B, H, n, C, L, left, j0, nbc, valid, kpm, device):
    """(B|1, H|1, nbc, C, A·L) bool for query blocks ``j0 … j0 + nbc − 1``: slot ``l`` of block ``j`` is
    key ``j·C + l − left``; allowed when inside the band of its row, inside the sequence, not padding and
    (2D) of a head inside the area."""
    A = valid.shape[1]
    width = L - C + 1
    c = torch.arange(C, device=device)[:, None]
    slot = torch.arange(L, device=device)[None, :]
    in_band = (slot - c >= 0) & (slot - c < width)  # (C, L)
    key_pos = torch.arange(j0, j0 + nbc, device=device)[:, None] * C + slot - left  # (nbc, L)
    key_ok = ((key_pos >= 0) & (key_pos < n))[None]  # (1, nbc, L)
    if kpm is not None:
        a = j0 * C - left
        keep = _rows(~kpm, a, a + nbc * C + width - 1, value=False, dim=1)  # (B, nbc·C + width − 1)
        key_ok = key_ok & keep.unfold(1, L, C)  # (B, nbc, L)
    allowed = in_band[None, None, :, None, :] & key_ok[:, :, None, None, :]  # (B|1, nbc, C, 1, L)
    if bool(valid.all()):  # the same mask for every head
        return allowed.expand(-1, -1, -1, A, -1).reshape(allowed.shape[0], 1, nbc, C, A * L)
    allowed = allowed[:, None] & valid[None, :, None, None, :, None]  # (B|1, H, nbc, C, A, L)
    return allowed.reshape(allowed.shape[0], H, nbc, C, A * L)


def _rows(t: torch.Tensor, a: int, b: int, value=0.0, dim: int = 2) -> torch.Tensor:
    """Rows ``a … b − 1`` of ``t`` along ``dim`` (the sequence axis), zero- (``value``-) filled where the
    range leaves ``[0, n)``: a halo slice without a padded copy of the whole tensor."""
    n = t.shape[dim]
    lo, hi = max(a, 0), min(b, n)
    x = t.narrow(dim, lo, hi - lo)
    if lo == a and hi == b:
        return x
    pad = [0, 0] * (t.dim() - 1 - dim) + [lo - a, b - hi]
    return F.pad(x, pad, value=value)


# Elements of the largest per-chunk temporary of the custom band kernel (a band copy of k or v, or a
# block of scores): 2**18 = 1 MiB in float32. Tests lower it to run several chunks on tiny inputs.
_CHUNK_ELEMENTS = 2**18


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
        A = index.shape[1]
        C = _block_size(n, left + right + 1)
        L = C + left + right
        out = q.new_empty(B, H, n, d_v)
        lse = q.new_empty(B, H, n)
        seed = int(torch.randint(0, 2**62, (), device="cpu")) if drop > 0 else 0
        for j0, nbc, kb, vb, allowed in _band_chunks(k, v, left, right, index, valid, kpm, C, L, n, A):
            lo, hi = j0 * C, min(n, (j0 + nbc) * C)
            qc = _rows(q, lo, (j0 + nbc) * C).reshape(B, H, nbc, C, d_k)
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
                p.mul_(_keep_mask(p, drop, seed, j0))
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
        A = index.shape[1]
        width = left + right + 1
        grad_out = grad_out.contiguous()
        dq = torch.empty_like(q)
        dk = torch.zeros_like(k)
        dv = torch.zeros_like(v)
        for j0, nbc, kb, vb, allowed in _band_chunks(k, v, left, right, index, valid, kpm, C, L, n, A):
            lo, top = j0 * C, (j0 + nbc) * C
            hi = min(n, top)
            qc = _rows(q, lo, top).reshape(B, H, nbc, C, d_k)
            doc = _rows(grad_out, lo, top).reshape(B, H, nbc, C, d_v)
            delta = (doc * _rows(out, lo, top).reshape(B, H, nbc, C, d_v)).sum(-1, keepdim=True)
            lse_c = _rows(lse, lo, top, value=float("inf")).reshape(B, H, nbc, C, 1)
            s = torch.matmul(qc, kb).mul_(scale)
            slope = torch.sigmoid(-s) if log_sigmoid else None  # d logsigmoid(s) / ds
            f = F.logsigmoid(s) if log_sigmoid else s
            p = f.sub_(lse_c).masked_fill_(~allowed, float("-inf")).exp_()  # (B, H, nbc, C, A·L)
            dp = torch.matmul(doc, vb.transpose(-1, -2))
            if drop > 0:
                keep = _keep_mask(p, drop, seed, j0)
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


def _keep_mask(p: torch.Tensor, drop: float, seed: int, j0: int) -> torch.Tensor:
    """Dropout keep-mask scaled by ``1 / (1 − drop)`` for the chunk starting at block ``j0``: the same
    values in forward and backward (a generator seeded with ``seed + j0``)."""
    g = torch.Generator(device=p.device)
    g.manual_seed((seed + j0) % 2**63)
    keep = torch.rand(p.shape, generator=g, device=p.device, dtype=p.dtype) >= drop
    return keep.to(p.dtype).div_(1.0 - drop)


def _band_chunks(k, v, left, right, index, valid, kpm, C, L, n, A):
    """Yield ``(j0, nbc, k_band, v_band, allowed)`` for chunks of query blocks whose largest temporary
    stays under ``_CHUNK_ELEMENTS``: ``k_band`` ``(B, H, nbc, d_k, A·L)``, ``v_band``
    ``(B, H, nbc, A·L, d_v)``, ``allowed`` ``(B|1, H|1, nbc, C, A·L)``."""
    B, H, _, d_k = k.shape
    d_v = v.shape[-1]
    width = left + right + 1
    nb = -(-n // C)
    per_block = B * H * A * L * max(C, d_k, d_v)
    step = max(1, min(nb, _CHUNK_ELEMENTS // per_block))
    step = -(-nb // -(-nb // step))  # equal chunks
    for j0 in range(0, nb, step):
        nbc = min(step, nb - j0)
        a = j0 * C - left
        b = a + nbc * C + width - 1
        kc = _gather_heads(_rows(k, a, b), index)  # (B, H, A, T, d_k)
        vc = _gather_heads(_rows(v, a, b), index)
        kb = kc.unfold(3, L, C).permute(0, 1, 3, 4, 2, 5).reshape(B, H, nbc, d_k, A * L)
        vb = vc.unfold(3, L, C).permute(0, 1, 3, 2, 5, 4).reshape(B, H, nbc, A * L, d_v)
        yield j0, nbc, kb, vb, _band_allowed(B, H, n, C, L, left, j0, nbc, valid, kpm, k.device)


def _scatter_band(grad, band, a, nbc, C, L, width, index, valid):
    """Add ``band`` ``(B, H, nbc, A·L, d)`` — gradients of the band blocks of keys ``j·C + a + l`` in the
    area heads ``index[h]`` — into ``grad`` ``(B, H, n, d)``: overlap-add along positions (the windows
    of neighbouring blocks overlap by ``width − 1`` keys), index-add over heads, drop the halo rows."""
    B, H, n, d = grad.shape
    A = index.shape[1]
    T = nbc * C + width - 1
    pieces = -(-L // C)
    band = band.view(B, H, nbc, A, L, d)
    acc = band.new_zeros(B, H, A, (nbc + pieces) * C, d)
    for piece in range(pieces):
        r0, r1 = piece * C, min(L, piece * C + C)
        target = acc[:, :, :, r0:r0 + nbc * C].view(B, H, A, nbc, C, d)[:, :, :, :, :r1 - r0]
        target.add_(band[:, :, :, :, r0:r1].permute(0, 1, 3, 2, 4, 5))
    acc = acc[:, :, :, :T]
    if A == 1 and bool((index[:, 0] == torch.arange(H, device=index.device)).all()):
        per_head = acc[:, :, 0]
    else:
        per_head = acc.new_zeros(B, H, T, d).index_add_(1, index.reshape(-1), acc.reshape(B, H * A, T, d))
    lo, hi = max(a, 0), min(a + T, n)
    grad[:, :, lo:hi] += per_head[:, :, lo - a:hi - a]


def _dense_allowed(n, left, right, valid, kpm, device):
    """(B|1, H, n, A, n) bool for the gathered-keys form: window on the key position, valid area heads,
    non-padding keys."""
    i = torch.arange(n, device=device)
    rel = i[None, :] - i[:, None]  # (n, n): j - i
    window = (rel >= -left) & (rel <= right)
    allowed = window[None, None, :, None, :] & valid[None, :, None, :, None]  # (1, H, n, A, n)
    if kpm is not None:
        allowed = allowed & ~kpm[:, None, None, None, :]  # (B, H, n, A, n)
    return allowed


def _reference(q, k, v, left, right, index, valid, kpm, scale, score_mod, drop):
    """The gathered-keys form (DESIGN.md §1): keys of the area heads stacked along the key axis, the
    window applied on ``kv_idx mod n``, one softmax over the (N+1)·n keys. Returns (out, probs) with
    probs of shape (B, H, n, A, n)."""
    B, H, n, d_k = q.shape
    A = index.shape[1]
    k_area = _gather_heads(k, index).reshape(B, H, A * n, d_k)  # (B, H, A·n, d_k)
    v_area = _gather_heads(v, index).reshape(B, H, A * n, v.shape[-1])
    scores = torch.matmul(q, k_area.transpose(-1, -2)) * scale  # (B, H, n, A·n)
    if score_mod is not None:
        scores = score_mod(scores)
    allowed = _dense_allowed(n, left, right, valid, kpm, q.device)
    allowed = allowed.expand(allowed.shape[0], H, n, A, n).reshape(allowed.shape[0], H, n, A * n)
    probs = _masked_softmax(scores, allowed)
    dropped = F.dropout(probs, drop, training=True) if drop > 0 else probs
    return torch.matmul(dropped, v_area), probs.view(B, H, n, A, n)


def _sdpa(q, k, v, left, right, index, valid, kpm, scale, drop):
    B, H, n, d_k = q.shape
    A = index.shape[1]
    k_area = _gather_heads(k, index).reshape(B, H, A * n, d_k)  # (B, H, A·n, d_k)
    v_area = _gather_heads(v, index).reshape(B, H, A * n, v.shape[-1])
    allowed = _dense_allowed(n, left, right, valid, kpm, q.device)
    allowed = allowed.reshape(allowed.shape[0], H, n, A * n)
    if A == 1 and bool(valid.all()):
        allowed = allowed[:, :1]  # the same window for every head: (B|1, 1, n, n)
    return F.scaled_dot_product_attention(q, k_area, v_area, attn_mask=allowed, dropout_p=drop, scale=scale)


def _flex(q, k, v, left, right, index, valid, kpm, scale, score_mod):
    B, H, n, d_k = q.shape
    A = index.shape[1]
    k_area = _gather_heads(k, index).reshape(B, H, A * n, d_k)  # (B, H, A·n, d_k)
    v_area = _gather_heads(v, index).reshape(B, H, A * n, v.shape[-1])
    keep = None if kpm is None else ~kpm

    def mask_mod(b, h, q_idx, kv_idx):
        j = kv_idx % n
        rel = j - q_idx
        ok = (rel >= -left) & (rel <= right) & valid[h, kv_idx // n]
        return ok if keep is None else ok & keep[b, j]

    mask = Mask(mask_mod, f"band({left}, {right}) x heads({A})", static=kpm is None)
    mod = None if score_mod is None else (lambda s, b, h, q_idx, kv_idx: score_mod(s))
    return flex_attention_call(q, k_area, v_area, score_mod=mod, mask=mask, scale=scale)


def _dispatch(q, k, v, left, right, index, valid, kpm, *, scale, score_mod, dropout_p, training, backend,
              return_probs=False):
    drop = dropout_p if training else 0.0
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    chosen = "reference" if return_probs else _resolve(backend, q.device, needs_grad, drop, score_mod)
    probs = None
    if chosen == "banded":
        out = _banded(q, k, v, left, right, index, valid, kpm, scale, score_mod, drop)
    elif chosen == "reference":
        out, probs = _reference(q, k, v, left, right, index, valid, kpm, scale, score_mod, drop)
    else:
        if chosen == "flex":
            out = _flex(q, k, v, left, right, index, valid, kpm, scale, score_mod)
        else:
            out = _sdpa(q, k, v, left, right, index, valid, kpm, scale, drop)
        has_key = _rows_with_key(kpm, q.shape[2], left, right)
        if has_key is not None:  # rows with no allowed key are 0, whatever the kernel returns
            out = out.masked_fill(~has_key, 0.0)
    return out, probs


# --------------------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------------------

def banded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, radius: int | tuple[int, int], *,
                     score_mod: ScoreMod | None = None, key_padding_mask: torch.Tensor | None = None,
                     scale: float | None = None, dropout_p: float = 0.0, training: bool = False,
                     backend: str = "auto") -> torch.Tensor:
    """Softmax attention over the band ``|i − j| ≤ radius`` in O(n · radius) time and memory.

    ``o_i = Σ_j softmax_j(score_mod(q_i·k_j · scale) | j allowed) v_j`` with ``j`` allowed when
    ``i − left ≤ j ≤ i + right`` and key ``j`` is not padding. This is the static local mask of the whole
    library (CSAN Eq. 4–6; MAN's SMAN, MAN Eq. 9; MTSA window heads with ``score_mod=F.logsigmoid``),
    computed without an ``n × n`` tensor on the ``banded`` and ``flex`` backends.

    Args:
        q, k: ``(B, H, n, d_k)``; v: ``(B, H, n, d_v)`` (self-attention: one length ``n``).
        radius: an int ``r >= 0`` (``|i − j| <= r``) or ``(left, right)`` for an asymmetric band
            ``i − left <= j <= i + right`` (e.g. ``(r, 0)``: causal local attention). A radius beyond
            the sequence covers it all.
        score_mod: an elementwise function of the scaled score applied before the softmax, e.g.
            ``torch.nn.functional.logsigmoid`` (MTSA's ``σ_t``); None = identity.
        key_padding_mask: ``(B, n)`` bool, ``True`` = padding key (excluded).
        scale: score scale; None = ``1/sqrt(d_k)``.
        dropout_p, training: dropout on the attention probabilities, applied when ``training``.
        backend: ``"auto"`` | ``"banded"`` | ``"flex"`` | ``"sdpa"`` (dense; no score_mod) | ``"reference"``.

    Returns:
        ``(B, H, n, d_v)``; rows with no allowed key (all keys in the band are padding) are 0.
    """
    kpm = _check_qkv(q, k, v, key_padding_mask)
    left, right = _check_radius(radius)
    if score_mod is not None and not callable(score_mod):
        raise TypeError(f"score_mod must be a callable (elementwise on the scaled score) or None, got "
                        f"{describe(score_mod)}")
    check_probability(dropout_p, "dropout_p")
    B, H, n, d_k = q.shape
    index = torch.arange(H, device=q.device)[:, None]  # (H, 1): each head on its own
    valid = torch.ones(H, 1, dtype=torch.bool, device=q.device)
    out, _ = _dispatch(q, k, v, left, right, index, valid, kpm, scale=_check_scale(scale, d_k), score_mod=score_mod,
                       dropout_p=dropout_p, training=training, backend=backend)
    return out


def _local_args(q, k, v, window, head_window, key_padding_mask, head_edges, scale):
    kpm = _check_qkv(q, k, v, key_padding_mask)
    r = check_window(window) // 2
    check_head_window(head_window, q.shape[1])
    check_choice(head_edges, "head_edges", HEAD_EDGES)
    index, valid = _head_area(q.shape[1], head_window, head_edges, q.device)
    return kpm, r, index, valid, _check_scale(scale, q.shape[-1])


def local_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, window: int = 11, head_window: int = 1,
                    key_padding_mask: torch.Tensor | None = None, head_edges: str = "truncate",
                    scale: float | None = None, dropout_p: float = 0.0, training: bool = False,
                    backend: str = "auto") -> torch.Tensor:
    """Convolutional self-attention, CSAN Eq. 4–6 (1D) and Eq. 7–9 (2D).

    Args:
        q, k: ``(B, H, n, d_k)``; v: ``(B, H, n, d_v)``.
        window: ``M + 1``, odd: the positions ``|i − j| <= M/2`` centred on the query, truncated at the
            sequence edges (a window wider than the sequence covers all of it). Default 11 (paper).
        head_window: ``N + 1``, odd, ``<= H``: the heads ``h − N/2 … h + N/2`` whose windows form the
            query's area (Eq. 7–8); one softmax over the whole area (Eq. 9). 1 = CSAN 1D.
        key_padding_mask: ``(B, n)`` bool, ``True`` = padding key (excluded in every head).
        head_edges: ``"truncate"`` (paper: the area stops at the first/last head) or ``"circular"``
            (keys and values of heads wrap around together).
        scale: score scale; None = ``1/sqrt(d_k)``.
        dropout_p, training: dropout on the attention probabilities, applied when ``training``.
        backend: ``"auto"`` | ``"banded"`` | ``"flex"`` | ``"sdpa"`` | ``"reference"`` (module docstring).

    Returns:
        ``(B, H, n, d_v)``; a query whose area holds only padding returns 0.
    """
    kpm, r, index, valid, scale = _local_args(q, k, v, window, head_window, key_padding_mask, head_edges, scale)
    check_probability(dropout_p, "dropout_p")
    out, _ = _dispatch(q, k, v, r, r, index, valid, kpm, scale=scale, score_mod=None, dropout_p=dropout_p,
                       training=training, backend=backend)
    return out


def _area_to_heads(probs: torch.Tensor, index: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(B, H, n, A, n) area probabilities → (B, H, n, H, n) indexed by the source head."""
    H = index.shape[0]
    one_hot = F.one_hot(index, H).to(probs.dtype) * valid[..., None].to(probs.dtype)  # (H, A, H)
    return torch.einsum("bhiaj,hag->bhigj", probs, one_hot)


def local_attention_maps(q: torch.Tensor, k: torch.Tensor, *, window: int = 11, head_window: int = 1,
                         key_padding_mask: torch.Tensor | None = None, head_edges: str = "truncate",
                         scale: float | None = None) -> torch.Tensor:
    """The attention probabilities of :func:`local_attention` (explicit form, for plots and tests).

    Returns ``(B, H, n, H, n)``: ``maps[b, h, i, g, j]`` is the weight query ``i`` of head ``h`` puts on
    key ``j`` of head ``g``; each row ``maps[b, h, i]`` sums to 1 over ``(g, j)`` (0 for a query whose
    area holds only padding). For CSAN 1D only ``g == h`` is non-zero; ``maps.diagonal(dim1=1, dim2=3)``
    gives the usual ``(B, n, n, H)`` per-head maps.
    """
    kpm, r, index, valid, scale = _local_args(q, k, k, window, head_window, key_padding_mask, head_edges, scale)
    _, probs = _dispatch(q, k, k, r, r, index, valid, kpm, scale=scale, score_mod=None, dropout_p=0.0,
                         training=False, backend="reference", return_probs=True)
    return _area_to_heads(probs, index, valid)


def _local_attention_with_maps(q, k, v, *, window, head_window, key_padding_mask, head_edges, dropout_p,
                               training):
    """Reference-backend output and its ``(B, H, n, H, n)`` maps in one pass (used by the module)."""
    kpm, r, index, valid, scale = _local_args(q, k, v, window, head_window, key_padding_mask, head_edges, None)
    out, probs = _dispatch(q, k, v, r, r, index, valid, kpm, scale=scale, score_mod=None, dropout_p=dropout_p,
                           training=training, backend="reference", return_probs=True)
    return out, _area_to_heads(probs, index, valid)
