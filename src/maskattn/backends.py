"""The backend registry: for every kernel family, its backends in ``auto``'s order of preference, each saying
for itself whether it can run a call (docs/design.md §2, "one switch, one truth").

A call describes itself once, as a :class:`Situation` (device, dtype, head dims, gradients, dropout, compiling,
the shape of its mask). Every :class:`Backend` entry answers with the reasons it *cannot* run that situation
(an empty list when it can) — the reasons come from the kernel modules themselves
(:func:`maskattn.kernels.flex.unsupported`, :func:`maskattn.kernels.banded.unsupported`,
:mod:`maskattn.kernels.triton`), as xformers' ``not_supported_reasons`` do — and, separately, the reasons
``auto`` passes it over although it could run (slower there, or an upstream bug). One loop decides:

* ``backend="auto"`` runs the first entry of the family with neither kind of reason;
* a named backend runs when it can, and is otherwise refused with a :class:`~maskattn.errors.BackendError`
  that lists every backend's reasons and what ``auto`` would run — never swapped silently.

``maskattn list --backends``, the trainer's checks before the first step and the tables in the docs read the
same entries (:func:`auto_choice`, :func:`limits`).

Backends:

* ``reference`` — explicit math with materialised scores; float64-capable; the specification. The attention
  maps (``module.attention_maps(x)``) always come from it.
* ``sdpa``      — PyTorch's dense kernels (``F.scaled_dot_product_attention``) and the library's recomputing
  autograd kernels built on dense matmuls (:mod:`maskattn.kernels`): MTSA's blocked sigmoid kernel, DMAN's tiled
  kernel. Dense in the mask: O(n²) time.
* ``flex``      — ``torch.nn.attention.flex_attention`` with ``score_mod`` / ``mask_mod`` and a block mask that
  skips empty blocks.
* ``banded``    — the library's O(n · band) local kernel (:mod:`maskattn.kernels.banded`) for masks that are a
  fixed band ``i − left <= j <= i + right``.
* ``triton``    — the library's fused Triton kernels (:mod:`maskattn.kernels.triton`): MTSA, DMAN and the local
  band at FlashAttention's memory profile. CUDA; on CPU tensors only under Triton's interpreter (tests).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from .errors import ArgumentError, BackendError
from .kernels import banded, flex
from .kernels.flex import flex_available
from .kernels.triton import band as triton_band, dman as triton_dman, runtime as triton_runtime
from .kernels.triton import tensorized as triton_tensorized
from .validation import check_choice

__all__ = ["BACKENDS", "Situation", "Backend", "Family", "FAMILIES", "backends_of", "check_backend", "resolve",
           "reasons", "needs_grad", "auto_choice", "limits", "SITUATIONS", "flex_available"]

BACKENDS = ("reference", "sdpa", "flex", "banded", "triton")


@dataclass(frozen=True)
class Situation:
    """What a call asks of a backend.

    Attributes:
        device: the device type of the inputs (``"cpu"``, ``"cuda"``, …).
        dtype: the dtype the call computes in (the queries' dtype).
        head_dims: ``(d_k, d_v)``.
        training: autograd runs through the call.
        dropout: attention dropout is active.
        compiling: the call is being traced by ``torch.compile``.
        band: the mask is one fixed band ``i − left <= j <= i + right`` on every head over a whole sequence
            (the local kernels apply).
        head_bands: each head's mask is a band (forward, backward, window, full; MTSA's Triton kernel).
        batch_mask: the mask depends on the batch (key padding, a per-sequence radius).
        score_mod: the local family's score modifier: None, ``"logsigmoid"`` or ``"other"``.
        scale: the tensorized family's token2token scale (``"log_sigmoid"`` / ``"identity"``), else None.
        row_floor: DMAN's mask floor is relative to each row's maximum (``mask_floor_mode="row_max"``).
        decoding: fewer queries than keys — a decoding step against a cache (DMAN).
    """

    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    head_dims: tuple[int, int] = (64, 64)
    training: bool = False
    dropout: bool = False
    compiling: bool = False
    band: bool = False
    head_bands: bool = False
    batch_mask: bool = False
    score_mod: str | None = None
    scale: str | None = None
    row_floor: bool = False
    decoding: bool = False

    @classmethod
    def of(cls, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *grad_inputs: torch.Tensor | None,
           dropout: bool, **mask) -> Situation:
        """The situation of a call on q ``(B, H, n, d_k)``, k, v ``(B, H, m, d_v)`` (and other tensors whose
        gradients it would compute); ``mask`` sets the mask fields (``band``, ``head_bands``, …)."""
        tensors = [t for t in (q, k, v, *grad_inputs) if t is not None]
        return cls(device=q.device.type, dtype=q.dtype, head_dims=(q.shape[-1], v.shape[-1]),
                   training=needs_grad(*tensors), dropout=bool(dropout), compiling=torch.compiler.is_compiling(),
                   **mask)


def _none(_: Situation) -> list[str]:
    return []


@dataclass(frozen=True)
class Backend:
    """One backend of one family: ``unsupported(situation)`` — why it cannot run a call; ``passed_over(situation)``
    — why ``auto`` does not choose it although it could run; ``available()`` — why it is missing from this
    installation (None when present; the backend table assumes every package is installed); ``declared()`` — limits
    that depend on the device at hand (compute capability, shared memory), in words, for :func:`limits`."""

    name: str
    summary: str
    unsupported: Callable[[Situation], list[str]] = _none
    passed_over: Callable[[Situation], list[str]] = _none
    available: Callable[[], str | None] = lambda: None
    declared: Callable[[], list[str]] = lambda: []

    def reasons(self, situation: Situation, *, installed: bool = False) -> list[str]:
        """Why this backend cannot run ``situation`` (``installed``: as if every package were installed)."""
        missing = None if installed else self.available()
        return ([missing] if missing else []) + self.unsupported(situation)


@dataclass(frozen=True)
class Family:
    """The backends of one kernel family, in ``auto``'s order of preference, and the reason for that order."""

    name: str
    backends: tuple[Backend, ...]
    why: str
    names: tuple[str, ...] = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "names", tuple(b.name for b in self.backends))

    def backend(self, name: str) -> Backend:
        return self.backends[self.names.index(name)]


