"""Multi-dim (tensorized) self-attention of MTSA / Fast-DiSA, computed without n×n×d tensors.

MTSA (Shen et al., NAACL 2019) Eq. 10–12, for query i, key j and feature l of one head::

    f_ijl = σ_t(q_i·k_j / √d_k) + S_jl + M_ij                      (10)
    p_ijl = exp(f_ijl) / Σ_g exp(f_igl)                            (11)
    o_il  = Σ_j p_ijl v_jl                                         (12)

Because ``S_jl`` depends on the key alone the feature-wise softmax factorises (DESIGN.md §1): with
``P = softmax_j(σ_t(R_ij) + M_ij)`` and ``E_jl = exp(S_jl − c_l)``::

    o_il = Σ_j P_ij E_jl v_jl / Σ_j P_ij E_jl

so one scalar attention call over the augmented values ``[v ⊙ E ; E]`` followed by a division gives
the exact result. ``c_l`` is the maximum of ``S_jl`` over the non-padding keys; padding keys get
``E = 0``, which removes them exactly. Rows whose denominator underflows (extreme scores, or all
of a query's allowed keys far below the maximum) are detected and recomputed exactly in log space.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .._validation import (
    check_attn_mask,
    check_qkv,
    check_choice,
    check_key_padding_mask,
    check_probability,
)
from ..backends import (
    flex_attention_call,
    masked_sigmoid_attention,
    resolve_backend,
    sigmoid_attention_backward,
    sigmoid_attention_forward,
)
from ..masks import Mask, as_dense

SCALES = ("log_sigmoid", "identity")

__all__ = ["tensorized_attention", "tensorized_attention_reference", "tensorized_attention_maps", "SCALES"]

# Rows whose denominator underflows are recomputed exactly in groups of at most this many elements
# (rows × keys × features).
_EXACT_GROUP_ELEMENTS = 1 << 22


def _scale_fn(scale: str):
    return F.logsigmoid if scale == "log_sigmoid" else (lambda r: r)


def _token2token(q, k, scale):
    """``σ_t(q_i·k_j / √d_k)``, Eq. 8 and the first term of Eq. 10: (B, H, n, m)."""
    return _scale_fn(scale)(torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1]))


def _validate(q, k, v, s2t, mask, key_padding_mask, scale, backend, dropout_p):
    B, H, n, m = check_qkv(q, k, v, s2t=s2t)
    check_choice(scale, "scale", SCALES)
    check_probability(dropout_p, "dropout_p")
    if mask is not None and not isinstance(mask, Mask):
        mask = check_attn_mask(mask, "mask", (B, H, n, m))
        if mask.device != q.device:
            raise ValueError(f"mask is on {mask.device} but q is on {q.device}")
    kpm = check_key_padding_mask(key_padding_mask, "key_padding_mask", B, m,
                                 f"k has batch {B} and {m} keys")
    return mask, kpm


def tensorized_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s2t: torch.Tensor,
                         mask: torch.Tensor | Mask | None = None, *, scale: str = "log_sigmoid",
                         backend: str = "auto", key_padding_mask: torch.Tensor | None = None,
                         dropout_p: float = 0.0, training: bool = False) -> torch.Tensor:
    """Tensorized (feature-wise) masked self-attention, MTSA Eq. 10–12.

    Args:
        q, k: ``(B, H, n, d_k)`` and ``(B, H, m, d_k)`` queries and keys.
        v, s2t: ``(B, H, m, d_v)`` values and the feature-wise source2token scores ``S`` (Eq. 9).
        mask: bool, broadcastable to ``(B, H, n, m)``, ``True`` = attend; or a
            :class:`maskattn.masks.Mask` predicate (evaluated lazily; best for ``flex``).
        scale: ``σ_t`` — ``"log_sigmoid"`` (MTSA default) or ``"identity"``.
        backend: ``"auto"``, ``"reference"``, ``"sdpa"`` or ``"flex"`` (see :mod:`maskattn.backends`).
        key_padding_mask: optional ``(B, m)`` bool, ``True`` = padding key (excluded).
        dropout_p: attention dropout (MTSA Appendix A.3): applied when ``training``, to both factors
            of the numerator, each with keep probability ``sqrt(1 - dropout_p)``; the denominator is
            not dropped.

    Returns:
        ``(B, H, n, d_v)``. A query with no allowed key returns 0. Finite inputs give finite outputs.
    """
    mask, kpm = _validate(q, k, v, s2t, mask, key_padding_mask, scale, backend, dropout_p)
    drop = dropout_p if training else 0.0
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, s2t))
    chosen = resolve_backend(backend, device=q.device, needs_grad=needs_grad, flex_ok=drop == 0.0)
    if chosen == "reference":
        return _reference(q, k, v, s2t, mask, kpm, scale, drop)
    return _factorised(q, k, v, s2t, mask, kpm, scale, chosen, drop)


# --------------------------------------------------------------------------------------------------
# reference: the explicit n × n × d_v form
# --------------------------------------------------------------------------------------------------

def _dense_allowed(mask, kpm, B, H, n, m, device):
    """(B|1, H|1, n, m) bool of allowed (query, key) pairs, or None when everything is allowed."""
    allowed = as_dense(mask, n, m, batch=B, heads=H, device=device)
    if kpm is not None:
        keep = ~kpm[:, None, None, :]
        allowed = keep if allowed is None else allowed & keep
    return allowed


def _reference(q, k, v, s2t, mask, kpm, scale, drop):
    B, H, n, _ = q.shape
    m = k.shape[2]
    allowed = _dense_allowed(mask, kpm, B, H, n, m, q.device)
    t2t = _token2token(q, k, scale)  # (B, H, n, m)
    scores = t2t.unsqueeze(-1) + s2t.unsqueeze(2)  # (B, H, n, m, d_v): Eq. 10
    if allowed is not None:
        scores = scores.masked_fill(~allowed.unsqueeze(-1), float("-inf"))
    probs = torch.softmax(scores, dim=3)  # Eq. 11, over keys
    if allowed is not None:
        probs = torch.where(allowed.any(-1)[..., None, None], probs, torch.zeros((), dtype=probs.dtype,
                                                                                 device=probs.device))
    if drop > 0:
        # Dropout(E_R) ⊙ Dropout(E_X) of Algorithm 1 step 7, in tensor form: p_ijl · d1_ij · d2_jl.
        keep = math.sqrt(1.0 - drop)
        d1 = torch.bernoulli(torch.full((B, H, n, m, 1), keep, dtype=q.dtype, device=q.device)) / keep
        d2 = torch.bernoulli(torch.full((B, H, 1, m, v.shape[-1]), keep, dtype=q.dtype, device=q.device)) / keep
        probs = probs * d1 * d2
    return (probs * v.unsqueeze(2)).sum(dim=3)  # Eq. 12


def tensorized_attention_reference(q, k, v, s2t, mask=None, *, scale="log_sigmoid", key_padding_mask=None):
    """The explicit ``n × n × d_v`` form of MTSA Eq. 10–12, computed in float64 — the test oracle."""
    mask, kpm = _validate(q, k, v, s2t, mask, key_padding_mask, scale, "reference", 0.0)
    out = _reference(q.double(), k.double(), v.double(), s2t.double(), mask, kpm, scale, 0.0)
    return out


def tensorized_attention_maps(q, k, s2t, mask=None, *, scale="log_sigmoid", key_padding_mask=None):
    """The maps a person plots for MTSA (Fig. 3 of the paper).

    Returns ``(token2token, source2token)``: ``token2token`` is ``(B, H, n, m)`` =
    ``softmax_j(σ_t(q_i·k_j/√d_k) + M_ij)`` (0 on rows with no allowed key) and ``source2token`` is
    ``(B, H, m, d_v)`` = ``softmax_j(S_jl)`` over non-padding keys, per feature. The feature-wise
    attention of Eq. 11 is ``p_ijl ∝ token2token_ij · source2token_jl``.
    """
    v = s2t  # only its shape is used by the checks
    mask, kpm = _validate(q, k, v, s2t, mask, key_padding_mask, scale, "reference", 0.0)
    B, H, n, _ = q.shape
    m = k.shape[2]
    allowed = _dense_allowed(mask, kpm, B, H, n, m, q.device)
    t2t = _token2token(q, k, scale)
    if allowed is not None:
        t2t = t2t.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(t2t, dim=-1)
    if allowed is not None:
        p = torch.where(allowed.any(-1, keepdim=True), p, torch.zeros((), dtype=p.dtype, device=p.device))
    s = s2t
    if kpm is not None:
        s = s.masked_fill(kpm[:, None, :, None], float("-inf"))
    s2t_probs = torch.softmax(s, dim=-2)
    if kpm is not None:
        s2t_probs = torch.nan_to_num(s2t_probs, nan=0.0)
    return p, s2t_probs


# --------------------------------------------------------------------------------------------------
# fast paths: one scalar attention over [v ⊙ E ; E], then a division
# --------------------------------------------------------------------------------------------------

def _row_has_key(mask, kpm, B, H, n, m, device):
    """(B|1, H|1, n, 1) bool: does query i have any allowed, non-padding key? ``mask`` is dense or None."""
    if kpm is None:
        if mask is None:
            return torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device)
        return mask.any(-1, keepdim=True)
    keep = (~kpm).to(torch.float32)  # (B, m)
    if mask is None:
        return (keep.sum(-1) > 0).view(B, 1, 1, 1)
    if mask.shape[0] == 1:  # one mask for the whole batch: (H, n, m) @ (m, B), no batch expansion
        counts = torch.matmul(mask[0].to(torch.float32), keep.t())  # (H|1, n, B)
        return (counts > 0).permute(2, 0, 1).unsqueeze(-1)  # (B, H|1, n, 1)
    return torch.matmul(mask.to(torch.float32), keep[:, None, :, None]) > 0  # (B, H|1, n, 1)


def _source2token_weights(s2t, pad):
    """``E_jl = exp(S_jl − c_l)`` with ``c_l`` the maximum over non-padding keys; padding keys get 0.
    ``c`` cancels in the ratio, so it carries no gradient."""
    s_for_max = s2t if pad is None else s2t.masked_fill(pad, float("-inf"))
    c = s_for_max.detach().amax(dim=-2, keepdim=True)
    c = torch.where(torch.isfinite(c), c, torch.zeros_like(c))
    e = torch.exp(s2t - c)
    return e if pad is None else e.masked_fill(pad, 0.0)


def _reliable(denominator):
    """Denominators large enough that the ratio keeps full precision (else: recompute exactly)."""
    info = torch.finfo(denominator.dtype)
    return denominator > info.tiny / info.eps


#: elements of the per-block working set (augmented values and their gradients) of the fused path.
FUSED_BLOCK_ELEMENTS = 1 << 18


def _batch_blocks(batch: int, per_item: int):
    step = max(1, FUSED_BLOCK_ELEMENTS // max(1, per_item))
    return [slice(b0, min(batch, b0 + step)) for b0 in range(0, batch, step)]


def _rows(t, bs):
    """Batch block of a tensor whose batch dimension may be broadcast (size 1)."""
    return None if t is None else t[bs] if t.shape[0] > 1 else t


class _FusedSigmoidTensorized(torch.autograd.Function):
    """The log-sigmoid fast path in one autograd node: ``out = N / D`` with
    ``[N ; D] = (sigmoid(R) ⊙ mask) @ [v ⊙ E ; E]``.

    Works block by block over the batch, so the augmented values, the weights and their gradients
    only ever exist for one block. Saves q, k, v, S (the caller's tensors, no copies), the output and
    D; E and the weights are recomputed in backward. Where D is too small to divide by, D is stored as
    ``inf``: the output there is 0 and so are its gradients (the caller recomputes those rows exactly).
    Returns (out, reliable)."""

    @staticmethod
    def forward(ctx, q, k, v, s2t, blocked, pad, scale):
        B, H, n, _ = q.shape
        m, d_v = v.shape[2], v.shape[3]
        # (B, n, H, d_v) memory seen as (B, H, n, d_v): merging the heads afterwards is a free view
        out = v.new_empty(B, n, H, d_v).transpose(1, 2)
        denominator = v.new_empty(B, H, n, d_v)
        for bs in _batch_blocks(B, H * max(n, m) * 2 * d_v):
            e = _source2token_weights(s2t[bs], _rows(pad, bs))
            y = sigmoid_attention_forward(q[bs].contiguous(), k[bs].contiguous(), torch.cat([v[bs] * e, e], dim=-1),
                                          _rows(blocked, bs), scale)  # (b, H, n, 2 d_v)
            numerator, den = y.split(d_v, dim=-1)
            den = torch.where(_reliable(den), den, torch.full_like(den, math.inf))
            denominator[bs] = den
            torch.div(numerator, den, out=out[bs])
        ctx.save_for_backward(q, k, v, s2t, out, denominator,
                              blocked if blocked is not None else torch.empty(0),
                              pad if pad is not None else torch.empty(0))
        ctx.has_blocked, ctx.has_pad, ctx.scale = blocked is not None, pad is not None, scale
        reliable = torch.isfinite(denominator)
        ctx.mark_non_differentiable(reliable)
        return out, reliable

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out, _grad_reliable):
        q, k, v, s2t, out, denominator, blocked, pad = ctx.saved_tensors
        blocked = blocked if ctx.has_blocked else None
        pad = pad if ctx.has_pad else None
        B, H, n, _ = q.shape
        m, d_v = v.shape[2], v.shape[3]
        grad_q, grad_k = torch.empty_like(q), torch.empty_like(k)
        grad_v, grad_s2t = torch.empty_like(v), torch.empty_like(s2t)
        for bs in _batch_blocks(B, H * max(n, m) * 2 * d_v):
            e = _source2token_weights(s2t[bs], _rows(pad, bs))
            v_b = v[bs]
            grad_num = grad_out[bs] / denominator[bs]  # out = N / D: dN = g / D (0 where D = inf)
            grad_y = torch.cat([grad_num, -grad_num * out[bs]], dim=-1)  # dD = -g · out / D
            gq, gk, gx = sigmoid_attention_backward(grad_y, q[bs].contiguous(), k[bs].contiguous(),
                                                    torch.cat([v_b * e, e], dim=-1), _rows(blocked, bs), ctx.scale)
            grad_ve, grad_e = gx.split(d_v, dim=-1)
            grad_q[bs], grad_k[bs] = gq, gk
            grad_v[bs] = grad_ve * e
            grad_s2t[bs] = (grad_ve * v_b + grad_e) * e  # dE/dS = E (0 on padding keys)
        return grad_q, grad_k, grad_v, grad_s2t, None, None, None


def _factorised(q, k, v, s2t, mask, kpm, scale, backend, drop):
    B, H, n, d_k = q.shape
    m, d_v = v.shape[2], v.shape[3]
    pad = kpm[:, None, :, None] if kpm is not None else None  # (B, 1, m, 1)
    band = mask.finite_band if isinstance(mask, Mask) and n == m else None
    if band is not None and backend == "sdpa" and drop == 0.0:
        return _banded(q, k, v, s2t, mask, kpm, scale, band)
    dense = as_dense(mask, n, m, batch=B, heads=H, device=q.device)
    has_key = _row_has_key(dense, kpm, B, H, n, m, q.device)
    if backend == "sdpa" and scale == "log_sigmoid" and drop == 0.0:
        blocked = None if dense is None else ~dense
        # rows without an allowed key have D = 0 and so come back as 0 already
        out, reliable = _FusedSigmoidTensorized.apply(q, k, v, s2t, blocked, pad, 1.0 / math.sqrt(d_k))
        return _fix_underflow(out, reliable, has_key, q, k, v, s2t, mask, kpm, scale)

    e = _source2token_weights(s2t, pad)
    numerator_values = v * e
    keep_factor = 1.0 - math.sqrt(1.0 - drop) if drop > 0 else 0.0
    if keep_factor > 0:
        numerator_values = F.dropout(numerator_values, keep_factor, training=True)
    augmented = torch.cat([numerator_values, e], dim=-1)  # (B, H, m, 2 d_v)

    if backend == "flex":
        score_mod = (lambda s, b, h, qi, kv: F.logsigmoid(s)) if scale == "log_sigmoid" else None
        y = flex_attention_call(q, k, augmented, score_mod=score_mod, mask=mask)
    else:
        if scale == "log_sigmoid":
            # softmax_j(logsigmoid(R_ij)) ∝ sigmoid(R_ij): the row normalisation cancels in the ratio.
            y = masked_sigmoid_attention(q, k, augmented, dense, 1.0 / math.sqrt(d_k), n_drop=d_v,
                                         drop_p=keep_factor)
        elif keep_factor > 0:
            num = F.scaled_dot_product_attention(q, k, augmented[..., :d_v], attn_mask=dense, dropout_p=keep_factor)
            den = F.scaled_dot_product_attention(q, k, augmented[..., d_v:], attn_mask=dense)
            y = torch.cat([num, den], dim=-1)
        else:
            y = F.scaled_dot_product_attention(q, k, augmented, attn_mask=dense)
    numerator, denominator = y.split(d_v, dim=-1)
    reliable = _reliable(denominator)
    safe_den = torch.where(reliable, denominator, torch.ones_like(denominator))
    out = torch.where(reliable & has_key, numerator / safe_den, torch.zeros_like(numerator))
    return _fix_underflow(out, reliable, has_key, q, k, v, s2t, mask, kpm, scale)


def _banded(q, k, v, s2t, mask, kpm, scale, band):
    """Window masks (every head the band ``i − left <= j <= i + right``): the O(n · band) local path of
    :func:`maskattn.functional.banded_attention` over ``[v ⊙ E ; E]``, never an n × n tensor."""
    from .local import banded_attention

    B, H, n, _ = q.shape
    d_v = v.shape[-1]
    pad = kpm[:, None, :, None] if kpm is not None else None
    e = _source2token_weights(s2t, pad)
    score_mod = F.logsigmoid if scale == "log_sigmoid" else None
    y = banded_attention(q, k, torch.cat([v * e, e], dim=-1), band, score_mod=score_mod, key_padding_mask=kpm,
                         backend="banded")
    numerator, denominator = y.split(d_v, dim=-1)
    left, right = band
    if kpm is None:
        has_key = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=q.device)  # the band holds the query itself
    else:  # any non-padding key in [i - left, i + right]: a difference of prefix counts, (B, 1, n, 1)
        counts = F.pad((~kpm).to(torch.int64).cumsum(-1), (1, 0))  # (B, n + 1)
        i = torch.arange(n, device=q.device)
        hi, lo = (i + right + 1).clamp(max=n), (i - left).clamp(min=0)
        has_key = (counts[:, hi] - counts[:, lo] > 0)[:, None, :, None]
    reliable = _reliable(denominator)
    safe_den = torch.where(reliable, denominator, torch.ones_like(denominator))
    out = torch.where(reliable & has_key, numerator / safe_den, torch.zeros_like(numerator))
    return _fix_underflow(out, reliable, has_key, q, k, v, s2t, mask, kpm, scale)


def _fix_underflow(out, reliable, has_key, q, k, v, s2t, mask, kpm, scale):
    underflow = (~reliable & has_key).any(-1)  # (B, H, n): rows with a key but an underflowed denominator
    if bool(underflow.any()):
        out = _recompute_rows(out, underflow, q, k, v, s2t, mask, kpm, scale)
    return out


def _recompute_rows(out, rows, q, k, v, s2t, mask, kpm, scale):
    """Exact log-space recomputation of the query rows flagged in ``rows`` (B, H, n)."""
    B, H, n, d_k = q.shape
    m, d_v = v.shape[2], v.shape[3]
    b_idx, h_idx, i_idx = rows.nonzero(as_tuple=True)
    work_dtype = torch.promote_types(q.dtype, torch.float32)
    group = max(1, _EXACT_GROUP_ELEMENTS // max(1, m * d_v))
    sigma = _scale_fn(scale)
    for start in range(0, b_idx.numel(), group):
        b, h, i = b_idx[start:start + group], h_idx[start:start + group], i_idx[start:start + group]
        q_r = q[b, h, i].to(work_dtype)  # (r, d_k)
        k_r = k[b, h].to(work_dtype)  # (r, m, d_k)
        t2t = sigma(torch.einsum("rd,rmd->rm", q_r, k_r) / math.sqrt(d_k))  # (r, m)
        scores = t2t.unsqueeze(-1) + s2t[b, h].to(work_dtype)  # (r, m, d_v)
        allowed = torch.ones(b.numel(), m, dtype=torch.bool, device=q.device)
        if mask is not None:
            if isinstance(mask, Mask):
                allowed = mask.mask_mod(b[:, None], h[:, None], i[:, None],
                                        torch.arange(m, device=q.device)[None, :]).expand(b.numel(), m)
            else:
                allowed = mask.expand(B, H, n, m)[b, h, i]
        if kpm is not None:
            allowed = allowed & ~kpm[b]
        scores = scores.masked_fill(~allowed.unsqueeze(-1), float("-inf"))
        probs = torch.softmax(scores, dim=1)
        exact = (probs * v[b, h].to(work_dtype)).sum(dim=1)  # (r, d_v)
        out = out.index_put((b, h, i), exact.to(out.dtype))
    return out
