"""Labels for raw text from a classifier checkpoint: one output per input line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..data.examples import PairExample, TextExample
from ..data.readers import tokenize
from ..errors import InputError
from ..metrics import predict_ids
from ..device import resolve_device
from .loading import LoadedModel, load_model

__all__ = ["predict"]


def predict(path: str | Path | LoadedModel, texts: list[str], *, batch_size: int = 256, device: str = "cpu",
            on_truncate: Callable[[list[int], int], None] | None = None) -> list:
    """Labels for raw sentences (tokenised as in training: ``data.tokenizer``, ``data.lowercase``), one per text, in order: the label, or a
    list of tags (one per token) for a tagger. A blank text gives ``""`` (``[]`` for a tagger), so outputs stay
    aligned with inputs. Pair models take ``"premise ||| hypothesis"`` strings. A text longer than the model
    reads (:attr:`LoadedModel.input_limit`) is truncated; ``on_truncate`` receives the 1-based numbers of those
    texts and the limit. A tagger refuses such a text (:class:`InputError`): cut, it would get fewer tags than it
    has tokens. Batches are cut to fit the memory budget (:func:`maskattn.device.check_memory`)."""
    loaded = path if isinstance(path, LoadedModel) else load_model(path, device=device)
    cfg = loaded.config
    options = cfg.data.token_options
    examples: list[TextExample | PairExample] = []
    positions: list[int] = []  # index in texts of each example
    for i, text in enumerate(texts):
        if not text.strip():
            continue
        if cfg.model.type == "pair":
            if "|||" not in text:
                raise InputError(f"input {i + 1}: a pair model needs 'premise ||| hypothesis', got {text[:60]!r}")
            premise, hypothesis = (tokenize(part, **options) for part in text.split("|||", 1))
            if not premise or not hypothesis:
                raise InputError(f"input {i + 1}: empty {'premise' if not premise else 'hypothesis'}")
            examples.append(PairExample(premise, hypothesis, "", line=i + 1))
        else:
            examples.append(TextExample(tokenize(text, **options), "", line=i + 1))
        positions.append(i)
    blank = [] if cfg.model.type == "tagger" else ""
    outputs = [blank] * len(texts)
    if not examples:
        return outputs
    items, truncated = loaded.encode(examples)
    if truncated and cfg.model.type == "tagger":  # cut, the output would have fewer tags than the input has tokens
        shown = ", ".join(str(examples[i].line) for i in truncated[:10]) + (", …" if len(truncated) > 10 else "")
        raise InputError(f"input(s) {shown}: longer than the {loaded.input_limit} tokens the tagger reads, and a "
                         "tagger needs one tag per token; split them into shorter lines")
    if truncated and on_truncate is not None:
        on_truncate([positions[i] + 1 for i in truncated], loaded.input_limit)  # examples[i].line
    ids = predict_ids(loaded.model, items, batch_size=batch_size, device=resolve_device(device))
    for i, p in zip(positions, ids):
        outputs[i] = loaded.labels.decode(p) if isinstance(p, list) else loaded.labels.itos[p]
    return outputs
