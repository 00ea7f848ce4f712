"""Joint source/target subword model (sentencepiece BPE or unigram) for translation.

One model is trained on the raw (untokenised) training text of *both* languages, so source and target share
one vocabulary (and may share embeddings). Special ids are fixed: ``<pad>`` = 0, ``<unk>`` = 1,
``<s>`` (bos) = 2, ``</s>`` (eos) = 3. The model is plain bytes (its serialized protobuf) and is stored inside
every translation checkpoint, so a checkpoint is self-contained.

Unseen characters: every character of the training text is kept in the vocabulary (character coverage 1.0),
but a character that never occurred in training (e.g. a Chinese character in an English–German model) is
encoded as ``<unk>`` (id 1) — never an error. Decoding renders ``<unk>`` as sentencepiece's ``⁇`` mark.

Text is normalised with sentencepiece's default NFKC-based rule (``nmt_nfkc``) and decoding returns
detokenised text (whitespace restored from the ``▁`` marks), ready for sacreBLEU.

``user_symbols`` (e.g. a corpus' unknown-word placeholder ``UNK``) are always one piece each, wherever they occur,
and decode to themselves; sentencepiece's own special pieces (:data:`RESERVED_PIECES`) cannot be one.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable, Sequence

import sentencepiece as spm
from ..errors import ArgumentError, ArgumentTypeError

__all__ = ["SubwordModel", "SUBWORD_TYPES", "PAD_ID", "UNK_ID", "BOS_ID", "EOS_ID", "RESERVED_PIECES"]

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
SUBWORD_TYPES = ("bpe", "unigram")
#: the pieces of the special ids (sentencepiece's names), in id order
RESERVED_PIECES = ("<pad>", "<unk>", "<s>", "</s>")
#: sentencepiece's refusal of a vocabulary smaller than the text's characters and the special pieces, with the
#: smallest size that works (its required characters, the word-boundary mark and the special and user pieces)
_TOO_SMALL = re.compile(r"Vocabulary size is smaller than required_chars\. \d+ vs (\d+)")


class SubwordModel:
    """A trained sentencepiece model with the fixed special ids above.

    ``SubwordModel.train(texts, vocab_size=8000)`` trains one; ``SubwordModel(proto)`` loads the bytes of
    :attr:`proto` (e.g. from a checkpoint). ``encode(text)`` → ids without bos/eos; ``decode(ids)`` → text
    (special ids are dropped).
    """

    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID

    def __init__(self, proto: bytes):
        if not isinstance(proto, (bytes, bytearray)) or not proto:
            raise ArgumentTypeError(f"proto must be the non-empty bytes of a sentencepiece model, got {type(proto).__name__}")
        self.proto = bytes(proto)
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.LoadFromSerializedProto(self.proto)
        except RuntimeError as exc:
            raise ArgumentError(f"not a sentencepiece model ({exc})") from None
        specials = (self._sp.pad_id(), self._sp.unk_id(), self._sp.bos_id(), self._sp.eos_id())
        if specials != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise ArgumentError(f"subword model has special ids pad/unk/bos/eos = {specials}; expected (0, 1, 2, 3)")

    @classmethod
    def train(cls, texts: Iterable[str], *, vocab_size: int = 8000, model_type: str = "bpe",
              num_threads: int = 1, user_symbols: Sequence[str] = (), option: str = "vocab_size") -> SubwordModel:
        """Train on ``texts`` (raw sentences of both languages; empty ones are skipped).

        ``vocab_size`` is an upper bound: on a small corpus the model gets fewer pieces rather than failing. It
        must hold every distinct character of the text (character coverage 1.0) and the special pieces: a smaller
        one is an :class:`ArgumentError` giving the smallest size that works (``option`` names the setting in it,
        e.g. ``data.subword_vocab``). ``user_symbols``: strings kept as one piece each (module docstring).
        """
        if model_type not in SUBWORD_TYPES:
            raise ArgumentError(f"unknown subword model_type {model_type!r}; expected one of {', '.join(SUBWORD_TYPES)}")
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 8:
            raise ArgumentError(f"vocab_size must be an int >= 8 (4 special ids + pieces), got {vocab_size!r}")
        symbols = list(user_symbols)
        for symbol in symbols:
            if not isinstance(symbol, str) or not symbol or any(c.isspace() for c in symbol) or symbol in RESERVED_PIECES:
                raise ArgumentError(f"user symbol {symbol!r} must be a non-empty word without spaces other than "
                                    f"sentencepiece's own {', '.join(RESERVED_PIECES)}")
        sentences = [t for t in texts if t.strip()]
        if not sentences:
            raise ArgumentError("cannot train a subword model on empty text")
        writer = io.BytesIO()
        options: dict = {"user_defined_symbols": symbols} if symbols else {}
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(sentences), model_writer=writer, model_type=model_type, vocab_size=vocab_size,
                hard_vocab_limit=False, character_coverage=1.0, pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID,
                eos_id=EOS_ID, num_threads=num_threads, minloglevel=2, **options)
        except RuntimeError as exc:
            needed = _TOO_SMALL.search(str(exc))
            if needed is None:
                raise
            raise ArgumentError(f"{option}={vocab_size} is smaller than this text needs: every one of its distinct "
                                f"characters is a piece, with the special pieces; the smallest size that works is "
                                f"{option}={needed.group(1)}") from None
        return cls(writer.getvalue())

    def __len__(self) -> int:
        return self._sp.get_piece_size()

    def pieces(self) -> list[str]:
        """All pieces, indexed by id."""
        return [self._sp.id_to_piece(i) for i in range(len(self))]

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` (no bos/eos); unseen characters become ``unk_id``."""
        if not isinstance(text, str):
            raise ArgumentTypeError(f"text must be a str, got {type(text).__name__}")
        return self._sp.encode(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._sp.encode(list(texts))

    def tokenize(self, text: str) -> list[str]:
        """The pieces of ``text`` (for inspection)."""
        return self._sp.encode(text, out_type=str)

    def decode(self, ids: Sequence[int]) -> str:
        """Detokenised text of ``ids``; pad/bos/eos are dropped, ``<unk>`` shows as ``⁇``."""
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < len(self)]
        if bad:
            raise ArgumentError(f"ids {bad[:5]} are outside the subword vocabulary (size {len(self)})")
        return self._sp.decode([i for i in ids if i not in (PAD_ID, BOS_ID, EOS_ID)])

    def __eq__(self, other) -> bool:
        return isinstance(other, SubwordModel) and self.proto == other.proto

    def __repr__(self) -> str:
        return f"SubwordModel(size={len(self)})"
