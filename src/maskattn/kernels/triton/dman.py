"""DMAN attention — MAN Eq. 4 with the dynamic mask of Eq. 12 (docs/design.md §1) — as Triton kernels: the
``triton`` backend of the ``dman`` family.

FlashAttention-2 with the gate in the scores: ``score = q·k / √d_k + log M``, ``log M = logσ(a_t + P[clip(t − s)]
+ U_h)`` (``log max(M, ε)`` with a ``mask_floor``), an online softmax per query tile in float32 (float64 for
float64 inputs) that keeps the output and one log-sum-exp per row for backward (docs/design.md §3). The mask is
used in log form, so rows whose ``σ(z)`` underflows stay exact; scores, ``log M`` and the log-sum-exp are in log₂
units inside (``exp2``). Key tiles wholly beyond the clip distance (every
``t − s >= D`` or every ``t − s <= −D``) use one gate value per row; causal key tiles in the future are skipped.

Backward is two passes without atomics (keys: dK, dV; queries: dQ), deterministic: the query pass also returns
``dz = dS ⊙ (1 − σ(z))`` (0 where the floor holds) reduced per row (→ the gradients of ``a`` and ``U``) and, per
query tile, the diagonal sums of each near tile (per square of its queries) and one sum per far side (→ the
gradient of ``P``); PyTorch
finishes those sums with plain reductions (:func:`_distance_gradient`). Attention dropout is FlashAttention-2's:
the keep-mask is drawn in the kernel from a seed and redrawn by backward.

The kernels are the ``torch.library`` operators ``maskattn::dman_triton`` (and its backward), so
``torch.compile(fullgraph=True)`` takes them as one node each, for any sequence length.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.library import custom_op, register_autograd

from ...errors import ArgumentError
from . import runtime

LOG2E = 1.4426950408889634  # log₂ e: the kernels' exponentials are base 2

__all__ = ["dman_triton", "unsupported", "square_offsets", "KERNELS"]

#: the kernel passes of one DMAN call (:data:`.runtime.TILE_TABLE`)
KERNELS = ("dman_fwd", "dman_bwd_kv", "dman_bwd_q")


def unsupported(*, device: str, dtype: torch.dtype, head_dims: dict[str, int], row_floor: bool = False) -> list[str]:
    """Why the Triton kernels cannot run a DMAN call (an empty list when they can); ``row_floor``: the call floors
    ``M`` relative to its row maximum (``mask_floor_mode="row_max"``), which the kernel's one scalar floor cannot."""
    reasons = runtime.call_reasons(device, dtype, head_dims, KERNELS)
    if row_floor:
        reasons.append("cannot apply a row-normalised mask floor (mask_floor_mode='row_max'): the kernel takes one "
                       "fixed floor")
    return reasons


