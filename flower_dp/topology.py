"""Directed (time-varying) communication graphs and their push-sum mixing matrices.

Convention (docs/symbols.md): ``P[i, j]`` is the weight that sender
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

import functools
import hashlib
import inspect
import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ._checks import check_choice, check_int

__all__ = [
    "Topology",
    "exp_one_peer",
    "exp_two_peer",
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
            f"{name} must have a positive diagonal (every node keeps part of its own value), "
            f"got {name}[{i}, {i}] = {diag[i]}"
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
                f"{name} must be doubly stochastic for this algorithm, got row {int(bad[0])} summing to "
                f"{float(rows[bad[0]])!r}; "
                "use a circulant graph (d_out, exp_one_peer, complete, rings)"
            )
    return P


def _reachable_all(adj: np.ndarray) -> bool:
    """True if the directed graph with adjacency ``adj[receiver, sender] > 0`` is strongly connected."""
    from scipy.sparse.csgraph import connected_components

    n_comp, _ = connected_components(adj > 0, directed=True, connection="strong")
    return n_comp == 1


@dataclass(frozen=True)
class Topology:
    """A sequence of mixing matrices ``P^k``, periodic in ``k``.

    Parameters
    ----------
    n : int
        Number of nodes (>= 1; ``n = 1`` is a single node that only keeps its own value).
    name : str
        Registry name (recorded in results).
    matrix_fn : callable k -> ndarray (n, n)
        The mixing matrix at iteration ``k`` in ``[0, period)`` (``P[receiver, sender]``),
        float64.  Must be picklable for process backends (module-level function or class).
    period : int
        ``P^(k + period) == P^k``; 1 for a static graph.
    doubly_stochastic : bool
        Rows also sum to 1 at every ``k`` (push-sum weights then stay exactly 1).

    Notes
    -----
    Matrices are validated (non-negative, positive diagonal, column sums 1 within 1e-12)
    the first time each phase is requested and cached read-only.

    Pickling leaves the cache behind, and the copies of one topology unpickled in one process are
    one object (:func:`_shared_topology`): a host actor that receives n node factories, each with
    the topology, keeps one topology and one matrix cache, not n (at n = 1,024 with the exp graph,
    10 dense 8 MB phases per copy).
    """

    n: int
    name: str
    matrix_fn: Callable[[int], np.ndarray] = field(repr=False)
    period: int = 1
    doubly_stochastic: bool = False
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_int("n", self.n, minimum=1)
        check_int("period", self.period, minimum=1)

    def __reduce__(self):
        fields_ = (self.n, self.name, self.matrix_fn, self.period, self.doubly_stochastic)
        key = self._cache.get("pickle_key", False)
        if key is False:
            key = _content_key(fields_)
            self._cache["pickle_key"] = key
        return _shared_topology, (key, *fields_)

    @property
    def static(self) -> bool:
        """True when ``P^k`` does not depend on ``k`` (``period == 1``)."""
        return self.period == 1

    def matrix(self, k: int) -> np.ndarray:
        """``P^k`` as a read-only (n, n) float64 array, ``P[receiver, sender]``."""
        key = int(k) % self.period
        P = self._cache.get(key)
        if P is None:
            P = validate_mixing_matrix(self.matrix_fn(key), doubly_stochastic=self.doubly_stochastic, name=f"P^{key}")
            if P.shape != (self.n, self.n):
                raise ValueError(f"{self.name}: P^{key} must have shape ({self.n}, {self.n}), got {P.shape}")
            P = P.copy()
            P.setflags(write=False)
            self._cache[key] = P
        return P

    def out_neighbors(self, i: int, k: int) -> list[int]:
        """Receivers of node ``i`` at ``k`` (sorted, ``i`` itself excluded)."""
        col = self.matrix(k)[:, self._node(i)]
        return [int(r) for r in np.flatnonzero(col) if r != i]

    def in_neighbors(self, i: int, k: int) -> list[int]:
        """Senders to node ``i`` at ``k`` (sorted, ``i`` itself excluded)."""
        row = self.matrix(k)[self._node(i), :]
        return [int(s) for s in np.flatnonzero(row) if s != i]

    def send_weights(self, i: int, k: int) -> dict[int, float]:
        """``{receiver: P^k[receiver, i]}`` for node ``i``'s outbox, including ``i`` itself; sums to 1."""
        col = self.matrix(k)[:, self._node(i)]
        return {int(r): float(col[r]) for r in np.flatnonzero(col)}

    def _node(self, i: int) -> int:
        return check_int("node id", i, minimum=0, maximum=self.n - 1)


