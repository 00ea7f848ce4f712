"""The model section of a run configuration."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

from ..sections import Rule, at_least, check_section, in_range, one_of, optional, positive
from ..errors import ConfigError
from ..layers.recipe import MAX_LAYERS

__all__ = ["ModelConfig", "MODEL_TYPES", "PRETRAINED_TYPES", "PRETRAINED_KEYS"]

MODEL_TYPES = ("sentence", "pair", "tagger", "seq2seq")
PRETRAINED_TYPES = ("sentence", "pair")  # the model types a pretrained encoder serves (models/pretrained.py)
#: the keys a model with ``pretrained`` reads; every other key describes maskattn's own embeddings and encoder
PRETRAINED_KEYS = ("type", "pretrained", "convert", "pool", "mlp_hidden", "mlp_layers", "activation", "dropout")


def _is_recipe(value) -> bool:
    def text(v) -> bool:
        return isinstance(v, str) and bool(v.strip())
    return text(value) or (isinstance(value, list) and bool(value) and all(text(v) for v in value))


_RECIPE = Rule(_is_recipe, "a layer recipe or baseline name (text), or a non-empty list of recipe groups (texts)")


def _is_conversions(value) -> bool:
    def conversion(v) -> bool:
        return isinstance(v, dict) and isinstance(v.get("mechanism"), str)
    return conversion(value) or (isinstance(value, list) and bool(value) and all(conversion(v) for v in value))


_CONVERSIONS = Rule(_is_conversions, "a mapping {mechanism: NAME, layers: [...], ...options} or a non-empty list "
                                     "of such mappings (maskattn.hf.convert's arguments)")


@dataclass
class ModelConfig:
    """What to build (see :func:`maskattn.models.build_model`).

    ``type``: ``sentence`` (:class:`SentenceClassifier`), ``pair`` (:class:`PairClassifier`, NLI),
    ``tagger`` (:class:`SequenceTagger`) or ``seq2seq`` (:class:`Seq2Seq`, translation). ``encoder``: a
    context-fusion baseline name (``bilstm``, ``bigru``, ``multi_cnn``, ``hrchy_cnn``) or a layer recipe
    (``"mtsa"``, ``"mha x2"``, ``"dman>san>ffn x6"``; :func:`maskattn.layers.parse_recipe`) with ``ffn``,
    ``ffn_dim``, ``norm``, ``positional``, ``num_heads``, ``attention_dropout`` and ``backend`` applying to
    recipes and ``encoder_options`` to baselines. ``embed_scale``: factor on the word vectors (default: ``√d_model``
    with sinusoidal positions, as in Vaswani et al. 2017, else 1; a run configuration with pretrained vectors,
    ``data.vectors``, sets 1: the vectors keep their own scale).

    ``seq2seq`` takes its layer recipes from ``architecture`` (``transformer``, ``man``, ``csan``,
    ``mtsa-encoder``; :attr:`Seq2Seq.ARCHITECTURES`) with ``encoder_layers`` / ``decoder_layers`` changing the
    depths — or, without one, from ``encoder`` and ``decoder`` (``preset``, the key's name before 0.2, is read
    as ``architecture`` with a deprecation warning). It also uses ``d_model``, ``num_heads``,
    ``ffn_dim``, ``dropout``, ``attention_dropout``, ``norm``, ``positional``, ``max_len`` (longest source
    or target in subwords), ``backend``, ``share_embeddings`` (one embedding matrix for source and target;
    they share the joint subword vocabulary) and ``tie_output`` (output projection = target embeddings).

    ``pretrained``: a local Hugging Face model folder, or a name from
    :data:`maskattn.models.pretrained.PRETRAINED_PACKAGES` (``all-MiniLM-L6-v2``), whose encoder and tokenizer
    replace maskattn's embeddings and encoder (``sentence`` and ``pair`` models;
    :class:`~maskattn.models.pretrained.PretrainedClassifier`). ``convert``: one
    ``{mechanism, layers, **options}`` mapping or a list of them, passed in order to
    :func:`maskattn.hf.convert`. With ``pretrained`` only :data:`PRETRAINED_KEYS` apply; any other key set to
    a value other than its default is an error (it would be ignored).

    ``pool``: ``source2token``, ``mean``, ``max`` or ``cls`` (the first token, a pretrained encoder's [CLS]);
    ``None`` (the default) is ``mean`` for a pretrained encoder (what sentence-transformers such as
    all-MiniLM-L6-v2 were trained with) and ``source2token`` for maskattn's own encoders (MTSA §4.3).
    """

    type: str = "sentence"
    encoder: str | list = "mtsa"
    d_model: int = 300
    embed_dim: int | None = None
    num_heads: int = 4
    ffn: bool = True
    ffn_dim: int | None = None
    norm: str = "pre"
    positional: str = "none"
    max_len: int = 512
    dropout: float = 0.1
    attention_dropout: float = 0.0
    backend: str = "auto"
    encoder_options: dict = field(default_factory=dict)
    pool: str | None = None
    mlp_hidden: int | None = None
    mlp_layers: int = 1
    activation: str = "relu"
    freeze_embeddings: bool = False
    embed_scale: float | None = None
    embed_dropout: float | None = None
    embed_init: float = 0.05
    architecture: str | None = None
    decoder: str | list | None = None
    encoder_layers: int | None = None
    decoder_layers: int | None = None
    share_embeddings: bool = False
    tie_output: bool = True
    pretrained: str | None = None
    convert: dict | list | None = None

    #: old key names, read as the new ones with a deprecation warning (until maskattn.errors.REMOVED_IN)
    RENAMED: ClassVar[dict[str, str]] = {"preset": "architecture"}

    # choices listed by the modules that use them (model.norm, positional, pool, activation, backend, architecture)
    # are checked when the model is built
    RULES: ClassVar[dict[str, Rule]] = {
        "type": one_of(*MODEL_TYPES),
        "encoder": _RECIPE,
        "decoder": optional(_RECIPE),
        "d_model": at_least(1),
        "embed_dim": optional(at_least(1)),
        "num_heads": at_least(1),
        "ffn_dim": optional(at_least(1)),
        "max_len": at_least(1),
        "dropout": in_range(0, 1),
        "attention_dropout": in_range(0, 1),
        "mlp_hidden": optional(at_least(1)),
        "mlp_layers": at_least(0),
        "embed_scale": optional(positive()),
        "embed_dropout": optional(in_range(0, 1)),
        "embed_init": positive(),
        "encoder_layers": optional(in_range(1, MAX_LAYERS, high_open=False)),
        "decoder_layers": optional(in_range(1, MAX_LAYERS, high_open=False)),
        "pretrained": optional(Rule(lambda v: isinstance(v, str) and bool(v.strip()), "a model folder or name")),
        "convert": optional(_CONVERSIONS),
    }

    def __post_init__(self):
        check_section(self, "model", self.RULES)
        if self.pretrained is None:
            if self.convert is not None:
                raise ConfigError("model.convert converts layers of a pretrained encoder; set model.pretrained (a "
                                  "model folder or name) too, or remove model.convert")
            return
        if self.type not in PRETRAINED_TYPES:
            raise ConfigError(f"model.type {self.type!r} cannot use model.pretrained; expected one of "
                              f"{', '.join(PRETRAINED_TYPES)}")
        ignored = [f.name for f in dataclasses.fields(self) if f.name not in PRETRAINED_KEYS
                   and getattr(self, f.name) != (f.default if f.default_factory is dataclasses.MISSING
                                                 else f.default_factory())]
        if ignored:
            raise ConfigError(f"model.{ignored[0]} has no effect with model.pretrained (the pretrained encoder brings "
                              f"its own embeddings, layers and sizes); remove it. With model.pretrained the model "
                              f"keys are: {', '.join(PRETRAINED_KEYS)}")

    @property
    def pooling(self) -> str:
        """``pool``, or its default for this encoder (class docstring)."""
        if self.pool is not None:
            return self.pool
        return "mean" if self.pretrained is not None else "source2token"
