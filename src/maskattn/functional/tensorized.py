"""Multi-dim (tensorized) self-attention of MTSA / Fast-DiSA, computed without n×n×d tensors.

MTSA (Shen et al., NAACL 2019) Eq. 10–12, for query i, key j and feature l of one head::

    f_ijl = σ_t(q_i·k_j / √d_k) + S_jl + M_ij                      (10)
    p_ijl = exp(f_ijl) / Σ_g exp(f_igl)                            (11)
    o_il  = Σ_j p_ijl v_jl                                         (12)

Because ``S_jl`` depends on the key alone the feature-wise softmax factorises (docs/design.md §1): with
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

from ..errors import ArgumentError
from .. import backends
from ..validation import (check_attn_mask, check_choice, check_key_padding_mask, check_probability, check_qkv, checking,
                          entry_point)
from ..kernels.flex import flex_attention_call
from ..kernels.sigmoid import masked_sigmoid_attention
from ..kernels.softmax import masked_softmax
from ..kernels.tensorized import fused_sigmoid_tensorized, reliable_denominator, source2token_weights
from ..kernels.triton.tensorized import tensorized_triton
from ..kernels.banded import rows_with_key
from ..masks import Mask, allowed as allowed_pairs, as_dense, predicate
from .dot_product import depends_on_batch, empty_output, fused_attention, is_empty
from .local import banded_attention

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
    """``(mask, key_padding_mask)`` checked (a bool mask as a 4-D view) — in the outermost entry point only."""
    if not checking():
        return mask, key_padding_mask
    B, H, n, m = check_qkv(q, k, v, s2t=s2t)
    check_choice(scale, "scale", SCALES)
    check_probability(dropout_p, "dropout_p")
    if mask is not None and not isinstance(mask, Mask):
        mask = check_attn_mask(mask, "mask", (B, H, n, m))
        if mask.device != q.device:
            raise ArgumentError(f"mask is on {mask.device} but q is on {q.device}")
    kpm = check_key_padding_mask(key_padding_mask, "key_padding_mask", B, m,
                                 lambda: f"k has batch {B} and {m} keys")
    return mask, kpm


@entry_point
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
        backend: ``"auto"``, ``"triton"`` (the fused kernel; masks that are a band per head), ``"flex"``,
            ``"banded"`` (masks that are the same window on every head), ``"sdpa"`` or ``"reference"`` — family
            ``tensorized`` of :data:`maskattn.backends.FAMILIES`.
        key_padding_mask: optional ``(B, m)`` bool, ``True`` = padding key (excluded).
        dropout_p: attention dropout (MTSA Appendix A.3): applied when ``training``, to both factors
            of the numerator, each with keep probability ``sqrt(1 - dropout_p)``; the denominator is
            not dropped.

    Returns:
        ``(B, H, n, d_v)``. A query with no allowed key returns 0. Finite inputs give finite outputs.
    """
    mask, kpm = _validate(q, k, v, s2t, mask, key_padding_mask, scale, backend, dropout_p)
    if is_empty(q, k):
        return empty_output(q, v, k, s2t)
    B, H, n, _ = q.shape
    drop = dropout_p if training else 0.0
    band = mask.finite_band if isinstance(mask, Mask) and n == k.shape[2] else None
    head_bands = [(math.inf, math.inf)] * H if mask is None else mask.bands_per_head(H) if isinstance(mask, Mask) \
        else None
    chosen = backends.resolve("tensorized", backend, backends.Situation.of(
        q, k, v, s2t, dropout=drop > 0, band=band is not None, head_bands=head_bands is not None,
        batch_mask=depends_on_batch(mask), scale=scale))
    if chosen == "reference":
        return _reference(q, k, v, s2t, mask, kpm, scale, drop)
    if chosen == "triton":
        out, reliable = tensorized_triton(q, k, v, s2t, head_bands, kpm, scale=scale, dropout_p=drop)
        return _fix_underflow(out, reliable, q, k, v, s2t, mask, kpm, scale)
    if q.dtype == torch.float16:
        # float16 has 5 exponent bits: E = exp(S − max) and the denominator of [v ⊙ E ; E] leave its normal range
        # once a row's keys lie ~10 below the feature's maximum (bfloat16 keeps float32's range); the factorised
        # form runs in float32 and returns float16 (docs/design.md §3)
        with torch.autocast(q.device.type, enabled=False):
            out = tensorized_attention(q.float(), k.float(), v.float(), s2t.float(), mask, scale=scale,
                                       backend=chosen, key_padding_mask=kpm, dropout_p=dropout_p, training=training)
        return out.to(torch.float16)
    if chosen == "banded":
        return _banded(q, k, v, s2t, mask, kpm, scale, band)
    return _factorised(q, k, v, s2t, mask, kpm, scale, chosen, drop)


