"""The backend policy: one table that says, for every kernel family, which backends exist and which one
``backend="auto"`` runs (docs/design.md §2, "one switch, one truth").

Backends:

* ``reference`` — explicit math with materialised scores; float64-capable; the specification. The
  attention maps (``module.attention_maps(x)``) always come from it.
* ``sdpa``      — PyTorch's dense kernels (``F.scaled_dot_product_attention``) and the library's
  recomputing autograd kernels built on dense matmuls (:mod:`maskattn.kernels`): MTSA's blocked sigmoid
  kernel, DMAN's tiled kernel. Dense in the mask: O(n²) time.
* ``flex``      — ``torch.nn.attention.flex_attention`` with ``score_mod`` / ``mask_mod`` and a block
  mask that skips empty blocks. Training on CUDA only (PyTorch: "FlexAttention does not support
  backward on CPU"); no attention dropout.
* ``banded``    — the library's O(n · band) local kernel (:mod:`maskattn.kernels.banded`) for masks
  that are a fixed band ``i − left <= j <= i + right``.

Every mechanism module and functional entry point calls :func:`resolve` with its family; an explicit
backend is honoured, or refused with a ``ValueError`` that says why and what to use instead — never
silently swapped. ``maskattn list --backends`` prints the table (:func:`maskattn.attention.registry.backend_table`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .validation import check_choice
from .kernels.flex import flex_available

__all__ = ["BACKENDS", "Rule", "BackendPolicy", "POLICIES", "backends_of", "check_backend", "refusal",
           "resolve", "needs_grad", "auto_choice", "SITUATIONS", "flex_available"]

BACKENDS = ("reference", "sdpa", "flex", "banded")


@dataclass(frozen=True)
class Rule:
    """``auto`` picks ``backend`` when every condition that is not None holds: ``device`` (``"cpu"`` /
    ``"cuda"``), ``training`` (autograd runs through the call), ``dropout`` (attention dropout is active),
    ``band`` (the mask is a fixed band)."""

    backend: str
    device: str | None = None
    training: bool | None = None
    dropout: bool | None = None
    band: bool | None = None

    def matches(self, device: str, training: bool, dropout: bool, band: bool) -> bool:
        return all(want is None or want == have for want, have in
                   ((self.device, device), (self.training, training), (self.dropout, dropout), (self.band, band)))


@dataclass(frozen=True)
class BackendPolicy:
    """The backends of one kernel family and the ``auto`` rules (first match wins; the last rule has no
    condition), with the reason for the choice."""

    family: str
    backends: tuple[str, ...]
    auto: tuple[Rule, ...]
    why: str


_FLEX_GRAD_NOTE = ("flex is not chosen for training: upstream reports wrong gradients for learnable tensors captured "
                   "by a compiled score_mod (pytorch/pytorch#158212), which is how DMAN's bias enters")

#: Kernel family → policy. The families are what the functional entry points compute; each registered
#: mechanism names its family (``SelfAttention.family``).
POLICIES: dict[str, BackendPolicy] = {p.family: p for p in (
    BackendPolicy("dot_product", ("reference", "sdpa", "flex"), (Rule("sdpa"),),
                  "SDPA's fused kernels (flash / memory-efficient on CUDA, flash on CPU) for plain masked attention"),
    BackendPolicy("mask_attention", ("reference", "sdpa", "flex"), (Rule("sdpa"),),
                  "MAN Eq. 4 with a given M: log M as an SDPA bias"),
    BackendPolicy("dman", ("reference", "sdpa", "flex"),
                  (Rule("flex", device="cuda", training=False, dropout=False), Rule("sdpa")),
                  "the tiled recomputing DMAN kernel (no n×n tensor kept for backward); flex for CUDA inference; "
                  + _FLEX_GRAD_NOTE),
    BackendPolicy("local", ("reference", "sdpa", "flex", "banded"),
                  (Rule("flex", device="cuda", dropout=False, band=True), Rule("banded", band=True), Rule("sdpa")),
                  "O(n·window): flex block masks on CUDA, the banded kernel elsewhere; dense SDPA when the window "
                  "is not a fixed band (SMAN radius='sqrt')"),
    BackendPolicy("tensorized", ("reference", "sdpa", "flex", "banded"),
                  (Rule("flex", device="cuda", dropout=False), Rule("banded", band=True, dropout=False), Rule("sdpa")),
                  "MTSA as one scalar attention over [v⊙E; E] (docs/design.md §1): flex on CUDA, the banded kernel "
                  "when every head is a window, else the blocked sigmoid kernel (which applies Appendix A.3's "
                  "dropout)"),
    BackendPolicy("multi_dim", ("reference",), (Rule("reference"),),
                  "DiSA's scores are an n×n×d tensor by construction (the memory baseline of MTSA Fig. 1)"),
)}

def _policy(family: str) -> BackendPolicy:
    if family not in POLICIES:
        raise ValueError(f"unknown kernel family {family!r}; expected one of {', '.join(POLICIES)}")
    return POLICIES[family]


def backends_of(family: str) -> tuple[str, ...]:
    """The concrete backends of ``family``."""
    return _policy(family).backends


def check_backend(backend, family: str) -> str:
    """``backend`` validated against ``family``'s backends (or ``"auto"``); for module constructors."""
    return check_choice(backend, "backend", ("auto",) + _policy(family).backends)


