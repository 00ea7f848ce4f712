"""The parameter-free local mechanisms on transformers' tensors: CSAN 1D / 2D and SMAN.

* CSAN 1D (Yang et al. 2019, Eq. 4–6): query ``i`` of head ``h`` attends to the ``window`` positions
  ``|i − j| <= window // 2`` of its own head.
* CSAN 2D (Eq. 7–9): to that window in the ``head_window`` heads centred on ``h``, one softmax over the area.
* SMAN (Fan et al. 2021, Eq. 11 with the static mask of §4.2): ``|t − s| <= radius``.

All three reuse the pretrained projections unchanged and add no parameter. They equal the original layer
only where the local area covers the whole sentence (CSAN 1D / SMAN: a sentence of at most
``window // 2 + 1`` / ``radius + 1`` tokens); CSAN 2D with ``head_window > 1`` also mixes keys of
neighbouring heads and never equals it. :func:`maskattn.hf.convert` warns so.
"""

from __future__ import annotations

import torch

from ..errors import ArgumentError
from ..functional import banded_attention, local_attention
from .base import ConvertedSelfAttention
from .options import check_choice, check_int, check_known, check_odd

HEAD_EDGES = ("truncate", "circular")

DEFAULTS: dict[str, dict[str, object]] = {
    "csan1d": {"window": 11},
    "csan2d": {"window": 11, "head_window": 3, "head_edges": "truncate"},
    "sman": {"radius": 4},
}


def check_local_options(mechanism: str, options: dict, num_heads: int | None) -> dict:
    """``options`` of a local mechanism with the defaults filled in; ``num_heads`` (when known) bounds
    ``head_window``."""
    check_known(options, DEFAULTS[mechanism], mechanism)
    resolved = {**DEFAULTS[mechanism], **options}
    if "window" in resolved:
        check_odd(resolved["window"], "window", "M + 1 positions centred on the query, CSAN Eq. 4")
    if "head_window" in resolved:
        check_odd(resolved["head_window"], "head_window", "N + 1 heads centred on the query's head, CSAN Eq. 7")
        if num_heads is not None and resolved["head_window"] > num_heads:
            raise ArgumentError(f"head_window must not exceed the model's {num_heads} heads, got "
                             f"{resolved['head_window']}")
        check_choice(resolved["head_edges"], "head_edges", HEAD_EDGES)
    if "radius" in resolved:
        check_int(resolved["radius"], "radius", 0, "SMAN's |t − s| <= radius, MAN Eq. 11")
    return resolved


def local_change_note(mechanism: str, options: dict) -> str:
    """Why a local mechanism changes the pretrained layer's outputs."""
    if mechanism == "sman":
        radius = options["radius"]
        return f"each query sees |t − s| <= {radius} only; exact for sentences of at most {radius + 1} tokens"
    reach = options["window"] // 2
    if options.get("head_window", 1) > 1:
        return f"each query attends to a window of {options['window']} positions in {options['head_window']} " \
               "neighbouring heads with one softmax; CSAN 2D never equals the original layer"
    return f"each query sees |i − j| <= {reach} only; exact for sentences of at most {reach + 1} tokens"


def local_attend(mechanism: str, options: dict, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 key_padding_mask: torch.Tensor | None, *, scale: float | None, dropout_p: float,
                 training: bool) -> torch.Tensor:
    """CSAN 1D / 2D or SMAN on ``(B, H, n, d)`` heads with the checked ``options``: ``(B, H, n, d)``."""
    if mechanism == "sman":
        return banded_attention(q, k, v, options["radius"], key_padding_mask=key_padding_mask, scale=scale,
                                dropout_p=dropout_p, training=training)
    return local_attention(q, k, v, window=options["window"], head_window=options.get("head_window", 1),
                           head_edges=options.get("head_edges", "truncate"), key_padding_mask=key_padding_mask,
                           scale=scale, dropout_p=dropout_p, training=training)


class LocalSelfAttention(ConvertedSelfAttention):
    """The pretrained layer's q/k/v with a local mechanism (one subclass each); no new parameter."""

    @classmethod
    def check_options(cls, options: dict, num_heads: int) -> dict:
        return check_local_options(cls.mechanism, options, num_heads)

    @classmethod
    def change_note(cls, options: dict) -> str:
        return local_change_note(cls.mechanism, options)

    def __init__(self, original, **options):
        super().__init__(original, options)
        self.scaling = original.scaling

    def attend(self, hidden_states, q, k, v, key_padding_mask):
        return local_attend(self.mechanism, self.options, q, k, v, key_padding_mask, scale=self.scaling,
                            dropout_p=self.dropout_p, training=self.training)


class Csan1dSelfAttention(LocalSelfAttention):
    """CSAN 1D, Eq. 4–6. Option: ``window`` (odd, default 11)."""

    mechanism = "csan1d"


class Csan2dSelfAttention(LocalSelfAttention):
    """CSAN 2D, Eq. 7–9. Options: ``window`` (odd, default 11), ``head_window`` (odd, default 3) and
    ``head_edges`` (``"truncate"``, the paper, or ``"circular"``)."""

    mechanism = "csan2d"


class StaticMaskSelfAttention(LocalSelfAttention):
    """SMAN, MAN Eq. 11: ``|t − s| <= radius``. Option: ``radius`` (int >= 0, default 4)."""

    mechanism = "sman"
