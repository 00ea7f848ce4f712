"""The dynamic mask of DMAN (Mask Attention Networks, Fan et al. NAACL 2021, Eq. 12) inside MAN's Eq. 4.

DMAN learns the mask from the query token, the signed relative distance and the head::

    M[b, h, t, s] = sigmoid(x_t·W + P[t − s] + U[h])                          (12)

so ``log M = logsigmoid(a_t + P[t − s] + U_h)`` with ``a = x W`` of shape ``(B, n)``, an additive bias of
Eq. 4 (:mod:`.mask_attention`). The ``triton`` backend is the fused kernel of :mod:`maskattn.kernels.triton.dman`
(FlashAttention-2 with the gate in the scores; CUDA); ``sdpa`` the tiled kernel of :mod:`maskattn.kernels.dman`
(no ``n × n`` tensor kept for backward, exact gradients of ``a``, ``P`` and ``U``); ``flex`` computes the
bias inside a ``score_mod``; ``reference`` materialises it.

Distances beyond the table: ``P`` has ``2·max_distance + 1`` entries for ``t − s ∈ [−max_distance,
max_distance]``; larger ``|t − s|`` use the edge entry (``P[±max_distance]``), so any sequence length is
valid and never indexes out of bounds.

``mask_floor``: ``None`` (default) takes the exact ``log M``; a number ``ε`` uses ``log max(M, ε)`` — the
authors' code clamps ``M`` at ``1e-10`` before the log (LibertFan/MAN
``translation/fairseq/modules/multihead_attention2.py`` line 122), so a key whose ``M`` is below ``ε`` keeps the
weight ``ε · exp(score)`` and passes no gradient to the mask. ``mask_floor_mode="row_max"`` clamps ``M`` divided by
its maximum over the row's keys instead, the maximum without gradient — the authors' summarization code
(``summarization/model/multihead_attention2.py`` line 144: ``M.div(M.max(-1)[0].detach()).clamp(1e-10).log()``).
Dividing a row by a constant leaves its softmax unchanged, so that is a floor of ``ε · max_s M[t, s]`` on ``M``;
as ``σ`` is increasing, ``max_s M[t, s] = σ(a_t + U_h + max_s P[clip(t − s)])``, the maximum over every key of the
call (padded keys and, in a causal call, later keys included, as the authors' ``max(-1)`` over the whole row:
a decoding step's row therefore has the maximum over the keys so far, as their incremental decoding does).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..errors import ArgumentError
from .. import backends
from ..validation import (check_choice, check_key_padding_mask, check_probability, check_qkv, check_tensor, checking,
                          entry_point)
from ..kernels.dman import dynamic_mask_kernel
from ..kernels.flex import flex_attention_call
from ..kernels.precision import in_working_precision
from ..kernels.triton.dman import dman_triton
from ..masks import allowed as allowed_pairs, causal as causal_mask, predicate
from .dot_product import attention_weights, empty_output, is_empty
from .mask_attention import eq4_float64

__all__ = ["relative_distance_index", "dynamic_mask_logits", "dynamic_mask", "dynamic_mask_attention",
           "dynamic_mask_weights", "dynamic_mask_attention_reference", "check_mask_floor", "check_mask_floor_mode",
           "MASK_FLOOR_MODES"]

#: What ``mask_floor`` clamps: ``"absolute"`` — ``M`` (the authors' translation code, line 122); ``"row_max"`` —
#: ``M / max_s M[t, s]`` (their summarization code, line 144).
MASK_FLOOR_MODES = ("absolute", "row_max")


def check_mask_floor(mask_floor) -> float | None:
    """``None`` (the exact log of Eq. 12's mask) or a floor ``0 < ε < 1`` for ``M`` before the log."""
    if mask_floor is None:
        return None
    if isinstance(mask_floor, bool) or not isinstance(mask_floor, (int, float)) or not 0 < mask_floor < 1:
        hint = " (in a recipe write 1.0e-10: YAML reads 1e-10 as a string)" if isinstance(mask_floor, str) else ""
        raise ArgumentError(f"mask_floor must be None (exact log M) or a number in (0, 1) such as 1e-10 (the authors' "
                         f"clamp), got {mask_floor!r}{hint}")
    return float(mask_floor)


def check_mask_floor_mode(mask_floor_mode: object, mask_floor: float | None) -> str:
    """``mask_floor_mode`` checked (:data:`MASK_FLOOR_MODES`); ``"row_max"`` needs a ``mask_floor``."""
    mode = check_choice(mask_floor_mode, "mask_floor_mode", MASK_FLOOR_MODES)
    if mode == "row_max" and mask_floor is None:
        raise ArgumentError("mask_floor_mode='row_max' floors M relative to its row maximum and needs mask_floor= (the "
                            "authors' summarization code: 1e-10), got mask_floor=None")
    return mode


def _row_log_floor(query_logit: torch.Tensor, distance_bias: torch.Tensor, head_bias: torch.Tensor, kv_len: int,
                   q_offset: int, mask_floor: float) -> torch.Tensor:
    """``log(ε · max_s M[t, s])`` per row, ``(B, H, n, 1)``, without gradient: ``max_s M = σ(a_t + U_h + max_s
    P[clip(t − s)])`` over the call's keys ``s = 0 … kv_len − 1`` (the floor of ``mask_floor_mode="row_max"``)."""
    B, n = query_logit.shape
    idx = relative_distance_index(n, kv_len, _max_distance(distance_bias), q_offset=q_offset,
                                  device=query_logit.device)
    nearest = distance_bias.detach()[idx].amax(-1)  # (n,): max_s P[clip(t − s)]
    z_max = query_logit.detach()[:, None, :] + head_bias.detach()[None, :, None] + nearest  # (B, H, n)
    return (F.logsigmoid(z_max) + math.log(mask_floor)).unsqueeze(-1)


def _mask(z: torch.Tensor, mask_floor: float | None, row_floor: torch.Tensor | None = None) -> torch.Tensor:
    """``M = sigmoid(z)``, or ``max(M, ε)`` with a ``mask_floor`` ``ε``, or ``max(M, exp(row_floor))`` per row."""
    mask = torch.sigmoid(z)
    if row_floor is not None:
        return mask.clamp(min=row_floor.exp())
    return mask if mask_floor is None else mask.clamp(min=mask_floor)


def _log_mask(z: torch.Tensor, mask_floor: float | None, row_floor: torch.Tensor | None = None) -> torch.Tensor:
    """``log M = logsigmoid(z)``, or ``log max(M, ε)`` with a ``mask_floor`` ``ε``, or ``max(log M, row_floor)``
    with a per-row floor (``mask_floor_mode="row_max"``; broadcast over the keys)."""
    log_m = F.logsigmoid(z)
    if row_floor is not None:
        return log_m.clamp(min=row_floor)
    return log_m if mask_floor is None else log_m.clamp(min=math.log(mask_floor))


def _floor_of_rows(query_logit: torch.Tensor, distance_bias: torch.Tensor, head_bias: torch.Tensor, kv_len: int,
                   q_offset: int, mask_floor: float | None, mask_floor_mode: str) -> torch.Tensor | None:
    """The per-row log floor of ``mask_floor_mode="row_max"``, else None."""
    if mask_floor_mode != "row_max" or mask_floor is None:
        return None
    return _row_log_floor(query_logit, distance_bias, head_bias, kv_len, q_offset, mask_floor)


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


def _check_parameters(query_logit, distance_bias, head_bias, B, H, n, dtype, device):
    check_tensor(query_logit, "query_logit", 2, "(batch, queries)")
    check_tensor(distance_bias, "distance_bias", 1, "(2·max_distance + 1,)")
    check_tensor(head_bias, "head_bias", 1, "(heads,)")
    if tuple(query_logit.shape) != (B, n):
        raise ArgumentError(f"query_logit has shape {tuple(query_logit.shape)}; expected (batch, queries) = {(B, n)}")
    if distance_bias.numel() < 3 or distance_bias.numel() % 2 == 0:
        raise ArgumentError(f"distance_bias must have 2·max_distance + 1 entries (odd, >= 3) for t − s in "
                         f"[−max_distance, max_distance], got {distance_bias.numel()}")
    if head_bias.numel() != H:
        raise ArgumentError(f"head_bias has {head_bias.numel()} entries but there are {H} heads")
    for name, t in (("query_logit", query_logit), ("distance_bias", distance_bias), ("head_bias", head_bias)):
        if t.device != device:  # dtypes may differ (float32 parameters, bfloat16 activations under autocast)
            raise ArgumentError(f"{name} is on {t.device} but q is on {device}")


def _validate(q, k, v, query_logit, distance_bias, head_bias, key_padding_mask, q_offset):
    """``(B, H, n, m, key_padding_mask)``, the inputs checked in the outermost entry point only."""
    if not checking():
        return (*q.shape[:3], k.shape[2], key_padding_mask)
    B, H, n, m = check_qkv(q, k, v)
    _check_parameters(query_logit, distance_bias, head_bias, B, H, n, q.dtype, q.device)
    kpm = check_key_padding_mask(key_padding_mask, "key_padding_mask", B, m, lambda: f"k has batch {B} and {m} keys")
    if isinstance(q_offset, bool) or not isinstance(q_offset, int) or q_offset < 0:
        raise ArgumentError(f"q_offset must be an int >= 0 (absolute position of the first query), got {q_offset!r}")
    return B, H, n, m, kpm


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
    # the per-row terms first, (B, H, n, 1), then the distances (n, m): no (B, 1, n, m) intermediate
    return (query_logit[:, None, :, None] + head_bias[None, :, None, None]) + distance_bias[idx]


def _allowed(B, H, n, m, q_offset, causal, kpm, device) -> torch.Tensor | None:
    """(B|1, 1, n, m) bool, True = attend: causal (queries at ``q_offset …``) and key padding."""
    structure = causal_mask().shifted(q_offset) if causal else None
    return allowed_pairs(structure, kpm, n, m, batch=B, heads=1, device=device)


@entry_point
def dynamic_mask(query_logit: torch.Tensor, distance_bias: torch.Tensor, head_bias: torch.Tensor, *,
                 kv_len: int | None = None, q_offset: int = 0, causal: bool = False,
                 key_padding_mask: torch.Tensor | None = None, mask_floor: float | None = None,
                 mask_floor_mode: str = "absolute") -> torch.Tensor:
    """DMAN's mask of Eq. 12, ``M = sigmoid(a_t + P[t − s] + U_h)`` (``max(M, mask_floor)`` with a floor;
    ``max(M, mask_floor · max_s M[t, s])`` with ``mask_floor_mode="row_max"``), ``(B, H, n, m)``; entries of padded
    keys (``key_padding_mask`` True) and, with ``causal``, of future keys are 0."""
    z = dynamic_mask_logits(query_logit, distance_bias, head_bias, kv_len=kv_len, q_offset=q_offset)
    B, H, n, m = z.shape
    kpm = check_key_padding_mask(key_padding_mask, "key_padding_mask", B, m, lambda: f"the mask has {m} keys") \
        if checking() else key_padding_mask
    allowed = _allowed(B, H, n, m, q_offset, causal, kpm, z.device)
    mask_floor = check_mask_floor(mask_floor)
    row_floor = _floor_of_rows(query_logit, distance_bias, head_bias, m, q_offset, mask_floor,
                               check_mask_floor_mode(mask_floor_mode, mask_floor))
    mask = _mask(z, mask_floor, row_floor)
    return mask if allowed is None else mask * allowed


@entry_point
def dynamic_mask_weights(q, k, query_logit, distance_bias, head_bias, *, causal=False, key_padding_mask=None,
                         q_offset=0, mask_floor=None,
                         mask_floor_mode: str = "absolute") -> tuple[torch.Tensor, torch.Tensor]:
    """The attention map ``S_M`` of Eq. 4 with DMAN's mask and the mask ``M`` itself, both ``(B, H, n, m)``,
    in the inputs' dtype (the reference backend; what a person plots)."""
    B, H, n, m, kpm = _validate(q, k, k, query_logit, distance_bias, head_bias, key_padding_mask, q_offset)
    mask_floor = check_mask_floor(mask_floor)
    row_floor = _floor_of_rows(query_logit, distance_bias, head_bias, m, q_offset, mask_floor,
                               check_mask_floor_mode(mask_floor_mode, mask_floor))  # (B, H, n, 1) or None
    z = dynamic_mask_logits(query_logit, distance_bias, head_bias, kv_len=m, q_offset=q_offset)  # (B, H, n, m)
    allowed = _allowed(B, H, n, m, q_offset, causal, kpm, q.device)
    probs = attention_weights(q, k, allowed, bias=_log_mask(z, mask_floor, row_floor))
    mask = _mask(z, mask_floor, row_floor)
    return probs, mask if allowed is None else mask * allowed


@entry_point
def dynamic_mask_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, query_logit: torch.Tensor,
                           distance_bias: torch.Tensor, head_bias: torch.Tensor, *, causal: bool = False,
                           key_padding_mask: torch.Tensor | None = None, q_offset: int = 0,
                           backend: str = "auto", dropout_p: float = 0.0, training: bool = False,
                           mask_floor: float | None = None, mask_floor_mode: str = "absolute") -> torch.Tensor:
    """DMAN attention: Eq. 4 with the dynamic mask of Eq. 12, without materialising ``M``.

    Args:
        q, k, v: ``(B, H, n, d_k)``, ``(B, H, m, d_k)``, ``(B, H, m, d_v)``.
        query_logit: ``a = x_t W`` for the queries, ``(B, n)``.
        distance_bias: ``P``, ``(2·max_distance + 1,)``, entry ``D + (t − s)``; clipped at the edges.
        head_bias: ``U``, ``(H,)``.
        causal: queries see keys at absolute positions ``<=`` their own.
        key_padding_mask: ``(B, m)`` bool, True = padding key (excluded).
        q_offset: absolute position of the first query (incremental decoding: the cache length).
        backend: ``"auto"`` | ``"triton"`` (the fused kernel; CUDA) | ``"sdpa"`` (the tiled kernel, exact gradients
            for ``a``, ``P``, ``U``) | ``"flex"`` (bias inside ``score_mod``; CPU: inference only) | ``"reference"``
            — family ``dman`` of :data:`maskattn.backends.FAMILIES`.
        dropout_p, training: attention-probability dropout (not available on ``flex``).
        mask_floor: ``None`` (exact ``log M``) or ``ε``: ``log max(M, ε)`` (the authors' code: ``1e-10``).
        mask_floor_mode: ``"absolute"`` (the floor above) or ``"row_max"``: ``log max(M / max_s M[t, s], ε)``, the
            authors' summarization code (``reference``, ``sdpa`` — as the materialised formula — and ``flex``;
            ``triton`` declines it).

    Returns:
        ``(B, H, n, d_v)``; rows with no allowed key are 0.
    """
    B, H, n, m, kpm = _validate(q, k, v, query_logit, distance_bias, head_bias, key_padding_mask, q_offset)
    if checking():
        check_probability(dropout_p, "dropout_p")
        mask_floor = check_mask_floor(mask_floor)
        mask_floor_mode = check_mask_floor_mode(mask_floor_mode, mask_floor)
    row_max = mask_floor_mode == "row_max"
    drop = dropout_p if training else 0.0
    if is_empty(q, k):
        return empty_output(q, v, k, query_logit, distance_bias, head_bias)
    chosen = backends.resolve("dman", backend, backends.Situation.of(
        q, k, v, query_logit, distance_bias, head_bias, dropout=drop > 0, batch_mask=kpm is not None,
        row_floor=row_max, decoding=n < m))
    if chosen == "triton":
        return dman_triton(q, k, v, query_logit, distance_bias, head_bias, causal=causal, key_padding_mask=kpm,
                           q_offset=q_offset, dropout_p=drop, mask_floor=mask_floor)
    if chosen == "reference" or (chosen == "sdpa" and (torch.compiler.is_compiling() or row_max)):
        # under torch.compile the tiled kernel's math runs as plain operations that Inductor traces (§3); the
        # tiled kernel takes one fixed floor, so a row-normalised floor runs the same materialised formula
        probs, _ = dynamic_mask_weights(q, k, query_logit, distance_bias, head_bias, causal=causal,
                                        key_padding_mask=kpm, q_offset=q_offset, mask_floor=mask_floor,
                                        mask_floor_mode=mask_floor_mode)
        return torch.matmul(F.dropout(probs, drop, training=True) if drop > 0 else probs, v)
    if chosen == "flex":
        row_floor = _floor_of_rows(query_logit, distance_bias, head_bias, m, q_offset, mask_floor, mask_floor_mode)
        return _flex(q, k, v, query_logit, distance_bias, head_bias, causal, kpm, q_offset, mask_floor, row_floor)
    return in_working_precision(dynamic_mask_kernel, q, k, v, query_logit, distance_bias, head_bias, out_dtype=v.dtype,
                                key_padding_mask=kpm, causal=causal, q_offset=q_offset, dropout_p=drop,
                                mask_floor=mask_floor)


