"""Topologies: column-stochastic mixing, hop cycles, connectivity, push-sum behaviour (COMMON.md 3 and 5)."""

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
    """COMMON.md 3 (a): w after one mix = 0.8333, 0.8333, 1.3333."""
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
