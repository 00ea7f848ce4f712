"""Pure attention math, one module per mechanism (the ``nn.Module`` classes sit on top of these)."""

from .tensorized import (
    SCALES,
    tensorized_attention,
    tensorized_attention_maps,
    tensorized_attention_reference,
)

__all__ = ["SCALES", "tensorized_attention", "tensorized_attention_maps", "tensorized_attention_reference"]
