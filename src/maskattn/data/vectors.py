"""Pretrained word vectors in GloVe's text format (``word v1 v2 … vd`` per line; a word2vec / fastText header
line ``<words> <width>`` is accepted too), matched to a vocabulary.

A vocabulary token finds its vector by ``lookup`` (:data:`LOOKUPS`): ``lowercase_fallback`` takes the token as
written, else its lower-cased form — right for uncased files such as GloVe 6B (every word lower-case) and for
cased ones such as GloVe 840B — while the model keeps its own casing (``data.lowercase``); ``exact`` takes the
token as written only.

The file is checked before training starts, each mistake a :class:`~maskattn.errors.DataError` naming the
file and line: a line whose width differs from the first vector line, a width other than the model's embedding
width, a duplicated word, numbers that do not parse or are not finite (checked for the words the vocabulary
uses; every line is checked for its word and width), a file that covers none of the vocabulary. A word may
contain spaces (GloVe 840B has a few, e.g. ``. . .``): the last ``width`` fields of a line are its numbers; the
width is the count of numbers that end the first vector line (a tab after the word separates like a space). No
line is held past :func:`maskattn.data.text.max_line_bytes` (16 MiB): a file without line breaks is refused after
reading that much of it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import DataError, warn_renamed
from .text import iter_lines
from .vocab import PAD, UNK, Vocabulary

__all__ = ["LOOKUPS", "WordVectors", "read_vectors", "load_vectors", "vector_coverage", "load_glove"]

LOOKUPS = ("lowercase_fallback", "exact")  # data.vectors_lookup


def _candidates(token: str, lookup: str) -> tuple[str, ...]:
    """The file words that may give ``token`` its vector, in order of preference."""
    lower = token.lower()
    return (token, lower) if lookup == "lowercase_fallback" and lower != token else (token,)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _header_width(line: str) -> int | None:
    """The width of a word2vec / fastText header line ``<words> <width>``, else None."""
    parts = line.split()
    return int(parts[1]) if len(parts) == 2 and all(p.isdigit() for p in parts) else None


def read_vectors(path: str | Path, dim: int, words: Iterable[str]) -> dict[str, np.ndarray]:
    """The vectors of ``words`` found in the file ``path`` (float32, ``(dim,)`` each), after checking the whole
    file (module docstring); ``dim``: the model's embedding width, which the file's width must equal."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"pretrained vectors file {path} {'is not a file' if path.exists() else 'does not exist'}")
    wanted = set(words)
    seen: dict[str, int] = {}  # word -> line
    found: dict[str, np.ndarray] = {}
    width, first = None, 0
    for number, line in iter_lines(path):
        if not line.strip():
            continue
        if width is None and number == 1 and (header := _header_width(line)) is not None:
            width, first = header, number
            _check_width(path, number, width, dim, "the header line gives")
            continue
        parts = line.rstrip().replace("\t", " ").split(" ")
        if width is None:  # the numbers that end the line (the word before them may hold spaces, or be a number)
            width, first = next((len(parts) - 1 - j for j in range(len(parts) - 1, -1, -1)
                                 if not _is_number(parts[j])), len(parts) - 1), number
            if width < 1:
                raise DataError(f"{path}:{number}: expected a word and its numbers separated by spaces, got "
                                f"{line[:60]!r}")
            _check_width(path, number, width, dim, "its first line has")
        if len(parts) < width + 1 or (len(parts) > width + 1 and all(map(_is_number, parts[1:len(parts) - width]))):
            raise DataError(f"{path}:{number}: expected a word and {width} numbers (the width of line {first}), got "
                            f"{len(parts) - 1} fields")
        word = " ".join(parts[:len(parts) - width])
        if word in seen:
            raise DataError(f"{path}:{number}: the word {word!r} appears a second time (first on line {seen[word]}); "
                            "a vectors file holds one vector per word")
        seen[word] = number
        if word in wanted:
            found[word] = _parse(parts[len(parts) - width:], path, number)
    if width is None:
        raise DataError(f"pretrained vectors file {path} holds no vectors (empty)")
    return found


def _check_width(path: Path, number: int, width: int, dim: int, what: str) -> None:
    if width != dim:
        raise DataError(f"{path}:{number}: {what} {width} numbers per word, but the model's word embeddings are {dim} "
                        f"wide (model.embed_dim, or model.d_model when it is not set); set model.embed_dim={width}")


