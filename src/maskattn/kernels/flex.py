"""The FlexAttention call: a ``score_mod`` and a mask (a :class:`~maskattn.masks.Mask` predicate or a dense
bool tensor) turned into a block mask that skips empty blocks, so a band of width w costs O(n · w).

Compiled on CUDA (training and inference); eager and inference-only on CPU (PyTorch raises "FlexAttention
does not support backward on CPU")."""

from __future__ import annotations

import functools
import warnings

import torch

from ..masks import Mask

__all__ = ["flex_available", "flex_attention_call"]


@functools.cache
def flex_available() -> bool:
    """Whether ``torch.nn.attention.flex_attention`` can be imported in this PyTorch."""
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except Exception:  # pragma: no cover - depends on the installed torch
        return False
    return True


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def flex_attention_call(q, k, v, *, score_mod=None, mask: Mask | None = None, scale: float | None = None) -> torch.Tensor:
    """FlexAttention of q ``(B, H, n, d)``, k ``(B, H, m, d)``, v ``(B, H, m, d_v)`` with a ``score_mod`` and
    a :class:`~maskattn.masks.Mask` predicate (True = attend; :func:`maskattn.masks.predicate` builds one
    from a dense mask and key padding).
    Under ``torch.no_grad()`` the inputs are detached (flex on CPU refuses inputs that require grad even when
    autograd is off). A query with no allowed key returns 0 (FlexAttention's own convention)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if not torch.is_grad_enabled():
        q, k, v = q.detach(), k.detach(), v.detach()
    B, H, n, _ = q.shape
    m = k.shape[-2]
    block_mask = None
    if mask is not None:
        block_mask = create_block_mask(mask.mask_mod, None if mask.static else B, H, n, m, device=q.device)
    if q.device.type == "cuda":
        return _compiled_flex()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
