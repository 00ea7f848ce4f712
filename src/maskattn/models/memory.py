"""The memory a batch takes in a model: :func:`model_memory_bytes` reads the model's modules — its parameters, the
width of every sublayer's output, its attention sublayers (heads, whether their scores are feature-wise) — and
asks the one attention estimate, :func:`maskattn.device.attention_memory_bytes`, for the quadratic part.

A model can be estimated before it exists: built on the ``meta`` device (:func:`estimate_before_building`), its
modules have their shapes and no memory, so a configuration no machine holds (``model.d_model=100000``) is refused
by the estimate instead of by the allocator."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn

from ..attention import SelfAttention
from ..device import attention_memory_bytes

__all__ = ["model_memory_bytes", "parameter_bytes", "activation_width", "estimate_before_building"]

#: families whose every pass builds n × n × d_head scores (DiSA's multi-dimensional baseline)
_FEATURE_WISE = ("multi_dim",)
#: families whose attention maps (the reference math) are n × n × d_head: MTSA / Fast-DiSA's source2token maps
_FEATURE_WISE_MAPS = ("tensorized", "multi_dim")
#: copies of every parameter a training step holds: the weights, their gradients and Adam's two moments
_TRAINING_COPIES = 4
#: values kept per value of a sublayer's output in a training step (the output, the input or mask its backward
#: reads, the gradient flowing through) and, in inference, alive around the widest one
_TRAINING_FACTOR, _INFERENCE_FACTOR = 3, 6


def parameter_bytes(model: nn.Module) -> int:
    """Bytes of ``model``'s parameters and buffers (its shapes: a ``meta`` model counts what it would hold)."""
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def _output_width(module: nn.Module) -> int:
    """Values per token of the output of a leaf module (0: none counted; attention scores are counted apart)."""
    if isinstance(module, nn.Linear):
        return module.out_features
    if isinstance(module, nn.Embedding):
        return module.embedding_dim
    if isinstance(module, nn.LayerNorm):
        return int(torch.Size(module.normalized_shape).numel())
    if isinstance(module, nn.modules.conv._ConvNd):  # the output, and the unfolded input a CPU convolution builds
        return module.out_channels + module.in_channels * int(torch.Size(module.kernel_size).numel())
    if isinstance(module, nn.RNNBase):  # the gates of every layer and direction, kept for backward
        gates = {"LSTM": 4, "GRU": 3}.get(module.mode, 1)
        return module.hidden_size * (gates + 1) * module.num_layers * (2 if module.bidirectional else 1)
    return 0


def activation_width(model: nn.Module) -> tuple[int, int]:
    """``(sum, max)`` over ``model``'s leaf modules of their output's values per token (Linear, Embedding,
    LayerNorm, convolutions, recurrent layers): what a training step keeps, and the widest single output."""
    widths = [_output_width(m) for m in model.modules() if next(m.children(), None) is None]
    return sum(widths), max(widths, default=0)


def model_memory_bytes(model: nn.Module, batch: int, length: int, *, training: bool = False, maps: bool = False,
                       parameters: bool = False) -> int:
    """Estimated peak bytes of ``model`` on a ``(batch, length)`` input: a training step with ``training``, one
    forward pass without it, the attention maps of every layer with ``maps`` (``maskattn viz``).

    The sum of three parts: the attention scores of every attention sublayer (quadratic in ``length``;
    :func:`~maskattn.device.attention_memory_bytes`); the sublayers' outputs (``batch × length`` tokens times
    :func:`activation_width` — all of them kept for backward in training, the widest few alive at once in
    inference); and with ``parameters`` the weights themselves (training: also their gradients and Adam's two
    moments) — for a model not yet in memory, such as one built on the ``meta`` device. It is tested to bound the
    measured peak of every mechanism, baseline and architecture (``tests/test_input_limits.py``)."""
    attention = [m for m in model.modules() if isinstance(m, SelfAttention)]
    parameter = next(model.parameters(), None)
    element_size = parameter.element_size() if parameter is not None else 4
    width = max((m.d_model for m in attention), default=0)
    heads = max((m.num_heads for m in attention), default=0)
    families = _FEATURE_WISE_MAPS if maps else _FEATURE_WISE
    # DiSA's training keeps about twice as many n × n × d tensors (scores, tanh, weights) as scalar attention keeps
    # n × n ones (measured: tests/test_input_limits.py)
    features = max((max(1, m.d_model // m.num_heads) * (2 if m.family in _FEATURE_WISE and training else 1)
                    if m.family in families else 1 for m in attention), default=1)
    # maps are kept for every sublayer at once; a forward pass frees each sublayer's scores before the next one
    layers = len(attention)
    estimate = attention_memory_bytes(batch, length, heads=heads, layers=layers, width=width, training=training,
                                      element_size=element_size, score_features=features)
    if maps and layers > 1:
        estimate += (layers - 1) * batch * heads * length * length * features * element_size
    total_width, widest = activation_width(model)
    tokens = batch * length * element_size
    estimate += (_TRAINING_FACTOR * total_width if training else _INFERENCE_FACTOR * widest) * tokens
    if parameters:
        estimate += parameter_bytes(model) * (_TRAINING_COPIES if training else 1)
    return estimate


def estimate_before_building(build: Callable[[], nn.Module], check: Callable[[nn.Module], None]) -> nn.Module:
    """``build()`` once on the ``meta`` device (shapes, no memory, no random numbers drawn), ``check`` that model
    (e.g. refuse it with :func:`~maskattn.device.check_memory` on :func:`model_memory_bytes` with
    ``parameters=True``), then ``build()`` for real and return it."""
    with torch.device("meta"):
        probe = build()
    check(probe)
    return build()
