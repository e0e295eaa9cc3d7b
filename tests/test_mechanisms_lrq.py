"""LRQ: decoded error exactly N(0, sigma^2), integrity, levels (Gau-LRQ, Sec. IV)."""

import dataclasses
import math

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings
from scipy import stats

from flower_dp.errors import DecodeError
from flower_dp.mechanisms import lrq

KEY = lrq.lrq_key(b"run-secret", 3, 7)


def _roundtrip(u, sigma, key=KEY, **kw):
    msg = lrq.encode(u, sigma, key, **kw)
    return msg, lrq.decode(msg, sigma, key)


@pytest.mark.parametrize("kind", ["zeros", "large_constant", "cauchy"])
def test_error_is_gaussian_1e6(kind):
    """KS p > 0.01 over 1e6 coordinates, std within 1%, mean within 5 SE, for very different inputs."""
    n, sigma = 10**6, 0.05
    u = {
        "zeros": np.zeros(n),
        "large_constant": np.full(n, 1e3 * sigma),
        "cauchy": np.random.default_rng(11).standard_cauchy(n),  # heavy tails, |u| up to ~1e6 sigma
    }[kind]
    msg, uh = _roundtrip(u, sigma)
    e = (uh - u) / sigma
    assert stats.kstest(e, "norm").pvalue > 0.01
    assert abs(e.std() - 1) < 0.01
    assert abs(e.mean()) < 5 / math.sqrt(n)
    assert uh.dtype == np.float64 and uh.shape == (n,)
    # smallest integer dtype: m = 0 for u = 0; ~425 levels for 1e3 sigma; Cauchy needs int32
    assert msg.m.dtype == {"zeros": np.int8, "large_constant": np.int16, "cauchy": np.int32}[kind]


@pytest.mark.parametrize("sigma", [1e-3, 0.05, 1.0])
def test_error_gaussian_for_fixed_inputs(sigma):
    """Exactly Gaussian error: u in {0, +-0.3, +-7.77, +-100} sigma, n = 2e5 each: KS p > 1e-3, |std - 1| < 0.01."""
    n = 200_000
    for i, c in enumerate([0.0, 0.3, -0.3, 7.77, -7.77, 100.0, -100.0]):
        u = np.full(n, c * sigma)
        _, uh = _roundtrip(u, sigma, key=lrq.lrq_key(b"s", i, 0))
        e = (uh - u) / sigma
        assert stats.kstest(e, "norm").pvalue > 1e-3, c
        assert abs(e.std() - 1) < 0.01 and abs(e.mean()) < 5 / math.sqrt(n), c


def test_hand_worked_example():
    """A flipped layer (Def. 3): x = 0.5, v = 0.4 -> L = -0.933174, R = 1.443115; flipped x = -0.8, v = 0.7."""
    own, other = lrq._halfwidths(np.array([0.5, -0.8]), np.array([0.4, 0.7]))
    np.testing.assert_allclose([-other[0], own[0]], [-0.933174, 1.443115], atol=1e-6)
    np.testing.assert_allclose([-own[1], other[1]], [-1.163336, 1.191550], atol=1e-6)
    w = own[0] + other[0]
    for u, m_ref, e_ref in [(0.3, 0, 0.2), (3.0, 1, -0.123711), (-1.0, -1, -0.876289)]:
        m = math.floor((u + own[0] - 0.5) / w)
        assert m == m_ref and m * w + 0.5 - u == pytest.approx(e_ref, abs=1e-6)


def test_layer_geometry_and_recipes_agree():
    """Layers: L <= x <= R, min w >= w_min, mean w/sigma = 2.525, (x-L)/w ~ U(0,1); naive == stable."""
    sigma, n = 0.05, 10**6
    x, L, R = lrq.lrq_layers(np.random.default_rng(5), n, sigma)
    xn, Ln, Rn = lrq.lrq_layers(np.random.default_rng(5), n, sigma, stable=False)
    np.testing.assert_array_equal(x, xn)
    assert np.max(np.abs(L - Ln)) < 1e-9 * sigma and np.max(np.abs(R - Rn)) < 1e-9 * sigma
    w = R - L
    assert np.all(L <= x) and np.all(x <= R)
    assert w.min() >= lrq.lrq_w_min(sigma) * (1 - 1e-12)
    assert abs(w.mean() / sigma - 2.525) < 0.01
    assert stats.kstest((x - L) / w, "uniform").pvalue > 1e-3
    assert lrq.lrq_w_min(1.0) == pytest.approx(2.35482, abs=1e-5)


