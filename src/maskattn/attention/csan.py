"""Convolutional self-attention networks, CSAN 1D and 2D (Yang et al., NAACL 2019, §3)."""

from __future__ import annotations

import torch

from ..functional.local import (
    HEAD_EDGES,
    LOCAL_BACKEND_CHOICES,
    _local_attention_with_maps,
    check_head_window,
    check_window,
    local_attention,
)
from ._common import check_choice, check_input, merge_heads, split_heads, zero_padding
from .multihead import MultiHeadAttention
from .registry import register_attention

__all__ = ["ConvSelfAttention"]


@register_attention("csan2d", description="CSAN 2D: local window over neighbouring heads, one softmax (Eq. 7-9)",
                    backends=("reference", "sdpa", "flex", "banded"), head_window=3)
@register_attention("csan1d", description="CSAN 1D: attention restricted to a local window (Eq. 4-6)",
                    backends=("reference", "sdpa", "flex", "banded"), head_window=1)
class ConvSelfAttention(MultiHeadAttention):
    """Convolutional self-attention: multi-head attention whose scope is a local window (1D, CSAN
    Eq. 4–6) or a window × neighbouring-heads area with one softmax (2D, Eq. 7–9).

    Parameter-free beyond the standard multi-head projections: it has exactly the parameters (and the
    ``state_dict`` keys) of :class:`~maskattn.MultiHeadAttention`, so a trained MHA checkpoint loads as is.

    Args:
        d_model, num_heads: widths (``d_model`` divisible by ``num_heads``).
        dropout: attention-probability dropout (training only).
        backend: ``"auto"`` | ``"banded"`` | ``"flex"`` | ``"sdpa"`` | ``"reference"``; see
            :mod:`maskattn.functional.local`. ``auto`` is the O(n·window) banded kernel on CPU and
            FlexAttention on CUDA.
        window: ``M + 1``, odd (default 11, the paper's best): keys ``|i − j| <= M/2``.
        head_window: ``N + 1``, odd, ``<= num_heads``: 1 = CSAN 1D; the registered ``"csan2d"`` uses 3.
        head_edges: ``"truncate"`` (paper) or ``"circular"`` (keys and values wrap across heads).
        bias: whether the projections have biases.

    ``forward(x, key_padding_mask=None, return_attention=False)``: ``x`` ``(B, n, d_model)`` →
    ``(B, n, d_model)``, padded positions exactly 0. With ``return_attention`` (computed by the
    reference backend) also ``{"attention": maps}``: ``(B, H, n, n)`` for 1D and ``(B, H, n, H, n)``
    for 2D, where ``maps[b, h, i, g, j]`` is the weight of query ``i`` of head ``h`` on key ``j`` of head ``g``.
    """

    def __init__(self, d_model: int, num_heads: int, *, dropout: float = 0.0, backend: str = "auto",
                 window: int = 11, head_window: int = 1, head_edges: str = "truncate", bias: bool = True):
        super().__init__(d_model, num_heads, dropout=dropout, bias=bias)
        self.backend = check_choice(backend, "backend", LOCAL_BACKEND_CHOICES)
        self.window = check_window(window)
        self.head_window = check_head_window(head_window, num_heads)
        self.head_edges = check_choice(head_edges, "head_edges", HEAD_EDGES)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, window={self.window}, "
                f"head_window={self.head_window}, head_edges={self.head_edges!r}, backend={self.backend!r}")

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None, return_attention: bool = False):
        """x: (B, n, d_model) → (B, n, d_model); see the class docstring for ``return_attention``."""
        kpm = check_input(x, self.d_model, key_padding_mask)
        q, k, v = (split_heads(t, self.num_heads) for t in self.in_proj(x).chunk(3, dim=-1))  # (B, H, n, d_h)
        options = dict(window=self.window, head_window=self.head_window, key_padding_mask=kpm,
                       head_edges=self.head_edges, dropout_p=self.dropout, training=self.training)
        maps = None
        if return_attention:
            out, area_maps = _local_attention_with_maps(q, k, v, **options)  # maps: (B, H, n, H, n)
            if self.head_window == 1:
                area_maps = area_maps.diagonal(dim1=1, dim2=3).permute(0, 3, 1, 2)  # (B, H, n, n)
            maps = {"attention": area_maps}
        else:
            out = local_attention(q, k, v, backend=self.backend, **options)
        out = zero_padding(self.out_proj(merge_heads(out)), kpm)
        return (out, maps) if return_attention else out
