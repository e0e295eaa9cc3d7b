"""The algorithm registry: plan once at config time, then build nodes.

Contract with the runners (in-process, Ray, relay):

``prepare(algorithm, params, *, n_nodes, samples_per_node, num_iters, dim, seed) -> Plan``
    Validates ``params`` (unknown keys -> ConfigError listing all of them and the valid
    ones), does the privacy calibration (schedules, sigma, K*, eps_rigorous / eps_paper per
    node, warnings; the DPPS family: eps_heuristic, eps_rigorous None) and, when ``budget_epsilon``
    is set, truncates K before the budget would be exceeded (a
    pre-flight truncation; on the heuristic eps for the DPPS family, and the plan's warning says so).
``topology_for(plan, base) -> Topology``
    The topology the algorithm must run on (DPPS family: ``with_sync``; A(DP)2SGD: its
    matchings; others: ``base``).  Use it for the nodes AND the backend's routing check.
``make_node(plan, *, node_id, topology, model, loss_fn, data_x, data_y, device="cpu") -> PushSumNode``
``ablate(plan, *, noise=True, clip=True) -> Plan``
    The same plan with the noise and/or the clipping switched off (reductions to SGP, tests).
``async_problem(algorithm) -> str | None``
    Why ``algorithm`` cannot run on the asynchronous network (:mod:`flower_dp.gossip.asynchronous`), None if it can
    (:data:`ASYNC_ALGORITHMS`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from flower_dp._checks import check_int
from flower_dp.errors import ConfigError
from flower_dp.privacy import PrivacyBudget, max_steps, rigorous_epsilon

from flower_dp.mechanisms.exact_release import check_noise_sampler

from .base import Plan, PushSumNode, ablate, validate_params
from .plan import exact_plan
from .dp_csgp import DPCSGPNode, DPCSGPParams, prepare_dp_csgp
from .dpps import DPPSNode, DPPSParams, PEDFLNode, PEDFLParams, prepare_dpps, prepare_pedfl
from .dyn_d2p import DynD2PNode, DynD2PParams, prepare_dyn_d2p
from .privsgp_vr import (
    ADP2Node,
    DP2SGDNode,
    PrivSGPParams,
    PrivSGPVRNode,
    adp2_matching,
    prepare_privsgp_family,
)
from .sgp import SGPNode, SGPParams, prepare_sgp

__all__ = ["ALGORITHMS", "prepare", "make_node", "ablate", "topology_for", "param_names", "ASYNC_ALGORITHMS",
           "SYNC_ONLY", "async_problem"]


def _family(name: str):
    return lambda p, **kw: prepare_privsgp_family(name, p, **kw)


def _dpps(name: str):
    return lambda p, **kw: prepare_dpps(name, p, **kw)


#: name -> (params dataclass, prepare(params, **sizes) -> Plan, node class)
ALGORITHMS: dict[str, tuple[type, Any, type]] = {
    "sgp": (SGPParams, prepare_sgp, SGPNode),
    "dyn_d2p": (DynD2PParams, prepare_dyn_d2p, DynD2PNode),
    "privsgp_vr": (PrivSGPParams, _family("privsgp_vr"), PrivSGPVRNode),
    "privsgp": (PrivSGPParams, _family("privsgp"), PrivSGPVRNode),
    "dp2_sgd": (PrivSGPParams, _family("dp2_sgd"), DP2SGDNode),
    "adp2_sgd": (PrivSGPParams, _family("adp2_sgd"), ADP2Node),
    "dp_csgp": (DPCSGPParams, prepare_dp_csgp, DPCSGPNode),
    "partpsp": (DPPSParams, _dpps("partpsp"), DPPSNode),
    "sgpdp": (DPPSParams, _dpps("sgpdp"), DPPSNode),
    "pedfl": (PEDFLParams, prepare_pedfl, PEDFLNode),
}


#: The algorithms whose ``mix`` is a linear sum of the incoming ``x`` shares and push-sum weights and that need no
#: network-wide reduction: they run on the asynchronous network with running sums per edge (PrivSGP-VR's table is
#: the node's own, refreshed by its own steps; nothing of it is exchanged).
ASYNC_ALGORITHMS = ("sgp", "dyn_d2p", "privsgp_vr", "privsgp")

#: Why every other algorithm runs synchronously only.
SYNC_ONLY = {
    "dp2_sgd": "a D-PSGD node carries no push-sum weight (x is never de-biased by w) and applies its gradient after a "
               "doubly stochastic mix; with nodes at different rates the sum of what arrives is not an average "
               "(AD-PSGD's atomic pairwise averaging would be needed, not running sums)",
    "adp2_sgd": "its synchronous simulation is D-PSGD on matchings: no push-sum weight to de-bias x, a gradient "
                "applied after a doubly stochastic mix (AD-PSGD's atomic pairwise averaging would be needed, not running sums)",
    "dp_csgp": "its mix is not a sum of incoming x shares: receivers keep error-feedback replicas (x_hat, s) of "
               "every sender's compressed differences, which need every difference once and in order",
    "partpsp": "every step needs a network-wide reduction first (the sensitivity estimate): a barrier",
    "sgpdp": "every step needs a network-wide reduction first (the sensitivity estimate): a barrier",
    "pedfl": "every step needs a network-wide reduction first (the sensitivity estimate), and a D-PSGD mix without "
             "push-sum weights",
}


def async_problem(algorithm: str) -> str | None:
    """Why ``algorithm`` cannot run with ``network.mode = "async"`` (naming it, the valid ones and the fix), None if
    it can."""
    if algorithm in ASYNC_ALGORITHMS:
        return None
    why = SYNC_ONLY.get(algorithm, "it is not a registered algorithm")
    return (f"network.mode = 'async' cannot run algorithm {algorithm!r}: {why}; asynchronous algorithms are "
            f"{list(ASYNC_ALGORITHMS)}, run {algorithm!r} with network.mode = 'sync'")


def param_names(algorithm: str) -> list[str]:
    """The valid parameter keys of ``algorithm``."""
    _check_algorithm(algorithm)
    return [f.name for f in dataclasses.fields(ALGORITHMS[algorithm][0])]


def _check_algorithm(algorithm: str) -> None:
    if algorithm not in ALGORITHMS:
        raise ConfigError(f"unknown algorithm {algorithm!r}; valid choices are {sorted(ALGORITHMS)}")


def _as_tuples(params: dict[str, Any]) -> dict[str, Any]:
    """Lists become tuples so the params dataclass stays frozen and hashable."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in params.items()}


