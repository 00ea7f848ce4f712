"""Mask attention (MAN Eq. 4) and the dynamic mask of DMAN (MAN Eq. 12), as pure functions.

Mask Attention Networks (Fan et al., NAACL 2021) multiply the exponentiated scores by a mask
``M ∈ [0, 1]`` before normalising (Eq. 4)::

    S_M(Q, K)_ij = M_ij exp(q_i·k_j / √d_k) / Σ_l M_il exp(q_i·k_l / √d_k)
    A_M(Q, K, V) = S_M(Q, K) V

Because ``M_ij exp(s_ij) = exp(s_ij + log M_ij)``, the mask enters as an additive *log-weight bias*
(a weight of exactly 0 becomes ``-inf``: the key is excluded), so Eq. 4 runs on every backend. The
all-ones mask gives plain attention (SAN, Eq. 6–7) and the identity mask gives ``V`` (FFN, Eq. 8).

DMAN (Eq. 12) learns the mask from the query token, the signed relative distance and the head::

    M[b, h, t, s] = sigmoid(x_t·W + P[t − s] + U[h])

so ``log M = logsigmoid(a_t + P[t − s] + U_h)`` with ``a = x W`` of shape ``(B, n)``. The ``sdpa``
backend never keeps an ``n × n`` tensor for backward: :class:`_DynamicMaskAttention` computes the
bias one query chunk at a time, runs ``F.scaled_dot_product_attention`` per chunk in forward and
recomputes the probabilities chunk by chunk in backward, from which it returns the gradients of
``q, k, v`` *and* of ``a``, ``P`` and ``U`` (a fused formula — it does not rely on SDPA returning a
bias gradient). The ``flex`` backend computes the same bias inside a ``score_mod``.

Distances beyond the table: ``P`` has ``2·max_distance + 1`` entries for ``t − s ∈
[−max_distance, max_distance]``; larger ``|t − s|`` use the edge entry (``P[±max_distance]``), so
any sequence length is valid and never indexes out of bounds.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .._validation import (
    check_qkv,
    broadcastable,
    check_attn_mask,
    check_key_padding_mask,
    check_probability,
    check_tensor,
    describe,
)
from ..backends import _generator, _keep_mask, flex_attention_call, resolve_backend
from ..masks import Mask, as_dense

__all__ = [
    "mask_attention",
    "mask_attention_reference",
    "mask_attention_weights",
    "log_weight_bias",
    "relative_distance_index",
    "dynamic_mask_logits",
    "dynamic_mask",
    "dynamic_mask_attention",
    "dynamic_mask_attention_reference",
    "static_window_mask",
]


# --------------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------------

def _check_qkv(q, k, v) -> tuple[int, int, int, int]:
    return check_qkv(q, k, v)


def _check_mask_weights(mask_weights, target, device) -> torch.Tensor | None:
    if mask_weights is None:
        return None
    if not isinstance(mask_weights, torch.Tensor):
        raise TypeError(f"mask_weights must be a float tensor with values in [0, 1], broadcastable to "
                        f"(batch, heads, queries, keys) = {target}, got {describe(mask_weights)}")
    if not mask_weights.is_floating_point():
        raise TypeError(f"mask_weights must be a floating-point tensor with values in [0, 1], got dtype "
                        f"{mask_weights.dtype}; convert a bool mask with `.float()` or pass it as attn_mask")
    if not broadcastable(tuple(mask_weights.shape), target):
        raise ValueError(f"mask_weights has shape {tuple(mask_weights.shape)}, which does not broadcast to "
                         f"(batch, heads, queries, keys) = {target}")
    if mask_weights.device != device:
        raise ValueError(f"mask_weights is on {mask_weights.device} but q is on {device}")
    if mask_weights.numel():
        w = mask_weights.detach()
        if not bool(((w >= 0) & (w <= 1)).all()):
            lo, hi = float(w.min()), float(w.max())
            raise ValueError(f"mask_weights must lie in [0, 1] (MAN Eq. 4: M_ij ∈ [0, 1]); got values in "
                             f"[{lo}, {hi}]" + (" (with NaN)" if bool(torch.isnan(w).any()) else ""))
    while mask_weights.dim() < 4:
        mask_weights = mask_weights.unsqueeze(0)
    return mask_weights


def _check_attn_mask(attn_mask, target, device):
    if attn_mask is None or isinstance(attn_mask, Mask):
        return attn_mask
    mask = check_attn_mask(attn_mask, "attn_mask", target)
    if mask.device != device:
        raise ValueError(f"attn_mask is on {mask.device} but q is on {device}")
    return mask


def _dense(mask, B, H, n, m, device) -> torch.Tensor | None:
    return as_dense(mask, n, m, batch=B, heads=H, device=device)


# --------------------------------------------------------------------------------------------------
# mask attention, Eq. 4
# --------------------------------------------------------------------------------------------------

def log_weight_bias(mask_weights: torch.Tensor) -> torch.Tensor:
    """``log M`` with ``log 0 = -inf``; a weight of exactly 0 passes no gradient (it is a hard
    exclusion, like a boolean mask), any weight ``> 0`` gets the exact gradient ``1 / M``."""
    tiny = torch.finfo(mask_weights.dtype).tiny
    return torch.where(mask_weights > 0, torch.log(mask_weights.clamp_min(tiny)),
                       torch.full((), float("-inf"), dtype=mask_weights.dtype, device=mask_weights.device))


def _bias_and_rows(mask_weights, allowed, dtype, device):
    """Additive bias (or None) and the (B|1, H|1, n, 1) bool 'row has a key' (or None = all rows do).

    Rows with no admissible key get a 0 bias (finite everywhere, so no NaN reaches autograd); their
    output is set to 0 afterwards.
    """
    bias = log_weight_bias(mask_weights) if mask_weights is not None else None
    if allowed is not None:
        bias = torch.zeros((), dtype=dtype, device=device).masked_fill(~allowed, float("-inf")) \
            if bias is None else bias.masked_fill(~allowed, float("-inf"))
    if bias is None:
        return None, None
    has_key = torch.isfinite(bias).any(-1, keepdim=True)
    return torch.where(has_key, bias, torch.zeros((), dtype=bias.dtype, device=device)), has_key


def _flex(q, k, v, **kwargs):
    """FlexAttention call; under ``torch.no_grad()`` the inputs are detached (flex on CPU refuses inputs
    that require grad even when autograd is off)."""
    if not torch.is_grad_enabled():
        q, k, v = q.detach(), k.detach(), v.detach()
    return flex_attention_call(q, k, v, **kwargs)


def _zero_empty_rows(out, has_key):
    if has_key is None:
        return out
    return torch.where(has_key, out, torch.zeros((), dtype=out.dtype, device=out.device))


def mask_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask_weights: torch.Tensor | None = None, *,
                   attn_mask: torch.Tensor | Mask | None = None, backend: str = "auto", dropout_p: float = 0.0,
                   training: bool = False) -> torch.Tensor:
    """Mask attention function ``A_M(Q, K, V) = S_M(Q, K) V`` of MAN Eq. 4.

    Args:
        q, k: ``(B, H, n, d_k)`` and ``(B, H, m, d_k)``; v: ``(B, H, m, d_v)``.
        mask_weights: ``M``, float in ``[0, 1]``, broadcastable to ``(B, H, n, m)`` (rows = queries);
            multiplies ``exp(q·k/√d_k)`` before normalisation. ``None`` is the all-ones mask (SAN).
        attn_mask: optional bool (``True`` = attend) broadcastable to ``(B, H, n, m)``, or a
            :class:`maskattn.masks.Mask` predicate.
        backend: ``"auto"``, ``"reference"``, ``"sdpa"`` or ``"flex"`` (flex: inference only on CPU).
        dropout_p, training: attention-probability dropout, applied when ``training``.

    Returns:
        ``(B, H, n, d_v)``. A weight of exactly 0 excludes the key; a row whose weights are all 0
        (or that has no allowed key) returns 0. The identity mask returns ``V`` (FFN, Eq. 8); the
        all-ones mask is plain scaled dot-product attention (SAN, Eq. 6).
    """
    B, H, n, m = _check_qkv(q, k, v)
    target = (B, H, n, m)
    mw = _check_mask_weights(mask_weights, target, q.device)
    mask = _check_attn_mask(attn_mask, target, q.device)
    drop = check_probability(dropout_p, "dropout_p") if training else 0.0
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v) + ((mw,) if mw is not None else ()))
    chosen = resolve_backend(backend, device=q.device, needs_grad=grad, flex_ok=drop == 0.0,
                             prefer_flex_on_cuda=False)
    if chosen == "reference":
        probs = _weights(q, k, mw, _dense(mask, B, H, n, m, q.device))
        if drop > 0:
            probs = F.dropout(probs, drop, training=True)
        return torch.matmul(probs, v)
    dense = _dense(mask, B, H, n, m, q.device)
    if chosen == "flex":
        if mw is None:  # a structural mask only: the block mask skips empty blocks (a window costs O(n·w))
            out = _flex(q, k, v, mask=mask)
            return _zero_empty_rows(out, dense.any(-1, keepdim=True)) if dense is not None else out
        admissible = (mw > 0) if dense is None else (mw > 0) & dense
        log_m = torch.log(mw.clamp_min(torch.finfo(mw.dtype).tiny)).expand(target)
        out = _flex(q, k, v, score_mod=lambda s, b, h, qi, kv: s + log_m[b, h, qi, kv], mask=admissible)
        return _zero_empty_rows(out, admissible.any(-1, keepdim=True))
    bias, has_key = _bias_and_rows(mw, dense, q.dtype, q.device)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=drop)
    return _zero_empty_rows(out, has_key)


def _weights(q, k, mw, allowed):
    """``S_M`` of Eq. 4 in the working dtype, as a softmax of ``scores + log M`` (0 on empty rows)."""
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])  # (B, H, n, m)
    bias, has_key = _bias_and_rows(mw, allowed, q.dtype, q.device)
    if bias is not None:
        scores = scores + bias
    return _zero_empty_rows(torch.softmax(scores, dim=-1), has_key)


def mask_attention_weights(q: torch.Tensor, k: torch.Tensor, mask_weights: torch.Tensor | None = None, *,
                           attn_mask: torch.Tensor | Mask | None = None) -> torch.Tensor:
    """The attention map ``S_M(Q, K)`` of Eq. 4, ``(B, H, n, m)`` (rows sum to 1, or 0 when empty)."""
    B, H, n, m = _check_qkv(q, k, k)
    mw = _check_mask_weights(mask_weights, (B, H, n, m), q.device)
    mask = _check_attn_mask(attn_mask, (B, H, n, m), q.device)
    return _weights(q, k, mw, _dense(mask, B, H, n, m, q.device))


def _eq4_float64(q, k, v, mw, allowed):
    """Eq. 4 literally, in float64: explicit exp, multiply by M, normalise. Returns (out, S_M)."""
    q, k, v = q.double(), k.double(), v.double()
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])  # (B, H, n, m)
    m_full = torch.ones_like(scores) if mw is None else mw.double().expand_as(scores)
    if allowed is not None:
        m_full = m_full * allowed
    admissible = m_full > 0
    shift = scores.masked_fill(~admissible, float("-inf")).amax(-1, keepdim=True)
    shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))  # any constant cancels
    numer = m_full * torch.exp((scores - shift).masked_fill(~admissible, 0.0))
    denom = numer.sum(-1, keepdim=True)
    probs = torch.where(denom > 0, numer / torch.where(denom > 0, denom, torch.ones_like(denom)),
                        torch.zeros_like(numer))
    return torch.matmul(probs, v), probs


def mask_attention_reference(q, k, v, mask_weights=None, *, attn_mask=None) -> torch.Tensor:
    """MAN Eq. 4 written out in float64 (``M ⊙ exp(QKᵀ/√d_k)``, row-normalised, times ``V``) — the
    test oracle for :func:`mask_attention`. Returns a float64 ``(B, H, n, d_v)``."""
    B, H, n, m = _check_qkv(q, k, v)
    mw = _check_mask_weights(mask_weights, (B, H, n, m), q.device)
    mask = _check_attn_mask(attn_mask, (B, H, n, m), q.device)
    return _eq4_float64(q, k, v, mw, _dense(mask, B, H, n, m, q.device))[0]


def static_window_mask(q_len: int, kv_len: int | None = None, *, radius: float | torch.Tensor,
                       q_offset: int = 0, device=None) -> torch.Tensor:
    """SMAN's static mask SM of Eq. 11 as bool (True = ``|t − s| <= radius``).

    ``radius`` is a number (one boundary for every sequence) or a ``(B,)`` tensor (one per sequence,
    e.g. ``sqrt(L)/2`` of §4.2); the result is ``(1, 1, n, m)`` or ``(B, 1, n, m)``. Query ``t`` sits
    at absolute position ``q_offset + t``.
    """
    kv_len = q_len if kv_len is None else kv_len
    t = torch.arange(q_offset, q_offset + q_len, device=device)[:, None]
    s = torch.arange(kv_len, device=device)[None, :]
    dist = (t - s).abs()  # (n, m)
    if isinstance(radius, torch.Tensor):
        return dist[None, None] <= radius.reshape(-1, 1, 1, 1)  # (B, 1, n, m)
    return (dist <= radius)[None, None]  # (1, 1, n, m)


# --------------------------------------------------------------------------------------------------
# DMAN, Eq. 12
# --------------------------------------------------------------------------------------------------

def _max_distance(distance_bias: torch.Tensor) -> int:
    return (distance_bias.numel() - 1) // 2


def relative_distance_index(q_len: int, kv_len: int, max_distance: int, *, q_offset: int = 0,
                            device=None) -> torch.Tensor:
    """``(n, m)`` long tensor of table indices ``clip(t − s, −D, D) + D`` for queries at absolute
    positions ``q_offset … q_offset + n − 1`` and keys at ``0 … m − 1`` (``D = max_distance``).
    Distances beyond ``±D`` share the edge entry, so every length indexes inside the table."""
    t = torch.arange(q_offset, q_offset + q_len, device=device)[:, None]
    s = torch.arange(kv_len, device=device)[None, :]
    return (t - s).clamp(-max_distance, max_distance) + max_distance


def _check_dman_params(query_logit, distance_bias, head_bias, B, H, n, dtype, device):
    check_tensor(query_logit, "query_logit", 2, "(batch, queries)")
    check_tensor(distance_bias, "distance_bias", 1, "(2·max_distance + 1,)")
    check_tensor(head_bias, "head_bias", 1, "(heads,)")
    if tuple(query_logit.shape) != (B, n):
        raise ValueError(f"query_logit has shape {tuple(query_logit.shape)}; expected (batch, queries) = {(B, n)}")
    if distance_bias.numel() < 3 or distance_bias.numel() % 2 == 0:
        raise ValueError(f"distance_bias must have 2·max_distance + 1 entries (odd, >= 3) for t − s in "
                         f"[−max_distance, max_distance], got {distance_bias.numel()}")
    if head_bias.numel() != H:
        raise ValueError(f"head_bias has {head_bias.numel()} entries but there are {H} heads")
    for name, t in (("query_logit", query_logit), ("distance_bias", distance_bias), ("head_bias", head_bias)):
        if t.dtype != dtype or t.device != device:
            raise TypeError(f"{name} is a {t.dtype} tensor on {t.device}; expected {dtype} on {device} like q")


def dynamic_mask_logits(query_logit: torch.Tensor, distance_bias: torch.Tensor, head_bias: torch.Tensor, *,
                        kv_len: int | None = None, q_offset: int = 0) -> torch.Tensor:
    """``z[b, h, t, s] = a[b, t] + P[clip(t − s)] + U[h]`` (the argument of σ in Eq. 12), ``(B, H, n, m)``.

    ``query_logit`` ``a = x W`` is ``(B, n)``, ``distance_bias`` ``P`` is ``(2D + 1,)`` and
    ``head_bias`` ``U`` is ``(H,)``.
    """
    B, n = query_logit.shape
    kv_len = n if kv_len is None else kv_len
    idx = relative_distance_index(n, kv_len, _max_distance(distance_bias), q_offset=q_offset,
                                  device=query_logit.device)
    return (distance_bias[idx][None, None] + query_logit[:, None, :, None]) + head_bias[None, :, None, None]


def _allowed(B, n, m, q_offset, causal, kpm, device) -> torch.Tensor | None:
    """(B|1, 1, n, m) bool, True = attend, for causal and key padding (None = everything)."""
    allowed = None
    if causal:
        t = torch.arange(q_offset, q_offset + n, device=device)[:, None]
        allowed = (torch.arange(m, device=device)[None, :] <= t)[None, None]  # (1, 1, n, m)
    if kpm is not None:
        keep = ~kpm[:, None, None, :]  # (B, 1, 1, m)
        allowed = keep if allowed is None else allowed & keep
    return allowed


def dynamic_mask(query_logit: torch.Tensor, distance_bias: torch.Tensor, head_bias: torch.Tensor, *,
                 kv_len: int | None = None, q_offset: int = 0, causal: bool = False,
                 key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
    """DMAN's mask of Eq. 12, ``M = sigmoid(a_t + P[t − s] + U_h)``, ``(B, H, n, m)``; entries of
    padded keys (``key_padding_mask`` True) and, with ``causal``, of future keys are 0."""
    z = dynamic_mask_logits(query_logit, distance_bias, head_bias, kv_len=kv_len, q_offset=q_offset)
    B, _, n, m = z.shape
    kpm = check_key_padding_mask(key_padding_mask, "key_padding_mask", B, m, f"the mask has {m} keys")
    allowed = _allowed(B, n, m, q_offset, causal, kpm, z.device)
    mask = torch.sigmoid(z)
    return mask if allowed is None else mask * allowed


def _dman_validate(q, k, v, query_logit, distance_bias, head_bias, key_padding_mask, q_offset):
    B, H, n, m = _check_qkv(q, k, v)
    _check_dman_params(query_logit, distance_bias, head_bias, B, H, n, q.dtype, q.device)
    kpm = check_key_padding_mask(key_padding_mask, "key_padding_mask", B, m, f"k has batch {B} and {m} keys")
    if isinstance(q_offset, bool) or not isinstance(q_offset, int) or q_offset < 0:
        raise ValueError(f"q_offset must be an int >= 0 (absolute position of the first query), got {q_offset!r}")
    return B, H, n, m, kpm


def dynamic_mask_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, query_logit: torch.Tensor,
                           distance_bias: torch.Tensor, head_bias: torch.Tensor, *, causal: bool = False,
                           key_padding_mask: torch.Tensor | None = None, q_offset: int = 0,
                           backend: str = "auto", dropout_p: float = 0.0, training: bool = False) -> torch.Tensor:
    """DMAN attention: Eq. 4 with the dynamic mask of Eq. 12, without materialising ``M``.

    Args:
        q, k, v: ``(B, H, n, d_k)``, ``(B, H, m, d_k)``, ``(B, H, m, d_v)``.
        query_logit: ``a = x_t W`` for the queries, ``(B, n)``.
        distance_bias: ``P``, ``(2·max_distance + 1,)``, entry ``D + (t − s)``; clipped at the edges.
        head_bias: ``U``, ``(H,)``.
        causal: queries see keys at absolute positions ``<=`` their own.
        key_padding_mask: ``(B, m)`` bool, True = padding key (excluded).
        q_offset: absolute position of the first query (incremental decoding: the cache length).
        backend: ``"auto"`` | ``"reference"`` | ``"sdpa"`` (query-chunked, recomputing, exact gradients
            for ``a``, ``P``, ``U``) | ``"flex"`` (bias inside ``score_mod``; CPU: inference only).
        dropout_p, training: attention-probability dropout (not available on ``flex``).

    Returns:
        ``(B, H, n, d_v)``; rows with no allowed key are 0.
    """
    B, H, n, m, kpm = _dman_validate(q, k, v, query_logit, distance_bias, head_bias, key_padding_mask, q_offset)
    drop = check_probability(dropout_p, "dropout_p") if training else 0.0
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, query_logit, distance_bias, head_bias))
    chosen = resolve_backend(backend, device=q.device, needs_grad=grad, flex_ok=drop == 0.0)
    if chosen == "reference":
        out, _, _ = _dman_reference(q, k, v, query_logit, distance_bias, head_bias, causal, kpm, q_offset, drop)
        return out
    if chosen == "flex":
        return _dman_flex(q, k, v, query_logit, distance_bias, head_bias, causal, kpm, q_offset)
    seed = int(torch.randint(0, 2**62, (1,)).item()) if drop > 0 else 0
    return _DynamicMaskAttention.apply(q, k, v, query_logit, distance_bias, head_bias, kpm, bool(causal),
                                       int(q_offset), float(drop), seed)


def _dman_reference(q, k, v, a, table, u, causal, kpm, q_offset, drop=0.0):
    """Materialised DMAN in the working dtype: returns (out, attention S_M, mask M)."""
    B, H, n, _ = q.shape
    m = k.shape[2]
    z = dynamic_mask_logits(a, table, u, kv_len=m, q_offset=q_offset)  # (B, H, n, m)
    allowed = _allowed(B, n, m, q_offset, causal, kpm, q.device)
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1]) + F.logsigmoid(z)
    has_key = None
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
        has_key = allowed.any(-1, keepdim=True)
        scores = torch.where(has_key, scores, torch.zeros((), dtype=scores.dtype, device=q.device))
    probs = _zero_empty_rows(torch.softmax(scores, dim=-1), has_key)
    mask = torch.sigmoid(z) if allowed is None else torch.sigmoid(z) * allowed
    dropped = F.dropout(probs, drop, training=True) if drop > 0 else probs
    return torch.matmul(dropped, v), probs, mask


def dynamic_mask_attention_reference(q, k, v, query_logit, distance_bias, head_bias, *, causal=False,
                                     key_padding_mask=None, q_offset=0):
    """Eq. 12 + Eq. 4 written out in float64: ``M = sigmoid(a_t + P[clip(t − s)] + U_h)`` (0 where not
    allowed), ``S = M ⊙ exp(scores)`` normalised per row, ``out = S V`` — the test oracle.
    Returns ``(out, attention, mask)``, all float64."""
    B, H, n, m, kpm = _dman_validate(q, k, v, query_logit, distance_bias, head_bias, key_padding_mask, q_offset)
    mask = dynamic_mask(query_logit.double(), distance_bias.double(), head_bias.double(), kv_len=m,
                        q_offset=q_offset, causal=causal, key_padding_mask=kpm)
    out, probs = _eq4_float64(q, k, v, mask, None)
    return out, probs, mask


def _dman_flex(q, k, v, a, table, u, causal, kpm, q_offset):
    D = _max_distance(table)
    off = q_offset

    def score_mod(score, b, h, q_idx, kv_idx):
        idx = (q_idx + off - kv_idx).clamp(-D, D) + D
        return score + F.logsigmoid(a[b, q_idx] + table[idx] + u[h])

    mask = None
    if causal:
        mask = Mask(lambda b, h, qi, kv: kv <= qi + off, "causal")
    if kpm is not None:
        keep = ~kpm
        pad = Mask(lambda b, h, qi, kv: keep[b, kv], "key_padding", static=False)
        mask = pad if mask is None else mask & pad
    out = _flex(q, k, v, score_mod=score_mod, mask=mask)
    if kpm is not None:  # a sequence with no real key: every row is empty
        out = out.masked_fill(kpm.all(-1)[:, None, None, None], 0.0)
    return out


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


def _log_mask(buf, neg_z, k_a, rows, m, *, negated=False, shift=None):
    """The tile's ``log M = −softplus(−z)`` (``negated``: ``−log M``, plus ``shift`` ``(G, rows, 1)`` where
    that is free) in the skewed ``(G, rows, m)`` view of ``buf``, from the ``(G, rows, w)`` table of ``−z``.
    The transcendental runs on the table when it is narrower than the tile (long sequences: at most
    ``2D + 1`` distances per row), else on the view itself (short sequences, where the table covers more
    distances than a row has keys). Returns ``(view, shift_applied)``."""
    if neg_z.shape[-1] <= m:
        values = F.softplus(neg_z)
        if not negated:
            values.neg_()
        elif shift is not None:
            values.add_(shift)
        return _skew_view(_scatter_columns(buf, values, k_a), rows, m), negated and shift is not None
    view = _skew_view(_scatter_columns(buf, neg_z, k_a), rows, m)
    torch.ops.aten.softplus.out(view, 1, 20, out=view)
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
    allowed = _allowed(1, rows, m, t0, causal, None, device)
    allowed = None if allowed is None else allowed[0]  # (1, rows, m)
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
    def forward(ctx, q, k, v, a, table, u, kpm, causal, q_offset, drop_p, seed):
        B, H, n, d_k = q.shape
        m, d_v = k.shape[2], v.shape[-1]
        BH = B * H
        scale = 1.0 / math.sqrt(d_k)
        D = _max_distance(table)
        pairs, rows = _tile_plan(BH, n, m, max(d_k, d_v))
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()  # saved instead of the strided views
        q3, k3, v3 = q.view(BH, n, d_k), k.view(BH, m, d_k), v.view(BH, m, d_v)
        neg_row_bias = (a[:, None, :] + u[None, :, None]).reshape(BH, n).neg_()  # −(a_t + U_h)
        neg_rev_table = table.flip(0).neg_()  # −P[D − u]: column u of a tile's table is the distance D − u
        out = q.new_empty(B, H, n, d_v)
        out3 = out.view(BH, n, d_v)
        lse = q.new_empty(BH, n)
        gen = _generator(q.device, seed) if drop_p > 0 else None
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
                bias, _ = _log_mask(buf, neg_z, k_a, c, m, negated=not fused)  # (G, c, m) skewed view of buf
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
                        p.mul_(_keep_mask(p, drop_p, gen))
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
        ctx.has_kpm, ctx.causal, ctx.q_offset, ctx.drop_p, ctx.seed, ctx.tiles = (
            kpm is not None, causal, q_offset, drop_p, seed, (pairs, rows))
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
        D = _max_distance(table)
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
        gen = _generator(q.device, ctx.seed) if ctx.drop_p > 0 else None
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
                p, shifted = _log_mask(buf_p, neg_z, k_a, c, m, negated=True, shift=lse_t)
                one_minus_m = neg_z.sigmoid_()  # 1 − M = sigmoid(−z) = d log M / dz
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
                    keep = _keep_mask(p, ctx.drop_p, gen)
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
                None, None, None, None, None)
