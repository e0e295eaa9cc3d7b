"""The exact discrete Gaussian sampler's inner loop (Canonne, Kamath and Steinke 2020, Algorithms 1-3), in integers.

One function, :func:`sample_into`, compiled by numba when it imports (:mod:`.discrete_gaussian`) and otherwise run as
plain Python: the same statements on the same integers, so both draw the same numbers from the same words.  Every
quantity is an integer below 2^62; the one float operation (in :func:`bernoulli`) only decides comparisons whose
answer it provably gets right, the rest go to exact long division.  The random input is a vector of 62-bit
words (int64) from the node's ChaCha20 keystream (:func:`flower_dp.rng.exact_noise_stream`).

The standard deviation is ``sigma = s / (sqrt(2) L)`` for integers ``s, L >= 1``, so ``sigma^2 = s^2 / (2 L^2)`` is
rational and the acceptance exponent of Algorithm 3 is a square of a rational, ``(x / M)^2`` with
``x = |2 L^2 t |Y| - s^2|`` and ``M = 2 L t s`` (``t = floor(sigma) + 1``, the discrete Laplace scale).  Writing
``x = h M + r`` (``0 <= r < M``), ``exp(-(x/M)^2) = exp(-h^2) exp(-2 h r / M) exp(-(r/M)^2)``: three independent
Bernoulli trials, each one exact with integers of the size of ``x`` (no 128-bit square is ever formed).
"""

from __future__ import annotations

TWO62 = 1 << 62
TWO62F = 4611686018427387904.0  # 2.0 ** 62
TWO31 = 1 << 31
MASK31 = (1 << 31) - 1
MASK62 = (1 << 62) - 1
MARGIN = 1 << 11
KMAX_DEN = 1 << 60
#: ``2 L^2 t |Y|`` must stay below this (a proposal this far out has probability below exp(-2^20); see sample_into)
X_LIMIT = 1 << 61


def uniform(words, pos, m):
    """A uniform integer in ``[0, m)`` (``1 <= m < 2^31``) from 62-bit words by Lemire's multiply-and-reject,
    exact: ``(value, pos)``, ``pos = -1`` when the words ran out.  The 93-bit product ``x m`` is formed from two
    31-bit halves of ``x``, so every intermediate stays below 2^63."""
    n = words.shape[0]
    thr = -1
    while pos < n:
        x = words[pos]
        pos += 1
        a = (x >> 31) * m
        s = (a & MASK31) * TWO31 + (x & MASK31) * m
        high = (a >> 31) + (s >> 62)
        low = s & MASK62
        if low >= m:
            return high, pos
        if thr < 0:
            thr = TWO62 % m
        if low >= thr:
            return high, pos
    return 0, -1


def _bernoulli_tie(words, pos, u, num, den):
    """Bernoulli(num/den) (``0 < num < den < 2^61``) for a uniform U in [0, 1) whose first 62 bits are ``u``: the
    binary expansion of num/den by exact long division, 62 bits at a time, compared with U's, reading a further
    word of U on a tie."""
    n = words.shape[0]
    rem = num
    while True:
        q = 0
        for _ in range(62):
            rem = rem << 1
            q = q << 1
            if rem >= den:
                rem -= den
                q |= 1
        if u < q:
            return True, pos
        if u > q:
            return False, pos
        if pos >= n:
            return False, -1
        u = words[pos]
        pos += 1


def bernoulli(words, pos, num, den):
    """Bernoulli(num/den) for ``0 <= num <= den < 2^61``, exact: one uniform U in [0, 1) read lazily, 62 bits per
    word, and U < num/den decided.  ``a = int(num / den * 2^62)`` (IEEE: within 2^10 of the true threshold
    ``num 2^62 / den``) decides it when U's first 62 bits ``u`` are more than 2^11 from ``a``, which is then the
    answer exact comparison gives; within 2^11 (probability 2^-50) :func:`_bernoulli_tie` decides it by long
    division."""
    if pos >= words.shape[0]:
        return False, -1
    u = words[pos]
    pos += 1
    if num >= den:
        return True, pos
    if num <= 0:
        return False, pos
    a = int(num / den * TWO62F)
    if u + MARGIN < a:
        return True, pos
    if u > a + MARGIN:
        return False, pos
    return _bernoulli_tie(words, pos, u, num, den)


