"""Banded softmax attention over a head area as Triton kernels: the ``triton`` backend of the ``local`` family
(CSAN 1D, CSAN Eq. 4–6; CSAN 2D, Eq. 7–9; SMAN with a fixed radius, MAN Eq. 11; MTSA's window heads with the
log-sigmoid score_mod).

Query ``i`` of head ``h`` attends to keys ``i − left … i + right`` of every head of its area (docs/design.md §1:
the keys of heads ``h − N/2 … h + N/2`` side by side, one softmax over all of them, CSAN Eq. 9), skipping
padding keys and area slots that fall off a truncated head axis. A query tile visits only the key tiles its
band reaches, in each slot of its area, with FlashAttention-2's online softmax in float32 (float64 for float64
inputs), and keeps one log-sum-exp per row for backward. Backward is two passes without atomics, so it is
bit-identical from run to run: queries (dQ, and ``Δ = rowsum(dO ⊙ O)``), then keys, where the program of a key
tile of head ``g`` loops over the (query head, slot) pairs whose slot holds head ``g`` — the inverse of the
area map, a small table built on the host once per (H, area, head_edges) and cached per device — and over the
query tiles whose band reaches the key tile.

Attention dropout is FlashAttention-2's: inverted, drawn in the kernel with Philox at the position of each
score in the gathered-keys form (key axis ``A·n`` long), redrawn by backward from the same seed (an int64
device tensor drawn from PyTorch's generator, so ``torch.manual_seed`` repeats a run). Rows with no allowed
key give 0 with zero, finite gradients.

The kernels are the ``torch.library`` operators ``maskattn::band_triton`` (and its backward), so
``torch.compile(fullgraph=True)`` takes them as one node each, for any sequence length.

Tiles (:func:`band_tiles`): under the interpreter 16 × 16 (test lengths cross tile edges). On CUDA a narrow band
(at most :data:`NARROW_BAND` positions) takes the ``band_*_narrow`` entries of :data:`.runtime.TILE_TABLE`: 16-row
query tiles against the keys they reach (a window-11 band of 16 queries spans 26 keys), so 34 % of the computed
scores lie inside the band — the most a tensor-core tile of at least 16 rows allows, ``w / roundup(15 + w, 16)``
(docs/gpu/offline-perf.md; 11 % with the earlier 64-row tiles). Tiles start where a band starts, not on a tile
boundary, so no visited tile is empty. These choices are derived from the compiled code, not yet timed on a GPU.
Heads of 145–160 features (d 150) are laid out 160 wide and run as 128 + 32 feature blocks with the table's entries
at that width (:func:`.runtime.feature_width`, :func:`.runtime.splits_features`; ``band_jit``), not as 256.
"""

from __future__ import annotations

import torch
from torch.library import custom_op, register_autograd

from . import runtime

__all__ = ["band_triton", "unsupported", "area_table", "owner_table", "band_tiles", "KERNELS"]

#: the kernel passes of one band call (:data:`.runtime.TILE_TABLE`; the narrow variants share the kernels)
KERNELS = ("band_fwd", "band_bwd_q", "band_bwd_kv", "band_fwd_narrow", "band_bwd_q_narrow", "band_bwd_kv_narrow")



def unsupported(*, device: str, dtype: torch.dtype, head_dims: dict[str, int], score_mod: str | None) -> list[str]:
    """Why the Triton band kernels cannot run a call (an empty list when they can); ``score_mod`` is None,
    ``"logsigmoid"`` (``F.logsigmoid``) or the name of another modifier."""
    reasons = runtime.call_reasons(device, dtype, head_dims, KERNELS)
    if score_mod not in (None, "logsigmoid"):
        reasons.append("has no kernel for a score_mod other than None or F.logsigmoid")
    return reasons


