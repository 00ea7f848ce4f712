"""The FlexAttention call: a ``score_mod`` and a mask (a :class:`~maskattn.masks.Mask` predicate) turned into a
block mask that skips empty blocks, so a band of width w costs O(n · w).

* Inside ``torch.compile`` (a compiled model): ``flex_attention`` and ``create_block_mask`` are traced into
  the caller's graph, which compiles them once with its own dynamic shapes.
* Eager on CUDA: ``flex_attention`` compiled once with dynamic shapes (:func:`_compiled_flex`), so new sequence
  lengths do not recompile it; block masks of static masks (no batch dependence) are cached per (mask, n, m,
  device) in a bounded LRU cache (:data:`BLOCK_MASK_CACHE_SIZE`). A mask that depends on the batch (key
  padding) is built once per ``block_mask_scope()`` — a stack's forward — and shared by its layers.
* Eager on CPU: the reference ``flex_attention``, inference only (PyTorch: "FlexAttention does not support
  backward on CPU").
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import warnings
from collections import OrderedDict

import torch

from ..masks import Mask

__all__ = ["flex_available", "flex_attention_call", "block_mask_scope", "unsupported", "BLOCK_MASK_CACHE_SIZE"]

#: static block masks kept by the eager path (least recently used dropped first)
BLOCK_MASK_CACHE_SIZE = 64
#: FlexAttention's CUDA kernel refuses smaller head dims (torch 2.11: "NYI: embedding dimension ... at least 16");
#: :func:`flex_attention_call` zero-pads q, k and v up to it
FLEX_MIN_HEAD_DIM = 16
#: compiled entries allowed for the shared eager-CUDA flex function (one per mask / score-mod kind and dtype)
FLEX_RECOMPILE_LIMIT = 64
_static_block_masks: OrderedDict[tuple, tuple] = OrderedDict()
#: per forward of a stack (block_mask_scope): the block masks of batch-dependent masks
_scoped_block_masks: contextvars.ContextVar[dict | None] = contextvars.ContextVar("maskattn_block_masks",
                                                                                   default=None)


def _probe_flex() -> bool:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except Exception:  # pragma: no cover - depends on the installed torch
        return False
    return True


_FLEX_AVAILABLE = _probe_flex()


def flex_available() -> bool:
    """Whether ``torch.nn.attention.flex_attention`` can be imported in this PyTorch (probed once, at import;
    a plain constant, so a compiled graph traces it without a cache wrapper)."""
    return _FLEX_AVAILABLE


def unsupported(*, device: str, training: bool, dropout: bool, compiling: bool, batch_mask: bool) -> list[str]:
    """Why FlexAttention cannot run a call (an empty list when it can): ``training`` — autograd runs through it;
    ``batch_mask`` — the mask depends on the batch (key padding, a per-sequence radius). (Whether this PyTorch
    has FlexAttention at all is :func:`flex_available`'s question.)"""
    reasons = []
    if dropout:
        reasons.append("does not support attention dropout")
    if training and device != "cuda":
        reasons.append(f"supports backward only on CUDA (PyTorch raises 'FlexAttention does not support backward "
                       f"on CPU'), got a {device} call that needs gradients; call it under torch.no_grad() for "
                       f"inference")
    if compiling and device == "cpu" and batch_mask:
        reasons.append("cannot take a mask that depends on the batch (key padding) when compiled on the CPU: "
                       "Inductor has no CPU kernel for it in this PyTorch; run it eagerly")
    return reasons


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=True)


@contextlib.contextmanager
def block_mask_scope():
    """Share the block masks of batch-dependent masks (same predicate, same tensors) among every flex call
    inside the scope — the layers of one forward pass. Nested scopes reuse the outer one."""
    if _scoped_block_masks.get() is not None:
        yield
        return
    token = _scoped_block_masks.set({})
    try:
        yield
    finally:
        _scoped_block_masks.reset(token)


def _block_mask(mask: Mask, B: int, H: int, n: int, m: int, device: torch.device):
    from torch.nn.attention.flex_attention import create_block_mask

    if torch.compiler.is_compiling():
        return create_block_mask(mask.mask_mod, None if mask.static else B, H, n, m, device=device)
    key = (mask.cache_key, None if mask.static else B, H, n, m, str(device))
    if mask.cache_key is not None and mask.static:  # least recently used dropped first
        if key in _static_block_masks:
            _static_block_masks.move_to_end(key)
            return _static_block_masks[key][1]
        block_mask = create_block_mask(mask.mask_mod, None, H, n, m, device=device)
        _static_block_masks[key] = (mask, block_mask)
        if len(_static_block_masks) > BLOCK_MASK_CACHE_SIZE:
            _static_block_masks.popitem(last=False)
        return block_mask
    scoped = None if mask.cache_key is None else _scoped_block_masks.get()
    if scoped is not None and key in scoped:
        return scoped[key][1]
    block_mask = create_block_mask(mask.mask_mod, B, H, n, m, device=device)
    if scoped is not None:
        # the entry holds the mask too: tensors its key names by id stay alive, so no id is reused meanwhile
        scoped[key] = (mask, block_mask)
    return block_mask


def _pad_last(t: torch.Tensor, size: int) -> torch.Tensor:
    return t if t.shape[-1] >= size else torch.nn.functional.pad(t, (0, size - t.shape[-1]))


def flex_attention_call(q, k, v, *, score_mod=None, mask: Mask | None = None, scale: float | None = None) -> torch.Tensor:
    """FlexAttention of q ``(B, H, n, d)``, k ``(B, H, m, d)``, v ``(B, H, m, d_v)`` with a ``score_mod`` and
    a :class:`~maskattn.masks.Mask` predicate (True = attend; :func:`maskattn.masks.predicate` builds one
    from a dense mask and key padding). Under ``torch.no_grad()`` the inputs are detached (flex on CPU refuses
    inputs that require grad even when autograd is off). A query with no allowed key returns 0
    (FlexAttention's own convention). On CUDA, head dims below :data:`FLEX_MIN_HEAD_DIM` are zero-padded."""
    from torch.nn.attention.flex_attention import flex_attention

    if not torch.is_grad_enabled():
        q, k, v = q.detach(), k.detach(), v.detach()
    B, H, n, d = q.shape
    m, d_v = k.shape[-2], v.shape[-1]
    if q.device.type == "cuda" and min(d, d_v) < FLEX_MIN_HEAD_DIM:
        # the CUDA kernel needs head dims >= 16: zero features change no score q·k and add zero output columns
        scale = d ** -0.5 if scale is None else scale
        q, k = _pad_last(q, FLEX_MIN_HEAD_DIM), _pad_last(k, FLEX_MIN_HEAD_DIM)
        v = _pad_last(v, FLEX_MIN_HEAD_DIM)
        return flex_attention_call(q, k, v, score_mod=score_mod, mask=mask, scale=scale)[..., :d_v]
    block_mask = None if mask is None else _block_mask(mask, B, H, n, m, q.device)
    if torch.compiler.is_compiling():
        # Inductor's flex lowering (CPU, torch 2.13) fails on transposed head views: give it dense layouts
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
    if q.device.type == "cuda":
        # every distinct score_mod / mask_mod (mechanism, dtype) is one more compiled entry of this one function;
        # past Dynamo's default limit of 8 it would silently fall back to flex's dense O(n²) math path
        with torch._dynamo.config.patch(recompile_limit=FLEX_RECOMPILE_LIMIT):
            return _compiled_flex()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