#: Topologies unpickled in this process, by the digest of their content (_content_key) (:meth:`Topology.__reduce__`).
_SHARED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _content_key(fields_: tuple) -> bytes | None:
    """SHA-256 of a topology's fields (n, name, matrix_fn, period, doubly_stochastic): equal digests, equal
    topologies.  No pickle: the matrix function is described by :func:`_fn_key`; None (no sharing) when it
    cannot be (a lambda, a closure, a bound method, anything in ``__main__``)."""
    n, name, fn, period, doubly = fields_
    fkey = _fn_key(fn)
    if fkey is None:
        return None
    return hashlib.sha256(repr((int(n), str(name), fkey, int(period), bool(doubly))).encode()).digest()


_PLAIN = (int, float, str, bool, type(None))


def _plain(v) -> bool:
    if isinstance(v, _PLAIN):
        return True
    if isinstance(v, (tuple, list)):
        return all(_plain(x) for x in v)
    return isinstance(v, dict) and all(isinstance(k, str) and _plain(x) for k, x in v.items())


def _fn_key(fn) -> object | None:
    """A value whose repr identifies what ``fn`` computes: the matrix classes' ``content_key()``, a module-level
    function's qualified name, a partial of one with plain arguments; else None."""
    if hasattr(fn, "content_key") and not inspect.isclass(fn):
        return fn.content_key()
    if isinstance(fn, functools.partial):
        inner = _fn_key(fn.func)
        kw = fn.keywords or {}
        if inner is None or not _plain(fn.args) or not _plain(kw):
            return None
        return (inner, tuple(fn.args), tuple(sorted(kw.items())))
    if not inspect.isfunction(fn):
        return None
    mod, qual = fn.__module__, fn.__qualname__
    return None if mod == "__main__" or "<" in qual else f"{mod}.{qual}"


def _shared_topology(key: bytes | None, n: int, name: str, matrix_fn: Callable[[int], np.ndarray], period: int,
                     doubly_stochastic: bool) -> Topology:
    """Unpickle a :class:`Topology`: the one already unpickled here with the same content, else a new one
    (immutable, so nodes may share it; its matrix cache fills once)."""
    topo = _SHARED.get(key) if key is not None else None
    if topo is None:
        topo = Topology(n, name, matrix_fn, period, doubly_stochastic)
        if key is not None:
            topo._cache["pickle_key"] = key
            _SHARED[key] = topo
    return topo


# ---------------------------------------------------------------------------------------------
# Picklable matrix functions (no lambdas, so topologies cross process boundaries).


class _Fixed:
    """``k -> P`` for a static graph."""

    def __init__(self, P: np.ndarray) -> None:
        self.P = P

    def __call__(self, k: int) -> np.ndarray:
        return self.P

    def content_key(self) -> tuple:
        P = np.ascontiguousarray(self.P)
        return ("fixed", P.shape, str(P.dtype), hashlib.sha256(P.tobytes()).hexdigest())


class _OnePeer:
    """``k -> (I + shift by 2^(k mod m)) / 2``: node i sends half to ``(i + 2^(k mod m)) mod n``."""

    def __init__(self, n: int, m: int) -> None:
        self.n, self.m = n, m

    def __call__(self, k: int) -> np.ndarray:
        hop = 1 << (k % self.m)
        return _uniform_from_out(self.n, [[i + hop] for i in range(self.n)])

    def content_key(self) -> tuple:
        return ("one_peer", int(self.n), int(self.m))


