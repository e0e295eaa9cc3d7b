"""Issue 4: every private algorithm on the small convex problem (logistic regression, 8 nodes).

The per-paper files test SGP, Dyn-D2P (``dyn``), PrivSGP-VR, DP-CSGP and SGPDP; this file covers
the remaining variants and baselines: Dyn[C]-D2P, Const-D2P, PrivSGP, DP2-SGD, A(DP)2SGD and
PEDFL.  Each one converges near the pooled optimum with a large budget and is measurably worse
with a small one.  Also: PrivSGP-VR with a single block reduces to SGP, and
the A(DP)2SGD topology pickles (process backends).
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from flower_dp.clients import registry
from flower_dp.clients.privsgp_vr import adp2_matching
from flower_dp.topology import d_out, random_irregular, undirected_ring
from test_algorithms_common import logreg_data, make_nodes, run
from test_algorithms_dyn_d2p import _gap

torch.set_num_threads(1)

_C = dict(lr=0.3, batch_size=16, delta=1e-4, accountant="rdp")

#: name -> (algorithm, params, privacy knob, (large, small), topology builder)
CASES = {
    "dyn_c_d2p": ("dyn_d2p", dict(_C, variant="dyn_c", clip0=4.0, rho_c=2.0), "epsilon", (50.0, 0.5), None),
    "const_d2p": ("dyn_d2p", dict(_C, variant="const", clip_bar=2.0), "epsilon", (50.0, 0.5), None),
    "privsgp": ("privsgp", dict(_C, batch_size=4, G=2.0), "epsilon", (50.0, 0.5), None),
    "dp2_sgd": ("dp2_sgd", dict(_C, G=2.0), "epsilon", (50.0, 0.5), lambda: undirected_ring(8)),
    "adp2_sgd": ("adp2_sgd", dict(_C, G=2.0), "epsilon", (50.0, 0.5), lambda: adp2_matching(8)),
    # PEDFL's privacy knob is b (per-round eps = b / gamma_n); its oracle sensitivity feeds back
    # into the noise, so small b degrades fast (b = 0.15 already diverges here).
    "pedfl": ("pedfl", dict(lr=0.3, batch_size=16, gamma_n=1e-2, sync_period=0), "b", (1e4, 0.2),
              lambda: d_out(8, 3)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_converges_with_large_budget_and_degrades_with_small(case):
    algorithm, params, knob, (large, small), topo_fn = CASES[case]
    big = _gap(algorithm, dict(params, **{knob: large}), topo_fn=topo_fn, seeds=(0,))
    # the small budget's gap is a noisy quantity (12 coordinates, the last iterations' noise dominate): over one noise
    # realization it ranged 0.03-0.35 (8 streams, const_d2p), so its mean over 4 seeds is compared
    worse = _gap(algorithm, dict(params, **{knob: small}), topo_fn=topo_fn, seeds=(0, 1, 2, 3))
    assert big < 0.08, big
    assert np.isfinite(worse) and worse > big + 0.02, (worse, big)


def test_privsgp_vr_single_block_reduces_to_sgp():
    """PrivSGP-VR with b = J (one block: g = h - T[0] + avg = h), noise 0 and clip inf
    is SGP with B = J (q = 1); only the summation order of the batch differs."""
    topo = random_irregular(5, seed=8)
    parts, _ = logreg_data(5, 16)
    _, sgp = make_nodes("sgp", dict(lr=0.2, batch_size=16), topo, parts=parts, num_iters=5)
    _, vr = make_nodes("privsgp_vr", dict(lr=0.2, batch_size=16, G=1.0, epsilon=2.0, delta=1e-4, accountant="rdp"),
                       topo, parts=parts, num_iters=5, plan_hook=lambda p: registry.ablate(p))
    assert all(nd.n_blocks == 1 for nd in vr)
    run(sgp, topo, 0, 5)
    run(vr, topo, 0, 5)
    for a, b in zip(sgp, vr):
        torch.testing.assert_close(a.x, b.x, rtol=1e-5, atol=1e-6)
        assert a.w == b.w
    assert all(nd.privacy_report()["steps_charged"] == 0 for nd in vr)


def test_adp2_matching_topology_pickles():
    """Topologies cross process boundaries (Ray hosts); the A(DP)2SGD matchings must too."""
    for n in (1, 2, 5, 8):
        topo = adp2_matching(n)
        copy = pickle.loads(pickle.dumps(topo))
        for k in range(4):
            np.testing.assert_array_equal(copy.matrix(k), topo.matrix(k))


def test_variance_reduction_wins_once_the_table_is_revisited():
    """The diagnostic behind PrivSGP-VR Fig. 9 (issue 15): on the convex problem, without noise and with a constant
    step, SAGA's table removes the sampling variance, so after many passes over the J / b blocks PrivSGP-VR ends far
    nearer the optimum than PrivSGP (measured: 9.0e-5 vs 2.9e-3 at b = 1, K = 800, 12.5 passes); after about 3 passes
    (K = 200) there is none yet (7.84e-3 vs 7.85e-3 over two seeds), as in Fig. 9 at the paper's setting does (1.9 passes)."""
    p = dict(lr=0.3, batch_size=1, G=100.0, noise_std=0.0, delta=1e-4)
    vr = _gap("privsgp_vr", p, num_iters=800, seeds=(0,))
    no_vr = _gap("privsgp", p, num_iters=800, seeds=(0,))
    assert vr < 0.1 * no_vr, (vr, no_vr)
    vr_short = _gap("privsgp_vr", p, num_iters=200, seeds=(0,))
    no_vr_short = _gap("privsgp", p, num_iters=200, seeds=(0,))
    assert vr_short > 0.5 * no_vr_short, (vr_short, no_vr_short)  # no real advantage yet (block draws are secret)
