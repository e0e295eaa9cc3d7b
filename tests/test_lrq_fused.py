"""LRQ codec: the fused numba kernels give bit for bit the numpy path's output (issue 16).

``FLOWER_DP_LRQ_KERNEL=numba`` forces the kernels (:mod:`flower_dp.mechanisms._lrq_numba`) at any d,
``numpy`` the pure-numpy path; every comparison is on the encoded levels m (values and dtype), the
integrity tag and every decoded value (as bits).  Without numba installed the fused half is skipped
and the numpy path is what every other LRQ test runs.
"""

import math

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from flower_dp.mechanisms import lrq

KEY = lrq.lrq_key(b"fused-secret", 5, 2)


@pytest.fixture
def numba_kernels():
    """Skip without numba (the fused half of the comparison)."""
    pytest.importorskip("numba")


def _codec(monkeypatch, kernel, u, sigma, key=KEY, **kw):
    monkeypatch.setenv(lrq.KERNEL_ENV, kernel)
    msg = lrq.encode(u, sigma, key, **kw)
    return msg, lrq.decode(msg, sigma, key)


def _assert_same(a, b):
    (ma, ha), (mb, hb) = a, b
    assert ma.m.dtype == mb.m.dtype
    np.testing.assert_array_equal(ma.m, mb.m)
    assert ma.tag == mb.tag
    assert ha.dtype == hb.dtype == np.float64
    np.testing.assert_array_equal(ha.view(np.uint64), hb.view(np.uint64))  # bits, signed zeros included


def _both(monkeypatch, u, sigma, **kw):
    fused = _codec(monkeypatch, "numba", u, sigma, **kw)
    ref = _codec(monkeypatch, "numpy", u, sigma, **kw)
    _assert_same(fused, ref)
    return fused


def _tight(n, sigma, dtype, chunk, rng, tiny=0.97):
    """Inputs on the edges of the cheap bound: |u| just inside / outside each layer's near and far distance."""
    kb = lrq._key_bytes(KEY)
    parts = [lrq.lrq_layers(lrq._chunk_rng(lrq._stream_entropy(kb), c), min(chunk, n - start), sigma, dtype=dtype)
             for c, start in enumerate(range(0, n, chunk))]
    x, L, R = (np.concatenate(t).astype(np.float64) for t in zip(*parts))
    near = np.where(x >= 0, R - x, x - L)
    far = np.where(x >= 0, x - L, R - x)
    gaps = rng.choice([1e-3, 1e-6, 1e-9, 1e-11, 1e-13, -1e-13, -1e-9, -1e-3], size=n)
    u = np.where(rng.random(n) < 0.5, 1.0, -1.0) * np.where(rng.random(n) < 0.5, near, far) * (1 - gaps)
    u[rng.random(n) < tiny] *= 1e-4  # the rest tiny: the edge ones are gathered from sparse blocks
    return u


