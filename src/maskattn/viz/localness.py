"""MAN Table 5 for trained models: the localness ``attn_s_{w,l}`` of Eq. 13 (:mod:`maskattn.analysis`) of the
DMAN and SAN attention maps over a dataset file, for windows ``w`` and encoder layers ``l``.

The DMAN rows come from the DMAN sublayer of each chosen layer of one checkpoint; the SAN rows from the
SAN sublayer of the same checkpoint (MAN's DMAN → SAN → FFN layers hold both) or of a second checkpoint
(e.g. a Transformer trained on the same data). Values are percentages, as in the paper.

Either model kind works (:mod:`.sources`): classifier checkpoints read the file as their training read its
data; translation checkpoints read raw source text, one sentence per line, encoded with their own subword
model, and give the maps of their Seq2Seq encoder — MAN Table 5 itself is measured on translation encoders.
Sentences a translation model cannot take whole (longer than ``max_len − 1`` subwords) and empty lines are
skipped and counted in :attr:`LocalnessTable.skipped`.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.table import Table

from ..errors import ArgumentError, ArgumentTypeError
from ..files import atomic_write
from ..validation import describe
from ..analysis import localness_per_sequence
from .maps import describe_layers, find_sublayers
from .sources import MapSource, load_for_maps

__all__ = ["WINDOWS", "LocalnessRow", "LocalnessTable", "localness_values", "localness_table"]

#: The windows of MAN Table 5.
WINDOWS = (1, 2, 4)


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
    each checkpoint was measured on; ``skipped``: per checkpoint, how many it left out and why
    (``{"over-long": 2, "empty": 1}``, see :class:`~maskattn.viz.sources.EncodedFile`)."""

    windows: tuple[int, ...]
    layers: tuple[int, ...]
    rows: list[LocalnessRow]
    data_file: str
    sentences: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, dict[str, int]] = field(default_factory=dict)

    def value(self, mechanism: str, window: int, layer: int) -> float:
        """``100 · attn_s_{w,l}`` of ``mechanism`` (``DMAN`` / ``SAN``)."""
        for row in self.rows:
            if row.mechanism == mechanism and row.window == window:
                return row.values[layer]
        raise KeyError(f"no row for mechanism {mechanism!r} and window {window}")

    def to_dict(self) -> dict:
        return {"data_file": self.data_file, "windows": list(self.windows), "layers": list(self.layers),
                "sentences": self.sentences, "skipped": self.skipped, "unit": "percent (100 * attn_s of MAN Eq. 13)",
                "rows": [{"mechanism": r.mechanism, "checkpoint": r.checkpoint, "window": r.window,
                          "values": {str(layer): v for layer, v in r.values.items()}} for r in self.rows]}

    def write_json(self, path: str | Path) -> Path:
        """:meth:`to_dict` as JSON, written atomically (:func:`~maskattn.files.atomic_write`)."""
        return atomic_write(path, [(json.dumps(self.to_dict(), indent=2) + "\n").encode("utf-8")])

    def write_csv(self, path: str | Path) -> Path:
        """Table 5's layout: ``mechanism, window, layer_<l>…`` (percent), one line per row; written atomically."""
        text = io.StringIO(newline="")
        writer = csv.writer(text)
        writer.writerow(["mechanism", "checkpoint", "window", *(f"layer_{layer}" for layer in self.layers)])
        for r in self.rows:
            writer.writerow([r.mechanism, r.checkpoint, r.window, *(f"{r.values[layer]:.4f}" for layer in self.layers)])
        return atomic_write(path, [text.getvalue().encode("utf-8")])

    def summary(self) -> str:
        """Where the rows come from: the data file, and per checkpoint its rows, sentence count and the
        sentences it skipped."""
        sources: dict[str, list[str]] = {}
        for r in self.rows:
            sources.setdefault(r.checkpoint, []).append(r.mechanism)
        parts = []
        for path, names in sources.items():
            skipped = self.skipped.get(path, {})
            reasons = ", ".join(f"{n} {reason}" for reason, n in skipped.items())
            note = f", {sum(skipped.values())} skipped: {reasons}" if skipped else ""
            parts.append(f"{'/'.join(dict.fromkeys(names))} from {path} ({self.sentences[path]} sentences{note})")
        return f"{self.data_file}: " + "; ".join(parts)

    def rich_table(self) -> Table:
        table = Table(title="attn_s (%), MAN Eq. 13")
        for column in ("", "w", *(f"#{layer}" for layer in self.layers)):
            table.add_column(column, justify="right")
        for r in self.rows:
            table.add_row(r.mechanism, str(r.window), *(f"{r.values[layer]:.2f}" for layer in self.layers))
        return table


