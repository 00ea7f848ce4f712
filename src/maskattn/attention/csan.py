"""Convolutional self-attention networks, CSAN 1D and 2D (Yang et al., NAACL 2019, §3)."""

from __future__ import annotations

import torch

from ..validation import check_choice, entry_point
from ..functional.local import HEAD_EDGES, check_head_window, check_window, local_attention, local_attention_maps
from .base import AttentionMaps, check_input, merge_heads, zero_padding
from .multihead import MultiHeadAttention
from .registry import register_attention

__all__ = ["ConvSelfAttention"]


@register_attention("csan2d", description="CSAN 2D: local window over neighbouring heads, one softmax (Eq. 7-9)",
                    head_window=3)
@register_attention("csan1d", description="CSAN 1D: attention restricted to a local window (Eq. 4-6)", head_window=1)
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

    ``forward(x, key_padding_mask=None)``: ``x`` ``(B, n, d_model)`` → ``(B, n, d_model)``, padded positions
    exactly 0. :meth:`attention_maps` (reference math) gives the maps.
    """

    family = "local"

    def __init__(self, d_model: int, num_heads: int, *, dropout: float = 0.0, backend: str = "auto",
                 window: int = 11, head_window: int = 1, head_edges: str = "truncate", bias: bool = True):
        super().__init__(d_model, num_heads, dropout=dropout, backend=backend, bias=bias)
        self.window = check_window(window)
        self.head_window = check_head_window(head_window, num_heads)
        self.head_edges = check_choice(head_edges, "head_edges", HEAD_EDGES)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, window={self.window}, "
                f"head_window={self.head_window}, head_edges={self.head_edges!r}, backend={self.backend!r}")

    @entry_point
    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, n, d_model) → (B, n, d_model); padded positions are 0."""
        kpm = check_input(x, self.d_model, key_padding_mask, module=self)
        q, k, v = self.project(x)  # (B, H, n, d_h) each
        out = local_attention(q, k, v, window=self.window, head_window=self.head_window, key_padding_mask=kpm,
                              head_edges=self.head_edges, dropout_p=self.dropout, training=self.training,
                              backend=self.backend)
        return zero_padding(self.out_proj(merge_heads(out)), kpm)

    @entry_point
    def attention_maps(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> AttentionMaps:
        """``attention``: ``(B, H, n, n)`` for CSAN 1D; ``(B, H, n, H, n)`` for 2D, where ``[b, h, i, g, j]`` is
        the weight of query ``i`` of head ``h`` on key ``j`` of head ``g``."""
        kpm = check_input(x, self.d_model, key_padding_mask, module=self)
        q, k, _ = self.project(x)
        maps = local_attention_maps(q, k, window=self.window, head_window=self.head_window, key_padding_mask=kpm,
                                    head_edges=self.head_edges)  # (B, H, n, H, n)
        if self.head_window == 1:
            maps = maps.diagonal(dim1=1, dim2=3).permute(0, 3, 1, 2)  # (B, n, n, H) -> (B, H, n, n)
        return AttentionMaps(attention=maps)
