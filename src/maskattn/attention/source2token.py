"""Multi-dimensional source2token self-attention: sentence pooling (Shen et al., 2018a; MTSA Eq. 9).

``p_l = softmax_i([W_2 σ(W_1 x_i + b_1) + b_2]_l)`` over non-padding tokens, per feature ``l``;
``s = Σ_i p_i ⊙ x_i``.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .._validation import check_positive_int
from ._common import check_choice, check_input, check_probability
from ._headwise import ACTIVATIONS


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

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None, return_attention: bool = False):
        """x: (B, n, d_model) → (B, d_model); with ``return_attention`` also the weights (B, n, d_model)."""
        kpm = check_input(x, self.d_model, key_padding_mask)
        scores = self.score(self.dropout(ACTIVATIONS[self.activation](self.hidden(x))))  # (B, n, d_model)
        if kpm is not None:
            scores = scores.masked_fill(kpm.unsqueeze(-1), float("-inf"))
        weights = torch.softmax(scores, dim=1)
        if kpm is not None:  # all-padding rows: softmax of -inf everywhere is NaN; they pool to 0
            weights = torch.where(kpm.all(dim=1)[:, None, None], torch.zeros_like(weights), weights)
        pooled = (weights * x).sum(dim=1)
        return (pooled, weights) if return_attention else pooled
