"""Analytic cost models of one training step (forward + backward) of a benchmarked module.

FLOPs (:func:`step_flops`) count the multiply-adds of the *matrix products* of the algorithm the chosen
backend runs, 2 FLOPs each — the convention of ``torch.utils.flop_counter.FlopCounterMode`` — and
nothing else (no softmax, exponentials, masking or other element-wise work). Weighted sums written
element-wise (``(p * v).sum(dim)`` in the naive n×n×d form of MTSA / DiSA) are contractions and are
counted like the matrix product they are. The backward pass costs twice the forward: every product
``A @ B`` has gradients for both operands, since the input and all parameters require gradients.
Recomputation inside a kernel's backward (the chunked sdpa kernels, flash attention) is *not* counted,
so two backends of one mechanism get the same count when they run the same algorithm.

Per family, with ``B`` batch, ``n`` length, ``H`` heads, ``d_k``/``d_v`` per-head widths and ``m`` the
keys each query is scored against (``n``; ``A·n`` for CSAN 2D's ``A`` gathered heads; the window for a
banded kernel):

* projections: every ``nn.Linear`` and per-head linear map of the module, once per token —
  ``2·B·n·d_in·d_out`` each (read from the parameter shapes, so options such as ``d_k`` are honoured);
* ``dense`` attention: ``q kᵀ`` and ``P v``: ``2·B·H·n·m·(d_k + d_v)``;
* ``tensorized`` (MTSA / Fast-DiSA through the value-augmentation identity, docs/design.md §1): ``q kᵀ`` and
  one product with the augmented values ``[v ⊙ E ; E]``: ``2·B·H·n·m·(d_k + 2·d_v)``;
* ``tensorized_naive`` (the explicit n×n×d form): ``q kᵀ`` and the feature-wise weighted sum,
  ``2·B·H·n·m·(d_k + d_v)``; DiSA has no ``q kᵀ`` (its score is additive): ``2·B·H·n·m·d_v``;
* ``algorithm1`` (MTSA Algorithm 1): ``q kᵀ``, ``E_R (v ⊙ E_S)`` and ``E_R E_S``, as ``tensorized``;
* ``local`` (banded kernel, or FlexAttention's block mask on a local mask): the dense formula with
  ``m`` = the window (× the head area); FlexAttention's 128-wide blocks also compute some masked
  entries near the band edge, which are not counted;
* ``lstm``: ``2·B·n·4h·(d_in + h)`` per direction and layer (the gate products);
* ``cnn``: ``2·B·n·C_out·C_in·k`` per convolution;
* ``other``: a module no model covers — the runner counts it with ``FlopCounterMode`` instead, and
  its memory estimate is the linear activation term alone.

Memory (:func:`estimate_bytes`) is a deliberately simple estimate of the peak bytes allocated by one
training step, used only to skip points that would not fit (``--mem-budget-gb``): the activations
that grow linearly with ``n`` (a fixed multiple of ``B·n·d``) plus what the family materialises — a few
``n × m`` tensors per head for materialised dense attention (``reference`` backends) and Algorithm 1,
a few ``n × n × d_v`` tensors per head for the naive tensorized form, band scores for the banded kernel,
and for the fused kernels a mask per head and the bounded block workspace of the chunked kernels. The
multiples were calibrated against measured CPU peaks (float32, n up to 768) and err on the high side:
the estimate is typically 1–2× the measured peak for the quadratic families (each record carries both).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from ..attention import (
    MTSA,
    ConvSelfAttention,
    DiSA,
    DynamicMaskAttention,
    FastDiSA,
    MultiHeadAttention,
    SelfAttention,
    StaticMaskAttention,
)
from ..attention.headwise import HeadwiseLinear
from ..errors import ArgumentTypeError
from ..models.fusion import BiRNN, MultiCNN
from .baselines import Algorithm1, CausalSDPA, TorchMHA

__all__ = ["Point", "family_of", "step_flops", "forward_flops", "estimate_bytes", "attention_flops",
           "projection_flops", "useful_attention_flops", "band_pairs", "FAMILIES"]

FAMILIES = ("dense", "local", "tensorized", "tensorized_naive", "algorithm1", "lstm", "cnn", "other")
#: Modules of the dense / local families (multi-head attention with scores per (query, key) pair).
_DENSE_TYPES = (MultiHeadAttention, DynamicMaskAttention, StaticMaskAttention, TorchMHA)

#: activations that grow linearly with n, in units of B·n·d_model elements (input and its gradient,
#: q/k/v, outputs, their gradients, projection temporaries).
_LINEAR_ACTIVATIONS = 24
#: n × m tensors per head alive at the peak of a materialised dense attention step (scores, probabilities,
#: masked copies, their gradients); measured: 3 (mha) to 5.5 (dman) on CPU.
_DENSE_COPIES = 7
#: n × n tensors per head of MTSA Algorithm 1 (R, σ_t(R), E_R, the mask, gradients); measured ~6.5.
_ALGORITHM1_COPIES = 8
#: n × n × d_v tensors per head of the naive tensorized form (scores, probabilities, products, gradients);
#: measured ~4.4 (MTSA) and ~5 (DiSA).
_NAIVE_COPIES = 6
#: elements of one weight block of the chunked sigmoid / DMAN kernels (maskattn.kernels.sigmoid.CHUNK_ELEMENTS)
#: and the number of block-sized temporaries alive at once in their backward.
_CHUNK_ELEMENTS = 1 << 21
_CHUNK_COPIES = 4


@dataclass(frozen=True)
class Point:
    """One measurement point: input ``(batch, n, width)`` of ``dtype``."""

    batch: int
    n: int
    width: int
    dtype: torch.dtype

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()


def _local_span(module: nn.Module, n: int) -> int | None:
    """Keys per query of a local (banded) mask, or None for a global mechanism."""
    if isinstance(module, ConvSelfAttention):
        return min(module.window, n) * module.head_window
    if isinstance(module, StaticMaskAttention):
        radius = module.radius if module.radius != "sqrt" else math.sqrt(n) / 2
        return min(2 * math.floor(radius) + 1, n)
    return None


def family_of(module: nn.Module, backend: str) -> str:
    """The cost family (one of :data:`FAMILIES`) of ``module`` run on ``backend``."""
    if isinstance(module, Algorithm1):
        return "algorithm1"
    if isinstance(module, (MTSA, FastDiSA)):
        return "tensorized_naive" if backend == "reference" else "tensorized"
    if isinstance(module, DiSA):
        return "tensorized_naive"
    if isinstance(module, BiRNN):
        return "lstm"
    if isinstance(module, MultiCNN):
        return "cnn"
    if not isinstance(module, _DENSE_TYPES):
        return "other"
    if backend in ("banded", "flex", "triton") and _local_span(module, 1) is not None:
        return "local"
    return "dense"


def projection_flops(module: nn.Module, tokens: int) -> int:
    """Forward FLOPs of every linear map of ``module`` applied once to each of ``tokens`` tokens."""
    total = 0
    for sub in module.modules():
        if isinstance(sub, nn.Linear):
            total += 2 * tokens * sub.in_features * sub.out_features
        elif isinstance(sub, HeadwiseLinear):
            heads, d_in, d_out = sub.weight.shape
            total += 2 * tokens * heads * d_in * d_out
        elif isinstance(sub, nn.MultiheadAttention):  # its fused q/k/v projection is a bare Parameter
            total += 2 * tokens * sub.in_proj_weight.shape[0] * sub.in_proj_weight.shape[1]
    return total


def attention_flops(batch: int, heads: int, queries: int, keys: int, d_k: int, d_v: int) -> int:
    """Forward FLOPs of ``q kᵀ`` (``d_k``) and ``weights @ values`` (``d_v``) over ``queries × keys``."""
    return 2 * batch * heads * queries * keys * (d_k + d_v)


def _heads_and_widths(module: nn.Module) -> tuple[int, int, int]:
    """(heads, d_k, d_v) of an attention module."""
    if isinstance(module, TorchMHA):
        heads = module.attention.num_heads
        return heads, module.attention.head_dim, module.attention.head_dim
    core = module.mtsa if isinstance(module, Algorithm1) else module
    if not isinstance(core, SelfAttention):
        raise ArgumentTypeError(f"no attention heads to cost in {type(module).__name__}")
    heads = core.num_heads
    d_v = core.d_model // heads
    d_k: int = getattr(core, "d_k", d_v)
    return heads, d_k, d_v


def forward_flops(module: nn.Module, backend: str, point: Point) -> int | None:
    """Forward FLOPs of ``module(x)`` for ``x`` of shape ``(batch, n, width)``, or None when no analytic
    model covers ``module`` (the caller then counts with ``FlopCounterMode``)."""
    B, n = point.batch, point.n
    family = family_of(module, backend)
    if isinstance(module, BiRNN):  # family lstm
        total = 0
        for name, weight in module.rnn.named_parameters():
            if name.startswith(("weight_ih", "weight_hh")):
                total += 2 * B * n * weight.shape[0] * weight.shape[1]
        return total
    if isinstance(module, MultiCNN):  # family cnn
        # (B, C_in, n) → (B, C_out, n) per kernel size: the input is padded to keep n outputs
        return sum(2 * B * n * module.channels * module.d_in * k for k in module.kernels)
    if family == "other":
        return None
    heads, d_k, d_v = _heads_and_widths(module)
    span = _local_span(module, n) if family == "local" else None
    keys = span if span is not None else n * getattr(module, "head_window", 1)
    value_width = 2 * d_v if family in ("tensorized", "algorithm1") else d_v  # [v ⊙ E ; E] is 2·d_v wide
    key_width = 0 if isinstance(module, DiSA) else d_k  # DiSA's score is additive: no q kᵀ product
    return projection_flops(module, B * n) + attention_flops(B, heads, n, keys, key_width, value_width)


def band_pairs(n: int, left: float, right: float) -> int:
    """The (query, key) pairs of an ``n × n`` band ``i − left <= j <= i + right`` (``inf`` for an open side)."""
    i = torch.arange(n, dtype=torch.float64)
    counts = (torch.clamp(i + right, max=n - 1) - torch.clamp(i - left, min=0) + 1).clamp(min=0)
    return int(counts.sum())


def _attended_pairs(module: nn.Module, n: int) -> tuple[int, int, int, int] | None:
    """(heads, pairs over all heads, d_k, value width) of the attention core of ``module`` at length ``n``:
    only the (query, key) pairs its mask allows (a band's, a directional head's half, CSAN 2D's area), or None
    when the module has no modelled attention core."""
    if isinstance(module, CausalSDPA):
        d_h = module.in_proj.out_features // 3 // module.heads
        return module.heads, module.heads * band_pairs(n, math.inf, 0), d_h, d_h
    if not isinstance(module, (*_DENSE_TYPES, MTSA, FastDiSA, ConvSelfAttention)):
        return None
    heads, d_k, d_v = _heads_and_widths(module)
    if isinstance(module, (MTSA, FastDiSA)):
        bands = module.mask.bands_per_head(heads)
        pairs = n * n * heads if bands is None else sum(band_pairs(n, *band) for band in bands)
        return heads, pairs, d_k, 2 * d_v  # [v ⊙ E ; E]
    causal = getattr(module, "causal", False)
    if isinstance(module, ConvSelfAttention):
        r = module.window // 2
        return heads, module.head_window * heads * band_pairs(n, r, r), d_k, d_v
    if isinstance(module, StaticMaskAttention) and module.radius != "sqrt":
        r = math.floor(module.radius)
        return heads, heads * band_pairs(n, r, 0 if causal else r), d_k, d_v
    return heads, heads * band_pairs(n, math.inf, 0 if causal else math.inf), d_k, d_v


def useful_attention_flops(module: nn.Module, point: Point, *, inference: bool = False) -> int | None:
    """FLOPs of the attention core alone (``q kᵀ`` and the weighted sum of values) over the pairs the mask
    allows — what a kernel that skips every masked-out score must do, FlashAttention's convention for its
    TFLOP/s (causal: half) —, forward + backward counted as 3 × forward (inference: forward); None for a
    module without a modelled attention core."""
    core = _attended_pairs(module, point.n)
    if core is None:
        return None
    _, pairs, d_k, value_width = core
    forward = 2 * point.batch * pairs * (d_k + value_width)
    return forward if inference else 3 * forward


def step_flops(module: nn.Module, backend: str, point: Point) -> int | None:
    """FLOPs of one forward + backward (3 × forward; see the module docstring), or None if unmodelled."""
    forward = forward_flops(module, backend, point)
    return None if forward is None else 3 * forward


def estimate_bytes(module: nn.Module, backend: str, point: Point) -> int:
    """A rough upper estimate of the peak bytes allocated by one training step (see the module docstring)."""
    B, n, d, size = point.batch, point.n, point.width, point.itemsize
    parameters = sum(p.numel() for p in module.parameters())
    out_width = getattr(module, "out_dim", d)
    base = (_LINEAR_ACTIVATIONS * B * n * max(d, out_width) + 2 * parameters) * size
    family = family_of(module, backend)
    if family == "other":
        return base
    if isinstance(module, BiRNN):  # family lstm
        return base + 2 * 2 * 5 * B * n * module.hidden * size  # gates and cell states of both directions, + grads
    if isinstance(module, MultiCNN):  # family cnn
        return base + B * n * d * sum(module.kernels) * size  # unfolded input windows
    heads, _, d_v = _heads_and_widths(module)
    area = getattr(module, "head_window", 1)
    keys = n * area
    if family == "tensorized_naive":
        return base + _NAIVE_COPIES * B * heads * n * keys * d_v * size
    if family == "algorithm1":
        return base + _ALGORITHM1_COPIES * B * heads * n * keys * size
    if family == "local":
        # band scores per head, plus the keys and values gathered block by block (and their gradients)
        span = _local_span(module, n) or n
        return base + (_DENSE_COPIES * B * heads * n * span + 6 * area * B * n * d) * size
    if backend == "reference":
        return base + _DENSE_COPIES * B * heads * n * keys * size
    # fused kernels: no n × m float tensor kept, but a mask per (batch,) head (bool, and a float copy in
    # PyTorch's CPU kernel) unless the mechanism has none, and the block workspace of the chunked kernels
    masked = isinstance(module, (MTSA, FastDiSA, StaticMaskAttention, ConvSelfAttention))
    mask = B * heads * n * keys * (1 + size) if masked else 0
    return base + mask + _CHUNK_COPIES * min(_CHUNK_ELEMENTS, B * heads * n * keys) * size
