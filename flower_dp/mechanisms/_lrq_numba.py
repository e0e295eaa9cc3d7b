"""Fused numba kernels of the LRQ codec (optional: ``pip install flower-dp[fast]``; see :mod:`.lrq`).

Each kernel does in one pass over a block what the numpy path of :func:`flower_dp.mechanisms.lrq.encode`
/ :func:`~flower_dp.mechanisms.lrq.decode` does in one numpy call per operation, with exactly the same
IEEE operations in the same order and the same float type, so every result is bit for bit the
numpy path's:

- only exact or correctly rounded operations: ``+ - * /``, ``abs``, ``min``, comparisons, casts
  (round to nearest) and nothing else.  The transcendental functions (exp, log, log1p) stay in
  numpy, on the few coordinates that need them: numpy's SIMD versions and LLVM's / libm's may
  differ in the last bit;
- fastmath off (numba's default): no FMA contraction, no reassociation, no reciprocal;
  ``error_model="numpy"``: a division is IEEE, as numpy's;
- a float32 layer dtype stays float32: numba promotes ``float32 op float64`` (and
  ``float32 * int16``) to float64, so every constant and every cast goes through :func:`as_layer`,
  which rounds to the layer dtype as numpy does when it casts a Python float to a float32 array's
  type (NEP 50).

The kernels are compiled once per signature and cached on disk (``cache=True``, next to this file
or in numba's user cache when that is read-only).
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

__all__ = ["amax_finite", "encode_block", "decode_block"]

_JIT = {"cache": True, "nogil": True, "error_model": "numpy"}  # fastmath stays off


def as_layer(x, like):
    """``x`` rounded to ``like``'s float type (a float32 or float64 scalar); jit only."""
    raise NotImplementedError("as_layer is only defined inside numba-compiled code")


@overload(as_layer, jit_options=_JIT)
def _as_layer(x, like):
    if like == types.float32:
        return lambda x, like: np.float32(x)
    return lambda x, like: np.float64(x)


_GROUP = 64  # the bound test runs branch-free (vectorized) over groups of this many; a group with a hit is redone


@njit(**_JIT)
def amax_finite(u):
    """``(max |u|, all finite)`` of a float64 vector in one vectorized pass (``(0.0, True)`` when empty).

    On the bit patterns: for a non-negative double, the order of its bits as an int64 is its order
    as a number, and every inf / NaN pattern is above every finite one.
    """
    bits = u.view(np.int64)
    mx = 0
    for i in range(bits.size):
        mx = max(mx, bits[i] & 0x7FFFFFFFFFFFFFFF)
    finite = mx < 0x7FF0000000000000
    return np.array([mx]).view(np.float64)[0], finite


@njit(**_JIT)
def _abs_max(z):
    """``max(|z|, initial=0)`` (no NaN in z) with 4 independent running maxima (the same value as one)."""
    k = z.size
    m0 = m1 = m2 = m3 = as_layer(0.0, z[0])
    k4 = k - k % 4
    for i in range(0, k4, 4):
        a0, a1, a2, a3 = abs(z[i]), abs(z[i + 1]), abs(z[i + 2]), abs(z[i + 3])
        m0 = a0 if a0 > m0 else m0
        m1 = a1 if a1 > m1 else m1
        m2 = a2 if a2 > m2 else m2
        m3 = a3 if a3 > m3 else m3
    for i in range(k4, k):
        a0 = abs(z[i])
        m0 = a0 if a0 > m0 else m0
    m0 = m1 if m1 > m0 else m0
    m2 = m3 if m3 > m2 else m2
    return m2 if m2 > m0 else m0


@njit(**_JIT)
def _undecided(z, r, u, inv_sigma, eta, c75, i):
    """Coordinate i is not proven m = 0 (lrq ``_undecided``: ``|u| / sigma >= min(r / (|z| + 0.75), |z|) - eta``)."""
    a = abs(z[i])
    near = r[i] / (a + c75)
    near = near if near < a else a  # np.minimum (no NaN here)
    near = near - eta
    return as_layer(abs(u[i]), a) * inv_sigma >= near  # abs_s = float(|u|) * inv_sigma, in the layer dtype


@njit(**_JIT)
def encode_block(z, r, u, inv_sigma, eps, lim, pos, gpos, gz, gv, gu, cnt):
    """The encoder's bound test (lrq ``_undecided``) on one block, gathering the undecided coordinates.

    ``z``, ``r``: the block's draws (layer dtype, k > 0 of them); ``u``: its float64 input;
    ``inv_sigma``: 1 / sigma in the layer dtype; ``eps``: the layer dtype's machine epsilon (float).
    Appends each undecided coordinate's position (``pos + i``), ``z``, ``v = 1 - r`` and ``u`` at
    index ``cnt`` onwards of ``gpos``, ``gz``, ``gv``, ``gu`` (room for ``lim`` more needed) and
    returns the new count; returns -1 when more than ``lim`` coordinates are undecided (a dense
    block: nothing appended counts).
    """
    if lim < 0:
        return -1
    k = z.size
    zmax = _abs_max(z)
    # near -= _eta(zmax, dtype): the Python float, rounded to the layer dtype
    eta = as_layer(64.0 * 16.0 * eps * (3.0 * np.float64(zmax) + 18.0), zmax)
    c75 = as_layer(0.75, zmax)
    one = as_layer(1.0, zmax)
    n = cnt
    for i0 in range(0, k, _GROUP):
        i1 = min(i0 + _GROUP, k)
        hits = 0
        for i in range(i0, i1):  # branch-free: vectorizes
            hits += _undecided(z, r, u, inv_sigma, eta, c75, i)
        if hits:
            if n - cnt + hits > lim:
                return -1
            for i in range(i0, i1):
                if _undecided(z, r, u, inv_sigma, eta, c75, i):
                    gpos[n] = pos + i
                    gz[n] = z[i]
                    gv[n] = one - r[i]
                    gu[n] = u[i]
                    n += 1
    return n


@njit(**_JIT)
def decode_block(m, z, r, sig, out, lim, pos, gpos, gz, gv, cnt):
    """The decoder's ``m = 0`` pass on one block: ``out = x sigma`` there, the ``m != 0`` ones gathered.

    Writes ``out[i] = float64(z[i]) * sig`` for every i (the caller overwrites the others) and counts
    the nonzero m; returns -1 when more than ``lim`` are nonzero (a dense block); otherwise appends
    the position, ``z`` and ``v = 1 - r`` of each ``m[i] != 0`` at index ``cnt`` onwards of ``gpos``,
    ``gz``, ``gv`` and returns the new count.
    """
    k = m.size
    nz = 0
    for i in range(k):  # vectorizes
        out[i] = np.float64(z[i]) * sig
        nz += m[i] != 0
    if nz > lim:
        return -1
    n = cnt
    if nz:
        one = as_layer(1.0, z[0])  # k > 0 here
        for i in range(k):
            if m[i] != 0:
                gpos[n] = pos + i
                gz[n] = z[i]
                gv[n] = one - r[i]
                n += 1
    return n
