"""Compressors: contract test over the registry, DP-CSGP's compressors and bit counts."""

import math

import pytest
import torch

from flower_dp.mechanisms import GSGD, make_compressor

NAMES = [
    "identity", "rand_0.1", "rand_0.5", "rand_0.75", "gsgd_2", "gsgd_4", "gsgd_8", "gsgd_16",
    "gsgd_8_bucket64", "gsgd_4_rescale", "gsgd_8_bucket100_rescale", "topk_0.1", "top_0.5",
]
D = 1000


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _x(seed=0, d=D):
    return torch.randn(d, generator=_gen(10_000 + seed), dtype=torch.float64)


def _errors(comp, x, reps):
    g = _gen(7)
    qs = torch.stack([comp.compress(x, g) for _ in range(reps)])
    return qs, ((qs - x) ** 2).sum(1) / (x**2).sum()


@pytest.mark.parametrize("name", NAMES)
def test_contract(name):
    """E||Q(x)-x||^2 <= omega^2 ||x||^2 (+3 SE); unbiased means mean(Q) -> x; Q(0) = 0; determinism."""
    comp = make_compressor(name)
    assert make_compressor(comp.name).name == comp.name  # the name round-trips
    x = _x()
    reps = 400
    qs, ratio = _errors(comp, x, reps)
    se = float(ratio.std()) / math.sqrt(reps)
    assert float(ratio.mean()) <= comp.omega2(D) + 3 * se + 1e-12, (float(ratio.mean()), comp.omega2(D))
    assert comp.omega(D) == pytest.approx(math.sqrt(comp.omega2(D)))
    if comp.unbiased:
        # ||mean(Q) - x||^2 has expectation E||Q-x||^2 / reps <= omega^2 ||x||^2 / reps
        bias2 = float(((qs.mean(0) - x) ** 2).sum() / (x**2).sum())
        assert bias2 <= 4 * float(ratio.mean()) / reps + 1e-20
    zero = torch.zeros(D, dtype=torch.float64)
    assert torch.equal(comp.compress(zero, _gen(1)), zero)
    a, b = comp.compress(x, _gen(3)), comp.compress(x, _gen(3))
    assert torch.equal(a, b) and a.dtype == x.dtype and a.shape == x.shape
    if name.startswith(("rand", "gsgd")):
        assert not torch.equal(a, comp.compress(x, _gen(4)))  # fresh randomness per (node, k) key
    assert isinstance(comp.bits(D), int) and comp.bits(D) > 0


def test_rand_a_mask_properties():
    """rand_a keeps exactly floor(a d) entries, equal to the input; error ratio exactly 1 - k/d (7.1)."""
    comp = make_compressor("rand_0.75")
    x = _x() + 10.0  # no zeros
    q = comp.compress(x, _gen(5))
    nz = q != 0
    assert int(nz.sum()) == 750
    assert torch.equal(q[nz], x[nz])
    assert make_compressor("rand_0.75").omega2(10) == pytest.approx(0.3)  # d=10, k=7
    _, ratio = _errors(make_compressor("rand_0.5"), _x(), 400)
    assert float(ratio.mean()) == pytest.approx(0.5, abs=0.01)
    assert not comp.unbiased


def test_gsgd_levels_and_exact_error():
    """Levels are integers in [0, s], signs match, and the MC error matches (||x||/s)^2 sum p(1-p) (7.1)."""
    x = _x(1)
    norm = float(x.norm())
    for b, ref_ratio, bound in [(2, 11.5, 15.8), (4, 2.13, 3.95), (8, 0.0102, 0.061)]:  # reference values
        comp = GSGD(b)
        s = 2 ** (b - 1)
        assert comp.omega2(D) == pytest.approx(bound, rel=0.01)
        q = comp.compress(x, _gen(2))
        lev = q.abs() * s / norm
        assert torch.allclose(lev, lev.round(), atol=1e-9) and float(lev.max()) <= s
        assert bool(((q >= 0) == (x >= 0))[q != 0].all())
        p = torch.frac(s * x.abs() / norm)
        exact = float((norm / s) ** 2 * (p * (1 - p)).sum()) / norm**2
        _, ratio = _errors(comp, x, 300)
        assert float(ratio.mean()) == pytest.approx(exact, rel=0.05)
        assert exact == pytest.approx(ref_ratio, rel=0.15)  # seed-dependent reference values


