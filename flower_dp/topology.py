"""Directed (time-varying) communication graphs and their push-sum mixing matrices.

Convention (COMMON.md section 1, STYLE.md 2.8): ``P[i, j]`` is the weight that sender
``j`` puts on receiver ``i`` at iteration ``k``.  Push-sum needs column sums of 1
(``1^T P^k = 1^T``) and a positive diagonal.  Default weights: sender ``j`` splits
uniformly over itself and its out-neighbours, ``P[i, j] = 1 / (1 + outdeg_j)``.

Every topology is a deterministic function of ``k`` so that every node knows its in-
and out-neighbours without talking to anyone.  Constructors are pure functions of
``(n, ...)`` and use integer arithmetic for powers of two.

Example (``exp_one_peer(4)``, k = 0: every node sends half to the next node)::

    0 -> 1 -> 2 -> 3 -> 0        P^0 = 1/2 (I + shift by 1)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ._checks import check_int

__all__ = [
    "Topology",
    "exp_one_peer",
    "exp_all_hops",
    "d_out",
    "directed_ring",
    "undirected_ring",
    "complete",
    "random_irregular",
    "from_matrix",
    "with_sync",
    "make_topology",
    "TOPOLOGIES",
    "validate_mixing_matrix",
    "check_strongly_connected",
]

_TOL = 1e-12


def validate_mixing_matrix(P: np.ndarray, *, doubly_stochastic: bool = False, name: str = "P") -> np.ndarray:
    """Check a push-sum mixing matrix; return it as float64.

    Raises ``ValueError`` naming the first offending column or entry when ``P`` is not
    square, has negative entries, a zero diagonal entry, or a column that does not sum
    to 1 (tolerance 1e-12); with ``doubly_stochastic`` rows must sum to 1 too.
    """
    P = np.asarray(P, dtype=np.float64)
    if P.ndim != 2 or P.shape[0] != P.shape[1] or P.shape[0] < 1:
        raise ValueError(f"{name} must be a square (n, n) matrix with n >= 1, got shape {P.shape}")
    if not np.all(np.isfinite(P)):
        raise ValueError(f"{name} must be finite, got NaN/inf entries")
    if (P < 0).any():
        i, j = np.argwhere(P < 0)[0]
        raise ValueError(f"{name} must have non-negative weights, got {name}[{i}, {j}] = {P[i, j]}")
    diag = np.diag(P)
    if (diag <= 0).any():
        i = int(np.flatnonzero(diag <= 0)[0])
        raise ValueError(
            f"{name} must have a positive diagonal (every node keeps part of its own value), got {name}[{i}, {i}] = {diag[i]}"
        )
    cols = P.sum(axis=0)
    bad = np.flatnonzero(np.abs(cols - 1) > _TOL)
    if bad.size:
        j = int(bad[0])
        raise ValueError(
            f"{name} must be column-stochastic (each sender's weights sum to 1), got column {j} summing to "
            f"{float(cols[j])!r}; normalise each column by the sender's total weight"
        )
    if doubly_stochastic:
        rows = P.sum(axis=1)
        bad = np.flatnonzero(np.abs(rows - 1) > _TOL)
        if bad.size:
            raise ValueError(
                f"{name} must be doubly stochastic for this algorithm, got row {int(bad[0])} summing to {float(rows[bad[0]])!r}; "
                "use a circulant graph (d_out, exp_one_peer, complete, rings)"
            )
    return P


def _reachable_all(adj: np.ndarray) -> bool:
    """True if the directed graph with adjacency ``adj[receiver, sender] > 0`` is strongly connected."""
    n = adj.shape[0]
    a = adj > 0
    for mat in (a, a.T):
        seen = np.zeros(n, dtype=bool)
        seen[0] = True
        frontier = [0]
        while frontier:
            j = frontier.pop()
            for i in np.flatnonzero(mat[:, j]):
                if not seen[i]:
                    seen[i] = True
                    frontier.append(int(i))
        if not seen.all():
            return False
    return True


@dataclass(frozen=True)
class Topology:
    """A sequence of mixing matrices ``P^k``, periodic in ``k``.

    Parameters
    ----------
    n : int
        Number of nodes.
    name : str
        Registry name (recorded in results).
    matrix_fn : callable k -> ndarray (n, n)
        The mixing matrix at iteration ``k`` (``P[receiver, sender]``), float64.
    period : int
        ``P^(k + period) == P^k``; 1 for a static graph.
    doubly_stochastic : bool
        Rows also sum to 1 at every ``k`` (push-sum weights then stay exactly 1).
    """

    n: int
    name: str
    matrix_fn: Callable[[int], np.ndarray] = field(repr=False)
    period: int = 1
    doubly_stochastic: bool = False
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def static(self) -> bool:
        return self.period == 1

    def matrix(self, k: int) -> np.ndarray:
        """``P^k`` as a read-only (n, n) float64 array."""
        key = int(k) % self.period
        P = self._cache.get(key)
        if P is None:
            P = validate_mixing_matrix(self.matrix_fn(key), doubly_stochastic=self.doubly_stochastic, name=f"P^{key}")
            if P.shape != (self.n, self.n):
                raise ValueError(f"{self.name}: P^{key} must have shape ({self.n}, {self.n}), got {P.shape}")
            P.setflags(write=False)
            self._cache[key] = P
        return P

    def out_neighbors(self, i: int, k: int) -> list[int]:
        """Receivers of node ``i`` at ``k`` (sorted, ``i`` itself excluded)."""
        col = self.matrix(k)[:, i]
        return [int(r) for r in np.flatnonzero(col) if r != i]

    def in_neighbors(self, i: int, k: int) -> list[int]:
        """Senders to node ``i`` at ``k`` (sorted, ``i`` itself excluded)."""
        row = self.matrix(k)[i, :]
        return [int(s) for s in np.flatnonzero(row) if s != i]

    def send_weights(self, i: int, k: int) -> dict[int, float]:
        """``{receiver: P^k[receiver, i]}`` for node ``i``'s outbox, including itself."""
        col = self.matrix(k)[:, i]
        return {int(r): float(col[r]) for r in np.flatnonzero(col)}


