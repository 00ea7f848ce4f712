"""maskattn's attention implementations in transformers' ``AttentionInterface``.

Each implementation is an attention function ``fn(module, query, key, value, attention_mask, **kwargs) ->
(attn_output, None)`` on transformers' layout (``query``/``key``/``value`` ``(B, H, n, d)``, ``attn_output``
``(B, n, H, d)``), registered together with :func:`~maskattn.hf.padding.key_padding_mask_function` in
``AttentionMaskInterface`` under the same name, so that padding reaches it. A model selects one with
``attn_implementation=name`` in ``from_pretrained`` or ``model.set_attn_implementation(name)``; it then runs
in every self-attention layer.
"""

from __future__ import annotations

from typing import cast

from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from ..errors import ArgumentError
from .local import DEFAULTS, check_local_options, local_attend
from .padding import key_padding_from, key_padding_mask_function

#: softmax attention (transformers' sdpa function) on maskattn's key-padding mask: the implementation
#: :func:`maskattn.hf.convert` gives a model, used by the layers it leaves alone.
SDPA = "maskattn_sdpa"

#: the parameter-free mechanisms :func:`register` adds (the others have parameters: use ``convert``).
REGISTRABLE = tuple(DEFAULTS)


def implementation_name(mechanism: str, options: dict) -> str:
    """``maskattn_<mechanism>`` followed by ``_<option>_<value>`` for each option off its default."""
    changed = [f"_{key}_{value}" for key, value in options.items() if value != DEFAULTS[mechanism][key]]
    return f"maskattn_{mechanism}" + "".join(changed)


def is_maskattn_implementation(name: str | None) -> bool:
    """Whether ``name`` is registered by maskattn (its layers receive the key-padding mask)."""
    return AttentionMaskInterface().get(name) is key_padding_mask_function


def softmax_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' sdpa attention function, after checking that ``attention_mask`` is maskattn's
    ``(B, 1, 1, n)`` key-padding mask (``F.scaled_dot_product_attention`` broadcasts it)."""
    key_padding_from(attention_mask, query, SDPA)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def _local_attention_function(mechanism: str, options: dict, name: str):
    def attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                  **kwargs):
        kpm = key_padding_from(attention_mask, query, name)
        out = local_attend(mechanism, options, query, key, value, kpm, scale=scaling, dropout_p=dropout,
                           training=module.training)
        return out.transpose(1, 2), None  # (B, H, n, d) -> (B, n, H, d), transformers' layout

    attention.__name__ = attention.__qualname__ = name
    attention.__doc__ = f"maskattn's {mechanism} with {options} as a transformers attention function."
    return attention


def _add(name: str, function) -> str:
    AttentionInterface.register(name, function)
    AttentionMaskInterface.register(name, key_padding_mask_function)
    return name


def register(mechanism: str | None = None, /, **options) -> str | tuple[str, ...]:
    """Add maskattn's parameter-free mechanisms to transformers' ``AttentionInterface``.

    ``register()`` adds ``maskattn_csan1d`` (CSAN 1D, window 11), ``maskattn_csan2d`` (CSAN 2D, window 11
    × 3 heads), ``maskattn_sman`` (SMAN, radius 4) and ``maskattn_sdpa`` (plain softmax attention) and
    returns their names. ``register(mechanism, **options)`` adds one mechanism with its options and
    returns its name: ``maskattn_<mechanism>`` followed by ``_<option>_<value>`` for each option that is
    not the default, e.g. ``register("csan2d", window=7)`` → ``"maskattn_csan2d_window_7"`` — so models
    configured differently never share a name. Calling it again with the same arguments changes nothing.

    Options: ``csan1d``: ``window`` (odd, 11); ``csan2d``: ``window`` (odd, 11), ``head_window`` (odd, 3),
    ``head_edges`` (``"truncate"`` | ``"circular"``); ``sman``: ``radius`` (int >= 0, 4).

    Each name is registered with maskattn's mask function as well (``AttentionMaskInterface``), so a padded
    key gets no weight; the query/key scale transformers passes (``scaling``) and its attention dropout are
    used as they are. These mechanisms change the pretrained model's outputs (see :func:`convert`).
    """
    if mechanism is None:
        if options:
            raise ArgumentError(f"options {sorted(options)} need a mechanism, e.g. register('csan2d', window=7); "
                             f"mechanisms: {', '.join(REGISTRABLE)}")
        return (*(cast(str, register(m)) for m in REGISTRABLE), _add(SDPA, softmax_attention))
    if not isinstance(mechanism, str) or mechanism not in REGISTRABLE:
        raise ArgumentError(f"unknown mechanism {mechanism!r} for register(); expected one of "
                         f"{', '.join(repr(m) for m in REGISTRABLE)} (DMAN and MTSA have parameters: use "
                         "maskattn.hf.convert)")
    resolved = check_local_options(mechanism, options, None)
    name = implementation_name(mechanism, resolved)
    return _add(name, _local_attention_function(mechanism, resolved, name))


def use_key_padding_implementation(model) -> None:
    """Give ``model`` maskattn's ``maskattn_sdpa`` implementation unless it already has one of maskattn's."""
    if not is_maskattn_implementation(model.config._attn_implementation):
        _add(SDPA, softmax_attention)
        model.set_attn_implementation(SDPA)