def _parse(values: list[str], path: Path, number: int) -> np.ndarray:
    try:
        vector = np.array(values, dtype=np.float32)
    except ValueError:
        bad = next(v for v in values if not _is_number(v))
        raise DataError(f"{path}:{number}: {bad!r} (value {values.index(bad) + 1}) is not a number") from None
    if not np.isfinite(vector).all():
        bad_at = int(np.flatnonzero(~np.isfinite(vector))[0])
        raise DataError(f"{path}:{number}: value {bad_at + 1} is {values[bad_at]!r}, not a finite number")
    return vector


@dataclass
class WordVectors:
    """Pretrained rows for a vocabulary: ``weight`` ``(len(vocab), dim)`` (zero where nothing was found),
    ``found`` ``(len(vocab),)`` bool, and the ``fixed`` tokens at the end of the vocabulary (added for words of
    the dev / test splits that the training data lacks; their vectors stay as the file gives them)."""

    path: Path
    lookup: str
    weight: torch.Tensor
    found: torch.Tensor
    fixed: int = 0


def load_vectors(path: str | Path, vocab: Vocabulary, dim: int, *, lookup: str = "lowercase_fallback",
                 extra_tokens: Iterable[str] = ()) -> tuple[Vocabulary, WordVectors]:
    """Match the vectors file ``path`` to ``vocab`` (module docstring). ``extra_tokens`` (tokens of the dev and
    test splits) that are not in ``vocab`` but have a vector are appended to the vocabulary, in order of first
    appearance, as fixed rows. Returns the (possibly extended) vocabulary and its :class:`WordVectors`."""
    if lookup not in LOOKUPS:
        raise DataError(f"unknown data.vectors_lookup {lookup!r}; expected one of {', '.join(LOOKUPS)}")
    extra = [t for t in dict.fromkeys(extra_tokens) if t not in vocab and t not in (PAD, UNK)]
    tokens = [t for t in vocab.itos[2:]] + extra
    table = read_vectors(path, dim, (c for t in tokens for c in _candidates(t, lookup)))

    def vector(token: str) -> np.ndarray | None:
        return next((table[c] for c in _candidates(token, lookup) if c in table), None)

    added = [t for t in extra if vector(t) is not None]
    full = Vocabulary(vocab.itos + added) if added else vocab
    weight = torch.zeros(len(full), dim)
    found = torch.zeros(len(full), dtype=torch.bool)
    for index, token in enumerate(full.itos[2:], start=2):
        if (row := vector(token)) is not None:
            weight[index] = torch.from_numpy(row)
            found[index] = True
    if not found[:len(vocab)].any():
        raise DataError(f"pretrained vectors file {path} covers none of the {len(vocab) - 2} training vocabulary types "
                        f"(data.vectors_lookup={lookup}); is it the right file, and the data's language?")
    return full, WordVectors(Path(path), lookup, weight, found, len(added))


def vector_coverage(vectors: WordVectors, vocab: Vocabulary, train_counts: Counter) -> dict:
    """How much of the training data the file covers: vocabulary types (padding and unknown aside) and the share
    of training tokens (tokens outside the vocabulary, e.g. under ``data.min_freq``, count as not covered)."""
    trained = len(vocab) - vectors.fixed
    types = int(vectors.found[2:trained].sum())
    total = sum(train_counts.values())
    covered = sum(count for token, count in train_counts.items()
                  if (index := vocab.stoi.get(token)) is not None and index < trained and bool(vectors.found[index]))
    return {"file": str(vectors.path), "lookup": vectors.lookup, "vocab_types": trained - 2, "types_covered": types,
            "train_tokens": total, "token_share": covered / total if total else 0.0, "fixed_eval_types": vectors.fixed}


def load_glove(path: str | Path, vocab: Vocabulary, dim: int, *, init_range: float = 0.05,
               seed: int = 0) -> tuple[torch.Tensor, int]:
    """Deprecated (until :data:`maskattn.errors.REMOVED_IN`): :func:`load_vectors` with ``exact`` lookup, as one
    ``(len(vocab), dim)`` matrix whose rows without a vector are uniform in ``[-init_range, init_range]`` (padding
    0), and the number of tokens found."""
    warn_renamed("maskattn.data.load_glove", "maskattn.data.load_vectors (it returns the rows found and their mask)")
    _, vectors = load_vectors(path, vocab, dim, lookup="exact")
    weight = torch.empty(len(vocab), dim).uniform_(-init_range, init_range,
                                                   generator=torch.Generator().manual_seed(seed))
    weight[vectors.found] = vectors.weight[vectors.found]
    weight[vocab.pad_id] = 0.0
    return weight, int(vectors.found.sum())
