"""What the viz commands read from a checkpoint, for either kind of model.

A :class:`MapSource` is the small adapter between a trained model and the drawing / analysis code: it turns a
sentence (or each sentence of a dataset file) into the ids the model was trained on, with one label per
position, and runs the model's attention encoder once in evaluation mode, collecting the maps of every layer
(:meth:`maskattn.Encoder.attention_maps`, i.e. each attention module's own :meth:`attention_maps`).
Everything downstream (:mod:`.maps`, :mod:`.panels`, :mod:`.localness`) is the same for both kinds:

* :class:`ClassifierSource` — sentence / pair classifiers and taggers: whitespace tokens (lowercased with
  ``data.lowercase``), the checkpoint's vocabulary, the sentence encoder's layers and its source2token pooling;
  a dataset file is read with the checkpoint's reader and cut to ``data.max_len``, as training read it.
* :class:`TranslationSource` — ``model.type: seq2seq``: the checkpoint's own sentencepiece model through
  :meth:`maskattn.inference.Translator.encode_source` (subword ids and ``</s>``, exactly the encoder input of
  training and translation), subword pieces as labels, and the maps of the Seq2Seq **encoder** self-attention
  (the decoder's self- and cross-attention are not read). A dataset file is raw source text, one sentence per
  line (format ``lines``); empty lines and sentences longer than the model takes are skipped and counted.

Drawing a sentence costs ``heads × n²`` values per sublayer, and the picture is unreadable long before memory
runs out, so :meth:`MapSource.encode` refuses a sentence of more than ``max_length`` positions
(:data:`MAX_LENGTH` by default, ``--max-length`` on the command line) before any model work, with an
:class:`~maskattn.errors.InputError` naming the limit and the length; and :meth:`MapSource.maps` refuses a batch
whose maps are estimated above the memory budget (:func:`maskattn.device.check_memory`: a raised ``--max-length``
cannot exhaust the machine), with a :class:`~maskattn.errors.MemoryLimitError` giving the estimate.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn

from ..validation import describe
from ..checkpoint import load_checkpoint
from ..data.pipeline import sentences_of
from ..data.readers import READERS, read_sentences, tokenize
from ..data.subword import UNK_ID
from ..data.text import read_lines
from ..device import check_memory
from ..errors import ArgumentError, ArgumentTypeError, InputError
from ..inference import LoadedModel, Translator, load_model, load_translator
from ..layers import Encoder
from ..models.classifier import SentenceEncoder
from ..models.fusion import BASELINES, RecipeFusion
from ..models.memory import model_memory_bytes
from ..models.seq2seq import Seq2Seq

__all__ = ["CLASSIFIER_FORMATS", "MAX_LENGTH", "EncodedSentence", "EncodedFile", "MapSource", "ClassifierSource",
           "TranslationSource", "load_for_maps", "check_length"]

#: Dataset formats of classifier checkpoints: the toolkit's readers, and ``lines`` (one raw sentence per line).
CLASSIFIER_FORMATS = (*READERS, "lines")

#: The longest sentence (in positions: words, or subwords and ``</s>``) drawn by default, and the longest
#: ``viz masks --length``.
MAX_LENGTH = 256


def check_length(length: int, max_length: int, what: str) -> int:
    """``length`` when it is at most ``max_length``, else :class:`InputError` naming both and the option that
    raises the limit."""
    if length > max_length:
        raise InputError(f"{what} has {length} positions but viz draws at most {max_length} (every map is n × n per "
                         f"head; a longer one is unreadable and can exhaust memory); shorten it, or raise the limit "
                         f"with --max-length {length}")
    return length


@dataclass(frozen=True)
class EncodedSentence:
    """One sentence as the model reads it: ``tokens`` (a label per position: words, or subword pieces and
    ``</s>``), their ``ids``, and the positions read as ``<unk>`` (``unknown``)."""

    tokens: tuple[str, ...]
    ids: tuple[int, ...]
    unknown: tuple[int, ...]


@dataclass(frozen=True)
class EncodedFile:
    """The sentences of a dataset file as the model reads them: ``ids`` per sentence kept, and ``skipped``:
    how many sentences were left out, by reason (``{"empty": 1, "over-long": 2}``; reasons with none are
    absent)."""

    path: str
    ids: list[tuple[int, ...]]
    skipped: dict[str, int] = field(default_factory=dict)


def _check_sentence_text(sentence) -> str:
    if not isinstance(sentence, str):
        raise ArgumentTypeError(f"sentence must be a string, got {describe(sentence)}")
    if not sentence.strip():
        raise ArgumentError("the sentence is empty; give at least one token")
    return sentence


class MapSource(ABC):
    """A trained model seen from its attention encoder (see the module docstring).

    ``model``: the whole model (put in evaluation mode while maps are read); ``stack``: the
    :class:`~maskattn.Encoder` whose layers are read (``stack.layer_names``, ``stack.attention_sublayers()``);
    ``pad_id``: the id batches are padded with; ``max_length``: the longest sentence :meth:`encode` accepts.
    """

    def __init__(self, model: nn.Module, stack: Encoder, pad_id: int, max_length: int = MAX_LENGTH):
        self.model, self.stack, self.pad_id, self.max_length = model, stack, pad_id, max_length

    @abstractmethod
    def encode(self, sentence: str) -> EncodedSentence:
        """``sentence`` encoded as the model was trained on; ``ValueError`` when it is empty or longer than
        the model takes, :class:`InputError` when it has more than ``max_length`` positions."""

    @abstractmethod
    def read_file(self, path: str | Path, *, format: str | None = None) -> EncodedFile:  # noqa: A002 (as data.format)
        """The sentences of a dataset file (``format``: see the subclasses); ``ValueError`` when none is left."""

    @abstractmethod
    def _attention_maps(self, ids: torch.Tensor, padding: torch.Tensor) -> tuple[list[dict], torch.Tensor | None]:
        """Per-layer maps and the pooling weights (or ``None``) of one forward pass over ``ids`` ``(B, n)``."""

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def maps(self, ids: Sequence[Sequence[int]]) -> tuple[list[dict], torch.Tensor | None, torch.Tensor]:
        """Run encoded sentences (padded into one batch with ``pad_id``) through the encoder once, in
        evaluation mode (no dropout: the trained model itself). Returns the maps of every layer, bottom first,
        ``{"<position>:<name>": AttentionMaps}`` (batch first), the source2token pooling weights ``(B, n, d)`` or
        ``None``, and the padding mask ``(B, n)`` (True = padding)."""
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence) or not ids or not all(ids):
            raise ArgumentError(f"ids must be a non-empty list of non-empty id sequences, got {describe(ids)}")
        width = max(len(row) for row in ids)
        check_memory(model_memory_bytes(self.model, len(ids), width, maps=True), device=self.device,
                     what=f"the attention maps of {len(ids)} sentence(s) of {width} positions",
                     advice="shorten the sentence (or lower --max-length / --batch-size)")
        batch = torch.full((len(ids), width), self.pad_id, dtype=torch.long)  # (B, n)
        for i, row in enumerate(ids):
            batch[i, :len(row)] = torch.tensor(list(row), dtype=torch.long)
        lengths = torch.tensor([len(row) for row in ids])
        padding = (torch.arange(width)[None, :] >= lengths[:, None]).to(self.device)  # (B, n), True = padding
        was_training = self.model.training
        self.model.eval()
        try:
            layers, pool = self._attention_maps(batch.to(self.device), padding)
        finally:
            self.model.train(was_training)
        return layers, pool, padding


class ClassifierSource(MapSource):
    """A sentence / pair / tagger checkpoint (:func:`maskattn.inference.load_model`) with a layer-recipe
    encoder (not a Bi-LSTM / CNN baseline)."""

    def __init__(self, loaded: LoadedModel, max_length: int = MAX_LENGTH):
        if not isinstance(loaded, LoadedModel):
            raise ArgumentTypeError(f"loaded must be a LoadedModel from maskattn.inference.load_model, got {describe(loaded)}")
        recipe = loaded.config.model.encoder
        if isinstance(recipe, str) and recipe.strip() in BASELINES:
            raise ArgumentError(f"the model's encoder is the context-fusion baseline {recipe.strip()!r}, which has no "
                             "attention maps; use a checkpoint of a layer-recipe encoder (e.g. 'mtsa', "
                             "'dman>san>ffn x6')")
        encoder = getattr(loaded.model, "encoder", None)
        if not isinstance(encoder, SentenceEncoder) or not isinstance(encoder.fusion, RecipeFusion) \
                or loaded.vocab is None:
            raise ArgumentError(f"the model ({type(loaded.model).__name__}, model.type {loaded.config.model.type!r}) has "
                             "no layer-recipe sentence encoder of its own to read attention maps from")
        super().__init__(loaded.model, encoder.fusion.encoder, loaded.vocab.pad_id, max_length)
        self.loaded, self.encoder, self.vocab = loaded, encoder, loaded.vocab

    def encode(self, sentence: str) -> EncodedSentence:
        """Tokens as in training (``data.tokenizer``, ``data.lowercase``); longer than ``data.max_len`` (training
        truncated there) or than the positional table's ``model.max_len`` is an error."""
        cfg = self.loaded.config
        tokens = tokenize(_check_sentence_text(sentence), **cfg.data.token_options)
        check_length(len(tokens), self.max_length, "the sentence")
        limits = []
        if cfg.data.max_len:
            limits.append((cfg.data.max_len, "data.max_len: longer inputs were truncated in training"))
        if cfg.model.positional != "none":
            limits.append((cfg.model.max_len, f"model.max_len of its {cfg.model.positional} positional encoding"))
        for limit, why in limits:
            if len(tokens) > limit:
                raise ArgumentError(f"the sentence has {len(tokens)} tokens but the model takes at most {limit} ({why}); "
                                 "shorten it")
        ids = tuple(self.vocab.encode(tokens))
        return EncodedSentence(tokens, ids, tuple(i for i, t in enumerate(ids) if t == self.vocab.unk_id))

    def read_file(self, path: str | Path, *, format: str | None = None) -> EncodedFile:  # noqa: A002 (as data.format)
        """Read as training read its data: the reader of ``format`` (default the checkpoint's ``data.format``;
        ``lines`` = one raw sentence per line; NLI files give premises and hypotheses), lowercasing, and
        truncation to ``data.max_len``; sentences without tokens are skipped (``empty``)."""
        cfg = self.loaded.config
        fmt = format or cfg.data.format
        if fmt not in CLASSIFIER_FORMATS:
            raise ArgumentError(f"unknown format {fmt!r}; expected one of {', '.join(CLASSIFIER_FORMATS)}")
        options = cfg.data.token_options
        if fmt == "lines":
            sentences = read_sentences(path, **options)
        else:
            sentences = sentences_of(READERS[fmt](path, **options))
        max_len = cfg.data.max_len
        kept = [tuple(self.vocab.encode(s[:max_len] if max_len else s)) for s in sentences if s]
        if not kept:
            raise ArgumentError(f"data file {path} holds no sentences")
        empty = len(sentences) - len(kept)
        return EncodedFile(str(path), kept, {"empty": empty} if empty else {})

    def _attention_maps(self, ids: torch.Tensor, padding: torch.Tensor) -> tuple[list[dict], torch.Tensor | None]:
        return self.encoder.attention_maps(ids, padding)


