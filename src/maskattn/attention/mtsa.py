"""Multi-mask tensorized self-attention (MTSA; Shen et al., NAACL 2019).

Per head ``c`` (MTSA §3.1–3.2, Eq. 7–13)::

    q, k = W_q x, W_k x   (d_k each),   v = W_v x   (d_h)                      (7)
    R_ij = q_i·k_j / √d_k                                                      (8)
    S_j  = W_s2 σ_m(W_s1 k_j + b_s1) + b_s2 ∈ R^{d_h}                          (9)
    f_ijl = σ_t(R_ij) + S_jl + M^c_ij,   p = softmax_j f,   H^c_i = Σ_j p_ij ⊙ v_j   (10–12)
    s = W_o [H^1; …; H^h]                                                      (13)

computed by :func:`maskattn.functional.tensorized_attention` without n×n×d tensors. The choices of the
authors' code (taoshen58/mtsa, ``MTSA_API/mtsa.py``) are options, the paper's equations the defaults;
:data:`AUTHORS_CONFIGS` and :meth:`MTSA.authors_config` set every option of their scripts (docs/fidelity.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import ArgumentError, ArgumentTypeError
from .. import masks as M
from ..validation import check_bool, check_choice, check_positive_int, check_probability, entry_point
from ..functional.activations import ACTIVATIONS, activation as activation_fn, check_activation as _check_activation
from ..functional.tensorized import SCALES, tensorized_attention, tensorized_attention_maps
from .base import AttentionMaps, SelfAttention, check_input, merge_heads, zero_padding
from .headwise import HeadwiseFusionGate, HeadwiseLinear, HeadwiseSource2Token, project_heads
from .registry import register_attention


def directional_head_masks(num_heads: int, *, include_diagonal: bool = True, name: str = "num_heads") -> list[M.Mask]:
    """Forward masks on the first half of the heads, backward masks on the second half (MTSA §3.2)."""
    if num_heads % 2:
        raise ArgumentError(f"{name} must be even for the default forward/backward split, got {num_heads}; "
                         "pass head_masks=[...] with one mask per head instead")
    half = num_heads // 2
    return [M.forward_mask(include_diagonal)] * half + [M.backward_mask(include_diagonal)] * half


def check_activation(value: object, name: str) -> str | None:
    """``None`` (no activation) or a name of the activation table,
    :data:`maskattn.functional.activations.ACTIVATIONS`."""
    return _check_activation(value, name)


#: σ_s, the scale of the source2token score ``S`` before its exponential (MTSA Eq. 10): ``"identity"``
#: (``E = exp(S)``, the paper's default and the authors' single-layer code, ``MTSA_API/mtsa.py`` line 223),
#: ``"log_sigmoid"`` (``E = σ(S)``, App. A.1's other choice) and ``"scaled_log_sigmoid"`` (``E = σ(S / √d_h)``, the
#: authors' NMT code's default ``afn_multi='scaled_sigmoid'``, ``Proj_NMT/files/mtsa.py`` lines 58 and 90).
S2T_SCALES = ("identity", "log_sigmoid", "scaled_log_sigmoid")


def resolve_head_masks(head_masks, num_heads: int, include_diagonal: bool) -> M.Mask:
    """One :class:`~maskattn.masks.Mask` covering every head, from a per-head list (names or Masks)."""
    if head_masks is None:
        per_head = directional_head_masks(num_heads, include_diagonal=include_diagonal)
    else:
        if isinstance(head_masks, (str, M.Mask)) or not isinstance(head_masks, Sequence):
            raise ArgumentTypeError("head_masks must be a list with one mask (a Mask or a name such as 'forward', "
                            f"'backward', 'window:3') per head, got {type(head_masks).__name__}")
        if len(head_masks) != num_heads:
            raise ArgumentError(f"head_masks has {len(head_masks)} entries but num_heads is {num_heads}; "
                             "expected one mask per head")
        per_head = [M.from_name(m) for m in head_masks]
    return M.per_head(per_head)


class TensorizedSelfAttention(SelfAttention):
    """What MTSA and Fast-DiSA share: per-head masks, the tensorized attention of MTSA Eq. 10–12 on
    ``project(x) = (q, k, v, S)``, an optional fusion gate (``self.fusion_gate``, set by the subclass), the
    heads concatenated, then :meth:`output`. ``v_activation`` (``σ`` on the values) and ``dense_dropout``
    (dropout on the input of every linear map) are the authors' code's ``apply_act_for_v`` and
    ``dense_keep_prob``; the subclasses apply them in :meth:`project`."""

    family = "tensorized"
    fusion_gate: HeadwiseFusionGate | None  # set by the subclass

    def __init__(self, d_model, num_heads, *, dropout, backend, head_masks, strict_masks, scale, v_activation,
                 dense_dropout):
        super().__init__(d_model, num_heads, dropout=dropout, backend=backend)
        self.d_head = d_model // num_heads
        self.scale = check_choice(scale, "scale", SCALES)
        check_bool(strict_masks, "strict_masks")
        self.mask = resolve_head_masks(head_masks, num_heads, include_diagonal=not strict_masks)
        self.v_activation = check_activation(v_activation, "v_activation")
        self.dense_dropout = check_probability(dense_dropout, "dense_dropout")
        self.d_in = d_model  # the width of x (MTSA's ``d_in`` may differ)

    def heads_from_input(self, linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        """A full-width map of the module input, split into heads (B, H, n, ·); ``dense_dropout`` drops its
        input with one mask per head."""
        return project_heads(linear, x, self.num_heads, input_dropout=self.dense_dropout, training=self.training)

    def activate_values(self, v: torch.Tensor) -> torch.Tensor:
        """``σ(v)`` with ``σ = v_activation`` (the authors' ``apply_act_for_v``), else ``v`` (the papers)."""
        return v if self.v_activation is None else activation_fn(self.v_activation)(v)

    def project(self, x: torch.Tensor):
        """Per-head ``q, k`` (B, H, n, d_k), values ``v`` and source2token scores ``S`` (B, H, n, d_h)."""
        raise NotImplementedError

    def output(self, heads: torch.Tensor) -> torch.Tensor:
        """The concatenated heads ``(B, n, d_model)`` → the module output (identity: no output projection)."""
        return heads

    @entry_point
    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, n, d_in) → (B, n, d_out) (both ``d_model`` unless MTSA sets them); padded positions are 0."""
        kpm = check_input(x, self.d_in, key_padding_mask, module=self)
        q, k, v, s2t = self.project(x)
        attended = tensorized_attention(q, k, v, s2t, self.mask, scale=self.scale, backend=self.backend,
                                        key_padding_mask=kpm, dropout_p=self.dropout, training=self.training)
        if self.fusion_gate is not None:
            attended = self.fusion_gate(v, attended)
        return zero_padding(self.output(merge_heads(attended)), kpm)  # (B, n, d_model)

    @entry_point
    def attention_maps(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> AttentionMaps:
        """``attention``: the token2token probabilities (B, H, n, n); ``source2token``: the feature-wise
        source2token weights (B, H, n, d_h) (see :func:`~maskattn.functional.tensorized_attention_maps`; the
        feature-wise attention of Eq. 11 is ``p_ijl ∝ attention_ij · source2token_jl``)."""
        kpm = check_input(x, self.d_in, key_padding_mask, module=self)
        q, k, _, s2t = self.project(x)
        t2t, s2t_probs = tensorized_attention_maps(q, k, s2t, self.mask, scale=self.scale, key_padding_mask=kpm)
        return AttentionMaps(attention=t2t, source2token=s2t_probs)


@register_attention("mtsa", description="multi-mask tensorized self-attention (MTSA, Shen et al. 2019)")
class MTSA(TensorizedSelfAttention):
    """Multi-mask tensorized self-attention.

    Args:
        d_model: the attention's width ``hn`` (input and output width unless ``d_in`` / ``d_out`` say otherwise);
            each head has ``d_h = d_model // num_heads`` value features.
        num_heads: number of heads; by default half use the forward mask, half the backward mask.
        dropout: attention dropout (Appendix A.3): keep probability ``sqrt(1 - dropout)`` on each of
            the two numerator factors of Algorithm 1 step 7, denominator undropped.
        backend: ``"auto"`` | ``"reference"`` | ``"sdpa"`` | ``"flex"`` | ``"banded"`` (window heads).
        head_masks: one mask per head (``Mask`` objects or names: ``"forward"``, ``"backward"``,
            ``"forward_strict"``, ``"backward_strict"``, ``"full"``, ``"window:R"``).
        strict_masks: exclude the diagonal from the default forward/backward masks — the masks of
            MTSA §2.2 as written (``M^fw_ij = 0`` only for ``j < i``) and the authors' code default.
            The default (diagonal included) lets every token see itself without a fusion gate.
        scale: ``σ_t``, ``"log_sigmoid"`` (paper default) or ``"identity"``.
        d_k: per-head query/key width ``d_i`` (default ``d_h``).
        s2t_hidden: hidden width ``d_a`` of the source2token map (default ``d_h``).
        s2t_activation: ``σ_m``, ``"elu"`` (default) or another name of the activation table
            (:data:`maskattn.functional.activations.ACTIVATIONS`: ``relu``, ``selu``, ``gelu``, ``gelu_tanh``,
            ``swish``, ``lrelu``).
        s2t_input: compute the source2token score from ``"k"`` (paper, Eq. 9), ``"v"`` (authors' code) or
            ``"x"``, the module input (authors' stacked MTSA, ``use_input_for_attn=True``).
        s2t_layers: ``2``: the map of Eq. 9; ``1``: one linear map ``S = W_s · + b_s`` (authors' stacked
            MTSA, ``add_layer_for_multi=False``).
        qk_input: compute q/k from ``"x"`` (paper, Eq. 7) or from ``"v"`` per head (authors' code).
        qk_bias: biases on the q/k maps; ``True`` as maskattn always had them, ``False`` as Eq. 7 and the
            authors' code (kept on by default so that existing models and checkpoints are unchanged).
        v_bias: bias on the value map; ``True`` as the authors' single-layer code, ``False`` as Eq. 7 and
            their stacked MTSA.
        v_activation: ``None`` (paper, Eq. 7) or an activation name (``"elu"``, ``"relu"``, …):
            ``v = σ(W_v x + b_v)`` (the authors' ``apply_act_for_v=True``); q/k from ``v`` and the fusion gate
            then see the activated values.
        fusion_gate: per-head gate ``g ⊙ v + (1 − g) ⊙ attention`` (authors' code).
        out_proj: apply ``W_o`` (Eq. 13); ``False`` concatenates the heads, as the authors' code.
        out_activation: ``None`` (paper, Eq. 13) or an activation name: ``s = σ(W_o [H^1; …] + b_o)``
            (the authors' stacked MTSA, ``output_hn``); needs ``out_proj=True``.
        out_bias: the bias ``b_o`` of ``W_o``; ``False`` as the authors' NMT code (tensor2tensor's
            ``output_transform`` has none, ``Proj_NMT/files/common_attention.py`` lines 3567–3568).
        dense_dropout: dropout on the input of every linear map of the module, one mask per head for the
            maps of the module input (the authors' ``dense_keep_prob = 1 − dense_dropout``); 0 by default.
        s2t_scale: σ_s of Eq. 10 (:data:`S2T_SCALES`): ``"identity"`` (paper default: ``E = exp(S)``),
            ``"log_sigmoid"`` (``E = σ(S)``) or ``"scaled_log_sigmoid"`` (``E = σ(S / √d_h)``, the authors' NMT
            ``afn_multi='scaled_sigmoid'``). Applied to ``S`` in front of the attention, so every backend runs it.
        s2t_bias_init: the initial value of the source2token score's bias ``b_s`` (0; the authors' NMT
            ``bias_start``, 5 in their README's training setup 1).
        d_in: the width of the input ``x`` (default ``d_model``): every map of ``x`` reads ``d_in`` features — the
            authors' module takes the 300-d word vectors and maps them to ``hn = d_model`` itself.
        in_hidden: the authors' ``input_hn``: a dense layer ``x ← σ(W_in x + b_in)`` (``d_in → in_hidden``, σ =
            ``in_activation``, its input dropped by ``dense_dropout``) in front of the attention, whose maps then
            read ``in_hidden`` features; None (default) for none.
        in_activation: σ of that input layer (None: linear); needs ``in_hidden``.
        d_out: the output width (default ``d_model``), the authors' ``output_hn``: the width of ``W_o``'s output;
            needs ``out_proj=True`` when it differs from ``d_model``.

    ``MTSA.authors_config(script)`` builds the module of one of the authors' scripts (:data:`AUTHORS_CONFIGS`).
    """

    def __init__(self, d_model: int, num_heads: int, *, dropout: float = 0.0, backend: str = "auto",
                 head_masks: Sequence[M.Mask | str] | None = None, strict_masks: bool = False,
                 scale: str = "log_sigmoid", d_k: int | None = None, s2t_hidden: int | None = None,
                 s2t_activation: str = "elu", s2t_input: str = "k", s2t_layers: int = 2, qk_input: str = "x",
                 qk_bias: bool = True, v_bias: bool = True, v_activation: str | None = None,
                 fusion_gate: bool = False, out_proj: bool = True, out_activation: str | None = None,
                 dense_dropout: float = 0.0, s2t_scale: str = "identity", s2t_bias_init: float = 0.0,
                 out_bias: bool = True, d_in: int | None = None, in_hidden: int | None = None,
                 in_activation: str | None = None, d_out: int | None = None):
        super().__init__(d_model, num_heads, dropout=dropout, backend=backend, head_masks=head_masks,
                         strict_masks=strict_masks, scale=scale, v_activation=v_activation,
                         dense_dropout=dense_dropout)
        self.d_k = self.d_head if d_k is None else check_positive_int(d_k, "d_k")
        self.d_in = d_model if d_in is None else check_positive_int(d_in, "d_in")
        self.d_out = d_model if d_out is None else check_positive_int(d_out, "d_out")
        self.s2t_scale = check_choice(s2t_scale, "s2t_scale", S2T_SCALES)
        if isinstance(s2t_bias_init, bool) or not isinstance(s2t_bias_init, (int, float)) \
                or not math.isfinite(s2t_bias_init):
            raise ArgumentError(f"s2t_bias_init must be a finite number (the initial source2token bias), got "
                                f"{s2t_bias_init!r}")
        self.in_activation = check_activation(in_activation, "in_activation")
        if in_hidden is not None:
            check_positive_int(in_hidden, "in_hidden")
        elif in_activation is not None:
            raise ArgumentError(f"in_activation={in_activation!r} needs in_hidden= (the width of the authors' input "
                                "layer, input_hn), got in_hidden=None")
        check_bool(out_bias, "out_bias")
        if self.d_out != d_model and not out_proj:
            raise ArgumentError(f"d_out={d_out!r} differs from d_model={d_model} and needs out_proj=True (W_o maps "
                                "the heads to d_out, as the authors' output_hn layer), got out_proj=False")
        if not out_bias and not out_proj:
            raise ArgumentError("out_bias=False sets the bias of W_o, which out_proj=False removes; leave out_bias at "
                                "True or use out_proj=True")
        self.s2t_input = check_choice(s2t_input, "s2t_input", ("k", "v", "x"))
        self.qk_input = check_choice(qk_input, "qk_input", ("x", "v"))
        check_choice(s2t_activation, "s2t_activation", tuple(ACTIVATIONS))
        for name, flag in (("qk_bias", qk_bias), ("v_bias", v_bias), ("fusion_gate", fusion_gate),
                           ("out_proj", out_proj)):
            check_bool(flag, name)
        self.out_activation = check_activation(out_activation, "out_activation")
        if out_activation is not None and not out_proj:
            raise ArgumentError(f"out_activation={out_activation!r} needs out_proj=True (the activation follows W_o, as "
                             "the authors' output layer), got out_proj=False")
        if s2t_layers == 1 and (s2t_hidden is not None or s2t_activation != "elu"):
            raise ArgumentError(f"s2t_layers=1 is one linear map with no hidden layer, so s2t_hidden={s2t_hidden!r} and "
                             f"s2t_activation={s2t_activation!r} have nothing to set; leave them at their defaults "
                             "or use s2t_layers=2")

        self.in_proj = nn.Linear(self.d_in, in_hidden) if in_hidden is not None else None  # the authors' input_hn
        x_width = self.d_in if in_hidden is None else in_hidden  # what the maps of x read
        self.v_proj = nn.Linear(x_width, d_model, bias=v_bias)
        if self.qk_input == "x":
            self.q_proj = nn.Linear(x_width, num_heads * self.d_k, bias=qk_bias)
            self.k_proj = nn.Linear(x_width, num_heads * self.d_k, bias=qk_bias)
        else:
            self.q_from_v = HeadwiseLinear(num_heads, self.d_head, self.d_k, bias=qk_bias, input_dropout=dense_dropout)
            self.k_from_v = HeadwiseLinear(num_heads, self.d_head, self.d_k, bias=qk_bias, input_dropout=dense_dropout)
        s2t_in = {"k": self.d_k, "v": self.d_head, "x": x_width}[self.s2t_input]
        self.source2token = HeadwiseSource2Token(num_heads, s2t_in, s2t_hidden or self.d_head, self.d_head,
                                                 activation=s2t_activation, layers=s2t_layers,
                                                 input_dropout=dense_dropout)
        self.fusion_gate = HeadwiseFusionGate(num_heads, self.d_head, input_dropout=dense_dropout) if fusion_gate \
            else None
        self.out_proj = nn.Linear(d_model, self.d_out, bias=out_bias) if out_proj else None
        for linear in (self.in_proj, self.v_proj, getattr(self, "q_proj", None), getattr(self, "k_proj", None),
                       self.out_proj):
            if linear is not None:
                nn.init.xavier_uniform_(linear.weight)
                if linear.bias is not None:
                    nn.init.zeros_(linear.bias)
        self.s2t_bias_init = float(s2t_bias_init)
        if self.s2t_bias_init:
            with torch.no_grad():
                bias = self.source2token.score.bias
                if bias is not None:
                    bias.fill_(self.s2t_bias_init)  # the authors' bias_start
        #: every constructor argument as resolved: two modules with equal ``config`` compute the same function of
        #: equal weights (``repr`` shows the submodules' shapes only)
        self.config: dict[str, Any] = {
            "d_model": d_model, "num_heads": num_heads, "dropout": self.dropout, "backend": self.backend,
            "head_masks": None if head_masks is None else [str(m) for m in head_masks],
            "strict_masks": strict_masks, "scale": self.scale, "d_k": self.d_k, "s2t_hidden": s2t_hidden,
            "s2t_activation": s2t_activation, "s2t_input": self.s2t_input, "s2t_layers": s2t_layers,
            "qk_input": self.qk_input, "qk_bias": qk_bias, "v_bias": v_bias, "v_activation": self.v_activation,
            "fusion_gate": fusion_gate, "out_proj": out_proj, "out_activation": self.out_activation,
            "dense_dropout": self.dense_dropout, "s2t_scale": self.s2t_scale, "s2t_bias_init": self.s2t_bias_init,
            "out_bias": out_bias, "d_in": self.d_in, "in_hidden": in_hidden, "in_activation": self.in_activation,
            "d_out": self.d_out}

    @classmethod
    def authors_config(cls, script: str, *, d_model: int | None = None, num_heads: int | None = None,
                       **overrides) -> MTSA:
        """The MTSA of one of the authors' scripts (:data:`AUTHORS_CONFIGS`: ``"sst"``, ``"snli"``, ``"stacked"``,
        ``"nmt_setup1"``, ``"nmt_setup2"``) with their widths and every option they set; ``d_model`` / ``num_heads``
        / ``overrides`` replace them (a ``d_model`` of the caller's also replaces their input width, unless
        ``d_in=`` is given).

        ``"stacked"`` is the attention of ``stacking_mtsa`` (``MTSA_API/mtsa.py`` lines 11–56); the layer around it
        — a single dense + ReLU map with its input dropped, then the attention, each in a post-LN residual with
        LayerNorm eps 1e-6 and residual dropout 0.2 — is the recipe :data:`STACKED_RECIPE` with
        :data:`STACKED_LAYER_SETTINGS` (``Encoder.from_recipe(hn, 8, STACKED_RECIPE, **STACKED_LAYER_SETTINGS)``,
        docs/fidelity.md)."""
        config = AUTHORS_CONFIGS.get(script) if isinstance(script, str) else None
        if config is None:
            raise ArgumentError(f"unknown script {script!r}; expected one of {', '.join(map(repr, AUTHORS_CONFIGS))}")
        if d_model is None:  # their widths: hn and the width of their input (the word vectors)
            d_model = config.d_model
            if config.d_in is not None and "d_in" not in overrides:
                overrides = {**overrides, "d_in": config.d_in}
        if d_model is None:
            raise ArgumentError(f"script {script!r} takes its width from the caller (the authors pass hn); give d_model=")
        num_heads = config.num_heads if num_heads is None else num_heads
        options = {key: value(num_heads) if callable(value) else value for key, value in config.options.items()}
        return cls(d_model, num_heads, **{**options, **overrides})

    def output(self, heads: torch.Tensor) -> torch.Tensor:
        if self.out_proj is None:
            return heads
        if self.training and self.dense_dropout > 0:
            heads = F.dropout(heads, self.dense_dropout, True)
        out = self.out_proj(heads)  # W_o of Eq. 13
        return out if self.out_activation is None else activation_fn(self.out_activation)(out)

    def project(self, x: torch.Tensor):
        """Per-head ``q, k`` (B, H, n, d_k), ``v`` and source2token scores ``S`` (B, H, n, d_h), ``S`` through σ_s
        (``s2t_scale``)."""
        if self.in_proj is not None:  # the authors' input_hn layer (mtsa.py lines 119-124)
            if self.training and self.dense_dropout > 0:
                x = F.dropout(x, self.dense_dropout, True)
            x = activation_fn(self.in_activation)(self.in_proj(x))
        v = self.activate_values(self.heads_from_input(self.v_proj, x))  # (B, H, n, d_h), Eq. 7
        if self.qk_input == "x":
            q, k = self.heads_from_input(self.q_proj, x), self.heads_from_input(self.k_proj, x)  # (B, H, n, d_k)
        else:
            q, k = self.q_from_v(v), self.k_from_v(v)
        if self.s2t_input == "x":
            B, n, width = x.shape
            source = x.unsqueeze(1).expand(B, self.num_heads, n, width)  # (B, H, n, d_in), one per head
        else:
            source = k if self.s2t_input == "k" else v
        s2t = self.source2token(source)  # (B, H, n, d_h)
        if self.s2t_scale == "log_sigmoid":  # E = exp(log σ(S)) = σ(S)
            s2t = F.logsigmoid(s2t)
        elif self.s2t_scale == "scaled_log_sigmoid":  # E = σ(S / √d_h), Proj_NMT/files/mtsa.py line 90
            s2t = F.logsigmoid(s2t / math.sqrt(self.d_head))
        return q, k, v, s2t


@dataclass(frozen=True)
class AuthorsConfig:
    """An MTSA of the authors' code: width (``None``: the caller's), heads, the options it sets (a callable value
    is called with the number of heads) and the input width ``d_in`` of their call (``None``: ``d_model``)."""

    d_model: int | None
    num_heads: int
    options: dict[str, Any] = field(default_factory=dict)
    d_in: int | None = None


#: The options the authors' single-layer MTSA shares across their scripts (``multi_mask_tensorized_self_attn``
#: with ``use_direction=True, attn_self=False, use_fusion_gate=True, dot_activation_name='sigmoid',
#: use_input_for_attn=False, add_layer_for_multi=True, apply_act_for_v=True, output_hn=None,
#: accelerate=False``).
_SINGLE_LAYER = {"strict_masks": True, "fusion_gate": True, "scale": "log_sigmoid", "qk_input": "v",
                 "qk_bias": False, "s2t_input": "v", "out_proj": False}

def _all_full(num_heads: int) -> list[str]:
    return ["full"] * num_heads


#: The attention of the authors' NMT code (``Proj_NMT/files/mtsa.py`` ``dot_product_attention_mtsa`` inside
#: tensor2tensor 1.9's ``multihead_attention``, ``Proj_NMT/files/common_attention.py`` lines 3405–3568) with the
#: hparams of their README (``use_k_mtsa=False, afn_extra='none', afn_dot='exp', afn_multi='scaled_sigmoid',
#: bi_direction=False``): q, k, v and the output transform without biases, no positional masks, ``exp`` token2token
#: scores, ``S`` one biased map of ``v`` per head, ``E = σ(S / √d_h)``; attention dropout 0.1
#: (``transformer_base_v2``, ``Proj_NMT/files/transformer.py`` line 1583), keep ``√0.9`` on both factors (mtsa.py
#: lines 103–106).
_NMT = {"head_masks": _all_full, "scale": "identity", "qk_input": "x", "qk_bias": False, "v_bias": False,
        "s2t_input": "v", "s2t_layers": 1, "s2t_scale": "scaled_log_sigmoid", "out_bias": False, "dropout": 0.1}

#: The width of the authors' single-layer scripts' input: 300-d GloVe vectors (``tel``), mapped to ``hn`` by the
#: module itself.
_GLOVE = 300

#: MTSA configurations of the authors' code (taoshen58/mtsa), by script. Widths: their ``hn`` and the width of
#: the input they pass (``d_in``).
AUTHORS_CONFIGS: dict[str, AuthorsConfig] = {
    # Proj_SST_mtsa/src/model/m_mtsa.py lines 33-43: hn = 2 x 300, relu; dropout keep 0.7 (configs.py line 61)
    "sst": AuthorsConfig(600, 2, {**_SINGLE_LAYER, "s2t_activation": "relu", "v_activation": "relu",
                                  "dense_dropout": 0.3}, d_in=_GLOVE),
    # Proj_SNLI_mtsa/src/model/m_mtsa.py lines 37-46: hn = 2 x 300, elu; dropout keep 0.65 (configs.py line 40)
    "snli": AuthorsConfig(600, 2, {**_SINGLE_LAYER, "s2t_activation": "elu", "v_activation": "elu",
                                   "dense_dropout": 0.35}, d_in=_GLOVE),
    # Proj_NMT/README.md, Training Setup 1: transformer_base_single_gpu (hidden 512, 8 heads),
    # afn_multi=scaled_sigmoid, bias_start=5 (the source2token bias starts at 5)
    "nmt_setup1": AuthorsConfig(512, 8, {**_NMT, "s2t_bias_init": 5.0}),
    # Proj_NMT/README.md, Training Setup 2: transformer_base, the hparams' defaults (bias_start=0)
    "nmt_setup2": AuthorsConfig(512, 8, dict(_NMT)),
    # MTSA_API/mtsa.py lines 11-56, the attention of stacking_mtsa with its defaults: head_num=8,
    # attn_keep_prob=.8, dense_keep_prob=.9, activation relu, dot_activation_name='exp'
    "stacked": AuthorsConfig(None, 8, {"strict_masks": True, "scale": "identity", "qk_input": "x", "qk_bias": False,
                                       "v_bias": False, "s2t_input": "x", "s2t_layers": 1, "out_proj": True,
                                       "out_activation": "relu", "dropout": 0.2, "dense_dropout": 0.1}),
}

#: The layer of ``stacking_mtsa`` (``MTSA_API/mtsa.py`` lines 40–54) as a recipe: ``bn_dense_layer(x, hn, …,
#: 'relu', keep_prob=dense_keep_prob)`` — one dense map with ReLU whose input is dropped (``ffn(layers=1)``) —
#: then the ``"stacked"`` attention, each sublayer in ``residual_connection`` (post-LN: ``LN(x + dropout(y))``,
#: LayerNorm eps 1e-6, lines 580–602); repeat it ``layer_num`` (10) times with ``" x10"``. Build it with
#: :data:`STACKED_LAYER_SETTINGS`.
STACKED_RECIPE = ("ffn(layers=1, activation=relu, input_dropout=0.1)>mtsa(strict_masks=true, scale=identity, "
                  "qk_input=x, qk_bias=false, v_bias=false, s2t_input=x, s2t_layers=1, out_activation=relu, "
                  "dropout=0.2, dense_dropout=0.1)")

#: The layer settings of ``stacking_mtsa``: post-LN, LayerNorm eps 1e-6, residual dropout ``1 − residual_keep_prob``
#: = 0.2, no final LayerNorm (``Encoder.from_recipe(hn, 8, STACKED_RECIPE, **STACKED_LAYER_SETTINGS)``).
STACKED_LAYER_SETTINGS: dict[str, Any] = {"norm": "post", "norm_eps": 1e-6, "dropout": 0.2, "final_norm": False}