class _Sync:
    """``base`` except the complete graph (1/n) when ``(k + 1) % sync_period == 0``."""

    def __init__(self, base: Topology, sync_period: int) -> None:
        self.base, self.sync_period = base, sync_period
        self.full = np.full((base.n, base.n), 1.0 / base.n)

    def __call__(self, k: int) -> np.ndarray:
        return self.full if (k + 1) % self.sync_period == 0 else self.base.matrix(k)

    def content_key(self) -> tuple | None:
        b = self.base
        base = _content_key((b.n, b.name, b.matrix_fn, b.period, b.doubly_stochastic))
        return None if base is None else ("sync", base.hex(), int(self.sync_period))


def _check_n(n: int, minimum: int = 1) -> int:
    return check_int("n", n, minimum=minimum)


def _num_hops(n: int) -> int:
    """m = floor(log2(n - 1)) + 1 computed with integers ((n-1).bit_length()); 1 for n <= 2."""
    return max(1, (n - 1).bit_length())


def _uniform_from_out(n: int, outs: list) -> np.ndarray:
    """Column-stochastic matrix where sender j splits 1/(1 + |outs[j]|) over itself and outs[j] (mod n)."""
    P = np.zeros((n, n))
    for j, targets in enumerate(outs):
        ts = sorted({int(t) % n for t in targets} - {j})
        w = 1.0 / (1 + len(ts))
        P[j, j] = w
        P[ts, j] = w
    return P


def _single_node(name: str) -> Topology:
    return Topology(1, name, _Fixed(np.ones((1, 1))), 1, True)


def exp_one_peer(n: int) -> Topology:
    """Time-varying directed exponential graph, one peer per iteration (Dyn-D2P, PrivSGP-VR).

    Node ``i`` sends half of its value to ``(i + 2^(k mod m)) mod n`` and keeps half,
    ``m = floor(log2(n - 1)) + 1`` computed with integers (n = 20: hops 1, 2, 4, 8, 16;
    n = 2: m = 1, hop 1).  Period ``m``; doubly stochastic, so push-sum weights stay 1.

    ``n = 1`` is a single node with ``P = [[1]]`` (no communication, plain local SGD).
    """
    n = _check_n(n)
    if n == 1:
        return _single_node("exp_one_peer")
    m = _num_hops(n)
    return Topology(n, "exp_one_peer", _OnePeer(n, m), period=m, doubly_stochastic=True)


def exp_two_peer(n: int) -> Topology:
    """DPPS / PartPSP "EXP" graph (the paper's Remark 2).

    At round ``k`` node ``i`` sends to itself and to ``(i + 2^(k mod B)) mod n``,
    ``B = floor(log2(n - 1)) + 1`` (n = 10: offsets 1, 2, 4, 8): "exactly two
    out-neighbours" counting the self-loop, weight 1/2 each.  These are exactly the
    matrices of :func:`exp_one_peer` (same phase: one global ``k``);
    only the recorded name differs.  ``n = 1``: ``P = [[1]]``.
    """
    t = exp_one_peer(n)
    return Topology(t.n, "exp_two_peer", t.matrix_fn, t.period, t.doubly_stochastic)


def exp_all_hops(n: int) -> Topology:
    """Static directed exponential graph with all hops (DP-CSGP): i -> i + 2^e, e = 0..m-1.

    Weight ``1/(1 + outdeg)`` = 1/(1 + m) (n = 10: hops 1, 2, 4, 8, weight 1/5).  Circulant,
    hence doubly stochastic.  ``n = 1``: ``P = [[1]]``.
    """
    n = _check_n(n)
    if n == 1:
        return _single_node("exp_all_hops")
    m = _num_hops(n)
    P = _uniform_from_out(n, [[i + (1 << e) for e in range(m)] for i in range(n)])
    return Topology(n, "exp_all_hops", _Fixed(P), doubly_stochastic=True)


