"""Encoding examples with a pretrained model's own tokenizer (``model.pretrained``; a Hugging Face tokenizer).

The readers of :mod:`.readers` read the files as for every other model (the same line policy, whitespace
tokens, ``data.lowercase``); the text given to the tokenizer is the example's tokens joined by single spaces,
which a BERT-family tokenizer splits again exactly there (it splits on whitespace before anything else). A
sentence pair (NLI) is encoded as the tokenizer's sentence pair — ``[CLS] premise [SEP] hypothesis [SEP]``
for BERT, with segment ids 0 / 1 — so one encoder reads both sentences together.

Items are dicts like the vocabulary-encoded ones of :func:`~.batching.encode_examples`: ``tokens`` (the
input ids, special tokens included), for pairs ``token_types`` (segment ids), and ``label``. Sequences longer
than ``max_len`` tokens (special tokens included) are truncated as the tokenizer truncates a pair
(``longest_first``: the longer sentence loses a token first); :class:`TokenizedText` lists them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ArgumentTypeError
from .examples import Example, PairExample, TextExample
from .vocab import LabelSet

__all__ = ["TokenizedText", "encode_with_tokenizer", "tokenizer_fingerprint"]


@dataclass
class TokenizedText:
    """The encoded items, and the positions (in the examples given) of those that were truncated."""

    items: list[dict]
    truncated: list[int]


def _texts(examples: Sequence[Example]) -> tuple[list[str], list[str] | None]:
    pairs = [e for e in examples if isinstance(e, PairExample)]
    sentences = [e for e in examples if isinstance(e, TextExample)]
    if pairs and not sentences and len(pairs) == len(examples):
        return [" ".join(e.premise) for e in pairs], [" ".join(e.hypothesis) for e in pairs]
    if len(sentences) != len(examples):
        kinds = sorted({type(e).__name__ for e in examples})
        raise ArgumentTypeError(f"a tokenizer encodes sentences or sentence pairs (not both), got {', '.join(kinds)}")
    return [" ".join(e.tokens) for e in sentences], None


def encode_with_tokenizer(examples: Sequence[Example], tokenizer, labels: LabelSet | None, *,
                          max_len: int) -> TokenizedText:
    """Examples → items of token ids (module docstring), at most ``max_len`` tokens each; ``labels=None`` for
    unlabelled text."""
    if not examples:
        return TokenizedText([], [])
    first, second = _texts(examples)
    options = {"return_token_type_ids": second is not None, "return_attention_mask": False, "verbose": False}
    encoded = tokenizer(first, second, **options)
    truncated = [i for i, ids in enumerate(encoded["input_ids"]) if len(ids) > max_len]
    if truncated:  # the others come out the same either way
        encoded = tokenizer(first, second, truncation="longest_first", max_length=max_len, **options)
    items = []
    for i, example in enumerate(examples):
        item = {"tokens": encoded["input_ids"][i]}
        if second is not None:
            item["token_types"] = encoded["token_type_ids"][i]
        if labels is not None and isinstance(example, (TextExample, PairExample)):  # _texts refused the others
            item["label"] = labels.encode(example.label)
        items.append(item)
    return TokenizedText(items, truncated)


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of the tokenizer's definition (vocabulary, normalisation, pre-tokenisation, special tokens: the
    JSON of its ``tokenizers`` backend without the truncation and padding settings, which each call changes),
    stored in checkpoints so that a model is never fed by another tokenizer."""
    definition = json.loads(tokenizer.backend_tokenizer.to_str())
    definition.pop("truncation", None)
    definition.pop("padding", None)
    canonical = json.dumps(definition, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