def needs_grad(*tensors: torch.Tensor) -> bool:
    """Will autograd run through a call on ``tensors``?"""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def refusal(backend: str, *, device: str, training: bool, dropout: bool, band: bool) -> str | None:
    """Why ``backend`` cannot run a call in this situation (None when it can): ``device`` type, ``training``
    (autograd runs through it), ``dropout`` active, ``band`` (the mask is a fixed band)."""
    if backend == "flex":
        if not flex_available():
            return "backend='flex' needs torch.nn.attention.flex_attention (PyTorch >= 2.5)"
        if dropout:
            return "backend='flex' does not support attention dropout; use backend='sdpa' or 'auto'"
        if training and device != "cuda":
            return ("backend='flex' supports backward only on CUDA (PyTorch raises 'FlexAttention does not support "
                    "backward on CPU'); use backend='auto' for CPU training, or call under torch.no_grad() for CPU "
                    "inference")
    if backend == "banded" and not band:
        return ("backend='banded' needs a mask that is a fixed band i - left <= j <= i + right on every head (a window "
                "with a fixed radius); use backend='sdpa' or 'auto' for this mask")
    return None


def resolve(family: str, backend: str, *, device: torch.device | str, training: bool, dropout: bool = False,
            band: bool = False) -> str:
    """The backend that runs a call of ``family``: ``backend`` itself when it can run, else a ``ValueError``
    saying why; ``"auto"`` → the first matching rule of :data:`POLICIES`.

    ``training``: autograd runs through the call; ``dropout``: attention dropout is active; ``band``: the
    mask is a fixed band (the local kernels apply)."""
    policy = _policy(family)
    check_backend(backend, family)
    device = torch.device(device).type
    context = dict(device=device, training=bool(training), dropout=bool(dropout), band=bool(band))
    if backend == "auto":
        for rule in policy.auto:
            if rule.matches(**context) and refusal(rule.backend, **context) is None:
                return rule.backend
        return "sdpa" if "sdpa" in policy.backends else policy.backends[0]
    reason = refusal(backend, **context)
    if reason is not None:
        raise ValueError(reason)
    return backend


#: (column title, device, training, dropout) of the situations the backend table shows.
SITUATIONS = (
    ("CPU training", "cpu", True, False),
    ("CPU inference", "cpu", False, False),
    ("CUDA training", "cuda", True, False),
    ("CUDA training + dropout", "cuda", True, True),
    ("CUDA inference", "cuda", False, False),
)


def auto_choice(family: str, *, device: str, training: bool, dropout: bool, band: bool) -> str:
    """What ``auto`` runs for ``family`` in a situation, from the rules alone (as if flex were installed):
    the entries of the backend table."""
    for rule in _policy(family).auto:
        if rule.matches(device, training, dropout, band):
            if rule.backend == "banded" and not band:
                continue
            if rule.backend == "flex" and (dropout or (training and device != "cuda")):
                continue
            return rule.backend
    return _policy(family).backends[0]
