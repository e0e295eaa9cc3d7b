"""Argument checks shared by the whole package.

Each check raises ``ValueError`` (or ``TypeError``) with a message that names the
argument, the value it got and the valid range, e.g.
``"epsilon must be > 0, got -1.0"``.  Use these instead of ``assert`` for user input.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

__all__ = [
    "check_positive",
    "check_nonnegative",
    "check_probability",
    "check_open_unit",
    "check_int",
    "check_choice",
    "check_finite",
    "check_epsilon",
    "check_delta",
]


def _num(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    v = float(value)
    if math.isnan(v):
        raise ValueError(f"{name} must be a number, got NaN")
    return v


def check_positive(name: str, value: Any, *, allow_inf: bool = False, hint: str = "") -> float:
    """Return ``float(value)`` if it is > 0 (and finite unless ``allow_inf``)."""
    v = _num(name, value)
    if not v > 0 or (math.isinf(v) and not allow_inf):
        rng = "> 0" if allow_inf else "> 0 and finite"
        raise ValueError(f"{name} must be {rng}, got {value!r}{'; ' + hint if hint else ''}")
    return v


def check_nonnegative(name: str, value: Any, *, hint: str = "") -> float:
    """Return ``float(value)`` if it is >= 0 and finite."""
    v = _num(name, value)
    if not (v >= 0 and math.isfinite(v)):
        raise ValueError(f"{name} must be >= 0 and finite, got {value!r}{'; ' + hint if hint else ''}")
    return v


def check_probability(name: str, value: Any, *, hint: str = "") -> float:
    """Return ``float(value)`` if it lies in (0, 1] (a sampling rate)."""
    v = _num(name, value)
    if not 0 < v <= 1:
        raise ValueError(f"{name} must be in (0, 1], got {value!r}{'; ' + hint if hint else ''}")
    return v


def check_open_unit(name: str, value: Any, *, hint: str = "") -> float:
    """Return ``float(value)`` if it lies in the open interval (0, 1)."""
    v = _num(name, value)
    if not 0 < v < 1:
        raise ValueError(f"{name} must be in (0, 1), got {value!r}{'; ' + hint if hint else ''}")
    return v


def check_epsilon(value: Any, name: str = "eps") -> float:
    """A privacy epsilon: > 0 and finite."""
    return check_positive(name, value, hint="pass a finite privacy budget such as 1.0")


def check_delta(value: Any, name: str = "delta") -> float:
    """A privacy delta: in (0, 1)."""
    return check_open_unit(name, value, hint="typical values are 1e-5 or 1/(number of records)")


def check_int(name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """Return ``value`` as an int if it is integral and within [minimum, maximum]."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return int(value)


def check_choice(name: str, value: Any, choices: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``choices``; the error lists them all."""
    options = sorted(choices)
    if value not in options:
        raise ValueError(f"unknown {name} {value!r}; valid choices are {options}")
    return value


def check_finite(name: str, array: Any) -> Any:
    """Raise ``ValueError`` if a tensor/array contains NaN or inf; return it unchanged."""
    try:
        import torch

        if isinstance(array, torch.Tensor):
            if not bool(torch.isfinite(array).all()):
                bad = int((~torch.isfinite(array)).sum())
                raise ValueError(f"{name} must be finite, got {bad} NaN/inf entries of {array.numel()}")
            return array
    except ImportError:  # pragma: no cover - torch is a hard dependency
        pass
    import numpy as np

    arr = np.asarray(array)
    if not np.all(np.isfinite(arr)):
        bad = int((~np.isfinite(arr)).sum())
        raise ValueError(f"{name} must be finite, got {bad} NaN/inf entries of {arr.size}")
    return array