def test_error_lies_in_the_layer():
    """e in (L, R] elementwise, using the same stream as chunk 0 of the key."""
    sigma, n = 0.1, 50_000
    u = np.random.default_rng(1).uniform(-3, 3, n)
    _, uh = _roundtrip(u, sigma)
    gen = lrq._chunk_rng(lrq._stream_entropy(lrq._key_bytes(KEY)), 0)
    x, L, R = lrq.lrq_layers(gen, n, sigma)
    e = uh - u
    tol = 1e-12 * (np.abs(u) + (R - L)) * 10
    assert np.all(e > L - tol) and np.all(e <= R + tol)


def test_unbiased_and_independent_of_input():
    """Mean error within 4 SE over 2e4 draws; corr(e, u) < 0.02; e(0) ~ e(50 sigma)."""
    sigma = 0.2
    for c in [0.0, 0.37, -5.0]:
        u = np.full(20_000, c)
        _, uh = _roundtrip(u, sigma)
        assert abs((uh - u).mean()) < 4 * sigma / math.sqrt(u.size)
    u = np.random.default_rng(2).normal(0, 10 * sigma, 100_000)
    _, uh = _roundtrip(u, sigma)
    assert abs(np.corrcoef(uh - u, u)[0, 1]) < 0.02
    e0 = _roundtrip(np.zeros(100_000), sigma, key=1)[1]
    e50 = _roundtrip(np.full(100_000, 50 * sigma), sigma, key=2)[1] - 50 * sigma
    assert stats.ks_2samp(e0, e50).pvalue > 1e-3


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_decode_bit_exact_and_block_size_free(monkeypatch, dtype):
    """Same key -> bit-identical decode (also through to_record); the inner block size is not part of the stream."""
    sigma, d = 0.05, 300_000
    u = np.random.default_rng(3).normal(0, 0.1, d)
    msg, uh = _roundtrip(u, sigma, chunk_size=100_000, dtype=dtype)
    again = lrq.decode(lrq.LRQMessage.from_record(msg.to_record()), sigma, KEY)
    np.testing.assert_array_equal(uh, again)
    monkeypatch.setattr(lrq, "_BLOCK", 777)
    msg2, uh2 = _roundtrip(u, sigma, chunk_size=100_000, dtype=dtype)
    np.testing.assert_array_equal(msg.m, msg2.m)
    np.testing.assert_array_equal(uh, uh2)
    assert msg.tag == msg2.tag


def test_wrong_key_and_tampering_detected():
    """Wrong round/client/secret key, altered m, altered metadata, wrong sigma -> DecodeError."""
    sigma = 0.05
    u = np.random.default_rng(4).normal(0, 1.0, 10_000)
    msg = lrq.encode(u, sigma, KEY)
    for wrong in [lrq.lrq_key(b"run-secret", 4, 7), lrq.lrq_key(b"run-secret", 3, 8), lrq.lrq_key(b"other", 3, 7), 12345]:
        with pytest.raises(DecodeError, match="integrity check"):
            lrq.decode(msg, sigma, wrong)
    m = msg.m.copy()
    m[17] += 1
    with pytest.raises(DecodeError, match="integrity check"):
        lrq.decode(dataclasses.replace(msg, m=m), sigma, KEY)
    with pytest.raises(DecodeError, match="integrity check"):
        lrq.decode(dataclasses.replace(msg, m=msg.m.astype(np.int64)), sigma, KEY)
    with pytest.raises(DecodeError, match="integrity check"):
        lrq.decode(dataclasses.replace(msg, sigma=0.06), 0.06, KEY)
    with pytest.raises(DecodeError, match="integrity check"):
        lrq.decode(dataclasses.replace(msg, chunk_size=4096), sigma, KEY)
    with pytest.raises(DecodeError, match="sigma mismatch.*got sigma=0.07"):
        lrq.decode(msg, 0.07, KEY)
    with pytest.raises(DecodeError, match="malformed"):
        lrq.decode(dataclasses.replace(msg, m=msg.m[:-1]), sigma, KEY)
    assert not msg.m.flags.writeable


def test_wrong_stream_gives_garbage():
    """Why the check matters: decoding with another stream (tag bypassed) has error std ~2 sigma."""
    sigma, n = 0.05, 200_000
    u = np.random.default_rng(6).uniform(-20 * sigma, 20 * sigma, n)
    msg = lrq.encode(u, sigma, KEY)
    forged = dataclasses.replace(msg, tag=lrq._tag(lrq._key_bytes(b"x"), msg.d, sigma, msg.dtype, msg.chunk_size, msg.m))
    e = (lrq.decode(forged, sigma, b"x") - u) / sigma
    assert e.std() > 1.5