# --------------------------------------------------------------------------------------------------
# the entries
# --------------------------------------------------------------------------------------------------

_REFERENCE = Backend("reference", "explicit math with materialised scores (float64-capable; the specification)")
_SDPA = Backend("sdpa", "PyTorch's fused scaled_dot_product_attention")


def _triton_passed_over(s: Situation) -> list[str]:
    if s.device != "cuda":
        return ["Triton's interpreter runs the kernels on the CPU for tests only"]
    reasons = []
    if triton_runtime.disabled():
        reasons.append(f"{triton_runtime.DISABLE_ENV}=1 in the environment takes the Triton kernels out of auto's "
                       "choices")
    if s.dtype == torch.float32:
        reasons.append("float32 inputs: Triton's IEEE tl.dot is a loop of FMAs (spilling registers, minutes to "
                       "compile) and TF32 would change the results; the kernels are for bfloat16 / float16 "
                       "(autocast)")
    if s.decoding:
        reasons.append("a decoding step (fewer queries than keys): one query fills one row of a 64-row tile; the "
                       "other kernels read the cache once")
    return reasons


def _flex_unsupported(s: Situation) -> list[str]:
    return flex.unsupported(device=s.device, training=s.training, dropout=s.dropout, compiling=s.compiling,
                            batch_mask=s.batch_mask)


def _flex_off_cpu(s: Situation) -> list[str]:
    return [f"on {s.device} FlexAttention runs unfused; the other kernels are faster"] if s.device != "cuda" else []


def _flex(summary: str, passed_over: Callable[[Situation], list[str]] = _flex_off_cpu) -> Backend:
    return Backend("flex", summary, _flex_unsupported, passed_over,
                   lambda: None if flex_available() else "needs torch.nn.attention.flex_attention (PyTorch >= 2.5)")


def _triton(summary: str, unsupported: Callable[[Situation], list[str]], kernels: tuple[str, ...]) -> Backend:
    return Backend("triton", summary, unsupported, _triton_passed_over, triton_runtime.missing_reason,
                   lambda: triton_runtime.declared_limits(kernels))


def _dman_flex_passed_over(s: Situation) -> list[str]:
    if s.training:
        return ["upstream reports wrong gradients for learnable tensors captured by a compiled score_mod "
                "(pytorch/pytorch#158212), which is how DMAN's bias enters"]
    return _flex_off_cpu(s)


