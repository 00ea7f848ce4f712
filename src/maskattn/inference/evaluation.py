"""Scoring a checkpoint on files: a classifier on a labelled file (:func:`evaluate_file`), a translation model
on a source file against a reference file (:func:`evaluate_translation`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..data.parallel import read_parallel
from ..data.readers import READERS
from ..errors import DataError, InputError
from ..metrics import corpus_scores, evaluate
from ..device import resolve_device
from .loading import load_model, load_translator
from .translator import Translator

__all__ = ["evaluate_file", "evaluate_translation"]


def evaluate_file(path: str | Path, data_file: str | Path, *, format: str | None = None, batch_size: int = 256,  # noqa: A002 (public keyword, as data.format)
                  device: str = "cpu", on_truncate: Callable[[list[int], int], None] | None = None) -> dict[str, float]:
    """Metrics of a classifier checkpoint on a labelled file (``format`` defaults to the checkpoint's data
    format). Examples longer than the model reads are truncated, as in training; ``on_truncate`` receives
    their line numbers in ``data_file`` and the limit."""
    loaded = load_model(path, device=device)
    fmt = format or loaded.config.data.format
    if fmt not in READERS:
        raise InputError(f"unknown format {fmt!r}; expected one of {', '.join(READERS)}")
    try:
        examples = READERS[fmt](data_file, labels=loaded.labels.itos, lowercase=loaded.config.data.lowercase)
    except DataError as exc:
        if fmt == loaded.config.data.format:
            raise
        raise DataError(f"{exc} — read as format {fmt!r}, but the checkpoint was trained on format "
                        f"{loaded.config.data.format!r} (leave out --format to read it so)") from None
    items, truncated = loaded.encode(examples, loaded.labels)
    if truncated and on_truncate is not None:
        on_truncate([line for i in truncated if (line := examples[i].line) is not None], loaded.input_limit)
    return evaluate(loaded.model, items, loaded.labels, batch_size=batch_size, device=resolve_device(device))


def evaluate_translation(path: str | Path | Translator, src_file: str | Path, ref_file: str | Path, *,
                         beam: int = 5, length_penalty: float = 0.6, batch_size: int = 64, device: str = "cpu",
                         on_truncate: Callable[[list[int], int], None] | None = None) -> dict:
    """Translate ``src_file`` line by line and score it against ``ref_file`` (line-aligned): sacreBLEU BLEU and
    chrF with their signatures. Different line counts or empty files raise :class:`DataError`; source lines
    longer than the model takes are truncated (``on_truncate``: :meth:`Translator.translate`)."""
    text = read_parallel(src_file, ref_file)
    if not len(text):
        raise DataError(f"{src_file} and {ref_file} hold no lines: there is nothing to score")
    translator = path if isinstance(path, Translator) else load_translator(path, device=device)
    hypotheses = translator.translate(text.source, beam=beam, length_penalty=length_penalty, batch_size=batch_size,
                                      on_truncate=on_truncate)
    return corpus_scores(hypotheses, text.target)
