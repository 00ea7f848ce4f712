"""Option checks shared by :func:`maskattn.hf.register` and :func:`maskattn.hf.convert`: every error names
the option, the value received and what was expected, before the model is touched."""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import ArgumentError, ArgumentTypeError
from ..validation import check_choice, describe

__all__ = ["check_known", "check_int", "check_odd", "check_float", "check_choice", "describe"]


def check_known(options: Mapping, valid: Mapping, mechanism: str) -> None:
    """Raise when ``options`` holds a name that ``mechanism`` does not take."""
    unknown = sorted(set(options) - set(valid))
    if unknown:
        listed = ", ".join(valid) if valid else "none (it is parameter-free with no option)"
        raise ArgumentError(f"unknown option {unknown[0]!r} for mechanism {mechanism!r}; valid options: {listed}")


def check_int(value, name: str, minimum: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{name} must be an int >= {minimum} ({what}), got {describe(value)}")
    if value < minimum:
        raise ArgumentError(f"{name} must be an int >= {minimum} ({what}), got {value}")
    return value


def check_odd(value, name: str, what: str) -> int:
    check_int(value, name, 1, what)
    if value % 2 == 0:
        raise ArgumentError(f"{name} must be odd ({what}), got {value}")
    return value


def check_float(value, name: str, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ArgumentTypeError(f"{name} must be a float ({what}), got {describe(value)}")
    return float(value)
