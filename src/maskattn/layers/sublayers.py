"""The non-attention sublayers of a layer: the position-wise feed-forward network and the residual wrapper."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn as nn

from ..errors import ArgumentError
from ..validation import check_positive_int, check_probability, check_choice
from ..functional.activations import ACTIVATIONS, activation as activation_fn, check_activation

__all__ = ["FeedForward", "Residual", "NORMS", "FFN_ACTIVATIONS", "FFN_LAYERS"]

NORMS = ("pre", "post")
#: the FFN's activations: the library's one table (:data:`maskattn.functional.activations.ACTIVATIONS`)
FFN_ACTIVATIONS = tuple(ACTIVATIONS)
#: ``2``: ``W2 act(W1 x)`` (Vaswani et al.); ``1``: ``act(W x)``, the "FFN" of the authors' stacked MTSA
FFN_LAYERS = (1, 2)


class FeedForward(nn.Module):
    """Position-wise feed-forward network ``W2 · dropout(act(W1 x + b1)) + b2`` (Vaswani et al., 2017); MAN's
    identity-mask attention (MAN Eq. 8–9). ``dropout`` is the inner (activation) dropout.

    ``activation`` is a name of the activation table (``relu``, ``gelu``, ``elu``, ``selu``, ``gelu_tanh``,
    ``swish``, ``lrelu``). ``layers=1`` is the single map ``act(W x + b)`` (``ffn_dim`` must equal ``d_model``;
    nothing inside it to drop, so ``dropout`` is unused): the dense + ReLU sublayer of the authors' stacked MTSA
    (taoshen58/mtsa ``MTSA_API/mtsa.py`` lines 43–44). ``input_dropout`` drops the FFN's input (0; their
    ``bn_dense_layer`` drops its input with ``dense_keep_prob``, line 456)."""

    def __init__(self, d_model: int, ffn_dim: int, *, dropout: float = 0.0, activation: str = "relu",
                 layers: int = 2, input_dropout: float = 0.0):
        super().__init__()
        check_positive_int(d_model, "d_model")
        check_positive_int(ffn_dim, "ffn_dim")
        self.activation = check_activation(activation, "activation", optional=False)
        if isinstance(layers, bool) or layers not in FFN_LAYERS:
            raise ArgumentError(f"layers must be 2 (W2 act(W1 x)) or 1 (act(W x), the authors' stacked MTSA), got "
                                f"{layers!r}")
        if layers == 1 and ffn_dim != d_model:
            raise ArgumentError(f"an FFN with layers=1 maps d_model to d_model, so ffn_dim must be {d_model}, got "
                                f"{ffn_dim}")
        self.layers = layers
        self.fc1 = nn.Linear(d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, d_model) if layers == 2 else None
        self.dropout = nn.Dropout(check_probability(dropout, "dropout"))
        self.input_dropout = nn.Dropout(check_probability(input_dropout, "input_dropout"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act: Callable[[torch.Tensor], torch.Tensor] = activation_fn(self.activation)
        hidden = act(self.fc1(self.input_dropout(x)))
        return hidden if self.fc2 is None else self.fc2(self.dropout(hidden))


def check_norm_eps(norm_eps: object) -> float:
    """The LayerNorm epsilon: a number > 0 (PyTorch's 1e-5; the authors' TensorFlow MTSA code uses 1e-6)."""
    if isinstance(norm_eps, bool) or not isinstance(norm_eps, (int, float)) or not math.isfinite(norm_eps) \
            or norm_eps <= 0:
        hint = " (in a recipe or YAML write 1.0e-6: YAML reads 1e-6 as a string)" if isinstance(norm_eps, str) else ""
        raise ArgumentError(f"norm_eps must be a number > 0 such as 1e-5, got {norm_eps!r}{hint}")
    return float(norm_eps)


class Residual(nn.Module):
    """``x + dropout(f(LN(x)))`` (pre-LN) or ``LN(x + dropout(f(x)))`` (post-LN) around a sublayer ``f``;
    ``norm_eps`` is the LayerNorm's epsilon."""

    def __init__(self, d_model: int, *, norm: str = "pre", dropout: float = 0.0, norm_eps: float = 1e-5):
        super().__init__()
        self.norm_position = check_choice(norm, "norm", NORMS)
        self.norm = nn.LayerNorm(d_model, eps=check_norm_eps(norm_eps))
        self.dropout = nn.Dropout(check_probability(dropout, "dropout"))

    def forward(self, x: torch.Tensor, sublayer) -> torch.Tensor:
        if self.norm_position == "pre":
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))
