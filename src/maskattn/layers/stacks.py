"""Stacks of layers: :class:`Encoder` (one recipe per layer, optional positions, final LayerNorm), the CSAN
placement (local attention in the lowest layers, CSAN §3.1 and §4: "the lowest three layers of the
encoder") and :class:`Decoder` (causal layers with encoder–decoder attention, incremental decoding).

Example::

    >>> import torch, maskattn
    >>> enc = maskattn.csan_encoder(64, 4, num_layers=4, csan_layers=2, head_window=3)
    >>> enc.layer_names
    ['csan2d', 'csan2d', 'mha', 'mha']
    >>> enc(torch.randn(2, 9, 64)).shape
    torch.Size([2, 9, 64])
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch
import torch.nn as nn

from ..errors import ArgumentError, ArgumentTypeError
from ..validation import check_choice, check_positive_int, check_probability, describe, entry_point
from ..attention import AttentionMaps, SelfAttention
from ..attention.base import check_input, zero_padding
from ..functional.local import check_window
from ..kernels.flex import block_mask_scope
from .chain import ChainLayer, EncoderLayer, LayerCache, LayerSettings
from .positional import POSITIONAL, PositionalEncoding
from .recipe import LayerRecipe, parse_recipe, recipe_string
from .sublayers import NORMS

__all__ = ["Encoder", "Decoder", "csan_encoder", "LayerSpec"]

LayerSpec = str | tuple[str, dict] | nn.Module

#: What :meth:`Encoder.attention_maps` returns: per layer, bottom first, ``{"<position>:<name>": maps}``.
StackMaps = list[dict[str, AttentionMaps]]


def _shared_block_masks():
    """:func:`maskattn.kernels.flex.block_mask_scope` in eager mode (a compiled graph builds its masks itself)."""
    return contextlib.nullcontext() if torch.compiler.is_compiling() else block_mask_scope()


def _layer_maps(layer: nn.Module, x, key_padding_mask, **kwargs) -> tuple[torch.Tensor, dict[str, AttentionMaps]]:
    if isinstance(layer, ChainLayer):
        return layer.attention_maps(x, key_padding_mask, **kwargs)
    return layer(x, key_padding_mask=key_padding_mask), {}


class Encoder(nn.Module):
    """A stack of encoder layers, one attention recipe per layer.

    Args:
        d_model, num_heads: widths shared by every layer.
        layers: one entry per layer, bottom first: a registry name (``"mha"``, ``"csan1d"``, …; see
            :func:`maskattn.list_attentions`), a ``(name, options)`` pair passed to
            :func:`maskattn.create_attention`, or a ready ``nn.Module`` whose forward is
            ``forward(x, key_padding_mask=None) -> x`` (e.g. a :class:`~maskattn.layers.ChainLayer`).
        ffn_dim: feed-forward width (default ``4 * d_model``); dropout: residual/FFN dropout.
        norm: ``"pre"`` or ``"post"`` LayerNorm in every layer.
        final_norm: a LayerNorm after the last layer; default: True for pre-LN, False for post-LN.
        positional: ``"none"`` (default), ``"sinusoidal"`` or ``"learned"`` positions added to the input
            (then dropout); max_len: longest sequence for the positional table.

    :meth:`from_recipe` builds the stack from a recipe string such as ``"dman>san>ffn x6"``.

    ``forward(x, key_padding_mask=None)``: ``x`` ``(B, n, d_model)``, ``key_padding_mask`` ``(B, n)`` bool
    with ``True`` = padding → ``(B, n, d_model)``, padded positions exactly 0. :meth:`attention_maps` gives
    the maps of every attention sublayer.
    """

    def __init__(self, d_model: int, num_heads: int, layers: Sequence[LayerSpec], *, ffn_dim: int | None = None,
                 dropout: float = 0.0, norm: str = "pre", final_norm: bool | None = None, positional: str = "none",
                 max_len: int = 512):
        super().__init__()
        check_positive_int(d_model, "d_model")
        check_choice(norm, "norm", NORMS)
        check_choice(positional, "positional", POSITIONAL)
        self.positional = None if positional == "none" else PositionalEncoding(d_model, positional, max_len)
        self.input_dropout = nn.Dropout(check_probability(dropout, "dropout"))
        if isinstance(layers, (str, nn.Module)) or not isinstance(layers, Sequence) or len(layers) == 0:
            raise ArgumentTypeError(f"layers must be a non-empty list of registry names, (name, options) pairs or "
                            f"nn.Modules, got {describe(layers)}")
        self.d_model = d_model
        built: list[nn.Module] = []
        names: list[str] = []
        for i, spec in enumerate(layers):
            if isinstance(spec, nn.Module):
                built.append(spec)
                names.append(type(spec).__name__)
                continue
            if isinstance(spec, str):
                name, options = spec, dict[str, object]()
            elif isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], str) and isinstance(spec[1], dict):
                name, options = spec
            else:
                raise ArgumentTypeError(f"layers[{i}] must be a registry name, a (name, options) pair or an nn.Module, "
                                f"got {describe(spec)}")
            built.append(EncoderLayer(d_model, num_heads, attention=name, attention_options=options,
                                      ffn_dim=ffn_dim, dropout=dropout, norm=norm))
            names.append(name)
        self.layers = nn.ModuleList(built)
        self.layer_names: list[str] = names
        #: the recipe string of a stack built by :meth:`from_recipe` (None for layers given as modules)
        self.recipe: str | None = None
        use_final = norm == "pre" if final_norm is None else bool(final_norm)
        self.final_norm = nn.LayerNorm(d_model) if use_final else None

    @classmethod
    def from_recipe(cls, d_model: int, num_heads: int, recipe: str | Sequence[str] | Sequence[LayerRecipe], *,
                    ffn: bool = True, ffn_dim: int | None = None, dropout: float = 0.0,
                    attention_dropout: float = 0.0, activation_dropout: float | None = None, norm: str = "pre",
                    backend: str = "auto", final_norm: bool | None = None, positional: str = "none",
                    max_len: int = 512, norm_eps: float = 1e-5) -> Encoder:
        """An encoder from a recipe (:mod:`maskattn.layers.recipe`), e.g. ``"csan2d x3, mha x3"``,
        ``"dman>san>ffn x6"`` or ``"mtsa"`` with ``ffn=False`` (MTSA's sentence encoder). Every layer is a
        :class:`~maskattn.layers.ChainLayer` with the stack's :class:`~maskattn.layers.LayerSettings`; ``norm_eps``
        is the epsilon of every LayerNorm (1e-5; the authors' stacked MTSA: 1e-6,
        :data:`maskattn.attention.mtsa.STACKED_LAYER_SETTINGS`)."""
        check_positive_int(d_model, "d_model")
        layers = parse_recipe(recipe)
        settings = LayerSettings(ffn_dim=ffn_dim, dropout=dropout, activation_dropout=activation_dropout,
                                 attention_dropout=attention_dropout, norm=norm, backend=backend, norm_eps=norm_eps)
        built = [ChainLayer.from_recipe(d_model, num_heads, layer, settings, ffn=ffn) for layer in layers]
        encoder = cls(d_model, num_heads, built, dropout=dropout, norm=norm, final_norm=final_norm,
                      positional=positional, max_len=max_len)
        if encoder.final_norm is not None:
            encoder.final_norm = nn.LayerNorm(d_model, eps=settings.norm_eps)
        encoder.layer_names = [str(layer) for layer in layers]
        encoder.recipe = recipe_string(layers)
        return encoder

    def attention_sublayers(self) -> list[dict[str, SelfAttention]]:
        """The attention sublayers of every layer, bottom first: one dict per layer mapping ``"<position>:<name>"``
        (e.g. ``"0:dman"``, ``"1:san"``; ``"0:mtsa"`` for a Transformer layer) to the attention module. Layers
        given as custom modules have none."""
        return [layer.attention_sublayers() if isinstance(layer, ChainLayer) else {} for layer in self.layers]

    def _embed(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None) -> torch.Tensor:
        check_input(x, self.d_model, key_padding_mask, module=self)
        if self.positional is not None:
            x = zero_padding(self.input_dropout(self.positional(x)), key_padding_mask)
        return x

    def _close(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None) -> torch.Tensor:
        return x if self.final_norm is None else zero_padding(self.final_norm(x), key_padding_mask)

    @entry_point
    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        with _shared_block_masks():  # the layers build each padding-dependent FlexAttention block mask once
            x = self._embed(x, key_padding_mask)
            for layer in self.layers:
                x = layer(x, key_padding_mask=key_padding_mask)
            return self._close(x, key_padding_mask)

    @entry_point
    def attention_maps(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> StackMaps:
        """The maps of every attention sublayer in one pass of the stack over ``x``: per layer, bottom first,
        ``{"<position>:<name>": AttentionMaps}`` (keys of :meth:`attention_sublayers`), each computed by the
        module's :meth:`~maskattn.SelfAttention.attention_maps` on the input it receives in this pass."""
        x = self._embed(x, key_padding_mask)
        maps = []
        for layer in self.layers:
            x, layer_maps = _layer_maps(layer, x, key_padding_mask)
            maps.append(layer_maps)
        return maps


class Decoder(nn.Module):
    """A stack of causal decoder layers (each a :class:`~maskattn.layers.ChainLayer` with encoder–decoder
    attention, built by ``ChainLayer.from_recipe(..., decoder=True)``) and, with pre-LN, a final LayerNorm.

    ``forward(x, padding, memory, memory_padding)`` is the teacher-forced pass over target inputs ``x``
    ``(B, T, d)``; incremental decoding: ``caches = decoder.init_cache(memory, memory_padding)`` (the
    encoder–decoder keys and values computed once), then ``out, caches = decoder.step(x_new, caches)``.
    """

    def __init__(self, d_model: int, num_heads: int, recipe: str | Sequence[str] | Sequence[LayerRecipe],
                 settings: LayerSettings | None = None):
        super().__init__()
        settings = LayerSettings() if settings is None else settings
        layers = parse_recipe(recipe)
        self.layers = nn.ModuleList(ChainLayer.from_recipe(d_model, num_heads, layer, settings, decoder=True)
                                    for layer in layers)
        self.recipe = recipe_string(layers)
        self.final_norm = nn.LayerNorm(d_model, eps=settings.norm_eps) if settings.norm == "pre" else None
        self.d_model = d_model

    def _close(self, x: torch.Tensor, padding: torch.Tensor | None) -> torch.Tensor:
        return zero_padding(x if self.final_norm is None else self.final_norm(x), padding)

    @entry_point
    def forward(self, x: torch.Tensor, padding: torch.Tensor | None, memory: torch.Tensor,
                memory_padding: torch.Tensor | None) -> torch.Tensor:
        check_input(x, self.d_model, padding, "x", "padding", module=self)
        check_input(memory, self.d_model, memory_padding, "memory", "memory_padding")
        with _shared_block_masks():
            for layer in self.layers:
                x = layer(x, padding, memory, memory_padding)
            return self._close(x, padding)

    def _chain_layers(self) -> list[ChainLayer]:
        return [layer for layer in self.layers if isinstance(layer, ChainLayer)]  # every layer (__init__)

    def init_cache(self, memory: torch.Tensor, memory_padding: torch.Tensor | None) -> tuple[LayerCache, ...]:
        return tuple(layer.init_cache(memory, memory_padding) for layer in self._chain_layers())

    @entry_point
    def step(self, x: torch.Tensor, caches: tuple[LayerCache, ...],
             padding: torch.Tensor | None = None) -> tuple[torch.Tensor, tuple[LayerCache, ...]]:
        check_input(x, self.d_model, padding, "x", "padding", module=self)
        new = []
        for layer, cache in zip(self._chain_layers(), caches):
            x, cache = layer.step(x, cache, padding)
            new.append(cache)
        return self._close(x, padding), tuple(new)


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
        raise ArgumentError(f"csan_layers must be an int in [0, num_layers={num_layers}], got {describe(csan_layers)}")
    check_window(head_window, "head_window")
    name = "csan1d" if head_window == 1 else "csan2d"
    local = (name, dict(window=window, head_window=head_window, head_edges=head_edges, backend=backend))
    return Encoder(d_model, num_heads, [local] * csan_layers + [upper] * (num_layers - csan_layers), **kw)
