"""The attention maps of a trained model for one sentence: load a checkpoint (classifier or translation,
through :mod:`.sources`), encode the sentence as training did, run the attention encoder once and keep every
attention sublayer's maps (the modules' own :meth:`~maskattn.SelfAttention.attention_maps`, through
:meth:`maskattn.Encoder.attention_maps`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from ..errors import ArgumentError, ArgumentTypeError
from ..validation import describe
from ..attention import AttentionMaps, SelfAttention, list_attentions
from ..inference import LoadedModel, Translator
from ..layers import SAN_ALIAS
from .sources import MapSource, load_for_maps

__all__ = ["Sublayer", "SentenceMaps", "sentence_maps", "mechanism_names", "find_sublayers", "check_layers"]


def mechanism_names() -> list[str]:
    """Names accepted as ``mechanism``: the registered attentions, ``san`` (= ``mha``) and ``pool`` (the
    sentence's source2token pooling)."""
    return [*list_attentions(), "san", "pool"]


def _kind(name: str) -> str:
    """``san`` and ``mha`` are the same mechanism (MAN's name for plain multi-head attention)."""
    return SAN_ALIAS.get(name, name)


@dataclass(frozen=True)
class Sublayer:
    """One attention sublayer of a sentence's forward pass: encoder ``layer`` (1-based), its key in the
    layer (``"0:dman"``), the mechanism ``name``, the module and its maps (batch dimension removed)."""

    layer: int
    key: str
    name: str
    module: nn.Module
    maps: AttentionMaps


@dataclass
class SentenceMaps:
    """The attention maps of one sentence through a model's encoder.

    ``tokens``: the sentence as the model read it, a label per position (classifiers: whitespace tokens,
    lowercased when training was; translation: subword pieces and ``</s>``); ``unknown``: positions of
    tokens outside the vocabulary (read as ``<unk>``); ``layers``: per encoder
    layer, bottom first, ``{key: maps}`` with the batch dimension removed; ``modules``: the matching
    attention modules; ``layer_names``: the recipe of each layer; ``pool``: the source2token pooling
    weights ``(n, d)`` or ``None``.
    """

    tokens: tuple[str, ...]
    unknown: tuple[int, ...]
    layers: list[dict[str, AttentionMaps]]
    modules: list[dict[str, SelfAttention]]
    layer_names: list[str]
    pool: torch.Tensor | None

    def select(self, layers: Sequence[int] | None = None, mechanism: str | None = None) -> list[Sublayer]:
        """The attention sublayers of ``layers`` (1-based, default all) whose mechanism is ``mechanism``
        (see :func:`find_sublayers`), bottom first, with their maps."""
        return [Sublayer(layer, key, key.split(":", 1)[1], self.modules[layer - 1][key], self.layers[layer - 1][key])
                for layer, key in find_sublayers(self.modules, self.layer_names, layers, mechanism)]


def describe_layers(layer_names: Sequence[str]) -> str:
    return ", ".join(f"{i}: {name}" for i, name in enumerate(layer_names, start=1))


def check_layers(layers: Sequence[int] | None, layer_names: Sequence[str]) -> list[int]:
    """``layers`` (1-based) checked against the encoder's depth; ``None`` = every layer."""
    count = len(layer_names)
    if layers is None:
        return list(range(1, count + 1))
    if isinstance(layers, (str, int)) or not isinstance(layers, Sequence) or not layers:
        raise ArgumentTypeError(f"layers must be a non-empty list of 1-based layer indices, got {describe(layers)}")
    for layer in layers:
        if isinstance(layer, bool) or not isinstance(layer, int) or not 1 <= layer <= count:
            raise ArgumentError(f"layer {layer!r} is out of range: the encoder has {count} layer{'s' if count > 1 else ''} "
                             f"(1..{count}; {describe_layers(layer_names)})")
    return list(layers)


def find_sublayers(modules: Sequence[Mapping[str, nn.Module]], layer_names: Sequence[str],
                   layers: Sequence[int] | None = None, mechanism: str | None = None) -> list[tuple[int, str]]:
    """``(layer, key)`` of the attention sublayers (``modules`` as :meth:`maskattn.Encoder.attention_sublayers`)
    in ``layers`` (1-based, default all) whose mechanism is ``mechanism`` (a registered name or ``san``;
    default any), bottom first. ``ValueError`` for an unknown mechanism, a layer out of range, or when
    nothing matches."""
    chosen = check_layers(layers, layer_names)
    if mechanism is not None and mechanism not in mechanism_names():
        raise ArgumentError(f"unknown mechanism {mechanism!r}; expected one of {', '.join(mechanism_names())}")
    found = [(layer, key) for layer in chosen for key in modules[layer - 1]
             if mechanism is None or _kind(key.split(":", 1)[1]) == _kind(mechanism)]
    if not found:
        where = "the encoder" if layers is None else f"layer{'s' if len(chosen) > 1 else ''} {', '.join(map(str, chosen))}"
        what = "attention sublayers" if mechanism is None else f"{mechanism!r} sublayers"
        raise ArgumentError(f"{where} has no {what}; the encoder layers are {describe_layers(layer_names)}")
    return found


def sentence_maps(checkpoint: str | Path | LoadedModel | Translator | MapSource, sentence: str, *,
                  device: str = "cpu") -> SentenceMaps:
    """Run ``sentence`` through the encoder of ``checkpoint`` (see :func:`load_for_maps`) once, in evaluation
    mode, and return every attention sublayer's maps and the pooling weights. The sentence is encoded as the
    model was trained (:meth:`MapSource.encode`); an empty or over-long one raises ``ValueError``."""
    source = load_for_maps(checkpoint, device=device)
    encoded = source.encode(sentence)
    layers, pool, _ = source.maps([encoded.ids])
    return SentenceMaps(
        tokens=encoded.tokens,
        unknown=encoded.unknown,
        layers=[{key: maps.apply(lambda m: m[0].cpu()) for key, maps in layer.items()} for layer in layers],
        modules=source.stack.attention_sublayers(),
        layer_names=list(source.stack.layer_names),
        pool=None if pool is None else pool[0].cpu(),
    )