def _local_flex_passed_over(s: Situation) -> list[str]:
    return _flex_off_cpu(s) + ([] if s.band else ["a mask that is not a fixed band runs dense"])


def _banded_unsupported(s: Situation) -> list[str]:
    return banded.unsupported(band=s.band)


def _local_sdpa_unsupported(s: Situation) -> list[str]:
    return [] if s.score_mod is None else ["cannot apply a score_mod (dense SDPA takes a fixed bias only)"]


def _tensorized_banded_unsupported(s: Situation) -> list[str]:
    reasons = banded.unsupported(band=s.band)
    if s.dropout:
        reasons.append("does not apply MTSA's attention dropout (Appendix A.3: dropout on the numerator only)")
    return reasons


#: Kernel family → its backends in auto's order. Each registered mechanism names its family
#: (``SelfAttention.family``); each functional entry point resolves through it.
FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("dot_product", (_SDPA, _flex("FlexAttention with a block mask"), _REFERENCE),
           "SDPA's fused kernels (flash / memory-efficient on CUDA, flash on CPU) for plain masked attention"),
    Family("mask_attention", (Backend("sdpa", "log M as an SDPA bias"), _flex("log M in a score_mod"), _REFERENCE),
           "MAN Eq. 4 with a given M: log M as an SDPA bias"),
    Family("dman", (
        _triton("fused FlashAttention-2-style kernel with the gate log σ(z) and deterministic mask gradients",
                lambda s: triton_dman.unsupported(device=s.device, dtype=s.dtype,
                                                  head_dims={"d_k": s.head_dims[0], "d_v": s.head_dims[1]},
                                                  row_floor=s.row_floor), triton_dman.KERNELS),
        _flex("the bias inside a score_mod", _dman_flex_passed_over),
        Backend("sdpa", "the tiled recomputing PyTorch kernel (exact gradients of a, P, U)"),
        _REFERENCE),
           "the fused Triton kernel on CUDA; elsewhere the tiled recomputing kernel (no n×n tensor kept for "
           "backward); flex only for inference, as gradients of captured parameters are unreliable upstream"),
    Family("local", (
        _triton("fused band kernel over the head area (CSAN 2D), O(n·band)",
                lambda s: triton_band.unsupported(
                    device=s.device, dtype=s.dtype, head_dims={"d_k": s.head_dims[0], "d_v": s.head_dims[1]},
                    score_mod=s.score_mod) + banded.unsupported(band=s.band), triton_band.KERNELS),
        _flex("block masks that skip empty blocks, O(n·band)", _local_flex_passed_over),
        Backend("banded", "the O(n·band) PyTorch band kernel", _banded_unsupported),
        Backend("sdpa", "dense masked SDPA, O(n²)", _local_sdpa_unsupported),
        _REFERENCE),
           "O(n·window): the fused band kernel on CUDA, the banded kernel elsewhere; dense SDPA when the mask is "
           "not a fixed band (SMAN radius='sqrt', decoding steps)"),
    Family("tensorized", (
        _triton("fused sigmoid attention over [v⊙E; E] with per-head band skipping and Appendix A.3's dropout",
                lambda s: triton_tensorized.unsupported(
                    device=s.device, dtype=s.dtype, head_dims={"d_k": s.head_dims[0], "d_v": s.head_dims[1]},
                    head_bands=s.head_bands, scale=s.scale or "log_sigmoid"), triton_tensorized.KERNELS),
        _flex("one FlexAttention call over [v⊙E; E]"),
        Backend("banded", "the band kernel over [v⊙E; E] (window heads)", _tensorized_banded_unsupported),
        Backend("sdpa", "the blocked sigmoid kernel (applies Appendix A.3's dropout)"),
        _REFERENCE),
           "MTSA as one scalar attention over [v⊙E; E] (docs/design.md §1): the fused Triton kernel on CUDA, else "
           "the banded kernel when every head is a window, else the blocked sigmoid kernel"),
    Family("multi_dim", (_REFERENCE,),
           "DiSA's scores are an n×n×d tensor by construction (the memory baseline of MTSA Fig. 1)"),
)}


def _family(family: str) -> Family:
    if family not in FAMILIES:
        raise ArgumentError(f"unknown kernel family {family!r}; expected one of {', '.join(FAMILIES)}")
    return FAMILIES[family]


def backends_of(family: str) -> tuple[str, ...]:
    """The concrete backends of ``family``, in ``auto``'s order of preference."""
    return _family(family).names


