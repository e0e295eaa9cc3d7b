"""Topologies: column-stochastic mixing, hop cycles, connectivity, push-sum behaviour."""

from __future__ import annotations

import numpy as np
import pytest

from flower_dp import topology as T

REGULAR = [
    T.exp_one_peer(20),
    T.exp_one_peer(2),
    T.exp_all_hops(10),
    T.d_out(10, 4),
    T.directed_ring(7),
    T.undirected_ring(6),
    T.complete(5),
    T.with_sync(T.d_out(10, 2), 5),
    T.make_topology("exp_two_peer", 10, sync_period=5),
    T.make_topology("d_out", 6, deg=1, sync_period=3),
]
IRREGULAR = [T.random_irregular(8, seed=s) for s in range(3)]
ALL = REGULAR + IRREGULAR


@pytest.mark.parametrize("topo", ALL, ids=lambda t: t.name)
def test_columns_sum_to_one_and_diagonal_positive(topo):
    for k in range(2 * topo.period):
        P = topo.matrix(k)
        np.testing.assert_allclose(P.sum(axis=0), 1.0, atol=1e-12)
        assert (np.diag(P) > 0).all() and (P >= 0).all()


@pytest.mark.parametrize("topo", ALL, ids=lambda t: t.name)
def test_receivers_view_equals_senders_view(topo):
    for k in range(topo.period):
        for i in range(topo.n):
            for r in topo.out_neighbors(i, k):
                assert i in topo.in_neighbors(r, k)
            for s in topo.in_neighbors(i, k):
                assert i in topo.out_neighbors(s, k)
            col = topo.matrix(k)[:, i]
            assert topo.send_weights(i, k) == {r: col[r] for r in np.flatnonzero(col)}
            assert sum(topo.send_weights(i, k).values()) == pytest.approx(1.0, abs=1e-12)


def test_exact_hop_cycle_n20():
    """Dyn-D2P / PrivSGP-VR: peer(i, k) = (i + 2^(k mod 5)) mod 20, hops [1, 2, 4, 8, 16]."""
    topo = T.exp_one_peer(20)
    assert topo.period == 5
    hops = [(topo.out_neighbors(0, k)[0] - 0) % 20 for k in range(10)]
    assert hops == [1, 2, 4, 8, 16] * 2
    assert topo.out_neighbors(19, 1) == [1]
    assert topo.matrix(3)[(3 + 8) % 20, 3] == 0.5 and topo.matrix(3)[3, 3] == 0.5


def test_all_hops_n10_and_d_out():
    assert T.exp_all_hops(10).out_neighbors(0, 0) == [1, 2, 4, 8]
    assert T.exp_all_hops(10).matrix(0)[1, 0] == pytest.approx(1 / 5)
    assert T.d_out(10, 4).out_neighbors(8, 0) == [0, 1, 9]
    np.testing.assert_allclose(T.d_out(10, 10).matrix(0), np.full((10, 10), 0.1))


def test_sync_rounds_are_complete_graph():
    topo = T.make_topology("d_out", 10, deg=2, sync_period=5)
    np.testing.assert_allclose(topo.matrix(4), np.full((10, 10), 0.1))
    assert topo.out_neighbors(0, 3) == [1]


@pytest.mark.parametrize("topo", ALL, ids=lambda t: t.name)
def test_union_strongly_connected(topo):
    T.check_strongly_connected(topo)


def _mix(topo, x, w, k):
    P = topo.matrix(k)
    return P @ x, P @ w


@pytest.mark.parametrize("topo", REGULAR, ids=lambda t: t.name)
def test_weights_stay_one_on_regular_graphs(topo):
    w = np.ones(topo.n)
    for k in range(3 * topo.period):
        _, w = _mix(topo, np.zeros(topo.n), w, k)
        assert np.array_equal(w, np.ones(topo.n))


