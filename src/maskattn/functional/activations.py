"""The one activation table of the library: every option that names an activation (MTSA's ``s2t_activation``,
``v_activation``, ``out_activation``, ``in_activation``; Fast-DiSA's; DMAN / SMAN / MAN SAN's ``activation``,
Eq. 5's ``F``; the encoder–decoder attention's; the FFN's; the source2token pooling's) is a name of
:data:`ACTIVATIONS`, checked by :func:`check_activation`.

The names are those of the authors' code:

* ``relu``, ``elu``, ``selu`` — ``activation_name_to_func`` of taoshen58/mtsa ``MTSA_API/mtsa.py`` (lines 396–424;
  their ``selu`` is ``scale · where(x >= 0, x, alpha · elu(x))``, PyTorch's ``F.selu``);
* ``gelu_tanh``, ``swish``, ``lrelu`` — the three that the copy in ``Proj_NLI_Trans_mtsa/src/nn_utils/mtsa.py``
  adds (lines 403–433): its ``gelu`` is the tanh approximation ``0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))``,
  its ``swish`` is ``x · σ(x)``, its ``lrelu`` is ``tf.nn.leaky_relu`` (negative slope 0.2, TensorFlow's default);
* ``gelu`` — the exact (erf) GELU: PyTorch's ``F.gelu``, fairseq's ``gelu`` that LibertFan/MAN's summarization
  model uses (``summarization/model/man.py`` ``man_base``: ``activation_fn='gelu'``), and the name the FFN always
  had. The NLI_Trans ``gelu`` is ``gelu_tanh`` here (fairseq calls it ``gelu_accurate``): the two differ by up to
  ~1e-3, so one name cannot mean both.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..errors import ArgumentError

__all__ = ["ACTIVATIONS", "LEAKY_RELU_SLOPE", "activation", "check_activation"]

#: ``tf.nn.leaky_relu``'s default ``alpha`` (the NLI_Trans ``lrelu``).
LEAKY_RELU_SLOPE = 0.2


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def _lrelu(x: torch.Tensor) -> torch.Tensor:
    return F.leaky_relu(x, LEAKY_RELU_SLOPE)


#: Activation name → function (elementwise, ``Tensor -> Tensor``).
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "elu": F.elu,
    "relu": F.relu,
    "selu": F.selu,
    "gelu": F.gelu,
    "gelu_tanh": _gelu_tanh,
    "swish": F.silu,
    "lrelu": _lrelu,
}


def check_activation(value: object, name: str, *, optional: bool = True) -> str | None:
    """``value`` checked as an activation name of :data:`ACTIVATIONS` (or ``None``, no activation, when
    ``optional``); raises :class:`~maskattn.errors.ArgumentError` naming ``name``, the value and the choices."""
    if value is None and optional:
        return None
    if isinstance(value, str) and value in ACTIVATIONS:
        return value
    names = ", ".join(map(repr, ACTIVATIONS))
    expected = f"None (no activation) or one of {names}" if optional else f"one of {names}"
    raise ArgumentError(f"unknown {name} {value!r}; expected {expected}")


def activation(name: str | None) -> Callable[[torch.Tensor], torch.Tensor]:
    """The function of an activation name (``None``: the identity)."""
    if name is None:
        return _identity
    return ACTIVATIONS[name]


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x
