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
from flower_dp.rng import node_secret, torch_generator
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
    """gaussian_noise(..., out=buf) == gaussian_noise(...) bit for bit, for torch's small and vectorised paths;
    in both key modes' streams; std = 0 zeroes the buffer and draws nothing."""
    for key in (node_secret(True, 7), node_secret(False, 7)):
        buf = torch.full((d,), float("nan"))
        got = gaussian_noise(d, 0.37, torch_generator(key, 2, "noise", 5), out=buf)
        assert got is buf
        assert torch.equal(got, gaussian_noise(d, 0.37, torch_generator(key, 2, "noise", 5)))
    gen = torch_generator(1, 0, "noise", 0)
    assert torch.equal(gaussian_noise(d, 0.0, gen, out=buf), torch.zeros(d))
    assert torch.equal(torch.randn(4, generator=gen), torch.randn(4, generator=torch_generator(1, 0, "noise", 0)))


def test_out_buffer_of_the_wrong_shape_or_dtype_is_refused():
    gen = torch_generator(1, 0, "noise", 0)
    with pytest.raises(ValueError, match="out must be a contiguous"):
        gaussian_noise(10, 1.0, gen, out=torch.empty(9))
    with pytest.raises(ValueError, match="got shape"):
        gaussian_noise(10, 1.0, gen, out=torch.empty(10, dtype=torch.float64))


def test_noise_is_drawn_in_float64_so_its_tail_is_not_cut_at_5_77_std():
    """torch's float32 sampler builds a draw from a 24-bit uniform: |z| <= sqrt(2 ln 2^24) = 5.77, a cut tail the
    Gaussian accountants do not charge.  The noise is drawn in float64 (53-bit uniforms, cut at 8.57) and rounded."""
    from flower_dp.mechanisms.noise import TAIL_CUT_STD

    assert math.sqrt(2 * 24 * math.log(2)) < 5.78 and abs(math.sqrt(2 * 53 * math.log(2)) - TAIL_CUT_STD) < 0.01
    got = gaussian_noise(4096, 0.7, torch.Generator().manual_seed(3))
    ref = torch.randn(4096, generator=torch.Generator().manual_seed(3), dtype=torch.float64).mul_(0.7).float()
    assert got.dtype == torch.float32 and torch.equal(got, ref)
    assert not torch.equal(got, torch.randn(4096, generator=torch.Generator().manual_seed(3)).mul_(0.7))
    buf = torch.empty(4096)
    assert torch.equal(gaussian_noise(4096, 0.7, torch.Generator().manual_seed(3), out=buf), ref)