# --------------------------------------------------------------------------------------------------
# reference: the explicit n × n × d_v form
# --------------------------------------------------------------------------------------------------

def _reference(q, k, v, s2t, mask, kpm, scale, drop):
    B, H, n, _ = q.shape
    m = k.shape[2]
    allowed = allowed_pairs(mask, kpm, n, m, batch=B, heads=H, device=q.device)  # (B|1, H|1, n, m) or None
    t2t = _token2token(q, k, scale)  # (B, H, n, m)
    scores = t2t.unsqueeze(-1) + s2t.unsqueeze(2)  # (B, H, n, m, d_v): Eq. 10
    probs = masked_softmax(scores, None if allowed is None else allowed.unsqueeze(-1), dim=3)  # Eq. 11, over keys
    if drop > 0:
        # Dropout(E_R) ⊙ Dropout(E_X) of Algorithm 1 step 7, in tensor form: p_ijl · d1_ij · d2_jl.
        keep = math.sqrt(1.0 - drop)
        d1 = torch.bernoulli(torch.full((B, H, n, m, 1), keep, dtype=q.dtype, device=q.device)) / keep
        d2 = torch.bernoulli(torch.full((B, H, 1, m, v.shape[-1]), keep, dtype=q.dtype, device=q.device)) / keep
        probs = probs * d1 * d2
    return (probs * v.unsqueeze(2)).sum(dim=3)  # Eq. 12


@entry_point
def tensorized_attention_reference(q, k, v, s2t, mask=None, *, scale="log_sigmoid", key_padding_mask=None):
    """The explicit ``n × n × d_v`` form of MTSA Eq. 10–12, computed in float64 — the test oracle."""
    mask, kpm = _validate(q, k, v, s2t, mask, key_padding_mask, scale, "reference", 0.0)
    out = _reference(q.double(), k.double(), v.double(), s2t.double(), mask, kpm, scale, 0.0)
    return out


@entry_point
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
    p = masked_softmax(_token2token(q, k, scale), allowed_pairs(mask, kpm, n, m, batch=B, heads=H, device=q.device))
    s2t_probs = masked_softmax(s2t, None if kpm is None else ~kpm[:, None, :, None], dim=-2)
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


