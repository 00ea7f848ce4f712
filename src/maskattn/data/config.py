"""The data section of a run configuration."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from ..sections import Rule, at_least, check_section, in_range, one_of, optional, pair
from ..errors import ConfigError
from .parallel import OVERLONG
from .readers import READERS
from .splits import HOLDOUTS
from .subword import SUBWORD_TYPES
from .tasks import SOURCES

__all__ = ["DataConfig"]


@dataclass
class DataConfig:
    """Where the examples come from and how they are split and encoded (see :func:`load_splits`).

    ``source``: ``files`` (``dir`` + ``train``/``dev``/``test`` file names read with ``format``: ``tsv``,
    ``trec``, ``trec_fine``, ``nli``, ``conll``), ``hf`` (Hugging Face ``datasets``: ``hf_name``,
    ``hf_config``, ``hf_data_files``, ``text_field``/``label_field`` or ``pair_fields``) or ``order`` (the
    synthetic order task: ``order_sizes`` train/dev/test, ``order_lengths`` min/max).

    Translation (``model.type: seq2seq``) reads ``format: parallel``: ``train``/``dev``/``test`` are file
    *prefixes* inside ``dir`` and the files are ``<prefix>.<src_lang>`` / ``<prefix>.<tgt_lang>``
    (:mod:`maskattn.data.parallel`). A joint ``subword`` model (``bpe`` or ``unigram``, at most
    ``subword_vocab`` pieces) is trained on both sides of the train split; training batches hold at most
    ``max_tokens`` padded tokens; ``max_len`` (default: ``model.max_len``) bounds a side in subwords and
    ``overlong`` says what happens to longer training pairs (``filter`` or ``truncate``).

    Without a ``dev`` file, ``dev_fraction`` of the train split is held out as the dev split: ``dev_holdout``
    ``random`` (a sample seeded by ``split_seed``) or ``last`` (the end of the train file, in file order: e.g.
    the first 80 % of a file for training and the last 20 % for model selection).
    """

    source: str = "files"
    dir: str | None = None
    format: str = "tsv"
    train: str | None = "train.tsv"
    dev: str | None = None
    test: str | None = "test.tsv"
    cv_folds: int = 0
    fold: int = 0
    dev_fraction: float = 0.1
    dev_holdout: str = "random"
    split_seed: int = 0
    lowercase: bool = False
    skip_empty: bool = False
    min_freq: int = 1
    max_vocab: int | None = None
    max_len: int | None = None
    vectors: str | None = None
    hf_name: str | None = None
    hf_config: str | None = None
    hf_data_files: dict | None = None
    text_field: str = "text"
    label_field: str = "label"
    pair_fields: list | None = None
    order_sizes: list = field(default_factory=lambda: [4000, 500, 1000])
    order_lengths: list = field(default_factory=lambda: [8, 24])
    src_lang: str | None = None
    tgt_lang: str | None = None
    subword: str = "bpe"
    subword_vocab: int = 8000
    max_tokens: int = 4096
    overlong: str = "filter"

    RULES: ClassVar[dict[str, Rule]] = {
        "source": one_of(*SOURCES),
        "format": one_of(*READERS, "parallel"),
        "cv_folds": Rule(lambda v: at_least(0).accepts(v) and v != 1, "0 (no cross-validation) or an int >= 2"),
        "fold": at_least(0),
        "dev_fraction": in_range(0, 1, low_open=True),
        "dev_holdout": one_of(*HOLDOUTS),
        "split_seed": at_least(0),
        "min_freq": at_least(1),
        "max_vocab": optional(at_least(1)),
        "max_len": optional(at_least(1)),
        "pair_fields": optional(pair(Rule(lambda v: isinstance(v, str) and bool(v), "a field name"))),
        "order_sizes": Rule(lambda v: isinstance(v, list) and len(v) == 3 and all(at_least(1).accepts(x) for x in v),
                            "a list of three ints >= 1 (train, dev, test sizes)"),
        "order_lengths": pair(at_least(2), ordered=True),  # both markers need a position
        "subword": one_of(*SUBWORD_TYPES),
        "subword_vocab": at_least(8),  # 4 special ids + pieces
        "max_tokens": at_least(1),
        "overlong": one_of(*OVERLONG),
    }

    def __post_init__(self):
        check_section(self, "data", self.RULES)
        if self.cv_folds and self.fold >= self.cv_folds:
            raise ConfigError(f"data.fold must be in [0, {self.cv_folds}) with data.cv_folds={self.cv_folds}, "
                              f"got {self.fold}")
        if self.cv_folds and self.dev_holdout == "last":
            raise ConfigError("data.dev_holdout 'last' takes the end of the train file, but with data.cv_folds the "
                              "training folds are a shuffled sample; use data.dev_holdout=random")

    def input_paths(self) -> list[Path]:
        """The files and folders this section reads from (the dataset folder, the word vectors, local files of
        a Hugging Face builder): a run folder must not hold them."""
        paths = [Path(self.dir)] if self.source == "files" and self.dir else []
        if self.vectors:
            paths.append(Path(self.vectors))
        if self.source == "hf" and isinstance(self.hf_data_files, dict):
            for value in self.hf_data_files.values():
                paths += [Path(v) for v in (value if isinstance(value, list) else [value]) if isinstance(v, str)]
        return paths
