"""The baselines that ``maskattn bench`` runs beside the registered mechanisms.

Every baseline maps ``x`` ``(B, n, width)`` to ``(B, n, out_dim)`` with ``module(x)``:

* ``torch_mha``       — ``torch.nn.MultiheadAttention(batch_first=True)``, ``need_weights=False``
  (PyTorch's fused scaled-dot-product kernel);
* ``bilstm``          — :class:`maskattn.models.fusion.BiRNN` (MTSA Table 1's Bi-LSTM: ``width`` hidden
  units per direction, ``out_dim = 2·width``);
* ``multi_cnn``       — :class:`maskattn.models.fusion.MultiCNN` (Kim 2014: 3/4/5-gram convolutions with
  ``width`` channels each, ``out_dim = 3·width``);
* ``mtsa_algorithm1`` — :class:`Algorithm1`, MTSA's Algorithm 1 as printed (n×n matrices per head);
* ``sdpa_causal``     — :class:`CausalSDPA`, multi-head attention through ``F.scaled_dot_product_attention``
  with ``is_causal=True`` (the flash kernel's causal path: the speed a local mechanism must beat).

The naive tensorized form of MTSA (n×n×d_h scores) is not listed here: it is the registered ``mtsa``
mechanism on its ``reference`` backend.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..attention import MTSA
from ..models.fusion import BASELINES as FUSION_BASELINES

__all__ = ["Algorithm1", "TorchMHA", "CausalSDPA", "Baseline", "BASELINES", "list_baselines"]


class Algorithm1(nn.Module):
    """MTSA Algorithm 1 as printed: per head, ``E_R = exp(σ_t(R))·exp(M)``, ``E_S = exp(S)``,
    ``E_X = v·E_S``, ``H = E_R E_X / E_R E_S`` — materialised n×n matrices, no max-subtraction (so
    ``exp(S)`` overflows once a source2token score exceeds ~88 in float32). Projections, masks and
    output projection are those of a :class:`maskattn.MTSA` with the same ``d_model`` and ``heads``."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.mtsa = MTSA(d_model, heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, n, d_model) → (B, n, d_model)."""
        m = self.mtsa
        q, k, v, s2t = m.project(x)  # (B, H, n, d)
        n = x.shape[1]
        mask = m.mask.materialize(n, heads=m.num_heads, device=x.device).to(x.dtype)  # exp(M): 1 or 0
        e_r = torch.exp(F.logsigmoid(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]))) * mask  # step 5
        e_s = torch.exp(s2t)  # step 6
        heads = (e_r @ (v * e_s)) / (e_r @ e_s)  # step 7
        assert m.out_proj is not None  # MTSA's default output projection
        return m.out_proj(heads.transpose(1, 2).reshape(x.shape))


class TorchMHA(nn.Module):
    """``torch.nn.MultiheadAttention`` as self-attention with the ``module(x)`` call of the benchmark."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.attention = nn.MultiheadAttention(d_model, heads, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, n, d_model) → (B, n, d_model)."""
        return self.attention(x, x, x, need_weights=False)[0]


class CausalSDPA(nn.Module):
    """Multi-head self-attention with ``F.scaled_dot_product_attention(..., is_causal=True)``: the causal flash
    kernel, which skips the masked half of the score blocks."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads = heads
        self.in_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, n, d_model) → (B, n, d_model)."""
        B, n, d = x.shape
        q, k, v = (t.view(B, n, self.heads, d // self.heads).transpose(1, 2)  # (B, n, d) -> (B, H, n, d/H)
                   for t in self.in_proj(x).chunk(3, dim=-1))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out_proj(out.transpose(1, 2).reshape(B, n, d))


@dataclass(frozen=True)
class Baseline:
    """A benchmarked module that is not a registered mechanism: ``build(width, heads)``; ``uncompilable``: why
    ``torch.compile(fullgraph=True)`` cannot take it (``maskattn bench --compile`` leaves it out, saying so)."""

    description: str
    build: Callable[[int, int], nn.Module]
    uncompilable: str | None = None


BASELINES: dict[str, Baseline] = {
    "torch_mha": Baseline("torch.nn.MultiheadAttention (PyTorch's fused SDPA)", TorchMHA),
    "bilstm": Baseline("Bi-LSTM, width hidden units per direction (out 2·width)",
                       lambda width, heads: FUSION_BASELINES["bilstm"](width),
                       uncompilable="Dynamo does not trace nn.LSTM over packed sequences (a graph break, which "
                                    "fullgraph=True refuses)"),
    "multi_cnn": Baseline("Multi-CNN, 3/4/5-gram convolutions, width channels each (out 3·width)",
                          lambda width, heads: FUSION_BASELINES["multi_cnn"](width, channels=width)),
    "mtsa_algorithm1": Baseline("MTSA Algorithm 1 as printed (n×n matrices per head)", Algorithm1),
    "sdpa_causal": Baseline("multi-head attention through SDPA's causal kernel (is_causal=True)", CausalSDPA),
}


def list_baselines() -> list[str]:
    """Names of the baselines, in the order they are run."""
    return list(BASELINES)
