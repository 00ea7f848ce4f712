"""Hugging Face ``datasets`` as a source (optional dependency).

``load_hf_splits(name, ...)`` calls ``datasets.load_dataset(name, config, data_files=...)``: a hub name
(e.g. ``"SetFit/sst5"``) when a hub is reachable, or a builder on local files (``"csv"``, ``"json"``) —
the offline tests use the latter, through the same code path.
"""

from __future__ import annotations

from ..errors import ArgumentError
from .examples import PairExample, TextExample
from .readers import tokenize

__all__ = ["load_hf_splits", "hf_available"]


def hf_available() -> bool:
    try:
        import datasets  # noqa: F401
    except ImportError:
        return False
    return True


def _convert(rows, split: str, *, text_field: str, label_field: str, pair_fields: tuple[str, str] | None,
             label_names: list[str] | None, lowercase: bool, tokenizer: str = "whitespace") -> list:
    out: list[TextExample | PairExample] = []
    for number, row in enumerate(rows, start=1):
        where = f"{split} split, row {number}"
        for field in ((label_field,) + (pair_fields or (text_field,))):
            if field not in row:
                raise ArgumentError(f"{where}: no field {field!r}; fields: {sorted(row)}")
        label = row[label_field]
        if label_names is not None and isinstance(label, int):
            label = label_names[label]
        label = str(label)
        if pair_fields:
            premise, hypothesis = (tokenize(str(row[f]), lowercase=lowercase, tokenizer=tokenizer) for f in pair_fields)
            if not premise or not hypothesis:
                raise ArgumentError(f"{where}: empty premise or hypothesis")
            out.append(PairExample(premise, hypothesis, label))
        else:
            tokens = tokenize(str(row[text_field]), lowercase=lowercase, tokenizer=tokenizer)
            if not tokens:
                raise ArgumentError(f"{where}: empty text")
            out.append(TextExample(tokens, label))
    return out


def load_hf_splits(name: str, *, config: str | None = None, data_files: dict | None = None,
                   text_field: str = "text", label_field: str = "label", pair_fields: tuple[str, str] | None = None,
                   lowercase: bool = False, tokenizer: str = "whitespace") -> dict[str, list]:
    """Every split of a ``datasets`` dataset as lists of examples (``label`` ids are mapped to names
    when the feature is a ``ClassLabel``)."""
    try:
        import datasets
    except ImportError:
        raise ArgumentError("data.source 'hf' needs the optional dependency `datasets` (pip install datasets)") from None
    loaded = datasets.load_dataset(name, config, data_files=data_files)
    splits = {}
    for split, ds in loaded.items():
        feature = ds.features.get(label_field)
        names = getattr(feature, "names", None)
        splits[split] = _convert(ds, split, text_field=text_field, label_field=label_field, pair_fields=pair_fields,
                                 label_names=names, lowercase=lowercase, tokenizer=tokenizer)
    return splits