class TranslationSource(MapSource):
    """A translation checkpoint (:func:`maskattn.inference.load_translator`): the maps of its Seq2Seq
    encoder for source sentences encoded by :meth:`Translator.encode_source`."""

    def __init__(self, translator: Translator, max_length: int = MAX_LENGTH):
        if not isinstance(translator, Translator) or not isinstance(translator.model, Seq2Seq):
            raise ArgumentTypeError("translator must be a Translator of a Seq2Seq model (maskattn.inference.load_translator), "
                            f"got {describe(translator)}")
        super().__init__(translator.model, translator.model.encoder, translator.subword.pad_id, max_length)
        self.translator = translator

    @property
    def limit(self) -> int:
        """The most subwords a source sentence may have (``max_len − 1``: ``</s>`` takes the last position)."""
        return self.translator.max_len - 1

    def _too_long(self, count: int) -> str:
        return (f"{count} subwords but the model takes at most {self.limit} (+ </s>: max_len "
                f"{self.translator.max_len}, data.max_len or else model.max_len of the checkpoint)")

    def encode(self, sentence: str) -> EncodedSentence:
        """Subword ids and ``</s>``, as training and translation feed the encoder, labelled with the subword
        pieces; a sentence translation would truncate (more than ``max_len − 1`` subwords) is an error."""
        ids, truncated = self.translator.encode_source(_check_sentence_text(sentence))
        check_length(len(ids), self.max_length, "the sentence (in subwords and </s>)")
        pieces = self.translator.subword.tokenize(sentence)  # labels only: a piece per subword id
        if truncated:
            raise ArgumentError(f"the sentence has {self._too_long(len(pieces))}; shorten it")
        return EncodedSentence((*pieces, "</s>"), tuple(ids), tuple(i for i, t in enumerate(ids) if t == UNK_ID))

    def read_file(self, path: str | Path, *, format: str | None = None) -> EncodedFile:  # noqa: A002 (as data.format)
        """Raw source text, one sentence per line (``format`` ``lines``, the default), read as translation
        reads its source files; empty lines and sentences longer than the model takes are skipped (counted
        in ``skipped`` as ``empty`` and ``over-long``)."""
        if format not in (None, "lines"):
            raise ArgumentError(f"a translation checkpoint reads raw source text, one sentence per line: format must be "
                             f"'lines', got {format!r}")
        kept, skipped = [], {"empty": 0, "over-long": 0}
        for line in read_lines(path):
            if not line.strip():
                skipped["empty"] += 1
                continue
            ids, truncated = self.translator.encode_source(line)
            if truncated:
                skipped["over-long"] += 1
            else:
                kept.append(tuple(ids))
        if not kept:
            raise ArgumentError(f"data file {path} holds no sentence the model can read ({skipped['empty']} empty, "
                             f"{skipped['over-long']} longer than {self.limit} subwords)")
        return EncodedFile(str(path), kept, {reason: n for reason, n in skipped.items() if n})

    def _attention_maps(self, ids: torch.Tensor, padding: torch.Tensor) -> tuple[list[dict], None]:
        return self.translator.model.encoder_attention_maps(ids), None  # padding = pad_id in ids


