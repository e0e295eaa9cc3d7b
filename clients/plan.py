"""The plan of a push-sum run: what an algorithm decides once, before the first iteration, for every node.

A :class:`Plan` holds, per node and iteration, the clip bound, the noise std the node draws and the noise
multiplier the accountant is charged for it (one description of each release: :meth:`Plan.release`), the sampling
rate, the planned eps and the warnings of the calibration.  The algorithms' ``prepare_*`` functions make it
(:mod:`flower_dp.clients.registry`); the nodes (:mod:`flower_dp.clients.base`) and the runners read it.
:func:`validate_params` builds an algorithm's parameter dataclass from a config table; :func:`ablate` switches
a plan's noise or clipping off.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from flower_dp.errors import ConfigError
from flower_dp.privacy.accountant import TABLE_SAMPLING, GaussianStep, LaplaceStep
from flower_dp.rng import noise_record

__all__ = ["Plan", "NoiseRelease", "validate_params", "ablate", "exact_plan", "HEURISTIC_NOTE"]

#: Why a DPPS-family eps is ``eps_heuristic`` and never ``eps_rigorous`` (results files, reports).
HEURISTIC_NOTE = ("heuristic, no DP proof: the Laplace scale rests on a data-dependent sensitivity estimate broadcast "
                  "in the clear (L1 clipping off by default, so the true sensitivity is unbounded); eps is the "
                  "composition of per node-message releases, not a record-level guarantee")


@dataclass(frozen=True)
class NoiseRelease:
    """One node's noise release at one iteration, as its :class:`Plan` describes it (:meth:`Plan.release`).

    ``std`` is the Gaussian std per coordinate the node draws (0: no draw; a heuristic Laplace plan: 0,
    its scale is data dependent) and ``steps`` what the accountant is charged for that draw (empty: nothing;
    PrivSGP-VR: its sampled part and its always-present table part; DPPS: one ``LaplaceStep``).  Both come
    from the plan's entry for ``(i, k)``; :meth:`PushSumNode.release_gaussian` /
    :meth:`PushSumNode.release_laplace` draw and charge them in one call.
    """

    std: float
    steps: tuple


@dataclass(frozen=True)
class Plan:
    """Everything decided once at config time for one run of one algorithm (picklable).

    Attributes
    ----------
    algorithm : str
        Registry name (``"sgp"``, ``"dyn_d2p"``, ``"privsgp_vr"``, ...).
    params : frozen dataclass
        The validated hyperparameters (fields named after the paper's symbols).
    n_nodes, dim, seed : int
        Network size, model dimension d (all trainable parameters), run seed.
    samples_per_node : tuple of int
        J_i, local dataset size per node.
    num_iters : int
        K actually run (after K* or a budget truncation).
    num_iters_requested : int
        K asked for in the config.
    q : tuple of float, per node
        Sampling rate charged to the accountant (B/J, or b/J for blocks).
    clip : tuple of ndarray (K,), per node
        Per-iteration clip bound (L2 per sample, or L1 for DPPS); ``inf`` = no clipping.
    noise_std : tuple of ndarray (K,), per node
        Gaussian std per coordinate on the *batch-mean* gradient (0 = no noise).  DPPS: zeros
        (its Laplace scale is data dependent, ``gamma_n S / b``).
    noise_multiplier : tuple of ndarray (K,), per node
        Noise multiplier charged per step: Gaussian std / (clip / B), or DPPS's Laplace ``gamma_n / b``.
    eps_rigorous, eps_paper : tuple of float, per node
        Rigorous (PLD/RDP) eps of the planned noise over ``num_iters`` and the paper formula's eps.
        ``eps_rigorous`` is ``(None, ...)`` for a heuristic plan: no implemented proof, no rigorous eps.
    eps_heuristic : tuple of float, per node
        Heuristic plans only (DPPS family): the composed eps of the Laplace releases under the
        *estimated* sensitivity, per node-message (not record-level, no proof); empty otherwise.
    delta : float
        The largest delta across nodes; ``node_delta`` (per node, optional) holds each node's own.
    accountant, adjacency : str
    sampling : {"poisson", "fixed_size"}
        The sampler the nodes really run and the accountant charges (PrivSGP(-VR): one of
        ``population[i]`` fixed blocks per step, ``q = 1 / population[i]``).
    population : tuple of int, per node
        For ``fixed_size``: what the batch is drawn from (the number of blocks); empty otherwise.
    noise_multiplier_always : tuple of ndarray (K,), per node
        A non-sampled Gaussian charged with every step (PrivSGP-VR's table average, present
        whichever block is drawn; see ``privsgp_vr_calibration``); empty = none.
    heuristic : bool
        True where the sensitivity is estimated (DPPS family): its eps is reported as
        ``eps_heuristic`` with :data:`HEURISTIC_NOTE`, never as ``eps_rigorous``.
    private : bool
        False when nothing is charged (SGP, non-private baselines, ablations).
    warnings : tuple of str
    reproducible : bool
        False (default): each node keys its privacy noise and private sampling with its own secret
        from OS entropy (:func:`flower_dp.rng.node_secret`).  True: a simulation mode keyed by the
        public ``seed`` (identical numbers on every backend and across resumes; the guarantee holds only
        against parties that do not know the seed).
    noise_sampler : {"float", "exact"}
        ``"float"`` (default): numpy's float64 Gaussian added to the float gradient.  ``"exact"``: integers on a
        public grid plus the exact discrete Gaussian from a ChaCha20 keystream
        (:mod:`flower_dp.mechanisms.exact_release`), charged by :mod:`flower_dp.privacy.discrete_gaussian`
        (:meth:`exact_steps`); its ``noise_std`` / ``noise_multiplier`` are the float plan's scaled so that its
        eps is the float plan's (:func:`exact_plan`).
    """

    algorithm: str
    params: Any
    n_nodes: int
    samples_per_node: tuple[int, ...]
    num_iters: int
    num_iters_requested: int
    dim: int
    seed: int
    q: tuple[float, ...]
    clip: tuple[np.ndarray, ...] = field(repr=False)
    noise_std: tuple[np.ndarray, ...] = field(repr=False)
    noise_multiplier: tuple[np.ndarray, ...] = field(repr=False)
    eps_rigorous: tuple[float | None, ...]
    eps_paper: tuple[float, ...]
    delta: float
    accountant: str = "auto"
    adjacency: str = "add_remove"
    heuristic: bool = False
    private: bool = True
    warnings: tuple[str, ...] = ()
    sampling: str = "poisson"
    population: tuple[int, ...] = ()
    noise_multiplier_always: tuple[np.ndarray, ...] = field(default=(), repr=False)
    node_delta: tuple[float, ...] = ()
    eps_heuristic: tuple[float, ...] = ()
    reproducible: bool = False
    noise_sampler: str = "float"

    def __post_init__(self) -> None:
        # the std a node draws and the steps it is charged describe one release: a plan that would draw
        # noise it never charges (or charge noise it never draws) is refused here, not found in a ledger
        for i in range(len(self.noise_std)):
            std, nu = np.asarray(self.noise_std[i]), np.asarray(self.noise_multiplier[i])
            if std.shape != nu.shape:
                raise ValueError(f"node {i}: noise_std has shape {std.shape} but noise_multiplier {nu.shape}, got a mismatch; "
                                 "one entry per iteration in both")
            if self.heuristic:
                continue
            charged = np.isfinite(nu) & (nu > 0)
            if self.private and not np.array_equal(std > 0, charged):
                k = int(np.flatnonzero((std > 0) != charged)[0])
                raise ValueError(f"node {i} iteration {k}: noise_std = {std[k]} but noise_multiplier = {nu[k]}, got a release "
                                 "that is drawn but not charged or charged but not drawn; both must be > 0 "
                                 "(finite noise_multiplier) or both off (std 0, noise_multiplier inf)")
            if not self.private and (std > 0).any():
                raise ValueError(f"node {i}: a plan with private=False draws noise (noise_std > 0), got "
                                 f"max {float(std.max())}; nothing would be charged for it")

    @property
    def eps_key(self) -> str:
        """The name this plan's eps is reported under: ``"eps_heuristic"`` (DPPS family) or ``"eps_rigorous"``."""
        return "eps_heuristic" if self.heuristic else "eps_rigorous"

    def eps_planned(self, i: int) -> float:
        """Node ``i``'s planned eps under :attr:`eps_key` (a number for every plan, whatever its name)."""
        return float(self.eps_heuristic[i] if self.heuristic else self.eps_rigorous[i])

    def delta_of(self, i: int) -> float:
        """Node ``i``'s delta (heterogeneous budgets: its own, not the largest across nodes)."""
        return float(self.node_delta[i]) if self.node_delta else float(self.delta)

    def steps(self, i: int, start: int = 0, stop: int | None = None) -> list:
        """The accountant steps of node ``i``'s iterations ``[start, stop)``, in iteration order.

        The one description of what a node's noise costs: nodes charge exactly these (those with a
        finite multiplier, :meth:`charged_steps`, through :meth:`release`), the budget truncation and the
        plan's eps use them.
        """
        stop = self.num_iters if stop is None else int(stop)
        nu = self.noise_multiplier[i][start:stop]
        if self.heuristic:
            return [LaplaceStep(float(v)) for v in nu]
        pop = self.population[i] if self.sampling == "fixed_size" else None
        sampling = TABLE_SAMPLING if self.noise_multiplier_always and self.sampling == "fixed_size" else self.sampling
        main = [GaussianStep(self.q[i], float(v), 1, sampling, pop) for v in nu]
        if not self.noise_multiplier_always:
            return main
        extra = [GaussianStep(1.0, float(v)) for v in self.noise_multiplier_always[i][start:stop]]
        return [s for pair in zip(main, extra) for s in pair]

    def charged_steps(self, i: int, start: int = 0, stop: int | None = None) -> list:
        """What the accountant is charged for node ``i``'s iterations ``[start, stop)``: :meth:`steps` that
        add noise (multiplier > 0 and finite); none for a non-private plan."""
        if not self.private:
            return []
        return [s for s in self.steps(i, start, stop) if s.noise_multiplier > 0 and math.isfinite(s.noise_multiplier)]

    def release(self, i: int, k: int) -> NoiseRelease:
        """Node ``i``'s noise release at iteration ``k``: the std it draws and the steps it is charged."""
        return NoiseRelease(float(self.noise_std[i][k]), tuple(self.charged_steps(i, k, k + 1)))

    def exact_steps(self, i: int, start: int = 0, stop: int | None = None) -> list[tuple[float, float, int]]:
        """Exact mode: node ``i``'s planned discrete Gaussian releases ``(q, sigma / Delta, 1)`` for iterations
        ``[start, stop)`` (``Delta``: the rounded sensitivity, :func:`flower_dp.mechanisms.exact_release.inflation`
        times the clip bound)."""
        from flower_dp.mechanisms.exact_release import inflation

        infl = inflation(self.dim)
        stop = self.num_iters if stop is None else int(stop)
        return [(float(self.q[i]), float(v) / infl, 1) for v in self.noise_multiplier[i][start:stop]
                if v > 0 and math.isfinite(v)]

    def summary(self, device: Any = "cpu") -> dict[str, Any]:
        """JSON-friendly description for the results file; ``noise`` names the sampler of the nodes' ``device`` (a
        device or a list of them: :func:`flower_dp.rng.noise_record`)."""
        p = {f.name: getattr(self.params, f.name) for f in fields(self.params)}
        return {
            "algorithm": self.algorithm,
            "params": {k: (list(v) if isinstance(v, tuple) else v) for k, v in p.items()},
            "n_nodes": self.n_nodes,
            "num_iters": self.num_iters,
            "num_iters_requested": self.num_iters_requested,
            "dim": self.dim,
            "seed": self.seed,
            "q": list(self.q),
            "eps_rigorous": None if self.heuristic else list(self.eps_rigorous),
            **({"eps_heuristic": list(self.eps_heuristic), "privacy_note": HEURISTIC_NOTE} if self.heuristic else {}),
            "eps_paper": list(self.eps_paper),
            "delta": self.delta,
            "accountant": self.accountant,
            "adjacency": self.adjacency,
            "sampling": self.sampling,
            "heuristic": self.heuristic,
            "private": self.private,
            "noise_std_first_last": [[float(s[0]), float(s[-1])] if len(s) else [] for s in self.noise_std],
            "warnings": list(self.warnings),
            "reproducible": self.reproducible,
            "noise": noise_record(self.reproducible, device=device, sampler=self.noise_sampler),
        }


def validate_params(cls: type, params: dict[str, Any], algorithm: str) -> Any:
    """Build the frozen params dataclass ``cls`` from a plain dict, reporting every problem at once.

    ``cls`` may define ``problems(self) -> list[str]`` for value checks.

    Raises
    ------
    ConfigError
        Listing every unknown key (with the valid keys) and every bad value.
    """
    if not isinstance(params, dict):
        raise ConfigError(f"params for {algorithm!r} must be a dict, got {type(params).__name__}")
    valid = [f.name for f in fields(cls)]
    problems = [
        f"unknown parameter {key!r} for algorithm {algorithm!r}; valid keys are {valid}" for key in params if key not in valid
    ]
    if problems:
        raise ConfigError("; ".join(problems), problems)
    try:
        obj = cls(**params)
    except (TypeError, ValueError) as exc:  # a missing required key or a bad type
        raise ConfigError(f"bad parameters for {algorithm!r}: {exc}") from exc
    problems = list(obj.problems()) if hasattr(obj, "problems") else []
    if problems:
        raise ConfigError(f"bad parameters for {algorithm!r}: " + "; ".join(problems), problems)
    return obj


def ablate(plan: Plan, *, noise: bool = True, clip: bool = True) -> Plan:
    """The plan with its noise (``noise=True``) and/or clipping (``clip=True``) switched off.

    For reductions and tests (every algorithm is SGP at noise 0, clip inf).  Without noise nothing is charged and
    eps is reported as inf.  DPPS: noise off means gamma_n = 0.
    """
    K = plan.num_iters
    changes: dict[str, Any] = {}
    notes = []
    if noise:
        changes.update(noise_std=tuple(np.zeros(K) for _ in plan.noise_std), noise_multiplier=tuple(np.full(K, np.inf) for _ in plan.noise_multiplier),
                       noise_multiplier_always=tuple(np.full(K, np.inf) for _ in plan.noise_multiplier_always),
                       eps_paper=(math.inf,) * plan.n_nodes, private=False,
                       **({"eps_heuristic": (math.inf,) * plan.n_nodes} if plan.heuristic
                          else {"eps_rigorous": (math.inf,) * plan.n_nodes}))
        if hasattr(plan.params, "gamma_n"):
            changes["params"] = replace(plan.params, gamma_n=0.0)
        notes.append("ablation: noise off (not private)")
    if clip:
        changes["clip"] = tuple(np.full(K, np.inf) for _ in plan.clip)
        if hasattr(plan.params, "clip_l1"):
            changes["params"] = replace(changes.get("params", plan.params), clip_l1=math.inf)
        notes.append("ablation: clipping off")
    return replace(plan, warnings=plan.warnings + tuple(notes), **changes)


#: the algorithms whose nodes release through PushSumNode.private_gradient (the exact mode's release)
EXACT_ALGORITHMS = ("sgp", "dyn_d2p", "dp2_sgd", "adp2_sgd", "dp_csgp")


def exact_plan(plan: Plan) -> Plan:
    """``plan`` in the exact mode (``noise_sampler="exact"``) at the same eps: every node's noise std and multiplier
    scaled by the smallest factor with which the discrete Gaussian's bound (rounding inflation included;
    :mod:`flower_dp.privacy.discrete_gaussian`) gives at most the float plan's ``eps_rigorous``.  Only plans of
    Poisson-sampled Gaussian releases (SGP, Dyn-D2P and its variants) have an exact mode."""
    from flower_dp.privacy.discrete_gaussian import calibrate_factor, exact_epsilon

    if (plan.heuristic or plan.sampling != "poisson" or plan.noise_multiplier_always
            or plan.algorithm not in EXACT_ALGORITHMS):
        raise ConfigError(f"noise_sampler='exact' covers the Poisson-sampled Gaussian releases of {EXACT_ALGORITHMS}, got "
                          f"{plan.algorithm!r} ({'Laplace' if plan.heuristic else plan.sampling} releases); use "
                          "noise_sampler='float' for it")
    base = replace(plan, noise_sampler="exact")
    if not plan.private:
        return base
    stds, nus, eps = [], [], []
    for i in range(plan.n_nodes):
        steps = base.exact_steps(i)
        f = calibrate_factor(steps, plan.delta_of(i), float(plan.eps_rigorous[i])) if steps else 1.0
        stds.append(np.asarray(plan.noise_std[i]) * f)
        nus.append(np.asarray(plan.noise_multiplier[i]) * f)
        eps.append(exact_epsilon([(q, z * f, c) for q, z, c in steps], plan.delta_of(i)) if steps else 0.0)
    factor = max((float(n[0] / o[0]) for n, o in zip(nus, plan.noise_multiplier) if len(o) and o[0] > 0),
                 default=1.0)
    note = (f"exact noise: discrete Gaussian on an integer grid, noise scaled by {factor:.3f}x for the same eps "
            "(its bound: CKS zCDP with Zhu-Wang Poisson subsampling)")
    return replace(base, noise_std=tuple(stds), noise_multiplier=tuple(nus), eps_rigorous=tuple(eps),
                   warnings=plan.warnings + (note,))
