"""Readers for the on-disk formats: ``label<TAB>text`` TSV, TREC's ``coarse<TAB>fine<TAB>text``, NLI JSON
lines (``premise``/``hypothesis``/``label``) and CoNLL-style ``token<whitespace>tag`` columns.

Files are read with the toolkit's line policy (:mod:`.text`: UTF-8, a byte-order mark dropped, lines split on
``\\n`` only); blank lines are skipped (CoNLL: they separate sentences). Every malformed line raises
:class:`~maskattn.errors.DataError` (a ``ValueError``) naming the file and the 1-based line number.
"""

from __future__ import annotations

import json
import re
from functools import partial
from collections.abc import Callable, Iterable
from pathlib import Path

from ..errors import ArgumentError, DataError
from .examples import PairExample, TaggedExample, TextExample
from .text import iter_lines

__all__ = ["tokenize", "TOKENIZERS", "read_tsv", "read_trec", "read_nli_jsonl", "read_conll", "read_sentences", "READERS"]


_WORD_PUNCT = re.compile(r"\w+|[^\w\s]")
#: ``data.tokenizer``: how a line of text becomes tokens
TOKENIZERS = ("whitespace", "word_punct")


def tokenize(text: str, *, lowercase: bool = False, tokenizer: str = "whitespace") -> tuple[str, ...]:
    """Tokens of ``text``: split at whitespace (``whitespace``: the benchmark files that are already tokenised) or
    into runs of word characters and single punctuation marks (``word_punct``, ``\\w+|[^\\w\\s]``: raw text
    such as SNLI's); lower-cased with ``lowercase``."""
    text = text.lower() if lowercase else text
    if tokenizer == "whitespace":
        return tuple(text.split())
    if tokenizer == "word_punct":
        return tuple(_WORD_PUNCT.findall(text))
    raise ArgumentError(f"unknown tokenizer {tokenizer!r}; expected one of {', '.join(TOKENIZERS)}")


def _lines(path: Path) -> Iterable[tuple[int, str]]:
    """``(line number, line)`` of the non-blank lines of ``path``."""
    return ((number, line) for number, line in iter_lines(path) if line.strip())


def _check_label(label: str, labels: Iterable[str] | None, where: str) -> str:
    if not label:
        raise DataError(f"{where}: empty label")
    if labels is not None and label not in labels:
        raise DataError(f"{where}: unknown label {label!r}; expected one of {sorted(labels)}")
    return label


def _nonempty(tokens: tuple[str, ...], where: str, what: str = "text") -> tuple[str, ...]:
    if not tokens:
        raise DataError(f"{where}: empty {what}")
    return tokens


def _nonempty_file(examples: list, path: Path) -> list:
    if not examples:
        raise DataError(f"data file {path} holds no examples (empty dataset)")
    return examples


def read_tsv(path: str | Path, *, labels: Iterable[str] | None = None, lowercase: bool = False,
             skip_empty: bool = False, tokenizer: str = "whitespace") -> list[TextExample]:
    """``label<TAB>text`` per line: exactly one tab (a line with more columns is an error, never glued into the
    text). ``labels``: the allowed label set (an unknown label is an error). A line with an empty text is an
    error, or skipped with ``skip_empty`` (CR's all.tsv has one)."""
    path = Path(path)
    labels = None if labels is None else set(labels)
    out = []
    for number, line in _lines(path):
        where = f"{path}:{number}"
        tabs = line.count("\t")
        if tabs != 1:  # a second tab would glue a column into the text (TREC's fine label, say)
            raise DataError(f"{where}: expected 'label<TAB>text', found {tabs or 'no'} tab{'s' * (tabs != 1)} in "
                            f"{line[:60]!r}" + (" (format trec reads coarse<TAB>fine<TAB>text)" if tabs == 2 else ""))
        label, text = line.split("\t")
        if skip_empty and not text.strip():
            continue
        out.append(TextExample(_nonempty(tokenize(text, lowercase=lowercase, tokenizer=tokenizer), where),
                               _check_label(label.strip(), labels, where), line=number))
    return _nonempty_file(out, path)