def check_backend(backend, family: str) -> str:
    """``backend`` validated against ``family``'s backends (or ``"auto"``); for module constructors."""
    return check_choice(backend, "backend", ("auto",) + _family(family).names)


def needs_grad(*tensors: torch.Tensor) -> bool:
    """Will autograd run through a call on ``tensors``?"""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def reasons(family: str, backend: str, situation: Situation, *, installed: bool = False) -> list[str]:
    """Why ``backend`` of ``family`` cannot run ``situation`` (empty when it can)."""
    return _family(family).backend(backend).reasons(situation, installed=installed)


def _auto(family: Family, situation: Situation, installed: bool) -> str:
    for entry in family.backends:
        if not entry.reasons(situation, installed=installed) and not entry.passed_over(situation):
            return entry.name
    for entry in family.backends:  # everything that runs here was passed over: take the first that runs
        if not entry.reasons(situation, installed=installed):
            return entry.name
    raise BackendError(f"no backend of the {family.name} family can run this call: " + _report(family, situation))


def _report(family: Family, situation: Situation) -> str:
    parts = []
    for entry in family.backends:
        why = entry.reasons(situation)
        parts.append(f"{entry.name}: {'; '.join(why) if why else 'can run it'}")
    return " | ".join(parts)


def resolve(family: str, backend: str, situation: Situation) -> str:
    """The backend that runs a call of ``family`` in ``situation``: ``backend`` itself when it can run it, else a
    :class:`~maskattn.errors.BackendError` with every backend's reasons; ``"auto"`` → the first backend of the
    family that can run it and is not passed over."""
    entry_family = _family(family)
    check_backend(backend, family)
    if backend == "auto":
        return _auto(entry_family, situation, installed=False)
    why = entry_family.backend(backend).reasons(situation)
    if not why:
        return backend
    try:
        auto = f"backend='auto' runs {_auto(entry_family, situation, installed=False)!r} here"
    except BackendError:
        auto = "no backend can"
    raise BackendError(f"backend={backend!r} cannot run this {family} call: it {'; it '.join(why)}. {auto}. "
                       f"Every backend: {_report(entry_family, situation)}")


#: (column title, situation) of the backend table: float32 on the CPU, bfloat16 on CUDA (mixed precision), head
#: dims 64, and for the local and tensorized families masks that are bands (CSAN's window, MTSA's heads)
SITUATIONS = (
    ("CPU training", Situation("cpu", torch.float32, training=True)),
    ("CPU inference", Situation("cpu", torch.float32)),
    ("CUDA training", Situation("cuda", torch.bfloat16, training=True)),
    ("CUDA training + dropout", Situation("cuda", torch.bfloat16, training=True, dropout=True)),
    ("CUDA inference", Situation("cuda", torch.bfloat16)),
)


def auto_choice(family: str, situation: Situation) -> str:
    """What ``auto`` runs for ``family`` in ``situation`` with every package installed and no interpreter (the
    entries of the backend table)."""
    if family in ("local", "tensorized"):
        situation = replace(situation, band=True, head_bands=True)
    with triton_runtime.not_interpreted():
        return _auto(_family(family), situation, installed=True)


#: situations that bring out each backend's limits (:func:`limits`)
_PROBES = tuple(Situation(device, dtype, head_dims=dims, training=training, dropout=dropout, compiling=compiling,
                          band=band, head_bands=band, batch_mask=not band, score_mod=mod)
                for device in ("cpu", "cuda")
                for dtype in (torch.float32, torch.float64, torch.bfloat16)
                for dims in ((64, 64), (512, 512))
                for training in (False, True) for dropout in (False, True) for compiling in (False, True)
                for band in (True, False) for mod in (None, "other"))


def limits(family: str, backend: str) -> list[str]:
    """Every reason ``backend`` of ``family`` gives over a grid of situations (device, dtype, head dims,
    gradients, dropout, compiling, mask shape) with every package installed: its declared limits, for
    ``maskattn list --backends`` and the docs."""
    entry = _family(family).backend(backend)
    seen: list[str] = []
    with triton_runtime.not_interpreted():
        for probe in _PROBES:
            for reason in entry.reasons(probe, installed=True):
                if reason not in seen:
                    seen.append(reason)
    return seen + [reason for reason in entry.declared() if reason not in seen]
