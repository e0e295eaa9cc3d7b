"""The gossip messages, the reduction step and the in-process loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flower_dp.gossip import Contribution, Share, reduce_contributions, run_iteration


class _ToyNode:
    """Push-sum consensus node on a fixed column-stochastic matrix (no gradients, no noise)."""

    def __init__(self, node_id: int, P: np.ndarray, x0: float) -> None:
        self.node_id, self.P = node_id, P
        self.x = torch.tensor([x0], dtype=torch.float64)
        self.w = 1.0

    def setup(self) -> None:
        pass

    def contribute(self, k):
        return {"S": Contribution(float(self.x[0]), "max")}

    def local_step(self, k, reduced=None):
        self.seen = reduced
        col = self.P[:, self.node_id]
        return [
            Share(self.node_id, r, k, {"x": self.x * col[r]}, weight=self.w * col[r], wire_bits=0 if r == self.node_id else 64)
            for r in np.flatnonzero(col)
        ]

    def mix(self, inbox):
        assert [s.sender for s in inbox] == sorted(s.sender for s in inbox)
        self.x = sum((s.tensors["x"] for s in inbox), torch.zeros(1, dtype=torch.float64))
        self.w = sum(s.weight for s in inbox)


# The 3-node non-regular digraph both Dyn-D2P and DP-CSGP are checked on.
P3 = np.array([[1 / 3, 0, 1 / 2], [1 / 3, 1 / 2, 0], [1 / 3, 1 / 2, 1 / 2]])


def test_three_node_fixture_weights_after_one_mix():
    """w after one mix = 0.8333, 0.8333, 1.3333."""
    nodes = [_ToyNode(i, P3, x0) for i, x0 in enumerate([1.0, 2.0, 3.0])]
    log = run_iteration(nodes, 0)
    np.testing.assert_allclose([n.w for n in nodes], [5 / 6, 5 / 6, 4 / 3], atol=1e-12)
    assert sum(n.w for n in nodes) == pytest.approx(3.0, abs=1e-12)
    assert log.bits_sent == {0: 128, 1: 64, 2: 64}
    assert log.reduced == {"S": 3.0}


def test_consensus_and_mass_conservation_and_order_independence():
    """x/w -> initial average; sum x and sum w conserved; node order does not change a bit."""
    x0 = [1.0, 2.0, 6.0]
    a = [_ToyNode(i, P3, v) for i, v in enumerate(x0)]
    b = [_ToyNode(i, P3, v) for i, v in enumerate(x0)]
    for k in range(200):
        run_iteration(a, k)
        run_iteration(b, k, order=[2, 0, 1])
        assert float(sum(n.x[0] for n in a)) == pytest.approx(9.0, abs=1e-9)
        assert sum(n.w for n in a) == pytest.approx(3.0, abs=1e-12)
    for na, nb in zip(a, b):
        assert torch.equal(na.x, nb.x) and na.w == nb.w
        assert float(na.x[0] / na.w) == pytest.approx(3.0, abs=1e-9)


def test_reduce_ops():
    """max, sum and max_pairwise_l1 reductions give the same dict to every node."""
    c = {
        0: {"m": Contribution(1.0, "max"), "s": Contribution(np.array([1.0, 2.0]), "sum"),
            "p": Contribution(np.array([0.0, 0.0]), "max_pairwise_l1")},
        1: {"m": Contribution(5.0, "max"), "s": Contribution(np.array([1.0, 1.0]), "sum"),
            "p": Contribution(np.array([1.0, -2.0]), "max_pairwise_l1")},
    }
    r = reduce_contributions(c)
    assert r["m"] == 5.0 and r["p"] == 3.0
    np.testing.assert_array_equal(r["s"], [2.0, 3.0])
    assert reduce_contributions({0: None, 1: None}) is None


def test_reduce_rejects_inconsistent_contributions():
    with pytest.raises(ValueError, match="nodes \\[1\\] contributed nothing"):
        reduce_contributions({0: {"m": Contribution(1.0)}, 1: None})
    with pytest.raises(ValueError, match="mixed ops"):
        reduce_contributions({0: {"m": Contribution(1.0, "max")}, 1: {"m": Contribution(1.0, "sum")}})


def test_routing_checked_against_topology():
    """A node that sends to someone other than its out-neighbours is caught, naming both lists."""
    nodes = [_ToyNode(i, P3, 1.0) for i in range(3)]
    with pytest.raises(ValueError, match="out-neighbours plus itself are"):
        run_iteration(nodes, 0, receivers=lambda i, k: [])