def test_key_never_in_repr():
    key = b"\x13\x37" * 16
    msg = lrq.encode(np.ones(10), 0.1, key)
    for text in (repr(msg), str(msg)):
        assert key.hex() not in text and repr(key) not in text and "tag" not in text
    assert not any(isinstance(v, bytes) and key in v for v in (getattr(msg, f.name) for f in dataclasses.fields(msg)))


def test_levels_within_spec_bound():
    """Levels (Lemma 3): max|m| <= ceil(A/w_min), distinct values <= 2 ceil(A/w_min) + 1."""
    sigma = 0.05
    table = {0.1: 3, 1.0: 3, 5.0: 7, 17.3: 17, 50.0: 45}  # A/sigma -> exact levels
    for i, (a, levels) in enumerate(table.items()):
        A = a * sigma
        assert lrq.lrq_levels(A, sigma) == levels
        u = np.random.default_rng(i).uniform(-A, A, 200_000)
        msg = lrq.encode(u, sigma, i)
        assert np.abs(msg.m.astype(np.int64)).max() <= math.ceil(A / lrq.lrq_w_min(sigma))
        assert np.unique(msg.m).size <= levels and msg.levels_used <= levels
        assert msg.m.dtype == np.int8
    assert lrq.lrq_bits_paper(17.3, 1.0) == pytest.approx(3.972, abs=1e-3)  # Lemma 3's bound
    assert lrq.lrq_bits_fixed(17.3, 1.0) == 5  # ceil(log2 17)
    assert lrq.lrq_message_bits(1000, 17.3, 1.0) == 5 * 1000 + 32
    assert lrq.lrq_bits_fixed(0.0, 1.0) == 0 and lrq.lrq_levels(0.0, 1.0) == 1


def test_entropy_small_inputs():
    """A/sigma = 1 gives m in [-1, 1] with entropy ~0.92 bits (convention A)."""
    u = np.random.default_rng(9).uniform(-1.0, 1.0, 200_000)
    msg = lrq.encode(u, 1.0, 99)
    assert set(np.unique(msg.m)) <= {-1, 0, 1}
    assert lrq.empirical_entropy(msg.m) == pytest.approx(0.92, abs=0.03)


def test_float32_layers_and_tiny_sigma():
    """float32 arithmetic also gives N(0, sigma^2); sigma -> 0 reproduces the input."""
    sigma, n = 0.05, 300_000
    u = np.random.default_rng(7).normal(0, 1, n)
    msg, uh = _roundtrip(u, sigma, dtype="float32")
    assert msg.dtype == "float32"
    e = (uh - u.astype(np.float32)) / sigma
    assert stats.kstest(e, "norm").pvalue > 1e-3 and abs(e.std() - 1) < 0.01
    u = np.linspace(-1, 1, 1000)
    _, uh = _roundtrip(u, 1e-12)
    assert np.max(np.abs(uh - u)) < 1e-10


def test_input_errors():
    with pytest.raises(ValueError, match="sigma must be > 0.*got 0"):
        lrq.encode(np.ones(3), 0.0, KEY)
    with pytest.raises(ValueError, match="1-D.*got shape"):
        lrq.encode(np.ones((2, 2)), 1.0, KEY)
    with pytest.raises(ValueError, match="finite.*got 1 NaN"):
        lrq.encode(np.array([1.0, np.nan]), 1.0, KEY)
    with pytest.raises(ValueError, match="too large"):
        lrq.encode(np.array([1e300]), 1e-300, KEY)
    with pytest.raises(ValueError, match="too large for float32.*dtype='float64'"):
        lrq.encode(np.array([1e5]), 1.0, KEY, dtype="float32")
    with pytest.raises(TypeError, match="key must be bytes"):
        lrq.encode(np.ones(3), 1.0, 1.5)
    with pytest.raises(ValueError, match="unknown dtype"):
        lrq.encode(np.ones(3), 1.0, KEY, dtype="float16")


def test_empty_and_torch_input():
    import torch

    msg, uh = _roundtrip(np.zeros(0), 1.0)
    assert msg.d == 0 and uh.shape == (0,)
    t = torch.linspace(-1, 1, 100, dtype=torch.float64)
    np.testing.assert_array_equal(lrq.encode(t, 0.5, 3).m, lrq.encode(t.numpy(), 0.5, 3).m)


