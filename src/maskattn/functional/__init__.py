"""Pure attention math, one module per mechanism (the ``nn.Module`` classes sit on top of these)."""

from .tensorized import SCALES, tensorized_attention, tensorized_attention_maps, tensorized_attention_reference
from .mask_attention import (
    dynamic_mask,
    dynamic_mask_attention,
    dynamic_mask_attention_reference,
    dynamic_mask_logits,
    log_weight_bias,
    mask_attention,
    mask_attention_reference,
    mask_attention_weights,
    relative_distance_index,
    static_window_mask,
)
from .local import banded_attention, local_attention, local_attention_maps

__all__ = [
    "SCALES", "tensorized_attention", "tensorized_attention_maps", "tensorized_attention_reference",
    "mask_attention", "mask_attention_reference", "mask_attention_weights", "log_weight_bias",
    "dynamic_mask", "dynamic_mask_attention", "dynamic_mask_attention_reference", "dynamic_mask_logits",
    "relative_distance_index", "static_window_mask",
    "banded_attention", "local_attention", "local_attention_maps",
]
