"""Pure attention math, one module per mechanism (the ``nn.Module`` classes sit on top of these).

* :mod:`.dot_product`    — plain masked scaled dot-product attention (SAN, MAN Eq. 6–7).
* :mod:`.mask_attention` — MAN's mask attention function, Eq. 4.
* :mod:`.dman`           — DMAN's dynamic mask, MAN Eq. 12.
* :mod:`.local`          — CSAN 1D/2D, Eq. 4–9, and every static band (SMAN, window heads).
* :mod:`.tensorized`     — MTSA / Fast-DiSA's multi-dim attention, MTSA Eq. 10–12.
* :mod:`.activations`    — the one activation table of every activation option.
"""

from .activations import ACTIVATIONS, activation, check_activation
from .dot_product import attention_weights, dot_product_attention, dot_product_attention_reference
from .mask_attention import log_weight_bias, mask_attention, mask_attention_reference, mask_attention_weights
from .dman import (
    dynamic_mask,
    dynamic_mask_attention,
    dynamic_mask_attention_reference,
    dynamic_mask_logits,
    dynamic_mask_weights,
    relative_distance_index,
)
from .local import banded_attention, local_attention, local_attention_maps
from .tensorized import SCALES, tensorized_attention, tensorized_attention_maps, tensorized_attention_reference

__all__ = [
    "ACTIVATIONS", "activation", "check_activation",
    "attention_weights", "dot_product_attention", "dot_product_attention_reference",
    "mask_attention", "mask_attention_reference", "mask_attention_weights", "log_weight_bias",
    "dynamic_mask", "dynamic_mask_attention", "dynamic_mask_attention_reference", "dynamic_mask_logits",
    "dynamic_mask_weights", "relative_distance_index",
    "banded_attention", "local_attention", "local_attention_maps",
    "SCALES", "tensorized_attention", "tensorized_attention_maps", "tensorized_attention_reference",
]
