"""Multi-dimensional source2token self-attention: sentence pooling (Shen et al., 2018a; MTSA Eq. 9).

``p_l = softmax_i([W_2 σ(W_1 x_i + b_1) + b_2]_l)`` over non-padding tokens, per feature ``l``;
``s = Σ_i p_i ⊙ x_i``.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..validation import check_choice, check_positive_int, check_probability, entry_point
from ..kernels.softmax import masked_softmax
from .base import check_input
from .headwise import ACTIVATIONS


class Source2Token(nn.Module):
    """Pool ``(B, n, d_model)`` to ``(B, d_model)`` with feature-wise attention weights.

    Args:
        d_model: feature width. hidden: width of the score MLP (default ``d_model``).
        activation: ``"elu"`` (default) or ``"relu"``. dropout: dropout on the MLP's hidden layer.

    A sequence that is all padding pools to zeros.
    """

    def __init__(self, d_model: int, *, hidden: int | None = None, activation: str = "elu", dropout: float = 0.0):
        super().__init__()
        self.d_model = check_positive_int(d_model, "d_model")
        hidden = d_model if hidden is None else check_positive_int(hidden, "hidden")
        self.activation = check_choice(activation, "activation", tuple(ACTIVATIONS))
        self.hidden = nn.Linear(d_model, hidden)
        self.score = nn.Linear(hidden, d_model)
        self.dropout = nn.Dropout(check_probability(dropout, "dropout"))
        for linear in (self.hidden, self.score):
            nn.init.xavier_uniform_(linear.weight)
            nn.init.zeros_(linear.bias)

    def weights(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The pooling weights ``p`` (B, n, d_model): a softmax over non-padding tokens per feature."""
        kpm = check_input(x, self.d_model, key_padding_mask, module=self)
        scores = self.score(self.dropout(ACTIVATIONS[self.activation](self.hidden(x))))  # (B, n, d_model)
        return masked_softmax(scores, None if kpm is None else ~kpm.unsqueeze(-1), dim=1)

    @entry_point
    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, n, d_model) → (B, d_model)."""
        return (self.weights(x, key_padding_mask) * x).sum(dim=1)
