"""The one layer of the library: a chain of residual sublayers (docs/design.md §5).

Every layer — a Transformer encoder layer (attention → FFN), MAN's layer (DMAN → SAN → FFN, MAN §2.5), any
recipe chain, and a decoder layer (causal self-attention → encoder–decoder attention → FFN) — is a
:class:`ChainLayer`: sublayers in order, each wrapped in a :class:`~maskattn.layers.Residual` (pre- or
post-LayerNorm), with one incremental-decoding cache (:class:`LayerCache`). The defaults that depend on
the kind of layer are in one table, :class:`LayerSettings`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn as nn

from ..errors import ArgumentError, ArgumentTypeError
from ..validation import check_choice, check_positive_int, check_probability, describe, entry_point
from ..attention import AttentionCache, AttentionMaps, CrossAttention, SelfAttention, create_attention
from ..attention.base import check_input, zero_padding
from .recipe import LayerRecipe, canonical_name
from .sublayers import NORMS, FeedForward, Residual, check_norm_eps

__all__ = ["LayerSettings", "ChainLayer", "LayerCache", "EncoderLayer", "MANLayer", "MAN_SUBLAYERS",
           "FFN_WIDTH_FACTORS", "AUTHORS_SETUPS"]

#: FFN width as a multiple of ``d_model``: Transformer layers 4 (Vaswani et al. 2017; MAN Eq. 3 "typically
#: 4 times"), MAN layers 2 (MAN §3.1: "the dimensionality of the inner-layer of the FFN in the MAN layers
#: [is] two times of the dimensionality of the hidden states", which keeps a DMAN → SAN → FFN layer at the
#: parameter count of a Transformer layer).
FFN_WIDTH_FACTORS = {"transformer": 4, "man": 2}

#: The sublayer names of MAN's layer variants (MAN Table 3).
MAN_SUBLAYERS = ("dman", "sman", "san", "ffn")


@dataclass(frozen=True)
class LayerSettings:
    """The settings every layer of a stack shares — the one table of layer defaults.

    ============================  =====================================================================
    ``ffn_dim``                   FFN width; None = ``FFN_WIDTH_FACTORS[kind] · d_model``: 4·d for a layer
                                  written as one attention name (Transformer), 2·d for a ``>`` chain (MAN)
    ``dropout``                   residual dropout (on every sublayer's output)
    ``activation_dropout``        dropout inside the FFN; None = ``dropout``
    ``attention_dropout``         attention-probability dropout of every attention sublayer
    ``norm``                      ``"pre"`` or ``"post"`` LayerNorm
    ``backend``                   backend of every attention sublayer (:mod:`maskattn.backends`)
    ``norm_eps``                  the LayerNorms' epsilon (1e-5, PyTorch's; the authors' TensorFlow MTSA: 1e-6)
    ============================  =====================================================================

    A sublayer's own options (``ffn(dim=…, dropout=…)``, ``dman(dropout=…)``) override these.
    """

    ffn_dim: int | None = None
    dropout: float = 0.0
    activation_dropout: float | None = None
    attention_dropout: float = 0.0
    norm: str = "pre"
    backend: str = "auto"
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.ffn_dim is not None:
            check_positive_int(self.ffn_dim, "ffn_dim")
        check_probability(self.dropout, "dropout")
        if self.activation_dropout is not None:
            check_probability(self.activation_dropout, "activation_dropout")
        check_probability(self.attention_dropout, "attention_dropout")
        check_choice(self.norm, "norm", NORMS)
        check_norm_eps(self.norm_eps)

    def ffn_width(self, d_model: int, kind: str) -> int:
        """The FFN width of a layer of ``kind`` (``"transformer"`` or ``"man"``)."""
        return self.ffn_dim if self.ffn_dim is not None else FFN_WIDTH_FACTORS[kind] * d_model

    @property
    def ffn_dropout(self) -> float:
        return self.dropout if self.activation_dropout is None else self.activation_dropout


@dataclass(frozen=True)
class LayerCache:
    """Incremental-decoding state of a :class:`ChainLayer`, per sublayer in order: an
    :class:`~maskattn.AttentionCache` for self-attention sublayers, the encoder–decoder keys and values
    (computed once per source) for the cross-attention sublayer, None for FFNs; plus the source padding."""

    self_attention: tuple[AttentionCache | None, ...]
    cross: tuple[tuple[torch.Tensor, torch.Tensor] | None, ...]
    memory_padding: torch.Tensor | None = None

    def __len__(self) -> int:
        """Positions decoded so far."""
        return next((len(c) for c in self.self_attention if c is not None), 0)

    def reorder(self, index: torch.Tensor) -> LayerCache:
        """Select / repeat batch rows of every sublayer's state (beam search)."""
        if not isinstance(index, torch.Tensor) or index.dim() != 1 or index.dtype not in (torch.long, torch.int):
            raise ArgumentTypeError(f"index must be a 1-D integer tensor of batch rows, got {describe(index)}")
        return LayerCache(
            tuple(None if c is None else c.reorder(index) for c in self.self_attention),
            tuple(None if kv is None else (kv[0].index_select(0, index), kv[1].index_select(0, index))
                  for kv in self.cross),
            None if self.memory_padding is None else self.memory_padding.index_select(0, index))


def _self_attention(name: str, options: dict, d_model: int, num_heads: int, settings: LayerSettings, causal: bool,
                    where: str) -> SelfAttention:
    """A registered attention module, built causal for a decoder (``mha`` with ``mask="causal"``, ``dman`` /
    ``sman`` / ``man_san`` with ``causal=True``)."""
    name = canonical_name(name)
    options = {"dropout": settings.attention_dropout, "backend": settings.backend, **options}
    if causal:
        fixed = {"mask", "causal"} & set(options)
        if fixed:
            raise ArgumentError(f"decoder layer {where!r}: option(s) {sorted(fixed)} of {name!r} cannot be set; decoder "
                             "self-attention is always causal")
        if name not in ("mha", "dman", "sman", "man_san"):
            raise ArgumentError(f"decoder layer {where!r}: sublayer {name!r} cannot be a decoder self-attention (it must "
                             "be causal and decode incrementally); expected one of mha, san, dman, sman, man_san")
        options.update({"mask": "causal"} if name == "mha" else {"causal": True})
    block = create_attention(name, d_model, num_heads, **options)
    widths = (getattr(block, "d_in", d_model), getattr(block, "d_out", d_model))
    if widths != (d_model, d_model):
        raise ArgumentError(f"layer {where!r}: sublayer {name!r} reads {widths[0]} and writes {widths[1]} features, but "
                            f"a residual sublayer must keep the layer's width {d_model}; leave d_in / d_out unset in a "
                            "layer")
    if causal and getattr(block, "radius", None) == "sqrt":
        raise ArgumentError(f"decoder layer {where!r}: sman(radius='sqrt') depends on the whole target length and cannot be decoded "
                         "incrementally; use a fixed radius such as sman(radius=4)")
    return block


class ChainLayer(nn.Module):
    """A layer: ``sublayers`` in order, each ``x + dropout(f(LN(x)))`` (pre-LN) or ``LN(x + dropout(f(x)))``
    (post-LN); outputs at padded positions are 0.

    Args:
        d_model, num_heads: widths shared by the sublayers.
        sublayers: ``(name, options)`` pairs: a registered attention name (or ``san``), ``ffn`` (options
            ``dim``, ``dropout``, ``activation``, ``layers``, ``input_dropout``) or ``cross`` (encoder–decoder
            attention; a decoder layer; options ``activation``, ``activation_dropout``, ``bias``).
        settings: the stack's :class:`LayerSettings`.
        kind: ``"transformer"`` or ``"man"`` — selects the FFN width default (:data:`FFN_WIDTH_FACTORS`).
        causal: every self-attention sublayer is causal (a decoder layer); enables :meth:`step`.

    ``forward(x, key_padding_mask=None, memory=None, memory_padding=None)``: ``memory`` ``(B, S, d)`` is the
    encoder output that ``cross`` sublayers attend to. Incremental decoding: ``cache = layer.init_cache(memory,
    memory_padding)``, then ``out, cache = layer.step(x_new, cache)``.
    """

    def __init__(self, d_model: int, num_heads: int, sublayers: Sequence[tuple[str, dict]], settings: LayerSettings
                 | None = None, *, kind: str = "man", causal: bool = False):
        super().__init__()
        settings = LayerSettings() if settings is None else settings
        check_positive_int(d_model, "d_model")
        check_choice(kind, "kind", tuple(FFN_WIDTH_FACTORS))
        if isinstance(sublayers, str) or not isinstance(sublayers, Sequence) or not sublayers:
            raise ArgumentTypeError(f"sublayers must be a non-empty list of (name, options) pairs, got {describe(sublayers)}")
        self.d_model, self.kind, self.causal = d_model, kind, bool(causal)
        self.names: list[str] = []
        where = ">".join(name for name, _ in sublayers if name != "cross")
        blocks: list[nn.Module] = []
        for i, pair in enumerate(sublayers):
            if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str) and isinstance(pair[1], dict)):
                raise ArgumentTypeError(f"sublayers[{i}] must be a (name, options) pair, got {describe(pair)}")
            name, options = pair
            if name == "ffn":
                options = dict(options)
                one_map = options.get("layers") == 1  # act(W x): d_model wide (the authors' stacked MTSA)
                width = options.pop("dim", d_model if one_map else settings.ffn_width(d_model, kind))
                blocks.append(FeedForward(d_model, width, dropout=options.pop("dropout", settings.ffn_dropout),
                                          **options))
            elif name == "cross":
                blocks.append(CrossAttention(d_model, num_heads, **{"dropout": settings.attention_dropout,
                                                                     "backend": settings.backend, **options}))
            else:
                blocks.append(_self_attention(name, options, d_model, num_heads, settings, self.causal, where))
            self.names.append(name)
        self.sublayers = nn.ModuleList(blocks)
        self.residuals = nn.ModuleList(Residual(d_model, norm=settings.norm, dropout=settings.dropout,
                                                norm_eps=settings.norm_eps) for _ in blocks)

    @classmethod
    def from_recipe(cls, d_model: int, num_heads: int, layer: LayerRecipe, settings: LayerSettings | None = None, *,
                    ffn: bool = True, decoder: bool = False) -> ChainLayer:
        """The layer of one :class:`~maskattn.layers.LayerRecipe`: a single attention name is a Transformer
        layer (attention → FFN, or the attention alone with ``ffn=False``); a ``>`` chain is exactly its
        sublayers (a MAN layer). ``decoder``: causal self-attention, with the encoder–decoder attention inserted
        after the last self-attention sublayer (``"dman>san>ffn"`` → DMAN → SAN → cross → FFN)."""
        sublayers = list(layer.sublayers)
        if not layer.chain and (ffn or decoder):
            sublayers.append(("ffn", {}))
        has_cross = any(name == "cross" for name, _ in sublayers)
        if decoder:
            attention_at = [i for i, (name, _) in enumerate(sublayers) if name not in ("ffn", "cross")]
            if not attention_at:
                raise ArgumentError(f"decoder layer {str(layer)!r} has no self-attention sublayer; add one of mha, san, "
                                 "dman, sman")
            if not has_cross:  # a recipe may place (and configure) it itself: "dman>san>cross(activation=gelu)>ffn"
                sublayers.insert(attention_at[-1] + 1, ("cross", {}))
        elif has_cross:
            raise ArgumentError(f"layer {str(layer)!r}: 'cross' is the encoder-decoder attention of a decoder layer; an "
                                "encoder layer has none")
        return cls(d_model, num_heads, sublayers, settings, kind="man" if layer.chain else "transformer",
                   causal=decoder)

    @property
    def order(self) -> tuple[str, ...]:
        """The sublayer names, in order."""
        return tuple(self.names)

    def extra_repr(self) -> str:
        return f"{' -> '.join(name.upper() for name in self.names)}, causal={self.causal}"

    def attention_sublayers(self) -> dict[str, SelfAttention]:
        """The self-attention sublayers keyed ``"<position>:<name>"`` (e.g. ``"0:dman"``, ``"1:san"``)."""
        return {f"{i}:{name}": block for i, (name, block) in enumerate(zip(self.names, self.sublayers))
                if isinstance(block, SelfAttention)}  # not ffn, not cross

    @entry_point
    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None,
                memory: torch.Tensor | None = None, memory_padding: torch.Tensor | None = None) -> torch.Tensor:
        kpm = check_input(x, self.d_model, key_padding_mask, module=self)
        if "cross" in self.names and memory is None:
            raise ArgumentError("this layer has an encoder-decoder attention sublayer; pass memory=encoder output")
        for name, block, residual in zip(self.names, self.sublayers, self.residuals):
            if name == "ffn":
                x = residual(x, block)
            elif name == "cross":
                x = residual(x, lambda h, block=block: block(h, block.memory_kv(memory), memory_padding))
            else:
                x = residual(x, lambda h, block=block: block(h, key_padding_mask=kpm))
        return zero_padding(x, kpm)

    @entry_point
    def attention_maps(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None,
                       memory: torch.Tensor | None = None,
                       memory_padding: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, AttentionMaps]]:
        """``(out, maps)``: this layer's output and, per self-attention sublayer (keys of
        :meth:`attention_sublayers`), its :class:`~maskattn.AttentionMaps` on the input it receives."""
        maps: dict[str, AttentionMaps] = {}
        handles = [block.register_forward_hook(
            lambda module, args, kwargs, out, key=key: maps.__setitem__(key, module.attention_maps(*args, **kwargs)),
            with_kwargs=True) for key, block in self.attention_sublayers().items()]
        try:
            out = self(x, key_padding_mask, memory, memory_padding)
        finally:
            for handle in handles:
                handle.remove()
        return out, maps

    def init_cache(self, memory: torch.Tensor | None = None, memory_padding: torch.Tensor | None = None) -> LayerCache:
        """An empty incremental-decoding cache (a causal layer); ``memory`` / ``memory_padding`` are the encoder
        output and its padding when the layer has an encoder–decoder attention sublayer."""
        if not self.causal:
            raise ArgumentError("init_cache needs a causal layer (a decoder layer, or MANLayer(causal=True))")
        if "cross" in self.names and memory is None:
            raise ArgumentError("this layer has an encoder-decoder attention sublayer; pass memory=encoder output")
        return LayerCache(
            tuple(block.init_cache() if isinstance(block, SelfAttention) else None for block in self.sublayers),
            tuple(block.memory_kv(memory) if isinstance(block, CrossAttention) and memory is not None else None
                  for block in self.sublayers),
            memory_padding)

    @entry_point
    def step(self, x: torch.Tensor, cache: LayerCache,
             key_padding_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, LayerCache]:
        """One incremental-decoding step: ``x`` ``(B, n_new, d)`` holds the new positions; returns ``(out, new
        cache)``, equal to the full causal forward's outputs at those positions."""
        if not isinstance(cache, LayerCache) or len(cache.self_attention) != len(self.names):
            raise ArgumentTypeError(f"cache must be a LayerCache from this layer's init_cache() ({len(self.names)} "
                            f"sublayers), got {describe(cache)}")
        kpm = check_input(x, self.d_model, key_padding_mask, module=self)
        caches = list(cache.self_attention)
        for i, (name, block, residual) in enumerate(zip(self.names, self.sublayers, self.residuals)):
            if name == "ffn":
                x = residual(x, block)
            elif name == "cross":
                x = residual(x, lambda h, block=block, kv=cache.cross[i]: block(h, kv, cache.memory_padding))
            else:
                def attend(h, block=block, i=i):
                    out, caches[i] = block.step(h, caches[i], key_padding_mask=kpm)
                    return out

                x = residual(x, attend)
        return zero_padding(x, kpm), LayerCache(tuple(caches), cache.cross, cache.memory_padding)


