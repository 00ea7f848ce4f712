"""MAN Table 5 for trained models: the localness ``attn_s_{w,l}`` of Eq. 13 (:mod:`maskattn.analysis`) of the
DMAN and SAN attention maps over a dataset file, for windows ``w`` and encoder layers ``l``.

The DMAN rows come from the DMAN sublayer of each chosen layer of one checkpoint; the SAN rows from the
SAN sublayer of the same checkpoint (MAN's DMAN → SAN → FFN layers hold both) or of a second checkpoint
(e.g. a Transformer trained on the same data). Values are percentages, as in the paper.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.table import Table

from .._validation import describe
from ..analysis import localness_per_sequence
from ..data.batching import BucketBatchSampler, collate
from ..data.pipeline import sentences_of
from ..data.readers import READERS, read_lines
from ..train.api import LoadedModel
from .maps import find_sublayers, load_for_maps, sentence_encoder

__all__ = ["WINDOWS", "FORMATS", "LocalnessRow", "LocalnessTable", "read_sentences", "localness_values",
           "localness_table"]

#: The windows of MAN Table 5.
WINDOWS = (1, 2, 4)
#: Dataset formats: the toolkit's readers, and ``lines`` (one raw sentence per line).
FORMATS = (*READERS, "lines")


@dataclass(frozen=True)
class LocalnessRow:
    """One row of the table: ``mechanism`` (``DMAN`` / ``SAN``) of ``checkpoint`` at window ``window``;
    ``values`` maps each layer (1-based) to ``100 · attn_s_{w,l}``."""

    mechanism: str
    checkpoint: str
    window: int
    values: dict[int, float]


@dataclass
class LocalnessTable:
    """MAN Table 5: rows per (mechanism, window), a column per layer; ``sentences``: how many sentences
    each checkpoint was measured on."""

    windows: tuple[int, ...]
    layers: tuple[int, ...]
    rows: list[LocalnessRow]
    data_file: str
    sentences: dict[str, int] = field(default_factory=dict)

    def value(self, mechanism: str, window: int, layer: int) -> float:
        """``100 · attn_s_{w,l}`` of ``mechanism`` (``DMAN`` / ``SAN``)."""
        for row in self.rows:
            if row.mechanism == mechanism and row.window == window:
                return row.values[layer]
        raise KeyError(f"no row for mechanism {mechanism!r} and window {window}")

    def to_dict(self) -> dict:
        return {"data_file": self.data_file, "windows": list(self.windows), "layers": list(self.layers),
                "sentences": self.sentences, "unit": "percent (100 * attn_s of MAN Eq. 13)",
                "rows": [{"mechanism": r.mechanism, "checkpoint": r.checkpoint, "window": r.window,
                          "values": {str(layer): v for layer, v in r.values.items()}} for r in self.rows]}

    def write_json(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        return path

    def write_csv(self, path: str | Path) -> Path:
        """Table 5's layout: ``mechanism, window, layer_<l>…`` (percent), one line per row."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["mechanism", "checkpoint", "window", *(f"layer_{layer}" for layer in self.layers)])
            for r in self.rows:
                writer.writerow([r.mechanism, r.checkpoint, r.window, *(f"{r.values[layer]:.4f}" for layer in self.layers)])
        return path

    def summary(self) -> str:
        """Where the rows come from: the data file, and per checkpoint its rows and sentence count."""
        sources = {}
        for r in self.rows:
            sources.setdefault(r.checkpoint, []).append(r.mechanism)
        return f"{self.data_file}: " + "; ".join(
            f"{'/'.join(dict.fromkeys(names))} from {path} ({self.sentences[path]} sentences)"
            for path, names in sources.items())

    def rich_table(self) -> Table:
        table = Table(title="attn_s (%), MAN Eq. 13")
        for column in ("", "w", *(f"#{layer}" for layer in self.layers)):
            table.add_column(column, justify="right")
        for r in self.rows:
            table.add_row(r.mechanism, str(r.window), *(f"{r.values[layer]:.2f}" for layer in self.layers))
        return table


def read_sentences(path: str | Path, loaded: LoadedModel, *, format: str | None = None) -> list[tuple[str, ...]]:
    """The sentences of a dataset file, read as ``loaded``'s training read its data: its reader
    (``format`` defaults to the checkpoint's ``data.format``; ``lines`` = one raw sentence per line), its
    lowercasing, and truncation to its ``data.max_len``. NLI files give premises and hypotheses."""
    fmt = format or loaded.config.data.format
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    lowercase = loaded.config.data.lowercase
    if fmt == "lines":
        sentences = read_lines(path, lowercase=lowercase)
    else:
        sentences = sentences_of(READERS[fmt](path, lowercase=lowercase))
    if not sentences:
        raise ValueError(f"data file {path} holds no sentences")
    max_len = loaded.config.data.max_len
    return [s[:max_len] if max_len else s for s in sentences]