def _check_n(n: int, minimum: int = 1) -> int:
    return check_int("n", n, minimum=minimum)


def _num_hops(n: int) -> int:
    """m = floor(log2(n - 1)) + 1 computed with integers; 1 for n <= 2."""
    return max(1, (n - 1).bit_length())


def _uniform_from_out(n: int, outs: list[list[int]]) -> np.ndarray:
    """Column-stochastic matrix where sender j splits 1/(1 + |outs[j]|) over itself and outs[j]."""
    P = np.zeros((n, n))
    for j, targets in enumerate(outs):
        ts = sorted(set(int(t) % n for t in targets) - {j})
        w = 1.0 / (1 + len(ts))
        P[j, j] = w
        for t in ts:
            P[t, j] = w
    return P


def exp_one_peer(n: int) -> Topology:
    """Time-varying directed exponential graph, one peer per iteration (Dyn-D2P, PrivSGP-VR, DPPS "EXP":
    two out-neighbours counting the node itself, weight 1/2 each).

    Node ``i`` sends half of its value to ``(i + 2^(k mod m)) mod n`` and keeps half,
    ``m = floor(log2(n - 1)) + 1`` (n = 20: hops 1, 2, 4, 8, 16).  Doubly stochastic.
    ``n = 1`` gives the single-node graph ``P = [[1]]``.
    """
    n = _check_n(n)
    if n == 1:
        return from_matrix(np.ones((1, 1)), name="exp_one_peer")
    m = _num_hops(n)
    return Topology(
        n,
        "exp_one_peer",
        lambda k: _uniform_from_out(n, [[i + (1 << (k % m))] for i in range(n)]),
        period=m,
        doubly_stochastic=True,
    )


def exp_all_hops(n: int) -> Topology:
    """Static directed exponential graph with all hops 1, 2, 4, ... (DP-CSGP); weight 1/(1 + outdeg)."""
    n = _check_n(n)
    if n == 1:
        return from_matrix(np.ones((1, 1)), name="exp_all_hops")
    m = _num_hops(n)
    P = _uniform_from_out(n, [[i + (1 << e) for e in range(m)] for i in range(n)])
    return Topology(n, "exp_all_hops", lambda k: P, doubly_stochastic=bool(np.allclose(P.sum(1), 1, atol=_TOL)))


def d_out(n: int, deg: int) -> Topology:
    """DPPS's circulant "d-Out" graph: node i sends to i + e, e = 0..deg-1 (itself included), weight 1/deg.

    ``deg = 2`` is the directed ring, ``deg = n`` the complete graph.
    """
    n = _check_n(n)
    deg = check_int("deg", deg, minimum=1)
    if deg > n:
        raise ValueError(f"deg must be in [1, n] = [1, {n}] (it counts the node itself), got {deg}")
    P = _uniform_from_out(n, [[i + e for e in range(1, deg)] for i in range(n)])
    return Topology(n, f"d_out_{deg}", lambda k: P, doubly_stochastic=True)


def directed_ring(n: int) -> Topology:
    """Static directed ring i -> i + 1, weights 1/2 self, 1/2 next."""
    return _renamed(d_out(_check_n(n), min(2, n)), "directed_ring")


def undirected_ring(n: int) -> Topology:
    """Undirected ring: 1/3 self, 1/3 left, 1/3 right (n = 2: 1/2-1/2)."""
    n = _check_n(n)
    P = _uniform_from_out(n, [[i - 1, i + 1] for i in range(n)])
    return Topology(n, "undirected_ring", lambda k: P, doubly_stochastic=True)


def complete(n: int) -> Topology:
    """Complete graph with uniform weights 1/n."""
    n = _check_n(n)
    return _renamed(d_out(n, n), "complete")


