"""From a :class:`DataConfig` to encoded splits: load and check the splits, build (or check) the
vocabulary and label set, load pretrained vectors, encode to ids — or, for a pretrained encoder, encode with
its own tokenizer (:func:`prepare_pretrained_data`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


from ..errors import ArgumentError
from .batching import encode_examples
from .examples import PairExample
from .pretrained import encode_with_tokenizer
from .splits import Splits, labels_of
from .tasks import load_splits
from .vectors import WordVectors, load_vectors, vector_coverage
from .vocab import LabelSet, Vocabulary

__all__ = ["PreparedData", "prepare_data", "prepare_pretrained_data", "sentences_of"]


@dataclass
class PreparedData:
    """Splits as examples and as encoded items, with the vocabulary (``None`` when a pretrained model's
    tokenizer encoded them), labels and optional vectors."""

    splits: Splits
    vocab: Vocabulary | None
    labels: LabelSet
    train: list[dict]
    dev: list[dict]
    test: list[dict]
    vectors: WordVectors | None = None
    #: per split, how many examples were cut to the length limit (splits with none are absent)
    truncated: dict[str, int] = field(default_factory=dict)
    #: what the vectors file covered (:func:`~maskattn.data.vectors.vector_coverage`); empty without one
    coverage: dict = field(default_factory=dict)


def sentences_of(examples) -> list:
    out = []
    for e in examples:
        out += [e.premise, e.hypothesis] if isinstance(e, PairExample) else [e.tokens]
    return out


def prepare_data(cfg, *, vocab: Vocabulary | None = None, labels: LabelSet | None = None,
                 embed_dim: int | None = None, max_len: int | None = None) -> PreparedData:
    """Load ``cfg``'s splits; build the vocabulary from the train split (``min_freq``, ``max_vocab``), extended
    with ``data.vectors`` by the dev / test words the vectors file covers (``data.vectors_extend``) — unless
    ``vocab`` is given (a resumed run: then the data must give the same vocabulary, else the data changed and the
    checkpoint is incompatible). ``embed_dim``: the width the vectors must have. Sentences are cut to ``max_len``
    tokens (default ``data.max_len``; the trainer passes the longest input its model reads)."""
    splits = load_splits(cfg)
    train_sentences = sentences_of(splits.train)
    built = Vocabulary.build(train_sentences, min_freq=cfg.min_freq, max_size=cfg.max_vocab)
    vectors, coverage = None, {}
    if cfg.vectors:
        if embed_dim is None:
            raise ArgumentError("data.vectors needs the embedding width (model.embed_dim or model.d_model)")
        extra = ([t for s in sentences_of(splits.dev) + sentences_of(splits.test) for t in s]
                 if cfg.vectors_extend else [])
        built, vectors = load_vectors(cfg.vectors, built, embed_dim, lookup=cfg.vectors_lookup, extra_tokens=extra)
        coverage = vector_coverage(vectors, built, Counter(t for s in train_sentences for t in s))
    if vocab is not None and vocab != built:
        raise ArgumentError(f"incompatible vocabulary: the checkpoint's vocabulary ({len(vocab)} tokens) differs from "
                         f"the one built from the data ({len(built)} tokens); resume with the same data, "
                         "data.min_freq / data.max_vocab and data.vectors")
    labels = _label_set(splits, labels)
    limit = max_len or cfg.max_len
    encode = (lambda examples: encode_examples(examples, built, labels, max_len=limit))
    truncated = {split: count for split in ("train", "dev", "test")
                 if (count := sum(1 for e in getattr(splits, split) if limit and len(e) > limit))}
    return PreparedData(splits, built, labels, encode(splits.train), encode(splits.dev), encode(splits.test), vectors,
                        truncated, coverage)


def _label_set(splits: Splits, labels: LabelSet | None) -> LabelSet:
    """The train split's labels; with ``labels`` (a resumed run's) they must be the same."""
    train_labels = LabelSet(labels_of(splits.train))
    if labels is not None and labels != train_labels:
        raise ArgumentError(f"incompatible labels: the checkpoint has {labels.itos}, the train data has "
                         f"{train_labels.itos}")
    return labels or train_labels


def prepare_pretrained_data(cfg, tokenizer, *, max_len: int, labels: LabelSet | None = None) -> PreparedData:
    """Load ``cfg``'s splits and encode them with a pretrained model's ``tokenizer`` (:mod:`.pretrained`), at
    most ``max_len`` tokens per sequence; ``labels``: a resumed run's label set, which the data must give
    again. There is no vocabulary to build."""
    splits = load_splits(cfg)
    labels = _label_set(splits, labels)
    encoded = {split: encode_with_tokenizer(getattr(splits, split), tokenizer, labels, max_len=max_len)
               for split in ("train", "dev", "test")}
    truncated = {split: len(e.truncated) for split, e in encoded.items() if e.truncated}
    return PreparedData(splits, None, labels, encoded["train"].items, encoded["dev"].items, encoded["test"].items,
                        truncated=truncated)
