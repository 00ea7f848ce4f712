"""Encoder–decoder Transformer for translation (Vaswani et al., 2017) whose encoder and decoder layers are
written as layer recipes, so each paper's translation setup is one named architecture (:attr:`Seq2Seq.ARCHITECTURES`):

* ``"transformer"`` — multi-head self-attention (SAN) in both stacks (Vaswani et al. 2017, base: 6 + 6 layers).
* ``"man"`` — every layer a MAN layer DMAN → SAN → FFN with FFN width ``2·d_model`` (MAN §3.1: "we replace
  all layers in Transformer by our MAN layer", encoder and decoder). In the decoder both self-attention
  sublayers are causal and the encoder–decoder attention sits between them and the FFN:
  DMAN → SAN → cross-attention → FFN.
* ``"csan"`` — CSAN 2D in the lowest 3 of 6 encoder layers, SAN above, standard decoder (CSAN §4).
* ``"mtsa-encoder"`` — MTSA replaces the encoder's self-attention (MTSA + FFN layers), standard decoder
  (MTSA §4.4).
* ``"man-summarization"`` — the authors' summarization model (``man_base``): every encoder layer
  ``MANLayer.authors_config("summarization")``'s sublayers and every decoder layer ``"summarization_decoder"``'s
  (GELU in every attention and FFN, DMAN's row-maximum floor; :meth:`MANLayer.authors_recipe`), post-LN.

Decoder layer recipes use the grammar of :func:`maskattn.layers.parse_recipe` with causal self-attention
sublayers only (``mha``/``san``, ``dman``, ``sman`` with a fixed radius): a single name is
self-attention → cross-attention → FFN; a ``>`` chain is its sublayers in order with the cross-attention
inserted after the last self-attention sublayer (``"dman>san>ffn"`` → DMAN → SAN → cross → FFN). Every
layer is a :class:`~maskattn.layers.ChainLayer` (:class:`~maskattn.layers.Decoder`).

Incremental decoding: :meth:`Seq2Seq.encode` → :meth:`Seq2Seq.init_state` (cross-attention keys/values
computed once per source) → :meth:`Seq2Seq.decode_step` with the new target tokens; the step logits equal
those of the teacher-forced :meth:`Seq2Seq.forward`. :mod:`maskattn.inference.decoding` has greedy and beam search.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import ArgumentError, ArgumentTypeError, renamed_attribute, warn_renamed
from ..validation import check_choice, check_positive_int, check_probability, describe
from ..attention.base import check_dims
from ..attention import AttentionMaps
from ..layers import (NORMS, POSITIONAL, Decoder, Encoder, LayerCache, LayerRecipe, LayerSettings, MANLayer,
                      PositionalEncoding, parse_recipe, recipe_runs, recipe_string)

__all__ = ["Seq2Seq", "DecoderState"]


# --------------------------------------------------------------------------------------------------
# Decoder state (incremental decoding)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecoderState:
    """What :meth:`Seq2Seq.decode_step` needs besides the new tokens. Immutable: each step returns a new one.

    ``memory`` ``(B, S, d)`` and ``memory_padding`` ``(B, S)`` (True = padding) from :meth:`Seq2Seq.encode`;
    ``caches``: per decoder layer its :class:`~maskattn.LayerCache` (self-attention caches and the
    encoder–decoder keys and values, computed once). ``len(state)`` is the number of target positions decoded
    so far (the position of the next token).
    """

    memory: torch.Tensor
    memory_padding: torch.Tensor
    caches: tuple[LayerCache, ...]

    def __len__(self) -> int:
        return len(self.caches[0])

    @property
    def batch_size(self) -> int:
        return self.memory.shape[0]

    def reorder(self, index: torch.Tensor) -> DecoderState:
        """A state whose row ``i`` is row ``index[i]`` of this one (``index``: 1-D integer tensor; rows may be
        dropped or repeated) — beam search follows its beams and drops finished sentences with it."""
        if not isinstance(index, torch.Tensor) or index.dim() != 1 or index.dtype not in (torch.long, torch.int):
            raise ArgumentTypeError(f"index must be a 1-D integer tensor of batch rows, got {describe(index)}")
        B = self.batch_size
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= B):
            raise ArgumentError(f"index must hold rows in [0, {B - 1}] (the state's batch size is {B}), got values "
                             f"in [{int(index.min())}, {int(index.max())}]")
        index = index.to(device=self.memory.device, dtype=torch.long)
        return DecoderState(
            memory=self.memory.index_select(0, index),
            memory_padding=self.memory_padding.index_select(0, index),
            caches=tuple(cache.reorder(index) for cache in self.caches),
        )


# --------------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------------


def _scale_recipe(layers: list[LayerRecipe], num_layers: int) -> list[LayerRecipe]:
    """``layers`` resized to ``num_layers``: each run of equal layers keeps its share of the depth (largest
    remainders, ties to the lower runs), so ``"csan2d x3, mha x3"`` at 2 layers is ``"csan2d, mha"``."""
    runs = recipe_runs(layers)
    exact = [count * num_layers / len(layers) for _, count in runs]
    counts = [math.floor(e) for e in exact]
    by_remainder = sorted(range(len(runs)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_remainder[: num_layers - sum(counts)]:
        counts[i] += 1
    return [layer for (layer, _), count in zip(runs, counts) for _ in range(count)]


class Seq2Seq(nn.Module):
    """Encoder–decoder model for translation: embeddings (× √d_model) + positions, an encoder and a decoder
    built from layer recipes (module docstring), and an output projection to the target vocabulary.

    Args:
        src_vocab_size, tgt_vocab_size: vocabulary sizes (ids ``0 … size−1``).
        d_model, num_heads: widths shared by every layer.
        encoder: encoder recipe (:func:`maskattn.layers.parse_recipe`), e.g. ``"mha x6"``,
            ``"csan2d x3, mha x3"``, ``"dman>san>ffn x6"``, ``"mtsa x6"``.
        decoder: decoder recipe of causal self-attention sublayers, e.g. ``"mha x6"`` or ``"dman>san>ffn x6"``.
        ffn_dim: FFN width (default ``4·d_model``; ``2·d_model`` in MAN layers).
        dropout: embedding, residual and FFN dropout. attention_dropout: attention-probability dropout.
        norm: ``"pre"`` (a final LayerNorm closes each stack) or ``"post"`` LayerNorm.
        positional: ``"sinusoidal"``, ``"learned"`` (separate source and target tables) or ``"none"``.
        max_len: longest source and target (positions ``0 … max_len−1``; the target counts its BOS token).
            Longer inputs raise ValueError naming both lengths.
        share_embeddings: one embedding table for source and target (needs equal vocabulary sizes); it is
            ``tgt_embed`` and ``src_embed`` is ``None``.
        tie_output: the output projection is the target embedding matrix (Press & Wolf, 2017).
        pad_id: padding id in source and target (its embedding row is 0 and is not trained).
        backend: attention backend of every attention sublayer.

    Embeddings are initialised ``N(0, d_model^-1/2)`` so that, scaled by ``√d_model``, they have unit
    variance like the sinusoidal positions and, tied, give unit-scale logits.

    ``forward(src_ids (B, S), tgt_in_ids (B, T)) -> logits (B, T, tgt_vocab_size)``: teacher forcing with a
    causal decoder; padding (``pad_id``) anywhere in the ids is masked. Logits at padded target positions
    carry no information.
    """

    #: Named architectures: encoder/decoder recipes (6 + 6 layers) and options; see the module docstring.
    ARCHITECTURES: dict[str, dict] = {
        "transformer": {"encoder": "mha x6", "decoder": "mha x6"},
        "man": {"encoder": "dman>san>ffn x6", "decoder": "dman>san>ffn x6"},
        "csan": {"encoder": "csan2d x3, mha x3", "decoder": "mha x6"},
        "mtsa-encoder": {"encoder": "mtsa x6", "decoder": "mha x6"},
        "man-summarization": {"encoder": f"{MANLayer.authors_recipe('summarization')} x6",
                              "decoder": f"{MANLayer.authors_recipe('summarization_decoder')} x6", "norm": "post"},
    }

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, *, d_model: int = 512, num_heads: int = 8,
                 encoder: str | list = "mha x6", decoder: str | list = "mha x6", ffn_dim: int | None = None,
                 dropout: float = 0.1, attention_dropout: float = 0.0, norm: str = "pre",
                 positional: str = "sinusoidal", max_len: int = 256, share_embeddings: bool = False,
                 tie_output: bool = True, pad_id: int = 0, backend: str = "auto"):
        super().__init__()
        self.src_vocab_size = check_positive_int(src_vocab_size, "src_vocab_size")
        self.tgt_vocab_size = check_positive_int(tgt_vocab_size, "tgt_vocab_size")
        check_dims(d_model, num_heads)
        if ffn_dim is not None:
            check_positive_int(ffn_dim, "ffn_dim")
        check_choice(norm, "norm", NORMS)
        check_choice(positional, "positional", POSITIONAL)
        self.max_len = check_positive_int(max_len, "max_len")
        for name, flag in (("share_embeddings", share_embeddings), ("tie_output", tie_output)):
            if not isinstance(flag, bool):
                raise ArgumentTypeError(f"{name} must be a bool, got {describe(flag)}")
        smaller_vocab = min(src_vocab_size, tgt_vocab_size)
        if isinstance(pad_id, bool) or not isinstance(pad_id, int) or not 0 <= pad_id < smaller_vocab:
            raise ArgumentError(f"pad_id must be an int id in both vocabularies [0, {smaller_vocab}), got {describe(pad_id)}")
        if share_embeddings and src_vocab_size != tgt_vocab_size:
            raise ArgumentError(f"share_embeddings needs one vocabulary, but src_vocab_size is {src_vocab_size} and "
                             f"tgt_vocab_size is {tgt_vocab_size}")
        self.d_model, self.num_heads, self.pad_id = d_model, num_heads, pad_id
        self.positional = positional

        self.tgt_embed = self._embedding(tgt_vocab_size)
        # shared: one registered table (no duplicate state_dict entry, which safetensors refuses)
        self.src_embed = None if share_embeddings else self._embedding(src_vocab_size)
        self.embed_scale = math.sqrt(d_model)
        self.src_positions = None if positional == "none" else PositionalEncoding(d_model, positional, max_len)
        self.tgt_positions = None if positional == "none" else PositionalEncoding(d_model, positional, max_len)
        self.embed_dropout = nn.Dropout(check_probability(dropout, "dropout"))

        self.encoder = Encoder.from_recipe(d_model, num_heads, encoder, ffn_dim=ffn_dim, dropout=dropout,
                                           attention_dropout=attention_dropout, norm=norm, backend=backend)
        self.decoder = Decoder(d_model, num_heads, decoder, LayerSettings(
            ffn_dim=ffn_dim, dropout=dropout, attention_dropout=attention_dropout, norm=norm, backend=backend))
        self.encoder_recipe, self.decoder_recipe = self.encoder.recipe, self.decoder.recipe
        self.output_projection = None if tie_output else nn.Linear(d_model, tgt_vocab_size, bias=False)
        if self.output_projection is not None:
            nn.init.normal_(self.output_projection.weight, 0.0, d_model ** -0.5)

    def _embedding(self, vocab_size: int) -> nn.Embedding:
        embedding = nn.Embedding(vocab_size, self.d_model, padding_idx=self.pad_id)
        nn.init.normal_(embedding.weight, 0.0, self.d_model ** -0.5)
        with torch.no_grad():
            embedding.weight[self.pad_id].zero_()
        return embedding

    def extra_repr(self) -> str:
        return f"encoder={self.encoder_recipe!r}, decoder={self.decoder_recipe!r}"

    @classmethod
    def from_architecture(cls, name: str, src_vocab_size: int, tgt_vocab_size: int, *,
                          encoder_layers: int | None = None, decoder_layers: int | None = None,
                          **overrides) -> Seq2Seq:
        """A model of a named architecture (:attr:`ARCHITECTURES`) with ``overrides`` of any constructor argument
        (``d_model=256``, …).

        ``encoder_layers`` / ``decoder_layers`` change the depth: each run of equal layers in the recipe keeps
        its share (``"csan"`` at 2 encoder layers is ``"csan2d, mha"``: CSAN in the lower half).
        """
        if not isinstance(name, str) or name not in cls.ARCHITECTURES:
            raise ArgumentError(f"unknown architecture {name!r}; expected one of "
                             f"{', '.join(repr(p) for p in cls.ARCHITECTURES)}")
        config = {**cls.ARCHITECTURES[name], **overrides}
        for key, depth in (("encoder", encoder_layers), ("decoder", decoder_layers)):
            if depth is not None:
                check_positive_int(depth, f"{key}_layers")
                config[key] = recipe_string(_scale_recipe(parse_recipe(config[key]), depth))
        return cls(src_vocab_size, tgt_vocab_size, **config)

    PRESETS = renamed_attribute("ARCHITECTURES")

    @classmethod
    def from_preset(cls, name: str, src_vocab_size: int, tgt_vocab_size: int, **options) -> Seq2Seq:
        """Old name of :meth:`from_architecture` (a "preset" is a ``maskattn train --preset`` file)."""
        warn_renamed("Seq2Seq.from_preset", "Seq2Seq.from_architecture")
        return cls.from_architecture(name, src_vocab_size, tgt_vocab_size, **options)

    # ------------------------------------------------------------------ validation

    def _check_ids(self, ids, name: str, vocab_size: int) -> torch.Tensor:
        if not isinstance(ids, torch.Tensor):
            raise ArgumentTypeError(f"{name} must be a 2-D integer tensor (batch, length) of token ids, got {describe(ids)}")
        if ids.dtype not in (torch.long, torch.int, torch.int16, torch.int8, torch.uint8):
            raise ArgumentTypeError(f"{name} must hold integer token ids (torch.long), got dtype {ids.dtype}")
        if ids.dim() != 2:
            raise ArgumentError(f"{name} must have shape (batch, length), got {tuple(ids.shape)}")
        if ids.shape[0] == 0 or ids.shape[1] == 0:
            raise ArgumentError(f"{name} is empty (shape {tuple(ids.shape)}); expected at least one row and one token")
        if torch.compiler.is_compiling():
            # reading the range is a host synchronisation and a graph break (Tensor.item) in every compiled step —
            # on a GPU, 16 recompilations in 50 steps (docs/gpu.md); compiled, the embedding's own check stands
            return ids.long()
        low, high = torch.stack(torch.aminmax(ids)).tolist()  # one host read, not two
        if low < 0 or high >= vocab_size:
            raise ArgumentError(f"{name} holds ids in [{low}, {high}] but the vocabulary has {vocab_size} entries "
                             f"(valid ids 0 … {vocab_size - 1})")
        return ids.long()

    def _check_positions(self, length: int, name: str, offset: int = 0) -> None:
        if self.positional != "none" and offset + length > self.max_len:
            where = f"positions {offset} … {offset + length - 1}" if offset else f"length {length}"
            raise ArgumentError(f"{name} has {where} but the model's max_len is {self.max_len} (positional "
                             f"encodings 0 … {self.max_len - 1}); truncate the input or build the model with a "
                             "larger max_len")

    # ------------------------------------------------------------------ embeddings and output

    def _embed(self, ids: torch.Tensor, embedding: nn.Embedding, positions: PositionalEncoding | None,
               offset: int = 0) -> torch.Tensor:
        x = embedding(ids) * self.embed_scale  # (B, n, d)
        if positions is not None:
            x = positions(x, offset=offset)
        return self.embed_dropout(x).masked_fill((ids == self.pad_id).unsqueeze(-1), 0.0)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        if self.output_projection is None:
            return F.linear(x, self.tgt_embed.weight)  # (B, T, V): tied to the target embedding
        return self.output_projection(x)

    # ------------------------------------------------------------------ full (teacher-forced) pass

    def _embed_source(self, src_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Checked ``src_ids`` ``(B, S)`` → the encoder input ``(B, S, d)`` and the padding mask ``(B, S)``."""
        src_ids = self._check_ids(src_ids, "src_ids", self.src_vocab_size)
        self._check_positions(src_ids.shape[1], "src_ids")
        padding = src_ids == self.pad_id
        embedding = self.tgt_embed if self.src_embed is None else self.src_embed
        return self._embed(src_ids, embedding, self.src_positions), padding

    def encode(self, src_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``src_ids`` ``(B, S)`` → ``(memory (B, S, d), src_padding_mask (B, S))`` (True = padding;
        memory at padded positions is 0)."""
        x, padding = self._embed_source(src_ids)
        return self.encoder(x, key_padding_mask=padding), padding

    def encoder_attention_maps(self, src_ids: torch.Tensor) -> list[dict[str, AttentionMaps]]:
        """The encoder self-attention maps of one :meth:`encode` pass over ``src_ids`` ``(B, S)`` (padding =
        ``pad_id``), for plots and analysis: per encoder layer, bottom first, ``{"<position>:<name>": maps}``
        (:meth:`maskattn.Encoder.attention_maps`)."""
        x, padding = self._embed_source(src_ids)
        return self.encoder.attention_maps(x, key_padding_mask=padding)

    def forward(self, src_ids: torch.Tensor, tgt_in_ids: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits ``(B, T, tgt_vocab_size)``: position ``t`` predicts the token after
        ``tgt_in_ids[:, t]`` from ``tgt_in_ids[:, :t+1]`` and the whole source."""
        tgt_in_ids = self._check_ids(tgt_in_ids, "tgt_in_ids", self.tgt_vocab_size)
        if isinstance(src_ids, torch.Tensor) and src_ids.dim() == 2 and src_ids.shape[0] != tgt_in_ids.shape[0]:
            raise ArgumentError(f"src_ids has batch size {src_ids.shape[0]} but tgt_in_ids has {tgt_in_ids.shape[0]}")
        self._check_positions(tgt_in_ids.shape[1], "tgt_in_ids")
        memory, memory_padding = self.encode(src_ids)
        padding = tgt_in_ids == self.pad_id
        x = self._embed(tgt_in_ids, self.tgt_embed, self.tgt_positions)
        return self._logits(self.decoder(x, padding, memory, memory_padding))

    # ------------------------------------------------------------------ incremental decoding

    def init_state(self, memory: torch.Tensor, src_padding_mask: torch.Tensor) -> DecoderState:
        """The state before the first target token: the memory, its cross-attention keys/values for every
        decoder layer, and empty self-attention caches."""
        if not isinstance(memory, torch.Tensor) or memory.dim() != 3 or memory.shape[-1] != self.d_model \
                or not memory.is_floating_point():
            raise ArgumentError(f"memory must be a float tensor of shape (batch, src_len, {self.d_model}) from "
                             f"encode(), got {describe(memory)}")
        if not isinstance(src_padding_mask, torch.Tensor) or src_padding_mask.dtype != torch.bool \
                or tuple(src_padding_mask.shape) != tuple(memory.shape[:2]):
            raise ArgumentError(f"src_padding_mask must be a bool tensor of shape {tuple(memory.shape[:2])} (True = "
                             f"padding) from encode(), got {describe(src_padding_mask)}")
        return DecoderState(memory, src_padding_mask, self.decoder.init_cache(memory, src_padding_mask))

    def decode_step(self, tgt_ids_new: torch.Tensor, state: DecoderState) -> tuple[torch.Tensor, DecoderState]:
        """Feed the next target tokens ``(B, t_new)`` (positions ``len(state) …``); returns their logits
        ``(B, t_new, tgt_vocab_size)`` — equal to :meth:`forward`'s at those positions — and the new state."""
        if not isinstance(state, DecoderState):
            raise ArgumentTypeError(f"state must be a DecoderState from init_state(), got {describe(state)}")
        tgt_ids_new = self._check_ids(tgt_ids_new, "tgt_ids_new", self.tgt_vocab_size)
        if tgt_ids_new.shape[0] != state.batch_size:
            raise ArgumentError(f"tgt_ids_new has batch size {tgt_ids_new.shape[0]} but the state has "
                             f"{state.batch_size}; reorder the state with state.reorder(index) first")
        offset = len(state)
        self._check_positions(tgt_ids_new.shape[1], "the decoded target", offset)
        is_pad = tgt_ids_new == self.pad_id
        padding = is_pad if bool(is_pad.any()) else None  # caches stay mask-free while nothing is padding
        x = self._embed(tgt_ids_new, self.tgt_embed, self.tgt_positions, offset)
        x, caches = self.decoder.step(x, state.caches, padding)
        return self._logits(x), DecoderState(state.memory, state.memory_padding, caches)

    @property
    def max_target_tokens(self) -> int | None:
        """Longest target a decoder can produce before EOS (``max_len − 1``: BOS takes position 0 and EOS
        is predicted from the last token's position); ``None`` without positional encodings."""
        return None if self.positional == "none" else self.max_len - 1
