"""Word embeddings: uniform ``[-init, init]`` initialisation (``init`` 0.05 as MTSA Appendix B; Kim 2014:
0.25), optional pretrained rows (MTSA Appendix B: GloVe where a word has a vector, the uniform initialisation
where it has none, all fine-tuned — or all fixed with ``freeze``, Kim 2014's "static" vectors), optional fixed
rows after the trained ones (words of the evaluation data that only the vectors file knows), padding row fixed at
zero, an optional scale (``√d_model`` before sinusoidal positions, as in Vaswani et al. 2017 §3.4 — otherwise the
unit-amplitude positions drown the ±0.05 word vectors; pretrained vectors keep their own scale), dropout, and a
projection when the embedding width differs from the model's."""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import ArgumentError

__all__ = ["TokenEmbedding", "PretrainedRows"]


class PretrainedRows(Protocol):
    """Pretrained vectors for a vocabulary (:class:`maskattn.data.vectors.WordVectors`): ``weight``
    ``(vocab, embed_dim)``, ``found`` ``(vocab,)`` bool (rows without a vector keep the initialisation) and
    ``fixed``, the number of rows at the end of the vocabulary that are not trained."""

    weight: torch.Tensor
    found: torch.Tensor
    fixed: int


class TokenEmbedding(nn.Module):
    """``ids (B, n)`` → ``(B, n, d_model)``.

    ``pretrained``: a ``(vocab_size, embed_dim)`` matrix (every row taken) or :class:`PretrainedRows`;
    ``fixed_rows``: the last rows of the vocabulary form a table that is never trained (default: ``pretrained``'s
    ``fixed``; a checkpoint's model is rebuilt with it and no vectors); ``freeze``: the trained table is fixed too.
    """

    def __init__(self, vocab_size: int, d_model: int, *, embed_dim: int | None = None, pad_id: int = 0,
                 dropout: float = 0.0, pretrained: torch.Tensor | PretrainedRows | None = None,
                 fixed_rows: int | None = None, freeze: bool = False, scale: float = 1.0, init: float = 0.05):
        super().__init__()
        if isinstance(init, bool) or not isinstance(init, (int, float)) or not init > 0:
            raise ArgumentError(f"model.embed_init must be a positive number (the bound of the uniform initialisation), "
                             f"got {init!r}")
        self.scale = scale
        embed_dim = embed_dim or d_model
        if isinstance(pretrained, torch.Tensor):
            weight, found, fixed = pretrained, torch.ones(len(pretrained), dtype=torch.bool), 0
        elif pretrained is not None:
            weight, found, fixed = pretrained.weight, pretrained.found, pretrained.fixed
        else:
            weight, found, fixed = None, None, 0
        fixed = fixed if fixed_rows is None else fixed_rows
        if not 0 <= fixed < vocab_size - pad_id:  # the padding row is among the trained rows
            raise ArgumentError(f"fixed_rows must be an int in [0, {vocab_size - pad_id}) for a vocabulary of "
                                f"{vocab_size} with padding id {pad_id}, got {fixed!r}")
        self.trained_rows = vocab_size - fixed
        self.embedding = nn.Embedding(self.trained_rows, embed_dim, padding_idx=pad_id)
        nn.init.uniform_(self.embedding.weight, -init, init)
        # the rows no training step changes (persistent: saved with the weights)
        self.fixed: torch.Tensor | None
        self.register_buffer("fixed", torch.zeros(fixed, embed_dim) if fixed else None)
        if weight is not None and found is not None:
            if tuple(weight.shape) != (vocab_size, embed_dim):
                raise ArgumentError(f"pretrained vectors have shape {tuple(weight.shape)}; expected "
                                 f"(vocab size {vocab_size}, embed_dim {embed_dim})")
            with torch.no_grad():
                rows = found[:self.trained_rows]
                self.embedding.weight[rows] = weight[:self.trained_rows][rows].to(self.embedding.weight.dtype)
                if self.fixed is not None:
                    self.fixed.copy_(weight[self.trained_rows:])
        with torch.no_grad():
            self.embedding.weight[pad_id].zero_()
        self.embedding.weight.requires_grad_(not freeze)
        self.proj = nn.Linear(embed_dim, d_model) if embed_dim != d_model else None
        self.dropout = nn.Dropout(dropout)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.fixed is None:
            x = self.embedding(ids)  # (B, n, embed_dim)
        else:
            is_fixed = ids >= self.trained_rows  # (B, n)
            trained = self.embedding(ids.masked_fill(is_fixed, self.embedding.padding_idx or 0))
            fixed = F.embedding((ids - self.trained_rows).clamp(min=0, max=len(self.fixed) - 1), self.fixed)
            x = torch.where(is_fixed.unsqueeze(-1), fixed.to(trained.dtype), trained)  # (B, n, embed_dim)
        x = self.dropout(x * self.scale if self.scale != 1.0 else x)
        return x if self.proj is None else self.proj(x)
