"""The exact discrete Gaussian sampler against its law, and its keystream.

The chi-square tests draw 10^7 samples from fixed keys (so they are deterministic) and compare the counts with
the exact pmf ``exp(-x^2 / (2 sigma^2)) / sum_y exp(-y^2 / (2 sigma^2))`` at sigma 0.8, 3.7 and 1e3; the same test
rejects the rounded continuous Gaussian at sigma 0.8 (which is not the discrete Gaussian), so it has power.
"""

import hashlib
import math
import os
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from flower_dp.mechanisms import _discrete_gaussian_kernel as kernel
from flower_dp.mechanisms.discrete_gaussian import KERNEL_ENV, discrete_gaussian, exact_sigma
from flower_dp.rng import KeyStream, NodeKey, exact_noise_stream, stream_key

N = 10_000_000


def _exact_pmf(sigma2: float, lo: int, hi: int) -> np.ndarray:
    """pmf on [lo, hi] with the normaliser summed independently (mpmath-free: float64 terms, |x| <= 50 sigma)."""
    lim = int(50 * math.sqrt(sigma2)) + 50
    xs = np.arange(-lim, lim + 1, dtype=np.float64)
    w = np.exp(-xs * xs / (2 * sigma2))
    p = w / math.fsum(w)
    return p[lo + lim: hi + lim + 1]


def _chi2_pvalue(draws: np.ndarray, sigma2: float, bins: int = 400) -> float:
    """Chi-square p-value of integer ``draws`` against N_Z(0, sigma2): integer cells grouped into cells of at least
    ~equal mass (at most ``bins``), tails merged so every expected count is >= 50."""
    lim = int(12 * math.sqrt(sigma2)) + 12
    p = _exact_pmf(sigma2, -lim, lim)
    counts = np.bincount(np.clip(draws, -lim, lim) + lim, minlength=2 * lim + 1).astype(np.float64)
    # group consecutive integers into cells of mass >= max(1/bins, 50/n)
    cdf = np.cumsum(p)
    target = max(1.0 / bins, 50.0 / len(draws))
    cell = np.minimum((cdf / target).astype(np.int64), int(1 / target))
    obs = np.bincount(cell, weights=counts)
    exp = np.bincount(cell, weights=p) * len(draws)
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    obs[-1] += len(draws) - obs.sum()  # the clipped tails' draws (none expected) land in the last cell
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    return float(stats.chi2.sf(chi2, len(obs) - 1))


@pytest.mark.parametrize("sigma", [0.8, 3.7, 1e3])
def test_chi_square_against_the_exact_pmf(sigma):
    s, L = exact_sigma(sigma)
    sigma2 = s * s / (2 * L * L)
    assert sigma ** 2 <= sigma2 <= sigma ** 2 * (1 + 2 ** -22)
    x = discrete_gaussian(N, sigma, exact_noise_stream(12345, 0, int(sigma * 10)))
    assert x.dtype == np.int64 and x.shape == (N,)
    p = _chi2_pvalue(x, sigma2)
    assert p > 1e-4, f"chi-square p = {p:.3g} at sigma {sigma}"
    assert abs(x.mean()) < 5 * math.sqrt(sigma2 / N)


def test_chi_square_has_power():
    """A rounded continuous Gaussian of the same sigma is not the discrete Gaussian at sigma 0.8: the test sees it."""
    rng = np.random.default_rng(0)
    x = np.rint(rng.normal(0.0, 0.8, N)).astype(np.int64)
    assert _chi2_pvalue(x, 0.8 ** 2) < 1e-12


def test_reproducible_and_key_separated():
    a = discrete_gaussian(5000, 3.7, exact_noise_stream(7, 2, 11))
    b = discrete_gaussian(5000, 3.7, exact_noise_stream(7, 2, 11))
    assert np.array_equal(a, b)
    for other in (exact_noise_stream(8, 2, 11), exact_noise_stream(7, 3, 11), exact_noise_stream(7, 2, 12)):
        assert not np.array_equal(a, discrete_gaussian(5000, 3.7, other))
    # a 256-bit secret: every bit of the key matters
    k1, k2 = NodeKey(2 ** 255 + 1), NodeKey(2 ** 255 + 3)
    assert stream_key(k1, 0, "noise", 0) != stream_key(k2, 0, "noise", 0)
    assert stream_key(NodeKey(5, reproducible=True), 0, "noise", 0) == stream_key(5, 0, "noise", 0)
    assert stream_key(5, 0, "noise", 0) != stream_key(5, 0, "data", 0)


