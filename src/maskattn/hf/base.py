"""The module :func:`maskattn.hf.convert` puts in place of an encoder layer's self-attention."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from ..errors import ArgumentError
from .padding import key_padding_from


class ConvertedSelfAttention(nn.Module):
    """Base of the converted self-attention modules (``encoder.layer[i].attention.self``).

    It takes over the original module's ``query``, ``key`` and ``value`` linear maps (the same objects: the
    pretrained weights and their state-dict keys stay), its attention dropout and its attributes; the
    output projection ``attention.output.dense`` is a sibling module and is left as it is. ``forward`` has
    the signature and return value of the BERT-family self-attention of transformers 5
    (``(hidden_states, attention_mask, past_key_values, **kwargs) -> (attn_output, attn_weights)``), so the
    rest of the model is untouched. Subclasses implement :meth:`attend` and declare their trainable
    parameters directly on the module (the state-dict keys :func:`maskattn.hf.load_encoder` restores).

    ``attn_weights`` is always None: maskattn's kernels never build the ``n × n`` maps, as with
    transformers' own ``sdpa`` implementation (``output_attentions=True`` returns no maps for these layers).
    """

    mechanism: str

    @classmethod
    def check_options(cls, options: dict, num_heads: int) -> dict:
        """The mechanism's options completed with its defaults; a wrong one raises naming it."""
        raise NotImplementedError

    @classmethod
    def change_note(cls, options: dict) -> str | None:
        """How these options change a pretrained model's outputs at initialisation (None: they do not)."""
        raise NotImplementedError

    # ``original`` is a transformers BERT-family self-attention (untyped here: transformers is optional)
    def __init__(self, original: Any, options: dict):
        super().__init__()
        self.config = original.config
        self.num_attention_heads = original.num_attention_heads
        self.attention_head_size = original.attention_head_size
        self.all_head_size = original.all_head_size
        self.query, self.key, self.value = original.query, original.key, original.value
        self.dropout = original.dropout
        self.is_causal = False
        self.layer_idx = original.layer_idx
        self.options = dict(options)
        self.train(original.training)  # a new module starts in training mode; keep the model's mode

    def new_parameter(self, tensor: torch.Tensor) -> nn.Parameter:
        """A parameter on the device and in the dtype of the pretrained projections."""
        weight = self.query.weight
        return nn.Parameter(tensor.to(device=weight.device, dtype=weight.dtype))

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                past_key_values=None, **kwargs) -> tuple[torch.Tensor, None]:
        if past_key_values is not None:
            raise ArgumentError(f"past_key_values must be None for a converted {self.mechanism} layer (encoder "
                             f"self-attention keeps no cache), got {type(past_key_values).__name__}")
        B, n, _ = hidden_states.shape
        heads = (B, n, self.num_attention_heads, self.attention_head_size)
        q = self.query(hidden_states).view(heads).transpose(1, 2)  # (B, n, H·d) -> (B, H, n, d)
        k = self.key(hidden_states).view(heads).transpose(1, 2)
        v = self.value(hidden_states).view(heads).transpose(1, 2)
        kpm = key_padding_from(attention_mask, q, self.config._attn_implementation)
        out = self.attend(hidden_states, q, k, v, kpm)  # (B, H, n, d)
        return out.transpose(1, 2).reshape(B, n, self.all_head_size), None  # (B, H, n, d) -> (B, n, H·d)

    def attend(self, hidden_states: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               key_padding_mask: torch.Tensor | None) -> torch.Tensor:
        """The mechanism on ``(B, H, n, d)`` heads; ``key_padding_mask`` is ``(B, n)``, True = padding."""
        raise NotImplementedError

    @property
    def dropout_p(self) -> float:
        """The model's attention dropout (``attention_probs_dropout_prob``) while training, else 0."""
        return self.dropout.p if self.training else 0.0

    def extra_repr(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"mechanism={self.mechanism!r}, heads={self.num_attention_heads}, {options}".rstrip(", ")
