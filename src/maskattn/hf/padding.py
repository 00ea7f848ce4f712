"""The padding mask between transformers and maskattn's attention layers.

transformers builds the attention mask once per forward through the mask function registered in
``AttentionMaskInterface`` under the model's attention implementation; an implementation registered in
``AttentionInterface`` without one receives ``attention_mask=None`` — padding would be silently ignored.
maskattn registers :func:`key_padding_mask_function` under each of its implementations: it passes the
2-D padding mask on as a ``(batch, 1, 1, keys)`` bool tensor (True = real token), which
``F.scaled_dot_product_attention`` broadcasts and :func:`key_padding_from` turns back into maskattn's
``key_padding_mask`` (True = padding). No ``n × n`` mask is built.
"""

from __future__ import annotations

import torch
from transformers.masking_utils import bidirectional_mask_function

from ..errors import ArgumentError
from .options import describe


def key_padding_mask_function(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset=0, *,
                              mask_function=bidirectional_mask_function, attention_mask=None, **kwargs):
    """Mask function of maskattn's attention implementations (transformers' ``AttentionMaskInterface``).

    Args:
        batch_size, q_length, kv_length, q_offset, kv_offset: the sizes transformers' mask creation passes.
        mask_function: the pattern transformers asks for; only the bidirectional (encoder) one is accepted —
            a causal, sliding or combined pattern cannot be expressed as a key padding mask.
        attention_mask: ``(batch, kv_length)`` bool, True = real token, or None (no padding).

    Returns:
        None (no padding) or ``attention_mask`` as a ``(batch, 1, 1, kv_length)`` bool view.
    """
    if mask_function is not bidirectional_mask_function:
        pattern = getattr(mask_function, "__name__", mask_function)
        raise ArgumentError(f"maskattn's attention implementations serve bidirectional encoder self-attention only; "
                         f"transformers asked for the mask pattern {pattern!r} (a decoder, a cache or an added "
                         "mask function)")
    if not (isinstance(q_offset, int) and isinstance(kv_offset, int) and q_offset == 0 and kv_offset == 0):
        raise ArgumentError(f"maskattn's attention implementations take no cache; got q_offset={q_offset!r}, "
                         f"kv_offset={kv_offset!r}, expected 0 and 0")
    if attention_mask is None:
        return None
    if tuple(attention_mask.shape) != (batch_size, kv_length):
        raise ArgumentError(f"attention_mask has shape {tuple(attention_mask.shape)}; expected (batch, sequence) = "
                         f"({batch_size}, {kv_length})")
    return attention_mask[:, None, None, :]  # (B, n) -> (B, 1, 1, n)


def key_padding_from(attention_mask, query: torch.Tensor, implementation: str) -> torch.Tensor | None:
    """maskattn's ``key_padding_mask`` (``(B, n)`` bool, True = padding) from the mask a layer received.

    ``query`` is the layer's ``(B, H, n, d)`` query; ``implementation`` the model's attention implementation,
    named in the error when the mask is not the ``(B, 1, 1, n)`` bool tensor of
    :func:`key_padding_mask_function` (another implementation's mask, or a 4-D mask passed by the caller).
    """
    if attention_mask is None:
        return None
    B, _, n, _ = query.shape
    if (isinstance(attention_mask, torch.Tensor) and attention_mask.dtype == torch.bool
            and tuple(attention_mask.shape) == (B, 1, 1, n)):
        return ~attention_mask[:, 0, 0, :]
    got = (f"a {attention_mask.dtype} tensor of shape {tuple(attention_mask.shape)}"
           if isinstance(attention_mask, torch.Tensor) else describe(attention_mask))
    raise ArgumentError(f"attention_mask reached a maskattn attention layer as {got}; expected None or the "
                     f"(batch, 1, 1, keys) = ({B}, 1, 1, {n}) bool key-padding mask built by maskattn's mask "
                     f"function. The model's attention implementation is {implementation!r}: keep one of "
                     "maskattn's (maskattn.hf.register() lists them) and pass a 2-D attention_mask "
                     "(batch, sequence), not a 4-D one")