def _input(regime, n, sigma, dtype, chunk, seed=0):
    rng = np.random.default_rng(seed)
    if regime == "sparse":  # a clipped update, |u| << sigma: the Gau-LRQ regime
        u = rng.standard_normal(n)
        return u * (sigma / np.linalg.norm(u))
    if regime == "dense":  # |u| ~ 3 sigma: every coordinate needs the layer arithmetic
        return rng.normal(0.0, 3.0 * sigma, n)
    if regime == "mixed":  # 5 % large coordinates
        return rng.standard_normal(n) * np.where(rng.random(n) < 0.05, 3.0 * sigma, 1e-3)
    if regime == "alternating":  # runs of dense and sparse blocks: the decoder catches its r stream up
        return rng.standard_normal(n) * np.where(np.arange(n) // 20_000 % 3 == 1, 3.0 * sigma, 1e-3)
    return _tight(n, sigma, dtype, chunk, rng, tiny=0.97 if regime == "tight" else 0.6)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("regime", ["sparse", "dense", "mixed", "alternating", "tight", "tight_dense"])
@pytest.mark.parametrize("chunk", [lrq.DEFAULT_CHUNK, 25_000, 16_389])
def test_fused_equals_numpy(monkeypatch, numba_kernels, regime, dtype, chunk):
    """Bit for bit: sparse, dense, mixed and bound-edge inputs, float64 / float32 layers, several chunk
    sizes; d = 70,001 is a multiple of neither the block (16,384) nor any chunk size."""
    sigma, n = 0.05, 70_001
    u = _input(regime, n, sigma, dtype, chunk)
    msg, _ = _both(monkeypatch, u, sigma, dtype=dtype, chunk_size=chunk)
    if regime == "sparse":
        assert np.count_nonzero(msg.m) < 0.01 * n
    if regime != "sparse":
        assert 0 < np.count_nonzero(msg.m) < n


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_fused_equals_numpy_small_blocks(monkeypatch, numba_kernels, dtype):
    """Block size 777 (sparse and dense blocks interleave, partial last blocks in every chunk) and the
    dense-run path; a second dense fraction makes every block dense (the dense formula everywhere)."""
    sigma, n, chunk = 0.05, 60_000, 25_000
    monkeypatch.setattr(lrq, "_BLOCK", 777)
    u = _input("tight_dense", n, sigma, dtype, chunk, seed=1)
    fused = _both(monkeypatch, u, sigma, dtype=dtype, chunk_size=chunk)
    monkeypatch.setattr(lrq, "_DENSE_FRACTION", -1.0)
    _assert_same(fused, _codec(monkeypatch, "numba", u, sigma, dtype=dtype, chunk_size=chunk))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("regime", ["alternating", "tight", "tight_dense"])
def test_fused_decoder_drawing_r_equals_positional(monkeypatch, numba_kernels, regime, dtype):
    """The fused decoder's fallback (draw every r, as the numpy path) == its default (v from the Philox
    counter where m != 0, r drawn only for dense blocks) == the numpy path."""
    sigma, n, chunk = 0.05, 70_001, 25_000
    u = _input(regime, n, sigma, dtype, chunk, seed=2)
    positional = _both(monkeypatch, u, sigma, dtype=dtype, chunk_size=chunk)
    assert lrq._positional is True
    monkeypatch.setattr(lrq, "_positional", False)
    _assert_same(positional, _codec(monkeypatch, "numba", u, sigma, dtype=dtype, chunk_size=chunk))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_philox_positions_match_numpy(numba_kernels, dtype):
    """``uniforms_at`` == numpy's ``random()`` draws after 0-11 normals (every buffer position, a pending
    32-bit half or not) and across 64- and 128-bit counter carries; a non-Philox generator is refused."""
    from flower_dp.mechanisms import _lrq_numba as K

    for nz in range(12):
        for counter in (None, 2**64 - 3, 2**128 - 2):
            bg = (np.random.Philox(np.random.SeedSequence(9, spawn_key=(nz,))) if counter is None
                  else np.random.Philox(key=12345 + nz, counter=counter))
            gen = np.random.Generator(bg)
            gen.standard_normal(nz, dtype=dtype)
            st = K.philox_state(bg)
            ref = gen.random(203, dtype=dtype)
            js = np.random.default_rng(nz).permutation(203)  # any order: no hidden sequential state
            np.testing.assert_array_equal(K.uniforms_at(js, st, np.zeros(1, dtype=dtype)), ref[js])
    with pytest.raises(TypeError, match="Philox"):
        K.philox_state(np.random.PCG64(0))


def test_positional_check_falls_back(monkeypatch, numba_kernels):
    """A numpy whose Philox state the kernels cannot read: the check says no, the decoder draws r."""
    monkeypatch.setenv(lrq.KERNEL_ENV, "numba")
    kern = lrq._kernels(1)
    monkeypatch.setattr(lrq, "_positional", None)
    assert lrq._positional_ok(kern) is True
    monkeypatch.setattr(lrq, "_positional", None)

    def unreadable(bit_generator):
        raise KeyError("counter")

    monkeypatch.setattr(kern, "philox_state", unreadable)
    assert lrq._positional_ok(kern) is False
    u = _input("mixed", 20_000, 0.05, "float64", lrq.DEFAULT_CHUNK)
    _both(monkeypatch, u, 0.05)


@pytest.mark.parametrize("d", [1, 2, 3, 5, 16_383, 16_384, 16_385])
def test_fused_equals_numpy_edge_lengths(monkeypatch, numba_kernels, d):
    """Lengths around the block size and tiny vectors (the kernels' groups of 64 and unrolled max)."""
    for dtype in ("float64", "float32"):
        for regime in ("sparse", "dense"):
            _both(monkeypatch, _input(regime, d, 0.3, dtype, lrq.DEFAULT_CHUNK, seed=d), 0.3, dtype=dtype)


def test_fused_wide_levels_and_layouts(monkeypatch, numba_kernels):
    """int16 / int32 levels (other decode signatures), a strided input, a big-endian m from a record."""
    sigma, n = 0.05, 40_000
    rng = np.random.default_rng(4)
    for u in (np.full(n, 1e3 * sigma), rng.standard_cauchy(n), rng.normal(0, 3 * sigma, 2 * n)[::2]):
        msg, _ = _both(monkeypatch, u, sigma)
        assert msg.m.dtype in (np.int8, np.int16, np.int32)
    rec = msg.to_record()
    rec["m"] = rec["m"].astype(rec["m"].dtype.newbyteorder(">"))
    swapped = lrq.LRQMessage.from_record(rec)
    monkeypatch.setenv(lrq.KERNEL_ENV, "numba")
    fused = lrq.decode(swapped, sigma, KEY)
    monkeypatch.setenv(lrq.KERNEL_ENV, "numpy")
    np.testing.assert_array_equal(fused.view(np.uint64), lrq.decode(swapped, sigma, KEY).view(np.uint64))


def test_fused_input_errors(monkeypatch, numba_kernels):
    """NaN / inf and out-of-range inputs raise the same errors on both paths."""
    for kernel in ("numba", "numpy"):
        monkeypatch.setenv(lrq.KERNEL_ENV, kernel)
        for bad in (np.nan, np.inf, -np.inf):
            u = np.zeros(1000)
            u[[3, 700]] = bad
            with pytest.raises(ValueError, match="2 NaN/inf entries of 1000"):
                lrq.encode(u, 0.1, KEY)
        with pytest.raises(ValueError, match="too large for float32"):
            lrq.encode(np.full(10, 1e5), 0.1, KEY, dtype="float32")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_kernels_match_the_numpy_steps(numba_kernels, dtype):
    """The kernels' own decisions, not only the end result (a valid but looser bound would give the same m):
    the encoder gathers exactly the coordinates of numpy's ``_undecided`` mask, with |u| / sigma placed on
    the bound within a few ulps; the decoder gathers exactly ``m != 0`` and writes ``x sigma`` elsewhere."""
    from flower_dp.mechanisms import _lrq_numba as K

    k, sigma = 5_000, 0.3
    rng = np.random.default_rng(7)
    gen = lrq._chunk_rng(123, 0)
    z = gen.standard_normal(k, dtype=dtype)
    r = gen.random(k, dtype=dtype)
    a = np.abs(z).astype(np.float64)
    eta = lrq._eta(float(np.abs(z).max()), z.dtype)
    edge = np.minimum(r / (a + 0.75), a) - eta  # the bound, near enough: the ulps below straddle it
    ulps = rng.integers(-4, 5, k) * float(np.finfo(dtype).eps)
    u = np.where(rng.random(k) < 0.5, -1.0, 1.0) * edge * sigma * (1 + ulps)
    u[rng.random(k) < 0.5] *= rng.uniform(0.5, 2.0)  # and others well inside / outside
    abs_s = np.abs(u).astype(dtype)
    abs_s *= 1.0 / sigma
    mask = lrq._undecided(z, r, abs_s, (np.empty_like(z), np.empty_like(z)), np.empty(k, dtype=bool))
    g = lrq._gather_bufs((np.int64, dtype, dtype, np.float64), k)
    inv = np.dtype(dtype).type(1.0 / sigma)
    cnt = K.encode_block(z, r, u, inv, float(np.finfo(dtype).eps), k, 10, *g, 0)
    assert 0.1 * k < cnt < 0.9 * k
    np.testing.assert_array_equal(g[0][:cnt], np.flatnonzero(mask) + 10)
    np.testing.assert_array_equal(g[1][:cnt], z[mask])
    np.testing.assert_array_equal(g[2][:cnt], (1.0 - r)[mask])
    np.testing.assert_array_equal(g[3][:cnt], u[mask])
    assert K.encode_block(z, r, u, inv, float(np.finfo(dtype).eps), cnt - 1, 10, *g, 0) == -1  # one too many
    m = (rng.random(k) < 0.01) * rng.integers(-3, 4, k).astype(np.int16)
    out = np.full(k, np.nan)
    g = g[:3]
    cnt = K.decode_block(m, z, r, np.float64(sigma), out, k, 0, *g, 0)
    np.testing.assert_array_equal(g[0][:cnt], np.flatnonzero(m))
    np.testing.assert_array_equal(g[2][:cnt], (1.0 - r)[m != 0])
    np.testing.assert_array_equal(out[m == 0], (z * np.float64(sigma))[m == 0])
    assert K.decode_block(m, z, r, np.float64(sigma), out, cnt - 1, 0, *g, 0) == -1


def test_kernels_have_no_fma(numba_kernels):
    """The kernels' multiply-adds (the encoder's eta ``3 zmax + 18``, the half-width ``-2 log v + z^2``,
    Eq. 12's ``w m + x``) are not contracted into FMAs: fastmath is off.  Compiled afresh here, without
    the cache, to read the machine code (with ``fastmath=True`` the encoder has an FMA on a CPU with FMA)."""
    import numba

    from flower_dp.mechanisms import _lrq_numba as K

    z = np.ones(8)
    calls = [
        (K.encode_block, (z, z, z, 2.0, 1e-16, 8, 0, *lrq._gather_bufs((np.int64, "float64", "float64", np.float64), 8), 0)),
        (K.hw_mid, (z, z, z.copy(), z.copy(), 0.5)),
        (K.hat_post, (z, np.ones(8, np.int8), z, -z, 0.5, np.empty(8))),
    ]
    for kernel, args in calls:
        fresh = numba.njit(error_model="numpy")(kernel.py_func)
        fresh(*args)
        (asm,) = fresh.inspect_asm().values()
        assert not any(op in asm for op in ("vfmadd", "vfmsub", "vfnmadd", "vfnmsub")), kernel


@pytest.mark.parametrize("layer", ["float64", "float32"])
@pytest.mark.parametrize("level", [np.int8, np.int16, np.int32, np.int64])
def test_fused_decode_of_any_level_dtype(monkeypatch, numba_kernels, layer, level):
    """Eq. 12's ``w m`` as numpy's ``own *= m`` computes it for every (layer, level) dtype pair (float32 x
    int32 / int64 goes through float64), in dense blocks and in the gathered few, also for levels no
    encoder would send (huge, or int32 beside float32 layers): a message with a valid tag decodes the same."""
    rng = np.random.default_rng(8)
    n, sigma = 40_000, 0.05
    top = min(np.iinfo(level).max, 2**62)
    for frac in (0.5, 0.002):  # dense blocks / a few nonzero levels gathered
        m = np.where(rng.random(n) < frac, rng.integers(-top, top, n, endpoint=True), 0).astype(level)
        msg = lrq.LRQMessage(m=m, d=n, sigma=sigma, dtype=layer, chunk_size=lrq.DEFAULT_CHUNK,
                             tag=lrq._tag(lrq._key_bytes(KEY), n, sigma, layer, lrq.DEFAULT_CHUNK, m))
        monkeypatch.setenv(lrq.KERNEL_ENV, "numba")
        fused = lrq.decode(msg, sigma, KEY)
        monkeypatch.setenv(lrq.KERNEL_ENV, "numpy")
        np.testing.assert_array_equal(fused.view(np.uint64), lrq.decode(msg, sigma, KEY).view(np.uint64))


@settings(max_examples=40, deadline=None)
@given(
    u=hnp.arrays(np.float64, st.integers(1, 300), elements=st.floats(-1e4, 1e4, allow_nan=False)),
    log_sigma=st.floats(-3, 2),
    dtype=st.sampled_from(["float64", "float32"]),
    chunk=st.integers(1, 400),
    key=st.integers(0, 2**64),
)
def test_property_fused_equals_numpy(u, log_sigma, dtype, chunk, key):
    """Any input, sigma, layer dtype and chunk size: the same m, tag and decoded bits."""
    pytest.importorskip("numba")
    sigma = 10.0**log_sigma
    if dtype == "float32" and float(np.abs(u).max()) / lrq.lrq_w_min(sigma) + 2.0 >= 2.0**14:
        return  # outside float32's range (a ValueError on both paths)
    with pytest.MonkeyPatch.context() as mp:
        fused = _codec(mp, "numba", u, sigma, key=key, dtype=dtype, chunk_size=chunk)
        _assert_same(fused, _codec(mp, "numpy", u, sigma, key=key, dtype=dtype, chunk_size=chunk))


def test_fused_decoded_error_is_gaussian(monkeypatch, numba_kernels):
    """The fused path's error is N(0, sigma^2) for a sparse and a dense input."""
    from scipy import stats

    n, sigma = 300_000, 0.05
    for u in (np.zeros(n), np.random.default_rng(6).normal(0, 3 * sigma, n)):
        _, uh = _codec(monkeypatch, "numba", u, sigma)
        e = (uh - u) / sigma
        assert stats.kstest(e, "norm").pvalue > 1e-3
        assert abs(e.std() - 1) < 0.01 and abs(e.mean()) < 5 / math.sqrt(n)


def test_kernel_choice(monkeypatch):
    """auto: numba from d = 2^17 on when it imports; numpy: never; a bad value or a missing numba is an error."""
    monkeypatch.setenv(lrq.KERNEL_ENV, "numpy")
    assert lrq._kernels(10**8) is None
    monkeypatch.setenv(lrq.KERNEL_ENV, "auto")
    assert lrq._kernels(lrq._FUSED_MIN_D - 1) is None
    monkeypatch.setenv(lrq.KERNEL_ENV, "fast")
    with pytest.raises(ValueError, match="FLOWER_DP_LRQ_KERNEL"):
        lrq._kernels(10)
    monkeypatch.setattr(lrq, "_kernel_module", ImportError("No module named 'numba'"))
    monkeypatch.setenv(lrq.KERNEL_ENV, "auto")
    assert lrq._kernels(10**8) is None  # falls back to numpy
    monkeypatch.setenv(lrq.KERNEL_ENV, "numba")
    with pytest.raises(ImportError, match="flower-dp\\[fast\\]"):
        lrq._kernels(10)
    with pytest.raises(ImportError):  # forced and missing: encode fails too, it does not fall back
        lrq.encode(np.ones(5), 1.0, KEY)
