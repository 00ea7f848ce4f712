"""Encoder–decoder Transformer for translation (Vaswani et al., 2017) whose encoder and decoder layers are
written as layer recipes, so each paper's translation setup is one preset:

* ``"transformer"`` — multi-head self-attention (SAN) in both stacks (Vaswani et al. 2017, base: 6 + 6 layers).
* ``"man"`` — every layer a MAN layer DMAN → SAN → FFN with FFN width ``2·d_model`` (MAN §3.1: "we replace
  all layers in Transformer by our MAN layer", encoder and decoder). In the decoder both self-attention
  sublayers are causal and the encoder–decoder attention sits between them and the FFN:
  DMAN → SAN → cross-attention → FFN.
* ``"csan"`` — CSAN 2D in the lowest 3 of 6 encoder layers, SAN above, standard decoder (CSAN §4).
* ``"mtsa-encoder"`` — MTSA replaces the encoder's self-attention (MTSA + FFN layers), standard decoder
  (MTSA §4.4).

Decoder layer recipes use the grammar of :func:`maskattn.encoder.parse_recipe` with causal self-attention
sublayers only (``mha``/``san``, ``dman``, ``sman`` with a fixed radius): a single name is
self-attention → cross-attention → FFN; a ``>`` chain is its sublayers in order with the cross-attention
inserted after the last self-attention sublayer (``"dman>san>ffn"`` → DMAN → SAN → cross → FFN). Every
sublayer is a :class:`~maskattn.layers.Residual` (pre- or post-LN).

Incremental decoding: :meth:`Seq2Seq.encode` → :meth:`Seq2Seq.init_state` (cross-attention keys/values
computed once per source) → :meth:`Seq2Seq.decode_step` with the new target tokens; the step logits equal
those of the teacher-forced :meth:`Seq2Seq.forward`. :mod:`maskattn.decoding` has greedy and beam search.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .._validation import check_choice, check_positive_int, check_probability, describe
from ..attention._common import check_dims, merge_heads, split_heads, zero_padding
from ..attention.man import AttentionCache, StaticMaskAttention
from ..attention.registry import create_attention
from ..encoder import (POSITIONAL, SAN_ALIAS, Encoder, LayerRecipe, PositionalEncoding, parse_recipe, recipe_runs,
                       recipe_string)
from ..layers import MAN_SUBLAYERS, NORMS, FeedForward, Residual, incremental_self_attention

__all__ = ["Seq2Seq", "DecoderState", "DecoderLayer", "CrossAttention", "DECODER_SELF_ATTENTIONS"]

#: Self-attention sublayers a decoder layer may use: causal and incrementally decodable.
DECODER_SELF_ATTENTIONS = ("mha", "san", "dman", "sman")


# --------------------------------------------------------------------------------------------------
# Decoder building blocks
# --------------------------------------------------------------------------------------------------


class CrossAttention(nn.Module):
    """Encoder–decoder attention (Vaswani et al. 2017 §3.2.3): queries from the decoder, keys and values
    from the encoder output ``memory``. :meth:`memory_kv` projects the memory once per source so that
    incremental decoding reuses it at every step."""

    def __init__(self, d_model: int, num_heads: int, *, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        check_dims(d_model, num_heads)
        self.d_model, self.num_heads = d_model, num_heads
        self.dropout = check_probability(dropout, "dropout")
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.kv_proj = nn.Linear(d_model, 2 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        for linear in (self.q_proj, self.kv_proj):
            nn.init.xavier_uniform_(linear.weight)
        if bias:
            for linear in (self.q_proj, self.kv_proj, self.out_proj):
                nn.init.zeros_(linear.bias)

    def memory_kv(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of ``memory`` ``(B, S, d)``: two ``(B, H, S, d_h)`` tensors."""
        k, v = self.kv_proj(memory).chunk(2, dim=-1)
        return split_heads(k, self.num_heads), split_heads(v, self.num_heads)

    def forward(self, x: torch.Tensor, memory_kv: tuple[torch.Tensor, torch.Tensor],
                memory_padding: torch.Tensor) -> torch.Tensor:
        """``x`` ``(B, T, d)`` attends to the memory keys/values; ``memory_padding`` ``(B, S)``, True = padding.
        Rows whose source is all padding get 0."""
        q = split_heads(self.q_proj(x), self.num_heads)  # (B, H, T, d_h)
        k, v = memory_kv
        allowed = ~memory_padding[:, None, None, :]  # (B, 1, 1, S)
        drop = self.dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=drop)
        out = out.masked_fill(~allowed.any(-1, keepdim=True), 0.0)
        return self.out_proj(merge_heads(out))  # (B, T, d)


