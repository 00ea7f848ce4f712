"""Turning raw text into output text with a trained :class:`~maskattn.models.seq2seq.Seq2Seq`: translations, or
summaries of articles.

:class:`Translator` = subword model + Seq2Seq + decoding options: ``translate(lines)`` subword-encodes each line,
decodes the batch as its :class:`~maskattn.inference.DecodingOptions` say (greedy for ``beam=1``, else beam search
with its length penalty, length limits and n-gram blocking) and returns detokenised text, one output per input
line:

* an empty (or whitespace-only) line gives an empty output line — the line count is always preserved;
* a line longer than the model's ``max_len`` (in subwords, counting ``</s>``) is truncated to fit and
  reported through ``on_truncate`` (the CLI prints a warning on stderr); it never raises an index error;
* the corpus' unknown-word spellings (``unk_tokens``, e.g. ``UNK`` and ``<unk>``) become the first one, as in
  training (:func:`maskattn.data.parallel.unify_unknown`);
* characters the subword model never saw become ``<unk>`` (see :mod:`maskattn.data.subword`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from ..errors import ArgumentError, ArgumentTypeError
from ..validation import check_positive_int
from ..data.parallel import unify_unknown
from ..data.subword import BOS_ID, EOS_ID, PAD_ID, SubwordModel
from .decoding import DecodingOptions

if TYPE_CHECKING:
    from ..models.seq2seq import Seq2Seq

__all__ = ["Translator"]


class Translator:
    """Translate (or summarise) sentences with ``model`` (a Seq2Seq over ``subword``'s joint vocabulary).

    ``max_len``: the longest source the model takes (sources are cut to ``max_len - 1`` subwords + ``</s>``).
    ``decoding``: the default :class:`~maskattn.inference.DecodingOptions` (a checkpoint's own, with
    :func:`~maskattn.inference.load_translator`; the default: beam 5, GNMT length penalty 0.6, outputs of at most
    ``⌊1.2 · source length + 10⌋`` subwords, capped by the model's positional range); every call may change
    some of them (``translate(lines, beam=1)``). ``unk_tokens``: the unknown-word spellings unified in the input.
    ``task``: ``"parallel"`` (translation) or ``"summarization"`` — the ``data.format`` it was trained on, which
    decides how its outputs are scored.
    """

    def __init__(self, model: Seq2Seq, subword: SubwordModel, *, max_len: int, device: torch.device | str = "cpu",
                 decoding: DecodingOptions | None = None, unk_tokens: Sequence[str] = (), task: str = "parallel"):
        if not isinstance(subword, SubwordModel):
            raise ArgumentTypeError(f"subword must be a SubwordModel, got {type(subword).__name__}")
        if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 2:
            raise ArgumentError(f"max_len must be an int >= 2, got {max_len!r}")
        if decoding is not None and not isinstance(decoding, DecodingOptions):
            raise ArgumentTypeError(f"decoding must be DecodingOptions, got {type(decoding).__name__}")
        self.model, self.subword, self.max_len, self.device = model, subword, max_len, torch.device(device)
        self.decoding = decoding or DecodingOptions()
        self.unk_tokens, self.task = tuple(unk_tokens), task

    def encode_source(self, line: str) -> tuple[list[int], bool]:
        """Source ids (``… </s>``) of one line, and whether it had to be truncated."""
        ids = self.subword.encode(unify_unknown([line], self.unk_tokens)[0] if self.unk_tokens else line)
        limit = self.max_len - 1
        return ids[:limit] + [EOS_ID], len(ids) > limit

    @torch.no_grad()
    def translate_ids(self, sources: Sequence[list[int]], *, batch_size: int = 64,
                      progress: Callable[[int, int], None] | None = None, **options) -> list[list[int]]:
        """Output subword ids for encoded sources (each ending in ``</s>``), in input order. ``options``: changes
        of :attr:`decoding` (``beam=…``, ``no_repeat_ngram_size=…``; None keeps one). ``progress(done, total)``
        is called after every batch with the number of sources decoded so far."""
        decoding = self.decoding.replace(**options)
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
            hyps = decoding.search(self.model, src.to(self.device), bos_id=BOS_ID, eos_id=EOS_ID)
            for row, i in enumerate(chunk):
                out[i] = list(hyps[row])
            if progress is not None:
                progress(start + len(chunk), len(order))
        return out

    def translate(self, lines: Sequence[str], *, batch_size: int = 64,
                  on_truncate: Callable[[list[int], int], None] | None = None,
                  progress: Callable[[int, int], None] | None = None, **options) -> list[str]:
        """One detokenised output per line (empty lines stay empty). ``options`` change :attr:`decoding` for this
        call (``beam``, ``length_penalty``, ``length_penalty_kind``, ``min_len``, ``max_len``,
        ``no_repeat_ngram_size``). ``on_truncate`` receives the 1-based numbers of the lines that were cut to the
        model's ``max_len`` and the subwords kept of them; ``progress``: :meth:`translate_ids`."""
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
        hyps = self.translate_ids(sources, batch_size=batch_size, progress=progress, **options)
        for i, hyp in zip(todo, hyps):
            outputs[i] = self.subword.decode(hyp)
        return outputs