def bernoulli_exp_frac(words, pos, num, den):
    """Bernoulli(exp(-num/den)) for ``0 <= num <= den < 2^52`` (CKS Algorithm 1: K = 1; while Bernoulli(gamma/K):
    K += 1; return K odd).  Bernoulli(gamma/K) is one draw of num/(den K), or Bernoulli(gamma) and Bernoulli(1/K)
    once den K would pass 2^60."""
    k = 1
    while True:
        if den <= KMAX_DEN // k:
            ok, pos = bernoulli(words, pos, num, den * k)
        else:
            ok, pos = bernoulli(words, pos, num, den)
            if pos >= 0 and ok:
                ok, pos = bernoulli(words, pos, 1, k)
        if pos < 0:
            return False, pos
        if ok:
            k += 1
        else:
            return (k % 2) == 1, pos


def bernoulli_exp_sq(words, pos, r, m):
    """Bernoulli(exp(-(r/m)^2)) for ``0 <= r < m < 2^52``: Algorithm 1 with Bernoulli(gamma/K) drawn as
    Bernoulli(r/m) and Bernoulli(r/m) and Bernoulli(1/K), independent (their product is (r/m)^2 / K)."""
    k = 1
    while True:
        ok, pos = bernoulli(words, pos, r, m)
        if pos >= 0 and ok:
            ok, pos = bernoulli(words, pos, r, m)
            if pos >= 0 and ok and k > 1:
                ok, pos = bernoulli(words, pos, 1, k)
        if pos < 0:
            return False, pos
        if ok:
            k += 1
        else:
            return (k % 2) == 1, pos


def bernoulli_exp(words, pos, num, den):
    """Bernoulli(exp(-num/den)) for any ``num >= 0``: floor(num/den) Bernoulli(exp(-1)), stopping at the first
    failure, then Bernoulli(exp(-(num mod den)/den))."""
    g = num // den
    for _ in range(g):
        ok, pos = bernoulli_exp_frac(words, pos, 1, 1)
        if pos < 0 or not ok:
            return False, pos
    return bernoulli_exp_frac(words, pos, num - g * den, den)


def discrete_laplace(words, pos, t):
    """A discrete Laplace with scale ``t`` (P[Y = y] proportional to exp(-|y|/t); CKS Algorithm 2 with s = 1)."""
    while True:
        u, pos = uniform(words, pos, t)
        if pos < 0:
            return 0, pos
        ok, pos = bernoulli_exp_frac(words, pos, u, t)
        if pos < 0:
            return 0, pos
        if not ok:
            continue
        v = 0
        while True:
            ok, pos = bernoulli_exp_frac(words, pos, 1, 1)
            if pos < 0:
                return 0, pos
            if not ok:
                break
            v += 1
        x = u + t * v
        if pos >= words.shape[0]:
            return 0, -1
        b = words[pos] & 1
        pos += 1
        if b == 1 and x == 0:
            continue
        return (x if b == 0 else -x), pos


def sample_into(words, pos, out, i, s, L, t):
    """Fill ``out[i:]`` with discrete Gaussians of ``sigma = s / (sqrt(2) L)`` (CKS Algorithm 3, discrete Laplace
    proposal of scale ``t``), reading ``words`` from ``pos``.  Returns ``(i, pos)``: ``i == len(out)`` when done,
    else the words ran out during sample ``i``, which restarts from the returned ``pos`` (the word where that sample
    began) once the caller appended more words: the output does not depend on how the stream is cut.  Returns
    ``(-1, pos)`` when a proposal reached ``|Y| >= X_LIMIT / (2 L^2 t)`` (probability below exp(-2^20) per trial at
    every sigma this module accepts): the caller raises, data-independently."""
    n = out.shape[0]
    s2 = s * s
    a = 2 * L * L * t
    m = 2 * L * t * s
    ymax = X_LIMIT // a
    while i < n:
        start = pos
        while True:
            y, pos = discrete_laplace(words, pos, t)
            if pos < 0:
                return i, start
            ay = y if y >= 0 else -y
            if ay >= ymax:
                return -1, pos
            x = a * ay - s2
            if x < 0:
                x = -x
            h = x // m
            r = x - h * m
            ok = True
            for _ in range(h):  # exp(-h^2) as h * h Bernoulli(exp(-1)) in two loops (h * h may not fit)
                for _ in range(h):
                    ok, pos = bernoulli_exp_frac(words, pos, 1, 1)
                    if pos < 0 or not ok:
                        break
                if pos < 0 or not ok:
                    break
            if pos < 0:
                return i, start
            if not ok:
                continue
            if h > 0:
                ok, pos = bernoulli_exp(words, pos, 2 * h * r, m)
                if pos < 0:
                    return i, start
                if not ok:
                    continue
            ok, pos = bernoulli_exp_sq(words, pos, r, m)
            if pos < 0:
                return i, start
            if ok:
                out[i] = y
                i += 1
                break
    return i, pos
