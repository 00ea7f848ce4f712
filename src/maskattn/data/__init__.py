"""Data: the line policy of every text file (:mod:`.text`), readers (TSV, TREC, NLI JSONL, CoNLL),
vocabularies, splits and k-fold cross-validation, pretrained vectors, length-bucketed batching with padding
masks (True = padding), the synthetic order task."""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from ..lazy import lazy_exports

if _TYPE_CHECKING:  # what static tools see; at run time the names are imported on first use (maskattn/lazy.py)
    from .config import DataConfig
    from .pipeline import PreparedData, prepare_data
    from .batching import IGNORE_INDEX, Batch, BucketBatchSampler, collate, encode_examples
    from .examples import PairExample, TaggedExample, TextExample
    from .readers import READERS, read_conll, read_nli_jsonl, read_sentences, read_trec, read_tsv, tokenize
    from .splits import Splits, check_label_sets, holdout, kfold, kfold_indices
    from .synthetic import OrderTask, order_splits
    from .tasks import load_splits
    from .text import iter_lines, read_lines, read_stream_lines, read_text
    from .vectors import WordVectors, load_glove, load_vectors, read_vectors
    from .vocab import PAD, UNK, LabelSet, Vocabulary

__all__ = [
    "DataConfig", "PreparedData", "prepare_data",
    "Batch", "BucketBatchSampler", "collate", "encode_examples", "IGNORE_INDEX",
    "TextExample", "PairExample", "TaggedExample",
    "READERS", "read_tsv", "read_trec", "read_nli_jsonl", "read_conll", "read_sentences", "tokenize",
    "iter_lines", "read_lines", "read_stream_lines", "read_text",
    "Splits", "check_label_sets", "holdout", "kfold", "kfold_indices",
    "OrderTask", "order_splits", "load_splits", "load_vectors", "read_vectors", "WordVectors", "load_glove",
    "Vocabulary", "LabelSet", "PAD", "UNK",
]

__getattr__, __dir__ = lazy_exports(__name__, {
    ".config": ("DataConfig",),
    ".pipeline": ("PreparedData", "prepare_data"),
    ".batching": ("IGNORE_INDEX", "Batch", "BucketBatchSampler", "collate", "encode_examples"),
    ".examples": ("PairExample", "TaggedExample", "TextExample"),
    ".readers": ("READERS", "read_conll", "read_nli_jsonl", "read_sentences", "read_trec", "read_tsv", "tokenize"),
    ".splits": ("Splits", "check_label_sets", "holdout", "kfold", "kfold_indices"),
    ".synthetic": ("OrderTask", "order_splits"),
    ".tasks": ("load_splits",),
    ".text": ("iter_lines", "read_lines", "read_stream_lines", "read_text"),
    ".vectors": ("WordVectors", "load_glove", "load_vectors", "read_vectors"),
    ".vocab": ("PAD", "UNK", "LabelSet", "Vocabulary"),
})
