"""What an LRQ message costs on the wire: layer width, levels and bits per coordinate (Lemma 3, counted exactly).
"""

from __future__ import annotations

import math

import numpy as np

from flower_dp._checks import check_int, check_nonnegative, check_positive

__all__ = ["lrq_w_min", "lrq_levels", "lrq_bits_fixed", "lrq_bits_paper", "lrq_message_bits", "empirical_entropy"]


def lrq_w_min(sigma: float) -> float:
    """Smallest layer width ``2 sigma sqrt(2 ln 2)`` (Def. 3), ~2.35482 sigma."""
    return 2.0 * check_positive("sigma", sigma) * math.sqrt(2.0 * math.log(2.0))


def lrq_levels(A: float, sigma: float) -> int:
    """Exact worst-case number of levels ``2 ceil(A / w_min) + 1`` for inputs in [-A, A] (Lemma 3, counted exactly)."""
    A = check_nonnegative("A", A, hint="A is the infinity norm bound of the input")
    return 2 * math.ceil(A / lrq_w_min(sigma)) + 1


def lrq_bits_fixed(A: float, sigma: float) -> int:
    """Fixed-length bits per coordinate, ``ceil(log2(lrq_levels(A, sigma)))`` (Lemma 3)."""
    return math.ceil(math.log2(lrq_levels(A, sigma)))


def lrq_bits_paper(A: float, sigma: float) -> float:
    """The paper's Lemma 3 real-valued bits ``log2(A / (sigma sqrt(2 ln 2)) + 1)``."""
    A = check_nonnegative("A", A)
    return math.log2(A / (check_positive("sigma", sigma) * math.sqrt(2.0 * math.log(2.0))) + 1.0)


def lrq_message_bits(d: int, A: float, sigma: float) -> int:
    """Implementable fixed-length uplink bits: ``d * lrq_bits_fixed + 32`` (A as float32)."""
    return check_int("d", d, minimum=0) * lrq_bits_fixed(A, sigma) + 32


def empirical_entropy(m: np.ndarray) -> float:
    """Empirical entropy of the symbols of ``m`` in bits per coordinate (entropy-coding bound)."""
    m = np.asarray(m)
    if m.size == 0:
        return 0.0
    _, counts = np.unique(m, return_counts=True)
    p = counts / m.size
    return float(-(p * np.log2(p)).sum())