@pytest.mark.parametrize("topo", IRREGULAR, ids=lambda t: t.name)
def test_weights_move_on_irregular_graphs(topo):
    _, w = _mix(topo, np.zeros(topo.n), np.ones(topo.n), 0)
    assert np.abs(w - 1).max() > 0.05
    assert w.sum() == pytest.approx(topo.n, abs=1e-12)


@pytest.mark.parametrize("topo", ALL, ids=lambda t: t.name)
def test_repeated_mixing_drives_ratio_to_average(topo):
    """Push-sum consensus: x/w -> the initial average on every graph type."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(topo.n, 3))
    avg = x.mean(axis=0)
    w = np.ones(topo.n)
    for k in range(400):
        x, w = _mix(topo, x, w, k)
    np.testing.assert_allclose(x / w[:, None], np.broadcast_to(avg, x.shape), atol=1e-8)


def test_three_node_fixture():
    """The 3-node fixture (Dyn-D2P and DP-CSGP's test matrix): w after one mix = 0.8333, 0.8333, 1.3333."""
    P = np.array([[1 / 3, 0, 1 / 2], [1 / 3, 1 / 2, 0], [1 / 3, 1 / 2, 1 / 2]])
    topo = T.from_matrix(P)
    assert not topo.doubly_stochastic
    np.testing.assert_allclose(topo.matrix(0) @ np.ones(3), [0.8333333333, 0.8333333333, 1.3333333333], atol=1e-9)


def test_callable_time_varying_and_n1_n2():
    A = np.array([[0.5, 0.0], [0.5, 1.0]])
    B = np.array([[1.0, 0.5], [0.0, 0.5]])
    topo = T.from_matrix(lambda k: A if k % 2 == 0 else B, period=2)
    assert topo.out_neighbors(0, 0) == [1] and topo.out_neighbors(0, 1) == []
    assert T.exp_one_peer(1).matrix(0).tolist() == [[1.0]]
    assert T.exp_one_peer(2).out_neighbors(0, 7) == [1]


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: T.from_matrix(np.array([[1.2, 0.5], [-0.2, 0.5]])), "non-negative weights, got P\\[1, 0\\] = -0.2"),
        (lambda: T.from_matrix(np.array([[0.6, 0.5], [0.5, 0.5]])), "column-stochastic .* column 0 summing to 1.1"),
        (lambda: T.from_matrix(np.array([[0.0, 0.5], [1.0, 0.5]])), "positive diagonal"),
        (lambda: T.from_matrix(np.eye(3)), "not strongly connected"),
        (lambda: T.exp_one_peer(0), "n must be >= 1, got 0"),
        (lambda: T.d_out(5, 6), "deg must be in \\[1, n\\] = \\[1, 5\\]"),
        (lambda: T.d_out(5, 0), "deg must be >= 1, got 0"),
        (lambda: T.make_topology("torus", 4), "unknown topology 'torus'; valid choices"),
        (lambda: T.validate_mixing_matrix(np.ones((2, 3)) / 2), "square \\(n, n\\) matrix"),
    ],
)
def test_bad_topologies_raise_clear_errors(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_doubly_stochastic_required_error():
    P = np.array([[1 / 3, 0, 1 / 2], [1 / 3, 1 / 2, 0], [1 / 3, 1 / 2, 1 / 2]])
    with pytest.raises(ValueError, match="doubly stochastic"):
        T.validate_mixing_matrix(P, doubly_stochastic=True)


def test_exp_two_peer_is_dpps_exp_graph():
    """DPPS's EXP graph (Remark 2): N = 10 -> B = 4, node i sends to itself and i + 2^(t mod 4), weight 1/2."""
    two, one = T.exp_two_peer(10), T.exp_one_peer(10)
    assert two.period == 4 and two.doubly_stochastic and two.name == "exp_two_peer"
    for k in range(8):
        np.testing.assert_array_equal(two.matrix(k), one.matrix(k))
        assert two.send_weights(3, k) == {3: 0.5, (3 + 2 ** (k % 4)) % 10: 0.5}
    assert T.make_topology("exp_two_peer", 10).name == "exp_two_peer"


@pytest.mark.parametrize("n, m", [(2, 1), (3, 2), (4, 2), (5, 3), (9, 4), (16, 4), (17, 5), (20, 5), (33, 6)])
def test_hop_count_integer_arithmetic(n, m):
    """m = floor(log2(n - 1)) + 1; n = 16 -> m = 4, one message in per node."""
    topo = T.exp_one_peer(n)
    assert topo.period == m
    assert T.exp_all_hops(n).out_neighbors(0, 0) == sorted({2**e % n for e in range(m)})
    for k in range(m):
        assert all(len(topo.in_neighbors(i, k)) == 1 for i in range(n))


@pytest.mark.parametrize(
    "build", [T.exp_one_peer, T.exp_two_peer, T.exp_all_hops, T.directed_ring, T.undirected_ring, T.complete,
              lambda n: T.d_out(n, 1), lambda n: T.with_sync(T.exp_one_peer(n), 3)]
)
def test_single_node_is_identity(build):
    """n = 1 means no communication: P = [[1]], no neighbours."""
    topo = build(1)
    assert topo.n == 1 and topo.matrix(0).tolist() == [[1.0]] and topo.matrix(7).tolist() == [[1.0]]
    assert topo.out_neighbors(0, 0) == [] and topo.send_weights(0, 3) == {0: 1.0}


@pytest.mark.parametrize("topo", ALL + [T.from_matrix(np.array([[0.5, 0.5], [0.5, 0.5]]))], ids=lambda t: t.name)
def test_topologies_pickle(topo):
    """Plain pickle works (process backends); the copy gives the same matrices."""
    import pickle

    copy = pickle.loads(pickle.dumps(topo))
    assert (copy.n, copy.name, copy.period, copy.doubly_stochastic) == (topo.n, topo.name, topo.period,
                                                                        topo.doubly_stochastic)
    for k in range(topo.period + 1):
        np.testing.assert_array_equal(copy.matrix(k), topo.matrix(k))


def test_pickled_topology_leaves_its_cache_and_is_shared_per_process():
    """A pickle carries no matrices (exp, n = 256: 8 dense phases filled by the connectivity check), and the
    copies unpickled in one process are one object (n node factories on a host actor: one matrix cache)."""
    import pickle

    topo = T.make_topology("exp", 256)  # checked: every phase is in the cache
    blob = pickle.dumps(topo)
    assert len(blob) < 1000
    a, b = pickle.loads(blob), pickle.loads(pickle.dumps(topo))
    assert a is b and a is not topo
    np.testing.assert_array_equal(a.matrix(3), topo.matrix(3))
    other = pickle.loads(pickle.dumps(T.make_topology("exp", 128)))
    assert other is not a and other.n == 128
    lam = T.Topology(2, "lambda", lambda k: np.full((2, 2), 0.5))  # not plainly picklable: copies stay apart
    import ray.cloudpickle as cp

    assert cp.loads(cp.dumps(lam)) is not cp.loads(cp.dumps(lam))


@pytest.mark.parametrize("n", range(3, 10))
def test_random_irregular_properties_many_seeds(n):
    """Fixture (c): strongly connected, unequal out-degrees, rows NOT all 1, deterministic in (n, seed)."""
    for seed in range(15):
        topo = T.random_irregular(n, seed=seed)
        P = topo.matrix(0)
        degs = {len(topo.out_neighbors(i, 0)) for i in range(n)}
        assert len(degs) > 1 and not topo.doubly_stochastic
        assert np.abs(P.sum(axis=1) - 1).max() > 1e-3
        T.check_strongly_connected(topo)
        np.testing.assert_array_equal(P, T.random_irregular(n, seed=seed).matrix(0))
    # p = 0 (ring only) and p = 1 (complete) are regular before the fix-up; still irregular after it
    for p in (0.0, 1.0):
        topo = T.random_irregular(n, seed=0, p=p)
        assert len({len(topo.out_neighbors(i, 0)) for i in range(n)}) > 1


def test_privsgp_vr_time_varying_fixture():
    """PrivSGP-VR's time-varying graph: node 0 pushes to 2 peers with 1/3, others to 1 peer with 1/2.

    w drifts from 1 and sum(w) == n, but z = x/w converges to the initial average; x alone does not."""
    n = 5

    def P_of(k):
        P = np.zeros((n, n))
        hop = 1 + k % 2
        P[0, 0] = P[hop, 0] = P[(hop + 1) % n, 0] = 1 / 3
        for j in range(1, n):
            P[j, j] = P[(j + hop) % n, j] = 0.5
        return P

    topo = T.from_matrix(P_of, period=2, name="privsgp_fixture")
    assert not topo.doubly_stochastic and topo.out_neighbors(0, 0) == [1, 2] and topo.out_neighbors(0, 1) == [2, 3]
    x0 = np.arange(n, dtype=float) ** 2
    x, w = x0.copy(), np.ones(n)
    for k in range(300):
        x, w = _mix(topo, x, w, k)
        assert w.sum() == pytest.approx(n, abs=1e-12) and (w > 0).all()
    assert np.abs(w - 1).max() > 0.05
    np.testing.assert_allclose(x / w, x0.mean(), atol=1e-10)
    assert np.abs(x - x0.mean()).max() > 0.1


def test_one_out_needs_sync_rounds():
    """DPPS Fig. 4 "1-Out": self-loops only, connected only through sync rounds."""
    with pytest.raises(ValueError, match="not strongly connected"):
        T.make_topology("d_out", 6, deg=1)
    topo = T.make_topology("d_out", 6, deg=1, sync_period=4)
    assert topo.period == 4 and topo.out_neighbors(2, 0) == [] and topo.out_neighbors(2, 3) == [0, 1, 3, 4, 5]


def test_sync_period_is_lcm_and_b_connectivity_window():
    topo = T.with_sync(T.exp_one_peer(10), 5)
    assert topo.period == 20 and topo.doubly_stochastic and not topo.static
    np.testing.assert_array_equal(topo.matrix(6), T.exp_one_peer(10).matrix(6))
    np.testing.assert_allclose(topo.matrix(9), np.full((10, 10), 0.1))
    # one-peer exponential graph: each single P^k is not strongly connected; the union over a period is
    with pytest.raises(ValueError, match="window of 1 iterations"):
        T.check_strongly_connected(T.exp_one_peer(10), window=1)
    T.check_strongly_connected(T.exp_one_peer(10), window=4)
    # a user sequence that is disconnected at k = 0 but connected over its period is accepted
    topo = T.from_matrix(lambda k: np.eye(2) if k == 0 else np.full((2, 2), 0.5), period=2)
    assert topo.out_neighbors(0, 0) == [] and topo.out_neighbors(0, 1) == [1]


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: T.random_irregular(2), "random_irregular needs n >= 3 nodes.*got 2"),
        (lambda: T.random_irregular(5, p=1.5), "p \\(extra-edge probability\\) must be in \\[0, 1\\], got 1.5"),
        (lambda: T.exp_one_peer(4).out_neighbors(4, 0), "node id must be <= 3, got 4"),
        (lambda: T.from_matrix(np.array([[np.nan, 0.5], [0.5, 0.5]])), "must be finite"),
        (lambda: T.from_matrix(lambda k: np.eye(2), period=3), "not strongly connected over a window of 3"),
        (lambda: T.make_topology("d_out", 4, degree=2), "bad arguments \\{'degree': 2\\} for topology 'd_out'"),
        (lambda: T.with_sync(T.complete(3), -1), "sync_period must be >= 0, got -1"),
        (lambda: T.from_matrix(np.full((2, 2), 0.5), period=0), "period must be >= 1, got 0"),
    ],
)
def test_more_errors(build, match):
    with pytest.raises(ValueError, match=match):
        build()
