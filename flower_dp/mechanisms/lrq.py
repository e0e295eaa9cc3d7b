"""Layered randomized quantizer (LRQ) with an exactly Gaussian decoding error.

Yan, Li, Lan, Wu, Song, "Layered Randomized Quantization for Communication-Efficient and
Privacy-Preserving Distributed Learning", arXiv:2312.07060, Sec. IV (Defs. 2-3, Lemma 3).

=========================  ===============================  =============================
paper                      spec                             code
=========================  ===============================  =============================
Delta~_j (client input)    u_j                              ``u[j]``
x_j ~ N(0, sigma^2)        shared layer centre              ``sigma * z`` (z ~ N(0,1))
y_j (flipped height)       via v ~ U(0,1] (§3.3 stable)     ``v``
L_j, R_j, w_j = R_j - L_j  layer interval                   ``w = sigma * (own + other)``
m_j (Eq. 11)               floor((u + R - x) / w)           ``LRQMessage.m``
hat-Delta_j (Eq. 12)       m w + x                          :func:`decode`
=========================  ===============================  =============================

Convention A (Eq. 11/12).  For every input ``u`` the error
``decode(encode(u)) - u`` is exactly ``N(0, sigma^2)`` i.i.d. over coordinates, *averaged over the
shared randomness* (§3.5); the randomness must stay secret between client and server (§2.3).

Shared stream (§2.4) and key: :mod:`.lrq_stream`; the message and its integrity tag: :mod:`.lrq_message`
(decoding with another key or a tampered message raises :class:`flower_dp.errors.DecodeError`); what a message
costs in bits: :mod:`.lrq_bits`.  All their names can be imported from here too.

Speed (the same values as the plain dense formulas).  Each side draws its stream once per
chunk (all of z into one buffer, then v block by block into a cache-sized buffer: the same numbers
as one call) and works on blocks of :data:`_BLOCK` coordinates with preallocated buffers.  Most
coordinates of a clipped update are far below sigma, so ``m = 0`` there; the encoder proves it
with a cheap bound (no transcendental function) and evaluates Eq. 11 only on the undecided
coordinates (:func:`_undecided`); the decoder evaluates Eq. 12's ``m w`` only where ``m != 0``
(``0 * w + x == x`` exactly).  A block with many undecided / nonzero coordinates is computed
densely (and the encoder then skips the test for the next few blocks).  Either way every
coordinate gets exactly what the dense formula gives.

Fused kernels (optional, ``pip install flower-dp[fast]``: numba).  With numba installed, the cheap
exact passes of each side (the bound test, gathering the undecided / nonzero coordinates, the
decoder's ``x sigma`` where ``m = 0``, the input's max and finiteness check; in dense blocks the ~17
exact steps around Eq. 11 / 12's exp, log and log1p) run as compiled loops over each block
(:mod:`._lrq_numba`) instead of one numpy call per operation, and the decoder draws no r
where it needs no v: it takes the v of its few ``m != 0`` coordinates straight from the chunk's
Philox counter (integer arithmetic, checked against numpy's own draws once per process,
:func:`_positional_ok`).  The normal draws and the transcendental layer arithmetic stay in numpy, so
the output (m, the tag, every decoded value) is bit for bit the numpy path's.
``FLOWER_DP_LRQ_KERNEL`` (:data:`KERNEL_ENV`) chooses: ``auto`` (default: the kernels when numba
imports and ``d >= 2^17``, below which numba's one-time import and cache load, 0.5-1 s of CPU,
outweigh what they save), ``numba`` (always; ImportError without numba) or ``numpy`` (never).
"""

from __future__ import annotations

import hmac
import math
import os

import numpy as np

from flower_dp._checks import check_choice, check_int, check_positive
from flower_dp.errors import DecodeError

