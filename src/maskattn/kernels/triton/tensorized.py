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
weights' mask is drawn inside the attention kernels from a seed and redrawn by backward; the per-(key, feature) mask
of ``v ⊙ E`` does not depend on the query and is drawn, by position under a second seed, where ``v ⊙ E`` is made.

MTSA's per-element work runs in fused elementwise kernels (:mod:`.tensorized_elementwise_jit`; docs/design.md §3),
each reading and writing every element once: in front, ``c`` (S's maximum per feature) and one prologue that writes
``v ⊙ E`` and ``E`` in the value dtype, already padded to the kernels' feature width; behind, the ``reliable`` flags;
in backward, the ``dN`` / ``dD`` pre-pass and the chain rule from ``d(v ⊙ E)``, ``dE`` back to v and S.

The kernels are the ``torch.library`` operators ``maskattn::tensorized_prologue`` and ``maskattn::tensorized_triton``
(each with its backward), so ``torch.compile(fullgraph=True)`` takes them as one node each, for any sequence length.
"""

from __future__ import annotations

import math

import torch
from torch.library import custom_op, register_autograd

from . import runtime

__all__ = ["tensorized_triton", "head_offsets", "head_groups", "unsupported", "output_gradients", "BAND_SENTINEL",
           "KERNELS", "NARROW_BAND", "ELEMENTWISE_KERNELS", "ELEMENTWISE_BLOCK", "elementwise_rows"]

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


# --------------------------------------------------------------------------------------------------
# MTSA's per-element work: fused elementwise kernels (tensorized_elementwise_jit; docs/design.md §3)
# --------------------------------------------------------------------------------------------------

#: the kernels of MTSA's per-element work around the attention passes (:mod:`.tensorized_elementwise_jit`). They
#: hold no tile in shared memory and loop over nothing but their keys (``c``), so their tiles are not
#: :data:`.runtime.TILE_TABLE`'s (per shared-memory class): :func:`elementwise_rows` rows × the padded feature width
ELEMENTWISE_KERNELS = ("tensorized_source_max", "tensorized_prologue", "tensorized_reliable", "tensorized_output_grads",
                       "tensorized_prologue_bwd")
#: elements per program of the elementwise kernels: with :data:`ELEMENTWISE_WARPS` warps, 16 per thread — two 16-byte
#: loads of bfloat16 per tensor, in flight together: memory-bound work wants many bytes in flight and short programs
ELEMENTWISE_BLOCK = 2048
ELEMENTWISE_WARPS = 4
#: features per program of the maximum over keys (:func:`tensorized_source_max` loops over a sequence, so its
#: programs split the features: d_v / 32 programs per (batch, head) pair; 64 contiguous bytes of bfloat16 per row)
SOURCE_MAX_FEATURES = 32


def elementwise_rows(block: int) -> int:
    """Rows (positions) per program of an elementwise kernel whose feature tile is ``block`` wide (its main block, for
    a split width: :func:`_feature_blocks`): :data:`ELEMENTWISE_BLOCK` / ``block``; 16 under the interpreter, so that
    test lengths cross tile edges (as the attention kernels' 16 × 16 tiles there: :func:`.runtime.tiles`)."""
    return 16 if runtime.interpreted() else max(1, ELEMENTWISE_BLOCK // block)


def _feature_block(width: int) -> int:
    """The power-of-two feature tile (at least 16) that covers ``width`` features."""
    return max(16, runtime.next_power_of_2(width))


def _feature_blocks(width: int) -> tuple[int, int]:
    """``(main, tail)``: the feature blocks of the elementwise kernels' tiles for heads of ``width`` features — the
    attention kernels' layout (:func:`.runtime.feature_split` of :func:`.runtime.feature_width`: 150 → 128 + 32,
    where one power-of-two tile was 256 wide); ``tail`` 0 for a power of two."""
    return runtime.feature_split(runtime.feature_width(width))


def _acc_type(dtype: torch.dtype):
    """The Triton type of the accumulator of ``dtype`` (:func:`.runtime.accumulator`)."""
    return runtime.load("jit_helpers").accumulator_type(str(runtime.accumulator(dtype)).removeprefix("torch."))


def _launch_rows(kernel, B: int, H: int, length: int, width: int, *args, **constants) -> None:
    """Launch elementwise ``kernel`` over ``length`` positions of every (batch, head) pair, one program per
    :func:`elementwise_rows` positions × ``width`` features in the attention kernels' feature blocks
    (:func:`_feature_blocks`: ``BLOCK_DV`` the width they cover, ``TAIL_DV`` the tail's, given only where there is
    one); the kernel takes ``num_tiles`` as its last positional argument."""
    main, tail = _feature_blocks(width)
    rows = elementwise_rows(main)
    tiles = runtime.cdiv(length, rows)
    runtime.launch(kernel, tiles * B * H, *args, tiles, ROWS=rows, BLOCK_DV=main + tail, num_warps=ELEMENTWISE_WARPS,
                   **({"TAIL_DV": tail} if tail else {}), **constants)


@custom_op("maskattn::tensorized_prologue", mutates_args=())
def _prologue(v: torch.Tensor, s2t: torch.Tensor, key_padding: torch.Tensor | None, seed: torch.Tensor | None,
              dropout_p: float, values: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(v ⊙ E, E, c)`` of MTSA's factorised form (docs/design.md §1) for v, s2t ``(B, H, m, d_v)`` (any strides):
    ``c`` ``(B, H, d_v)`` the maximum of S over the keys that are not padding, per feature (0 where it is not
    finite), in the accumulator type of ``values``; ``E = exp(S − c)`` (exactly 0 at padding keys) and ``v ⊙ E``
    (Appendix A.3's (key, feature) dropout factor applied, ``dropout_p`` its drop probability, drawn under
    ``seed[1]``), contiguous ``(B, H, m, d_p)`` in ``values`` with the features padded with zeros to ``d_p =``
    :func:`.runtime.feature_width` ``(d_v)`` (a multiple of 16; a width that is not a power of two as the kernels' main
    + tail blocks: 160 for 150). Two launches: the maximum (reads S), the prologue (reads S and v,
    writes both)."""
    jit = runtime.load("tensorized_elementwise_jit")
    B, H, m, d_v = v.shape
    width = runtime.feature_width(d_v)
    ve, e = (v.new_empty(B, H, m, width, dtype=values) for _ in range(2))
    c = v.new_empty(B, H, d_v, dtype=runtime.accumulator(values))
    kpm = runtime.placeholder(key_padding, v)
    common = dict(HAS_KPM=key_padding is not None, ACC=_acc_type(values))
    block = min(_feature_block(d_v), SOURCE_MAX_FEATURES)
    tiles = runtime.cdiv(d_v, block)
    runtime.launch(jit.tensorized_source_max, tiles * B * H, s2t, kpm, c, *s2t.stride(), H, m, d_v, tiles,
                   ROWS=elementwise_rows(block), BLOCK_D=block, num_warps=ELEMENTWISE_WARPS, **common)
    _launch_rows(jit.tensorized_prologue, B, H, m, width, v, s2t, kpm, c, runtime.placeholder(seed, v, torch.int64),
                 ve, e, *runtime.stride_args(v, s2t), H, m, d_v, width, dropout_p, DROPOUT=dropout_p > 0, **common)
    return ve, e, c


@_prologue.register_fake
def _(v, s2t, key_padding, seed, dropout_p, values):
    B, H, m, d_v = v.shape
    width = runtime.feature_width(d_v)
    return (v.new_empty(B, H, m, width, dtype=values), v.new_empty(B, H, m, width, dtype=values),
            v.new_empty(B, H, d_v, dtype=runtime.accumulator(values)))


@custom_op("maskattn::tensorized_prologue_backward", mutates_args=())
def _prologue_backward(grad_ve: torch.Tensor, grad_e: torch.Tensor, v: torch.Tensor, s2t: torch.Tensor,
                       key_padding: torch.Tensor | None, seed: torch.Tensor | None, c: torch.Tensor,
                       dropout_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dv, dS)`` from the gradients of :func:`_prologue`'s ``v ⊙ E`` and ``E`` (``(B, H, m, d_p)``, any strides):
    one launch that recomputes ``E`` (and redraws the dropout) from v, S and ``c``; each gradient in its input's
    dtype and layout."""
    jit = runtime.load("tensorized_elementwise_jit")
    B, H, m, d_v = v.shape
    grad_v, grad_s = torch.empty_like(v), torch.empty_like(s2t)
    _launch_rows(jit.tensorized_prologue_bwd, B, H, m, d_v, grad_ve, grad_e, v, s2t, runtime.placeholder(key_padding, v),
                 c, runtime.placeholder(seed, v, torch.int64), grad_v, grad_s,
                 *runtime.stride_args(grad_ve, grad_e, v, s2t, grad_v, grad_s), H, m, d_v, dropout_p,
                 HAS_KPM=key_padding is not None, DROPOUT=dropout_p > 0, ACC=_acc_type(c.dtype))
    return grad_v, grad_s


@_prologue_backward.register_fake
def _(grad_ve, grad_e, v, s2t, key_padding, seed, c, dropout_p):
    return torch.empty_like(v), torch.empty_like(s2t)


def _prologue_setup_context(ctx, inputs, output):
    v, s2t, key_padding, seed, dropout_p, _ = inputs
    ctx.save_for_backward(v, s2t, key_padding, seed, output[2])
    ctx.dropout_p = dropout_p


def _prologue_backward_formula(ctx, grad_ve, grad_e, _grad_c):
    v, s2t, key_padding, seed, c = ctx.saved_tensors
    return (*_prologue_backward(grad_ve, grad_e, v, s2t, key_padding, seed, c, ctx.dropout_p), None, None, None, None)


register_autograd("maskattn::tensorized_prologue", _prologue_backward_formula, setup_context=_prologue_setup_context)


def _reliable(den: torch.Tensor, value_dim: int) -> torch.Tensor:
    """``(B, H, n, value_dim)`` bool: False where the denominator (``den``, contiguous ``(B, H, n, d_p)``)
    underflowed and the output is 0 — one elementwise launch behind the attention kernel."""
    B, H, n, width = den.shape
    reliable = den.new_empty(B, H, n, value_dim, dtype=torch.bool)
    _launch_rows(runtime.load("tensorized_elementwise_jit").tensorized_reliable, B, H, n, value_dim, den, reliable, n,
                 value_dim, width, _threshold(den.dtype))
    return reliable


def output_gradients(grad_out: torch.Tensor, out: torch.Tensor, den: torch.Tensor, value_dtype: torch.dtype
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward pre-pass (FlashAttention-2's Δ, per feature): ``dN = dO / D`` and ``dD = −dN ⊙ out`` (0 where
    ``D`` underflowed; a NaN ``D`` propagates, as on the reference) from ``grad_out``, ``out`` ``(B, H, n, d_v)``
    (any strides) and ``den`` contiguous ``(B, H, n, d_p)``: contiguous ``(B, H, n, d_p)`` in ``value_dtype``
    (features past ``d_v`` zero), read once per tile by both passes — one elementwise launch."""
    B, H, n, width = den.shape
    d_num, d_den = (den.new_empty(B, H, n, width, dtype=value_dtype) for _ in range(2))
    _launch_rows(runtime.load("tensorized_elementwise_jit").tensorized_output_grads, B, H, n, width, grad_out, out, den,
                 d_num, d_den, *runtime.stride_args(grad_out, out), H, n, out.shape[-1], width, _threshold(den.dtype),
                 ACC=_acc_type(den.dtype))
    return d_num, d_den


# --------------------------------------------------------------------------------------------------
# the attention passes (tensorized_jit)
# --------------------------------------------------------------------------------------------------

def _constants(kernel: str, suffix: str, q: torch.Tensor, ve: torch.Tensor, kpm, identity: bool,
               dropout_p: float) -> dict:
    """The launch constants of pass ``kernel`` for a head group of :func:`head_groups` (``suffix``)."""
    width = max(q.shape[-1], ve.shape[-1])
    tiles = runtime.tiles(kernel + suffix, width, q.device, q.dtype)
    constants = runtime.launch_constants(q, ve)
    if runtime.splits_features(kernel + suffix, width, q.device, q.dtype):  # 160 as 128 + 32, not 256
        constants.update(runtime.feature_constants(q.shape[-1], ve.shape[-1]))
    return dict(constants, HAS_KPM=kpm is not None, IDENTITY=identity, DROPOUT=dropout_p > 0,
                BAND_START=suffix == "_narrow", BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, num_warps=tiles.warps,
                num_stages=tiles.stages, **({"QUERY_ROWS": True} if tiles.query_rows else {}))


def _scales(scale: float) -> tuple[float, float]:
    """``(scale, scale·log₂e)``: the score scale (``1/√d_k`` of the unpadded head: :func:`tensorized_triton` pads
    the features) and the same in log₂ units (the kernels' exponentials are base 2)."""
    return scale, scale * LOG2E


@custom_op("maskattn::tensorized_triton", mutates_args=())
def _forward(q: torch.Tensor, k: torch.Tensor, ve: torch.Tensor, e: torch.Tensor, key_padding: torch.Tensor | None,
             bands: list[int], seed: torch.Tensor | None, identity: bool, dropout_p: float, scale: float,
             value_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out, reliable, D, row_max)``: out ``(B, H, n, value_dim)`` in q's dtype — the first ``value_dim`` features
    of a ``(B, n, H, d_p)`` buffer (``d_p`` = ve's padded width; merging the heads of an unpadded one is a view) —,
    ``reliable`` (:func:`_reliable`), the float32 (float64) denominators ``(B, H, n, d_p)`` and with the identity
    scale the row maxima (log₂ units)."""
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
    return runtime.unpad_features(out, value_dim), _reliable(den, value_dim), den, row_max


@_forward.register_fake
def _(q, k, ve, e, key_padding, bands, seed, identity, dropout_p, scale, value_dim):
    B, H, n, _ = q.shape
    acc = runtime.accumulator(q.dtype)
    out = q.new_empty(B, n, H, ve.shape[-1]).transpose(1, 2)
    return (runtime.unpad_features(out, value_dim), q.new_empty(B, H, n, value_dim, dtype=torch.bool),
            q.new_empty(B, H, n, ve.shape[-1], dtype=acc), q.new_empty((B, H, n) if identity else (0,), dtype=acc))


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
    q, k, ve, e, key_padding, bands, seed, identity, dropout_p, scale, _ = inputs
    out, _, den, row_max = output
    ctx.save_for_backward(q, k, ve, e, key_padding, seed, out, den, row_max)
    ctx.arguments = (bands, identity, dropout_p, scale)
    ctx.set_materialize_grads(False)  # reliable, D and the row maxima have none: no zeros are written for them


def _backward_formula(ctx, grad_out, _grad_reliable, _grad_den, _grad_row_max):
    if grad_out is None:  # the output's gradient is undefined (zero): so are the inputs'
        return (None,) * 11
    q, k, ve, e, key_padding, seed, out, den, row_max = ctx.saved_tensors
    bands, identity, dropout_p, scale = ctx.arguments
    grads = _backward(grad_out, q, k, ve, e, key_padding, bands, seed, out, den, row_max, identity, dropout_p, scale)
    return (*grads, None, None, None, None, None, None, None)


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
        # each numerator factor of Appendix A.3 keeps √(1 − p): the weights' (in the attention kernels, under
        # seed[0]) and v ⊙ E's (in the prologue, under seed[1])
        drop = 1.0 - math.sqrt(1.0 - dropout_p) if dropout_p > 0 else 0.0
        seed = torch.randint(0, 2**62, (2,), dtype=torch.int64, device=q.device) if drop > 0 else None
        kpm = None if key_padding_mask is None else key_padding_mask.to(torch.uint8).contiguous()
        # E's range: bfloat16 for half precision (docs/design.md §3); the prologue pads the features to the
        # kernels' width (runtime.feature_width: a multiple of 16, main + tail for a split width — 160 for 150), as
        # q and k are here (zeros change no score and give zero columns, sliced off)
        ve, e, _ = _prologue(v.to(runtime.kernel_dtype(v.dtype)), s2t.to(runtime.kernel_dtype(s2t.dtype)), kpm, seed,
                             drop, runtime.value_dtype(q.dtype))
        d_k = q.shape[-1]
        q, k = (runtime.pad_features(t, runtime.feature_width(d_k)) for t in (q, k))
        out, reliable, _, _ = _forward(q, k, ve, e, kpm, head_offsets(bands), seed, scale == "identity", drop,
                                       1.0 / math.sqrt(d_k), v.shape[-1])
    return out.to(out_dtype), reliable
