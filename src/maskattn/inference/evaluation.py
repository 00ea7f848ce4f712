"""Scoring a checkpoint on files: a classifier on a labelled file (:func:`evaluate_file`), a seq2seq model
(translation or summarization) on a source file against a reference file (:func:`evaluate_translation`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..data.parallel import read_parallel
from ..data.readers import READERS
from ..errors import DataError, InputError
from ..files import atomic_write
from ..metrics import SEQ2SEQ_SCORES, check_references, scored_predictions
from ..metrics.test_outputs import hypotheses_bytes, predictions_bytes
from ..device import resolve_device
from .loading import load_model, load_translator
from .translator import Translator

__all__ = ["evaluate_file", "evaluate_translation"]


def evaluate_file(path: str | Path, data_file: str | Path, *, format: str | None = None, batch_size: int = 256,  # noqa: A002 (public keyword, as data.format)
                  device: str = "cpu", on_truncate: Callable[[list[int], int], None] | None = None,
                  predictions: str | Path | None = None) -> dict[str, float]:
    """Metrics of a classifier checkpoint on a labelled file (``format`` defaults to the checkpoint's data
    format). Examples longer than the model reads are truncated, as in training; ``on_truncate`` receives
    their line numbers in ``data_file`` and the limit. ``predictions``: a file to write each example's predicted
    and gold label to (``test.pred.jsonl``'s format, :mod:`maskattn.metrics.test_outputs`)."""
    loaded = load_model(path, device=device)
    fmt = format or loaded.config.data.format
    if fmt not in READERS:
        raise InputError(f"unknown format {fmt!r}; expected one of {', '.join(READERS)}")
    try:
        examples = READERS[fmt](data_file, labels=loaded.labels.itos, **loaded.config.data.token_options)
    except DataError as exc:
        if fmt == loaded.config.data.format:
            raise
        raise DataError(f"{exc} — read as format {fmt!r}, but the checkpoint was trained on format "
                        f"{loaded.config.data.format!r} (leave out --format to read it so)") from None
    items, truncated = loaded.encode(examples, loaded.labels)
    if truncated and on_truncate is not None:
        on_truncate([line for i in truncated if (line := examples[i].line) is not None], loaded.input_limit)
    metrics, named = scored_predictions(loaded.model, items, loaded.labels, batch_size=batch_size,
                                        device=resolve_device(device))
    if predictions is not None:
        atomic_write(predictions, [predictions_bytes(named)])
    return metrics


def evaluate_translation(path: str | Path | Translator, src_file: str | Path, ref_file: str | Path, *,
                         batch_size: int = 64, device: str = "cpu",
                         on_truncate: Callable[[list[int], int], None] | None = None,
                         progress: Callable[[int, int], None] | None = None, predictions: str | Path | None = None,
                         **options) -> dict:
    """Run a seq2seq checkpoint (or :class:`Translator`) on ``src_file`` line by line and score its outputs against
    ``ref_file`` (line-aligned) as its task is scored: a translation model by sacreBLEU BLEU and chrF with their
    signatures, a summarization model by ROUGE-1/2/L F1 with 95 % bootstrap intervals
    (:func:`~maskattn.metrics.rouge_scores`). ``options`` change the checkpoint's decoding settings (``beam=…``,
    :class:`DecodingOptions`). Different line counts or empty files raise :class:`DataError`, and so do empty
    reference summaries (naming their lines); source lines longer than the model takes are truncated
    (``on_truncate``, ``progress``: :meth:`Translator.translate`). ``predictions``: a file to write the
    hypotheses to (``test.hyp.txt``'s format, :mod:`maskattn.metrics.test_outputs`)."""
    text = read_parallel(src_file, ref_file)
    if not len(text):
        raise DataError(f"{src_file} and {ref_file} hold no lines: there is nothing to score")
    translator = path if isinstance(path, Translator) else load_translator(path, device=device)
    score, _ = SEQ2SEQ_SCORES[translator.task]
    text = text.with_unknown(translator.unk_tokens)
    if translator.task == "summarization":
        check_references(text.target, str(ref_file))  # before decoding, which can take a while
    hypotheses = translator.translate(text.source, batch_size=batch_size, on_truncate=on_truncate, progress=progress,
                                      **options)
    if predictions is not None:
        atomic_write(predictions, [hypotheses_bytes(hypotheses)])
    return score(hypotheses, text.target)

