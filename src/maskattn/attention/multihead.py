"""Multi-head scaled dot-product attention (Vaswani et al., 2017) — the baseline of every paper here, MAN's
SAN (Eq. 6–7), and the decoder's causal self-attention."""

from __future__ import annotations

import torch

from ..validation import entry_point
from ..functional.dot_product import attention_weights, dot_product_attention
from ..masks import Mask, causal as causal_mask, from_name
from .base import (AttentionCache, AttentionMaps, SelfAttention, check_input, merge_heads,
                   qkv_projections, split_qkv, zero_padding)
from .registry import register_attention


@register_attention("mha", description="multi-head scaled dot-product attention (SDPA)")
class MultiHeadAttention(SelfAttention):
    """Multi-head scaled dot-product self-attention on ``F.scaled_dot_product_attention``.

    Args:
        d_model: input/output width; num_heads: heads (``d_model`` must divide evenly).
        dropout: attention-probability dropout. backend: ``auto`` | ``reference`` | ``sdpa`` | ``flex``.
        mask: an optional structural mask for every head (a :class:`~maskattn.masks.Mask` or a name
            such as ``"causal"``); ``None`` attends everywhere. With ``"causal"`` the module decodes
            incrementally (:meth:`step`).
        bias: whether the projections have biases.
    """

    family = "dot_product"

    def __init__(self, d_model: int, num_heads: int, *, dropout: float = 0.0, backend: str = "auto",
                 mask: Mask | str | None = None, bias: bool = True):
        super().__init__(d_model, num_heads, dropout=dropout, backend=backend)
        self.mask = from_name(mask) if mask is not None else None
        self.in_proj, self.out_proj = qkv_projections(d_model, bias=bias)

    @property
    def causal(self) -> bool:
        """Whether the mask is the causal predicate (``"causal"``, ``masks.causal()`` or ``masks.forward_mask()``):
        such a module decodes incrementally."""
        return self.mask is not None and self.mask.is_causal

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-head ``q, k, v``: three ``(B, H, n, d_h)`` tensors."""
        return split_qkv(self.in_proj(x), self.num_heads)

    def _attend(self, q, k, v, mask, key_padding_mask):
        out = dot_product_attention(q, k, v, mask, key_padding_mask=key_padding_mask, dropout_p=self.dropout,
                                    training=self.training, backend=self.backend)
        return self.out_proj(merge_heads(out))

    @entry_point
    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, n, d_model) → (B, n, d_model); padded positions are 0."""
        kpm = check_input(x, self.d_model, key_padding_mask, module=self)
        return zero_padding(self._attend(*self.project(x), self.mask, kpm), kpm)

    @entry_point
    def attention_maps(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> AttentionMaps:
        """``attention``: the probabilities ``(B, H, n, n)``."""
        kpm = check_input(x, self.d_model, key_padding_mask, module=self)
        q, k, _ = self.project(x)
        return AttentionMaps(attention=attention_weights(q, k, self.mask, key_padding_mask=kpm))

    @entry_point
    def step(self, x: torch.Tensor, cache: AttentionCache,
             key_padding_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, AttentionCache]:
        kpm, q, cache, offset = self._step_inputs(x, cache, key_padding_mask)
        out = self._attend(q, cache.key, cache.value, causal_mask().shifted(offset), cache.padding)
        return zero_padding(out, kpm), cache