class EncoderLayer(ChainLayer):
    """A Transformer encoder layer: one registered self-attention sublayer, then a feed-forward sublayer
    (``ffn_dim`` default ``4·d_model``)."""

    def __init__(self, d_model: int, num_heads: int, *, attention: str = "mha", attention_options: dict | None = None,
                 ffn_dim: int | None = None, dropout: float = 0.0, norm: str = "pre"):
        super().__init__(d_model, num_heads, [(attention, dict(attention_options or {})), ("ffn", {})],
                         LayerSettings(ffn_dim=ffn_dim, dropout=dropout, norm=norm), kind="transformer")

    @property
    def attention(self) -> nn.Module:
        return self.sublayers[0]


class MANLayer(ChainLayer):
    """A Mask Attention Networks layer (MAN §2.5, Fig. 2): sublayers in ``order``, FFN width ``2·d_model``
    (MAN §3.1). ``order`` elements: ``"dman"`` (:class:`~maskattn.DynamicMaskAttention`, Eq. 12), ``"sman"``
    (:class:`~maskattn.StaticMaskAttention`, Eq. 11), ``"san"`` (:class:`~maskattn.MultiHeadAttention`, the
    all-ones mask) and ``"ffn"`` (:class:`~maskattn.layers.FeedForward`, the identity mask, Eq. 9). The default
    is the paper's DMAN → SAN → FFN; MAN Table 3's variants are e.g. ``("ffn", "san", "ffn")``,
    ``("san", "san", "ffn")``, ``("dman", "dman", "ffn")``, ``("san", "dman", "ffn")``.

    A thin constructor of :class:`ChainLayer` (the recipe ``"dman>san>ffn"`` builds the same layer).

    Args:
        d_model, num_heads: width and heads. ffn_dim: FFN width (default ``2·d_model``).
        norm: ``"pre"`` (authors' translation setups) or ``"post"``. dropout: residual dropout.
        attention_dropout: attention-probability dropout. activation_dropout: dropout inside the FFN
            (default: ``dropout``, as every layer of the library).
        causal: decoder layer (every attention sublayer causal); enables :meth:`step`.
        backend: attention backend for every attention sublayer.
        dman_options / sman_options: extra options, e.g. ``{"max_distance": 64, "activation": "relu"}``
            or ``{"radius": "sqrt"}``.
        san_options: when given, SAN is MAN's all-ones mask attention (``"man_san"``,
            :class:`~maskattn.attention.man.FullMaskAttention`) with these options — ``{"activation": "relu"}``
            is the authors' SAN sublayer (Eq. 5's ``F``); None keeps :class:`~maskattn.MultiHeadAttention`.
            With ``causal=True`` it is the causal ``man_san`` of the authors' decoder layers.
        ffn_options: options of the FFN sublayer, e.g. ``{"activation": "gelu"}``.
        cross_options: a decoder layer's encoder–decoder attention (:class:`~maskattn.CrossAttention`), inserted
            after the last attention sublayer, with these options — ``{"activation": "relu"}`` is the authors'
            (their decoder's ``encoder_attn`` is a ``MultiheadAttention2`` too); needs ``causal=True``. None: no
            encoder–decoder attention.
        norm_eps: the LayerNorms' epsilon (1e-5).

    ``MANLayer.authors_config(setup)`` builds the layer of the authors' translation setups (:data:`AUTHORS_SETUPS`).
    """

    def __init__(self, d_model: int, num_heads: int, *, ffn_dim: int | None = None,
                 order: Sequence[str] = ("dman", "san", "ffn"), norm: str = "pre", dropout: float = 0.0,
                 attention_dropout: float = 0.0, activation_dropout: float | None = None, causal: bool = False,
                 backend: str = "auto", dman_options: dict | None = None, sman_options: dict | None = None,
                 san_options: dict | None = None, ffn_options: dict | None = None, cross_options: dict | None = None,
                 norm_eps: float = 1e-5):
        if isinstance(order, str) or not isinstance(order, Sequence) or not order:
            raise ArgumentError(f"order must be a non-empty sequence of sublayer names from {MAN_SUBLAYERS}, got "
                             f"{order!r}")
        for i, kind in enumerate(order):
            if kind not in MAN_SUBLAYERS:
                raise ArgumentError(f"unknown order element {kind!r} at position {i} of {tuple(order)!r}; expected one "
                                 f"of {', '.join(repr(k) for k in MAN_SUBLAYERS)}")
        if cross_options is not None and not causal:
            raise ArgumentError(f"cross_options={cross_options!r} adds an encoder-decoder attention, which only a decoder "
                                "layer has; pass causal=True or cross_options=None")
        options = {"dman": dict(dman_options or {}), "sman": dict(sman_options or {}), "san": dict(san_options or {}),
                   "ffn": dict(ffn_options or {})}
        names = {"san": "man_san"} if san_options is not None else {}
        sublayers = [(names.get(kind, kind), options.get(kind, {})) for kind in order]
        if cross_options is not None:
            attention_at = [i for i, kind in enumerate(order) if kind != "ffn"]
            if not attention_at:
                raise ArgumentError(f"cross_options needs a self-attention sublayer in front of it; order {tuple(order)!r} "
                                    "has none")
            sublayers.insert(attention_at[-1] + 1, ("cross", dict(cross_options)))
        settings = LayerSettings(ffn_dim=ffn_dim, dropout=dropout, activation_dropout=activation_dropout,
                                 attention_dropout=attention_dropout, norm=norm, backend=backend, norm_eps=norm_eps)
        super().__init__(d_model, num_heads, sublayers, settings, kind="man", causal=causal)

    @classmethod
    def authors_config(cls, setup: str = "iwslt", **overrides) -> MANLayer:
        """The layer of one of the authors' setups (:data:`AUTHORS_SETUPS`): the translation encoder layers
        ``"iwslt"``, ``"wmt_base"``, ``"wmt_big"`` and the summarization model's (``man_base``) encoder and decoder
        layers ``"summarization"``, ``"summarization_decoder"``, with every setting of their architecture and
        training script; ``overrides`` replace any constructor argument."""
        if not isinstance(setup, str) or setup not in AUTHORS_SETUPS:
            raise ArgumentError(f"unknown setup {setup!r}; expected one of {', '.join(map(repr, AUTHORS_SETUPS))}")
        return cls(**{**AUTHORS_SETUPS[setup], **overrides})

    @classmethod
    def authors_recipe(cls, setup: str) -> str:
        """The layer recipe (:func:`~maskattn.layers.parse_recipe`) of :meth:`authors_config`'s sublayers with their
        options, e.g. ``"dman(activation=gelu, …)>man_san(…)>ffn(activation=gelu)"`` — what a model configuration
        writes to build the authors' layers in a stack; the layer-wide settings (widths, norm, dropouts) are the
        stack's (:class:`LayerSettings`)."""
        if not isinstance(setup, str) or setup not in AUTHORS_SETUPS:
            raise ArgumentError(f"unknown setup {setup!r}; expected one of {', '.join(map(repr, AUTHORS_SETUPS))}")
        config = cast(dict[str, Any], AUTHORS_SETUPS[setup])
        options = {kind: config.get(f"{kind}_options") for kind in ("dman", "sman", "san", "ffn")}
        sublayers = [("man_san" if kind == "san" and options["san"] is not None else kind, dict(options[kind] or {}))
                     for kind in config.get("order", ("dman", "san", "ffn"))]
        if config.get("cross_options") is not None:
            last = max(i for i, (name, _) in enumerate(sublayers) if name != "ffn")
            sublayers.insert(last + 1, ("cross", dict(config["cross_options"])))
        return str(LayerRecipe(tuple(sublayers), chain=True))


