"""Encoder stacks with a per-layer attention recipe, and the CSAN placement (local attention in the lowest
layers, standard attention above: CSAN §3.1 and §4, "the lowest three layers of the encoder").

A recipe is a readable string (or a YAML list of its comma-separated groups), parsed by
:func:`parse_recipe` and built by :meth:`Encoder.from_recipe`::

    recipe    := group ("," group)*            e.g.  "csan2d x3, mha x3"
    group     := layer ["x" INT]               a layer repeated INT times (default 1)
    layer     := sublayer (">" sublayer)*      e.g.  "dman>san>ffn" — exactly these sublayers, in order
    sublayer  := NAME ["(" key=value, ... ")"] e.g.  "csan1d(window=5)", "ffn(dim=512)"

``NAME`` is a registered attention (:func:`maskattn.list_attentions`), ``san`` (plain multi-head attention,
MAN's name for it) or ``ffn``. A layer written as a single attention name is a Transformer layer
(attention → FFN) unless ``ffn=False``; a ``>`` chain is exactly the listed sublayers, each one
``x + dropout(f(LN(x)))`` (pre-LN) or ``LN(x + dropout(f(x)))`` (post-LN). A chain of MAN sublayers
(``dman``, ``sman``, ``san``, ``ffn``) without options is a :class:`~maskattn.MANLayer`. Option values are
YAML scalars or flow lists: ``mtsa(head_masks=[forward, backward, window:2, full])``.

Example::

    >>> import torch, maskattn
    >>> enc = maskattn.csan_encoder(64, 4, num_layers=4, csan_layers=2, head_window=3)
    >>> enc.layer_names
    ['csan2d', 'csan2d', 'mha', 'mha']
    >>> enc(torch.randn(2, 9, 64)).shape
    torch.Size([2, 9, 64])
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn as nn
import yaml

from ._validation import check_choice, check_positive_int, check_probability, describe
from .attention.registry import create_attention, list_attentions
from .functional.local import check_window
from .layers import MAN_SUBLAYERS, NORMS, EncoderLayer, FeedForward, MANLayer, Residual

__all__ = ["Encoder", "csan_encoder", "parse_recipe", "recipe_string", "recipe_runs", "LayerRecipe", "ChainLayer",
           "PositionalEncoding", "POSITIONAL"]

LayerSpec = str | tuple[str, dict] | nn.Module

# --------------------------------------------------------------------------------------------------
# Layer recipes
# --------------------------------------------------------------------------------------------------

SAN_ALIAS = {"san": "mha"}
_REPEAT = re.compile(r"^(?P<layer>.*?)\s*(?:[x×\*]\s*(?P<times>\d+))?$", re.S)
_SUBLAYER = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*(?:\((?P<options>.*)\))?$", re.S)


@dataclass(frozen=True)
class LayerRecipe:
    """One encoder layer: ``sublayers`` as ``(name, options)`` pairs; ``chain`` is True when written
    with ``>`` (exactly these sublayers), False for a single name (attention → FFN when the encoder
    has ``ffn=True``)."""

    sublayers: tuple[tuple[str, dict], ...]
    chain: bool = False

    def __str__(self) -> str:
        def one(name, options):
            return name + (f"({', '.join(f'{k}={v}' for k, v in options.items())})" if options else "")
        return ">".join(one(n, o) for n, o in self.sublayers)


def _split_top(text: str, sep: str) -> list[str]:
    """Split on ``sep`` outside parentheses / brackets."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if depth < 0:
            raise ValueError(f"unbalanced brackets in recipe {text!r}")
        if ch == sep and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    if depth:
        raise ValueError(f"unbalanced brackets in recipe {text!r}")
    return parts + [current]


def _parse_options(text: str, where: str) -> dict:
    options = {}
    for item in _split_top(text, ","):
        if not item.strip():
            continue
        if "=" not in item:
            raise ValueError(f"{where}: option {item.strip()!r} must be written key=value")
        key, value = (t.strip() for t in item.split("=", 1))
        if not key.isidentifier():
            raise ValueError(f"{where}: option name {key!r} is not an identifier")
        options[key] = yaml.safe_load(value) if value else None
    return options