@entry_point
def dynamic_mask_attention_reference(q, k, v, query_logit, distance_bias, head_bias, *, causal=False,
                                     key_padding_mask=None, q_offset=0, mask_floor=None, mask_floor_mode="absolute"):
    """Eq. 12 + Eq. 4 written out in float64: ``M = sigmoid(a_t + P[clip(t − s)] + U_h)`` (``max(M, ε)``
    with a ``mask_floor``; 0 where not allowed), ``S = M ⊙ exp(scores)`` normalised per row, ``out = S V``
    — the test oracle. Returns ``(out, attention, mask)``, all float64."""
    B, H, n, m, kpm = _validate(q, k, v, query_logit, distance_bias, head_bias, key_padding_mask, q_offset)
    mask = dynamic_mask(query_logit.double(), distance_bias.double(), head_bias.double(), kv_len=m,
                        q_offset=q_offset, causal=causal, key_padding_mask=kpm, mask_floor=mask_floor,
                        mask_floor_mode=mask_floor_mode)
    out, probs = eq4_float64(q, k, v, mask)
    return out, probs, mask


def _flex(q, k, v, a, table, u, causal, kpm, q_offset, mask_floor, row_floor=None):
    D = _max_distance(table)
    off = q_offset
    lowest = -D  # a plain captured value, not an expression: see the note in functional/local.py's _flex
    floors = None if row_floor is None else row_floor.squeeze(-1)  # (B, H, n): log(ε · max_s M), row_max only

    def score_mod(score, b, h, q_idx, kv_idx):
        idx = (q_idx - kv_idx + off).clamp(lowest, D) + D
        log_m = F.logsigmoid(a[b, q_idx] + table[idx] + u[h])
        if floors is not None:
            return score + torch.maximum(log_m, floors[b, h, q_idx])
        return score + (log_m if mask_floor is None else log_m.clamp(min=math.log(mask_floor)))

    B, H, n, _ = q.shape
    structure = causal_mask().shifted(q_offset) if causal else None
    return flex_attention_call(q, k, v, score_mod=score_mod,
                               mask=predicate(structure, kpm, batch=B, heads=H, q_len=n, kv_len=k.shape[2]))