#: The authors' DMAN and SAN (LibertFan/MAN ``translation/fairseq/modules/multihead_attention2.py``): ReLU before
#: the output projection (line 249), ``P[0] ≡ 0`` (lines 100–101), ``M`` clamped at 1e-10 before the log
#: (line 122), a distance table as long as ``max_source_positions`` (1024, ``models/man.py`` lines 114–115).
_AUTHORS_ATTENTION = {"dman_options": {"activation": "relu", "self_distance": "zero", "mask_floor": 1e-10,
                                       "max_distance": 1024},
                      "san_options": {"activation": "relu"}}

#: MANLayer settings of the authors' translation setups (``models/man.py``: ``man_iwslt_de_en`` lines 821–839,
#: ``man_wmt_en_de_base`` 842–855, ``man_wmt_en_de_big`` 858–871; the residual dropout of the first two from
#: ``translation-scripts/train/train-iwslt.sh`` / ``train-wmt-base.sh``, ``--dropout 0.3`` / ``0.1``).
AUTHORS_SETUPS: dict[str, dict[str, object]] = {
    "iwslt": {"d_model": 512, "num_heads": 4, "ffn_dim": 512, "norm": "pre", "dropout": 0.3, "attention_dropout": 0.1,
              "activation_dropout": 0.1, **_AUTHORS_ATTENTION},
    "wmt_base": {"d_model": 512, "num_heads": 8, "ffn_dim": 1024, "norm": "pre", "dropout": 0.1,
                 "attention_dropout": 0.1, "activation_dropout": 0.1, **_AUTHORS_ATTENTION},
    "wmt_big": {"d_model": 1024, "num_heads": 16, "ffn_dim": 2048, "norm": "pre", "dropout": 0.3,
                "attention_dropout": 0.1, "activation_dropout": 0.1, **_AUTHORS_ATTENTION},
}