def square_offsets(max_distance: int, q_offset: int, block_m: int, block_n: int) -> tuple[int, int]:
    """``(r_lo, r_hi)``: the bounds of the offsets ``r = query square − key tile`` (in units of ``block_n``) of the
    squares of ``block_n`` queries × ``block_n`` keys inside the query pass's *near* tiles (``block_m`` queries ×
    ``block_n`` keys, ``block_m`` a multiple of ``block_n``; near: some distance ``t − s`` strictly inside
    ``(−D, D)``, as ``dman_jit._near_keys`` decides). A square at offset ``r`` covers the distances
    ``r·block_n + q_offset − (block_n − 1) … r·block_n + q_offset + (block_n − 1)``; with ``block_m > block_n`` a
    near tile may hold squares whose distances all lie at or beyond ``±D`` (their diagonal sums go to ``P``'s edge
    entries)."""
    squares = block_m // block_n
    r_hi = squares - 1 + (block_n - 2 + max_distance - q_offset) // block_n
    r_lo = -((q_offset + block_m + max_distance - 2) // block_n)
    return r_lo, r_hi


def _constants(kernel: str, q: torch.Tensor, v: torch.Tensor, kpm, causal: bool, dropout_p: float,
               mask_floor) -> dict:
    """The launch constants of pass ``kernel``: its tiles (:func:`.runtime.tiles`) and, where the pass tiles the
    feature axis at this width (:func:`.runtime.splits_features`: 160 as 128 + 32, not 256), its feature blocks."""
    width = max(q.shape[-1], v.shape[-1])
    tiles = runtime.tiles(kernel, width, q.device, q.dtype)
    # the query pass's diagonal sums of dz are taken per square of BLOCK_N queries: BLOCK_M a multiple of BLOCK_N
    assert kernel != "dman_bwd_q" or tiles.block_m % tiles.block_n == 0, tiles
    constants = runtime.launch_constants(q, v)
    if runtime.splits_features(kernel, width, q.device, q.dtype):
        constants.update(runtime.feature_constants(q.shape[-1], v.shape[-1]))
    return dict(constants, CAUSAL=bool(causal), HAS_KPM=kpm is not None, HAS_FLOOR=mask_floor is not None,
                DROPOUT=dropout_p > 0, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, num_warps=tiles.warps,
                num_stages=tiles.stages)


def _sizes(q, k, v, table, q_offset: int, tiles: int):
    """The kernels' size arguments after the strides: ``H, N, M, D_K, D_V, num_tiles, D, q_offset`` (``num_tiles``
    programs per (batch, head) pair: ``tiles`` of the sequence the pass holds)."""
    D = (table.numel() - 1) // 2
    return [q.shape[1], q.shape[2], k.shape[2], q.shape[-1], v.shape[-1], tiles, D, q_offset]


def _floor(mask_floor) -> float:
    return 0.0 if mask_floor is None else math.log(mask_floor)


def _parameter_strides(a, table, u) -> list[int]:
    return [*a.stride(), table.stride(0), u.stride(0)]


@custom_op("maskattn::dman_triton", mutates_args=())
def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, table: torch.Tensor,
             u: torch.Tensor, key_padding: torch.Tensor | None, seed: torch.Tensor | None, causal: bool,
             q_offset: int, dropout_p: float, mask_floor: float | None,
             scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)``: out ``(B, H, n, d_v)`` in q's dtype, laid out as ``(B, n, H, d_v)`` (merging the heads is a
    view), and the float32 (float64) log₂-sum-exp₂ of each row ``(B, H, n)`` (0 for a row with no allowed key);
    ``scale`` multiplies ``q·k`` (``1/√d_k`` of the unpadded head: :func:`dman_triton` pads the features)."""
    B, H, n, d_k = q.shape
    d_v = v.shape[-1]
    out = q.new_empty(B, n, H, d_v).transpose(1, 2)
    lse = q.new_empty(B, H, n, dtype=runtime.accumulator(q.dtype))
    if out.numel() == 0:
        return out, lse
    constants = _constants("dman_fwd", q, v, key_padding, causal, dropout_p, mask_floor)
    sizes = _sizes(q, k, v, table, q_offset, runtime.cdiv(n, constants["BLOCK_M"]))
    runtime.launch(
        runtime.load("dman_jit").dman_fwd, sizes[5] * B * H, q, k, v, a, table, u,
        runtime.placeholder(key_padding, q), runtime.placeholder(seed, q, torch.int64), out, lse,
        *runtime.stride_args(q, k, v, out), *_parameter_strides(a, table, u), *sizes, scale * LOG2E, dropout_p,
        _floor(mask_floor), **constants)
    return out, lse


@_forward.register_fake
def _(q, k, v, a, table, u, key_padding, seed, causal, q_offset, dropout_p, mask_floor, scale):
    B, H, n, _ = q.shape
    return (q.new_empty(B, n, H, v.shape[-1]).transpose(1, 2),
            q.new_empty(B, H, n, dtype=runtime.accumulator(q.dtype)))


def _distance_gradient(near: torch.Tensor, far: torch.Tensor, r_min: int, q_offset: int, D: int,
                       block: int) -> torch.Tensor:
    """The gradient of ``P`` ``(2D + 1,)`` from the query pass's buffers, with plain (deterministic) sums.

    ``near`` ``(B·H, query squares, slots, 2·block)``: slot ``σ`` holds the diagonal sums of the square of
    ``block`` queries × ``block`` keys at offset ``r = r_min + σ`` (query square − key tile), column ``c`` the
    distance ``base_r + c`` with ``base_r = r·block + q_offset − (block − 1)`` (column ``2·block − 1`` is padding,
    always 0). Consecutive slots overlap by ``block − 1``
    distances, so the first half of slot ``σ`` and the second half of slot ``σ − 1`` add up into one dense run
    of distances ``base_{r_min} + x``. ``far`` ``(B·H, query tiles, 2)``: the far-left (``t − s >= D``) and
    far-right (``t − s <= −D``) sums. Distances past ``±D`` go to the edge entries."""
    near = near.sum((0, 1))  # (slots, 2·block)
    far = far.sum((0, 1))  # (2,)
    dense = (F.pad(near[:, :block], (0, 0, 0, 1)) + F.pad(near[:, block:], (0, 0, 1, 0))).reshape(-1)
    base = r_min * block + q_offset - (block - 1)
    length = dense.numel()
    low = min(max(-D - base + 1, 0), length)  # x < low: t − s <= −D
    high = min(max(D - base, 0), length)  # x >= high: t − s >= D
    grad = near.new_zeros(2 * D + 1)
    grad[base + low + D:base + high + D] = dense[low:high]
    grad[0] += dense[:low].sum() + far[1]
    grad[2 * D] += dense[high:].sum() + far[0]
    return grad


def _far_offsets(a: torch.Tensor, table: torch.Tensor, u: torch.Tensor, lse: torch.Tensor,
                 mask_floor: float | None) -> torch.Tensor:
    """``(B, H, 2, n)``, contiguous: each query's ``log₂ M − lse`` where every distance is ``>= D`` (far left,
    ``P[2D]``) and ``<= −D`` (far right, ``P[0]``) — ``M = σ(a_t + U_h + P[edge])`` floored at ``ε`` — which the key
    pass's far tiles add to their scores (one value per query, read: computed in the kernel it cost two
    transcendentals and ~15 instructions per query and thread in every tile; docs/design.md §3)."""
    z = a[:, None, None, :] + u[None, :, None, None] + torch.stack((table[-1], table[0]))[None, None, :, None]
    log_m = F.logsigmoid(z)
    if mask_floor is not None:
        log_m = log_m.clamp_min(math.log(mask_floor))
    return (log_m * LOG2E - lse[:, :, None, :]).contiguous()


@custom_op("maskattn::dman_triton_backward", mutates_args=())
def _backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor,
              table: torch.Tensor, u: torch.Tensor, key_padding: torch.Tensor | None, seed: torch.Tensor | None,
              out: torch.Tensor, lse: torch.Tensor, causal: bool, q_offset: int, dropout_p: float,
              mask_floor: float | None, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                 torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv, da, dP, dU)``, contiguous, in the inputs' dtypes."""
    B, H, n, d_k = q.shape
    m, d_v = k.shape[2], v.shape[-1]
    acc = lse.dtype
    if q.numel() == 0 or k.numel() == 0:
        return (q.new_zeros(B, H, n, d_k), k.new_zeros(B, H, m, d_k), v.new_zeros(B, H, m, d_v), torch.zeros_like(a),
                torch.zeros_like(table), torch.zeros_like(u))
    grad_q, grad_k, grad_v = q.new_empty(B, H, n, d_k), k.new_empty(B, H, m, d_k), v.new_empty(B, H, m, d_v)
    jit = runtime.load("dman_jit")
    grad_out = grad_out.to(out.dtype)
    delta = (grad_out.to(acc) * out.to(acc)).sum(-1)  # Δ_i = dO_i · out_i, (B, H, n)
    far = _far_offsets(a, table, u, lse, mask_floor)
    keys = _constants("dman_bwd_kv", q, v, key_padding, causal, dropout_p, mask_floor)
    queries = _constants("dman_bwd_q", q, v, key_padding, causal, dropout_p, mask_floor)
    tail = (scale, scale * LOG2E, dropout_p, _floor(mask_floor))
    common = (q, k, v, a, table, u, runtime.placeholder(key_padding, q), runtime.placeholder(seed, q, torch.int64),
              lse, delta, grad_out)
    strides = (*runtime.stride_args(q, k, v, grad_out), *_parameter_strides(a, table, u))
    key_sizes = _sizes(q, k, v, table, q_offset, runtime.cdiv(m, keys["BLOCK_N"]))
    runtime.launch(jit.dman_bwd_kv, key_sizes[5] * B * H, *common, far, grad_k, grad_v, *strides, *key_sizes, *tail,
                   **keys)
    block_m, block_n = queries["BLOCK_M"], queries["BLOCK_N"]
    sizes = _sizes(q, k, v, table, q_offset, runtime.cdiv(n, block_m))
    D, query_tiles = sizes[6], sizes[5]
    squares = query_tiles * (block_m // block_n)  # squares of block_n queries (the diagonal sums' rows)
    r_lo, r_hi = square_offsets(D, q_offset, block_m, block_n)
    r_min, r_max = max(r_lo, 1 - runtime.cdiv(m, block_n)), min(r_hi, squares - 1)
    slots = max(1, r_max - r_min + 1)
    row_grad = q.new_empty(B * H, n, dtype=acc)
    near = q.new_empty(B * H, squares, slots, 2 * block_n, dtype=acc)  # every slot written by the kernel
    far = q.new_empty(B * H, query_tiles, 2, dtype=acc)
    runtime.launch(jit.dman_bwd_q, query_tiles * B * H, *common, grad_q, row_grad, near, far, *strides, *sizes,
                   r_min, slots, *tail, **queries)
    row_grad = row_grad.view(B, H, n)
    return (grad_q, grad_k, grad_v, row_grad.sum(1).to(a.dtype),
            _distance_gradient(near, far, r_min, q_offset, D, block_n).to(table.dtype),
            row_grad.sum((0, 2)).to(u.dtype))


@_backward.register_fake
def _(grad_out, q, k, v, a, table, u, key_padding, seed, out, lse, causal, q_offset, dropout_p, mask_floor, scale):
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), a.new_empty(a.shape),
            table.new_empty(table.shape), u.new_empty(u.shape))