def decoder_sublayers(layer: LayerRecipe) -> list[tuple[str, dict]]:
    """The sublayers of one decoder layer from its recipe: a single name is self-attention → cross → FFN;
    a chain is its sublayers with ``("cross", {})`` inserted after the last self-attention sublayer."""
    sublayers = list(layer.sublayers) if layer.chain else [layer.sublayers[0], ("ffn", {})]
    for name, _ in sublayers:
        if name != "ffn" and name not in DECODER_SELF_ATTENTIONS:
            raise ValueError(f"decoder layer {str(layer)!r}: sublayer {name!r} cannot be a decoder self-attention "
                             f"(it must be causal and incrementally decodable); expected one of "
                             f"{', '.join(DECODER_SELF_ATTENTIONS)} or ffn")
    attention_at = [i for i, (name, _) in enumerate(sublayers) if name != "ffn"]
    if not attention_at:
        raise ValueError(f"decoder layer {str(layer)!r} has no self-attention sublayer; add one of "
                         f"{', '.join(DECODER_SELF_ATTENTIONS)}")
    last = attention_at[-1] + 1
    return sublayers[:last] + [("cross", {})] + sublayers[last:]


class DecoderLayer(nn.Module):
    """One decoder layer: causal self-attention sublayer(s), encoder–decoder attention and FFN(s), in the
    order given by :func:`decoder_sublayers`, each wrapped in a :class:`~maskattn.layers.Residual`.

    Args:
        d_model, num_heads: widths. layer: the layer's :class:`~maskattn.encoder.LayerRecipe`.
        ffn_dim: FFN width; default ``2·d_model`` for chains of MAN sublayers (MAN §3.1), else ``4·d_model``.
            A sublayer's ``ffn(dim=…)`` option overrides it.
        dropout: residual and FFN dropout. attention_dropout, backend: defaults of every attention sublayer.
        norm: ``"pre"`` or ``"post"``.

    ``forward(x, memory_kv, memory_padding, padding=None, caches=None)``: ``x`` ``(B, T, d)``; with
    ``caches`` (one :class:`~maskattn.AttentionCache` per self-attention sublayer) ``x`` holds the new
    positions only and the result is ``(out, new_caches)``. Padded positions of ``out`` are 0.
    """

    def __init__(self, d_model: int, num_heads: int, layer: LayerRecipe, *, ffn_dim: int | None = None,
                 dropout: float = 0.0, attention_dropout: float = 0.0, norm: str = "pre", backend: str = "auto"):
        super().__init__()
        sublayers = decoder_sublayers(layer)
        man_chain = layer.chain and all(name in MAN_SUBLAYERS for name, _ in layer.sublayers)
        ffn_dim = ffn_dim or (2 if man_chain else 4) * d_model
        defaults = {"dropout": attention_dropout, "backend": backend}
        self.kinds, blocks = [], []
        for name, options in sublayers:
            if name == "cross":
                self.kinds.append("cross")
                blocks.append(CrossAttention(d_model, num_heads, dropout=attention_dropout))
            elif name == "ffn":
                options = dict(options)
                width = options.pop("dim", ffn_dim)
                self.kinds.append("ffn")
                blocks.append(FeedForward(d_model, width, dropout=options.pop("dropout", dropout), **options))
            else:
                self.kinds.append("self")
                blocks.append(_causal_self_attention(name, options, d_model, num_heads, defaults, str(layer)))
        self.names = [name for name, _ in sublayers]
        self.sublayers = nn.ModuleList(blocks)
        self.residuals = nn.ModuleList(Residual(d_model, norm=norm, dropout=dropout) for _ in blocks)

    @property
    def cross_attention(self) -> CrossAttention:
        return self.sublayers[self.kinds.index("cross")]

    @property
    def num_self_attentions(self) -> int:
        return self.kinds.count("self")

    def extra_repr(self) -> str:
        return " > ".join(self.names)

    def forward(self, x: torch.Tensor, memory_kv: tuple[torch.Tensor, torch.Tensor], memory_padding: torch.Tensor,
                padding: torch.Tensor | None = None, caches: tuple[AttentionCache, ...] | None = None):
        new_caches = []
        for kind, block, residual in zip(self.kinds, self.sublayers, self.residuals):
            if kind == "ffn":
                x = residual(x, block)
            elif kind == "cross":
                x = residual(x, lambda h, block=block: block(h, memory_kv, memory_padding))
            elif caches is None:
                x = residual(x, lambda h, block=block: block(h, key_padding_mask=padding))
            else:
                state = {}

                def step(h, block=block, cache=caches[len(new_caches)], state=state):
                    out, state["cache"] = incremental_self_attention(block, h, padding, cache)
                    return out

                x = residual(x, step)
                new_caches.append(state["cache"])
        x = zero_padding(x, padding)
        return x if caches is None else (x, tuple(new_caches))