def test_gsgd_worked_example():
    """x = (3, -4), b = 2: outputs lie in {0, +-2.5, +-5}; exact error 2.5."""
    x = torch.tensor([3.0, -4.0], dtype=torch.float64)
    comp = GSGD(2)
    g = _gen(0)
    qs = torch.stack([comp.compress(x, g) for _ in range(5_000)])
    assert set(qs[:, 0].tolist()) <= {2.5, 5.0} and set(qs[:, 1].tolist()) <= {-2.5, -5.0}
    assert float(((qs - x) ** 2).sum(1).mean()) == pytest.approx(2.5, rel=0.04)  # SE ~1%
    assert torch.allclose(qs.mean(0), x, atol=0.08)


def test_gsgd_bucket_and_rescale_bounds():
    """bucket m: omega^2 = min(m/s^2, sqrt(m)/s) (0.031 for b=8, m=512); rescale: 1 - 1/tau (3.4)."""
    assert GSGD(8, bucket=512).omega2(10**6) == pytest.approx(512 / 128**2)
    r = GSGD(8, rescale=True)
    v = min(101_770 / 128**2, math.sqrt(101_770) / 128)
    assert r.omega2(101_770) == pytest.approx(1 - 1 / (1 + v)) and r.contractive(101_770)
    assert not GSGD(8).contractive(101_770)  # whole-vector gsgd_8 violates Assumption 4 (8.1)
    assert not r.unbiased


@pytest.mark.parametrize(
    "name, d, bits",
    [  # payload bits per message
        ("identity", 101_770, 3_256_640),
        ("rand_0.75", 101_770, 2_442_464),
        ("rand_0.5", 101_770, 1_628_320),
        ("rand_0.1", 101_770, 325_664),
        ("gsgd_16", 101_770, 1_628_352),
        ("gsgd_8", 101_770, 814_192),
        ("gsgd_8_bucket512", 101_770, 820_528),
        ("identity", 11_173_962, 357_566_784),
        ("rand_0.75", 11_173_962, 268_175_072),
        ("rand_0.5", 11_173_962, 178_783_392),
        ("rand_0.1", 11_173_962, 35_756_672),
        ("gsgd_16", 11_173_962, 178_783_424),
        ("gsgd_8", 11_173_962, 89_391_728),
        ("gsgd_8_bucket512", 11_173_962, 90_090_096),
        ("topk_0.1", 101_770, 10_177 * (32 + 17)),  # k (32 + ceil(log2 d)), 2^16 < d <= 2^17
    ],
)
def test_exact_bits(name, d, bits):
    assert make_compressor(name).bits(d) == bits


def test_spec_omega_values():
    """Exact omega^2 row of the section 9 table."""
    assert GSGD(16).omega2(101_770) == pytest.approx(9.478e-5, rel=1e-3)
    assert GSGD(8).omega2(101_770) == pytest.approx(2.492, rel=1e-3)
    assert GSGD(16).omega2(11_173_962) == pytest.approx(0.010407, rel=1e-3)
    assert GSGD(8).omega2(11_173_962) == pytest.approx(26.115, rel=1e-3)
    assert GSGD(8, strict_bits=True).bits(101_770) == 9 * 101_770 + 32  # strict (b+1) d + 32 (8.2 item 8)


def test_topk_deterministic_keeps_largest():
    x = torch.tensor([0.1, -5.0, 2.0, 0.3, -0.2, 4.0, 0.0, 1.0, -3.0, 0.5])
    q = make_compressor("topk_0.3").compress(x)
    assert torch.equal(q, torch.tensor([0, -5.0, 0, 0, 0, 4.0, 0, 0, -3.0, 0]))


@pytest.mark.parametrize(
    "name, match",
    [
        ("rand_1.5", r"a must be in \(0, 1\), got 1.5"),
        ("rand_0", r"got 0"),
        ("gsgd_2.5", r"integer b >= 2, got '2.5'"),
        ("gsgd_1", r"b must be >= 2, got 1"),
        ("qsgd_8", r"unknown compressor name, got 'qsgd_8'; valid forms"),
        ("topk_2", r"got 2"),
        ("rand_abc", r"unknown compressor"),
    ],
)
def test_bad_names(name, match):
    with pytest.raises(ValueError, match=match):
        make_compressor(name)


def test_needs_generator_and_flat_input():
    with pytest.raises(ValueError, match="needs a torch.Generator"):
        make_compressor("rand_0.5").compress(torch.ones(4))
    with pytest.raises(ValueError, match="1-D"):
        make_compressor("identity").compress(torch.ones(2, 2))


@pytest.mark.parametrize("name", ["identity", "rand_0.5", "gsgd_8", "gsgd_8_bucket64_rescale", "topk_0.1"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_input_rejected(name, bad):
    """Issue 3 bad input: a non-finite vector is refused, naming the count, never silently compressed."""
    x = torch.ones(16)
    x[3] = bad
    with pytest.raises(ValueError, match="x must be finite, got 1 NaN/inf entries of 16"):
        make_compressor(name).compress(x, _gen(0))
