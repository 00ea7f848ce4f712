"""Option checks shared by :func:`maskattn.hf.register` and :func:`maskattn.hf.convert`: every error names
the option, the value received and what was expected, before the model is touched."""

from __future__ import annotations

from collections.abc import Mapping


def describe(value) -> str:
    return f"{type(value).__name__} {value!r}"


def check_known(options: Mapping, valid: Mapping, mechanism: str) -> None:
    """Raise when ``options`` holds a name that ``mechanism`` does not take."""
    unknown = sorted(set(options) - set(valid))
    if unknown:
        listed = ", ".join(valid) if valid else "none (it is parameter-free with no option)"
        raise ValueError(f"unknown option {unknown[0]!r} for mechanism {mechanism!r}; valid options: {listed}")


def check_int(value, name: str, minimum: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int >= {minimum} ({what}), got {describe(value)}")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum} ({what}), got {value}")
    return value


def check_odd(value, name: str, what: str) -> int:
    check_int(value, name, 1, what)
    if value % 2 == 0:
        raise ValueError(f"{name} must be odd ({what}), got {value}")
    return value


def check_float(value, name: str, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float ({what}), got {describe(value)}")
    return float(value)


def check_choice(value, name: str, choices) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"unknown {name} {value!r}; expected one of {', '.join(repr(c) for c in choices)}")
    return value
