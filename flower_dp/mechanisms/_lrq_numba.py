"""Fused numba kernels of the LRQ codec (optional: ``pip install flower-dp[fast]``; see :mod:`.lrq`).

Each kernel does in one pass over a block what the numpy path of :func:`flower_dp.mechanisms.lrq.encode`
/ :func:`~flower_dp.mechanisms.lrq.decode` does in one numpy call per operation, with exactly the same
IEEE operations in the same order and the same float type, so every result is bit for bit the
numpy path's (the decoder's v where m != 0 come from the Philox counter instead: integer
arithmetic and numpy's exact int-to-float conversion, see the last section):

- only exact or correctly rounded operations: ``+ - * /``, ``abs``, ``min``, comparisons, casts
  (round to nearest) and nothing else.  The transcendental functions (exp, log, log1p) stay in
  numpy, on the few coordinates that need them: numpy's SIMD versions and LLVM's / libm's may
  differ in the last bit;
- fastmath off (numba's default): no FMA contraction (the compiled encoder has no FMA instruction,
  tests/test_lrq_fused.py checks), no reassociation, no reciprocal;
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

__all__ = ["amax_finite", "encode_block", "decode_block", "decode_block_at", "philox_state", "uniforms_at",
           "v_and_s", "hw_pre", "hw_mid", "floor_post", "hat_post"]

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


# --- the layer arithmetic of dense blocks, between numpy's exp / log / log1p ----------------------
#
# lrq ``_halfwidths`` + ``_floor_t`` / ``_hat`` are ~20 numpy passes, 3 of them transcendental.  Here
# the 17 others are 3 kernel passes (plus one for v and s), each doing the numpy path's operations in
# its order and float type; exp, log and log1p stay numpy calls on the same buffers.


@njit(**_JIT)
def v_and_s(r, u, inv_sigma, v, s):
    """``v = 1 - r`` and ``s = float(u * inv_sigma)`` (the product in float64, as numpy's ``same_kind`` out)."""
    one = as_layer(1.0, r[0])
    for i in range(r.size):
        v[i] = one - r[i]
        s[i] = as_layer(u[i] * inv_sigma, one)


@njit(**_JIT)
def hw_pre(z, z2, p):
    """``z2 = z z``, ``p = z2 (-0.5)`` (then numpy: ``p = exp(p)``, ``own = log(v)``)."""
    half = as_layer(-0.5, z[0])
    for i in range(z.size):
        q = z[i] * z[i]
        z2[i] = q
        p[i] = q * half


@njit(**_JIT)
def hw_mid(z2, v, p, own, cap):
    """``p = -min(p v, cap)``, ``own = sqrt(own (-2) + z2)`` (then numpy: ``p = log1p(p)``)."""
    two = as_layer(-2.0, cap)
    for i in range(p.size):
        q = p[i] * v[i]
        q = q if q < cap else cap  # np.minimum (no NaN here)
        p[i] = -q
        own[i] = np.sqrt(own[i] * two + z2[i])


@njit(**_JIT)
def floor_post(z, s, own, p, out):
    """Eq. 11 from the half-widths: ``other = sqrt(p (-2))``, ``out = floor(((R - z) + s) / (own + other))``."""
    two = as_layer(-2.0, z[0])
    for i in range(z.size):
        other = np.sqrt(p[i] * two)
        t = (own[i] if z[i] >= 0 else other) - z[i]  # R - x (in units of sigma)
        t = t + s[i]
        out[i] = np.floor(t / (own[i] + other))  # an integer below the int dtype's range (the level bound)


def _times_level(w, m):
    """``w * m`` as numpy's ``own *= m`` computes it; jit only."""
    raise NotImplementedError("_times_level is only defined inside numba-compiled code")


@overload(_times_level, jit_options=_JIT)
def _times_level_ol(w, m):
    if w == types.float32 and m.bitwidth <= 16:  # numpy: float32 loop (int8 / int16 -> float32 exactly)
        return lambda w, m: w * np.float32(m)
    if w == types.float32:  # numpy: float64 loop, the product rounded back to float32
        return lambda w, m: np.float32(np.float64(w) * np.float64(m))
    return lambda w, m: w * np.float64(m)


@njit(**_JIT)
def hat_post(z, m, own, p, sig, out):
    """Eq. 12 from the half-widths: ``out = float64((own + other) m + z) * sig``."""
    two = as_layer(-2.0, z[0])
    for i in range(z.size):
        w = own[i] + np.sqrt(p[i] * two)
        x = _times_level(w, m[i]) + z[i]
        out[i] = np.float64(x) * sig


# --- the decoder's v where m != 0, straight from the Philox counter ------------------------------
#
# The decoder needs v = 1 - r only where m != 0 (0.02 % of the coordinates of a clipped update), so
# instead of drawing all of a chunk's r it computes those few from the counter-based generator:
# r[j] is a fixed function of (the Philox state right after the chunk's z, j).  Integer arithmetic
# only (Random123's Philox4x64-10 as numpy implements it, numpy/random/src/philox/philox.h), then
# numpy's exact conversions: float64 ``(u64 >> 11) * 2^-53``, float32 ``(u32 >> 8) * 2^-24`` from the
# 32-bit halves, low half first.  :func:`flower_dp.mechanisms.lrq._positional_ok` checks this
# against numpy's own draws once per process before it is used.

_M0 = np.uint64(0xD2E7470EE14C6C93)
_M1 = np.uint64(0xCA5A826395121157)
_W0 = np.uint64(0x9E3779B97F4A7C15)
_W1 = np.uint64(0xBB67AE8584CAA73B)
_LO32 = np.uint64(0xFFFFFFFF)
_U0 = np.uint64(0)
_U1 = np.uint64(1)
_U8 = np.uint64(8)
_U11 = np.uint64(11)
_U32 = np.uint64(32)


def philox_state(bit_generator) -> np.ndarray:
    """A numpy ``Philox``'s state as uint64[13]: counter (4), key (2), buffer (4), buffer_pos, has_uint32, uinteger."""
    st = bit_generator.state
    if st["bit_generator"] != "Philox":
        raise TypeError(f"expected a Philox bit generator, got {st['bit_generator']}")
    return np.concatenate([st["state"]["counter"], st["state"]["key"], st["buffer"],
                           np.array([st["buffer_pos"], st["has_uint32"], st["uinteger"]], dtype=np.uint64)])


@njit(**_JIT)
def _mulhilo(a, b):
    """(low, high) 64-bit halves of the 128-bit product a * b (uint64)."""
    a_lo, a_hi = a & _LO32, a >> _U32
    b_lo, b_hi = b & _LO32, b >> _U32
    hh, hl, lh, ll = a_hi * b_hi, a_hi * b_lo, a_lo * b_hi, a_lo * b_lo
    carry = ((hl & _LO32) + (lh & _LO32) + (ll >> _U32)) >> _U32
    return a * b, hh + (hl >> _U32) + (lh >> _U32) + carry


@njit(**_JIT)
def _u64_at(t, st):
    """The t-th uint64 (t >= 0) the Philox generator of state ``st`` (:func:`philox_state`) would return."""
    bpos = np.int64(st[10])
    avail = 4 - bpos
    if t < avail:
        return st[6 + bpos + t]
    q = (t - avail) // 4
    lane = (t - avail) % 4
    add = np.uint64(q) + _U1  # the counter after q + 1 increments, with carry (philox_next)
    c0, c1, c2, c3 = st[0] + add, st[1], st[2], st[3]
    if c0 < add:
        c1 += _U1
        if c1 == _U0:
            c2 += _U1
            if c2 == _U0:
                c3 += _U1
    k0, k1 = st[4], st[5]
    for rnd in range(10):
        if rnd > 0:
            k0 += _W0
            k1 += _W1
        lo0, hi0 = _mulhilo(_M0, c0)
        lo1, hi1 = _mulhilo(_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    if lane == 0:
        return c0
    if lane == 1:
        return c1
    if lane == 2:
        return c2
    return c3


def _uniform_at(j, st, like):
    """numpy's j-th ``random()`` of ``like``'s float type from state ``st``; jit only."""
    raise NotImplementedError("_uniform_at is only defined inside numba-compiled code")


@overload(_uniform_at, jit_options=_JIT)
def _uniform_at_ol(j, st, like):
    if like == types.float32:
        def f32(j, st, like):
            if st[11] != _U0:  # a 32-bit half is pending: it is the first one
                if j == 0:
                    return np.float32(st[12] >> _U8) * np.float32(1.0 / 16777216.0)
                j -= 1
            u = _u64_at(j // 2, st)
            half = (u >> _U32) if j % 2 else (u & _LO32)
            return np.float32(half >> _U8) * np.float32(1.0 / 16777216.0)
        return f32

    def f64(j, st, like):
        return np.float64(_u64_at(j, st) >> _U11) * (1.0 / 9007199254740992.0)
    return f64


@njit(**_JIT)
def uniforms_at(js, st, like):
    """``random()`` values number ``js`` (an int64 array) of the stream in state ``st``, of ``like``'s dtype."""
    out = np.empty(js.size, dtype=like.dtype)
    for i in range(js.size):
        out[i] = _uniform_at(js[i], st, like[0])
    return out


@njit(**_JIT)
def decode_block_at(m, z, st, off, sig, out, lim, pos, gpos, gz, gv, cnt):
    """:func:`decode_block` without the block's r: the gathered ``v = 1 - r[off + i]`` come from the
    chunk's Philox state ``st`` after its z (``off``: the block's offset in its chunk)."""
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
                gv[n] = one - _uniform_at(off + i, st, z[0])
                n += 1
    return n