def test_keystream_is_rfc8439_chacha20():
    """The stream is the ChaCha20 block function's output (RFC 8439 section 2.3.2 test vector: key 00..1f,
    nonce 000000090000004a00000000, block counter 1)."""
    key = bytes(range(32))
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    nonce = (1).to_bytes(4, "little") + bytes.fromhex("000000090000004a00000000")
    block = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor().update(bytes(64))
    assert block[:16].hex() == "10f1e7e4d13b5915500fdd1fa32071c4"
    ks = KeyStream(stream_key(1, 0, "noise", 0))
    w = ks.words64(4)
    ref = Cipher(algorithms.ChaCha20(stream_key(1, 0, "noise", 0), bytes(16)), mode=None).encryptor().update(bytes(32))
    assert w.tobytes() == ref
    assert hashlib.sha256(ref).hexdigest() == hashlib.sha256(KeyStream(stream_key(1, 0, "noise", 0)).bytes(32)).hexdigest()


def test_compiled_and_python_kernels_draw_the_same(monkeypatch):
    pytest.importorskip("numba")
    for sigma in (0.8, 25.0, 1e6):
        monkeypatch.setenv(KERNEL_ENV, "python")
        a = discrete_gaussian(3000, sigma, exact_noise_stream(3, 1, 4))
        monkeypatch.setenv(KERNEL_ENV, "numba")
        b = discrete_gaussian(3000, sigma, exact_noise_stream(3, 1, 4))
        assert np.array_equal(a, b)


def test_output_does_not_depend_on_how_the_stream_is_cut():
    """A sample that runs out of words restarts from its first word once more are appended."""
    s, L = exact_sigma(3.7)
    t = math.isqrt((s * s) // (2 * L * L)) + 1
    words = KeyStream(stream_key(9, 0, "noise", 0)).words62(40_000)
    whole = np.empty(1000, dtype=np.int64)
    i, _ = kernel.sample_into(words, 0, whole, 0, s, L, t)
    assert i == 1000
    cut = np.empty(1000, dtype=np.int64)
    i, pos, end = 0, 0, 50
    while i < 1000:
        i, pos = kernel.sample_into(words[:end], pos, cut, i, s, L, t)
        end += 37
    assert np.array_equal(whole, cut)


def test_exact_bernoulli_matches_its_rational():
    """The Bernoulli(num/den) primitive is exact: with U's words forced onto the float threshold, the long-division
    path decides, and the probability over all 2^k first words equals num/den to the grid."""
    num, den = 1, 3
    thr = (num << 62) // den  # floor(2^62 / 3)
    w = np.array([thr, 0], dtype=np.int64)  # a tie at the first word: the next word (0) is below 1/3's next bits
    assert kernel.bernoulli(w, 0, num, den) == (True, 2)
    w = np.array([thr, (1 << 62) - 1], dtype=np.int64)
    assert kernel.bernoulli(w, 0, num, den) == (False, 2)
    assert kernel.bernoulli(np.array([thr + 1], dtype=np.int64), 0, num, den) == (False, 1)
    assert kernel.bernoulli(np.array([thr - 1], dtype=np.int64), 0, num, den) == (True, 1)


def test_bad_sigma():
    with pytest.raises(ValueError, match="sigma must be a finite number in"):
        discrete_gaussian(3, float("nan"), exact_noise_stream(0, 0, 0))
    with pytest.raises(ValueError, match="sigma must be a finite number in"):
        exact_sigma(0.0)
    with pytest.raises(TypeError, match="exact_noise_stream"):
        discrete_gaussian(3, 1.0, np.random.default_rng(0))


def test_sigma_is_rounded_up_exactly():
    for sigma in (0.0625, 0.8, 1.0, 3.7, 1e3, 12345.678, 2.0 ** 24):
        s, L = exact_sigma(sigma)
        assert Fraction(s * s, 2 * L * L) >= Fraction(sigma) ** 2
        assert Fraction((s - 1) ** 2, 2 * L * L) < Fraction(sigma) ** 2
    assert os.environ.get(KERNEL_ENV, "auto") in ("auto", "numba", "python")