def _setup_context(ctx, inputs, output):
    q, k, v, a, table, u, key_padding, seed, causal, q_offset, dropout_p, mask_floor, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, a, table, u, key_padding, seed, out, lse)
    ctx.arguments = (causal, q_offset, dropout_p, mask_floor, scale)


def _backward_formula(ctx, grad_out, _grad_lse):
    q, k, v, a, table, u, key_padding, seed, out, lse = ctx.saved_tensors
    causal, q_offset, dropout_p, mask_floor, scale = ctx.arguments
    grads = _backward(grad_out, q, k, v, a, table, u, key_padding, seed, out, lse, causal, q_offset, dropout_p,
                      mask_floor, scale)
    return (*grads, None, None, None, None, None, None, None)


register_autograd("maskattn::dman_triton", _backward_formula, setup_context=_setup_context)


def dman_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, query_logit: torch.Tensor,
                distance_bias: torch.Tensor, head_bias: torch.Tensor, *, causal: bool,
                key_padding_mask: torch.Tensor | None, q_offset: int, dropout_p: float,
                mask_floor: float | None) -> torch.Tensor:
    """DMAN attention of q ``(B, H, n, d_k)``, k ``(B, H, m, d_k)``, v ``(B, H, m, d_v)`` with the mask
    ``M = σ(a_t + P[clip(t − s, −D, D) + D] + U_h)`` (MAN Eq. 12): ``query_logit`` a ``(B, n)``, ``distance_bias``
    P ``(2D + 1,)``, ``head_bias`` U ``(H,)``; queries at absolute positions ``q_offset …``, keys at ``0 … m − 1``;
    ``causal`` hides later keys; ``key_padding_mask`` ``(B, m)`` True = padding, or None; ``dropout_p`` attention
    dropout (0 = none); ``mask_floor`` ``ε``: ``log max(M, ε)`` (no gradient where ``M < ε``), or None.

    Computes in float32 (float64 for float64 inputs) with autocast off, whatever the dtype of a, P, U (float32
    parameters in a half-precision model); returns ``(B, H, n, d_v)`` in q's dtype, differentiable with respect to
    q, k, v, a, P and U (each gradient in its input's dtype). Rows with no allowed key are 0, with zero gradients.

    ``D >= 1`` (P of 3 entries or more, as :func:`maskattn.functional.dman.dynamic_mask_attention` requires): the
    kernels' far tiles — every distance ``>= D`` or every one ``<= −D`` — skip the causal mask, which is right only
    for ``D >= 1`` (with ``D = 0`` and a query offset, later keys reached a row; docs/design.md §3). Any other
    table is refused with an :class:`~maskattn.errors.ArgumentError`."""
    entries = distance_bias.shape[0] if distance_bias.dim() == 1 else -1
    if entries < 3 or entries % 2 == 0:
        raise ArgumentError(f"distance_bias must be a 1-D table of 2·max_distance + 1 entries with max_distance >= 1 "
                            f"(odd, >= 3: the Triton kernels' far tiles assume D >= 1), got shape "
                            f"{tuple(distance_bias.shape)}")
    out_dtype = q.dtype
    with torch.autocast(q.device.type, enabled=False):
        work = runtime.kernel_dtype(q.dtype)
        acc = runtime.accumulator(work)
        d_k, d_v = q.shape[-1], v.shape[-1]
        # features padded to the kernels' width (runtime.feature_width: a multiple of 16, main + tail for a split
        # width — 160 for 150; zeros change no score, the output's padding is sliced off)
        q, k = (runtime.pad_features(t.to(work), runtime.feature_width(d_k)) for t in (q, k))
        v = runtime.pad_features(v.to(work), runtime.feature_width(d_v))
        # the parameters are tiny: their casts (and the casts of their gradients back) cost nothing
        a, table, u = query_logit.to(acc), distance_bias.to(acc), head_bias.to(acc)
        seed = torch.randint(0, 2**62, (1,), dtype=torch.int64, device=q.device) if dropout_p > 0 else None
        kpm = None if key_padding_mask is None else key_padding_mask.to(torch.uint8).contiguous()
        # q_offset goes in as it is: under torch.compile(dynamic=True) an int() would specialise the graph on it
        out, _ = _forward(q, k, v, a, table, u, kpm, seed, bool(causal), q_offset, float(dropout_p),
                          None if mask_floor is None else float(mask_floor), 1.0 / math.sqrt(d_k))
    return runtime.unpad_features(out, d_v).to(out_dtype)