def d_out(n: int, deg: int) -> Topology:
    """DPPS's circulant "d-Out" graph: node i sends to i + e, e = 0..deg-1 (itself included), weight 1/deg.

    ``deg = 1`` is the self-loop only (DPPS Fig. 4 "1-Out"; not connected on its own, only
    with sync rounds, :func:`with_sync`), ``deg = 2`` the directed ring, ``deg = n`` the
    complete graph.  Doubly stochastic.
    """
    n = _check_n(n)
    deg = check_int("deg", deg, minimum=1)
    if deg > n:
        raise ValueError(f"deg must be in [1, n] = [1, {n}] (it counts the node itself), got {deg}; use deg <= n")
    P = _uniform_from_out(n, [[i + e for e in range(1, deg)] for i in range(n)])
    return Topology(n, f"d_out_{deg}", _Fixed(P), doubly_stochastic=True)


def directed_ring(n: int) -> Topology:
    """Static directed ring i -> i + 1, weights 1/2 self, 1/2 next (``n = 1``: ``[[1]]``)."""
    n = _check_n(n)
    t = d_out(n, min(2, n))
    return Topology(n, "directed_ring", t.matrix_fn, 1, True)


def undirected_ring(n: int) -> Topology:
    """Undirected ring: 1/3 self, 1/3 left, 1/3 right (n = 2: 1/2-1/2; n = 1: ``[[1]]``)."""
    n = _check_n(n)
    P = _uniform_from_out(n, [[i - 1, i + 1] for i in range(n)])
    return Topology(n, "undirected_ring", _Fixed(P), doubly_stochastic=True)


def complete(n: int) -> Topology:
    """Complete graph with uniform weights 1/n (``n = 1``: ``[[1]]``)."""
    n = _check_n(n)
    return Topology(n, "complete", _Fixed(np.full((n, n), 1.0 / n)), doubly_stochastic=True)


def random_irregular(n: int, *, seed: int = 0, p: float = 0.3) -> Topology:
    """A seeded random strongly connected static digraph with unequal out-degrees.

    A directed ring ``i -> i + 1`` guarantees strong connectivity; every other edge is
    added with probability ``p``.  If all out-degrees come out equal, node 0 gets one
    more edge (or, if it already sends to everyone, only its ring edge).  Weights
    ``1/(1 + outdeg_j)``: columns sum to 1 but rows do not, so push-sum weights really
    move (the graph that exercises de-biasing: every paper's graph keeps ``w == 1``).

    Parameters
    ----------
    n : int
        Number of nodes, >= 3 (with 2 nodes every strongly connected digraph is regular).
    seed : int
        The graph is a deterministic function of ``(n, seed, p)``.
    p : float in [0, 1]
        Probability of each extra edge.
    """
    n = check_int("n", n)
    if n < 3:
        raise ValueError(
            f"random_irregular needs n >= 3 nodes (with 2 nodes every strongly connected graph is regular), got {n}; "
            "use exp_one_peer, complete or from_matrix for small n"
        )
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p (extra-edge probability) must be in [0, 1], got {p}")
    seed = check_int("seed", seed, minimum=0)
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(n,)))
    outs = [{(i + 1) % n} for i in range(n)]
    for i in range(n):
        for j in range(n):
            if j != i and rng.random() < p:
                outs[i].add(j)
    if len({len(o) for o in outs}) == 1:  # all equal: make node 0 different
        if len(outs[0]) < n - 1:
            outs[0].add(min(j for j in range(1, n) if j not in outs[0]))
        else:
            outs[0] = {1}
    P = _uniform_from_out(n, [sorted(o) for o in outs])
    return Topology(n, f"random_irregular_s{seed}", _Fixed(P))


