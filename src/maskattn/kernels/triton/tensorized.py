"""MTSA / Fast-DiSA's factorised attention (docs/design.md §1) as Triton kernels: the ``triton`` backend of the
``tensorized`` family.

One pass over the key tiles a query tile can see accumulates, in float32, the numerator ``Σ w·d·(v ⊙ E)`` and
the denominator ``Σ w·E`` (``w = σ(R)`` for the log-sigmoid scale: no running maximum, no row normaliser —
they cancel in the ratio; ``d`` the weights' dropout mask), and divides at the end. Each head's mask is a band
``lo <= j − i <= hi`` (forward, backward, with or without the diagonal, a window, everything); tiles outside a
head's band are skipped, so MTSA's directional heads cost half of full attention, and tiles wholly inside it run
without a mask. Heads share the tiles of their launch, so window heads (narrow bands) run in a launch of their own
with 16-row tiles started at the band start (:func:`head_groups`; docs/gpu/offline-perf.md). ``q``, ``k`` are ``tl.dot`` operands in the inputs' dtype; ``v ⊙ E`` and ``E`` in
:func:`.runtime.value_dtype` (bfloat16 for half-precision inputs: E's range needs float32's exponent). Backward is
a pre-pass ``dN = dO / D``, ``dD = −dN ⊙ out`` (:func:`output_gradients`) and two kernels without atomics (keys,
then queries).

Attention dropout follows MTSA Appendix A.3 (keep probability ``√(1 − p)`` on each numerator factor): the
weights' mask is drawn inside the kernel from a seed and redrawn by backward; the per-(key, feature) mask of
``v ⊙ E`` does not depend on the query and is ordinary dropout in front of the kernel.

The kernels are the ``torch.library`` operators ``maskattn::tensorized_triton`` (and its backward), so
``torch.compile(fullgraph=True)`` takes them as one node each, for any sequence length.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.library import custom_op, register_autograd

from . import runtime

__all__ = ["tensorized_triton", "head_offsets", "head_groups", "unsupported", "output_gradients", "BAND_SENTINEL",
           "KERNELS", "NARROW_BAND"]

LOG2E = 1.4426950408889634  # log₂ e: the kernels' exponentials are base 2

#: stands for an open side of a band (``j − i`` unbounded); far beyond any sequence length, far below int32's edge
BAND_SENTINEL = 1 << 30


def head_offsets(bands) -> list[int]:
    """Per-head ``(left, right)`` bands (``i − left <= j <= i + right``, ``inf`` for an open side) as the
    kernels' flat list ``[lo₀, hi₀, lo₁, hi₁, …]`` of ``j − i`` bounds."""
    flat = []
    for left, right in bands:
        # comparisons, not math.isinf: Dynamo traces this with plain Python floats
        flat += [-BAND_SENTINEL if left == math.inf else -int(left), BAND_SENTINEL if right == math.inf else int(right)]
    return flat


#: the kernel passes of one MTSA call (:data:`.runtime.TILE_TABLE`; the narrow variants share the kernels)
KERNELS = ("tensorized_fwd", "tensorized_bwd_kv", "tensorized_bwd_q", "tensorized_fwd_narrow",
           "tensorized_bwd_kv_narrow", "tensorized_bwd_q_narrow")
#: heads whose band spans at most this many positions (MTSA's window heads) run in a launch of their own with the
#: ``tensorized_*_narrow`` tiles of :data:`.runtime.TILE_TABLE`, as the band kernel's narrow bands do
NARROW_BAND = 33