def _causal_self_attention(name: str, options: dict, d_model: int, num_heads: int, defaults: dict,
                           where: str) -> nn.Module:
    """A registered attention built causal: ``mha``/``san`` with ``mask="causal"``, ``dman``/``sman`` with
    ``causal=True``."""
    fixed = {"mask", "causal"} & set(options)
    if fixed:
        raise ValueError(f"decoder layer {where!r}: option(s) {sorted(fixed)} of {name!r} cannot be set; decoder "
                         "self-attention is always causal")
    name = SAN_ALIAS.get(name, name)
    causal = {"mask": "causal"} if name == "mha" else {"causal": True}
    block = create_attention(name, d_model, num_heads, **{**defaults, **options, **causal})
    if isinstance(block, StaticMaskAttention) and block.radius == "sqrt":
        raise ValueError(f"decoder layer {where!r}: sman(radius='sqrt') depends on the whole target length and "
                         "cannot be decoded incrementally; use a fixed radius such as sman(radius=4)")
    return block


# --------------------------------------------------------------------------------------------------
# Decoder state (incremental decoding)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecoderState:
    """What :meth:`Seq2Seq.decode_step` needs besides the new tokens. Immutable: each step returns a new one.

    ``memory`` ``(B, S, d)`` and ``memory_padding`` ``(B, S)`` (True = padding) from :meth:`Seq2Seq.encode`;
    ``cross``: per decoder layer the cross-attention keys and values ``(B, H, S, d_h)``, computed once;
    ``caches``: per decoder layer one :class:`~maskattn.AttentionCache` per self-attention sublayer.
    ``len(state)`` is the number of target positions decoded so far (the position of the next token).
    """

    memory: torch.Tensor
    memory_padding: torch.Tensor
    cross: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    caches: tuple[tuple[AttentionCache, ...], ...]

    def __len__(self) -> int:
        return len(self.caches[0][0])

    @property
    def batch_size(self) -> int:
        return self.memory.shape[0]

    def reorder(self, index: torch.Tensor) -> DecoderState:
        """A state whose row ``i`` is row ``index[i]`` of this one (``index``: 1-D integer tensor; rows may be
        dropped or repeated) — beam search follows its beams and drops finished sentences with it."""
        if not isinstance(index, torch.Tensor) or index.dim() != 1 or index.dtype not in (torch.long, torch.int):
            raise TypeError(f"index must be a 1-D integer tensor of batch rows, got {describe(index)}")
        B = self.batch_size
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= B):
            raise ValueError(f"index must hold rows in [0, {B - 1}] (the state's batch size is {B}), got values "
                             f"in [{int(index.min())}, {int(index.max())}]")
        index = index.to(device=self.memory.device, dtype=torch.long)
        return DecoderState(
            memory=self.memory.index_select(0, index),
            memory_padding=self.memory_padding.index_select(0, index),
            cross=tuple((k.index_select(0, index), v.index_select(0, index)) for k, v in self.cross),
            caches=tuple(tuple(c.reorder(index) for c in layer) for layer in self.caches),
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
        encoder: encoder recipe (:func:`maskattn.encoder.parse_recipe`), e.g. ``"mha x6"``,
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

    #: Named configurations: encoder/decoder recipes (6 + 6 layers) and options; see the module docstring.
    PRESETS: dict[str, dict] = {
        "transformer": {"encoder": "mha x6", "decoder": "mha x6"},
        "man": {"encoder": "dman>san>ffn x6", "decoder": "dman>san>ffn x6"},
        "csan": {"encoder": "csan2d x3, mha x3", "decoder": "mha x6"},
        "mtsa-encoder": {"encoder": "mtsa x6", "decoder": "mha x6"},
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
                raise TypeError(f"{name} must be a bool, got {describe(flag)}")
        smaller_vocab = min(src_vocab_size, tgt_vocab_size)
        if isinstance(pad_id, bool) or not isinstance(pad_id, int) or not 0 <= pad_id < smaller_vocab:
            raise ValueError(f"pad_id must be an int id in both vocabularies [0, {smaller_vocab}), got {describe(pad_id)}")
        if share_embeddings and src_vocab_size != tgt_vocab_size:
            raise ValueError(f"share_embeddings needs one vocabulary, but src_vocab_size is {src_vocab_size} and "
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
        decoder_layers = parse_recipe(decoder)
        self.decoder_layers = nn.ModuleList(
            DecoderLayer(d_model, num_heads, layer, ffn_dim=ffn_dim, dropout=dropout,
                         attention_dropout=attention_dropout, norm=norm, backend=backend)
            for layer in decoder_layers)
        self.decoder_norm = nn.LayerNorm(d_model) if norm == "pre" else None
        self.encoder_recipe, self.decoder_recipe = self.encoder.recipe, recipe_string(decoder_layers)
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
    def from_preset(cls, name: str, src_vocab_size: int, tgt_vocab_size: int, *, encoder_layers: int | None = None,
                    decoder_layers: int | None = None, **overrides) -> Seq2Seq:
        """A model from :attr:`PRESETS` with ``overrides`` of any constructor argument (``d_model=256``, …).

        ``encoder_layers`` / ``decoder_layers`` change the depth: each run of equal layers in the recipe keeps
        its share (``"csan"`` at 2 encoder layers is ``"csan2d, mha"``: CSAN in the lower half).
        """
        if not isinstance(name, str) or name not in cls.PRESETS:
            raise ValueError(f"unknown preset {name!r}; expected one of {', '.join(repr(p) for p in cls.PRESETS)}")
        config = {**cls.PRESETS[name], **overrides}
        for key, depth in (("encoder", encoder_layers), ("decoder", decoder_layers)):
            if depth is not None:
                check_positive_int(depth, f"{key}_layers")
                config[key] = recipe_string(_scale_recipe(parse_recipe(config[key]), depth))
        return cls(src_vocab_size, tgt_vocab_size, **config)

    # ------------------------------------------------------------------ validation

    def _check_ids(self, ids, name: str, vocab_size: int) -> torch.Tensor:
        if not isinstance(ids, torch.Tensor):
            raise TypeError(f"{name} must be a 2-D integer tensor (batch, length) of token ids, got {describe(ids)}")
        if ids.dtype not in (torch.long, torch.int, torch.int16, torch.int8, torch.uint8):
            raise TypeError(f"{name} must hold integer token ids (torch.long), got dtype {ids.dtype}")
        if ids.dim() != 2:
            raise ValueError(f"{name} must have shape (batch, length), got {tuple(ids.shape)}")
        if ids.shape[0] == 0 or ids.shape[1] == 0:
            raise ValueError(f"{name} is empty (shape {tuple(ids.shape)}); expected at least one row and one token")
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= vocab_size:
            raise ValueError(f"{name} holds ids in [{low}, {high}] but the vocabulary has {vocab_size} entries "
                             f"(valid ids 0 … {vocab_size - 1})")
        return ids.long()

    def _check_positions(self, length: int, name: str, offset: int = 0) -> None:
        if self.positional != "none" and offset + length > self.max_len:
            where = f"positions {offset} … {offset + length - 1}" if offset else f"length {length}"
            raise ValueError(f"{name} has {where} but the model's max_len is {self.max_len} (positional "
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
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
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

    def encoder_attention_maps(self, src_ids: torch.Tensor) -> list[dict[str, dict[str, torch.Tensor]]]:
        """The encoder self-attention maps of one :meth:`encode` pass over ``src_ids`` ``(B, S)`` (padding =
        ``pad_id``), for plots and analysis: per encoder layer, bottom first, ``{"<position>:<name>": maps}``
        as :meth:`maskattn.Encoder.forward` returns them with ``return_attention=True``."""
        x, padding = self._embed_source(src_ids)
        _, maps = self.encoder(x, key_padding_mask=padding, return_attention=True)
        return maps

    def forward(self, src_ids: torch.Tensor, tgt_in_ids: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits ``(B, T, tgt_vocab_size)``: position ``t`` predicts the token after
        ``tgt_in_ids[:, t]`` from ``tgt_in_ids[:, :t+1]`` and the whole source."""
        tgt_in_ids = self._check_ids(tgt_in_ids, "tgt_in_ids", self.tgt_vocab_size)
        if isinstance(src_ids, torch.Tensor) and src_ids.dim() == 2 and src_ids.shape[0] != tgt_in_ids.shape[0]:
            raise ValueError(f"src_ids has batch size {src_ids.shape[0]} but tgt_in_ids has {tgt_in_ids.shape[0]}")
        self._check_positions(tgt_in_ids.shape[1], "tgt_in_ids")
        memory, memory_padding = self.encode(src_ids)
        padding = tgt_in_ids == self.pad_id
        x = self._embed(tgt_in_ids, self.tgt_embed, self.tgt_positions)
        for layer in self.decoder_layers:
            x = layer(x, layer.cross_attention.memory_kv(memory), memory_padding, padding)
        return self._logits(x)

    # ------------------------------------------------------------------ incremental decoding

    def init_state(self, memory: torch.Tensor, src_padding_mask: torch.Tensor) -> DecoderState:
        """The state before the first target token: the memory, its cross-attention keys/values for every
        decoder layer, and empty self-attention caches."""
        if not isinstance(memory, torch.Tensor) or memory.dim() != 3 or memory.shape[-1] != self.d_model \
                or not memory.is_floating_point():
            raise ValueError(f"memory must be a float tensor of shape (batch, src_len, {self.d_model}) from "
                             f"encode(), got {describe(memory)}")
        if not isinstance(src_padding_mask, torch.Tensor) or src_padding_mask.dtype != torch.bool \
                or tuple(src_padding_mask.shape) != tuple(memory.shape[:2]):
            raise ValueError(f"src_padding_mask must be a bool tensor of shape {tuple(memory.shape[:2])} (True = "
                             f"padding) from encode(), got {describe(src_padding_mask)}")
        return DecoderState(
            memory=memory, memory_padding=src_padding_mask,
            cross=tuple(layer.cross_attention.memory_kv(memory) for layer in self.decoder_layers),
            caches=tuple(tuple(AttentionCache() for _ in range(layer.num_self_attentions))
                         for layer in self.decoder_layers))

    def decode_step(self, tgt_ids_new: torch.Tensor, state: DecoderState) -> tuple[torch.Tensor, DecoderState]:
        """Feed the next target tokens ``(B, t_new)`` (positions ``len(state) …``); returns their logits
        ``(B, t_new, tgt_vocab_size)`` — equal to :meth:`forward`'s at those positions — and the new state."""
        if not isinstance(state, DecoderState):
            raise TypeError(f"state must be a DecoderState from init_state(), got {describe(state)}")
        tgt_ids_new = self._check_ids(tgt_ids_new, "tgt_ids_new", self.tgt_vocab_size)
        if tgt_ids_new.shape[0] != state.batch_size:
            raise ValueError(f"tgt_ids_new has batch size {tgt_ids_new.shape[0]} but the state has "
                             f"{state.batch_size}; reorder the state with state.reorder(index) first")
        offset = len(state)
        self._check_positions(tgt_ids_new.shape[1], "the decoded target", offset)
        padding = tgt_ids_new == self.pad_id
        padding = padding if bool(padding.any()) else None  # caches stay mask-free while nothing is padding
        x = self._embed(tgt_ids_new, self.tgt_embed, self.tgt_positions, offset)
        caches = []
        for layer, kv, layer_caches in zip(self.decoder_layers, state.cross, state.caches):
            x, new = layer(x, kv, state.memory_padding, padding, caches=layer_caches)
            caches.append(new)
        new_state = DecoderState(state.memory, state.memory_padding, state.cross, tuple(caches))
        return self._logits(x), new_state

    @property
    def max_target_tokens(self) -> int | None:
        """Longest target a decoder can produce before EOS (``max_len − 1``: BOS takes position 0 and EOS
        is predicted from the last token's position); ``None`` without positional encodings."""
        return None if self.positional == "none" else self.max_len - 1
