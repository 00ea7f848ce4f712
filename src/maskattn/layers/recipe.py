"""Layer recipes: a readable string (or a YAML list of its comma-separated groups) that says which sublayers
each layer of a stack has, parsed by :func:`parse_recipe`::

    recipe    := group ("," group)*            e.g.  "csan2d x3, mha x3"
    group     := layer ["x" INT]               a layer repeated INT times (default 1)
    layer     := sublayer (">" sublayer)*      e.g.  "dman>san>ffn" — exactly these sublayers, in order
    sublayer  := NAME ["(" key=value, ... ")"] e.g.  "csan1d(window=5)", "ffn(dim=512)"

``NAME`` is a registered attention (:func:`maskattn.list_attentions`), ``san`` (plain multi-head attention,
MAN's name for it), ``ffn`` or — in a decoder layer, to give it options or a place — ``cross`` (the
encoder–decoder attention, which a decoder layer otherwise gets after its last self-attention sublayer). A layer written as a single attention name is a Transformer layer
(attention → FFN); a ``>`` chain is a MAN-style layer of exactly the listed sublayers (the defaults that
differ between the two are in :class:`maskattn.layers.LayerSettings`). Option values are YAML scalars or flow
lists: ``mtsa(head_masks=[forward, backward, window:2, full])``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import yaml

from ..errors import ArgumentError, ArgumentTypeError
from ..sections import parse_yaml, shown
from ..validation import describe
from ..attention.registry import list_attentions

__all__ = ["LayerRecipe", "parse_recipe", "recipe_runs", "recipe_string", "SAN_ALIAS", "canonical_name",
           "option_text", "MAX_LAYERS"]

#: the most layers a recipe may hold ("mtsa x 100000" would build that many modules before any memory check)
MAX_LAYERS = 1000

#: MAN's name for plain multi-head attention.
SAN_ALIAS = {"san": "mha"}


def canonical_name(name: str) -> str:
    """The registry name of a sublayer name (``san`` → ``mha``)."""
    return SAN_ALIAS.get(name, name)

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
            return name + (f"({', '.join(f'{k}={option_text(v)}' for k, v in options.items())})" if options else "")
        return ">".join(one(n, o) for n, o in self.sublayers)


def option_text(value) -> str:
    """An option value as recipe text that :func:`parse_recipe` reads back as the same value (a float in YAML's
    spelling: ``1.0e-10``, which YAML 1.1 reads as a number where ``1e-10`` would be a string)."""
    if isinstance(value, float):
        return yaml.safe_dump(value).split("\n")[0]
    return str(value)


def _split_top(text: str, sep: str) -> list[str]:
    """Split on ``sep`` outside parentheses / brackets."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if depth < 0:
            raise ArgumentError(f"unbalanced brackets in recipe {text!r}")
        if ch == sep and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    if depth:
        raise ArgumentError(f"unbalanced brackets in recipe {text!r}")
    return parts + [current]


def _parse_options(text: str, where: str) -> dict:
    options: dict[str, object] = {}
    for item in _split_top(text, ","):
        if not item.strip():
            continue
        if "=" not in item:
            raise ArgumentError(f"{where}: option {item.strip()!r} must be written key=value")
        key, value = (t.strip() for t in item.split("=", 1))
        if not key.isidentifier():
            raise ArgumentError(f"{where}: option name {key!r} is not an identifier")
        if key in options:
            raise ArgumentError(f"{where}: option {key} is given twice ({key}={shown(options[key])}, {key}={value}); "
                                "give it once")
        options[key] = parse_yaml(value, f"{where}: option {key}={value}", ArgumentError) if value else None
    return options


def _check_sublayer(name: str, where: str) -> str:
    valid = ["ffn", "san", *list_attentions(), "cross"]
    if name not in valid:
        raise ArgumentError(f"{where}: unknown sublayer {name!r}; expected one of {', '.join(valid)}")
    return name


def parse_recipe(recipe: str | Sequence[str] | Sequence[LayerRecipe]) -> list[LayerRecipe]:
    """Parse a recipe (grammar in the module docstring) into one :class:`LayerRecipe` per layer,
    bottom first. ``recipe`` may be a string or a list of groups (e.g. from YAML); a list of
    :class:`LayerRecipe` (already parsed) is returned as it is."""
    if isinstance(recipe, Sequence) and recipe and all(isinstance(g, LayerRecipe) for g in recipe):
        return [g for g in recipe if isinstance(g, LayerRecipe)]
    if isinstance(recipe, str):
        groups = _split_top(recipe, ",")
    elif isinstance(recipe, Sequence) and recipe and all(isinstance(g, str) for g in recipe):
        groups = [g for g in recipe if isinstance(g, str)]
    else:
        raise ArgumentTypeError(f"recipe must be a string such as 'mtsa x2' or a non-empty list of such strings, "
                        f"got {describe(recipe)}")
    layers: list[LayerRecipe] = []
    for group in groups:
        group = group.strip()
        if not group:
            raise ArgumentError(f"empty layer group in recipe {recipe!r}")
        match = _REPEAT.match(group)
        if match is None:
            raise ArgumentError(f"recipe group {group!r} is not 'LAYER' or 'LAYER * N'")
        body, times = match["layer"].strip(), int(match["times"] or 1)
        if not 1 <= times <= MAX_LAYERS - len(layers):
            raise ArgumentError(f"recipe group {group!r}: repeat count must be in [1, {MAX_LAYERS - len(layers)}] (a "
                                f"recipe holds at most {MAX_LAYERS} layers), got {times}")
        sublayers = []
        for part in _split_top(body, ">"):
            m = _SUBLAYER.match(part.strip())
            if not m:
                raise ArgumentError(f"recipe group {group!r}: cannot parse sublayer {part.strip()!r}; expected "
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
