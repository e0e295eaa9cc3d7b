"""DP-CSGP: differentially private compressed stochastic gradient push (Zhu et al.).

The paper mixes before stepping; this module re-phases it to step -> mix (identical
trajectory) with the paper's first exchange (t = 1, where Q(0) = 0) done locally in ``setup``.
Symbols (DP-CSGP t = k + 1; docs/symbols.md):

===============================  ===================================================
paper                            code
===============================  ===================================================
x_i^{t+1} (after the step)       ``x_half``
w_i^{t+1} (after the mix)        ``self.x``
y_i^t                            ``self.w``
x_hat_i^t                        ``self.x_hat``
sum_j a_ij x_hat_j               ``self.s`` (one aggregate instead of per-sender replicas)
A, a_ij                          ``P_c = (1 - gamma_c) I + gamma_c P`` (3.7), ``P^k[i, j]``
eta, G, sigma, Q                 ``params.lr``, ``params.G``, ``plan.noise_std``, ``params.compressor``
===============================  ===================================================

Node, one iteration: g = (1/B) sum clip_G(grad f(z; s)) + N(0, sigma^2) -> x_half = x - eta g ->
q = Q(x_half - x_hat) (fresh randomness per (node, k)) -> x_hat += q -> shares ``{q: P_c[r,i] q}``
with weight ``P_c[r,i] w`` (wire: compressor bits + 32) ; mix: s += sum q-shares,
x = x_half - x_hat + s, w = sum weights.  Needs a static graph (F5).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from flower_dp.gossip import Share
from flower_dp.mechanisms.compressors import make_compressor
from flower_dp.privacy import dp_csgp_calibration

from .base import torch_generator, Plan, PushSumNode, _sum_tensor, ablate
from .sgp import SGPParams, nonprivate_plan

__all__ = ["DPCSGPParams", "DPCSGPNode", "prepare_dp_csgp"]


@dataclass(frozen=True)
class DPCSGPParams(SGPParams):
    """DP-CSGP hyperparameters (Algorithm 1, Proposition 2).

    lr : eta;  batch_size : B (Poisson q = B/J);  G : per-sample L2 clip bound
    compressor : "identity", "rand_<a>", "gsgd_<b>[_bucket<m>][_rescale]", "topk_<f>"
    gamma_c : consensus step in (0, 1] (1 = paper; 0.5 for rand_0.5, 0.1 for rand_0.1, 8.1)
    prelude_mix : True = the paper's t = 1 exchange in setup (x, w start at r_i x0, r_i);
                  False = plain SGP start (x_hat = 0)
    nonprivate : no clipping and no noise (the DP-free compressed baseline)
    clip_only : diagnostic twin: per-sample clipping at G with no noise and nothing charged (eps = inf)
    """

    lr: float = 0.03
    batch_size: int = 64
    epsilon: float = 1.0
    delta: float = 1e-4
    G: float = 0.5
    compressor: str = "identity"
    gamma_c: float = 1.0
    prelude_mix: bool = True
    nonprivate: bool = False
    calibration: str = "rigorous"
    c2: float = 1.0
    accountant: str = "auto"
    budget_epsilon: float | None = None
    clip_only: bool = False

    def problems(self) -> list[str]:
        out = super().problems()
        if self.clip_only not in (True, False):
            out.append(f"clip_only must be true or false, got {self.clip_only!r}")
        if self.clip_only and self.nonprivate:
            out.append("clip_only needs the private path (clipping at G), got nonprivate = true; set one of them")
        if not (isinstance(self.gamma_c, (int, float)) and 0 < self.gamma_c <= 1):
            out.append(f"gamma_c must be in (0, 1], got {self.gamma_c!r}")
        if self.calibration not in ("rigorous", "paper"):
            out.append(f"calibration must be 'rigorous' or 'paper', got {self.calibration!r}")
        if not (isinstance(self.G, (int, float)) and self.G > 0):
            out.append(f"G must be > 0, got {self.G!r}")
        try:
            make_compressor(self.compressor)
        except (TypeError, ValueError) as exc:
            out.append(str(exc))
        return out


def prepare_dp_csgp(p: DPCSGPParams, *, n_nodes: int, samples_per_node, num_iters: int, dim: int, seed: int) -> Plan:
    """Plan: sigma on the batch-mean clipped gradient per node (rigorous or Prop. 2), both eps."""
    J = tuple(int(j) for j in samples_per_node)
    K = int(num_iters)
    comp = make_compressor(p.compressor)
    notes = []
    if not comp.contractive(dim):
        notes.append(f"compressor {p.compressor} is not contractive at d = {dim} (omega^2 = {comp.omega2(dim):.3g} "
                     ">= 1): the gossip may diverge; use a bucketed or rescaled gsgd")
    if p.gamma_c == 1 and comp.omega2(dim) >= 0.5:
        notes.append(f"gamma_c = 1 with omega^2 = {comp.omega2(dim):.3g}: rand_0.5 and stronger diverge at gamma_c = 1 "
                     "in simulations; try gamma_c = 0.5 (rand_0.5) or 0.1 (rand_0.1)")
    if p.nonprivate:
        return nonprivate_plan("dp_csgp", p, n_nodes=n_nodes, samples_per_node=J, num_iters=K, dim=dim, seed=seed,
                               batch_size=p.batch_size, warnings=tuple(notes))
    q, std, nu, e_r, e_p = [], [], [], [], []
    memo: dict[int, object] = {}
    for i in range(n_nodes):
        if J[i] not in memo:  # equal J: calibrate once
            memo[J[i]] = dp_csgp_calibration(p.epsilon, p.delta, num_iters=K, J=J[i], batch_size=p.batch_size, G=p.G,
                                             calibration=p.calibration, c2=p.c2, accountant=p.accountant)
        cal = memo[J[i]]
        q.append(cal.q)
        std.append(np.full(K, cal.noise_std))
        nu.append(np.full(K, cal.noise_multiplier))
        e_r.append(cal.eps_rigorous)
        e_p.append(cal.eps_paper)
        notes.extend(f"node {i}: {w}" for w in cal.warnings)
    plan = Plan(
        algorithm="dp_csgp", params=p, n_nodes=n_nodes, samples_per_node=J, num_iters=K, num_iters_requested=K,
        dim=dim, seed=seed, q=tuple(q), clip=(np.full(K, float(p.G)),) * n_nodes, noise_std=tuple(std),
        noise_multiplier=tuple(nu), eps_rigorous=tuple(e_r), eps_paper=tuple(e_p), delta=p.delta, accountant=p.accountant,
        warnings=tuple(notes),
    )
    return ablate(plan, noise=True, clip=False) if p.clip_only else plan  # the clip-only twin: G, no noise


class DPCSGPNode(PushSumNode):
    """One DP-CSGP node (CHOCO-style error feedback + push-sum weights)."""

    def __init__(self, plan: Plan, **kw) -> None:
        super().__init__(plan, **kw)
        if not self.topology.static:
            raise ValueError(f"dp_csgp needs a static topology (receivers keep per-sender state), got "
                             f"{self.topology.name!r} with period {self.topology.period}; use exp_all_hops or a ring")
        self.compressor = make_compressor(self.params.compressor)
        gc, i = float(self.params.gamma_c), self.node_id
        P = self.topology.matrix(0)
        # P_c = (1 - gamma_c) I + gamma_c P, own column (sending) and own row sum (setup), 3.7.
        self.send_w = {r: gc * float(P[r, i]) + (1.0 - gc if r == i else 0.0) for r in range(P.shape[0]) if P[r, i] > 0}
        self.row_sum = float(gc * P[i].sum() + (1.0 - gc))
        self.x_hat = torch.zeros_like(self.x)
        self.s = torch.zeros_like(self.x)
        self.x_half = self.x.clone()
        self._ready = False

    def setup(self) -> None:
        """The paper's t = 1 exchange (Q(0) = 0): x_hat = x0, x = r_i x0, w = r_i, s = r_i x0 (needs identical x0)."""
        if self._ready:
            return
        if self.params.prelude_mix:
            x0 = self.x.clone()
            self.x_hat = x0.clone()
            self.x = self.row_sum * x0
            self.w = self.row_sum
            self.s = self.row_sum * x0
        self._ready = True

    def local_step(self, k: int, reduced: dict | None = None) -> list[Share]:
        self.check_k(k)
        if not self._ready:
            raise RuntimeError(f"node {self.node_id}: call setup() before local_step (DP-CSGP's first exchange "
                               "happens there), got local_step first")
        i, B = self.node_id, self.params.batch_size
        clip = float(self.plan.clip[i][k])
        idx = self.sample_poisson(k, B)                                           # line 9
        g_noisy, stats, std = self.private_gradient(k, self.z(), idx, B, clip)    # lines 10-11 (at z = w / y)
        self.x_half = self.x - self.params.lr * g_noisy                           # line 12
        self.check_finite_(self.x_half, "x_half", k)
        gen = torch_generator(self.plan.seed, i, "compress", k, device=self.device)
        q = self.compressor.compress(self.x_half - self.x_hat, gen)               # lines 1-2 (next t)
        self.x_hat = self.x_hat + q                                               # line 5 (own reference)
        d = q.numel()
        self._metrics = {**stats, "noise_std": std, "clip": clip}
        return self.push_shares(k, {"q": q}, self.w, self.compressor.bits(d), weights=self.send_w)

    def mix(self, inbox: list[Share]) -> None:
        """Lines 5-8: s += sum_j P_c[i,j] q_j; x = x_half - x_hat + s; w = sum_j P_c[i,j] w_j."""
        self.s = self.s + _sum_tensor(inbox, "q", self.s)
        self.x = self.x_half - self.x_hat + self.s
        self.w = float(sum(sh.weight for sh in inbox))

    def _extra_state(self) -> dict:
        return {"ready": self._ready, "x_hat": self.x_hat.cpu().clone(), "s": self.s.cpu().clone(),
                "x_half": self.x_half.cpu().clone()}

    def _load_extra_state(self, state: dict) -> None:
        self._ready = state["ready"]
        self.x_hat = state["x_hat"].to(self.device)
        self.s = state["s"].to(self.device)
        self.x_half = state["x_half"].to(self.device)