def _check_windows(windows) -> tuple[int, ...]:
    if isinstance(windows, (str, int)) or not isinstance(windows, Sequence) or not windows:
        raise ArgumentTypeError(f"windows must be a non-empty list of ints >= 0, got {describe(windows)}")
    for w in windows:
        if isinstance(w, bool) or not isinstance(w, int) or w < 0:
            raise ArgumentError(f"windows must hold ints >= 0 (distance w of MAN Eq. 13), got {w!r}")
    return tuple(windows)


@torch.no_grad()
def localness_values(source: MapSource, sentences: Sequence[Sequence[int]], mechanism: str, layers: Sequence[int],
                     windows: Sequence[int], *, batch_size: int = 32) -> dict[tuple[int, int], float]:
    """``{(layer, window): 100 · attn_s_{w,l}}`` for the first ``mechanism`` sublayer (``dman``, ``san``, or
    any registered attention) of each layer (1-based) of ``source``'s encoder: Eq. 13 over ``sentences``
    (encoded ids, e.g. :attr:`EncodedFile.ids <maskattn.viz.sources.EncodedFile>`), each sentence counting
    once, padded queries excluded (:func:`maskattn.analysis.localness_per_sequence`)."""
    if not isinstance(source, MapSource):
        raise ArgumentTypeError(f"source must be a MapSource (maskattn.viz.load_for_maps), got {describe(source)}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ArgumentError(f"batch_size must be an int >= 1, got {describe(batch_size)}")
    if isinstance(sentences, (str, bytes)) or not isinstance(sentences, Sequence) or not sentences:
        raise ArgumentError(f"sentences must be a non-empty list of encoded sentences (id lists), got "
                         f"{describe(sentences)}")
    windows = _check_windows(windows)
    stack = source.stack
    found = find_sublayers(stack.attention_sublayers(), stack.layer_names, list(layers), mechanism)
    keys: dict[int, str] = {}
    for layer, key in found:
        keys.setdefault(layer, key)
    missing = [layer for layer in layers if layer not in keys]
    if missing:
        raise ArgumentError(f"layer {missing[0]} has no {mechanism!r} sublayer; the encoder layers are "
                         + describe_layers(stack.layer_names))
    per_sentence: dict[tuple[int, int], list[torch.Tensor]] = {(layer, w): [] for layer in layers for w in windows}
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))  # similar lengths: little padding
    for start in range(0, len(order), batch_size):
        maps, _, padding = source.maps([sentences[i] for i in order[start:start + batch_size]])
        for layer in layers:
            attention = maps[layer - 1][keys[layer]].attention  # (B, H, n, n): S_M(Q, K) of Eq. 4
            for w in windows:
                per_sentence[(layer, w)].append(localness_per_sequence(attention, w, padding).cpu())
    return {k: 100.0 * float(torch.cat(v).double().mean()) for k, v in per_sentence.items()}


def localness_table(checkpoint: str | Path, data_file: str | Path, *, san_checkpoint: str | Path | None = None,
                    windows: Sequence[int] = WINDOWS, layers: Sequence[int] | None = None, format: str | None = None,  # noqa: A002 (as data.format)
                    batch_size: int = 32, device: str = "cpu") -> LocalnessTable:
    """MAN Table 5 for ``checkpoint`` (a classifier or translation model with DMAN sublayers) on ``data_file``.

    The SAN rows come from ``san_checkpoint`` when given, else from ``checkpoint``'s own SAN sublayers.
    ``layers``: 1-based encoder layers (default all); ``format``: the file's format (default each
    checkpoint's ``data.format`` for classifiers, ``lines`` — raw source text — for translation). Each
    checkpoint reads the file its own way (:meth:`MapSource.read_file`); what it skipped is in
    :attr:`LocalnessTable.skipped`.
    """
    windows = _check_windows(windows)
    sources = [("DMAN", "dman", checkpoint), ("SAN", "san", san_checkpoint or checkpoint)]
    loaded: dict[str, MapSource] = {}
    for _, _, path in sources:
        if str(path) not in loaded:
            loaded[str(path)] = load_for_maps(path, device=device)
    depth = min(len(source.stack.layer_names) for source in loaded.values())
    layers = list(range(1, depth + 1)) if layers is None else list(layers)
    files = {path: source.read_file(data_file, format=format) for path, source in loaded.items()}
    rows = []
    for label, mechanism, path in sources:
        values = localness_values(loaded[str(path)], files[str(path)].ids, mechanism, layers, windows,
                                  batch_size=batch_size)
        rows += [LocalnessRow(label, str(path), w, {layer: values[(layer, w)] for layer in layers}) for w in windows]
    rows.sort(key=lambda r: (r.window, r.mechanism != "DMAN"))  # Table 5: DMAN above SAN for each w
    return LocalnessTable(windows, tuple(layers), rows, str(data_file),
                          {path: len(f.ids) for path, f in files.items()},
                          {path: f.skipped for path, f in files.items()})