from .lrq_bits import empirical_entropy, lrq_bits_fixed, lrq_bits_paper, lrq_levels, lrq_message_bits, lrq_w_min
from .lrq_message import LRQMessage
from .lrq_message import message_tag as _tag
from .lrq_stream import chunk_rng as _chunk_rng
from .lrq_stream import draw as _draw
from .lrq_stream import key_bytes as _key_bytes
from .lrq_stream import lrq_key
from .lrq_stream import stream_blocks as _stream_blocks
from .lrq_stream import stream_entropy as _stream_entropy
from .lrq_stream import stream_zr as _stream_zr

__all__ = [
    "LRQMessage",
    "encode",
    "decode",
    "lrq_key",
    "lrq_layers",
    "lrq_w_min",
    "lrq_levels",
    "lrq_bits_fixed",
    "lrq_bits_paper",
    "lrq_message_bits",
    "empirical_entropy",
    "DEFAULT_CHUNK",
    "KERNEL_ENV",
]

#: Coordinates per independently keyed stream chunk.
DEFAULT_CHUNK = 1 << 20
_BLOCK = 1 << 14  # inner block (L2-sized buffers); affects neither the stream nor the result
#: Above this fraction of undecided (encode) / nonzero (decode) coordinates a block is computed densely.
_DENSE_FRACTION = 0.125
_DENSE_RUN = 7  # after a dense block the encoder computes this many blocks densely without testing
_DTYPES = ("float64", "float32")
_INT_DTYPES = (np.int8, np.int16, np.int32, np.int64)
#: Environment variable choosing the codec's inner loops: "auto" (default), "numba" or "numpy".
KERNEL_ENV = "FLOWER_DP_LRQ_KERNEL"
_FUSED_MIN_D = 1 << 17  # "auto" uses the numba kernels from this d on
_kernel_module: object = None  # the imported kernels module, or the ImportError of trying
_positional: bool | None = None  # the kernels' Philox arithmetic matches numpy's draws (see _positional_ok)


def _kernels(d: int):
    """The fused numba kernels (:mod:`._lrq_numba`) for a vector of length ``d``, or None: the numpy path."""
    global _kernel_module
    mode = os.environ.get(KERNEL_ENV, "auto")
    if mode == "numpy" or (mode == "auto" and d < _FUSED_MIN_D):
        return None
    if mode not in ("auto", "numba"):
        raise ValueError(f"{KERNEL_ENV} must be 'auto', 'numba' or 'numpy', got {mode!r}")
    if _kernel_module is None:
        try:
            from . import _lrq_numba
            _kernel_module = _lrq_numba
        except ImportError as exc:  # numba not installed (or broken): the numpy path
            _kernel_module = exc
    if isinstance(_kernel_module, ImportError):
        if mode == "numba":
            raise ImportError(f"{KERNEL_ENV}=numba but the fused LRQ kernels do not import: {_kernel_module}; "
                              "pip install 'flower-dp[fast]'") from _kernel_module
        return None
    return _kernel_module


def _gather_bufs(dtypes: tuple, cap: int, old: tuple | None = None, cnt: int = 0) -> tuple:
    """Arrays of ``cap`` entries of the given dtypes, holding the first ``cnt`` entries of ``old``."""
    new = tuple(np.empty(cap, dtype=t) for t in dtypes)
    for a, b in zip(new, old or ()):
        a[:cnt] = b[:cnt]
    return new


