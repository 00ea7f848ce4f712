"""``convert``: maskattn mechanisms in chosen layers of a pretrained transformers encoder."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from transformers import PreTrainedModel

from ..errors import ArgumentError, ArgumentTypeError
from .base import ConvertedSelfAttention
from .dman import DynamicMaskSelfAttention
from .interface import use_key_padding_implementation
from .local import Csan1dSelfAttention, Csan2dSelfAttention, StaticMaskSelfAttention
from .mtsa import TensorizedSelfAttention
from .options import describe

#: mechanism name -> the module that replaces ``encoder.layer[i].attention.self``
MECHANISMS: dict[str, type[ConvertedSelfAttention]] = {
    cls.mechanism: cls for cls in (DynamicMaskSelfAttention, TensorizedSelfAttention, Csan1dSelfAttention,
                                   Csan2dSelfAttention, StaticMaskSelfAttention)
}

#: ``config.model_type`` of the supported architectures: the BERT family, whose encoder layers hold a
#: ``attention.self`` module with ``query``/``key``/``value`` linear maps (checked against transformers 5.23).
SUPPORTED_MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "camembert", "electra")

#: ``model.config`` attribute listing the conversions applied, in order (saved in ``config.json``).
CONVERSIONS_KEY = "maskattn_conversions"


class ConversionWarning(UserWarning):
    """``convert`` chose a mechanism or options that change the pretrained model's outputs."""


def _encoder_layers(model: Any) -> Any:  # the BERT-family layer list (nn.ModuleList of transformers layers)
    if not isinstance(model, PreTrainedModel):
        raise ArgumentTypeError(f"model must be a transformers PreTrainedModel (e.g. from AutoModel.from_pretrained or "
                        f"maskattn.hf.load_encoder), got {type(model).__name__}")
    model_type = model.config.model_type
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ArgumentError(f"convert does not support model_type {model_type!r} ({type(model).__name__}); "
                         f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    if model.config.is_decoder or model.config.add_cross_attention:
        raise ArgumentError(f"convert supports encoders only; this {model_type} has is_decoder="
                         f"{model.config.is_decoder}, add_cross_attention={model.config.add_cross_attention}")
    base: Any = model.base_model  # BertModel, RobertaModel, …
    return base.encoder.layer


def _layer_indices(layers, count: int) -> list[int]:
    valid = f"ints in 0..{count - 1} (or -{count}..-1 from the top) for this model's {count} layers"
    if layers is None:
        return list(range(count))
    items = [layers] if isinstance(layers, int) and not isinstance(layers, bool) else layers
    if isinstance(items, (str, bytes)) or not isinstance(items, (Sequence, range)) or len(items) == 0:
        raise ArgumentTypeError(f"layers must be None (all), an int or a non-empty list of {valid}, got {describe(layers)}")
    indices = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int):
            raise ArgumentTypeError(f"layers must hold {valid}, got {describe(item)}")
        if not -count <= item < count:
            raise ArgumentError(f"layer index {item} is out of range: layers must be {valid}")
        indices.append(item % count)
    if len(set(indices)) != len(indices):
        raise ArgumentError(f"layers {list(items)} name a layer twice ({sorted(indices)} counted from the bottom)")
    return sorted(indices)


def convert(model: PreTrainedModel, mechanism: str, layers: int | Sequence[int] | None = None, **options):
    """Swap the self-attention of ``layers`` of a transformers encoder for a maskattn mechanism, in place.

    The new module keeps the layer's pretrained ``query``/``key``/``value`` weights and its output projection
    and adds the mechanism's own parameters, initialised so that the model computes exactly what it computed
    before wherever the mechanism allows it:

    * ``"dman"`` (MAN Eq. 12): exact. Options ``max_distance`` (128), ``head_bias_init`` (0.0).
    * ``"mtsa"`` (MTSA Eq. 9–12): exact with the defaults ``scale="identity"``, ``head_masks="full"``;
      ``scale="log_sigmoid"``, ``head_masks="directional"`` is the paper's form. Also ``s2t_hidden``,
      ``s2t_activation``.
    * ``"csan1d"``, ``"csan2d"`` (CSAN Eq. 4–9) and ``"sman"`` (MAN Eq. 11): parameter-free, exact only for
      sentences the window covers (CSAN 2D with ``head_window > 1``: never). Options as in :func:`register`.

    A conversion that changes the outputs at initialisation emits a :class:`ConversionWarning`. The model
    is switched to a maskattn attention implementation (``maskattn_sdpa`` unless it already has one), whose
    mask function passes the padding mask to every layer. The conversion is recorded in
    ``model.config.maskattn_conversions`` (saved by ``save_pretrained``; :func:`load_encoder` replays it).

    Args:
        model: a transformers model of a supported architecture (:data:`SUPPORTED_MODEL_TYPES`), with or
            without a task head.
        mechanism: one of :data:`MECHANISMS`.
        layers: the encoder layers to convert: an index, a list of indices (negative ones count from the
            top) or None for every layer. A layer can be converted once.
        **options: the mechanism's options (defaults above).

    Returns:
        ``model`` itself, so that a trainer can call ``convert(model, **{"mechanism": "csan2d",
        "layers": [0, 1, 2], "window": 11})``.
    """
    encoder_layers = _encoder_layers(model)
    if not isinstance(mechanism, str) or mechanism not in MECHANISMS:
        raise ArgumentError(f"unknown mechanism {mechanism!r}; expected one of {', '.join(repr(m) for m in MECHANISMS)}")
    cls = MECHANISMS[mechanism]
    indices = _layer_indices(layers, len(encoder_layers))
    resolved = cls.check_options(options, model.config.num_attention_heads)
    for i in indices:
        current = encoder_layers[i].attention.self
        if isinstance(current, ConvertedSelfAttention):
            raise ArgumentError(f"layer {i} is already converted to {current.mechanism!r}; convert a layer once "
                             "(start again from the pretrained model to change its mechanism)")
    for i in indices:
        encoder_layers[i].attention.self = cls(encoder_layers[i].attention.self, **resolved)
    use_key_padding_implementation(model)
    record = {"mechanism": mechanism, "layers": indices, **resolved}
    setattr(model.config, CONVERSIONS_KEY, [*getattr(model.config, CONVERSIONS_KEY, []), record])
    note = cls.change_note(resolved)
    if note is not None:
        warnings.warn(f"convert: {mechanism} in layers {indices} changes the model's outputs at initialisation: "
                      f"{note}. Fine-tune the converted model.", ConversionWarning, stacklevel=2)
    return model
