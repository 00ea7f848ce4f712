"""Encoder layers: residual sublayers (attention, feed-forward) with pre- or post-LayerNorm."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._validation import check_choice, check_positive_int, check_probability
from .attention.registry import create_attention

NORMS = ("pre", "post")

__all__ = ["FeedForward", "Residual", "EncoderLayer", "NORMS"]


class FeedForward(nn.Module):
    """Position-wise feed-forward network ``W2 · act(W1 x + b1) + b2`` (Vaswani et al., 2017)."""

    def __init__(self, d_model: int, ffn_dim: int, *, dropout: float = 0.0, activation: str = "relu"):
        super().__init__()
        check_positive_int(d_model, "d_model")
        check_positive_int(ffn_dim, "ffn_dim")
        self.activation = check_choice(activation, "activation", ("relu", "gelu"))
        self.fc1 = nn.Linear(d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, d_model)
        self.dropout = nn.Dropout(check_probability(dropout, "dropout"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = F.relu if self.activation == "relu" else F.gelu
        return self.fc2(self.dropout(act(self.fc1(x))))


class Residual(nn.Module):
    """``x + dropout(f(LN(x)))`` (pre-LN) or ``LN(x + dropout(f(x)))`` (post-LN) around a sublayer ``f``."""

    def __init__(self, d_model: int, *, norm: str = "pre", dropout: float = 0.0):
        super().__init__()
        self.norm_position = check_choice(norm, "norm", NORMS)
        self.norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(check_probability(dropout, "dropout"))

    def forward(self, x: torch.Tensor, sublayer) -> torch.Tensor:
        if self.norm_position == "pre":
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    """One encoder layer: a registered self-attention sublayer, then a feed-forward sublayer.

    ``attention`` is a registry name (see :func:`maskattn.list_attentions`) built with
    ``attention_options``; padded positions of the output are 0.
    """

    def __init__(self, d_model: int, num_heads: int, *, attention: str = "mha", attention_options: dict | None = None,
                 ffn_dim: int | None = None, dropout: float = 0.0, norm: str = "pre"):
        super().__init__()
        self.attention = create_attention(attention, d_model, num_heads, **(attention_options or {}))
        self.attention_residual = Residual(d_model, norm=norm, dropout=dropout)
        self.ffn = FeedForward(d_model, ffn_dim or 4 * d_model, dropout=dropout)
        self.ffn_residual = Residual(d_model, norm=norm, dropout=dropout)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = self.attention_residual(x, lambda h: self.attention(h, key_padding_mask=key_padding_mask))
        x = self.ffn_residual(x, self.ffn)
        if key_padding_mask is not None:
            x = x.masked_fill(key_padding_mask.unsqueeze(-1), 0.0)
        return x


# --------------------------------------------------------------------------------------------------
# Mask Attention Networks layer (MAN §2.5, Table 3)
# --------------------------------------------------------------------------------------------------

from dataclasses import dataclass  # noqa: E402

from .attention._common import check_input, merge_heads, split_heads, zero_padding  # noqa: E402
from .attention.man import AttentionCache, DynamicMaskAttention, StaticMaskAttention  # noqa: E402
from .attention.multihead import MultiHeadAttention  # noqa: E402

MAN_SUBLAYERS = ("dman", "sman", "san", "ffn")

__all__ += ["MANLayer", "MANLayerCache", "MAN_SUBLAYERS", "incremental_self_attention"]


@dataclass(frozen=True)
class MANLayerCache:
    """Incremental-decoding state of a :class:`MANLayer`: one :class:`AttentionCache` per attention
    sublayer (``None`` for FFN sublayers), in ``order``."""

    sublayers: tuple

    def __len__(self) -> int:
        return next((len(c) for c in self.sublayers if c is not None), 0)

    def reorder(self, index: torch.Tensor) -> MANLayerCache:
        """Select / repeat batch rows of every sublayer's cache (beam search)."""
        return MANLayerCache(tuple(None if c is None else c.reorder(index) for c in self.sublayers))