def read_trec(path: str | Path, *, labels: Iterable[str] | None = None, lowercase: bool = False,
              fine: bool = False, skip_empty: bool = False, tokenizer: str = "whitespace") -> list[TextExample]:
    """TREC's ``coarse<TAB>fine<TAB>text`` (exactly two tabs); the label is the coarse class (6-way) or, with
    ``fine``, ``coarse:fine`` (50-way)."""
    path = Path(path)
    labels = None if labels is None else set(labels)
    out = []
    for number, line in _lines(path):
        where = f"{path}:{number}"
        parts = line.split("\t")
        if len(parts) != 3:
            raise DataError(f"{where}: expected 'coarse<TAB>fine<TAB>text', found {len(parts) - 1} tab(s) "
                             f"in {line[:60]!r}")
        coarse, fine_label, text = parts
        label = f"{coarse.strip()}:{fine_label.strip()}" if fine else coarse.strip()
        if skip_empty and not text.strip():
            continue
        out.append(TextExample(_nonempty(tokenize(text, lowercase=lowercase, tokenizer=tokenizer), where),
                               _check_label(label, labels, where), line=number))
    return _nonempty_file(out, path)


def read_nli_jsonl(path: str | Path, *, labels: Iterable[str] | None = None, lowercase: bool = False,
                   tokenizer: str = "whitespace") -> list[PairExample]:
    """One JSON object per line with string fields ``premise``, ``hypothesis`` and ``label``."""
    path = Path(path)
    labels = None if labels is None else set(labels)
    out = []
    for number, line in _lines(path):
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise DataError(f"{where}: expected a JSON object with premise/hypothesis/label")
        missing = [key for key in ("premise", "hypothesis", "label") if key not in record]
        if missing:
            raise DataError(f"{where}: missing field(s) {missing}; expected premise, hypothesis, label")
        premise, hypothesis = (tokenize(str(record[key]), lowercase=lowercase, tokenizer=tokenizer)
                               for key in ("premise", "hypothesis"))
        out.append(PairExample(_nonempty(premise, where, "premise"), _nonempty(hypothesis, where, "hypothesis"),
                               _check_label(str(record["label"]), labels, where), line=number))
    return _nonempty_file(out, path)


def read_conll(path: str | Path, *, labels: Iterable[str] | None = None, lowercase: bool = False,
               token_column: int = 0, tag_column: int = -1, tokenizer: str = "whitespace") -> list[TaggedExample]:
    """CoNLL-style columns: one ``token ... tag`` line per token (whitespace-separated), sentences separated
    by blank lines; ``-DOCSTART-`` lines are skipped. The tokens are given: ``tokenizer`` must be
    ``whitespace`` (a token split again would lose its tag)."""
    if tokenizer != "whitespace":
        raise ArgumentError(f"data.tokenizer {tokenizer!r} cannot apply to CoNLL columns (one token per line, each "
                            "with its tag); use data.tokenizer=whitespace")
    path = Path(path)
    labels = None if labels is None else set(labels)
    out: list[TaggedExample] = []
    rows: list[tuple[int | None, str, str]] = []  # (line number, token, tag) of the current sentence
    for number, line in [*iter_lines(path), (None, "")]:  # a final blank line ends the last sentence
        columns = line.split()
        if not columns:
            if rows:
                out.append(TaggedExample(tuple(r[1] for r in rows), tuple(r[2] for r in rows), line=rows[0][0]))
                rows = []
            continue
        if columns[0] == "-DOCSTART-":
            continue
        where = f"{path}:{number}"
        if len(columns) < 2:
            raise DataError(f"{where}: expected 'token <whitespace> tag', found one column {line.strip()!r}")
        token = columns[token_column]
        rows.append((number, token.lower() if lowercase else token, _check_label(columns[tag_column], labels, where)))
    return _nonempty_file(out, path)


def read_sentences(path: str | Path, *, lowercase: bool = False, tokenizer: str = "whitespace") -> list[tuple[str, ...]]:
    """Unlabelled sentences, one per line, split by ``tokenizer``; blank lines are skipped."""
    path = Path(path)
    return [tokenize(line, lowercase=lowercase, tokenizer=tokenizer) for _, line in _lines(path)]


READERS: dict[str, Callable] = {"tsv": read_tsv, "trec": read_trec, "trec_fine": partial(read_trec, fine=True), "nli": read_nli_jsonl,
                                "conll": read_conll}