def area_table(num_heads: int, head_window: int, head_edges: str) -> list[int]:
    """The forward table of the head area, flattened ``(H, 1 + 2A)``: row ``h`` is
    ``[count, a₀, g₀, a₁, g₁, …]`` (zero-padded), the existing slots ``a`` of head ``h``'s area and the heads
    ``g`` they hold — the entries of :func:`maskattn.functional.local.head_area` with ``valid`` True, computed
    from the sizes alone (plain ints: no device tensor is read, so no host synchronisation and nothing for
    ``torch.compile`` to trace)."""
    H, A = int(num_heads), int(head_window)
    half = A // 2
    table = []
    for h in range(H):
        row = []
        for a in range(A):
            g = h + a - half
            if head_edges == "circular":
                g %= H
            elif not 0 <= g < H:
                continue
            row += [a, g]
        table += [len(row) // 2] + row + [0] * (2 * A - len(row))
    return table


def owner_table(area: list[int], num_heads: int) -> list[int]:
    """The inverse of :func:`area_table`, flattened ``(H, 1 + 2P)``: row ``g`` is
    ``[count, h₀, a₀, h₁, a₁, …]``, every (query head ``h``, slot ``a``) whose slot holds head ``g``'s keys
    (once per slot: a head that fills several slots of one area is listed for each); ``P`` the longest row."""
    H = int(num_heads)
    width = len(area) // H
    pairs: list[list[int]] = [[] for _ in range(H)]
    for h in range(H):
        row = area[h * width:(h + 1) * width]
        for e in range(row[0]):
            a, g = row[1 + 2 * e], row[2 + 2 * e]
            pairs[g] += [h, a]
    longest = max(len(p) for p in pairs)
    table = []
    for p in pairs:
        table += [len(p) // 2] + p + [0] * (longest - len(p))
    return table


#: bands of at most this many positions take the ``*_narrow`` tiles of :data:`.runtime.TILE_TABLE` (32-wide inner
#: tiles: fewer wasted scores where one query tile's band is 64 + 32 keys)
NARROW_BAND = 33


def band_passes(left: int, right: int) -> tuple[str, str, str]:
    """The :data:`.runtime.TILE_TABLE` names of the forward, the query and the key pass for a band
    ``i − left … i + right``: ``band_*``, or ``band_*_narrow`` for a band of at most :data:`NARROW_BAND`
    positions."""
    suffix = "_narrow" if left + right + 1 <= NARROW_BAND else ""
    return ("band_fwd" + suffix, "band_bwd_q" + suffix, "band_bwd_kv" + suffix)


def band_tiles(head_dim: int, left: int, right: int, device, dtype: torch.dtype = torch.float16
               ) -> tuple[runtime.Tiles, runtime.Tiles, runtime.Tiles]:
    """The tiles of the forward, the query (dQ) and the key (dK/dV) pass for a band ``i − left … i + right``: the
    ``band_*`` entries of :data:`.runtime.TILE_TABLE`, ``band_*_narrow`` for a band of at most
    :data:`NARROW_BAND` positions — sized to the band: 16 queries × 32 keys (key pass: 16 keys × 32 queries),
    so a band of ``w <= 17`` positions is one tile of ``w / 32`` useful scores per row (CSAN's window 11: 34 %,
    the most a tensor-core tile of at least 16 rows can hold; docs/gpu/offline-perf.md); under the interpreter
    :func:`.runtime.tiles`' 16 × 16 (:func:`band_passes`)."""
    return tuple(runtime.tiles(kernel, head_dim, device, dtype)  # type: ignore[return-value]
                 for kernel in band_passes(left, right))


def _constants(kernel: str, q: torch.Tensor, v: torch.Tensor, kpm, logsigmoid: bool, dropout_p: float,
               tiles: runtime.Tiles) -> dict:
    """The launch constants of pass ``kernel`` (its :data:`.runtime.TILE_TABLE` name, ``_narrow`` included) with
    ``tiles``: the feature axis as a main and a tail block where the pass splits it on this device
    (:func:`.runtime.splits_features`: 160 as 128 + 32, not 256), else one block as :func:`.runtime.launch_constants`
    says."""
    constants = runtime.launch_constants(q, v)
    if runtime.splits_features(kernel, max(q.shape[-1], v.shape[-1]), q.device, q.dtype):
        constants.update(runtime.feature_constants(q.shape[-1], v.shape[-1]))
    return dict(constants, HAS_KPM=kpm is not None, LOGSIG=logsigmoid, DROPOUT=dropout_p > 0,
                BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, num_warps=tiles.warps, num_stages=tiles.stages)


def _launch_sizes(q, area, left, right):
    """``B, H, n, A, left, right``: the area width ``A`` and the band clamped to the sequence (a band wider than the
    sequence covers it: clamping keeps every position sum far inside int32)."""
    B, H, n, _ = q.shape
    A = (len(area) // H - 1) // 2
    return B, H, n, A, min(left, n), min(right, n)


@custom_op("maskattn::band_triton", mutates_args=())
def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding: torch.Tensor | None, area: list[int],
             seed: torch.Tensor | None, left: int, right: int, scale: float, logsigmoid: bool,
             dropout_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)``: out ``(B, H, n, d_v)`` in q's dtype, laid out as ``(B, n, H, d_v)`` (merging the heads is a
    view), and the float32 (float64) log₂-sum-exp₂ per row, contiguous ``(B, H, n)`` (``+inf``: no allowed key)."""
    B, H, n, A, left, right = _launch_sizes(q, area, left, right)
    d_v = v.shape[-1]
    out = q.new_empty(B, n, H, d_v).transpose(1, 2)
    lse = q.new_empty(B, H, n, dtype=runtime.accumulator(q.dtype))
    if out.numel() == 0:
        lse.fill_(float("inf"))
        return out, lse
    tiles, _, _ = band_tiles(max(q.shape[-1], d_v), left, right, q.device, q.dtype)
    constants = _constants(band_passes(left, right)[0], q, v, key_padding, logsigmoid, dropout_p, tiles)
    query_tiles = runtime.cdiv(n, tiles.block_m)
    runtime.launch(
        runtime.load("band_jit").band_fwd, query_tiles * B * H, q, k, v, runtime.placeholder(key_padding, q),
        runtime.device_table(area, q.device), runtime.placeholder(seed, q, torch.int64), out, lse,
        *runtime.stride_args(q, k, v, out), H, n, A, left, right, q.shape[-1], d_v, query_tiles, len(area) // H,
        scale, dropout_p, **constants)
    return out, lse


@_forward.register_fake
def _(q, k, v, key_padding, area, seed, left, right, scale, logsigmoid, dropout_p):
    B, H, n, _ = q.shape
    return q.new_empty(B, n, H, v.shape[-1]).transpose(1, 2), q.new_empty(B, H, n, dtype=runtime.accumulator(q.dtype))


@custom_op("maskattn::band_triton_backward", mutates_args=())
def _backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              key_padding: torch.Tensor | None, area: list[int], seed: torch.Tensor | None, out: torch.Tensor,
              lse: torch.Tensor, left: int, right: int, scale: float, logsigmoid: bool,
              dropout_p: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)``, contiguous, in the inputs' dtype."""
    B, H, n, A, left, right = _launch_sizes(q, area, left, right)
    d_k, d_v = q.shape[-1], v.shape[-1]
    grad_q, grad_k, grad_v = q.new_empty(B, H, n, d_k), k.new_empty(B, H, n, d_k), v.new_empty(B, H, n, d_v)
    if B * n == 0:
        return grad_q, grad_k, grad_v
    jit = runtime.load("band_jit")
    owners = owner_table(area, H)
    delta = q.new_empty(B, H, n, dtype=lse.dtype)
    _, rows, keys = band_tiles(max(d_k, d_v), left, right, q.device, q.dtype)
    _, rows_pass, keys_pass = band_passes(left, right)
    kpm, seed = runtime.placeholder(key_padding, q), runtime.placeholder(seed, q, torch.int64)
    sizes = (H, n, A, left, right, d_k, d_v)
    query_tiles = runtime.cdiv(n, rows.block_m)
    runtime.launch(
        jit.band_bwd_q, query_tiles * B * H, q, k, v, kpm, runtime.device_table(area, q.device), seed, out, grad_out,
        lse, delta, grad_q, *runtime.stride_args(q, k, v, out, grad_out), *sizes, query_tiles, len(area) // H, scale,
        dropout_p, **_constants(rows_pass, q, v, key_padding, logsigmoid, dropout_p, rows))
    key_tiles = runtime.cdiv(n, keys.block_n)
    runtime.launch(
        jit.band_bwd_kv, key_tiles * B * H, q, k, v, kpm, runtime.device_table(owners, q.device), seed, grad_out,
        lse, delta, grad_k, grad_v, *runtime.stride_args(q, k, v, grad_out), *sizes, key_tiles, len(owners) // H,
        scale, dropout_p, **_constants(keys_pass, q, v, key_padding, logsigmoid, dropout_p, keys))
    return grad_q, grad_k, grad_v


@_backward.register_fake
def _(grad_out, q, k, v, key_padding, area, seed, out, lse, left, right, scale, logsigmoid, dropout_p):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, key_padding, area, seed, left, right, scale, logsigmoid, dropout_p = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, key_padding, seed, out, lse)
    ctx.arguments = (area, left, right, scale, logsigmoid, dropout_p)