def head_groups(bands: list[int]) -> list[tuple[str, list[int]]]:
    """The launches of a call with per-head bands ``bands`` (:func:`head_offsets`' flat list): ``(suffix, heads)``
    — the heads whose band spans more than :data:`NARROW_BAND` positions (directional, full: tiles of 64–128 rows,
    aligned) with the suffix ``""``, those of at most :data:`NARROW_BAND` (windows) with ``"_narrow"``: 16-row
    tiles whose key (query) tiles start where the band starts, so a window(3) head fills 7 of 32 computed scores per
    row (21.9 %, the most a tensor-core tile holds: docs/gpu/offline-perf.md) instead of 4–7 % in the shared tiles.
    Empty groups are left out."""
    narrow = [h for h in range(len(bands) // 2) if bands[2 * h + 1] - bands[2 * h] + 1 <= NARROW_BAND]
    wide = [h for h in range(len(bands) // 2) if h not in narrow]
    return [(suffix, heads) for suffix, heads in (("", wide), ("_narrow", narrow)) if heads]


def unsupported(*, device: str, dtype: torch.dtype, head_dims: dict[str, int], head_bands: bool, scale: str) -> list[str]:
    """Why the Triton kernels cannot run an MTSA call (an empty list when they can)."""
    reasons = runtime.call_reasons(device, dtype, head_dims, KERNELS)
    if not head_bands:
        reasons.append("takes masks that are a band per head (forward, backward, window, full, causal), not an "
                       "arbitrary mask tensor or predicate")
    if scale not in ("log_sigmoid", "identity"):
        reasons.append(f"has no kernel for scale {scale!r}")
    return reasons


def _threshold(acc: torch.dtype) -> float:
    """Denominators above this divide with full precision (the rows below come back 0, as on the other fast
    paths: :func:`maskattn.kernels.tensorized.reliable_denominator`)."""
    info = torch.finfo(acc)
    return info.tiny / info.eps


def _constants(kernel: str, suffix: str, q: torch.Tensor, ve: torch.Tensor, kpm, identity: bool,
               dropout_p: float) -> dict:
    """The launch constants of pass ``kernel`` for a head group of :func:`head_groups` (``suffix``)."""
    tiles = runtime.tiles(kernel + suffix, max(q.shape[-1], ve.shape[-1]), q.device, q.dtype)
    return dict(runtime.launch_constants(q, ve), HAS_KPM=kpm is not None, IDENTITY=identity,
                DROPOUT=dropout_p > 0, BAND_START=suffix == "_narrow", BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
                num_warps=tiles.warps, num_stages=tiles.stages)


def _scales(scale: float) -> tuple[float, float]:
    """``(scale, scale·log₂e)``: the score scale (``1/√d_k`` of the unpadded head: :func:`tensorized_triton` pads
    the features) and the same in log₂ units (the kernels' exponentials are base 2)."""
    return scale, scale * LOG2E


@custom_op("maskattn::tensorized_triton", mutates_args=())
def _forward(q: torch.Tensor, k: torch.Tensor, ve: torch.Tensor, e: torch.Tensor, key_padding: torch.Tensor | None,
             bands: list[int], seed: torch.Tensor | None, identity: bool,
             dropout_p: float, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out, D, row_max)``: out ``(B, H, n, d_v)`` in q's dtype, laid out as ``(B, n, H, d_v)`` (merging the
    heads is a view), the float32 (float64) denominators and with the identity scale the row maxima (log₂ units)."""
    jit = runtime.load("tensorized_jit")
    B, H, n, d_k = q.shape
    m, d_v = k.shape[2], ve.shape[-1]
    out = q.new_empty(B, n, H, d_v).transpose(1, 2)
    acc = runtime.accumulator(q.dtype)
    den = q.new_empty(B, H, n, d_v, dtype=acc)
    row_max = q.new_empty((B, H, n) if identity else (0,), dtype=acc)
    for suffix, heads in head_groups(bands):  # disjoint heads: each launch writes its own
        constants = _constants("tensorized_fwd", suffix, q, ve, key_padding, identity, dropout_p)
        tiles = runtime.cdiv(n, constants["BLOCK_M"])
        runtime.launch(
            jit.tensorized_fwd, tiles * B * len(heads), q, k, ve, e, runtime.placeholder(key_padding, q),
            runtime.device_table(bands, q.device), runtime.device_table(heads, q.device),
            runtime.placeholder(seed, q, torch.int64), out, den,
            runtime.placeholder(row_max if identity else None, q, acc), *runtime.stride_args(q, k, ve, e, out),
            H, n, m, d_k, d_v, tiles, len(heads), _scales(scale)[1], dropout_p, _threshold(acc), **constants)
    return out, den, row_max


@_forward.register_fake
def _(q, k, ve, e, key_padding, bands, seed, identity, dropout_p, scale):
    B, H, n, _ = q.shape
    acc = runtime.accumulator(q.dtype)
    return (q.new_empty(B, n, H, ve.shape[-1]).transpose(1, 2), q.new_empty(B, H, n, ve.shape[-1], dtype=acc),
            q.new_empty((B, H, n) if identity else (0,), dtype=acc))


def output_gradients(grad_out: torch.Tensor, out: torch.Tensor, den: torch.Tensor, value_dtype: torch.dtype
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward pre-pass (FlashAttention-2's Δ, per feature): ``dN = dO / D`` and ``dD = −dN ⊙ out`` (0 where
    ``D`` underflowed), contiguous ``(B, H, n, d_v)`` in ``value_dtype`` — read once per tile by both passes."""
    underflow = den <= _threshold(den.dtype)  # NaN is not underflow: it propagates, as on the reference
    d_num = torch.where(underflow, 0.0, grad_out.to(den.dtype) / torch.where(underflow, 1.0, den))
    d_den = -d_num * out.to(den.dtype)
    return d_num.to(value_dtype).contiguous(), d_den.to(value_dtype).contiguous()


@custom_op("maskattn::tensorized_triton_backward", mutates_args=())
def _backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, ve: torch.Tensor, e: torch.Tensor,
              key_padding: torch.Tensor | None, bands: list[int], seed: torch.Tensor | None, out: torch.Tensor,
              den: torch.Tensor, row_max: torch.Tensor, identity: bool,
              dropout_p: float, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, d(v⊙E), dE)``, contiguous, in the inputs' dtypes."""
    jit = runtime.load("tensorized_jit")
    B, H, n, d_k = q.shape
    m, d_v = k.shape[2], ve.shape[-1]
    grad_q, grad_k = q.new_empty(B, H, n, d_k), k.new_empty(B, H, m, d_k)
    grad_ve, grad_e = ve.new_empty(B, H, m, d_v), e.new_empty(B, H, m, d_v)
    d_num, d_den = output_gradients(grad_out, out, den, ve.dtype)
    strides = runtime.stride_args(q, k, ve, e)
    scale, scale2 = _scales(scale)
    for suffix, heads in head_groups(bands):  # disjoint heads: each launch writes its own gradients
        common = (q, k, ve, e, runtime.placeholder(key_padding, q), runtime.device_table(bands, q.device),
                  runtime.device_table(heads, q.device), runtime.placeholder(seed, q, torch.int64),
                  runtime.placeholder(row_max if identity else None, q, den.dtype), d_num, d_den)
        keys = _constants("tensorized_bwd_kv", suffix, q, ve, key_padding, identity, dropout_p)
        key_tiles = runtime.cdiv(m, keys["BLOCK_N"])
        runtime.launch(jit.tensorized_bwd_kv, key_tiles * B * len(heads), *common, grad_k, grad_ve, grad_e, *strides,
                       H, n, m, d_k, d_v, key_tiles, len(heads), scale, scale2, dropout_p, **keys)
        queries = _constants("tensorized_bwd_q", suffix, q, ve, key_padding, identity, dropout_p)
        query_tiles = runtime.cdiv(n, queries["BLOCK_M"])
        runtime.launch(jit.tensorized_bwd_q, query_tiles * B * len(heads), *common, grad_q, *strides,
                       H, n, m, d_k, d_v, query_tiles, len(heads), scale, scale2, dropout_p, **queries)
    return grad_q, grad_k, grad_ve, grad_e


@_backward.register_fake
def _(grad_out, q, k, ve, e, key_padding, bands, seed, out, den, row_max, identity, dropout_p, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), ve.new_empty(ve.shape), e.new_empty(e.shape)


def _setup_context(ctx, inputs, output):
    q, k, ve, e, key_padding, bands, seed, identity, dropout_p, scale = inputs
    out, den, row_max = output
    ctx.save_for_backward(q, k, ve, e, key_padding, seed, out, den, row_max)
    ctx.arguments = (bands, identity, dropout_p, scale)


def _backward_formula(ctx, grad_out, _grad_den, _grad_row_max):
    q, k, ve, e, key_padding, seed, out, den, row_max = ctx.saved_tensors
    bands, identity, dropout_p, scale = ctx.arguments
    grads = _backward(grad_out, q, k, ve, e, key_padding, bands, seed, out, den, row_max, identity, dropout_p, scale)
    return (*grads, None, None, None, None, None, None)


register_autograd("maskattn::tensorized_triton", _backward_formula, setup_context=_setup_context)


def tensorized_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s2t: torch.Tensor, bands,
                      key_padding_mask: torch.Tensor | None, *, scale: str, dropout_p: float
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, reliable)``: MTSA's attention of q/k ``(B, H, n|m, d_k)``, v/s2t ``(B, H, m, d_v)`` with per-head
    ``bands`` (``(left, right)`` per head, ``inf`` for an open side), ``key_padding_mask`` ``(B, m)`` (True =
    padding) or None, ``scale`` ``"log_sigmoid"`` or ``"identity"`` and attention dropout ``dropout_p`` (MTSA
    Appendix A.3; 0 = none). ``reliable`` ``(B, H, n, d_v)`` is False where the denominator underflowed and the
    output is 0 (docs/design.md §3). Computes in float32 (float64 for float64 inputs); float16 values in float32.
    Returns ``out`` in the inputs' dtype."""
    out_dtype = q.dtype
    with torch.autocast(q.device.type, enabled=False):
        work = runtime.kernel_dtype(q.dtype)
        q, k = q.to(work), k.to(work)
        values = runtime.value_dtype(q.dtype)  # E's range: bfloat16 for half precision (docs/design.md §3)
        keep_pad = None if key_padding_mask is None else key_padding_mask[:, None, :, None]  # (B, 1, m, 1)
        s2t = s2t.to(runtime.accumulator(q.dtype))
        if keep_pad is not None:
            s2t = s2t.masked_fill(keep_pad, float("-inf"))
        c = s2t.detach().amax(dim=-2, keepdim=True)
        e = torch.exp(s2t - torch.where(torch.isfinite(c), c, torch.zeros_like(c)))  # E = exp(S − c); 0 on padding
        ve = v.to(e.dtype) * e
        if keep_pad is not None:
            ve = ve.masked_fill(keep_pad, 0.0)  # junk values at padding keys cannot reach the sums
        keep_factor = 1.0 - math.sqrt(1.0 - dropout_p) if dropout_p > 0 else 0.0
        if keep_factor > 0:
            ve = F.dropout(ve, keep_factor, training=True)  # the (key, feature) factor of Appendix A.3
        seed = torch.randint(0, 2**62, (1,), dtype=torch.int64, device=q.device) if keep_factor > 0 else None
        kpm = None if key_padding_mask is None else key_padding_mask.to(torch.uint8).contiguous()
        # features padded to a multiple of 16 (zeros change no score and give zero columns, sliced off)
        d_k, d_v = q.shape[-1], v.shape[-1]
        q, k = (runtime.pad_features(t, runtime.padded_head_dim(d_k)) for t in (q, k))
        ve, e = (runtime.pad_features(t.to(values), runtime.padded_head_dim(d_v)) for t in (ve, e))
        out, den, _ = _forward(q, k, ve, e, kpm, head_offsets(bands), seed, scale == "identity", keep_factor,
                               1.0 / math.sqrt(d_k))
        out, den = runtime.unpad_features(out, d_v), runtime.unpad_features(den, d_v)
    return out.to(out_dtype), ~(den <= _threshold(den.dtype))
