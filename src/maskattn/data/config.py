"""The data section of a run configuration."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from ..sections import Rule, at_least, check_section, in_range, one_of, optional, pair
from ..errors import ConfigError
from .parallel import OVERLONG
from .readers import READERS, TOKENIZERS
from .splits import HOLDOUTS
from .subword import RESERVED_PIECES, SUBWORD_TYPES
from .tasks import SOURCES
from .vectors import LOOKUPS

__all__ = ["DataConfig", "SEQ2SEQ_FORMATS"]

#: the formats of line-aligned source / target files (model.type seq2seq): translation, summarization
SEQ2SEQ_FORMATS = ("parallel", "summarization")


def _is_word(value) -> bool:
    return isinstance(value, str) and bool(value) and not any(c.isspace() for c in value)


@dataclass
class DataConfig:
    """Where the examples come from and how they are split and encoded (see :func:`load_splits`).

    ``source``: ``files`` (``dir`` + ``train``/``dev``/``test`` file names read with ``format``: ``tsv``,
    ``trec``, ``trec_fine``, ``nli``, ``conll``), ``hf`` (Hugging Face ``datasets``: ``hf_name``,
    ``hf_config``, ``hf_data_files``, ``text_field``/``label_field`` or ``pair_fields``) or ``order`` (the
    synthetic order task: ``order_sizes`` train/dev/test, ``order_lengths`` min/max).

    Sequence-to-sequence models (``model.type: seq2seq``) read ``format: parallel`` (translation, scored by BLEU
    and chrF) or ``format: summarization`` (article → summary, scored by ROUGE): ``train``/``dev``/``test`` are file
    *prefixes* inside ``dir`` (``train`` may be a list of them, read one after the other) and the files are
    ``<prefix>.<src_lang>`` / ``<prefix>.<tgt_lang>`` (:mod:`maskattn.data.parallel`; for summarization the
    suffixes default to ``src`` / ``tgt``). A joint ``subword`` model (``bpe`` or ``unigram``, at most
    ``subword_vocab`` pieces) is trained on both sides of the train split; training batches hold at most
    ``max_tokens`` padded tokens; ``max_len`` (default: ``model.max_len``) bounds a side in subwords and
    ``overlong`` says what happens to longer training pairs (``filter`` or ``truncate``, with a warning).
    ``unk_tokens``: the spellings a corpus uses for its unknown-word placeholder (Gigaword: ``[UNK, <unk>]``),
    replaced everywhere by the first, which the subword model keeps as one piece.

    Sentences are split into tokens by ``tokenizer``: ``whitespace`` (files already tokenised, such as TREC and
    SST) or ``word_punct`` (runs of word characters and single punctuation marks, ``\\w+|[^\\w\\s]``: raw text
    such as SNLI's, so that ``airplane.`` is ``airplane`` ``.``), lower-cased with ``lowercase``.

    ``vectors``: a pretrained word-vector file in GloVe's text format (:mod:`maskattn.data.vectors`) for the
    embeddings of ``sentence``, ``pair`` and ``tagger`` models, as wide as ``model.embed_dim``; ``vectors_lookup``
    (``lowercase_fallback``: the token as written, else lower-cased — what an uncased file such as GloVe 6B needs,
    whatever ``lowercase`` is; ``exact``); ``vectors_extend``: words of the dev and test splits that the train split
    lacks but the file covers join the vocabulary with their vector, kept fixed (no training signal reaches them;
    the MTSA authors keep every GloVe word outside the training vocabulary fixed the same way) — else they are
    unknown tokens.

    Without a ``dev`` file, ``dev_fraction`` of the train split is held out as the dev split: ``dev_holdout``
    ``random`` (a sample seeded by ``split_seed``) or ``last`` (the end of the train file, in file order: e.g.
    the first 80 % of a file for training and the last 20 % for model selection).
    """

    source: str = "files"
    dir: str | None = None
    format: str = "tsv"
    train: str | list | None = "train.tsv"
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
    vectors_lookup: str = "lowercase_fallback"
    vectors_extend: bool = True
    tokenizer: str = "whitespace"
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
    unk_tokens: list = field(default_factory=list)

    RULES: ClassVar[dict[str, Rule]] = {
        "source": one_of(*SOURCES),
        "format": one_of(*READERS, *SEQ2SEQ_FORMATS),
        "train": optional(Rule(lambda v: isinstance(v, str) or (isinstance(v, list) and bool(v) and all(
            isinstance(x, str) and bool(x) for x in v)), "a file name, or a non-empty list of file prefixes")),
        "cv_folds": Rule(lambda v: at_least(0).accepts(v) and v != 1, "0 (no cross-validation) or an int >= 2"),
        "fold": at_least(0),
        "dev_fraction": in_range(0, 1, low_open=True),
        "dev_holdout": one_of(*HOLDOUTS),
        "split_seed": at_least(0),
        "min_freq": at_least(1),
        "max_vocab": optional(at_least(1)),
        "max_len": optional(at_least(1)),
        "vectors": optional(Rule(lambda v: isinstance(v, str) and bool(v.strip()), "the path of a vectors file")),
        "vectors_lookup": one_of(*LOOKUPS),
        "tokenizer": one_of(*TOKENIZERS),
        "pair_fields": optional(pair(Rule(lambda v: isinstance(v, str) and bool(v), "a field name"))),
        "order_sizes": Rule(lambda v: isinstance(v, list) and len(v) == 3 and all(at_least(1).accepts(x) for x in v),
                            "a list of three ints >= 1 (train, dev, test sizes)"),
        "order_lengths": pair(at_least(2), ordered=True),  # both markers need a position
        "subword": one_of(*SUBWORD_TYPES),
        "subword_vocab": at_least(8),  # 4 special ids + pieces
        "max_tokens": at_least(1),
        "overlong": one_of(*OVERLONG),
        "unk_tokens": Rule(lambda v: isinstance(v, list) and all(_is_word(x) for x in v),
                           "a list of words (no spaces), the first the spelling the others become"),
    }

    def __post_init__(self):
        check_section(self, "data", self.RULES)
        if self.tokenizer != "whitespace" and self.format == "conll":
            raise ConfigError(f"data.tokenizer {self.tokenizer!r} cannot apply to data.format 'conll' (one given token "
                              "per line, each with its tag); use data.tokenizer=whitespace")
        if isinstance(self.train, list) and self.format not in SEQ2SEQ_FORMATS:
            raise ConfigError(f"data.train lists several files, which only data.format {' or '.join(SEQ2SEQ_FORMATS)} "
                              f"reads; give one file for data.format {self.format!r}")
        if self.unk_tokens and self.format not in SEQ2SEQ_FORMATS:
            raise ConfigError(f"data.unk_tokens applies to the subword model of data.format "
                              f"{' or '.join(SEQ2SEQ_FORMATS)}, not to {self.format!r}")
        if self.unk_tokens and self.unk_tokens[0] in RESERVED_PIECES:
            raise ConfigError(f"data.unk_tokens[0] {self.unk_tokens[0]!r} is a special piece of the subword model "
                              f"({', '.join(RESERVED_PIECES)}); put a spelling of the corpus first, e.g. "
                              f"[UNK, {self.unk_tokens[0]}]")
        if self.cv_folds and self.fold >= self.cv_folds:
            raise ConfigError(f"data.fold must be in [0, {self.cv_folds}) with data.cv_folds={self.cv_folds}, "
                              f"got {self.fold}")
        if self.cv_folds and self.dev_holdout == "last":
            raise ConfigError("data.dev_holdout 'last' takes the end of the train file, but with data.cv_folds the "
                              "training folds are a shuffled sample; use data.dev_holdout=random")

    @property
    def token_options(self) -> dict:
        """How text becomes tokens, as the keywords of :func:`~maskattn.data.readers.tokenize` and of every reader:
        the same in training, evaluation, prediction and plots."""
        return {"lowercase": self.lowercase, "tokenizer": self.tokenizer}

    @property
    def suffixes(self) -> tuple[str | None, str | None]:
        """The source and target file suffixes: ``src_lang`` / ``tgt_lang`` (for summarization ``src`` / ``tgt``
        unless set)."""
        if self.format == "summarization":
            return self.src_lang or "src", self.tgt_lang or "tgt"
        return self.src_lang, self.tgt_lang

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