def _check_sublayer(name: str, where: str) -> str:
    valid = ["ffn", "san", *list_attentions()]
    if name not in valid:
        raise ValueError(f"{where}: unknown sublayer {name!r}; expected one of {', '.join(valid)}")
    return name


def parse_recipe(recipe: str | Sequence[str]) -> list[LayerRecipe]:
    """Parse a recipe (grammar in the module docstring) into one :class:`LayerRecipe` per layer,
    bottom first. ``recipe`` may be a string or a list of groups (e.g. from YAML)."""
    if isinstance(recipe, str):
        groups = _split_top(recipe, ",")
    elif isinstance(recipe, Sequence) and recipe and all(isinstance(g, str) for g in recipe):
        groups = list(recipe)
    else:
        raise TypeError(f"recipe must be a string such as 'mtsa x2' or a non-empty list of such strings, "
                        f"got {describe(recipe)}")
    layers = []
    for group in groups:
        group = group.strip()
        if not group:
            raise ValueError(f"empty layer group in recipe {recipe!r}")
        match = _REPEAT.match(group)
        body, times = match["layer"].strip(), int(match["times"] or 1)
        if times < 1:
            raise ValueError(f"recipe group {group!r}: repeat count must be >= 1")
        sublayers = []
        for part in _split_top(body, ">"):
            m = _SUBLAYER.match(part.strip())
            if not m:
                raise ValueError(f"recipe group {group!r}: cannot parse sublayer {part.strip()!r}; expected "
                                 "name or name(key=value, ...)")
            name = _check_sublayer(m["name"], f"recipe group {group!r}")
            sublayers.append((name, _parse_options(m["options"] or "", f"recipe group {group!r}")))
        chain = len(sublayers) > 1 or sublayers[0][0] == "ffn"
        layers += [LayerRecipe(tuple(sublayers), chain)] * times
    return layers


def recipe_runs(layers: Sequence[LayerRecipe]) -> list[tuple[LayerRecipe, int]]:
    """Runs of equal consecutive layers as ``(layer, count)`` pairs, in order."""
    runs: list[list] = []
    for layer in layers:
        if runs and runs[-1][0] == layer:
            runs[-1][1] += 1
        else:
            runs.append([layer, 1])
    return [(layer, count) for layer, count in runs]


def recipe_string(layers: Sequence[LayerRecipe]) -> str:
    """The canonical recipe string of parsed layers (runs of equal layers folded into ``x N``)."""
    return ", ".join(str(layer) + (f" x{n}" if n > 1 else "") for layer, n in recipe_runs(layers))


class ChainLayer(nn.Module):
    """A layer of residual sublayers in order (attention modules from the registry and FFNs), each
    wrapped in :class:`~maskattn.layers.Residual`; padded positions of the output are 0."""

    def __init__(self, d_model: int, num_heads: int, sublayers: Sequence[tuple[str, dict]], *, ffn_dim: int,
                 dropout: float = 0.0, norm: str = "pre", attention_defaults: dict | None = None):
        super().__init__()
        self.names = [name for name, _ in sublayers]
        blocks = []
        for name, options in sublayers:
            if name == "ffn":
                options = dict(options)
                width = options.pop("dim", ffn_dim)
                blocks.append(FeedForward(d_model, width, dropout=options.pop("dropout", dropout), **options))
            else:
                blocks.append(create_attention(SAN_ALIAS.get(name, name), d_model, num_heads,
                                               **{**(attention_defaults or {}), **options}))
        self.sublayers = nn.ModuleList(blocks)
        self.residuals = nn.ModuleList(Residual(d_model, norm=norm, dropout=dropout) for _ in blocks)

    def extra_repr(self) -> str:
        return " > ".join(self.names)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        for name, block, residual in zip(self.names, self.sublayers, self.residuals):
            if name == "ffn":
                x = residual(x, block)
            else:
                x = residual(x, lambda h, block=block: block(h, key_padding_mask=key_padding_mask))
        if key_padding_mask is not None:
            x = x.masked_fill(key_padding_mask.unsqueeze(-1), 0.0)
        return x


# --------------------------------------------------------------------------------------------------
# Positional encodings
# --------------------------------------------------------------------------------------------------

