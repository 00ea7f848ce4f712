"""Pretrained word vectors in GloVe's text format (``word v1 v2 … vd`` per line)."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import DataError
from .text import iter_lines
from .vocab import Vocabulary

__all__ = ["load_glove"]


def load_glove(path: str | Path, vocab: Vocabulary, dim: int, *, init_range: float = 0.05,
               seed: int = 0) -> tuple[torch.Tensor, int]:
    """An embedding matrix ``(len(vocab), dim)``: rows of tokens found in ``path`` take the pretrained
    vector, the others are uniform in ``[-init_range, init_range]`` (MTSA Appendix B), padding is 0.
    Returns (matrix, number of tokens found). The file is streamed with the toolkit's line policy
    (:mod:`.text`)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"pretrained vectors file {path} does not exist")
    g = torch.Generator().manual_seed(seed)
    weight = torch.empty(len(vocab), dim).uniform_(-init_range, init_range, generator=g)
    found = 0
    for number, line in iter_lines(path):
        parts = line.rstrip().split(" ")
        if len(parts) < 2:
            continue
        if len(parts) != dim + 1:
            raise DataError(f"{path}:{number}: expected a word and {dim} numbers, got {len(parts) - 1} numbers")
        index = vocab.stoi.get(parts[0])
        if index is None or index == vocab.pad_id:
            continue
        try:
            weight[index] = torch.tensor([float(v) for v in parts[1:]])
        except ValueError:
            raise DataError(f"{path}:{number}: non-numeric vector component") from None
        found += 1
    weight[vocab.pad_id] = 0.0
    return weight, found
