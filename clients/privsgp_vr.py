"""PrivSGP-VR (arXiv 2405.02638), PrivSGP, DP2-SGD and A(DP)2SGD.

PrivSGP-VR, block SAGA (Algorithm 1, with blocks of b samples), node i:

=======================  ============================================================
paper symbol             code
=======================  ============================================================
T_i[j], avg_i            ``self.table[j]`` (float32, J/b x d), ``self.avg`` (float64)
xi (sample / block)      ``blk`` ~ U{0..J/b-1} from stream (seed, node, "data", k)
h = grad f_i(z; xi)      block mean of per-sample gradients clipped to G (8.3)
g (eq. 6)                ``h - T[blk] + avg`` with the OLD table entry
sigma_i                  ``plan.noise_std[i][k]`` (std on g)
gamma                    ``params.lr``
=======================  ============================================================

Blocks: the local data is split once (stream (seed, node, "init", 0)) into J // b fixed
blocks of b samples (the remainder is dropped), and one block is drawn uniformly per step.
That is fixed-size sampling, accounted as such under replace-one adjacency (q = 1 / (J // b); charging
Poisson q = b/J at sensitivity G/b would understate eps about 12x on the ci Fig. 9 run): PrivSGP's
block mean moves by 2G/b; PrivSGP-VR's ``h - T[blk]`` by 4G/b when the block
is drawn and its table average by 2G/(b J//b) at every step, charged as a second, non-sampled
Gaussian (``privsgp_vr_calibration``).  PrivSGP is the same node without the table (g = h).
DP2-SGD / A(DP)2SGD (the paper's comparison baselines): D-PSGD plus noise on a doubly stochastic W; the
gradient is taken at the node's own x, the pre-step model is sent (``weight=None``) and
``mix`` subtracts the pending step.  A(DP)2SGD runs on :func:`adp2_matching`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from flower_dp.errors import ConfigError
from flower_dp.gossip import Share
from flower_dp.privacy import paper, privsgp_vr_calibration, rigorous_epsilon
from flower_dp.privacy.accountant import GaussianStep
from flower_dp.rng import numpy_rng

from .base import FLOAT_BITS, DPSGDNode, Plan, PushSumNode
from .sgp import SGPParams

__all__ = ["PrivSGPParams", "PrivSGPVRNode", "DP2SGDNode", "ADP2Node", "prepare_privsgp_family", "adp2_matching"]

FAMILY = ("privsgp_vr", "privsgp", "dp2_sgd", "adp2_sgd")


@dataclass(frozen=True)
class PrivSGPParams(SGPParams):
    """Hyperparameters of PrivSGP-VR and its baselines.

    batch_size : block size b (privsgp_vr, privsgp) or expected Poisson batch B (dp2_sgd, adp2_sgd)
    adjacency : None (default) = "replace_one" for the fixed blocks of privsgp_vr / privsgp (the only
        relation they are accounted under) and "add_remove" for the Poisson batches of dp2_sgd / adp2_sgd
    epsilon, delta : per-node budget; a float, or one value per node (heterogeneous budgets)
    G : gradient norm bound; per-sample gradients are clipped to G when ``clip`` (8.3)
    calibration : "rigorous" or "paper" (eq. 11, needs c2; 0.3724 reproduces K* = 3120, NOT a DP constant)
    noise_std : fixed std on g (e.g. sqrt(0.03)); overrides the calibration (eps then reported)
    kstar_A, kstar_L : when both are set, K = round(K*) from eq. (12) (needs c2) replaces num_iters
    """

    lr: float = 0.03
    batch_size: int = 1
    epsilon: float | tuple = 3.0
    delta: float | tuple = 1e-5
    G: float = 10.0
    clip: bool = True
    calibration: str = "rigorous"
    c2: float | None = None
    noise_std: float | None = None
    kstar_A: float | None = None
    kstar_L: float | None = None
    accountant: str = "auto"
    adjacency: str | None = None
    budget_epsilon: float | None = None

    def problems(self) -> list[str]:
        out = super().problems()
        if self.calibration not in ("rigorous", "paper"):
            out.append(f"calibration must be 'rigorous' or 'paper', got {self.calibration!r}")
        if self.calibration == "paper" and self.c2 is None and self.noise_std is None:
            out.append("calibration 'paper' needs c2 (the paper never gives it; 0.3724 fits its K*), got None")
        if not (isinstance(self.G, (int, float)) and self.G > 0):
            out.append(f"G must be > 0, got {self.G!r}")
        if self.noise_std is not None and not self.noise_std >= 0:
            out.append(f"noise_std must be >= 0, got {self.noise_std!r}")
        if (self.kstar_A is None) != (self.kstar_L is None):
            out.append(f"kstar_A and kstar_L go together, got kstar_A={self.kstar_A}, kstar_L={self.kstar_L}")
        return out


class _ADP2Matchings:
    """``k -> W^k`` of :func:`adp2_matching` (a module-level class, so the topology pickles for process backends)."""

    def __init__(self, n: int) -> None:
        self.n = int(n)

    def __call__(self, k: int) -> np.ndarray:
        n = self.n
        M = np.eye(n)
        pairs = [(a, a + 1) for a in range(k % 2, n - 1, 2)]
        if k % 2 == 1 and n % 2 == 0 and n > 2:
            pairs.append((n - 1, 0))  # the ring's wrap-around edge is odd
        for a, b in pairs:
            M[a, a] = M[b, b] = M[a, b] = M[b, a] = 0.5
        return M


def adp2_matching(n: int):
    """A(DP)2SGD's synchronous simulation (the paper does not specify it): ring-edge matchings alternating
    between the even edges {(0,1),(2,3),...} (k even) and the odd edges {(1,2),(3,4),...} (k odd);
    matched pairs average 1/2-1/2, an unmatched node keeps itself.  Doubly stochastic, period 2."""
    from flower_dp.topology import from_matrix

    return from_matrix(_ADP2Matchings(n), period=2 if n > 1 else 1, name="adp2_matching", doubly_stochastic=True)


def prepare_privsgp_family(name: str, p: PrivSGPParams, *, n_nodes: int, samples_per_node, num_iters: int,
                           dim: int, seed: int) -> Plan:
    """Plan for ``privsgp_vr`` / ``privsgp`` / ``dp2_sgd`` / ``adp2_sgd`` (one noise level per node)."""
    J = tuple(int(j) for j in samples_per_node)
    for key, v in (("epsilon", p.epsilon), ("delta", p.delta)):
        if isinstance(v, tuple) and len(v) != n_nodes:
            raise ConfigError(f"{key} must be one number or one per node ({n_nodes}), got {len(v)} values")
    eps = np.broadcast_to(np.asarray(p.epsilon, dtype=float), (n_nodes,))
    dels = np.broadcast_to(np.asarray(p.delta, dtype=float), (n_nodes,))
    vr = name == "privsgp_vr"
    b = p.batch_size
    K = int(num_iters)
    notes: list[str] = []
    if p.kstar_A is not None:  # eq. (12); DECISION: round, then recompute sigma with the integer K
        k_star = paper.k_star_privsgp_vr(eps, dels, J=min(J), n_nodes=n_nodes, A=p.kstar_A, L=p.kstar_L, d=dim,
                                         G=p.G, c2=p.c2 if p.c2 is not None else 0.3724)
        K = max(1, int(round(k_star)))
        notes.append(f"K = round(K*) = {K} (eq. 12, K* = {k_star:.2f}) replaces num_iters = {num_iters}")
    sampling = "fixed_size" if name in ("privsgp_vr", "privsgp") else "poisson"
    adjacency = p.adjacency or ("replace_one" if sampling == "fixed_size" else "add_remove")
    if sampling == "fixed_size" and adjacency != "replace_one":
        raise ConfigError(f"{name} draws one of J // b fixed blocks per step, which is accounted under adjacency "
                          f"'replace_one' only (removing a record would change the blocks), got {adjacency!r}; "
                          "leave adjacency unset")
    q, std, nu, nu_always, pop, eps_rig, eps_pap = [], [], [], [], [], [], []
    memo: dict[tuple, object] = {}
    for i in range(n_nodes):
        if b > J[i]:
            raise ValueError(f"batch_size b = {b} exceeds node {i}'s J = {J[i]}, got too few samples; lower b")
        key = (float(eps[i]), float(dels[i]), J[i])
        if p.noise_std == 0:  # no noise: nothing to calibrate or charge
            n_blk = J[i] // b
            q.append(1.0 / n_blk if sampling == "fixed_size" else min(1.0, b / J[i]))
            pop.append(n_blk)
            std.append(np.zeros(K))
            nu.append(np.full(K, np.inf))
            nu_always.append(np.full(K, np.inf))
            eps_rig.append(math.inf)
            eps_pap.append(math.nan)
            continue
        if key not in memo:  # equal budgets and J: calibrate once
            memo[key] = privsgp_vr_calibration(key[0], key[1], num_iters=K, J=J[i], G=p.G, block=b, vr=vr,
                                               calibration=p.calibration, c2=p.c2, accountant=p.accountant,
                                               adjacency=adjacency, sampling=sampling,
                                               noise_std=p.noise_std if p.noise_std else None)
        cal = memo[key]
        notes.extend(f"node {i}: {w}" for w in cal.warnings if p.noise_std is None)
        q.append(cal.q)
        pop.append(cal.dataset_size or 0)
        std.append(np.full(K, cal.noise_std))
        nu.append(np.full(K, cal.noise_multiplier))
        nu_always.append(np.full(K, cal.noise_multiplier_always))
        eps_rig.append(float(cal.eps_rigorous))
        eps_pap.append(float(cal.eps_paper))
    clip = np.full(K, p.G if p.clip else np.inf)
    if not p.clip:
        notes.append("clip=False: G is not enforced, so the noise calibration rests on an assumed bound (8.3)")
    return Plan(
        algorithm=name, params=p, n_nodes=n_nodes, samples_per_node=J, num_iters=K, num_iters_requested=int(num_iters),
        dim=dim, seed=seed, q=tuple(q), clip=(clip,) * n_nodes, noise_std=tuple(std), noise_multiplier=tuple(nu),
        eps_rigorous=tuple(eps_rig), eps_paper=tuple(eps_pap), delta=float(dels.max()), accountant=p.accountant,
        adjacency=adjacency, private=bool(any(s[0] > 0 for s in std)), warnings=tuple(notes), sampling=sampling,
        node_delta=tuple(float(d) for d in dels),
        population=tuple(pop) if sampling == "fixed_size" else (),
        noise_multiplier_always=tuple(nu_always) if vr else (),
    )


class PrivSGPVRNode(PushSumNode):
    """PrivSGP-VR (block SAGA table) or, for ``plan.algorithm == "privsgp"``, PrivSGP (no table)."""

    def __init__(self, plan: Plan, **kw) -> None:
        super().__init__(plan, **kw)
        self.vr = plan.algorithm == "privsgp_vr"
        b = self.params.batch_size
        perm = numpy_rng(plan.seed, self.node_id, "init", 0).permutation(self.J)
        self.n_blocks = self.J // b
        self.blocks = torch.as_tensor(perm[: self.n_blocks * b].reshape(self.n_blocks, b), dtype=torch.long)
        self.table: torch.Tensor | None = None
        self.avg: torch.Tensor | None = None
        self._ready = not self.vr

    def memory_bytes(self) -> int:
        """Bytes of the VR table (J/b x d float32) plus the float64 average."""
        d = self.x.numel()
        return (self.n_blocks * d * 4 + d * 8) if self.vr else 0

    def setup(self) -> None:
        """INIT (3.1): T[j] = block mean of clipped gradients at x^0 for all J/b blocks; avg = mean_j T[j]."""
        if self._ready:
            return
        clip = float(self.plan.clip[self.node_id][0])
        z0 = self.z()
        self.table = torch.empty(self.n_blocks, self.x.numel(), dtype=torch.float32, device=self.device)
        for j in range(self.n_blocks):
            self.table[j], _ = self.grad_mean(z0, self.blocks[j], self.params.batch_size, clip, -1)
        self.avg = self.table.to(torch.float64).mean(0)
        self._ready = True

    def vr_gradient(self, z: torch.Tensor, blk: int, clip: float, k: int):
        """``(g, h, stats)`` at ``z`` for block ``blk`` without changing state: h = clipped block-mean
        gradient (step 2), g = h - T[blk] + avg with the OLD table (step 3, eq. 6); PrivSGP: g = h."""
        h, stats = self.grad_mean(z, self.blocks[blk], self.params.batch_size, clip, k)
        if not self.vr:
            return h, h, stats
        return (h.to(torch.float64) - self.table[blk] + self.avg).to(torch.float32), h, stats

    def local_step(self, k: int, reduced: dict | None = None) -> list[Share]:
        self.check_k(k)
        if not self._ready:
            raise RuntimeError(f"node {self.node_id}: call setup() before local_step (PrivSGP-VR fills its table "
                               "at x^0 there), got local_step first")
        i, b = self.node_id, self.params.batch_size
        clip = float(self.plan.clip[i][k])
        blk = int(numpy_rng(self._private_key, i, "data", k).integers(self.n_blocks))  # step 1: xi ~ U (private)
        g, h, stats = self.vr_gradient(self.z(), blk, clip, k)                        # steps 2-3
        if self.vr:
            self.avg += (h.to(torch.float64) - self.table[blk]) / self.n_blocks       # step 4: avg, then table
            self.table[blk] = h                                                       # clean gradient, eq. (5)
        noise, std = self.release_gaussian(k, g.numel())                              # step 5 (both parts charged)
        x_half = self.x - self.params.lr * (g + noise)                                # step 6, eq. (7)
        self.check_finite_(x_half, "x_half", k)
        self._metrics = {**stats, "noise_std": std, "clip": clip, "memory_bytes": float(self.memory_bytes())}
        return self.push_shares(k, {"x": x_half}, self.w, FLOAT_BITS * x_half.numel())  # steps 7-9

    def privacy_report(self) -> dict:
        return {**super().privacy_report(), "memory_bytes": self.memory_bytes()}

    def _extra_state(self) -> dict:
        return {"ready": self._ready, "table": None if self.table is None else self.table.cpu().clone(),
                "avg": None if self.avg is None else self.avg.cpu().clone()}

    def _load_extra_state(self, state: dict) -> None:
        self._ready = state["ready"]
        self.table = None if state["table"] is None else state["table"].to(self.device)
        self.avg = None if state["avg"] is None else state["avg"].to(self.device)


class DP2SGDNode(DPSGDNode):
    """DP2-SGD (D-PSGD + Gaussian noise): needs a doubly stochastic W; no push-sum weight."""

    def local_step(self, k: int, reduced: dict | None = None) -> list[Share]:
        self.check_k(k)
        i, B = self.node_id, self.params.batch_size
        clip = float(self.plan.clip[i][k])
        idx = self.sample_poisson(k, B)
        g_noisy, stats, std = self.private_gradient(k, self.x, idx, B, clip)  # at the node's OWN x (pre-mix)
        self.pending = self.params.lr * g_noisy                    # applied after mixing
        self.check_finite_(self.pending, "gradient step", k)
        self._metrics = {**stats, "noise_std": std, "clip": clip}
        return self.push_shares(k, {"x": self.x}, None, FLOAT_BITS * self.x.numel())


class ADP2Node(DP2SGDNode):
    """A(DP)2SGD, synchronous simulation: DP2-SGD on :func:`adp2_matching` (use ``registry.topology_for``)."""

    def __init__(self, plan: Plan, **kw) -> None:
        super().__init__(plan, **kw)
        if self.topology.name != "adp2_matching":
            raise ValueError(f"adp2_sgd runs on the adp2_matching topology, got {self.topology.name!r}; "
                             "build it with flower_dp.clients.registry.topology_for(plan, base)")