def _check_windows(windows) -> tuple[int, ...]:
    if isinstance(windows, (str, int)) or not isinstance(windows, Sequence) or not windows:
        raise TypeError(f"windows must be a non-empty list of ints >= 0, got {describe(windows)}")
    for w in windows:
        if isinstance(w, bool) or not isinstance(w, int) or w < 0:
            raise ValueError(f"windows must hold ints >= 0 (distance w of MAN Eq. 13), got {w!r}")
    return tuple(windows)


@torch.no_grad()
def localness_values(loaded: LoadedModel, sentences: Sequence[Sequence[str]], mechanism: str, layers: Sequence[int],
                     windows: Sequence[int], *, batch_size: int = 32) -> dict[tuple[int, int], float]:
    """``{(layer, window): 100 · attn_s_{w,l}}`` for the first ``mechanism`` sublayer (``dman``, ``san``, or
    any registered attention) of each layer (1-based) of ``loaded``: Eq. 13 over ``sentences``, each
    sentence counting once, padded queries excluded (:func:`maskattn.analysis.localness_per_sequence`)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {describe(batch_size)}")
    windows = _check_windows(windows)
    encoder = sentence_encoder(loaded)
    stack = encoder.fusion.encoder
    found = find_sublayers(stack.attention_sublayers(), stack.layer_names, list(layers), mechanism)
    keys = {}
    for layer, key in found:
        keys.setdefault(layer, key)
    missing = [layer for layer in layers if layer not in keys]
    if missing:
        raise ValueError(f"layer {missing[0]} has no {mechanism!r} sublayer; the encoder layers are "
                         + ", ".join(f"{i}: {name}" for i, name in enumerate(stack.layer_names, start=1)))
    items = [{"tokens": loaded.vocab.encode(s)} for s in sentences]
    device = next(encoder.parameters()).device
    per_sentence: dict[tuple[int, int], list[torch.Tensor]] = {(layer, w): [] for layer in layers for w in windows}
    was_training = encoder.training
    encoder.eval()
    try:
        for indices in BucketBatchSampler(items, batch_size, shuffle=False).batches():
            batch = collate([items[i] for i in indices]).to(device)
            padding = batch.inputs["padding_mask"]
            maps, _ = encoder.attention_maps(batch.inputs["tokens"], padding)
            for layer in layers:
                attention = maps[layer - 1][keys[layer]]["attention"]  # (B, H, n, n): S_M(Q, K) of Eq. 4
                for w in windows:
                    per_sentence[(layer, w)].append(localness_per_sequence(attention, w, padding).cpu())
    finally:
        encoder.train(was_training)
    return {k: 100.0 * float(torch.cat(v).double().mean()) for k, v in per_sentence.items()}


def localness_table(checkpoint: str | Path, data_file: str | Path, *, san_checkpoint: str | Path | None = None,
                    windows: Sequence[int] = WINDOWS, layers: Sequence[int] | None = None, format: str | None = None,
                    batch_size: int = 32, device: str = "cpu") -> LocalnessTable:
    """MAN Table 5 for ``checkpoint`` (a model with DMAN sublayers) on ``data_file``.

    The SAN rows come from ``san_checkpoint`` when given, else from ``checkpoint``'s own SAN sublayers.
    ``layers``: 1-based encoder layers (default all); ``format``: the file's format (default each
    checkpoint's ``data.format``; ``lines`` for raw text).
    """
    windows = _check_windows(windows)
    sources = [("DMAN", "dman", checkpoint), ("SAN", "san", san_checkpoint or checkpoint)]
    loaded = {}
    for _, _, path in sources:
        if str(path) not in loaded:
            loaded[str(path)] = load_for_maps(path, device=device)
    depth = min(len(sentence_encoder(m).fusion.encoder.layer_names) for m in loaded.values())
    layers = list(range(1, depth + 1)) if layers is None else list(layers)
    rows, counts = [], {}
    for label, mechanism, path in sources:
        model = loaded[str(path)]
        sentences = read_sentences(data_file, model, format=format)
        counts[str(path)] = len(sentences)
        values = localness_values(model, sentences, mechanism, layers, windows, batch_size=batch_size)
        rows += [LocalnessRow(label, str(path), w, {layer: values[(layer, w)] for layer in layers}) for w in windows]
    rows.sort(key=lambda r: (r.window, r.mechanism != "DMAN"))  # Table 5: DMAN above SAN for each w
    return LocalnessTable(windows, tuple(layers), rows, str(data_file), counts)
