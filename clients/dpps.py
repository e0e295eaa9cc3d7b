"""DPPS / PartPSP / SGPDP (Zhou, Xue, Chen) and the PEDFL approximation.

Perturbed push-sum: Laplace noise is added to the shared *state* (not only to messages),
scaled by a network-wide sensitivity estimate (eq. 22) or the oracle real sensitivity.
Requires doubly stochastic P^k (the sensitivity lemma); sync rounds are a topology
(``with_sync``) and the estimator resets at ``k % sync_period == 0``.

===========================  ==============================================================
paper symbol                 code
===========================  ==============================================================
s_i, a_i, y_i = s_i / a_i    ``self.x`` (shared part only, d_s), ``self.w``, ``self.z()``
l_i                          ``self.l`` (node-local head, never sent)
eps_i^(t) = -gamma_s g_s     ``pert``;  gamma_s, gamma_l = ``params.lr``, ``params.lr_l``
c (L1 clip, eq. 24)          ``params.clip_l1`` (inf = off, the MLP default)
C', lambda, b, gamma_n       ``params.c_prime``, ``params.lam``, ``params.b``, ``params.gamma_n``
S_i^(t), S^(t)               ``self.S_i`` (contributed, "max"), ``reduced["S"]``
real sensitivity             ``reduced["S_real"]`` = max_ij ||s_half_i - s_half_j||_1 (oracle)
===========================  ==============================================================

Privacy: per round a Laplace release with ``noise_multiplier = gamma_n / b`` (pure b/gamma_n-DP per
node-message under the *estimated* sensitivity), composed over rounds and tagged HEURISTIC.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch

from flower_dp.gossip import Contribution, Share
from flower_dp.mechanisms.flat import param_slices
from flower_dp.privacy import dpps_accounting

from .base import DPSGDNode, FLOAT_BITS, Plan, PushSumNode
from .sgp import SGPParams

__all__ = ["DPPSParams", "PEDFLParams", "DPPSNode", "PEDFLNode", "prepare_dpps", "prepare_pedfl"]


@dataclass(frozen=True)
class PEDFLParams(SGPParams):
    """Laplace-on-the-state hyperparameters shared by the DPPS family and PEDFL.

    lr : gamma_s (shared part);  batch_size : expected batch (Poisson, mean over the expected size)
    gamma_n : noise scale factor (0 = no noise);  b : privacy parameter (eps_round = b / gamma_n)
    clip_l1 : L1 clip c of the shared gradient (inf = off);  sync_period : all-to-all average period (0 = off)
    delta : only for reporting a composed (eps, delta) of the heuristic Laplace releases
    decay_at, decay_factor : step decay: from each round k in ``decay_at`` on, gamma_s, gamma_l and gamma_n are
        divided by ``decay_factor`` once more (the authors' code: / 10 at the start of epochs 5 and 10; () = off).
        A smaller gamma_n raises the per-round eps b / gamma_n, and the accounting follows the schedule.
    """

    lr: float = 0.1
    batch_size: int = 100
    gamma_n: float = 1e-3
    b: float = 5.0
    clip_l1: float = math.inf
    sync_period: int = 5
    delta: float = 1e-5
    accountant: str = "auto"
    budget_epsilon: float | None = None
    decay_at: tuple[int, ...] = ()
    decay_factor: float = 10.0

    def rate(self, k: int) -> float:
        """The step-decay multiplier of round ``k`` on gamma_s, gamma_l and gamma_n (1.0 before the first decay)."""
        return float(self.decay_factor) ** -sum(1 for d in self.decay_at if k >= d)

    def problems(self) -> list[str]:
        out = super().problems()
        at = tuple(self.decay_at) if isinstance(self.decay_at, (tuple, list)) else None
        if at is None or not all(isinstance(d, int) and d >= 1 for d in at) or list(at) != sorted(set(at)):
            out.append(f"decay_at must be increasing rounds >= 1 (e.g. (240, 540); () = off), got {self.decay_at!r}")
        if not (isinstance(self.decay_factor, (int, float)) and self.decay_factor > 0):
            out.append(f"decay_factor must be > 0, got {self.decay_factor!r}")
        if not (isinstance(self.gamma_n, (int, float)) and self.gamma_n >= 0):
            out.append(f"gamma_n must be >= 0, got {self.gamma_n!r}")
        if not (isinstance(self.b, (int, float)) and self.b > 0):
            out.append(f"b must be > 0, got {self.b!r}")
        if not (isinstance(self.clip_l1, (int, float)) and self.clip_l1 > 0):
            out.append(f"clip_l1 must be > 0 (inf = off), got {self.clip_l1!r}")
        if not (isinstance(self.sync_period, int) and self.sync_period >= 0):
            out.append(f"sync_period must be an integer >= 0 (0 = off), got {self.sync_period!r}")
        return out


@dataclass(frozen=True)
class DPPSParams(PEDFLParams):
    """PartPSP / SGPDP hyperparameters (the paper's Algorithms 1-2).

    lr_l : gamma_l (local head);  c_prime, lam : estimator constants C', lambda (tuned, 3.3)
    split : "partpsp1" | "partpsp2" | "all" (SGPDP);  model_name : for ``shared_parameter_names``
    sensitivity : "estimate" (eq. 22) or "real" (oracle max pairwise L1, Table 2)
    estimator_state : "network_max" (code default) or "own" (eq. 22 literally)
    reset_floor : in a reset round (k = 0 and the round after each sync) contribute at least 2 ||eps_i||_1, so the
        network S >= 2 max_i ||eps_i||_1 (the real sensitivity of equal s_i is
        max_ij ||eps_i - eps_j||_1 <= 2 max_i ||eps_i||_1, which the reset value 2 C' max_i ||eps_i||_1 misses
        when C' < 1).  Off by default: the paper's and the code's estimator.
    measure_real : also measure the real sensitivity each round (diagnostic, O(n^2 d_s) at the backend)
    """

    lr_l: float = 0.1
    c_prime: float = 0.78
    lam: float = 0.55
    split: str = "partpsp1"
    model_name: str = "partpsp_mlp"
    sensitivity: str = "estimate"
    estimator_state: str = "network_max"
    reset_floor: bool = False
    measure_real: bool = False

    def problems(self) -> list[str]:
        out = super().problems()
        if self.sensitivity not in ("estimate", "real"):
            out.append(f"sensitivity must be 'estimate' or 'real', got {self.sensitivity!r}")
        if self.estimator_state not in ("network_max", "own"):
            out.append(f"estimator_state must be 'network_max' or 'own', got {self.estimator_state!r}")
        if not isinstance(self.reset_floor, bool):
            out.append(f"reset_floor must be True or False, got {self.reset_floor!r}")
        if self.split not in ("partpsp1", "partpsp2", "all"):
            out.append(f"split must be 'partpsp1', 'partpsp2' or 'all', got {self.split!r}")
        return out


def _laplace_plan(name: str, p: PEDFLParams, *, n_nodes, samples_per_node, num_iters, dim, seed) -> Plan:
    K = int(num_iters)
    J = tuple(int(j) for j in samples_per_node)
    private = p.gamma_n > 0
    notes = ["DPPS-family privacy is HEURISTIC: the sensitivity is estimated (or an oracle) and published in "
             "the clear; eps is per node-message, not record-level"]
    gamma = float(p.gamma_n) * np.array([p.rate(k) for k in range(K)])  # noise rate per round (step decay)
    if private:
        acc = dpps_accounting(p.b, gamma, p.delta, accountant=p.accountant)
        eps_r, eps_p = acc.eps_composed, float(acc.eps_round_paper.max())  # eps_r: reported as eps_heuristic
        notes.append(f"paper eps is per round (b/gamma_n = {eps_p:.4g}); basic composition over K: {acc.eps_basic:.4g}")
    else:
        eps_r = eps_p = math.inf
    return Plan(
        algorithm=name, params=p, n_nodes=n_nodes, samples_per_node=J, num_iters=K, num_iters_requested=K, dim=dim,
        seed=seed, q=(1.0,) * n_nodes, clip=(np.full(K, float(p.clip_l1)),) * n_nodes,
        noise_std=(np.zeros(K),) * n_nodes, noise_multiplier=(gamma / p.b if private else np.full(K, np.inf),) * n_nodes,
        eps_rigorous=(None,) * n_nodes, eps_heuristic=(float(eps_r),) * n_nodes, eps_paper=(float(eps_p),) * n_nodes,
        delta=p.delta,
        accountant=p.accountant, heuristic=True, private=private, warnings=tuple(notes),
    )


def prepare_dpps(name: str, p: DPPSParams, **kw) -> Plan:
    """Plan for ``partpsp`` or ``sgpdp`` (SGPDP shares every parameter: ``split`` must be "all")."""
    if name == "sgpdp" and p.split != "all":
        p = dataclasses.replace(p, split="all")
    if name == "partpsp" and p.split == "all":
        raise ValueError("partpsp with split='all' is SGPDP, got split='all'; use algorithm 'sgpdp' or a partpsp split")
    return _laplace_plan(name, p, **kw)


def prepare_pedfl(p: PEDFLParams, **kw) -> Plan:
    """Plan for PEDFL (an approximation: the paper does not specify it): oracle sensitivity only."""
    return _laplace_plan("pedfl", p, **kw)


def _check_doubly(node: PushSumNode) -> None:
    if not node.topology.doubly_stochastic:
        raise ValueError(f"{node.plan.algorithm} needs a doubly stochastic topology (sensitivity lemma), got "
                         f"{node.topology.name!r}; use d_out, exp_one_peer, a ring or complete")


def _l1_clip(g: torch.Tensor, c: float) -> torch.Tensor:
    """Eq. (24): ``g / max(1, ||g||_1 / c)``."""
    return g if math.isinf(c) else g / max(1.0, float(g.abs().sum()) / c)


class DPPSNode(PushSumNode):
    """PartPSP (shared front part + local head) or SGPDP (everything shared) with DPPS noise."""

    def __init__(self, plan: Plan, **kw) -> None:
        super().__init__(plan, **kw)
        _check_doubly(self)
        from flower_dp.models import shared_parameter_names

        shared = set(shared_parameter_names(self.params.model_name, self.params.split, self.model))
        slices = param_slices(self.model)
        full = self.x
        self.shared_idx = torch.cat([torch.arange(s.start, s.stop) for n, s in slices.items() if n in shared]
                                    or [torch.zeros(0, dtype=torch.long)]).to(self.device)
        self.local_idx = torch.cat([torch.arange(s.start, s.stop) for n, s in slices.items() if n not in shared]
                                   or [torch.zeros(0, dtype=torch.long)]).to(self.device)
        if self.shared_idx.numel() == 0:
            raise ValueError(f"split {self.params.split!r} shares no parameter of this model, got d_s = 0")
        self.d_full = full.numel()
        self.x = full[self.shared_idx].clone()
        self.l = full[self.local_idx].clone()
        self.S_prev = 0.0
        self.L1_prev = 0.0
        self.S_i = 0.0
        self.x_half = self.x.clone()

    def _assemble(self, shared: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
        full = torch.empty(self.d_full, dtype=torch.float32, device=self.device)
        full[self.shared_idx] = shared
        full[self.local_idx] = local
        return full

    def eval_params(self) -> torch.Tensor:
        """Shared part from ``z = x / w`` plus this node's own head ``l``."""
        return self._assemble(self.z(), self.l)

    def _reset(self, k: int) -> bool:
        sp = self.params.sync_period
        return k == 0 or (sp > 0 and k % sp == 0)

    def contribute(self, k: int) -> dict[str, Contribution] | None:
        self.check_k(k)
        p = self.params
        B = p.batch_size
        idx = self.sample_poisson(k, B)
        z = self.z()
        r = p.rate(k)                                                       # step decay (1.0 when off)
        if self.local_idx.numel():                                          # Alg. 2 step 2, eq. (23)
            g_full, _ = self.grad_mean(self._assemble(z, self.l), idx, B, math.inf, k)
            self.l = self.l - r * p.lr_l * g_full[self.local_idx]
        g_full, stats = self.grad_mean(self._assemble(z, self.l), idx, B, math.inf, k)   # step 3, same batch
        raw = g_full[self.shared_idx]
        g = _l1_clip(raw, float(self.plan.clip[self.node_id][k]))          # eq. (24)
        pert = -r * p.lr * g                                                # eq. (25)
        self.x_half = self.x + pert                                         # eq. (7)
        self.check_finite_(self.x_half, "x_half", k)
        pert_l1 = float(pert.abs().sum())
        if self._reset(k):                                                  # eq. (22), init term dropped (3.3)
            self.S_i = 2 * p.c_prime * pert_l1
            if p.reset_floor:                                               # safe floor: equal s_i ->
                self.S_i = max(self.S_i, 2 * pert_l1)                       # real <= 2 max_i ||eps_i||_1
        else:
            lam_noise = p.lam * p.gamma_n * p.rate(k - 1) * self.L1_prev    # lambda ||gamma_n n||_1, last round
            self.S_i = p.lam * self.S_prev + 2 * p.c_prime * (pert_l1 + lam_noise)
        self._metrics = {**stats, "clip_fraction": float(float(raw.abs().sum()) > self.plan.clip[self.node_id][k]),
                         "sensitivity_own": self.S_i}
        out: dict[str, Contribution] = {}
        if p.gamma_n > 0:
            out["S"] = Contribution(self.S_i, "max")
        if p.sensitivity == "real" or p.measure_real:
            out["S_real"] = Contribution(self.x_half, "max_pairwise_l1")
        return out or None

    def local_step(self, k: int, reduced: dict | None = None) -> list[Share]:
        self.check_k(k)
        p = self.params
        x_noise = self.x_half
        if p.gamma_n > 0:
            S = float(reduced["S_real"] if p.sensitivity == "real" else reduced["S"])
            n = self.release_laplace(k, self.x.numel(), S / p.b)                     # n ~ Lap(0, S/b), charged
            x_noise = self.x_half + p.gamma_n * p.rate(k) * n                         # eq. (8)
            self.L1_prev = float(n.abs().sum())
            self.S_prev = S if p.estimator_state == "network_max" else self.S_i
            self._metrics.update(noise_scale=p.gamma_n * p.rate(k) * S / p.b, sensitivity_est=float(reduced["S"]))
        if reduced is not None and "S_real" in reduced:
            self._metrics["sensitivity_real"] = float(reduced["S_real"])
        self._metrics["noise_std"] = math.sqrt(2) * self._metrics.get("noise_scale", 0.0)
        self._metrics["bits_collective"] = float(FLOAT_BITS * (self.plan.n_nodes - 1)) if p.gamma_n > 0 else 0.0
        return self.push_shares(k, {"x": x_noise}, self.w, FLOAT_BITS * x_noise.numel())

    def _extra_state(self) -> dict:
        return {"l": self.l.cpu().clone(), "S_prev": self.S_prev, "L1_prev": self.L1_prev}

    def _load_extra_state(self, state: dict) -> None:
        self.l = state["l"].to(self.device)
        self.S_prev, self.L1_prev = float(state["S_prev"]), float(state["L1_prev"])

    def params_with_shared(self, shared: torch.Tensor) -> torch.Tensor:
        """The full flat vector of ``shared`` (a shared part, e.g. the network average of the nodes' ``z``) with
        this node's own head ``l``."""
        return self._assemble(shared.to(self.x), self.l)


class PEDFLNode(DPSGDNode):
    """PEDFL approximation: D-PSGD with Laplace noise ``gamma_n Lap(S_real / b)`` on the sent model;
    ``mix`` (inherited): ``x = sum_j W[i,j] (x_j + gamma_n n_j) - gamma_s g_i``."""

    def contribute(self, k: int) -> dict[str, Contribution] | None:
        self.check_k(k)
        return {"S_real": Contribution(self.x, "max_pairwise_l1")} if self.params.gamma_n > 0 else None

    def local_step(self, k: int, reduced: dict | None = None) -> list[Share]:
        self.check_k(k)
        p, i = self.params, self.node_id
        idx = self.sample_poisson(k, p.batch_size)
        g, stats = self.grad_mean(self.x, idx, p.batch_size, math.inf, k)
        r = p.rate(k)                                                        # step decay (1.0 when off)
        self.pending = r * p.lr * _l1_clip(g, float(self.plan.clip[i][k]))
        sent = self.x
        self._metrics = dict(stats)
        if p.gamma_n > 0:
            S = float(reduced["S_real"])
            sent = self.x + r * p.gamma_n * self.release_laplace(k, self.x.numel(), S / p.b)
            self._metrics.update(sensitivity_real=S, noise_std=math.sqrt(2) * r * p.gamma_n * S / p.b)
        return self.push_shares(k, {"x": sent}, None, FLOAT_BITS * sent.numel())
