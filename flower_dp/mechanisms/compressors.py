"""Message compressors for DP-CSGP with exact bit counts (DP-CSGP paper, Assumption 4 and its experiments).

Each compressor maps a flat vector ``x`` (shape (d,)) to the *decompressed* estimate
``Q(x)`` as a dense tensor; the bits it would cost on the wire come from the cost model
(:meth:`Compressor.bits`), never from object sizes.

Contraction convention (DP-CSGP, Assumption 4): ``E||Q(x) - x||^2 <= omega^2 ||x||^2``;
:meth:`Compressor.omega` returns ``omega`` (not squared).  ``Q(0) = 0`` for all.
Compressor randomness (rand_a masks, gsgd dithers) is data-independent post-processing
and costs no privacy; draw it from ``flower_dp.rng.torch_generator(seed, node, "compress", k)``
(never from the data or noise streams).

=================  ========  =====================================  ==========================================
name               unbiased  omega^2                                bits for a d-vector
=================  ========  =====================================  ==========================================
identity           yes       0                                      32 d
rand_<a>           no        1 - floor(a d)/d (exact)               32 floor(a d) (mask from shared seed)
gsgd_<b>           yes       min(m/s^2, sqrt(m)/s), s = 2^(b-1)     b d + 32 ceil(d/m), m = bucket (or d)
gsgd_<b> rescale   no        1 - 1/tau, tau = 1 + min(...)          same
topk_<f>           no        1 - floor(f d)/d (deterministic bound)  k (32 + ceil(log2 d)), k = floor(f d)
=================  ========  =====================================  ==========================================

``rand_a`` is the paper's *biased* keep-a-fraction version (no 1/a rescaling).  Whole-vector
``gsgd_8`` is not contractive at realistic d (omega^2 >= 1); use ``bucket=512``.
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod

import torch

from flower_dp._checks import check_int, check_open_unit

__all__ = [
    "Compressor",
    "Identity",
    "RandA",
    "GSGD",
    "TopK",
    "COMPRESSORS",
    "make_compressor",
]


def _check_vec(x: torch.Tensor) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dim() != 1:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be a 1-D torch.Tensor (a flat vector), got {shape}; flatten it first")
    if x.dtype.is_floating_point and not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).sum())
        raise ValueError(
            f"x must be finite, got {bad} NaN/inf entries of {x.numel()}; the vector to compress diverged "
            "(lower the learning rate or the noise)"
        )
    return x


class Compressor(ABC):
    """A (possibly random, possibly biased) compression operator on flat vectors.

    Attributes
    ----------
    name : str
        Registry name that :func:`make_compressor` accepts back.
    unbiased : bool
        True if ``E[Q(x)] = x`` for every x.
    """

    name: str
    unbiased: bool

    @abstractmethod
    def compress(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Return ``Q(x)``: a new dense tensor, shape (d,), same dtype/device as ``x``."""

    @abstractmethod
    def bits(self, d: int) -> int:
        """Exact payload bits for one d-vector message (push-sum weight excluded)."""

    @abstractmethod
    def omega2(self, d: int) -> float:
        """``omega^2`` with ``E||Q(x)-x||^2 <= omega^2 ||x||^2`` for every d-vector x."""

    def omega(self, d: int) -> float:
        """``omega`` (the square root of :meth:`omega2`); ``< 1`` means contractive (Assumption 4)."""
        return math.sqrt(self.omega2(d))

    def contractive(self, d: int) -> bool:
        """Whether Assumption 4 (omega < 1) holds at this d."""
        return self.omega2(d) < 1.0

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class Identity(Compressor):
    """No compression: ``Q(x) = x`` (exact-communication ablation, DP-SGP)."""

    name = "identity"
    unbiased = True

    def compress(self, x, generator=None):
        return _check_vec(x).clone()

    def bits(self, d):
        return 32 * check_int("d", d, minimum=0)

    def omega2(self, d):
        return 0.0


