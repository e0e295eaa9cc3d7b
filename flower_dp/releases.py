"""What a node may release: public by construction, charged by the accountant, or not released.

Everything computed from private data that leaves a node
(messages, metrics, results) is charged or is not released.  A node's ``last_metrics()`` is
node-internal; every place where those metrics leave the node (the in-process runner's
``results.json`` / ``history.csv``, the relay transport's reply, the Ray host's segment result)
passes them through :func:`release_metrics`, which keeps only :data:`PUBLIC_NODE_METRICS`
(and, for the heuristic DPPS family, :data:`HEURISTIC_BROADCAST_METRICS`) unless

* the run opted in with ``debug_metrics`` (run config ``[run] debug_metrics = true``,
  ``PushSumStrategy(..., debug_metrics=True)``): then every statistic goes out, and the results
  file says ``"uncharged_statistics_released": true`` with a warning; or
* the node is not private (its plan charges nothing: SGP, non-private baselines, ablations with
  the noise off, the toy demo node): there is no privacy claim to protect (eps = inf is reported),
  so its training statistics are released.

Released by default: the noised messages themselves (push-sum shares, their weights) and their
bit counts, public schedule values (noise std, clip bound), test-set metrics of the
network-average model on public test data, and eps numbers.  Not released by default: training
loss, clip fraction, per-sample gradient norms, realised batch sizes, a node's own sensitivity
estimate before the network max.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PUBLIC_NODE_METRICS", "HEURISTIC_BROADCAST_METRICS", "DEBUG_ONLY_NODE_METRICS", "release_metrics", "node_metrics",
           "node_is_private", "release_fields", "public_history_row", "HISTORY_KEYS", "RELEASE_WARNING"]

#: Per-node metrics that are public by construction (schedules, message sizes, memory of the public shapes).
PUBLIC_NODE_METRICS = frozenset({
    "noise_std",        # the planned Gaussian std (public schedule); DPPS: see HEURISTIC_BROADCAST_METRICS
    "clip",             # the planned clip bound (public schedule)
    "bits_sent",        # bits of the noised messages sent this iteration (a function of the model size)
    "bits_sent_total",
    "bits_collective",  # DPPS: bits of its sensitivity broadcast (a function of n)
    "memory_bytes",     # PrivSGP-VR table size: J_i / b blocks x d floats (public partition size and shapes)
})

#: DPPS family only (PartPSP, SGPDP, PEDFL): values the algorithm itself broadcasts in the clear
#: (its data-dependent sensitivity estimate, the max over nodes, and the Laplace scale derived
#: from it; ``S_real`` is the simulation's oracle, broadcast to every node as the reduction
#: result).  They are not charged: these algorithms have no DP proof and report ``eps_heuristic``.
#: Whitelisted so that the heuristic is visible, not hidden.
HEURISTIC_BROADCAST_METRICS = frozenset({"sensitivity_est", "noise_scale", "sensitivity_real"})

#: Statistics of private data the accountant does not charge: released only with ``debug_metrics``
#: (or by a node that is not private).  Listed for the docs and tests; any key not public is treated so.
DEBUG_ONLY_NODE_METRICS = frozenset({"loss", "clip_fraction", "batch", "grad_norm_mean", "grad_norm_batch",
                                     "sensitivity_own"})

#: History row keys the runner and PushSumStrategy write besides node metrics: iteration / round, total bits,
#: test metrics of the network-average model on the public test set.
HISTORY_KEYS = frozenset({"k", "round", "bits_total", "acc_avg", "test_loss_avg", "acc_nodes_mean"})

RELEASE_WARNING = ("debug_metrics is on: per-node training statistics computed on private data (training loss, "
                   "clip fraction, gradient norms, realised batch sizes, ...) are released in the history; the "
                   "accountant does not charge them, so the reported eps does not cover them")


def node_is_private(node: Any) -> bool:
    """Whether ``node`` makes a privacy claim: its plan's ``private`` flag, else its own ``private``
    attribute, else True (a node that says nothing is treated as private)."""
    plan = getattr(node, "plan", None)
    if plan is not None and hasattr(plan, "private"):
        return bool(plan.private)
    return bool(getattr(node, "private", True))


def release_metrics(metrics: dict[str, Any], *, debug: bool = False, private: bool = True) -> dict[str, float]:
    """The part of a node's ``last_metrics()`` that may leave the node (as floats).

    Parameters
    ----------
    metrics : dict
        ``node.last_metrics()``.
    debug : bool
        Release everything (the explicit ``debug_metrics`` opt-in).
    private : bool
        False for a node that charges nothing (everything is released; no claim to protect).
    """
    if debug or not private:
        return {k: float(v) for k, v in metrics.items()}
    allowed = PUBLIC_NODE_METRICS | HEURISTIC_BROADCAST_METRICS
    return {k: float(v) for k, v in metrics.items() if k in allowed}


def node_metrics(node: Any, debug: bool = False) -> dict[str, float]:
    """:func:`release_metrics` of ``node.last_metrics()`` (``{}`` for a node without metrics)."""
    lm = getattr(node, "last_metrics", None)
    return release_metrics(lm() if callable(lm) else {}, debug=debug, private=node_is_private(node))


def public_history_row(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` without the uncharged statistics (for history written before the releases were filtered)."""
    allowed = HISTORY_KEYS | PUBLIC_NODE_METRICS | HEURISTIC_BROADCAST_METRICS
    return {k: v for k, v in row.items() if k in allowed or str(k).startswith("eps")}


def release_fields(debug: bool, private: bool = True) -> dict[str, Any]:
    """The results-file fields stating what was released: ``uncharged_statistics_released`` and,
    when true, ``release_warning``."""
    if debug and private:
        return {"uncharged_statistics_released": True, "release_warning": RELEASE_WARNING}
    if not private:
        return {"uncharged_statistics_released": True,
                "release_warning": "the run is not private (nothing is charged, eps = inf): its training "
                                   "statistics are released"}
    return {"uncharged_statistics_released": False}