def from_matrix(
    P: np.ndarray | Callable[[int], np.ndarray],
    *,
    period: int = 1,
    name: str = "custom",
    doubly_stochastic: bool | None = None,
) -> Topology:
    """A user-given topology: a fixed (n, n) matrix, or a callable ``k -> P^k`` with the given period.

    ``P[receiver, sender]``; every matrix is validated (non-negative, positive diagonal,
    columns summing to 1 within 1e-12) and the union of the graphs over one period must be
    strongly connected.  ``doubly_stochastic=None`` detects it from the row sums; ``True``
    makes every matrix's rows be checked too.  A 1x1 matrix ``[[1]]`` is a single node.
    The callable is evaluated at ``k = 0..period-1`` only; it should be picklable for
    process backends.
    """
    period = check_int("period", period, minimum=1)
    if callable(P):
        fn = P
    else:
        fn = _Fixed(validate_mixing_matrix(P).copy())
    mats = [validate_mixing_matrix(fn(k), name=f"P^{k}") for k in range(period)]
    if doubly_stochastic is None:
        doubly_stochastic = all(np.allclose(M.sum(1), 1, rtol=0, atol=_TOL) for M in mats)
    topo = Topology(mats[0].shape[0], name, fn, period, bool(doubly_stochastic))
    check_strongly_connected(topo)
    return topo


def with_sync(base: Topology, sync_period: int) -> Topology:
    """DPPS's periodic all-to-all average (the paper's synchronization rounds).

    ``base`` except the complete graph (1/n) at every ``k`` with ``(k + 1) % sync_period == 0``
    (``sync_period = 5``: k = 4, 9, 14, ...).  Period ``lcm(base.period, sync_period)``.
    ``sync_period = 0`` returns ``base`` unchanged.
    """
    sync_period = check_int("sync_period", sync_period, minimum=0)
    if sync_period == 0:
        return base
    period = math.lcm(base.period, sync_period)
    return Topology(
        base.n, f"{base.name}+sync{sync_period}", _Sync(base, sync_period), period, base.doubly_stochastic
    )


def check_strongly_connected(topology: Topology, window: int | None = None) -> None:
    """Raise ``ValueError`` unless the union of ``P^k`` over ``window`` consecutive k (default: one
    period) is strongly connected for every start k in one period (B-strong connectivity,
    ``B_conn = window``)."""
    window = topology.period if window is None else check_int("window", window, minimum=1)
    if topology.n == 1:
        return
    for start in range(topology.period):
        union = sum(topology.matrix(start + t) for t in range(window))
        if not _reachable_all(union):
            raise ValueError(
                f"topology {topology.name!r} is not strongly connected over a window of {window} iterations "
                f"starting at k={start}, got a node that cannot reach every other; add edges, "
                "or pass a larger window / period"
            )


TOPOLOGIES: dict[str, Callable[..., Topology]] = {
    "exp_one_peer": exp_one_peer,
    "exp": exp_one_peer,  # alias
    "exp_two_peer": exp_two_peer,  # DPPS "EXP": self + one peer, 1/2 each (same matrices)
    "exp_all_hops": exp_all_hops,
    "d_out": d_out,
    "directed_ring": directed_ring,
    "undirected_ring": undirected_ring,
    "complete": complete,
    "random_irregular": random_irregular,
}


def make_topology(name: str, n: int, *, sync_period: int = 0, check: bool = True, **kwargs) -> Topology:
    """Build a registered topology by name, e.g. ``make_topology("d_out", 10, deg=4)``.

    ``sync_period > 0`` adds DPPS's periodic complete-graph rounds (:func:`with_sync`).
    The result is checked to be strongly connected over one period (``check=False``: the caller
    checks the graph it finally runs on, e.g. after an algorithm added its sync rounds).
    """
    check_choice("topology", name, TOPOLOGIES)
    try:
        topo = TOPOLOGIES[name](n, **kwargs)
    except TypeError as exc:
        raise ValueError(f"bad arguments {kwargs} for topology {name!r}, got TypeError: {exc}") from exc
    topo = with_sync(topo, sync_period)
    if check:
        check_strongly_connected(topo)
    return topo