class RandA(Compressor):
    """Keep a uniformly random subset of ``k = floor(a d)`` coordinates, zero the rest, no rescaling.

    The mask is fresh per call from ``generator`` (seeded by (node, k) so receivers can rebuild it
    from the shared seed; only the k values are sent).  Biased; ``E||Q(x)-x||^2 = (1 - k/d)||x||^2``.

    Parameters
    ----------
    a : float in (0, 1)
        Fraction kept (``rand_0.75`` = the paper's "rand75").
    """

    unbiased = False

    def __init__(self, a: float) -> None:
        self.a = check_open_unit("a", a, hint="a is the kept fraction, e.g. rand_0.75")
        self.name = f"rand_{a:g}"

    def k(self, d: int) -> int:
        return int(math.floor(self.a * check_int("d", d, minimum=0)))

    def mask(self, d: int, generator: torch.Generator, device="cpu") -> torch.Tensor:
        """Sorted int64 indices of the kept coordinates, shape (k,)."""
        perm = torch.randperm(d, generator=generator, device=generator.device)
        return perm[: self.k(d)].sort().values.to(device)

    def compress(self, x, generator=None):
        x = _check_vec(x)
        if generator is None:
            raise ValueError(
                "rand_a needs a torch.Generator for its mask, got None; use torch_generator(..., 'compress', k)"
            )
        idx = self.mask(x.numel(), generator, x.device)
        out = torch.zeros_like(x)
        out[idx] = x[idx]
        return out

    def bits(self, d):
        return 32 * self.k(d)

    def omega2(self, d):
        d = check_int("d", d, minimum=1)
        return 1.0 - self.k(d) / d


class TopK(Compressor):
    """Keep the ``k = floor(f d)`` largest-|x| coordinates (deterministic; values and indices sent).

    ``||Q(x)-x||^2 <= (1 - k/d)||x||^2``.  Ties are broken by ``torch.topk``.
    """

    unbiased = False

    def __init__(self, frac: float) -> None:
        self.frac = check_open_unit("frac", frac, hint="frac is the kept fraction, e.g. topk_0.1")
        self.name = f"topk_{frac:g}"

    def k(self, d: int) -> int:
        return int(math.floor(self.frac * check_int("d", d, minimum=0)))

    def compress(self, x, generator=None):
        x = _check_vec(x)
        k = self.k(x.numel())
        out = torch.zeros_like(x)
        if k > 0:
            idx = torch.topk(x.abs(), k, sorted=False).indices
            out[idx] = x[idx]
        return out

    def bits(self, d):
        d = check_int("d", d, minimum=1)
        return self.k(d) * (32 + math.ceil(math.log2(d)))

    def omega2(self, d):
        d = check_int("d", d, minimum=1)
        return 1.0 - self.k(d) / d


