"""Parallel data (translation; article → summary pairs): line-aligned source/target files, subword encoding,
token-count batches.

Files follow the ``<prefix>.<lang>`` convention (Multi30k, IWSLT, WMT; Gigaword's ``train.src`` / ``train.tgt``):
``train.en`` / ``train.de`` hold line *i* of the source and its translation on line *i* of the target; lines
are read with the toolkit's line policy (:mod:`.text`: UTF-8, ``\\n`` only). A pair of files with different line
counts raises ``DataError`` naming both files and their counts. Several file pairs of a split are read one
after the other (:func:`read_parallel_prefixes`: ``train: [train, train_extra]``).

Unknown words: a corpus that writes rare words as a placeholder (Gigaword: ``<unk>`` in train and valid,
``UNK`` in test) can have every spelling replaced by the first one (:func:`unify_unknown`, ``data.unk_tokens``),
which the subword model keeps as one piece, so ``UNK`` is never split into characters.

Empty lines: in the **training** split a pair whose source or target is empty (or whitespace only) is
skipped — it teaches nothing. In **dev / test** every line is kept, so scores are computed on the full
reference set (an empty source is translated to an empty line).

Length: training pairs longer than ``max_len`` subwords on either side (counting the ``</s>`` / ``<s>``
marks) are dropped (``overlong="filter"``, the default) or cut to fit (``overlong="truncate"``). Dev / test
pairs are always truncated to ``max_len`` (the model cannot read more; this affects the dev loss only — BLEU
is computed against the raw reference lines).

Encoded pair: ``{"src": ids + [eos], "tgt": [bos] + ids + [eos]}``. Decoder input is ``tgt[:-1]``, decoder
target ``tgt[1:]``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import ArgumentError, DataError
from .batching import epoch_generator
from .subword import BOS_ID, EOS_ID, PAD_ID, SubwordModel
from .text import read_lines

__all__ = ["OVERLONG", "ParallelText", "parallel_paths", "read_parallel", "read_parallel_prefixes", "unify_unknown",
           "encode_pairs", "EncodedPairs", "TranslationBatch", "collate_pairs", "TokenBatchSampler", "pair_size"]

OVERLONG = ("filter", "truncate")


@dataclass
class ParallelText:
    """Raw line-aligned text of one split: ``source[i]`` translates to ``target[i]``. ``files``: the
    (source, target) file pairs it was read from, in order (default: the one pair ``src_path``, ``tgt_path``)."""

    source: list[str]
    target: list[str]
    src_path: Path
    tgt_path: Path
    files: list[tuple[Path, Path]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.files:
            self.files = [(self.src_path, self.tgt_path)]

    def __len__(self) -> int:
        return len(self.source)

    def describe(self) -> str:
        """The files, for messages: ``a.en / a.de`` (``+`` between pairs)."""
        return " + ".join(f"{src} / {tgt}" for src, tgt in self.files)

    def with_unknown(self, spellings: Sequence[str]) -> ParallelText:
        """This text with every unknown-word spelling replaced by the first one (:func:`unify_unknown`)."""
        if not spellings:
            return self
        return ParallelText(unify_unknown(self.source, spellings), unify_unknown(self.target, spellings),
                            self.src_path, self.tgt_path, list(self.files))


def unify_unknown(lines: Sequence[str], spellings: Sequence[str]) -> list[str]:
    """``lines`` with every whitespace-separated word equal to one of ``spellings`` replaced by ``spellings[0]``
    (``["UNK", "<unk>"]``: a ``<unk>`` of the train files becomes the test files' ``UNK``); the rest is kept as it
    is, whitespace included."""
    if not spellings:
        return list(lines)
    pattern = re.compile(r"(?<!\S)(?:" + "|".join(map(re.escape, spellings)) + r")(?!\S)")
    return [pattern.sub(spellings[0], line) for line in lines]


def parallel_paths(folder: str | Path, prefix: str, src_lang: str, tgt_lang: str) -> tuple[Path, Path]:
    """``<folder>/<prefix>.<src_lang>`` and ``<folder>/<prefix>.<tgt_lang>``."""
    if not src_lang or not tgt_lang:
        raise ArgumentError(f"parallel data needs data.src_lang and data.tgt_lang (file suffixes such as 'en', 'de'), "
                         f"got {src_lang!r} and {tgt_lang!r}")
    if src_lang == tgt_lang:
        raise ArgumentError(f"data.src_lang and data.tgt_lang are both {src_lang!r}; they name two different files")
    root = Path(folder)
    return root / f"{prefix}.{src_lang}", root / f"{prefix}.{tgt_lang}"


def read_parallel(src_path: str | Path, tgt_path: str | Path) -> ParallelText:
    """Read two line-aligned files (UTF-8); different line counts raise ``DataError``."""
    src_path, tgt_path = Path(src_path), Path(tgt_path)
    source, target = read_lines(src_path), read_lines(tgt_path)
    if len(source) != len(target):
        raise DataError(f"parallel files are not line-aligned: {src_path} has {len(source)} lines, "
                         f"{tgt_path} has {len(target)} lines")
    return ParallelText(source, target, src_path, tgt_path)


def read_parallel_prefixes(folder: str | Path, prefixes: str | Sequence[str], src_lang: str,
                           tgt_lang: str) -> ParallelText:
    """The file pairs ``<folder>/<prefix>.<src_lang>`` / ``.<tgt_lang>`` of one prefix or several (concatenated in
    order, as one split)."""
    names = [prefixes] if isinstance(prefixes, str) else list(prefixes)
    if not names:
        raise ArgumentError("no file prefix given: expected a prefix such as 'train' or a list of them")
    parts = [read_parallel(*parallel_paths(folder, name, src_lang, tgt_lang)) for name in names]
    return ParallelText([line for part in parts for line in part.source], [line for part in parts for line in part.target],
                        parts[0].src_path, parts[0].tgt_path, [pair for part in parts for pair in part.files])


@dataclass
class EncodedPairs:
    """Encoded pairs and what encoding did: ``kept[i]`` is the line index (0-based) of ``items[i]``."""

    items: list[dict]
    kept: list[int]
    skipped_empty: int = 0
    filtered: int = 0
    truncated: int = 0


def encode_pairs(text: ParallelText, subword: SubwordModel, *, max_len: int, training: bool,
                 overlong: str = "filter") -> EncodedPairs:
    """Subword-encode a split (see the module docstring for empty lines and length handling).

    ``max_len``: the longest sequence the model takes, counting ``</s>`` on the source and ``<s>`` on the
    decoder input (so at most ``max_len - 1`` subwords per side).
    """
    if overlong not in OVERLONG:
        raise ArgumentError(f"unknown data.overlong {overlong!r}; expected one of {', '.join(OVERLONG)}")
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 2:
        raise ArgumentError(f"max_len must be an int >= 2 (one subword + </s>), got {max_len!r}")
    out = EncodedPairs([], [])
    limit = max_len - 1
    sources = subword.encode_batch(text.source)
    targets = subword.encode_batch(text.target)
    for i, (src, tgt) in enumerate(zip(sources, targets)):
        if training and not (text.source[i].strip() and text.target[i].strip()):
            out.skipped_empty += 1
            continue
        too_long = len(src) > limit or len(tgt) > limit
        if too_long and training and overlong == "filter":
            out.filtered += 1
            continue
        if too_long:
            out.truncated += 1
            src, tgt = src[:limit], tgt[:limit]
        out.items.append({"src": src + [EOS_ID], "tgt": [BOS_ID] + tgt + [EOS_ID]})
        out.kept.append(i)
    return out


def pair_size(item: dict) -> int:
    """Padded width of a pair in a batch: the longer of the source and the decoder input."""
    return max(len(item["src"]), len(item["tgt"]) - 1)


@dataclass
class TranslationBatch:
    """``src`` ``(B, S)``, decoder input ``tgt_in`` ``(B, T)`` and targets ``tgt_out`` ``(B, T)``, padded with
    ``pad_id``; ``ntokens``: target tokens (non-padding entries of ``tgt_out``, the loss terms)."""

    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    ntokens: int

    def to(self, device) -> TranslationBatch:
        return TranslationBatch(self.src.to(device, non_blocking=True), self.tgt_in.to(device, non_blocking=True),
                                self.tgt_out.to(device, non_blocking=True), self.ntokens)


def _pad(rows: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    out = torch.full((len(rows), max(1, max(len(r) for r in rows))), pad_id, dtype=torch.long)  # (B, n)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    return out


def collate_pairs(items: Sequence[dict], pad_id: int = PAD_ID) -> TranslationBatch:
    """Pad encoded pairs into a :class:`TranslationBatch`."""
    if not items:
        raise ArgumentError("cannot collate an empty batch")
    src = _pad([it["src"] for it in items], pad_id)
    tgt_in = _pad([it["tgt"][:-1] for it in items], pad_id)
    tgt_out = _pad([it["tgt"][1:] for it in items], pad_id)
    return TranslationBatch(src, tgt_in, tgt_out, sum(len(it["tgt"]) - 1 for it in items))


class TokenBatchSampler:
    """Batches bounded by a token budget: ``len(batch) × max pair_size ≤ max_tokens`` (padding included).

    Pairs are sorted by (padded width, source length, target length) and cut greedily into batches, so a
    batch holds pairs of similar length (little padding). With ``shuffle``, pairs with identical lengths are
    permuted and the batch order is shuffled by a generator seeded from ``(seed, epoch)`` — ``batches(epoch)``
    is a pure function of them (exact resume) — and the number of batches is the same in every epoch.
    """

    def __init__(self, items: Sequence[dict], max_tokens: int, *, shuffle: bool = True, seed: int = 0):
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ArgumentError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
        if not items:
            raise ArgumentError("cannot batch an empty dataset")
        self.sizes = [pair_size(it) for it in items]
        longest = max(self.sizes)
        if longest > max_tokens:
            raise ArgumentError(f"a pair is {longest} tokens wide but max_tokens is {max_tokens}; raise data.max_tokens "
                             "or lower data.max_len")
        self.keys = [(pair_size(it), len(it["src"]), len(it["tgt"])) for it in items]
        self.max_tokens, self.shuffle, self.seed = max_tokens, shuffle, seed
        self._num_batches = len(self._cut(sorted(range(len(items)), key=lambda i: (self.keys[i], i))))

    def __len__(self) -> int:
        return self._num_batches

    def generator(self, epoch: int) -> torch.Generator:
        return epoch_generator(self.seed, epoch)

    def _cut(self, order: list[int]) -> list[list[int]]:
        batches: list[list[int]] = []
        current: list[int] = []
        width = 0
        for i in order:
            new_width = max(width, self.sizes[i])
            if current and new_width * (len(current) + 1) > self.max_tokens:
                batches.append(current)
                current, new_width = [], self.sizes[i]
            current.append(i)
            width = new_width
        if current:
            batches.append(current)
        return batches

    def batches(self, epoch: int = 0) -> list[list[int]]:
        n = len(self.sizes)
        if not self.shuffle:
            return self._cut(sorted(range(n), key=lambda i: (self.keys[i], i)))
        g = self.generator(epoch)
        tie_break = torch.randperm(n, generator=g).tolist()
        batches = self._cut(sorted(range(n), key=lambda i: (self.keys[i], tie_break[i])))
        return [batches[i] for i in torch.randperm(len(batches), generator=g).tolist()]
