"""A small registry of attention mechanisms: ``create_attention(name, d_model, num_heads, **options)``.

Every registered class is a :class:`~maskattn.attention.base.SelfAttention`: one constructor convention,
``Cls(d_model, num_heads, *, dropout=0.0, backend="auto", **options)``, ``forward(x, key_padding_mask=None)
-> Tensor`` with ``x`` of shape ``(B, n, d_model)`` and ``key_padding_mask`` ``(B, n)`` bool with ``True =
padding``, and ``attention_maps(x, key_padding_mask=None)``. Its backends are those of its kernel family in
:data:`maskattn.backends.FAMILIES`. Registering a class is all it takes for the parametrised tests to cover it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

import torch.nn as nn

from ..errors import ArgumentError, ArgumentTypeError
from .. import backends as backend_policy
from .base import SelfAttention

__all__ = ["register_attention", "create_attention", "list_attentions", "attention_info", "AttentionInfo",
           "backend_table", "backend_table_rows", "backend_limits_table"]


@dataclass(frozen=True)
class AttentionInfo:
    name: str
    cls: type[SelfAttention]
    defaults: dict = field(default_factory=dict)
    description: str = ""

    @property
    def family(self) -> str:
        """The kernel family of :data:`maskattn.backends.FAMILIES` that runs the mechanism."""
        return self.cls.family

    @property
    def backends(self) -> tuple[str, ...]:
        """The concrete backends the mechanism runs on (from the backend registry), in ``auto``'s order."""
        return backend_policy.backends_of(self.family)

    def options(self) -> list[str]:
        params = inspect.signature(self.cls.__init__).parameters
        return [p for p, spec in params.items() if spec.kind == inspect.Parameter.KEYWORD_ONLY]


_REGISTRY: dict[str, AttentionInfo] = {}


def register_attention(name: str, *, description: str = "", **defaults) -> Callable[[type[nn.Module]], type[nn.Module]]:
    """Class decorator: register ``cls`` (a ``SelfAttention`` with a ``family``) under ``name`` with default
    keyword options."""

    def wrap(cls):
        if name in _REGISTRY:
            raise ArgumentError(f"attention {name!r} is already registered (by {_REGISTRY[name].cls.__name__})")
        if getattr(cls, "family", None) not in backend_policy.FAMILIES:
            raise ArgumentTypeError(f"{cls.__name__} must declare its kernel family (one of "
                            f"{', '.join(backend_policy.FAMILIES)})")
        info = AttentionInfo(name, cls, dict(defaults), description or (cls.__doc__ or "").strip().split("\n")[0])
        unknown = set(defaults) - set(info.options())
        if unknown:
            raise ArgumentTypeError(f"defaults {sorted(unknown)} are not keyword options of {cls.__name__}")
        _REGISTRY[name] = info
        return cls

    return wrap


def list_attentions() -> list[str]:
    """Names of every registered attention mechanism, sorted."""
    return sorted(_REGISTRY)


def attention_info(name: str) -> AttentionInfo:
    """The registry entry of attention ``name`` (class, kernel family, backends, default options); an unknown
    name raises with the registered names."""
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ArgumentError(f"unknown attention {name!r}; registered: {', '.join(list_attentions())}")
    return _REGISTRY[name]


def create_attention(name: str, d_model: int, num_heads: int, **options) -> SelfAttention:
    """Build a registered attention module; unknown names or options fail with the valid ones listed."""
    info = attention_info(name)
    valid = info.options()
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ArgumentError(f"unknown option(s) {unknown} for attention {name!r}; valid options: {', '.join(valid)}")
    return info.cls(d_model, num_heads, **{**info.defaults, **options})


def backend_table_rows() -> list[dict[str, str]]:
    """One row per kernel family of :data:`maskattn.backends.FAMILIES`: its registered mechanisms, its backends
    (in ``auto``'s order), what ``auto`` runs in each situation of :data:`maskattn.backends.SITUATIONS` (for masks
    that are bands, where the family has band kernels) and why."""
    families = {name: attention_info(name).family for name in list_attentions()}
    rows = []
    for name, family in backend_policy.FAMILIES.items():
        row = {"family": name,
               "mechanisms": ", ".join(m for m, f in families.items() if f == name) or "(functional only)",
               "backends": ", ".join(family.names)}
        for title, situation in backend_policy.SITUATIONS:
            row[title] = backend_policy.auto_choice(name, situation)
        row["why"] = family.why
        rows.append(row)
    return rows


def backend_table() -> str:
    """The backend registry as a markdown table (``maskattn list --backends``; the README's table is this text)."""
    columns = ["family", "mechanisms", "backends", *(title for title, _ in backend_policy.SITUATIONS)]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in backend_table_rows():
        lines.append("| " + " | ".join(f"`{row[c]}`" if c == "family" else row[c] for c in columns) + " |")
    return "\n".join(lines)


def backend_limits_table() -> str:
    """Every backend of every family with what it runs and its declared limits (the reasons it gives over a grid
    of situations, :func:`maskattn.backends.limits`), as a markdown table."""
    lines = ["| family | backend | runs | cannot run when it |", "|---|---|---|---|"]
    for name, family in backend_policy.FAMILIES.items():
        for entry in family.backends:
            limits = "; ".join(backend_policy.limits(name, entry.name)) or "—"
            lines.append(f"| `{name}` | {entry.name} | {entry.summary} | {limits} |")
    return "\n".join(lines)
