"""A small registry of attention mechanisms: ``create_attention(name, d_model, num_heads, **options)``.

Every registered class follows one constructor convention,
``Cls(d_model, num_heads, *, dropout=0.0, backend="auto", **options)``, and one forward convention,
``forward(x, key_padding_mask=None, return_attention=False)`` with ``x`` of shape ``(B, n, d_model)``
and ``key_padding_mask`` ``(B, n)`` bool with ``True = padding``. Registering a class is all it takes
for the parametrised tests to cover it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

import torch.nn as nn

__all__ = ["register_attention", "create_attention", "list_attentions", "attention_info", "AttentionInfo"]


@dataclass(frozen=True)
class AttentionInfo:
    name: str
    cls: type[nn.Module]
    defaults: dict = field(default_factory=dict)
    description: str = ""
    backends: tuple[str, ...] = ("reference", "sdpa", "flex")

    def options(self) -> list[str]:
        params = inspect.signature(self.cls.__init__).parameters
        return [p for p, spec in params.items() if spec.kind == inspect.Parameter.KEYWORD_ONLY]


_REGISTRY: dict[str, AttentionInfo] = {}


def register_attention(name: str, *, description: str = "", backends: tuple[str, ...] = ("reference", "sdpa", "flex"),
                       **defaults) -> Callable[[type[nn.Module]], type[nn.Module]]:
    """Class decorator: register ``cls`` under ``name`` with default keyword options."""

    def wrap(cls):
        if name in _REGISTRY:
            raise ValueError(f"attention {name!r} is already registered (by {_REGISTRY[name].cls.__name__})")
        info = AttentionInfo(name, cls, dict(defaults), description or (cls.__doc__ or "").strip().split("\n")[0],
                             tuple(backends))
        unknown = set(defaults) - set(info.options())
        if unknown:
            raise TypeError(f"defaults {sorted(unknown)} are not keyword options of {cls.__name__}")
        _REGISTRY[name] = info
        return cls

    return wrap


def list_attentions() -> list[str]:
    """Names of every registered attention mechanism, sorted."""
    return sorted(_REGISTRY)


def attention_info(name: str) -> AttentionInfo:
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"unknown attention {name!r}; registered: {', '.join(list_attentions())}")
    return _REGISTRY[name]


def create_attention(name: str, d_model: int, num_heads: int, **options) -> nn.Module:
    """Build a registered attention module; unknown names or options fail with the valid ones listed."""
    info = attention_info(name)
    valid = info.options()
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for attention {name!r}; valid options: {', '.join(valid)}")
    return info.cls(d_model, num_heads, **{**info.defaults, **options})