class GSGD(Compressor):
    """QSGD-style stochastic quantization with ``s = 2^(b-1)`` levels (as in DP-CSGP's experiments).

    ``Q(x) = ||x|| sign(x) floor(s |x|/||x|| + u) / s`` with ``u ~ U[0,1)^d`` fresh per call,
    applied to consecutive buckets of ``bucket`` coordinates (each with its own norm) or to the
    whole vector (``bucket=None``, the paper).  ``sign(0) = +1``; a zero bucket maps to zero.

    Parameters
    ----------
    b : int >= 2
        Bits per coordinate (sign + b-1 level bits, the paper's count).
    bucket : int, optional
        Bucket size m; ``None`` = whole vector.  Adds 32 bits (one float32 norm) per bucket.
    rescale : bool
        Divide by ``tau = 1 + min(m/s^2, sqrt(m)/s)`` (CHOCO "qsgd-biased"): biased but contractive.
    strict_bits : bool
        Count ``b + 1`` bits per coordinate (levels 0..s need one more bit).
    """

    def __init__(self, b: int, *, bucket: int | None = None, rescale: bool = False, strict_bits: bool = False) -> None:
        self.b = check_int("b", b, minimum=2)
        if self.b > 31:
            raise ValueError(f"b must be <= 31 (levels held in int32 arithmetic), got {b}")
        self.s = 2 ** (self.b - 1)
        self.bucket = None if bucket is None else check_int("bucket", bucket, minimum=1)
        self.rescale = bool(rescale)
        self.strict_bits = bool(strict_bits)
        self.unbiased = not self.rescale
        suffix = (f"_bucket{self.bucket}" if self.bucket else "") + ("_rescale" if self.rescale else "")
        self.name = f"gsgd_{self.b}{suffix}"

    def _m(self, d: int) -> int:
        return d if self.bucket is None else min(self.bucket, d)

    def variance_factor(self, d: int) -> float:
        """The unbiased operator's ``min(m/s^2, sqrt(m)/s)`` (the paper's omega^2)."""
        m = self._m(check_int("d", d, minimum=1))
        return min(m / self.s**2, math.sqrt(m) / self.s)

    def compress(self, x, generator=None):
        x = _check_vec(x)
        if generator is None:
            raise ValueError(
                "gsgd_b needs a torch.Generator for its dither, got None; use torch_generator(..., 'compress', k)"
            )
        d = x.numel()
        if d == 0:
            return x.clone()
        m = self._m(d)
        nb = -(-d // m)
        u = torch.rand(d, generator=generator, dtype=x.dtype, device=generator.device).to(x.device)
        pad = nb * m - d
        xb = torch.nn.functional.pad(x, (0, pad)).view(nb, m)
        ub = torch.nn.functional.pad(u, (0, pad)).view(nb, m)
        norm = xb.norm(dim=1, keepdim=True)
        safe = torch.where(norm > 0, norm, torch.ones_like(norm))
        level = torch.floor(self.s * xb.abs() / safe + ub).clamp_(max=self.s)  # clamp guards rounding at |x| = ||x||
        sign = torch.where(xb >= 0, 1.0, -1.0).to(x.dtype)
        q = norm * sign * level / self.s
        if self.rescale:
            q = q / (1.0 + self.variance_factor(d))
        return q.reshape(-1)[:d].contiguous()

    def bits(self, d):
        d = check_int("d", d, minimum=0)
        per = self.b + 1 if self.strict_bits else self.b
        nbuckets = 1 if self.bucket is None else -(-d // self.bucket)
        return per * d + 32 * nbuckets

    def omega2(self, d):
        v = self.variance_factor(d)
        return 1.0 - 1.0 / (1.0 + v) if self.rescale else v


#: prefix -> constructor taking the numeric parameter of the name.
COMPRESSORS = {"identity": Identity, "rand": RandA, "gsgd": GSGD, "topk": TopK, "top": TopK}

_NAME = re.compile(r"^(rand|gsgd|topk|top)_([0-9.eE+-]+)((?:_bucket[0-9]+)?)((?:_rescale)?)$")


def make_compressor(name: str, **kwargs) -> Compressor:
    """Build a compressor from its name.

    Parameters
    ----------
    name : str
        ``"identity"``, ``"rand_<a>"`` (a in (0,1), e.g. ``rand_0.75``), ``"gsgd_<b>"`` (integer b >= 2,
        optional suffixes ``_bucket<m>`` and ``_rescale``, e.g. ``gsgd_8_bucket512``), ``"topk_<frac>"``
        (alias ``top_<frac>``).
    **kwargs
        Extra options for gsgd (``bucket``, ``rescale``, ``strict_bits``).

    Raises
    ------
    ValueError
        Unknown name or bad parameter, naming the value, the valid forms and the fix.
    """
    forms = "'identity', 'rand_<a>' (0<a<1), 'gsgd_<b>[_bucket<m>][_rescale]' (integer b>=2), 'topk_<frac>'"
    if not isinstance(name, str):
        raise TypeError(f"compressor name must be a str, got {type(name).__name__}; valid forms are {forms}")
    if name == "identity":
        if kwargs:
            raise ValueError(f"identity takes no options, got {sorted(kwargs)}")
        return Identity()
    match = _NAME.match(name)
    if match is None:
        raise ValueError(f"unknown compressor name, got {name!r}; valid forms are {forms}")
    kind, num, bucket, rescale = match.groups()
    try:
        value = float(num)
    except ValueError:
        msg = f"compressor {name!r} has a non-numeric parameter, got {num!r}; valid forms are {forms}"
        raise ValueError(msg) from None
    if kind == "gsgd":
        if not value.is_integer():
            raise ValueError(f"gsgd_<b> needs an integer b >= 2, got {num!r} in {name!r}; e.g. gsgd_8")
        opts = dict(kwargs)
        if bucket:
            opts.setdefault("bucket", int(bucket[len("_bucket"):]))
        if rescale:
            opts.setdefault("rescale", True)
        return GSGD(int(value), **opts)
    if kwargs:
        raise ValueError(f"{kind}_<x> takes no options, got {sorted(kwargs)}")
    return COMPRESSORS[kind](value)