def _dense_only(monkeypatch):
    """Make every block take the dense path (Eq. 11/12 on every coordinate): the reference."""
    monkeypatch.setattr(lrq, "_DENSE_FRACTION", -1.0)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_sparse_paths_equal_the_dense_formula(monkeypatch, dtype):
    """The encoder's cheap m = 0 proof and the decoder's m != 0 gather give exactly the dense results.

    Inputs put |u| just inside / outside the near- and far-side distances of every coordinate's own
    layer (relative gaps 1e-3 .. 1e-13), so the bound is tested where it is tight, and sparse and
    dense blocks are mixed (block size 777, odd chunk size).
    """
    sigma, n, chunk = 0.05, 60_000, 25_000
    monkeypatch.setattr(lrq, "_BLOCK", 777)
    kb = lrq._key_bytes(KEY)
    x, L, R = [], [], []
    for c, start in enumerate(range(0, n, chunk)):
        xc, Lc, Rc = lrq.lrq_layers(lrq._chunk_rng(lrq._stream_entropy(kb), c), min(chunk, n - start), sigma,
                                    dtype=dtype)
        x.append(xc), L.append(Lc), R.append(Rc)
    x, L, R = (np.concatenate(t).astype(np.float64) for t in (x, L, R))
    near = np.where(x >= 0, R - x, x - L)  # the distance that can be ~0
    far = np.where(x >= 0, x - L, R - x)
    rng = np.random.default_rng(0)
    gaps = rng.choice([1e-3, 1e-6, 1e-9, 1e-11, 1e-13, -1e-13, -1e-9, -1e-3], size=n)
    dist = np.where(rng.random(n) < 0.5, near, far)
    u = np.where(rng.random(n) < 0.5, 1.0, -1.0) * dist * (1 - gaps)
    u[rng.random(n) < 0.3] *= 1e-4  # and many tiny ones (sparse blocks)
    u[:5000] = 0.0
    fast_msg = lrq.encode(u, sigma, KEY, dtype=dtype, chunk_size=chunk)
    fast = lrq.decode(fast_msg, sigma, KEY)
    _dense_only(monkeypatch)
    ref_msg = lrq.encode(u, sigma, KEY, dtype=dtype, chunk_size=chunk)
    np.testing.assert_array_equal(fast_msg.m, ref_msg.m)
    assert fast_msg.m.dtype == ref_msg.m.dtype and fast_msg.tag == ref_msg.tag
    np.testing.assert_array_equal(fast, lrq.decode(ref_msg, sigma, KEY))
    assert 0 < np.count_nonzero(fast_msg.m) < n  # both kinds of coordinates occur


def test_tiny_updates_are_mostly_proven_zero(monkeypatch):
    """A clipped update far below sigma (the Gau-LRQ regime) leaves almost every coordinate to the cheap bound."""
    calls = []
    real = lrq._floor_t
    monkeypatch.setattr(lrq, "_floor_t", lambda z, *a, **k: (calls.append(z.size), real(z, *a, **k))[1])
    d = 200_000
    u = np.random.default_rng(3).normal(size=d)
    u /= np.linalg.norm(u)  # |u| ~ 2e-3, sigma = 0.5
    msg = lrq.encode(u, 0.5, KEY)
    assert sum(calls) < 0.01 * d
    e = (lrq.decode(msg, 0.5, KEY) - u) / 0.5
    assert stats.kstest(e, "norm").pvalue > 1e-3


@settings(max_examples=60, deadline=None)
@given(
    u=hnp.arrays(np.float64, st.integers(1, 64), elements=st.floats(-1e6, 1e6, allow_nan=False)),
    log_sigma=st.floats(-6, 2),
    key=st.integers(0, 2**64),
)
def test_property_error_in_layer_and_levels(u, log_sigma, key):
    """Any input: e in (L, R] of its layer and |m| <= ceil(max|u| / w_min) (Lemma 3)."""
    sigma = 10.0**log_sigma
    msg = lrq.encode(u, sigma, key)
    e = lrq.decode(msg, sigma, key) - u
    x, L, R = lrq.lrq_layers(lrq._chunk_rng(lrq._stream_entropy(lrq._key_bytes(key)), 0), u.size, sigma)
    tol = 1e-9 * (np.abs(u) + (R - L))
    assert np.all(e > L - tol) and np.all(e <= R + tol)
    A = float(np.abs(u).max())
    assert np.abs(msg.m.astype(np.int64)).max() <= math.ceil(A / lrq.lrq_w_min(sigma))