def prepare(
    algorithm: str,
    params: dict[str, Any],
    *,
    n_nodes: int,
    samples_per_node: list[int],
    num_iters: int,
    dim: int,
    seed: int,
    reproducible: bool = False,
    noise_sampler: str = "float",
) -> Plan:
    """Validate, calibrate and plan one run of ``algorithm`` (see the module docstring).

    ``reproducible=False`` (default): every node keys its privacy noise and private sampling with its
    own secret from OS entropy.  ``True``: the simulation mode keyed by the public ``seed`` (identical
    numbers on every backend; the guarantee holds only against parties that do not know the seed).
    ``noise_sampler``: ``"float"`` (default) or ``"exact"`` (:func:`flower_dp.clients.plan.exact_plan`).
    """
    _check_algorithm(algorithm)
    n_nodes = check_int("n_nodes", n_nodes, minimum=1)
    num_iters = check_int("num_iters", num_iters, minimum=1)
    dim = check_int("dim", dim, minimum=1)
    seed = check_int("seed", seed, minimum=0)
    J = [check_int("samples_per_node[i]", j, minimum=1) for j in samples_per_node]
    if len(J) != n_nodes:
        raise ConfigError(f"samples_per_node must have n_nodes = {n_nodes} entries, got {len(J)}")
    cls, prep, _ = ALGORITHMS[algorithm]
    p = validate_params(cls, _as_tuples(dict(params)), algorithm)
    plan = prep(p, n_nodes=n_nodes, samples_per_node=J, num_iters=num_iters, dim=dim, seed=seed)
    budget = getattr(p, "budget_epsilon", None)
    if budget is not None and plan.private:
        plan = _truncate_to_budget(plan, float(budget))
    plan = dataclasses.replace(plan, reproducible=bool(reproducible))
    if check_noise_sampler(noise_sampler) == "exact":
        plan = exact_plan(plan)
    return plan


