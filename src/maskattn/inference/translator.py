"""Translating raw sentences with a trained :class:`~maskattn.models.seq2seq.Seq2Seq`.

:class:`Translator` = subword model + Seq2Seq: ``translate(lines)`` subword-encodes each line, decodes the
batch greedily (``beam=1``) or with beam search, and returns detokenised text, one output per input line:

* an empty (or whitespace-only) line gives an empty output line — the line count is always preserved;
* a line longer than the model's ``max_len`` (in subwords, counting ``</s>``) is truncated to fit and
  reported through ``on_truncate`` (the CLI prints a warning on stderr); it never raises an index error;
* characters the subword model never saw become ``<unk>`` (see :mod:`maskattn.data.subword`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

import torch

from ..errors import ArgumentError, ArgumentTypeError
from ..validation import check_positive_int
from ..data.subword import BOS_ID, EOS_ID, PAD_ID, SubwordModel
from .decoding import beam_search, greedy_decode

if TYPE_CHECKING:
    from ..models.seq2seq import Seq2Seq

__all__ = ["Translator"]


class Translator:
    """Translate sentences with ``model`` (a Seq2Seq over ``subword``'s joint vocabulary).

    ``max_len``: the longest source the model takes (sources are cut to ``max_len - 1`` subwords +
    ``</s>``). Outputs have at most ``⌊1.2 · source length + 10⌋`` subwords, capped by the model's positional
    range (:mod:`maskattn.inference.decoding`). ``length_penalty``: the GNMT α of beam search (0.6 as in Vaswani et
    al. 2017; 0 ranks by log-probability).
    """

    def __init__(self, model: Seq2Seq, subword: SubwordModel, *, max_len: int,
                 device: torch.device | str = "cpu"):
        if not isinstance(subword, SubwordModel):
            raise ArgumentTypeError(f"subword must be a SubwordModel, got {type(subword).__name__}")
        if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 2:
            raise ArgumentError(f"max_len must be an int >= 2, got {max_len!r}")
        self.model, self.subword, self.max_len, self.device = model, subword, max_len, torch.device(device)

    def encode_source(self, line: str) -> tuple[list[int], bool]:
        """Source ids (``… </s>``) of one line, and whether it had to be truncated."""
        ids = self.subword.encode(line)
        limit = self.max_len - 1
        return ids[:limit] + [EOS_ID], len(ids) > limit

    @torch.no_grad()
    def translate_ids(self, sources: Sequence[list[int]], *, beam: int = 5, length_penalty: float = 0.6,
                      batch_size: int = 64) -> list[list[int]]:
        """Output subword ids for encoded sources (each ending in ``</s>``), in input order."""
        check_positive_int(beam, "beam")
        check_positive_int(batch_size, "batch_size")
        self.model.eval()
        out: list[list[int]] = [[] for _ in sources]
        order = sorted(range(len(sources)), key=lambda i: len(sources[i]))  # little padding per batch
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            width = max(len(sources[i]) for i in chunk)
            src = torch.full((len(chunk), width), PAD_ID, dtype=torch.long)  # (B, S)
            for row, i in enumerate(chunk):
                src[row, :len(sources[i])] = torch.tensor(sources[i], dtype=torch.long)
            src = src.to(self.device)
            if beam == 1:
                hyps = greedy_decode(self.model, src, bos_id=BOS_ID, eos_id=EOS_ID)
            else:
                hyps = cast(list[list[int]], beam_search(self.model, src, beam_size=beam, length_penalty=length_penalty,
                                                          bos_id=BOS_ID, eos_id=EOS_ID))  # the best of each beam
            for row, i in enumerate(chunk):
                out[i] = list(hyps[row])
        return out

    def translate(self, lines: Sequence[str], *, beam: int = 5, length_penalty: float = 0.6, batch_size: int = 64,
                  on_truncate: Callable[[list[int], int], None] | None = None) -> list[str]:
        """One detokenised translation per line (empty lines stay empty). ``on_truncate`` receives the
        1-based numbers of the lines that were cut to the model's ``max_len`` and the subwords kept of them."""
        if isinstance(lines, str):
            raise ArgumentTypeError("lines must be a sequence of sentences, not one str")
        todo, sources, truncated = [], [], []
        for number, line in enumerate(lines, start=1):
            if not isinstance(line, str):
                raise ArgumentTypeError(f"line {number} is a {type(line).__name__}, expected str")
            if not line.strip():
                continue
            ids, cut = self.encode_source(line)
            if cut:
                truncated.append(number)
            todo.append(number - 1)
            sources.append(ids)
        if truncated and on_truncate is not None:
            on_truncate(truncated, self.max_len - 1)
        outputs = [""] * len(lines)
        hyps = self.translate_ids(sources, beam=beam, length_penalty=length_penalty, batch_size=batch_size)
        for i, hyp in zip(todo, hyps):
            outputs[i] = self.subword.decode(hyp)
        return outputs
