"""Stochastic Gradient Push (SGP, Assran et al. 2019, arXiv 1811.10792) and its Gaussian-DP form.

The reference push-sum algorithm and the node the whole Gaussian
"SGP + per-sample clip + noise" family runs on (Dyn-D2P's five variants are SGP with a
(C_k, sigma_k) table in the plan; see ``dyn_d2p.py``).

One iteration at node i (the skeleton the four push-sum papers share):

=====================  ==========================================================
paper symbol           code
=====================  ==========================================================
x_i^k, w_i^k, z_i^k    ``self.x``, ``self.w``, ``self.z()``
gamma                  ``params.lr``
B (expected batch)     ``params.batch_size``; q = B / J (Poisson)
C_k                    ``plan.clip[i][k]`` (inf: no clipping)
sigma_k / B            ``plan.noise_std[i][k]`` (std on the batch MEAN)
P^k[r, i]              ``topology.send_weights(i, k)[r]``
=====================  ==========================================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from flower_dp.gossip import Share

from .base import FLOAT_BITS, Plan, PushSumNode

__all__ = ["SGPParams", "SGPNode", "prepare_sgp", "nonprivate_plan"]


@dataclass(frozen=True)
class SGPParams:
    """SGP hyperparameters.

    lr : float      step size gamma (> 0; 0 allowed for consensus tests)
    batch_size : int  expected batch size B (Poisson, q = B/J)
    """

    lr: float = 0.05
    batch_size: int = 32

    def problems(self) -> list[str]:
        out = []
        if not (isinstance(self.lr, (int, float)) and self.lr >= 0 and math.isfinite(self.lr)):
            out.append(f"lr must be a finite number >= 0, got {self.lr!r}")
        if not (isinstance(self.batch_size, int) and self.batch_size >= 1):
            out.append(f"batch_size must be an integer >= 1, got {self.batch_size!r}")
        return out


def nonprivate_plan(algorithm: str, params, *, n_nodes: int, samples_per_node, num_iters: int, dim: int,
                    seed: int, batch_size: int, warnings: tuple[str, ...] = ()) -> Plan:
    """A plan with no clipping, no noise and nothing charged (eps = inf)."""
    K = int(num_iters)
    J = tuple(int(j) for j in samples_per_node)
    inf, zero = np.full(K, np.inf), np.zeros(K)
    return Plan(
        algorithm=algorithm, params=params, n_nodes=n_nodes, samples_per_node=J, num_iters=K,
        num_iters_requested=K, dim=dim, seed=seed, q=tuple(min(1.0, batch_size / j) for j in J),
        clip=(inf,) * n_nodes, noise_std=(zero,) * n_nodes, noise_multiplier=(inf,) * n_nodes,
        eps_rigorous=(math.inf,) * n_nodes, eps_paper=(math.inf,) * n_nodes, delta=0.0,
        private=False, warnings=warnings,
    )


def prepare_sgp(params: SGPParams, *, n_nodes: int, samples_per_node, num_iters: int, dim: int, seed: int) -> Plan:
    """Plan for plain (non-private) SGP."""
    return nonprivate_plan("sgp", params, n_nodes=n_nodes, samples_per_node=samples_per_node,
                           num_iters=num_iters, dim=dim, seed=seed, batch_size=params.batch_size)


class SGPNode(PushSumNode):
    """SGP with optional per-sample L2 clipping and Gaussian noise from the plan's table.

    ``local_step``: z = x/w -> Poisson batch -> g = (1/B) sum clip_{C_k}(grad f(z; s)) ->
    + N(0, (sigma_k/B)^2 I) (privacy charged here) -> x_half = x - gamma (g + N) ->
    sender-scaled shares ``{x: P[r,i] x_half}``, weight ``P[r,i] w``.  ``mix``: push-sum sum.
    """

    def local_step(self, k: int, reduced: dict | None = None) -> list[Share]:
        self.check_k(k)
        i = self.node_id
        B = self.params.batch_size
        clip = float(self.plan.clip[i][k])
        idx = self.sample_poisson(k, B)                                   # Poisson(q = B/J)
        # gradient at z, clipped per sample (eq. 5), + N_i^k (std sigma_k / B), drawn and charged (exact mode:
        # integers on a grid + discrete Gaussian, PushSumNode.private_gradient)
        g_noisy, stats, std = self.private_gradient(k, self.z(), idx, B, clip)
        x_half = self.x - self.params.lr * g_noisy                        # step 5: x^{k+1/2}
        self.check_finite_(x_half, "x_half", k)
        self._metrics = {**stats, "noise_std": std, "clip": clip}
        return self.push_shares(k, {"x": x_half}, self.w, FLOAT_BITS * x_half.numel())  # steps 6-7
