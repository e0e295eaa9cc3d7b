"""Test helper: bitwise comparison of nested node states (tensors, arrays, dicts, lists, plain values)."""

from __future__ import annotations

import numpy as np
import torch


def first_difference(a, b, path: str = "state") -> str | None:
    """The path of the first place where ``a`` and ``b`` differ, or None when they are equal bit for bit
    (tensors: same dtype and ``torch.equal``; arrays: ``np.array_equal``; NaN equals NaN)."""
    if isinstance(a, torch.Tensor):
        return None if isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b) else path
    if isinstance(a, dict):
        if not isinstance(b, dict) or set(a) != set(b):
            return path
        for k in a:
            bad = first_difference(a[k], b[k], f"{path}.{k}")
            if bad:
                return bad
        return None
    if isinstance(a, (list, tuple)):
        if not isinstance(b, (list, tuple)) or len(a) != len(b):
            return path
        for i, (u, v) in enumerate(zip(a, b)):
            bad = first_difference(u, v, f"{path}[{i}]")
            if bad:
                return bad
        return None
    if isinstance(a, np.ndarray):
        return None if np.array_equal(a, b) else path
    return None if a == b or (a != a and b != b) else path