#: The attentions of the authors' summarization model (LibertFan/MAN ``summarization/model/multihead_attention2.py``,
#: built by ``summarization/model/man.py`` with ``man_base``'s ``activation_fn='gelu'`` and ``activation_dropout=0.1``,
#: lines 204–230 and 762–783): ``F`` = GELU followed by dropout 0.1 before ``out_proj`` (lines 294–296), and DMAN's
#: clamp on ``M`` divided by its row maximum (line 144); tables of ``--max-source-positions`` /
#: ``--max-target-positions`` = 512 entries (``scripts/summarization/train/train-man-base-cnndm.sh``).
_SUMMARIZATION_ATTENTION = {"activation": "gelu", "activation_dropout": 0.1}

#: ``man_base`` (``summarization/model/man.py`` lines 762–783) with the training script's dropouts: d 768, 12 heads,
#: FFN 1536 with GELU, post-LN (``MANEncoderLayer.forward``: ``LN(x + dropout(f(x)))``, lines 240–292), residual,
#: attention and FFN-inner dropout 0.1; every layer mixed (DMAN → SAN → FFN, ``encoder_mix_layers = 6``).
_SUMMARIZATION = {"d_model": 768, "num_heads": 12, "ffn_dim": 1536, "norm": "post", "dropout": 0.1,
                  "attention_dropout": 0.1, "activation_dropout": 0.1, "ffn_options": {"activation": "gelu"},
                  "dman_options": {**_SUMMARIZATION_ATTENTION, "self_distance": "zero", "mask_floor": 1e-10,
                                   "mask_floor_mode": "row_max", "max_distance": 512},
                  "san_options": dict(_SUMMARIZATION_ATTENTION)}

AUTHORS_SETUPS["summarization"] = _SUMMARIZATION
#: ``MANDecoderLayer`` (lines 296–465): causal DMAN → causal SAN → encoder–decoder attention → FFN, every attention a
#: ``MultiheadAttention2`` with GELU and its dropout.
AUTHORS_SETUPS["summarization_decoder"] = {**_SUMMARIZATION, "causal": True,
                                           "cross_options": dict(_SUMMARIZATION_ATTENTION)}