def random_irregular(n: int, *, seed: int = 0, p: float = 0.3) -> Topology:
    """A seeded random strongly connected directed graph with unequal out-degrees.

    A directed ring guarantees strong connectivity; each other edge is added with
    probability ``p``; node 0 gets one extra edge so out-degrees are never all equal.
    Weights ``1/(1 + outdeg_j)``: columns sum to 1 but rows do not, so push-sum
    weights really move (the graph that exercises de-biasing).
    """
    n = _check_n(n, 3)
    rng = np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=(n,)))
    outs = [{(i + 1) % n} for i in range(n)]
    for i in range(n):
        for j in range(n):
            if j != i and rng.random() < p:
                outs[i].add(j)
    degs = [len(o) for o in outs]
    if len(set(degs)) == 1:
        outs[0].add(next(j for j in range(n) if j not in outs[0] and j != 0) if degs[0] < n - 1 else 1)
        if len({len(o) for o in outs}) == 1:
            outs[0] = {1}
    P = _uniform_from_out(n, [sorted(o) for o in outs])
    return Topology(n, f"random_irregular_s{seed}", lambda k: P)


def _renamed(t: Topology, name: str) -> Topology:
    return Topology(t.n, name, t.matrix_fn, t.period, t.doubly_stochastic)


def from_matrix(
    P: np.ndarray | Callable[[int], np.ndarray],
    *,
    period: int = 1,
    name: str = "custom",
    doubly_stochastic: bool | None = None,
) -> Topology:
    """A user-given topology: a fixed matrix, or a callable ``k -> P^k`` with the given period.

    Every matrix is validated (non-negative, positive diagonal, columns summing to 1)
    and the union of the graphs over one period must be strongly connected.
    """
    period = check_int("period", period, minimum=1)
    fn: Callable[[int], np.ndarray]
    if callable(P):
        fn = P
    else:
        M = validate_mixing_matrix(P)
        fn = lambda k: M  # noqa: E731
    first = validate_mixing_matrix(fn(0))
    if doubly_stochastic is None:
        doubly_stochastic = all(np.allclose(validate_mixing_matrix(fn(k)).sum(1), 1, atol=_TOL) for k in range(period))
    topo = Topology(first.shape[0], name, fn, period, bool(doubly_stochastic))
    check_strongly_connected(topo)
    return topo


def with_sync(base: Topology, sync_period: int) -> Topology:
    """DPPS's periodic all-to-all average: ``base`` except the complete graph (1/n) when
    ``(k + 1) % sync_period == 0`` (COMMON.md F3).  ``sync_period = 0`` returns ``base``."""
    sync_period = check_int("sync_period", sync_period, minimum=0)
    if sync_period == 0:
        return base
    n = base.n
    full = np.full((n, n), 1.0 / n)
    period = int(np.lcm(base.period, sync_period))
    return Topology(
        n,
        f"{base.name}+sync{sync_period}",
        lambda k: full if (k + 1) % sync_period == 0 else base.matrix_fn(k % base.period),
        period=period,
        doubly_stochastic=base.doubly_stochastic,
    )


def check_strongly_connected(topology: Topology, window: int | None = None) -> None:
    """Raise ``ValueError`` unless the union of ``P^k`` over ``window`` consecutive k (default: one
    period) is strongly connected for every start k in one period (B-strong connectivity)."""
    window = topology.period if window is None else check_int("window", window, minimum=1)
    if topology.n == 1:
        return
    for start in range(topology.period):
        union = sum(topology.matrix(start + t) for t in range(window))
        if not _reachable_all(union):
            raise ValueError(
                f"topology {topology.name!r} is not strongly connected over a window of {window} iterations "
                f"starting at k={start}; every node must be able to reach every other within the window "
                "(add edges, or pass a larger window)"
            )


TOPOLOGIES: dict[str, Callable[..., Topology]] = {
    "exp_one_peer": exp_one_peer,
    # DPPS/PartPSP "EXP" (specs/dpps-partpsp.md 6.4: self + one peer, 1/2 each) is the same graph.
    "exp": exp_one_peer,
    "exp_all_hops": exp_all_hops,
    "d_out": d_out,
    "directed_ring": directed_ring,
    "undirected_ring": undirected_ring,
    "complete": complete,
    "random_irregular": random_irregular,
}


def make_topology(name: str, n: int, *, sync_period: int = 0, **kwargs) -> Topology:
    """Build a registered topology by name, e.g. ``make_topology("d_out", 10, deg=4)``.

    ``sync_period > 0`` adds DPPS's periodic complete-graph rounds (:func:`with_sync`).
    """
    if name not in TOPOLOGIES:
        raise ValueError(f"unknown topology {name!r}; valid choices are {sorted(TOPOLOGIES)}")
    try:
        topo = TOPOLOGIES[name](n, **kwargs)
    except TypeError as exc:
        raise ValueError(f"bad arguments {kwargs} for topology {name!r}: {exc}") from exc
    check_strongly_connected(topo)
    return with_sync(topo, sync_period)