def _check_order(order) -> tuple[str, ...]:
    if isinstance(order, str) or not isinstance(order, (tuple, list)) or not order:
        raise ValueError(f"order must be a non-empty sequence of sublayer names from {MAN_SUBLAYERS}, got {order!r}")
    for i, kind in enumerate(order):
        if kind not in MAN_SUBLAYERS:
            raise ValueError(f"unknown order element {kind!r} at position {i} of {tuple(order)!r}; expected one of "
                             f"{', '.join(repr(k) for k in MAN_SUBLAYERS)}")
    return tuple(order)


def incremental_self_attention(block: nn.Module, x: torch.Tensor, key_padding_mask: torch.Tensor | None,
                               cache: AttentionCache) -> tuple[torch.Tensor, AttentionCache]:
    """One causal incremental-decoding step of a self-attention sublayer.

    ``x`` ``(B, n_new, d)`` holds the new positions (``key_padding_mask`` ``(B, n_new)``, True = padding),
    ``cache`` the keys/values of the earlier ones. Returns ``(out (B, n_new, d), new cache)``; the
    step-by-step outputs equal the block's full-sequence causal outputs. Causal DMAN / SMAN use their own
    ``cache`` argument; plain multi-head attention (SAN, built with ``mask="causal"``) has no cache API of
    its own, so its ``in_proj``/``out_proj`` run here over the cached keys/values.
    """
    if isinstance(block, (DynamicMaskAttention, StaticMaskAttention)):
        return block(x, key_padding_mask=key_padding_mask, cache=cache)
    if type(block) is not MultiHeadAttention or block.mask is None or block.mask.name != "causal":
        raise TypeError(f"incremental decoding supports causal DynamicMaskAttention, StaticMaskAttention and "
                        f"MultiHeadAttention(mask='causal'), got {block!r}")
    kpm = check_input(x, block.d_model, key_padding_mask)
    q, k, v = (split_heads(t, block.num_heads) for t in block.in_proj(x).chunk(3, dim=-1))  # (B, H, n, d_h)
    offset = len(cache)
    cache = cache.extend(k, v, kpm)
    n, m = q.shape[2], cache.key.shape[2]
    allowed = (torch.arange(m, device=x.device)[None, :]
               <= torch.arange(offset, offset + n, device=x.device)[:, None])[None, None]  # (1, 1, n, m)
    if cache.padding is not None:
        allowed = allowed & ~cache.padding[:, None, None, :]
    drop = block.dropout if block.training else 0.0
    out = F.scaled_dot_product_attention(q, cache.key, cache.value, attn_mask=allowed, dropout_p=drop)
    out = out.masked_fill(~allowed.any(-1, keepdim=True), 0.0)
    return zero_padding(block.out_proj(merge_heads(out)), kpm), cache


