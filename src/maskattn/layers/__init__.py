"""Layers and stacks: the one layer chain (:class:`ChainLayer`), its sublayers, the recipe grammar, positional
encodings, and the encoder / decoder stacks.

* :mod:`.sublayers`  — :class:`FeedForward`, :class:`Residual`.
* :mod:`.chain`      — :class:`ChainLayer` (every layer), :class:`LayerSettings` (the defaults table),
  :class:`LayerCache`, and the thin constructors :class:`EncoderLayer`, :class:`MANLayer`.
* :mod:`.recipe`     — the layer-recipe grammar (``"dman>san>ffn x6"``).
* :mod:`.positional` — sinusoidal / learned positions.
* :mod:`.stacks`     — :class:`Encoder`, :class:`Decoder`, :func:`csan_encoder`.
"""

from .sublayers import FFN_ACTIVATIONS, NORMS, FeedForward, Residual
from .recipe import SAN_ALIAS, LayerRecipe, canonical_name, parse_recipe, recipe_runs, recipe_string
from .chain import FFN_WIDTH_FACTORS, MAN_SUBLAYERS, ChainLayer, EncoderLayer, LayerCache, LayerSettings, MANLayer
from .positional import POSITIONAL, PositionalEncoding
from .stacks import Decoder, Encoder, LayerSpec, csan_encoder

__all__ = [
    "FeedForward", "Residual", "NORMS", "FFN_ACTIVATIONS",
    "LayerRecipe", "parse_recipe", "recipe_runs", "recipe_string", "SAN_ALIAS", "canonical_name",
    "ChainLayer", "LayerSettings", "LayerCache", "EncoderLayer", "MANLayer", "MAN_SUBLAYERS", "FFN_WIDTH_FACTORS",
    "PositionalEncoding", "POSITIONAL",
    "Encoder", "Decoder", "csan_encoder", "LayerSpec",
]
