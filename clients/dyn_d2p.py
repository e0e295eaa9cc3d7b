"""Dyn-D2P: dynamic differentially private decentralized learning (Zhu et al.).

Every variant is SGP (``sgp.SGPNode``) with a per-iteration table ``(C_k, sigma_k)``
computed once at config time, identically for every node (Algorithms 1-5):

==========  ===================  ========================  ===============================
variant     C_k                  mu_k                      solve
==========  ===================  ========================  ===============================
dyn         C0 rho_c^(-k/K)      mu0 rho_mu^(k/K)          eq. (8) (paper) / PLD (rigorous)
dyn_c       C0 rho_c^(-k/K)      mu_bar                    eq. (9) / PLD
dyn_mu      Cbar                 mu0 rho_mu^(k/K)          eq. (8) / PLD
const       Cbar                 mu_bar                    eq. (9) / PLD
general     user list            C_k / (s * shape_k)       eq. (10) (paper) / PLD on the scale s
nonprivate  none                 none                      none
==========  ===================  ========================  ===============================

Symbols: ``sigma_k = C_k / mu_k`` is the std on the SUM of clipped gradients (paper); the plan
stores the std on the batch MEAN, ``sigma_k / B`` (docs/symbols.md).  ``p = q = B / J``.
Privacy: per k a ``PoissonSampled(q, Gaussian(nu_k = sigma_k / C_k))`` event, charged in
``local_step``; ``adjacency="replace_one"`` doubles the sensitivity (f = 2, 4.1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from flower_dp.privacy import calibrate_schedule, dyn_d2p_schedule, gdp, rigorous_epsilon
from flower_dp.privacy.calibration import DYN_VARIANTS
from flower_dp.privacy.accountant import GaussianStep

from .base import Plan, ablate
from .sgp import SGPNode, SGPParams, nonprivate_plan

__all__ = ["DynD2PParams", "DynD2PNode", "prepare_dyn_d2p", "DYN_VARIANTS"]



@dataclass(frozen=True)
class DynD2PParams(SGPParams):
    """Dyn-D2P hyperparameters (Algorithms 1-5).

    variant : one of DYN_VARIANTS
    epsilon, delta : per-node record-level budget
    clip0 : C0, initial clip bound (dyn, dyn_c)
    clip_bar : Cbar, constant clip bound (dyn_mu, const)
    rho_c, rho_mu : decay of C_k / growth of mu_k over the run (>= 1)
    clip_schedule, noise_shape : ``general`` only: C_k and sigmatilde_k lists of length K
    calibration : "rigorous" (PLD/RDP meets eps) or "paper" (GDP-CLT, eqs. 6-10)
    accountant : "pld" or "rdp";  adjacency : "add_remove" (f = 1) or "replace_one" (f = 2)
    budget_epsilon : optional hard stop; K is truncated before it would exceed (budget_epsilon, delta)
    clip_only : diagnostic twin: the variant's clip bounds C_k with no noise and nothing charged (eps = inf); with
        the non-private run it separates what clipping costs from what the noise costs
    """

    variant: str = "dyn"
    epsilon: float = 1.0
    delta: float = 1e-4
    clip0: float = 4.0
    clip_bar: float = 1.5
    rho_c: float = 2.0
    rho_mu: float = 2.0
    clip_schedule: tuple | None = None
    noise_shape: tuple | None = None
    calibration: str = "rigorous"
    accountant: str = "auto"
    adjacency: str = "add_remove"
    budget_epsilon: float | None = None
    clip_only: bool = False

    def problems(self) -> list[str]:
        out = super().problems()
        if self.variant not in DYN_VARIANTS:
            out.append(f"variant must be one of {list(DYN_VARIANTS)}, got {self.variant!r}")
        if self.calibration not in ("rigorous", "paper"):
            out.append(f"calibration must be 'rigorous' or 'paper', got {self.calibration!r}")
        if self.adjacency not in ("add_remove", "replace_one"):
            out.append(f"adjacency must be 'add_remove' or 'replace_one', got {self.adjacency!r}")
        if self.accountant not in ("auto", "pld", "rdp"):
            out.append(f"accountant must be 'pld' or 'rdp', got {self.accountant!r}")
        for name in ("epsilon", "clip0", "clip_bar"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v > 0):
                out.append(f"{name} must be > 0, got {v!r}")
        if not (isinstance(self.delta, float) and 0 < self.delta < 1):
            out.append(f"delta must be in (0, 1), got {self.delta!r}")
        for name in ("rho_c", "rho_mu"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v >= 1):
                out.append(f"{name} must be >= 1 (1 = constant), got {v!r}")
        if self.clip_only not in (True, False):
            out.append(f"clip_only must be true or false, got {self.clip_only!r}")
        if self.clip_only and self.variant == "nonprivate":
            out.append("clip_only needs a variant with clip bounds (const, dyn_mu, dyn_c, dyn, general), got "
                       "'nonprivate'")
        if self.variant == "general" and (self.clip_schedule is None or self.noise_shape is None):
            out.append("variant 'general' needs clip_schedule and noise_shape (lists of length num_iters), got None")
        return out


def _general_schedule(p: DynD2PParams, q: float, K: int):
    """``general`` (Algorithm 2): C_k and sigma_k = s * shape_k; s from eq. (10) or a PLD solve."""
    clip = np.asarray(p.clip_schedule, dtype=float)
    shape = np.asarray(p.noise_shape, dtype=float)
    if clip.shape != (K,) or shape.shape != (K,) or (clip <= 0).any() or (shape <= 0).any():
        raise ValueError(f"clip_schedule and noise_shape must hold {K} positive values (one per iteration), "
                         f"got shapes {clip.shape} and {shape.shape}")
    notes = []
    mu_tot = gdp.mu_from_eps_delta(p.epsilon, p.delta)
    if p.calibration == "paper":  # eq. (10) with 1/J -> p = B/J (3.8)
        s = (q / mu_tot) * math.sqrt(2 * float(np.sum(clip**2 / shape**2)))
        if (clip / (s * shape)).max() > 1:
            notes.append("general/paper: max mu_k > 1, where eq. (10)'s relaxation e^x - 1 < 2x fails (8 #5)")
    else:
        s = calibrate_schedule(shape / clip, p.epsilon, p.delta, q, accountant=p.accountant)
    return clip, s * shape / clip, notes  # nu_k = 1 / mu_k = s shape_k / C_k


def prepare_dyn_d2p(p: DynD2PParams, *, n_nodes: int, samples_per_node, num_iters: int, dim: int, seed: int) -> Plan:
    """Plan for a Dyn-D2P variant: the (C_k, sigma_k) table and both eps (identical at every node)."""
    J = tuple(int(j) for j in samples_per_node)
    if p.variant == "nonprivate":
        return nonprivate_plan("dyn_d2p", p, n_nodes=n_nodes, samples_per_node=J, num_iters=num_iters,
                               dim=dim, seed=seed, batch_size=p.batch_size)
    if len(set(J)) != 1:
        raise ValueError(f"Dyn-D2P needs the same J at every node (one shared schedule), got {sorted(set(J))}; "
                         "partition evenly")
    K = int(num_iters)
    q = min(1.0, p.batch_size / J[0])
    f = 2 if p.adjacency == "replace_one" else 1
    if p.variant == "general":
        clip, nu, notes = _general_schedule(p, q, K)
        steps = [GaussianStep(q, float(v)) for v in nu]
        eps_rig = rigorous_epsilon(steps, p.delta, accountant=p.accountant)
        eps_pap = gdp.eps_from_mu_delta(gdp.clt_composed_mu(q, 1 / nu).mu, p.delta)
    else:
        sch = dyn_d2p_schedule(p.variant, epsilon=p.epsilon, delta=p.delta, q=q, num_iters=K, clip0=p.clip0,
                               clip_bar=p.clip_bar, rho_c=p.rho_c, rho_mu=p.rho_mu, calibration=p.calibration,
                               sensitivity_factor=f, accountant=p.accountant)
        clip, nu, notes = sch.clip, sch.noise_multiplier, list(sch.warnings)
        eps_rig, eps_pap = sch.eps_rigorous, sch.eps_paper
    # nu is std / (f C) (= 1/mu_k); the ledger takes std / C with the adjacency applied by the accountant.
    std_sum = nu * f * clip
    nu_charged = std_sum / clip
    plan = Plan(
        algorithm="dyn_d2p", params=p, n_nodes=n_nodes, samples_per_node=J, num_iters=K,
        num_iters_requested=K, dim=dim, seed=seed, q=(q,) * n_nodes, clip=(clip,) * n_nodes,
        noise_std=(std_sum / p.batch_size,) * n_nodes, noise_multiplier=(nu_charged,) * n_nodes,
        eps_rigorous=(float(eps_rig),) * n_nodes, eps_paper=(float(eps_pap),) * n_nodes, delta=p.delta,
        accountant=p.accountant, adjacency=p.adjacency, warnings=tuple(notes),
    )
    return ablate(plan, noise=True, clip=False) if p.clip_only else plan  # the clip-only twin: C_k, no noise


class DynD2PNode(SGPNode):
    """A Dyn-D2P node: SGP whose clip bound and noise follow the plan's (C_k, sigma_k) table."""