class MANLayer(nn.Module):
    """A Mask Attention Networks layer: sublayers in ``order``, each ``x + dropout(f(LN(x)))`` (pre-LN) or
    ``LN(x + dropout(f(x)))`` (post-LN) — MAN §2.5 and Fig. 2.

    ``order`` elements: ``"dman"`` (:class:`~maskattn.DynamicMaskAttention`, Eq. 12), ``"sman"``
    (:class:`~maskattn.StaticMaskAttention`, Eq. 11), ``"san"`` (:class:`~maskattn.MultiHeadAttention`,
    the all-ones mask) and ``"ffn"`` (:class:`FeedForward`, the identity mask, Eq. 9). The default is the
    paper's DMAN → SAN → FFN; MAN Table 3's variants are e.g. ``("ffn", "san", "ffn")``,
    ``("san", "san", "ffn")``, ``("dman", "dman", "ffn")``, ``("san", "dman", "ffn")``.

    Args:
        d_model, num_heads: width and heads. ffn_dim: FFN width (default ``2·d_model``, as in MAN §3.1).
        norm: ``"pre"`` (authors' translation setups) or ``"post"``. dropout: residual dropout.
        attention_dropout: attention-probability dropout. activation_dropout: dropout inside the FFN.
        causal: decoder layer (every attention sublayer causal); enables incremental decoding.
        backend: attention backend for every attention sublayer.
        dman_options / sman_options: extra options, e.g. ``{"max_distance": 64, "activation": "relu"}``
            or ``{"radius": "sqrt"}``.

    ``forward(x, key_padding_mask=None, return_attention=False, *, cache=None)``: returns ``out``
    (``(B, n, d)``, padded positions 0); with ``return_attention`` also a dict ``{"0:dman": maps, …}``;
    with ``cache`` (start with ``layer.init_cache()``) also the new :class:`MANLayerCache`.
    """

    def __init__(self, d_model: int, num_heads: int, *, ffn_dim: int | None = None,
                 order: tuple[str, ...] = ("dman", "san", "ffn"), norm: str = "pre", dropout: float = 0.0,
                 attention_dropout: float = 0.0, activation_dropout: float = 0.0, causal: bool = False,
                 backend: str = "auto", dman_options: dict | None = None, sman_options: dict | None = None):
        super().__init__()
        self.order = _check_order(order)
        self.d_model, self.causal = d_model, causal
        ffn_dim = 2 * d_model if ffn_dim is None else ffn_dim
        common = dict(dropout=attention_dropout, backend=backend)
        blocks = []
        for kind in self.order:
            if kind == "ffn":
                blocks.append(FeedForward(d_model, ffn_dim, dropout=activation_dropout))
            elif kind == "dman":
                blocks.append(DynamicMaskAttention(d_model, num_heads, causal=causal, **common, **(dman_options or {})))
            elif kind == "sman":
                blocks.append(StaticMaskAttention(d_model, num_heads, causal=causal, **common, **(sman_options or {})))
            else:
                blocks.append(MultiHeadAttention(d_model, num_heads, mask="causal" if causal else None, **common))
        self.sublayers = nn.ModuleList(blocks)
        self.residuals = nn.ModuleList(Residual(d_model, norm=norm, dropout=dropout) for _ in self.order)

    def extra_repr(self) -> str:
        return f"order={' -> '.join(k.upper() for k in self.order)}, causal={self.causal}"

    def init_cache(self) -> MANLayerCache:
        """An empty incremental-decoding cache (needs ``causal=True``)."""
        if not self.causal:
            raise ValueError("init_cache needs a causal MANLayer; construct it with causal=True")
        return MANLayerCache(tuple(None if k == "ffn" else AttentionCache() for k in self.order))

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None, return_attention: bool = False,
                *, cache: MANLayerCache | None = None):
        check_input(x, self.d_model, key_padding_mask)
        if cache is not None:
            if not isinstance(cache, MANLayerCache) or len(cache.sublayers) != len(self.order):
                raise TypeError(f"cache must be a MANLayerCache from this layer's init_cache() "
                                f"({len(self.order)} sublayers), got {type(cache).__name__}")
            if not self.causal:
                raise ValueError("cache (incremental decoding) needs a causal MANLayer; construct it with causal=True")
        maps, new_caches = {}, []
        for i, (kind, block, residual) in enumerate(zip(self.order, self.sublayers, self.residuals)):
            state = {}

            def sublayer(h, kind=kind, block=block, i=i, state=state):
                if kind == "ffn":
                    return block(h)
                if cache is not None and kind == "san":
                    out, state["cache"] = incremental_self_attention(block, h, key_padding_mask, cache.sublayers[i])
                    return out
                kwargs = {} if cache is None or kind == "san" else {"cache": cache.sublayers[i]}
                result = block(h, key_padding_mask=key_padding_mask, return_attention=return_attention, **kwargs)
                if not isinstance(result, tuple):
                    return result
                if return_attention:
                    maps[f"{i}:{kind}"] = result[1]
                if cache is not None:
                    state["cache"] = result[-1]
                return result[0]

            x = residual(x, sublayer)
            new_caches.append(state.get("cache"))
        if key_padding_mask is not None:
            x = x.masked_fill(key_padding_mask.unsqueeze(-1), 0.0)
        result = (x, maps) if return_attention else (x,)
        if cache is not None:
            result = result + (MANLayerCache(tuple(new_caches)),)
        return result if len(result) > 1 else result[0]
