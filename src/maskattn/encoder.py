"""Encoder stacks with a per-layer attention recipe, and the CSAN placement (local attention in the lowest
layers, standard attention above: CSAN §3.1 and §4, "the lowest three layers of the encoder").

Example::

    >>> import torch, maskattn
    >>> enc = maskattn.csan_encoder(64, 4, num_layers=4, csan_layers=2, head_window=3)
    >>> enc.layer_names
    ['csan2d', 'csan2d', 'mha', 'mha']
    >>> enc(torch.randn(2, 9, 64)).shape
    torch.Size([2, 9, 64])
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn

from ._validation import check_choice, check_positive_int, describe
from .functional.local import check_window
from .layers import NORMS, EncoderLayer

__all__ = ["Encoder", "csan_encoder"]

LayerSpec = str | tuple[str, dict] | nn.Module


class Encoder(nn.Module):
    """A stack of encoder layers, one attention recipe per layer.

    Args:
        d_model, num_heads: widths shared by every layer.
        layers: one entry per layer, bottom first: a registry name (``"mha"``, ``"csan1d"``, …; see
            :func:`maskattn.list_attentions`), a ``(name, options)`` pair passed to
            :func:`maskattn.create_attention`, or a ready ``nn.Module`` whose forward is
            ``forward(x, key_padding_mask=None) -> x`` (e.g. a custom layer).
        ffn_dim: feed-forward width (default ``4 * d_model``); dropout: residual/FFN dropout.
        norm: ``"pre"`` or ``"post"`` LayerNorm in every layer.
        final_norm: a LayerNorm after the last layer; default: True for pre-LN, False for post-LN.

    ``forward(x, key_padding_mask=None)``: ``x`` ``(B, n, d_model)``, ``key_padding_mask`` ``(B, n)``
    bool with ``True`` = padding → ``(B, n, d_model)``, padded positions exactly 0.
    """

    def __init__(self, d_model: int, num_heads: int, layers: Sequence[LayerSpec], *, ffn_dim: int | None = None,
                 dropout: float = 0.0, norm: str = "pre", final_norm: bool | None = None):
        super().__init__()
        check_positive_int(d_model, "d_model")
        check_choice(norm, "norm", NORMS)
        if isinstance(layers, (str, nn.Module)) or not isinstance(layers, Sequence) or len(layers) == 0:
            raise TypeError(f"layers must be a non-empty list of registry names, (name, options) pairs or "
                            f"nn.Modules, got {describe(layers)}")
        self.d_model = d_model
        built, names = [], []
        for i, spec in enumerate(layers):
            if isinstance(spec, nn.Module):
                built.append(spec)
                names.append(type(spec).__name__)
                continue
            if isinstance(spec, str):
                name, options = spec, {}
            elif isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], str) and isinstance(spec[1], dict):
                name, options = spec
            else:
                raise TypeError(f"layers[{i}] must be a registry name, a (name, options) pair or an nn.Module, "
                                f"got {describe(spec)}")
            built.append(EncoderLayer(d_model, num_heads, attention=name, attention_options=options,
                                      ffn_dim=ffn_dim, dropout=dropout, norm=norm))
            names.append(name)
        self.layers = nn.ModuleList(built)
        self.layer_names: list[str] = names
        use_final = norm == "pre" if final_norm is None else bool(final_norm)
        self.final_norm = nn.LayerNorm(d_model) if use_final else None

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be a tensor of shape (batch, seq_len, {self.d_model}), got {describe(x)}")
        for layer in self.layers:
            x = layer(x, key_padding_mask=key_padding_mask)
        if self.final_norm is not None:
            x = self.final_norm(x)
            if key_padding_mask is not None:
                x = x.masked_fill(key_padding_mask.unsqueeze(-1), 0.0)
        return x


def csan_encoder(d_model: int, num_heads: int, num_layers: int = 6, csan_layers: int = 3, *, head_window: int = 3,
                 window: int = 11, head_edges: str = "truncate", upper: str | tuple[str, dict] = "mha",
                 backend: str = "auto", **kw) -> Encoder:
    """The CSAN encoder: convolutional self-attention in the lowest ``csan_layers`` of ``num_layers``
    layers and ``upper`` (standard multi-head attention by default) above — the paper's setup is the
    lowest 3 of 6 (§4). ``head_window=1`` gives CSAN 1D, odd values ``> 1`` CSAN 2D. ``backend``
    applies to the CSAN layers; ``**kw`` (``ffn_dim``, ``dropout``, ``norm``, ``final_norm``) go to
    :class:`Encoder`."""
    check_positive_int(num_layers, "num_layers")
    if isinstance(csan_layers, bool) or not isinstance(csan_layers, int) or not 0 <= csan_layers <= num_layers:
        raise ValueError(f"csan_layers must be an int in [0, num_layers={num_layers}], got {describe(csan_layers)}")
    check_window(head_window, "head_window")
    name = "csan1d" if head_window == 1 else "csan2d"
    local = (name, dict(window=window, head_window=head_window, head_edges=head_edges, backend=backend))
    return Encoder(d_model, num_heads, [local] * csan_layers + [upper] * (num_layers - csan_layers), **kw)
