"""DP-CSGP (clients/dp_csgp.py): a 3-node test vector, the SGP reduction, exact bits."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from flower_dp.clients import registry
from flower_dp.mechanisms.compressors import make_compressor
from flower_dp.topology import exp_one_peer, random_irregular, undirected_ring
from test_algorithms_common import logreg_data, make_nodes, run
from test_algorithms_dyn_d2p import _gap, point_nodes

torch.set_num_threads(1)

B3 = torch.tensor([[1.0, 0.0], [0.0, 2.0], [-1.0, 1.0]])  # the 3-node fixture's targets b_i
NO_DP = dict(lr=0.1, batch_size=1, compressor="identity", accountant="rdp")


def test_spec_test_vector_7_4():
    """3-node test vector: identity Q, eta = 0.1, sigma = 0, no clipping; t = k + 1, x^{t+1} is our x_half."""
    topo, nodes = point_nodes("dp_csgp", NO_DP, B3, 3, plan_hook=lambda p: registry.ablate(p))
    np.testing.assert_allclose([n.w for n in nodes], [0.83333333, 0.83333333, 1.33333333], atol=1e-8)  # y^2
    run(nodes, topo, 0, 1)
    np.testing.assert_allclose(torch.stack([n.x_half for n in nodes]), [[0.1, 0], [0, 0.2], [-0.1, 0.1]], atol=1e-7)
    np.testing.assert_allclose(torch.stack([n.x for n in nodes]),                                       # w^3
                               [[-0.01666667, 0.05], [0.03333333, 0.1], [-0.01666667, 0.15]], atol=1e-7)
    np.testing.assert_allclose([n.w for n in nodes], [0.94444444, 0.69444444, 1.36111111], atol=1e-8)  # y^3
    np.testing.assert_allclose(torch.stack([n.z() for n in nodes]),
                               [[-0.01764706, 0.05294118], [0.048, 0.144], [-0.0122449, 0.11020408]], atol=1e-7)
    run(nodes, topo, 1, 2)
    np.testing.assert_allclose(torch.stack([n.x_half for n in nodes]),                                  # x^3
                               [[0.08509804, 0.04470588], [0.02853333, 0.2856], [-0.11544218, 0.23897959]], atol=1e-7)
    np.testing.assert_allclose([n.w for n in nodes], [0.99537037, 0.66203704, 1.34259259], atol=1e-8)  # y^4
    run(nodes, topo, 2, 3)
    np.testing.assert_allclose(torch.stack([n.x_half for n in nodes]),                                  # x^4
                               [[0.07359409, 0.12089007], [0.03619306, 0.33388125], [-0.11396458, 0.35654575]],
                               atol=1e-6)
    np.testing.assert_allclose(sum(n.x_half for n in nodes), [-0.00417744, 0.81131707], atol=1e-6)


def test_identity_gamma_one_equals_sgp_from_row_sums():
    """Q = identity, gamma_c = 1 == SGP started from (r_i x0, r_i), r = row sums of P."""
    topo = random_irregular(6, seed=5)
    parts, _ = logreg_data(6, 32)
    K = 6
    _, sgp = make_nodes("sgp", dict(lr=0.2, batch_size=8), topo, parts=parts, num_iters=K)
    _, cs = make_nodes("dp_csgp", dict(lr=0.2, batch_size=8, compressor="identity", accountant="rdp"), topo,
                       parts=parts, num_iters=K, plan_hook=lambda p: registry.ablate(p))
    r = topo.matrix(0).sum(1)
    for nd in sgp:
        nd.x, nd.w = float(r[nd.node_id]) * nd.x, float(r[nd.node_id])
    run(sgp, topo, 0, K)
    run(cs, topo, 0, K)
    for a, b in zip(sgp, cs):
        torch.testing.assert_close(a.x, b.x, rtol=1e-5, atol=1e-6)
        assert abs(a.w - b.w) < 1e-12


def test_prelude_off_is_plain_sgp():
    """prelude_mix=False gives plain SGP (x_hat starts at 0)."""
    topo = random_irregular(5, seed=6)
    parts, _ = logreg_data(5, 32)
    _, sgp = make_nodes("sgp", dict(lr=0.2, batch_size=8), topo, parts=parts, num_iters=5)
    _, cs = make_nodes("dp_csgp", dict(lr=0.2, batch_size=8, prelude_mix=False, accountant="rdp"), topo,
                       parts=parts, num_iters=5, plan_hook=lambda p: registry.ablate(p))
    run(sgp, topo, 0, 5)
    run(cs, topo, 0, 5)
    for a, b in zip(sgp, cs):
        torch.testing.assert_close(a.x, b.x, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("compressor", ["identity", "rand_0.5", "gsgd_8", "topk_0.25"])
def test_bits_equal_compressor_formula_times_messages(compressor):
    """Bits per node per iteration = outdeg x (payload + 32); self-shares free."""
    topo = random_irregular(6, seed=7)
    parts, _ = logreg_data(6, 32)
    params = dict(lr=0.1, batch_size=8, G=1.0, compressor=compressor, epsilon=2.0, delta=1e-4, accountant="rdp")
    if compressor == "rand_0.5":
        params["gamma_c"] = 0.5
    _, nodes = make_nodes("dp_csgp", params, topo, parts=parts, num_iters=3)
    d = nodes[0].x.numel()
    payload = make_compressor(compressor).bits(d)
    expected = {"identity": 32 * d, "rand_0.5": 32 * math.floor(0.5 * d), "gsgd_8": 8 * d + 32,
                "topk_0.25": math.floor(0.25 * d) * (32 + math.ceil(math.log2(d)))}[compressor]
    assert payload == expected
    for k in range(3):
        outs = {nd.node_id: nd.local_step(k) for nd in nodes}
        for i, shares in outs.items():
            outdeg = len(topo.out_neighbors(i, k))
            assert sum(s.wire_bits for s in shares) == outdeg * (payload + 32)
            assert [s.wire_bits for s in shares if s.receiver == i] == [0]
            assert nodes[i].last_metrics()["bits_sent"] == outdeg * (payload + 32)
        from flower_dp.gossip import route_shares

        inbox = route_shares(outs, list(range(6)))
        for nd in nodes:
            nd.mix(inbox[nd.node_id])


def test_identity_communication_matches_dp_sgp_numbers():
    """DP-SGP (identity) 32 d + 32 per message; DP2-SGD 32 d per message, no weight."""
    topo = undirected_ring(4)
    parts, _ = logreg_data(4, 32)
    _, cs = make_nodes("dp_csgp", dict(NO_DP, batch_size=8), topo, parts=parts, num_iters=1)
    _, dp2 = make_nodes("dp2_sgd", dict(lr=0.1, batch_size=8, G=1.0, epsilon=2.0, delta=1e-4, accountant="rdp"),
                        topo, parts=parts, num_iters=1)
    d = cs[0].x.numel()
    assert [s.wire_bits for s in cs[0].local_step(0) if s.receiver != 0] == [32 * d + 32] * 2
    sh = [s for s in dp2[0].local_step(0) if s.receiver != 0]
    assert [s.wire_bits for s in sh] == [32 * d] * 2 and sh[0].weight is None


def test_refuses_time_varying_graph():
    parts, _ = logreg_data(4, 16)
    with pytest.raises(ValueError, match="static topology"):
        make_nodes("dp_csgp", dict(NO_DP, batch_size=4), exp_one_peer(4), parts=parts, num_iters=2)


def test_dp_csgp_converges_and_degrades_with_eps():
    common = dict(lr=0.3, batch_size=16, G=1.0, delta=1e-4, compressor="rand_0.75", accountant="rdp")
    big = _gap("dp_csgp", dict(common, epsilon=50.0))
    small = _gap("dp_csgp", dict(common, epsilon=0.5), seeds=(0, 1, 2, 3))  # a noisy gap: its mean over 4 seeds
    assert big < 0.08, big
    assert small > big + 0.02, (small, big)


def test_dp2_sgd_baseline_gets_the_same_noise_and_eps():
    """DP2SGD runs with the same G, sigma (same calibration), B and T, so only the
    communication differs (32 d per message, no weight, vs 32 d + 32 for DP-CSGP with identity)."""
    sizes = dict(n_nodes=4, samples_per_node=[500] * 4, num_iters=200, dim=50, seed=0)
    common = dict(lr=0.1, batch_size=16, G=1.5, epsilon=3.0, delta=1e-4, accountant="rdp")
    cs = registry.prepare("dp_csgp", dict(common, compressor="identity"), **sizes)
    dp2 = registry.prepare("dp2_sgd", common, **sizes)
    assert cs.q == dp2.q == (16 / 500,) * 4
    np.testing.assert_allclose(cs.noise_std[0], dp2.noise_std[0], rtol=1e-9)
    np.testing.assert_allclose(cs.noise_multiplier[0], dp2.noise_multiplier[0], rtol=1e-9)
    assert cs.eps_rigorous[0] == pytest.approx(dp2.eps_rigorous[0], rel=1e-9) and cs.eps_rigorous[0] <= 3.0