def load_for_maps(checkpoint: str | Path | LoadedModel | Translator | MapSource, *,
                  device: str = "cpu", max_length: int = MAX_LENGTH) -> MapSource:
    """The :class:`MapSource` of ``checkpoint``: a checkpoint file (a translation checkpoint, ``model.type:
    seq2seq``, gives a :class:`TranslationSource`, any other a :class:`ClassifierSource`), a loaded model or
    translator, or a source itself (kept as it is). ``ValueError`` for a model without an attention encoder
    (a Bi-LSTM / CNN baseline); ``max_length``: the longest sentence the source encodes."""
    if isinstance(checkpoint, MapSource):
        return checkpoint
    if isinstance(checkpoint, LoadedModel):
        return ClassifierSource(checkpoint, max_length)
    if isinstance(checkpoint, Translator):
        return TranslationSource(checkpoint, max_length)
    if not isinstance(checkpoint, (str, Path)):
        raise ArgumentTypeError("checkpoint must be a checkpoint path, a LoadedModel, a Translator or a MapSource, got "
                        f"{describe(checkpoint)}")
    ckpt = load_checkpoint(checkpoint)
    if ckpt.model_type == "seq2seq":
        return TranslationSource(load_translator(ckpt, device=device), max_length)
    return ClassifierSource(load_model(ckpt, device=device), max_length)
