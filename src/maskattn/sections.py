"""Configuration sections as dataclasses: building them from dicts (YAML, ``--set``) and checking every value.

Each section class (:class:`~maskattn.data.DataConfig`, :class:`~maskattn.models.ModelConfig`,
``OptimConfig``, ``TrainConfig``) declares its allowed values in one place, a ``RULES`` mapping from key to
:class:`Rule`, and calls :func:`check_section` from ``__post_init__``, so a section cannot be built with a value
outside its range, whether it comes from a file, a ``--set`` flag or Python. :func:`from_dict` first checks
the keys and the types (an unknown key fails with the list of valid keys). Every failure is a
:class:`~maskattn.errors.ConfigError` naming ``section.key``, the allowed values and the value received.

Every YAML text maskattn reads — config files, ``--set`` values, recipe options, grid variants (``--variants``
files and ``--variant`` settings), ``range(...)`` sweeps, the ``config.yaml`` of run folders — goes through
:func:`parse_yaml` (a file: :func:`maskattn.data.text.read_yaml`); nothing else in maskattn calls ``yaml.safe_load``. A syntax error,
nesting deeper than Python's recursion, a number it cannot convert, a text longer than :data:`MAX_YAML_BYTES` and
aliases that expand past :data:`MAX_YAML_NODES` values (a "billion laughs" text of a few hundred bytes) are one
error naming where the text came from, raised within a fraction of a second — never a traceback or a machine's
memory.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import TypeGuard
from dataclasses import dataclass, fields

import reprlib

import yaml

from .errors import ConfigError, warn_renamed

__all__ = ["Rule", "at_least", "positive", "in_range", "one_of", "optional", "pair", "check_section", "from_dict",
           "parse_yaml", "shown", "is_sections", "MAX_YAML_NODES", "MAX_YAML_BYTES"]

#: the most values (scalars, lists, mappings, counted as expanded by aliases) one YAML text may hold
MAX_YAML_NODES = 100_000
#: the longest YAML text read (characters; a run configuration is a few KiB)
MAX_YAML_BYTES = 2**20

_SHOWN = reprlib.Repr()
_SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlist, _SHOWN.maxdict, _SHOWN.maxlevel = 80, 80, 8, 8, 3


def is_sections(value: object) -> bool:
    """Is ``value`` shaped like a run configuration read back from a file: a mapping of section mappings?"""
    return isinstance(value, dict) and all(isinstance(section, dict) for section in value.values())


def shown(value: object) -> str:
    """``repr(value)``, abridged (``…``) for messages: a hostile value never makes a message of megabytes."""
    return _SHOWN.repr(value)


def parse_yaml(text: str, where: str, error: type[Exception] = ConfigError) -> object:
    """The value of the YAML ``text`` (``yaml.safe_load``: plain data, no Python objects), or ``error`` naming
    ``where`` (and the line, for a text of several lines) and what is wrong (module docstring)."""
    if len(text) > MAX_YAML_BYTES:
        raise error(f"{where}: YAML of {len(text):,} characters, more than the {MAX_YAML_BYTES:,} maskattn reads "
                    "(a configuration is a few KiB); is it the right file?")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"{where}:{mark.line + 1}" if mark is not None and "\n" in text else where
        raise error(f"{at}: not valid YAML ({getattr(exc, 'problem', None) or exc})") from None
    except RecursionError:
        raise error(f"{where}: YAML nested too deeply to read") from None
    except (ValueError, OverflowError) as exc:  # e.g. an integer of more digits than Python converts
        raise error(f"{where}: a YAML value maskattn cannot read ({exc})") from None
    count, stack = 0, [data]
    while stack:  # counted as expanded: aliases repeat a node wherever they point at it
        node = stack.pop()
        count += 1
        if count > MAX_YAML_NODES:
            raise error(f"{where}: YAML with more than {MAX_YAML_NODES} values (counting every alias as what it "
                        "expands to); not a configuration maskattn reads")
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return data


@dataclass(frozen=True)
class Rule:
    """An allowed set of values: ``accepts(value)`` and its description for messages (``"an int >= 1"``,
    ``"in [0, 1)"``), which completes "``section.key`` must be …"; ``explain`` replaces that message."""

    accepts: Callable[[object], bool]
    description: str
    explain: Callable[[str, object], str] | None = None

    def message(self, name: str, value) -> str:
        """Why ``value`` is not allowed for the key ``name``."""
        return self.explain(name, value) if self.explain else f"{name} must be {self.description}, got {shown(value)}"


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def at_least(low: float, *, integer: bool = True) -> Rule:
    """An int (or, with ``integer=False``, a finite number) ``>= low``."""
    if integer:
        return Rule(lambda v: _is_int(v) and v >= low, f"an int >= {low:g}")
    return Rule(lambda v: _is_number(v) and v >= low, f"a number >= {low:g}")


def positive() -> Rule:
    """A finite number ``> 0``."""
    return Rule(lambda v: _is_number(v) and v > 0, "a positive number")


def in_range(low: float, high: float, *, high_open: bool = True, low_open: bool = False) -> Rule:
    """A finite number in the interval from ``low`` to ``high`` (closed unless ``*_open``; ``high`` may be
    ``inf``)."""
    def accepts(v) -> bool:
        return _is_number(v) and (v > low if low_open else v >= low) and (v < high if high_open else v <= high)
    return Rule(accepts, f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}")


def one_of(*choices: str) -> Rule:
    """A string among ``choices`` (an unknown one is reported with the list)."""
    description = f"one of {', '.join(choices)}"
    return Rule(lambda v: isinstance(v, str) and v in choices, description,
                lambda name, value: f"unknown {name} {value!r}; expected {description}")


def optional(rule: Rule) -> Rule:
    """``None`` or a value of ``rule`` (a wrong value is explained by ``rule``)."""
    return Rule(lambda v: v is None or rule.accepts(v), f"null or {rule.description}", rule.message)


def pair(rule: Rule, *, ordered: bool = False) -> Rule:
    """A list of two values of ``rule`` (``ordered``: the first <= the second)."""
    def accepts(v) -> bool:
        return isinstance(v, (list, tuple)) and len(v) == 2 and all(rule.accepts(x) for x in v) \
            and (not ordered or v[0] <= v[1])
    return Rule(accepts, f"a list of two values, each {rule.description}{' (first <= second)' if ordered else ''}")


def check_section(section: object, name: str, rules: Mapping[str, Rule]) -> None:
    """Raise :class:`ConfigError` for the first field of ``section`` outside its rule."""
    for key, rule in rules.items():
        value = getattr(section, key)
        if not rule.accepts(value):
            raise ConfigError(rule.message(f"{name}.{key}", value))


# --- from dicts ---------------------------------------------------------------------------------------

def _accepts_type(tp, value) -> bool:
    """Does ``value`` (from YAML) fit the annotation ``tp``?"""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_accepts_type(t, value) for t in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return _is_int(value)
    return isinstance(value, origin or tp)


def _number_from_text(tp, value):
    """YAML 1.1 reads ``1e-6`` (no dot) as a string; for a float-typed key take it as the number it spells."""
    if isinstance(value, str) and _accepts_type(tp, 0.5) and not _accepts_type(tp, value):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


@functools.cache
def _type_hints(cls) -> dict:
    """``typing.get_type_hints`` of a section class, evaluated once (it was most of the time a grid of 10,000 runs
    took to check)."""
    return typing.get_type_hints(cls)


def from_dict(cls, data: dict | None, where: str = ""):
    """Build dataclass ``cls`` from a dict; unknown keys, wrongly typed values and values outside the section's
    rules raise :class:`ConfigError` naming the key (and, for unknown keys, listing the valid ones). A key of
    ``cls.RENAMED`` (old name → new name) is read as its new name, with a deprecation warning."""
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"config section {where or cls.__name__!r} must be a mapping, got {type(data).__name__}")
    hints = _type_hints(cls)
    valid = [f.name for f in fields(cls)]
    for old, new in getattr(cls, "RENAMED", {}).items():  # old spellings, accepted (with a warning) for a release
        if old in data:
            prefix = f"{where}." if where else ""
            if new in data:
                raise ConfigError(f"config keys {prefix}{old} and {prefix}{new} are one setting ({old} is its old "
                                  f"name); give {prefix}{new} only")
            warn_renamed(f"config key {prefix}{old}", f"{prefix}{new}", stacklevel=2)
            data = {(new if key == old else key): value for key, value in data.items()}
    unknown = sorted(set(data) - set(valid))
    if unknown:
        prefix = f"{where}." if where else ""
        raise ConfigError(f"unknown config key(s) {', '.join(prefix + k for k in unknown)}; valid keys"
                          f"{' of ' + where if where else ''}: {', '.join(valid)}")
    kwargs = {}
    for key, value in data.items():
        tp = hints[key]
        name = f"{where}.{key}" if where else key
        if dataclasses.is_dataclass(tp):
            kwargs[key] = from_dict(tp, value, name)
        else:
            value = _number_from_text(tp, value)
            if not _accepts_type(tp, value):
                raise ConfigError(f"config key {name} must be {_type_name(tp)}, got {shown(value)}")
            kwargs[key] = float(value) if tp is float else value
    return cls(**kwargs)