def _factorised(q, k, v, s2t, mask, kpm, scale, backend, drop):
    B, H, n, d_k = q.shape
    m, d_v = v.shape[2], v.shape[3]
    pad = kpm[:, None, :, None] if kpm is not None else None  # (B, 1, m, 1)
    dense = as_dense(mask, n, m, batch=B, heads=H, device=q.device)
    has_key = _row_has_key(dense, kpm, B, H, n, m, q.device)
    if backend == "sdpa" and scale == "log_sigmoid" and drop == 0.0:
        blocked = None if dense is None else ~dense
        # rows without an allowed key have D = 0 and so come back as 0 already
        out, reliable = fused_sigmoid_tensorized(q, k, v, s2t, blocked, pad, 1.0 / math.sqrt(d_k))
        return _fix_underflow(out, reliable, q, k, v, s2t, mask, kpm, scale, has_key)

    e = source2token_weights(s2t, pad)
    numerator_values = v * e
    keep_factor = 1.0 - math.sqrt(1.0 - drop) if drop > 0 else 0.0
    if keep_factor > 0:
        numerator_values = F.dropout(numerator_values, keep_factor, training=True)
    augmented = torch.cat([numerator_values, e], dim=-1)  # (B, H, m, 2 d_v)

    if backend == "flex":
        score_mod = (lambda s, b, h, qi, kv: F.logsigmoid(s)) if scale == "log_sigmoid" else None
        y = flex_attention_call(q, k, augmented, score_mod=score_mod,
                                mask=predicate(mask, None, batch=B, heads=H, q_len=n, kv_len=m))
    else:
        if scale == "log_sigmoid":
            # softmax_j(logsigmoid(R_ij)) ∝ sigmoid(R_ij): the row normalisation cancels in the ratio.
            y = masked_sigmoid_attention(q, k, augmented, dense, 1.0 / math.sqrt(d_k), n_drop=d_v,
                                         drop_p=keep_factor, row_normalise=True)
        elif keep_factor > 0:  # the weights' dropout on the numerator only (Appendix A.3)
            num = fused_attention(q, k, augmented[..., :d_v], allowed=dense, dropout_p=keep_factor)
            den = fused_attention(q, k, augmented[..., d_v:], allowed=dense)
            y = torch.cat([num, den], dim=-1)
        else:
            y = fused_attention(q, k, augmented, allowed=dense)
    return _divide(y, d_v, has_key, q, k, v, s2t, mask, kpm, scale)


def _divide(y, d_v, has_key, q, k, v, s2t, mask, kpm, scale):
    """``out = N / D`` from ``y = [N ; D]``, 0 on rows without a key; underflowed rows recomputed exactly."""
    numerator, denominator = y.split(d_v, dim=-1)
    reliable = reliable_denominator(denominator)
    safe_den = torch.where(reliable, denominator, torch.ones_like(denominator))
    out = torch.where(reliable & has_key, numerator / safe_den, torch.zeros_like(numerator))
    return _fix_underflow(out, reliable, q, k, v, s2t, mask, kpm, scale, has_key)


def _banded(q, k, v, s2t, mask, kpm, scale, band):
    """Window masks (every head the band ``i − left <= j <= i + right``): the O(n · band) local kernel over
    ``[v ⊙ E ; E]`` (:func:`maskattn.functional.banded_attention`), never an n × n tensor."""
    left, right = band
    pad = kpm[:, None, :, None] if kpm is not None else None
    e = source2token_weights(s2t, pad)
    score_mod = F.logsigmoid if scale == "log_sigmoid" else None
    y = banded_attention(q, k, torch.cat([v * e, e], dim=-1), band, score_mod=score_mod, key_padding_mask=kpm,
                         backend="banded")
    has_key = rows_with_key(kpm, q.shape[2], left, right)
    return _divide(y, v.shape[-1], torch.ones((), dtype=torch.bool, device=q.device) if has_key is None else has_key,
                   q, k, v, s2t, mask, kpm, scale)


def _fix_underflow(out, reliable, q, k, v, s2t, mask, kpm, scale, has_key=None):
    """Recompute exactly, in log space, the rows whose denominator underflowed (their allowed keys' source2token
    scores all lie ~88 or more below the feature's maximum). Finding them reads a flag on the host, so this runs
    in eager mode on the CPU only, where that costs no device synchronisation; on CUDA and under torch.compile
    such rows stay 0 (docs/design.md §3). ``has_key`` (which rows have an allowed key) is computed when not given."""
    if torch.compiler.is_compiling() or q.device.type != "cpu":
        return out
    if has_key is None:
        B, H, n, _ = q.shape
        m = k.shape[2]
        has_key = _row_has_key(as_dense(mask, n, m, batch=B, heads=H, device=q.device), kpm, B, H, n, m, q.device)
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