def _halfwidths(z: np.ndarray, v: np.ndarray, own: np.ndarray | None = None, other: np.ndarray | None = None,
                z2: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Stable recipe of Def. 3 (the flip) in units of sigma: (own, other) half-widths, shape like z.

    ``own``, ``other`` and ``z2`` are optional output / scratch buffers of z's shape and dtype
    (the results are the same with or without them).
    """
    cap = 1.0 - float(np.finfo(z.dtype).eps) / 2  # clamp v*g(x) below 1 (belt and braces)
    z2 = np.multiply(z, z, out=z2)
    p = np.multiply(z2, -0.5, out=other)
    np.exp(p, out=p)
    p *= v
    np.minimum(p, cap, out=p)
    own = np.log(v, out=own)
    own *= -2.0
    own += z2
    np.sqrt(own, out=own)
    np.negative(p, out=p)
    np.log1p(p, out=p)
    p *= -2.0
    np.sqrt(p, out=p)
    return own, p


def _undecided(z: np.ndarray, r: np.ndarray, abs_s: np.ndarray, bufs: tuple, out: np.ndarray) -> np.ndarray:
    """Mask of the coordinates whose ``m`` a cheap bound (no log/exp/sqrt) does not prove to be 0.

    All in units of sigma, with a = |z|, r = 1 - v and s = u / sigma: the numerator of Eq. 11
    is ``(R - x) + s`` and ``m = 0`` iff ``-(R - x) <= s < x - L``.  One of the two distances
    R - x, x - L is ``a + other >= a``; the other is ``sqrt(a^2 + q) - a = q / (sqrt(a^2 + q) + a)``
    with ``q = -2 ln v >= 2 r``, increasing in q, so at least ``2 r / (sqrt(a^2 + 2 r) + a)
    >= r / (a + 0.75)`` (as r < 1).  A coordinate is decided when ``|s|`` (``abs_s``) is below both
    bounds by more than the rounding error of the dense formula (:func:`_eta`), which then gives
    ``m = 0`` too.  ``bufs``: 2 scratch arrays of z's length and dtype; ``out``: bool array of
    z's length.
    """
    a = np.abs(z, out=bufs[0])
    near = np.add(a, 0.75, out=bufs[1])
    np.divide(r, near, out=near)
    np.minimum(near, a, out=near)
    near -= _eta(float(a.max(initial=0.0)), z.dtype)
    return np.greater_equal(abs_s, near, out=out)


def _eta(zmax: float, dtype) -> float:
    """Margin above the rounding error of Eq. 11's numerator and w for |z| <= zmax and |s| < |z|.

    Each of R, x, w, s enters with a few ulps of at most ``|z| + 9`` (the half-widths are at
    most ``|z| + sqrt(-2 ln(eps/2)) <= |z| + 8.6``): below ``16 eps (3 zmax + 18)``; 64x that.
    """
    return 64.0 * 16.0 * float(np.finfo(dtype).eps) * (3.0 * zmax + 18.0)


def _floor_t(z: np.ndarray, v: np.ndarray, s: np.ndarray, out: np.ndarray, bufs: tuple | None = None,
             kern=None) -> None:
    """Eq. 11 densely: ``out = floor(((R - x) + s) / w)``, all in units of sigma (s = u / sigma).

    ``bufs``: 4 scratch arrays of z's length and dtype (or None: allocated here).  ``kern``: the
    fused kernels (same result, 4 passes fewer than 20 numpy ones) or None.
    """
    if bufs is None:
        bufs = tuple(np.empty_like(z) for _ in range(4))
    if kern is not None:
        if z.size:
            own, p, z2 = _halfwidths_fused(kern, z, v, bufs)
            kern.floor_post(z, s, own, p, out)
        return
    own, other = _halfwidths(z, v, bufs[0], bufs[1], bufs[2])
    t = bufs[3]
    np.copyto(t, other)
    np.copyto(t, own, where=z >= 0)  # R/sigma
    t -= z  # (R - x)/sigma
    t += s
    own += other  # w/sigma
    t /= own
    np.floor(t, out=out, casting="unsafe")  # exact: |t| < 2^52 (float64) / 2^14 levels (float32)


def _hat(z: np.ndarray, v: np.ndarray, m: np.ndarray, sigma: np.float64, out: np.ndarray,
         bufs: tuple | None = None, kern=None) -> None:
    """Eq. 12 densely: ``out = (w m + x) sigma`` (float64), w and x in units of sigma; ``kern`` as in :func:`_floor_t`."""
    if bufs is None:
        bufs = tuple(np.empty_like(z) for _ in range(3))
    if kern is not None:
        if z.size:
            own, p, _ = _halfwidths_fused(kern, z, v, bufs)
            kern.hat_post(z, m, own, p, sigma, out)
        return
    own, other = _halfwidths(z, v, bufs[0], bufs[1], bufs[2])
    own += other  # w/sigma
    own *= m
    own += z
    np.multiply(own, sigma, out=out)  # np.float64 sigma: the product is taken in float64


def _halfwidths_fused(kern, z: np.ndarray, v: np.ndarray, bufs: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_halfwidths` up to its last step: ``(own, p, z2)`` with ``other = sqrt(-2 p)`` (the kernels' job)."""
    own, p, z2 = bufs[0], bufs[1], bufs[2]
    kern.hw_pre(z, z2, p)
    np.exp(p, out=p)
    np.log(v, out=own)
    kern.hw_mid(z2, v, p, own, z.dtype.type(1.0 - float(np.finfo(z.dtype).eps) / 2))
    np.log1p(p, out=p)
    return own, p, z2


def lrq_layers(gen: np.random.Generator, n: int, sigma: float, *, dtype: str = "float64", stable: bool = True):
    """Draw ``n`` layers: centres x and intervals [L, R] (Def. 3), for tests and inspection.

    Parameters
    ----------
    gen : numpy.random.Generator
    n : int
    sigma : float
        Error std per coordinate.
    stable : bool
        ``True``: the stable recipe used by :func:`encode`; ``False``: the naive Def. 3 recipe
        (y = v g(x) flipped, R = sigma sqrt(-2 ln y), L = -sigma sqrt(-2 ln(1 - y))).

    Returns
    -------
    x, L, R : ndarray, shape (n,)
    """
    z, v = _draw(gen, n, dtype)
    x = sigma * z
    if stable:
        own, other = _halfwidths(z, v)
        pos = z >= 0
        return x, np.where(pos, -other, -own) * sigma, np.where(pos, own, other) * sigma
    y = v * np.exp(-0.5 * z * z)
    y = np.where(z >= 0, y, 1.0 - y)
    return x, -sigma * np.sqrt(-2.0 * np.log1p(-y)), sigma * np.sqrt(-2.0 * np.log(y))


def _as_vector(u) -> tuple[np.ndarray, float]:
    """(u as a finite 1-D float64 array, max|u|); C-contiguous where the fused kernels will read it."""
    if hasattr(u, "detach"):  # torch.Tensor
        u = u.detach().cpu().numpy()
    arr = np.asarray(u, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"u must be a 1-D vector (flatten the update first), got shape {arr.shape}")
    kern = _kernels(arr.size) if arr.size else None
    if kern is not None:
        arr = np.ascontiguousarray(arr)
        amax, finite = kern.amax_finite(arr)  # one pass: max|u| and the finiteness check
    else:
        lo, hi = (float(arr.min()), float(arr.max())) if arr.size else (0.0, 0.0)
        finite = math.isfinite(lo) and math.isfinite(hi)  # min/max propagate NaN: one pass each, no mask
        amax = max(-lo, hi, 0.0)
    if not finite:
        raise ValueError(f"u must be finite, got {int((~np.isfinite(arr)).sum())} NaN/inf entries of {arr.size}")
    return arr, float(amax)


def _encode_numpy(u: np.ndarray, inv_sigma: float, m: np.ndarray, entropy: int, chunk_size: int, dtype: str) -> None:
    """Eq. 11 into the zeroed ``m``, one numpy call per operation (see the module docstring)."""
    d = u.size
    blk = max(1, min(_BLOCK, chunk_size, d))
    fb = tuple(np.empty(blk, dtype=dtype) for _ in range(5))
    mask = np.empty(blk, dtype=bool)
    sparse: list[tuple[np.ndarray, ...]] = []  # undecided coordinates of sparse blocks: (positions, z, v)
    dense_run = 0
    for pos, zs, rs, vs in _stream_blocks(entropy, d, chunk_size, dtype, blk):
        k = zs.size
        ub = u[pos : pos + k]
        if dense_run:  # the last tested block was dense: skip the (then wasted) test for a few blocks
            dense_run -= 1
            idx = None
        else:
            abs_s = np.abs(ub, out=fb[4][:k], casting="same_kind")
            abs_s *= inv_sigma  # |u|/sigma
            idx = np.flatnonzero(_undecided(zs, rs, abs_s, (fb[0][:k], fb[1][:k]), mask[:k]))
        if idx is None or idx.size > _DENSE_FRACTION * k:
            dense_run = _DENSE_RUN if idx is not None else dense_run
            s = np.multiply(ub, inv_sigma, out=fb[4][:k], casting="same_kind")  # u/sigma
            _floor_t(zs, vs, s, m[pos : pos + k], (fb[0][:k], fb[1][:k], fb[2][:k], fb[3][:k]))
        elif idx.size:  # the rest of the block stays m = 0; the few undecided ones are done together below
            sparse.append((idx + pos, zs[idx], vs[idx]))
    if sparse:
        where, zs, vs = (np.concatenate(parts) for parts in zip(*sparse))
        s = np.multiply(u[where], inv_sigma, out=np.empty(where.size, dtype=dtype), casting="same_kind")
        sub = np.empty(where.size, dtype=m.dtype)
        _floor_t(zs, vs, s, sub)
        m[where] = sub


def _encode_fused(kern, u: np.ndarray, inv_sigma: float, m: np.ndarray, entropy: int, chunk_size: int,
                  dtype: str) -> None:
    """:func:`_encode_numpy` with the bound test and the gather fused into one kernel call per block
    and the dense blocks' exact steps in kernels (:func:`_floor_t` with ``kern``).

    Same blocks, same dense/sparse decisions, same numpy calls on the same values for everything
    that is not exact arithmetic: the same m.
    """
    d = u.size
    blk = max(1, min(_BLOCK, chunk_size, d))
    fb = None  # dense-block buffers, made when a dense block comes
    inv_t = np.dtype(dtype).type(inv_sigma)
    eps = float(np.finfo(dtype).eps)
    gtypes = (np.int64, dtype, dtype, np.float64)  # undecided coordinates: position, z, v, u
    g = _gather_bufs(gtypes, max(4 * blk, d >> 8))
    cnt = 0
    dense_run = 0
    for pos, zs, rs in _stream_zr(entropy, d, chunk_size, dtype, blk):
        k = zs.size
        if dense_run:  # as in _encode_numpy: no test for a few blocks after a dense one
            dense_run -= 1
            new = -1
        else:
            lim = math.floor(_DENSE_FRACTION * k)  # more undecided than this: dense
            if cnt + lim > g[0].size:
                g = _gather_bufs(gtypes, 2 * (cnt + lim), g, cnt)
            new = kern.encode_block(zs, rs, u[pos : pos + k], inv_t, eps, lim, pos, *g, cnt)
            if new < 0:
                dense_run = _DENSE_RUN
        if new < 0:
            if fb is None:
                fb = tuple(np.empty(blk, dtype=dtype) for _ in range(5))
            vs, s = fb[3][:k], fb[4][:k]
            kern.v_and_s(rs, u[pos : pos + k], inv_sigma, vs, s)  # 1 - r, u/sigma
            _floor_t(zs, vs, s, m[pos : pos + k], (fb[0][:k], fb[1][:k], fb[2][:k]), kern)
        else:
            cnt = new
    if cnt:
        where, zs, vs, us = (a[:cnt] for a in g)
        s = np.multiply(us, inv_sigma, out=np.empty(cnt, dtype=dtype), casting="same_kind")
        sub = np.empty(cnt, dtype=m.dtype)
        _floor_t(zs, vs, s, sub, kern=kern)
        m[where] = sub


def encode(u, sigma: float, key: bytes | int, *, dtype: str = "float64", chunk_size: int = DEFAULT_CHUNK,
           bound: float | None = None) -> LRQMessage:
    """Quantize ``u`` so that the server's decode equals ``u + N(0, sigma^2 I)`` exactly (Eq. 11).

    Parameters
    ----------
    u : array-like or Tensor, shape (d,)
        The (clipped) update, finite.  Converted to float64 (float32 for ``dtype="float32"``,
        in which case the Gaussian law holds for ``float32(u)``).
    sigma : float
        Error std per coordinate (> 0, the per-client sigma).
    key : bytes or int
        Shared secret stream key for this (run, round, client); see :func:`lrq_key`.
    dtype : {"float64", "float32"}
        Float type of the shared-randomness arithmetic; both sides must use the same.  float32
        is faster but limited to max|u| < 2^14 w_min (ValueError otherwise).
    chunk_size : int
        Coordinates per keyed stream chunk (default 2^20).
    bound : float or None
        A public bound on max|u| (e.g. the L2 clip S2).  Given, the message's integer dtype follows from it
        alone (not from the data), so the message's form reveals nothing about ``u``; max|u| above it raises
        ``ValueError``.  None: the smallest dtype holding this message's integers.

    Returns
    -------
    LRQMessage
    """
    sigma = check_positive("sigma", sigma, hint="sigma is the LRQ error std per coordinate")
    check_choice("dtype", dtype, _DTYPES)
    chunk_size = check_int("chunk_size", chunk_size, minimum=1)
    kb = _key_bytes(key)
    u, amax = _as_vector(u)
    d = u.size
    # float64: levels stay exact integers; float32: the float32 rounding of u (~|u| 2^-24) stays
    # below ~1e-3 sigma, so the error is N(0, sigma^2) up to that rounding.
    limit = 2.0**52 if dtype == "float64" else 2.0**14
    if amax / lrq_w_min(sigma) + 2.0 >= limit:
        raise ValueError(
            f"max|u|/sigma too large for {dtype} layers (max {limit:.3g} levels), got max|u|={amax}, sigma={sigma}; "
            "increase sigma, clip the update, or use dtype='float64'"
        )
    if bound is not None and amax > bound:
        raise ValueError(f"max|u| must be <= the public bound {bound}, got {amax}; clip u first")
    inv_sigma = 1.0 / sigma
    # |m| <= ceil(A / w_min) (Lemma 3), + 1 for rounding: write straight into a small int dtype
    levels = math.ceil((amax if bound is None else bound) / lrq_w_min(sigma)) + 1
    m = np.zeros(d, dtype=next(t for t in _INT_DTYPES if levels <= np.iinfo(t).max))  # calloc: pages come zeroed
    kern = _kernels(d)
    if kern is None:
        _encode_numpy(u, inv_sigma, m, _stream_entropy(kb), chunk_size, dtype)
    else:
        _encode_fused(kern, u, inv_sigma, m, _stream_entropy(kb), chunk_size, dtype)
    if bound is None:
        lo, hi = (int(m.min()), int(m.max())) if d else (0, 0)
        idt = next(t for t in _INT_DTYPES if np.iinfo(t).min <= lo and hi <= np.iinfo(t).max)
        if idt != m.dtype:
            m = m.astype(idt)
    m.flags.writeable = False
    return LRQMessage(m=m, d=d, sigma=sigma, dtype=dtype, chunk_size=chunk_size,
                      tag=_tag(kb, d, sigma, dtype, chunk_size, m))


def decode(msg: LRQMessage, sigma: float, key: bytes | int) -> np.ndarray:
    """Server side (Eq. 12): ``hat_u = m w + x`` from the regenerated shared randomness.

    Parameters
    ----------
    msg : LRQMessage
    sigma : float
        The sigma the server expects for this client and round (must equal ``msg.sigma``).
    key : bytes or int
        The same key the client used.

    Returns
    -------
    ndarray, shape (d,), float64
        ``u + e`` with ``e ~ N(0, sigma^2 I)`` exactly (over the shared randomness).

    Raises
    ------
    DecodeError
        Wrong key (another round, client or secret), tampered payload or metadata, or a sigma
        that differs from the message's.
    """
    if not isinstance(msg, LRQMessage):
        raise TypeError(f"msg must be an LRQMessage, got {type(msg).__name__}")
    sigma = check_positive("sigma", sigma)
    kb = _key_bytes(key)
    m = np.asarray(msg.m)
    if m.ndim != 1 or m.size != msg.d or m.dtype.kind != "i" or msg.dtype not in _DTYPES or msg.chunk_size < 1:
        raise DecodeError(
            f"malformed LRQ message: got m shape {m.shape}, dtype {m.dtype}, d={msg.d}, layer dtype {msg.dtype!r}, "
            f"chunk_size={msg.chunk_size}; expected a 1-D signed int array of length d"
        )
    expected = _tag(kb, msg.d, float(msg.sigma), msg.dtype, msg.chunk_size, m)
    if not hmac.compare_digest(expected, bytes(msg.tag)):
        raise DecodeError(
            f"LRQ message failed its integrity check (d={msg.d}); got a tag that does not match this key: "
            "the key (round, client or the secret it derives from) differs from the encoder's, or the message was altered"
        )
    if float(msg.sigma) != sigma:
        raise DecodeError(f"sigma mismatch: the message was encoded with sigma={msg.sigma!r}, got sigma={sigma!r}; "
                          "decode with the sigma of this round's schedule")
    out = np.empty(msg.d, dtype=np.float64)
    kern = _kernels(msg.d)
    if kern is None:
        _decode_numpy(m, out, np.float64(sigma), _stream_entropy(kb), msg.chunk_size, msg.dtype)
    else:
        _decode_fused(kern, m, out, np.float64(sigma), _stream_entropy(kb), msg.chunk_size, msg.dtype)
    return out


def _decode_numpy(m: np.ndarray, out: np.ndarray, sig: np.float64, entropy: int, chunk_size: int, dtype: str) -> None:
    """Eq. 12 into ``out``, one numpy call per operation (see the module docstring)."""
    d = m.size
    blk = max(1, min(_BLOCK, chunk_size, d))
    fb = tuple(np.empty(blk, dtype=dtype) for _ in range(3))
    sparse: list[tuple[np.ndarray, ...]] = []  # nonzero m of sparse blocks: (positions, z, v)
    for pos, zs, _, vs in _stream_blocks(entropy, d, chunk_size, dtype, blk):
        k = zs.size
        mb, ob = m[pos : pos + k], out[pos : pos + k]
        idx = np.flatnonzero(mb)
        if idx.size > _DENSE_FRACTION * k:
            _hat(zs, vs, mb, sig, ob, (fb[0][:k], fb[1][:k], fb[2][:k]))
        else:
            np.multiply(zs, sig, out=ob)  # m = 0: (0 w + x) sigma = x sigma (w is finite)
            if idx.size:  # the few nonzero m are done together below
                sparse.append((idx + pos, zs[idx], vs[idx]))
    if sparse:
        where, zs, vs = (np.concatenate(parts) for parts in zip(*sparse))
        sub = np.empty(where.size, dtype=np.float64)
        _hat(zs, vs, m[where], sig, sub)
        out[where] = sub


def _positional_ok(kern) -> bool:
    """Whether the kernels' Philox arithmetic (``uniforms_at``) gives numpy's ``random()`` draws here.

    Checked once per process, both layer dtypes, after 0-5 normals (every buffer / pending-half
    state); if not (another numpy), the fused decoder draws r as the numpy path does.
    """
    global _positional
    if _positional is None:
        try:
            ok = True
            for dtype in _DTYPES:
                for nz in range(6):
                    gen = _chunk_rng(nz, nz)
                    gen.standard_normal(nz, dtype=dtype)
                    st = kern.philox_state(gen.bit_generator)
                    ref = gen.random(64, dtype=dtype)
                    ok = ok and np.array_equal(ref, kern.uniforms_at(np.arange(64), st, np.zeros(1, dtype=dtype)))
        except Exception:  # noqa: BLE001  a numpy whose Philox state looks different: draw instead
            ok = False
        _positional = ok
    return _positional


def _decode_fused(kern, m: np.ndarray, out: np.ndarray, sig: np.float64, entropy: int, chunk_size: int,
                  dtype: str) -> None:
    """:func:`_decode_numpy` with the ``m = 0`` pass and the gather fused into one kernel call per block.

    Where m = 0 the decoder needs no v, so it draws no r: the few v where m != 0 are computed from
    the chunk's Philox state after its z (:func:`_positional_ok`); a dense block draws its r from
    the generator, first catching the stream up over the blocks skipped since the last draw.
    """
    d = m.size
    if not (m.flags.c_contiguous and m.dtype.isnative):
        m = np.ascontiguousarray(m, dtype=m.dtype.newbyteorder("="))  # same values
    positional = _positional_ok(kern)
    blk = max(1, min(_BLOCK, chunk_size, d))
    zbuf = np.empty(min(chunk_size, d), dtype=dtype)
    rbuf = np.empty(blk, dtype=dtype)
    fb = None  # dense-block buffers, made when a dense block comes
    gtypes = (np.int64, dtype, dtype)  # nonzero m: position, z, v
    g = _gather_bufs(gtypes, max(4 * blk, d >> 8))
    cnt = 0
    for c, start in enumerate(range(0, d, chunk_size)):
        n = min(chunk_size, d - start)
        gen = _chunk_rng(entropy, c)
        z = zbuf[:n]
        gen.standard_normal(out=z, dtype=dtype)
        st = kern.philox_state(gen.bit_generator) if positional else None
        drawn = 0  # r drawn from gen so far in this chunk
        for b in range(0, n, blk):
            k = min(blk, n - b)
            pos, zs = start + b, z[b : b + k]
            mb, ob = m[pos : pos + k], out[pos : pos + k]
            lim = math.floor(_DENSE_FRACTION * k)  # more nonzero m than this: dense
            if cnt + lim > g[0].size:
                g = _gather_bufs(gtypes, 2 * (cnt + lim), g, cnt)
            if positional:
                new = kern.decode_block_at(mb, zs, st, b, sig, ob, lim, pos, *g, cnt)
            else:
                gen.random(out=rbuf[:k], dtype=dtype)
                drawn = b + k
                new = kern.decode_block(mb, zs, rbuf[:k], sig, ob, lim, pos, *g, cnt)
            if new >= 0:
                cnt = new
                continue
            while drawn < b:  # positional: the r of the blocks since the last draw, discarded
                step = min(blk, b - drawn)
                gen.random(out=rbuf[:step], dtype=dtype)
                drawn += step
            if drawn == b:
                gen.random(out=rbuf[:k], dtype=dtype)
                drawn = b + k
            if fb is None:
                fb = tuple(np.empty(blk, dtype=dtype) for _ in range(4))
            vs = np.subtract(1.0, rbuf[:k], out=fb[3][:k])
            _hat(zs, vs, mb, sig, ob, (fb[0][:k], fb[1][:k], fb[2][:k]), kern)
    if cnt:
        where, zs, vs = (a[:cnt] for a in g)
        sub = np.empty(cnt, dtype=np.float64)
        _hat(zs, vs, m[where], sig, sub, kern=kern)
        out[where] = sub