def _backward_formula(ctx, grad_out, _grad_lse):
    q, k, v, key_padding, seed, out, lse = ctx.saved_tensors
    area, left, right, scale, logsigmoid, dropout_p = ctx.arguments
    grads = _backward(grad_out.to(q.dtype), q, k, v, key_padding, area, seed, out, lse, left, right, scale,
                      logsigmoid, dropout_p)
    return (*grads, None, None, None, None, None, None, None, None)


register_autograd("maskattn::band_triton", _backward_formula, setup_context=_setup_context)


def band_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, left: int, right: int,
                index: torch.Tensor | None, valid: torch.Tensor | None, kpm: torch.Tensor | None, scale: float,
                logsigmoid: bool, dropout_p: float) -> torch.Tensor:
    """Softmax attention of q, k ``(B, H, n, d_k)``, v ``(B, H, n, d_v)`` over the band
    ``i − left <= j <= i + right`` of every head of the area (``index``, ``valid``:
    :func:`maskattn.functional.local.head_area`'s — None for CSAN 1D; ``valid`` None with an ``index`` =
    ``head_edges="circular"``; only their shapes are read, never their values), with key padding ``kpm``
    ``(B, n)`` (True = padding) or None, ``scale`` on the scores, ``logsigmoid``: the score_mod
    ``F.logsigmoid`` (MTSA window heads), and attention dropout ``dropout_p`` (0 = none). Computes in float32
    (float64 for float64 inputs) with autocast off; returns ``(B, H, n, d_v)`` in q's dtype, 0 on rows with no
    allowed key. Differentiable w.r.t. q, k, v (once)."""
    H = int(q.shape[1])
    if index is None:
        area = area_table(H, 1, "truncate")
    else:
        area = area_table(H, int(index.shape[1]), "circular" if valid is None else "truncate")
    out_dtype = q.dtype
    with torch.autocast(q.device.type, enabled=False):
        work = runtime.kernel_dtype(q.dtype)
        # features padded to the kernels' width (runtime.feature_width: a multiple of 16, main + tail for a split
        # width — 160 for 150; zeros change no score, the output's padding is sliced off)
        d_k, d_v = q.shape[-1], v.shape[-1]
        q, k = (runtime.pad_features(t.to(work), runtime.feature_width(d_k)) for t in (q, k))
        v = runtime.pad_features(v.to(work), runtime.feature_width(d_v))
        seed = torch.randint(0, 2**62, (1,), dtype=torch.int64, device=q.device) if dropout_p > 0 else None
        key_padding = None if kpm is None else kpm.to(torch.uint8).contiguous()
        out, _ = _forward(q, k, v, key_padding, area, seed, int(left), int(right), float(scale), bool(logsigmoid),
                          float(dropout_p))
    return runtime.unpad_features(out, d_v).to(out_dtype)