def _max_iters(plan: Plan, i: int, budget_epsilon: float) -> int:
    """Largest K' <= K whose first K' iterations (every step planned in them) fit the budget at node ``i``
    (:func:`flower_dp.privacy.max_steps`, the one budget check, over the plan's iterations)."""
    steps = plan.steps(i)
    per = len(steps) // plan.num_iters  # steps per iteration (PrivSGP-VR: 2)
    budget = PrivacyBudget(budget_epsilon, plan.delta_of(i), plan.adjacency,
                           "node_round" if plan.heuristic else "record")
    return max_steps([steps[j:j + per] for j in range(0, len(steps), per)], budget, accountant=plan.accountant)


def _truncate_to_budget(plan: Plan, budget_epsilon: float) -> Plan:
    """Largest K whose planned steps fit (budget_epsilon, delta) at every node (pre-flight hard stop)."""
    K = plan.num_iters
    cache: dict[tuple, int] = {}
    for i in range(plan.n_nodes):
        key = (plan.q[i], plan.noise_multiplier[i].tobytes(), plan.noise_multiplier_always[i].tobytes() if plan.noise_multiplier_always else b"",
               plan.delta_of(i))
        if key not in cache:
            cache[key] = _max_iters(plan, i, budget_epsilon)
        K = min(K, cache[key])
    if K == plan.num_iters:
        return plan
    if K == 0:
        raise ConfigError(f"budget_epsilon = {budget_epsilon} at delta = {plan.delta} does not cover even one "
                          f"iteration of {plan.algorithm!r}, got K = 0; raise the budget or the noise")
    eps = []
    for i in range(plan.n_nodes):
        eps.append(rigorous_epsilon(plan.steps(i, 0, K), plan.delta_of(i), accountant=plan.accountant,
                                    adjacency=plan.adjacency))
    # A heuristic plan (DPPS family) is truncated on its heuristic eps, and says so: the budget then limits
    # the composed per node-message Laplace releases, it is not a record-level guarantee.
    kind = "heuristic eps (no DP proof, per node-message)" if plan.heuristic else "rigorous eps"
    note = (f"budget hard stop: K truncated from {plan.num_iters} to {K} so that the {kind} stays <= "
            f"{budget_epsilon} (delta = {plan.delta})")
    eps_fields = {"eps_heuristic": tuple(eps)} if plan.heuristic else {"eps_rigorous": tuple(eps)}
    return dataclasses.replace(
        plan, num_iters=K, clip=tuple(c[:K] for c in plan.clip), noise_std=tuple(s[:K] for s in plan.noise_std),
        noise_multiplier=tuple(v[:K] for v in plan.noise_multiplier), noise_multiplier_always=tuple(v[:K] for v in plan.noise_multiplier_always), **eps_fields,
        warnings=plan.warnings + (note,))


def topology_for(plan: Plan, base):
    """The topology ``plan`` must run on, derived from the configured ``base`` topology."""
    from flower_dp.topology import with_sync

    if plan.algorithm in ("partpsp", "sgpdp", "pedfl"):
        return with_sync(base, plan.params.sync_period)
    if plan.algorithm == "adp2_sgd":
        return adp2_matching(plan.n_nodes)
    return base


def make_node(plan: Plan, *, node_id: int, topology, model, loss_fn, data_x, data_y, device: str = "cpu") -> PushSumNode:
    """Build node ``node_id`` of ``plan`` (its model, loss and local data are owned by the node)."""
    _check_algorithm(plan.algorithm)
    node_cls = ALGORITHMS[plan.algorithm][2]
    if len(data_x) != plan.samples_per_node[node_id]:
        raise ValueError(f"node {node_id} got {len(data_x)} samples but the plan was made for "
                         f"{plan.samples_per_node[node_id]}; pass the same partition to prepare and make_node")
    return node_cls(plan, node_id=node_id, topology=topology, model=model, loss_fn=loss_fn, data_x=data_x,
                    data_y=data_y, device=device)
