"""PrivSGP-VR, PrivSGP, DP2-SGD, A(DP)2SGD (clients/privsgp_vr.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from flower_dp.clients import registry
from flower_dp.clients.privsgp_vr import adp2_matching
from flower_dp.topology import random_irregular, undirected_ring
from test_algorithms_common import cached_plan, logreg_data, make_nodes, run
from test_algorithms_dyn_d2p import _gap

torch.set_num_threads(1)

VR = dict(lr=0.1, batch_size=4, G=1.0, epsilon=2.0, delta=1e-4, accountant="rdp")


def _one_node(params, J=32, K=4, hook=None):
    topo = random_irregular(3, seed=0)
    parts, _ = logreg_data(3, J)
    return topo, make_nodes("privsgp_vr", params, topo, parts=parts, num_iters=K, plan_hook=hook)[1]


def test_vr_estimator_unbiased_over_the_sample_index():
    """For a fixed table and z, mean over blocks of g equals the full local gradient."""
    _, nodes = _one_node(VR)
    nd = nodes[0]
    z = nd.z() + 0.3 * torch.randn(nd.x.numel(), generator=torch.Generator().manual_seed(0))  # away from x0
    gs, hs = zip(*[nd.vr_gradient(z, j, 1.0, 0)[:2] for j in range(nd.n_blocks)])
    torch.testing.assert_close(torch.stack(gs).mean(0), torch.stack(hs).mean(0), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(gs[0], hs[0])  # the correction is really there


def test_zero_variance_right_after_setup():
    """7.8: with every table entry computed at the current z (after INIT at x0), g = full gradient for every block."""
    _, nodes = _one_node(VR)
    nd = nodes[0]
    full = nd.avg.float()
    for j in range(nd.n_blocks):
        torch.testing.assert_close(nd.vr_gradient(nd.z(), j, 1.0, 0)[0], full, rtol=1e-5, atol=1e-6)


def test_table_update_order_and_clean_table():
    """7.9-7.11: g uses the OLD entry and avg; then avg, table[blk] = h (no noise in the table)."""
    topo, nodes = _one_node(VR, K=6)
    nd = nodes[0]
    run(nodes, topo, 0, 2)  # move z away from x0
    k = 2
    from flower_dp.rng import numpy_rng

    blk = int(numpy_rng(nd.plan.seed, 0, "data", k).integers(nd.n_blocks))
    old_table, old_avg, x, z = nd.table.clone(), nd.avg.clone(), nd.x.clone(), nd.z()
    h, _ = nd.grad_mean(z, nd.blocks[blk], 4, 1.0, k)
    shares = nd.local_step(k)
    assert torch.equal(nd.table[blk], h)                                   # clean gradient stored
    others = [j for j in range(nd.n_blocks) if j != blk]
    assert torch.equal(nd.table[others], old_table[others])
    torch.testing.assert_close(nd.avg, old_avg + (h.double() - old_table[blk]) / nd.n_blocks)
    torch.testing.assert_close(nd.avg, nd.table.double().mean(0), rtol=1e-6, atol=1e-7)
    g_old = (h.double() - old_table[blk] + old_avg).float()
    noise = nd.gaussian(k, float(nd.plan.noise_std[0][k]), x.numel())
    x_half = x - 0.1 * (g_old + noise)
    self_w = topo.send_weights(0, k)[0]
    torch.testing.assert_close([s for s in shares if s.receiver == 0][0].tensors["x"], self_w * x_half)
    assert nd.privacy_report()["memory_bytes"] == nd.n_blocks * nd.x.numel() * 4 + nd.x.numel() * 8


def test_privsgp_full_batch_reduces_to_sgp():
    """PrivSGP, noise 0, clip inf, b = J == SGP with B = J (q = 1)."""
    topo = random_irregular(5, seed=8)
    parts, _ = logreg_data(5, 16)
    _, sgp = make_nodes("sgp", dict(lr=0.2, batch_size=16), topo, parts=parts, num_iters=5)
    _, ps = make_nodes("privsgp", dict(VR, lr=0.2, batch_size=16), topo, parts=parts, num_iters=5,
                       plan_hook=lambda p: registry.ablate(p))
    run(sgp, topo, 0, 5)
    run(ps, topo, 0, 5)
    for a, b in zip(sgp, ps):
        torch.testing.assert_close(a.x, b.x, rtol=1e-5, atol=1e-6)
        assert a.w == b.w


def test_dp2_sgd_is_dpsgd_and_refuses_directed_graphs():
    """DP2-SGD: x_{k+1} = W x_k - gamma g(x_k) (gradient at the pre-mix own model)."""
    topo = undirected_ring(4)
    parts, _ = logreg_data(4, 16)
    _, nodes = make_nodes("dp2_sgd", dict(VR, batch_size=16), topo, parts=parts, num_iters=3,
                          plan_hook=lambda p: registry.ablate(p))
    W = topo.matrix(0)
    for k in range(3):
        X = torch.stack([nd.x for nd in nodes]).double()
        G = torch.stack([nd.grad_mean(nd.x, nd.sample_poisson(k, 16), 16, math.inf, k)[0] for nd in nodes]).double()
        run(nodes, topo, k, k + 1)
        expect = torch.as_tensor(W) @ X - 0.1 * G
        torch.testing.assert_close(torch.stack([nd.x for nd in nodes]).double(), expect, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="doubly stochastic"):
        make_nodes("dp2_sgd", VR, random_irregular(4, seed=0), parts=parts, num_iters=2)


def test_adp2_matchings_and_run():
    for n in (2, 5, 6):
        t = adp2_matching(n)
        for k in range(4):
            P = t.matrix(k)
            np.testing.assert_allclose(P.sum(0), 1)
            np.testing.assert_allclose(P.sum(1), 1)
            assert all(len(t.out_neighbors(i, k)) <= 1 for i in range(n))
    base = undirected_ring(6)
    parts, _ = logreg_data(6, 16)
    plan = cached_plan("adp2_sgd", VR, n_nodes=6, samples_per_node=[16] * 6, num_iters=4, dim=12)
    topo = registry.topology_for(plan, base)
    _, nodes = make_nodes("adp2_sgd", VR, topo, parts=parts, num_iters=4)
    run(nodes, topo, 0, 4)
    assert all(nd.privacy_report()["steps_charged"] == 4 for nd in nodes)
    with pytest.raises(ValueError, match="adp2_matching"):
        make_nodes("adp2_sgd", VR, base, parts=parts, num_iters=4)


def test_k_star_and_heterogeneous_budgets():
    """K = round(K*) from eq. (12) (3120 at the paper's CIFAR-10 constants);
    heterogeneous budgets get their own sigma_i with one K."""
    from flower_dp.privacy import paper

    kw = dict(J=3125, n_nodes=16, A=1.0, L=1.0, d=100, G=10.0, c2=0.3724)
    k_star = paper.k_star_privsgp_vr(3.0, 1e-5, **kw)
    plan = registry.prepare("privsgp_vr", dict(VR, G=10.0, epsilon=[3.0, 1.0], delta=1e-5, c2=0.3724,
                                               calibration="paper", kstar_A=1.0, kstar_L=1.0),
                            n_nodes=2, samples_per_node=[3125, 3125], num_iters=10, dim=100, seed=0)
    k2 = paper.k_star_privsgp_vr([3.0, 1.0], 1e-5, **{**kw, "n_nodes": 2})
    assert plan.num_iters == round(k2) and k_star > 0
    s = [float(v[0]) for v in plan.noise_std]
    # eq. (11): sigma_i proportional to 1/eps_i at one K; independent of the block size b
    np.testing.assert_allclose(s[1] / s[0], 3.0, rtol=1e-9)
    np.testing.assert_allclose(s[0], paper.paper_sigma_privsgp_vr(3.0, 1e-5, num_iters=plan.num_iters, J=3125,
                                                                   G=10.0, c2=0.3724), rtol=1e-9)


def test_privsgp_vr_converges_and_degrades_with_eps():
    common = dict(lr=0.3, batch_size=4, G=2.0, delta=1e-4, accountant="rdp")
    big = _gap("privsgp_vr", dict(common, epsilon=50.0))
    small = _gap("privsgp_vr", dict(common, epsilon=0.5))
    assert big < 0.08, big
    assert small > big + 0.02, (small, big)
