"""The memory a batch takes in a built model: :func:`model_memory_bytes` reads the model's attention sublayers
(heads, width, whether their scores are feature-wise) and asks the one estimate,
:func:`maskattn.device.attention_memory_bytes`."""

from __future__ import annotations

import torch.nn as nn

from ..attention import SelfAttention
from ..device import attention_memory_bytes

__all__ = ["model_memory_bytes"]

#: families whose every pass builds n × n × d_head scores (DiSA's multi-dimensional baseline)
_FEATURE_WISE = ("multi_dim",)
#: families whose attention maps (the reference math) are n × n × d_head: MTSA / Fast-DiSA's source2token maps
_FEATURE_WISE_MAPS = ("tensorized", "multi_dim")


def model_memory_bytes(model: nn.Module, batch: int, length: int, *, training: bool = False,
                       maps: bool = False) -> int:
    """Estimated peak bytes of ``model`` on a ``(batch, length)`` input: a training step with ``training``, one
    forward pass without it, the attention maps of every layer with ``maps`` (``maskattn viz``). A model without
    attention sublayers (a Bi-LSTM / CNN baseline) counts its activations only."""
    attention = [m for m in model.modules() if isinstance(m, SelfAttention)]
    parameter = next(model.parameters(), None)
    element_size = parameter.element_size() if parameter is not None else 4
    width = max((m.d_model for m in attention), default=0)
    if not width:
        width = max((p.shape[-1] for p in model.parameters() if p.dim() >= 2), default=1)
    heads = max((m.num_heads for m in attention), default=0)
    families = _FEATURE_WISE_MAPS if maps else _FEATURE_WISE
    features = max((max(1, m.d_model // m.num_heads) if m.family in families else 1 for m in attention), default=1)
    # maps are kept for every sublayer at once; a forward pass frees each sublayer's scores before the next one
    layers = len(attention)
    estimate = attention_memory_bytes(batch, length, heads=heads, layers=layers, width=width, training=training,
                                      element_size=element_size, score_features=features)
    if maps and layers > 1:
        estimate += (layers - 1) * batch * heads * length * length * features * element_size
    return estimate
