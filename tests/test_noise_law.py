"""The DP step's Gaussian noise as nodes draw it (``PushSumNode.gaussian``: stream (key, node, "noise", k),
``flower_dp.mechanisms.noise.gaussian_noise``) is N(0, std^2) in both key modes, by a KS test on >= 100k draws;
the seeded mode is deterministic, the secret mode is not; drawing into a buffer (``out=``) changes no number."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from flower_dp.clients import registry
from flower_dp.mechanisms.noise import gaussian_noise
from flower_dp.models import build_model
import numpy as np

from flower_dp.rng import node_secret, noise_generator
from flower_dp.topology import make_topology

D = 120_000


def _node(reproducible: bool):
    plan = registry.prepare("dyn_d2p", {"variant": "dyn", "epsilon": 4.0, "delta": 1e-4, "batch_size": 8, "lr": 0.1,
                                        "accountant": "rdp"},
                            n_nodes=4, samples_per_node=[32] * 4, num_iters=4, dim=8, seed=3, reproducible=reproducible)
    g = torch.Generator().manual_seed(0)
    return registry.make_node(plan, node_id=1, topology=make_topology("exp_one_peer", 4),
                              model=build_model("logreg", num_classes=2, in_features=3, seed=0),
                              loss_fn=torch.nn.functional.cross_entropy,
                              data_x=torch.randn(32, 3, generator=g), data_y=torch.randint(0, 2, (32,), generator=g))


@pytest.mark.parametrize("reproducible", [True, False], ids=["reproducible", "secret"])
def test_node_noise_is_n0_std2_by_ks_mean_and_std(reproducible):
    """120,000 draws of node.gaussian (what release_gaussian adds): KS against N(0, std^2) (p > 1e-6: the secret
    mode is random, so the level keeps the test from ever flaking), mean within 5 SE, std within 1 %."""
    std = 0.8
    z = _node(reproducible).gaussian(2, std, D).double()
    assert z.shape == (D,) and z.dtype == torch.float64
    res = stats.kstest(z.numpy() / std, "norm")
    assert res.pvalue > 1e-6, res
    assert abs(float(z.mean())) < 5 * std / math.sqrt(D)
    assert abs(float(z.std()) / std - 1) < 0.01


def test_reproducible_noise_is_deterministic_and_secret_noise_differs_between_runs():
    """Seeded mode: the same node of two builds (two runs) draws the same numbers at the same k (and other numbers
    at another k); secret mode: two builds draw different numbers (and both differ from the seeded stream)."""
    a, b = _node(True), _node(True)
    assert torch.equal(a.gaussian(3, 1.0, 1000), b.gaussian(3, 1.0, 1000))
    assert not torch.equal(a.gaussian(3, 1.0, 1000), a.gaussian(4, 1.0, 1000))
    s1, s2 = _node(False), _node(False)
    x1, x2 = s1.gaussian(3, 1.0, 1000), s2.gaussian(3, 1.0, 1000)
    assert not torch.equal(x1, x2) and not torch.equal(x1, a.gaussian(3, 1.0, 1000))
    assert torch.equal(x1, s1.gaussian(3, 1.0, 1000))  # one node replays its own k (a rebuilt relay step)


@pytest.mark.parametrize("d", [1, 5, 15, 16, 17, 1000, 101_770])
def test_out_buffer_draws_the_same_numbers(d):
    """gaussian_noise(..., out=buf) == gaussian_noise(...) bit for bit, in both key modes' streams; std = 0 zeroes
    the buffer and draws nothing."""
    for key in (node_secret(True, 7), node_secret(False, 7)):
        buf = torch.full((d,), float("nan"))
        got = gaussian_noise(d, 0.37, noise_generator(key, 2, 5), out=buf)
        assert got is buf
        assert torch.equal(got, gaussian_noise(d, 0.37, noise_generator(key, 2, 5)))
    gen = noise_generator(1, 0, 0)
    assert torch.equal(gaussian_noise(d, 0.0, gen, out=buf), torch.zeros(d))
    assert np.array_equal(gen.standard_normal(4), noise_generator(1, 0, 0).standard_normal(4))  # nothing drawn


def test_out_buffer_of_the_wrong_shape_or_dtype_is_refused():
    gen = noise_generator(1, 0, 0)
    with pytest.raises(ValueError, match="out must be a contiguous"):
        gaussian_noise(10, 1.0, gen, out=torch.empty(9))
    with pytest.raises(ValueError, match="got shape"):
        gaussian_noise(10, 1.0, gen, out=torch.empty(10, dtype=torch.float64))


def test_noise_is_drawn_in_float64_so_its_tail_is_not_cut():
    """torch's float32 sampler builds a draw from a 24-bit uniform: |z| <= sqrt(2 ln 2^24) = 5.77, a cut tail the
    Gaussian accountants do not charge.  The noise is numpy's float64 ziggurat (tail by exponential rejection from
    53-bit uniforms: |z| <= r + 53 ln 2 / r = 13.7, r = 3.654), times std in float64, then rounded."""
    from flower_dp.mechanisms.noise import TAIL_CUT_STD

    r = 3.6541528853610088  # numpy's ziggurat_nor_r
    assert math.sqrt(2 * 24 * math.log(2)) < 5.78 and abs(r + 53 * math.log(2) / r - TAIL_CUT_STD) < 0.01
    got = gaussian_noise(4096, 0.7, noise_generator(3, 0, 0))
    ref = torch.from_numpy(noise_generator(3, 0, 0).standard_normal(4096) * 0.7).float()
    assert got.dtype == torch.float32 and torch.equal(got, ref)
    buf = torch.empty(4096)
    assert torch.equal(gaussian_noise(4096, 0.7, noise_generator(3, 0, 0), out=buf), ref)
    f64 = gaussian_noise(4096, 0.7, noise_generator(3, 0, 0), dtype=torch.float64)
    assert f64.dtype == torch.float64 and torch.equal(f64.float(), ref)


def test_the_tail_beyond_5_77_std_is_there():
    """2e7 draws: P(|Z| > 5.5) = 3.8e-8 gives 0.76 expected; P(|Z| > 4.5) = 6.8e-6 gives 136 (a float32 Box-Muller
    already thins this region).  The count beyond 4.5 std is within 5 SE of N(0, 1)'s."""
    z = np.concatenate([gaussian_noise(2_000_000, 1.0, noise_generator(11, 0, k), dtype=torch.float64).numpy()
                        for k in range(10)])
    n45 = int((np.abs(z) > 4.5).sum())
    expect = z.size * 2 * stats.norm.sf(4.5)
    assert abs(n45 - expect) < 5 * math.sqrt(expect), (n45, expect)