POSITIONAL = ("none", "sinusoidal", "learned")


class PositionalEncoding(nn.Module):
    """Adds positions to ``(B, n, d)`` inputs: ``"sinusoidal"`` (Vaswani et al. 2017, fixed) or
    ``"learned"`` (a trained table of ``max_len`` rows). MTSA needs none: its masks encode order."""

    def __init__(self, d_model: int, kind: str = "sinusoidal", max_len: int = 512):
        super().__init__()
        self.kind = check_choice(kind, "positional", POSITIONAL[1:])
        self.max_len = check_positive_int(max_len, "max_len")
        if kind == "learned":
            self.table = nn.Parameter(torch.empty(max_len, d_model).normal_(0.0, 0.02))
        else:
            position = torch.arange(max_len, dtype=torch.float32)[:, None]  # (max_len, 1)
            rate = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
            table = torch.zeros(max_len, d_model)
            table[:, 0::2] = torch.sin(position * rate)
            table[:, 1::2] = torch.cos(position * rate[: d_model // 2])
            self.register_buffer("table", table, persistent=False)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """Add positions ``offset … offset + n − 1`` to ``x`` ``(B, n, d)``; ``offset`` > 0 continues a
        sequence (incremental decoding)."""
        n = x.shape[1]
        if offset + n > self.max_len:
            raise ValueError(f"sequence length {offset + n} exceeds the positional encoding's max_len {self.max_len}; "
                             "raise max_len or truncate inputs")
        return x + self.table[offset:offset + n].to(x.dtype)


# --------------------------------------------------------------------------------------------------
# Encoder stacks
# --------------------------------------------------------------------------------------------------


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
        positional: ``"none"`` (default), ``"sinusoidal"`` or ``"learned"`` positions added to the input
            (then dropout); max_len: longest sequence for the positional table.

    :meth:`from_recipe` builds the stack from a recipe string such as ``"dman>san>ffn x6"``.

    ``forward(x, key_padding_mask=None, return_attention=False)``: ``x`` ``(B, n, d_model)``,
    ``key_padding_mask`` ``(B, n)`` bool with ``True`` = padding → ``(B, n, d_model)``, padded positions
    exactly 0. With ``return_attention`` also the attention maps of every layer (see :meth:`forward`).
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

    def attention_sublayers(self) -> list[dict[str, nn.Module]]:
        """The attention sublayers of every layer, bottom first: one dict per layer mapping
        ``"<position>:<name>"`` (the keys of :class:`~maskattn.MANLayer`'s maps, e.g. ``"0:dman"``,
        ``"1:san"``; ``"0:mtsa"`` for a Transformer layer) to the attention module. Layers given as custom
        modules have none."""
        found = []
        for layer, layer_name in zip(self.layers, self.layer_names):
            if isinstance(layer, EncoderLayer):
                found.append({f"0:{layer_name.split('(', 1)[0]}": layer.attention})
            elif isinstance(layer, MANLayer):
                found.append({f"{i}:{kind}": block for i, (kind, block) in enumerate(zip(layer.order, layer.sublayers))
                              if kind != "ffn"})
            elif isinstance(layer, ChainLayer):
                found.append({f"{i}:{name}": block for i, (name, block) in enumerate(zip(layer.names, layer.sublayers))
                              if name != "ffn"})
            else:
                found.append({})
        return found

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None, return_attention: bool = False):
        """Encode ``x``. With ``return_attention`` returns ``(out, maps)``: ``maps`` holds one dict per layer,
        bottom first, ``{"<position>:<name>": module_maps}`` for each attention sublayer (keys of
        :meth:`attention_sublayers`), where ``module_maps`` is exactly what that module returns with
        ``return_attention=True`` on the input it receives in this pass (e.g. MTSA's ``token2token`` /
        ``source2token``, DMAN's ``attention`` / ``mask``, CSAN's ``attention``)."""
        if not isinstance(return_attention, bool):
            raise TypeError(f"return_attention must be a bool, got {describe(return_attention)}")
        if not return_attention:
            return self._encode(x, key_padding_mask)
        with _recording_attention(self.attention_sublayers()) as maps:
            out = self._encode(x, key_padding_mask)
        return out, maps

    def _encode(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be a tensor of shape (batch, seq_len, {self.d_model}), got {describe(x)}")
        if self.positional is not None:
            x = self.input_dropout(self.positional(x))
            if key_padding_mask is not None:
                x = x.masked_fill(key_padding_mask.unsqueeze(-1), 0.0)
        for layer in self.layers:
            x = layer(x, key_padding_mask=key_padding_mask)
        if self.final_norm is not None:
            x = self.final_norm(x)
            if key_padding_mask is not None:
                x = x.masked_fill(key_padding_mask.unsqueeze(-1), 0.0)
        return x

    @classmethod
    def from_recipe(cls, d_model: int, num_heads: int, recipe: str | Sequence[str] | Sequence[LayerRecipe], *,
                    ffn: bool = True, ffn_dim: int | None = None, dropout: float = 0.0,
                    attention_dropout: float = 0.0, norm: str = "pre", backend: str = "auto",
                    final_norm: bool | None = None, positional: str = "none", max_len: int = 512) -> Encoder:
        """An encoder from a recipe (see the module docstring), e.g. ``"csan2d x3, mha x3"``,
        ``"dman>san>ffn x6"`` or ``"mtsa"`` with ``ffn=False`` (MTSA's sentence encoder).

        ``attention_dropout`` and ``backend`` are every attention sublayer's defaults (a sublayer's own
        options override them); ``ffn_dim`` defaults to ``4·d_model`` (``2·d_model`` in MAN layers)."""
        check_positive_int(d_model, "d_model")
        check_choice(norm, "norm", NORMS)
        layers = recipe if (isinstance(recipe, Sequence) and recipe and isinstance(recipe[0], LayerRecipe)) \
            else parse_recipe(recipe)
        defaults = {"dropout": check_probability(attention_dropout, "attention_dropout"), "backend": backend}
        built = []
        for layer in layers:
            names = tuple(name for name, _ in layer.sublayers)
            options = [o for _, o in layer.sublayers if o]
            if not layer.chain and ffn:
                (name, opts), = layer.sublayers
                built.append(EncoderLayer(d_model, num_heads, attention=SAN_ALIAS.get(name, name),
                                          attention_options={**defaults, **opts}, ffn_dim=ffn_dim, dropout=dropout,
                                          norm=norm))
            elif layer.chain and set(names) <= set(MAN_SUBLAYERS) and not options:
                built.append(MANLayer(d_model, num_heads, order=names, ffn_dim=ffn_dim, norm=norm, dropout=dropout,
                                      attention_dropout=attention_dropout, backend=backend))
            else:
                built.append(ChainLayer(d_model, num_heads, layer.sublayers, ffn_dim=ffn_dim or 4 * d_model,
                                        dropout=dropout, norm=norm, attention_defaults=defaults))
        encoder = cls(d_model, num_heads, built, dropout=dropout, norm=norm, final_norm=final_norm,
                      positional=positional, max_len=max_len)
        encoder.layer_names = [str(layer) for layer in layers]
        encoder.recipe = recipe_string(layers)
        return encoder


def _ask_for_maps(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Forward pre-hook: call the attention module with ``return_attention=True``."""
    return args, {**kwargs, "return_attention": True}


def _keep_maps(record: dict, key: str, module: nn.Module, args: tuple, kwargs: dict, output):
    """Forward hook: store the module's maps under ``key`` and hand its caller the output it asked for."""
    out, record[key] = output
    return out


@contextmanager
def _recording_attention(sublayers: list[dict[str, nn.Module]]) -> Iterator[list[dict]]:
    """While active, every attention module of ``sublayers`` returns its usual output to its layer and
    stores its maps in the yielded list (one dict per layer), so the maps come from the unchanged forward
    pass of the layers."""
    records: list[dict] = [{} for _ in sublayers]
    handles = []
    try:
        for record, layer in zip(records, sublayers):
            for key, module in layer.items():
                handles.append(module.register_forward_pre_hook(_ask_for_maps, with_kwargs=True))
                handles.append(module.register_forward_hook(partial(_keep_maps, record, key), with_kwargs=True))
        yield records
    finally:
        for handle in handles:
            handle.remove()


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
