"""The push-sum node base class and the stages every algorithm's node shares.

A node is driven by ``flower_dp.gossip`` through ``setup()``,
``contribute(k)``, ``local_step(k, reduced)`` and ``mix(inbox)``.  This module holds what
every algorithm shares: the flat state ``(x, w)``, Poisson sampling keyed by
``(key, node, "data", k)`` (``key``: the node's secret, or the seed in reproducible mode;
:mod:`flower_dp.rng`), the gradient stages (batch mean dividing by the *expected*
batch size B), sender-scaled shares, the push-sum mix, the privacy ledger and
checkpointing.  Each algorithm module adds only its update rule; the plan a node runs is
:mod:`flower_dp.clients.plan` (its names can be imported from here too).

Nothing here imports Flower: the in-process runner uses these nodes too.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn

from flower_dp.errors import NonFiniteError
from flower_dp.gossip import Contribution, Share
from flower_dp.mechanisms.clipping import batch_gradient, per_sample_clipped_grad_sum, per_sample_clipped_grads
from flower_dp.mechanisms.exact_release import exact_release
from flower_dp.mechanisms.ghost_clipping import check_ghost_supported, ghost_clipped_grad_sum
from flower_dp.mechanisms.flat import flatten_params
from flower_dp.privacy.accountant import NodeAccountant
from flower_dp.mechanisms.noise import NoisePrefetcher, gaussian_noise, laplace_noise
from flower_dp.privacy.discrete_gaussian import exact_epsilon
from flower_dp.rng import NodeKey, exact_noise_stream, exact_stream, node_secret, noise_generator, numpy_rng
from flower_dp.rng import torch_generator

from .plan import HEURISTIC_NOTE, NoiseRelease, Plan, ablate, validate_params

__all__ = ["Plan", "NoiseRelease", "PushSumNode", "DPSGDNode", "validate_params", "ablate", "FLOAT_BITS", "torch_generator", "HEURISTIC_NOTE"]

#: Bits per float32 on the wire (the cost model: self-shares cost 0 bits).
FLOAT_BITS = 32


class PushSumNode:
    """One push-sum node: flat numerator ``x`` (float32), scalar weight ``w``, de-biased ``z = x / w``.

    Subclasses implement :meth:`local_step` (and override :meth:`setup`, :meth:`contribute`,
    :meth:`mix` where the algorithm needs it).  The model is only an architecture: its
    parameters are never read after construction except through the flat state.

    Parameters
    ----------
    plan : Plan
    node_id : int
    topology : flower_dp.topology.Topology
        ``P^k[receiver, sender]``, column-stochastic; the node reads its own column.
    model : nn.Module
        Owned by the node; its initial parameters give ``x^0`` (identical across nodes when
        built from the same seed).
    loss_fn : callable ``(output, y) -> scalar``, mean-reducing.
    data_x, data_y : Tensor, shape (J, ...)
        The node's local dataset.
    device : str
    """

    def __init__(self, plan: Plan, *, node_id: int, topology, model: nn.Module, loss_fn, data_x, data_y,
                 device: str = "cpu") -> None:
        if not 0 <= int(node_id) < plan.n_nodes:
            raise ValueError(f"node_id must be in [0, {plan.n_nodes}), got {node_id}")
        if topology.n != plan.n_nodes:
            raise ValueError(f"topology has {topology.n} nodes but the plan has {plan.n_nodes}, got a mismatch; "
                             "build both with the same n_nodes")
        if len(data_x) != len(data_y):
            raise ValueError(f"data_x and data_y must have the same length, got {len(data_x)} and {len(data_y)}")
        self.plan = plan
        self.params = plan.params
        self.node_id = int(node_id)
        self.topology = topology
        self.device = device
        self.model = model.to(device)
        self.loss_fn = loss_fn
        self.data_x = data_x.to(device)
        self.data_y = data_y.to(device)
        self.J = len(data_x)
        self.x = flatten_params(self.model).to(device=device, dtype=torch.float32)
        self.w = 1.0
        self.accountant = NodeAccountant(plan.accountant, plan.adjacency)
        self._metrics: dict[str, float] = {}
        self._bits_sent = 0
        # key of the private streams ("noise", "data"): a fresh 256-bit secret, or the seed in reproducible
        # mode (flower_dp.rng); never in state_dict, results or logs
        self._private_key: NodeKey = node_secret(plan.reproducible, plan.seed)
        self._prefetcher: NoisePrefetcher | None = None
        # exact mode: the discrete Gaussian releases charged so far, {(q, noise_multiplier): count}
        self._exact_ledger: dict[tuple[float, float], int] = {}
        self.last_release: np.ndarray | None = None  # exact mode: the int64 vector the last release published

    def prefetch_noise(self, enabled: bool = True) -> None:
        """Draw each iteration's Gaussian noise ahead, on the process's noise thread, while the gradients are
        computed (``run.prefetch_noise``; :class:`flower_dp.mechanisms.noise.NoisePrefetcher`).  The same numbers,
        bit for bit; faster when a core is free beside the torch threads, one float64 vector of the noise's length
        more per node.  CPU nodes only (a CUDA node draws on its device): ignored on a GPU."""
        if self._prefetcher is not None:
            self._prefetcher.cancel()
        on_cpu = torch.device(self.device).type == "cpu"
        self._prefetcher = NoisePrefetcher(noise_generator) if enabled and on_cpu else None

    # ----------------------------------------------------------------- interface
    def setup(self) -> None:
        """Local one-off initialisation before k = 0 (default: nothing)."""

    def contribute(self, k: int) -> dict[str, Contribution] | None:
        """Values for a network-wide reduction before ``local_step`` (default: none)."""
        return None

    def local_step(self, k: int, reduced: dict | None = None) -> list[Share]:  # pragma: no cover - abstract
        raise NotImplementedError

    def mix(self, inbox: list[Share]) -> None:
        """Push-sum combine: ``x = sum of x-shares``, ``w = sum of weights`` (inbox in sender order)."""
        self.x = _sum_tensor(inbox, "x", self.x)
        self.w = float(sum(s.weight for s in inbox))

    # ----------------------------------------------------------------- views
    def z(self) -> torch.Tensor:
        """De-biased parameters ``x / w`` (a new tensor, shape (d,))."""
        return self.x / self.w

    def eval_params(self) -> torch.Tensor:
        """The flat vector to evaluate (default: ``z``)."""
        return self.z()

    def last_metrics(self) -> dict[str, float]:
        """Metrics of the last ``local_step`` (loss, clip_fraction, noise_std, bits_sent, ...)."""
        return dict(self._metrics)

    def privacy_report(self) -> dict[str, Any]:
        """Per-node privacy: the eps of the noise actually charged so far, and the plan's numbers.

        Proven mechanisms report ``eps_rigorous`` (PLD/RDP) and ``eps_rigorous_planned``.  A heuristic plan
        (DPPS family) reports ``eps_rigorous: None``, ``eps_heuristic`` / ``eps_heuristic_planned`` and a
        ``privacy_note`` saying why: the same composition, but of releases calibrated to an estimated
        sensitivity, per node-message, with no proof behind it.
        """
        plan, i = self.plan, self.node_id
        exact = getattr(plan, "noise_sampler", "float") == "exact"
        charged = sum(self._exact_ledger.values()) if exact else self.accountant.steps_charged
        if exact and plan.private and charged:
            eps = exact_epsilon([(q, z, c) for (q, z), c in self._exact_ledger.items()], plan.delta_of(i))
        else:
            eps = self.accountant.epsilon(plan.delta_of(i)) if (plan.private and charged) else (
                0.0 if plan.private else float("inf"))
        if plan.heuristic:
            head = {"eps_rigorous": None, "eps_heuristic": float(eps),
                    "eps_heuristic_planned": plan.eps_planned(i), "privacy_note": HEURISTIC_NOTE}
        else:
            head = {"eps_rigorous": float(eps), "eps_rigorous_planned": float(plan.eps_rigorous[i])}
        return {
            **head,
            "eps_paper": float(plan.eps_paper[i]),
            "delta": plan.delta_of(i),
            "accountant": plan.accountant,
            "adjacency": plan.adjacency,
            "heuristic": plan.heuristic,
            "steps_charged": int(charged),
            "noise_sampler": getattr(plan, "noise_sampler", "float"),
        }

    # ----------------------------------------------------------------- checkpoint
    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume (RNG streams are keyed by k, so none is stored).

        The node's private key is never stored.  Reproducible mode: a resumed run equals an uninterrupted
        one bit for bit.  Secret mode: :meth:`load_state_dict` draws a fresh secret, so the resumed run
        continues with fresh, independent noise and batches (valid; it is not the uninterrupted run's numbers).
        """
        return {
            "node_id": self.node_id,
            "algorithm": self.plan.algorithm,
            "x": self.x.detach().cpu().clone(),
            "w": self.w,
            "bits_sent": self._bits_sent,
            "accountant": self.accountant.state_dict(),
            "exact_ledger": [[q, z, c] for (q, z), c in self._exact_ledger.items()],
            "extra": self._extra_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (same plan and node)."""
        if state.get("algorithm") != self.plan.algorithm or state.get("node_id") != self.node_id:
            raise ValueError(
                f"cannot load a state of algorithm {state.get('algorithm')!r} node {state.get('node_id')} into "
                f"{self.plan.algorithm!r} node {self.node_id}, got a mismatch; resume with the same config"
            )
        self.x = state["x"].to(self.device, torch.float32).clone()
        self.w = float(state["w"])
        self._bits_sent = int(state["bits_sent"])
        self.accountant.load_state_dict(state["accountant"])
        self._exact_ledger = {(float(q), float(z)): int(c) for q, z, c in state.get("exact_ledger", [])}
        self._load_extra_state(state["extra"])
        # a restored node never reuses its old noise at another state: fresh secret (seed in reproducible mode)
        self._private_key = node_secret(self.plan.reproducible, self.plan.seed)
        if self._prefetcher is not None:
            self._prefetcher.cancel()  # drawn for the old key: never used

    # ----------------------------------------------------------------- shared stages
    def sample_poisson(self, k: int, batch_size: int) -> torch.Tensor:
        """Poisson batch: each local sample kept independently w.p. ``q = B/J`` (private stream (key, node, data, k)).

        Exact mode (``noise_sampler="exact"``, an integer ``B``): each sample is kept with probability exactly
        ``min(B, J) / J``, decided in integers on the node's ChaCha20 keystream, so the sampling the accountant charges
        is the one that runs; float mode: numpy's PCG64 uniform below ``q`` in float64."""
        if getattr(self.plan, "noise_sampler", "float") == "exact" and float(batch_size).is_integer():
            keep = exact_stream(self._private_key, self.node_id, "data", k).below(self.J, min(int(batch_size), self.J),
                                                                                 self.J)
            return torch.as_tensor(np.flatnonzero(keep), dtype=torch.long)
        q = min(1.0, batch_size / self.J)
        rng = numpy_rng(self._private_key, self.node_id, "data", k)
        return torch.as_tensor(np.flatnonzero(rng.random(self.J) < q), dtype=torch.long)

    @property
    def _clipped_sum(self):
        """Per-sample clipping: the ghost-norm path (no per-sample gradients materialised, 1.3-2x a
        non-private step) when every layer supports it, else the torch.func vmap reference."""
        fn = getattr(self, "_clip_impl", None)
        if fn is None:
            try:
                check_ghost_supported(self.model)
                fn = ghost_clipped_grad_sum
            except (NotImplementedError, ValueError):
                fn = per_sample_clipped_grad_sum
            self._clip_impl = fn
        return fn

    def grad_mean(self, params: torch.Tensor, idx: torch.Tensor, batch_size: int, clip: float, k: int):
        """``(1/B) sum_{s in batch} clipL2_C(grad f(params; s))`` with B the *expected* batch size.

        ``clip = inf`` uses one ordinary backward pass (the non-private path).

        Returns
        -------
        g : Tensor (d,) float32
        stats : dict with ``loss``, ``clip_fraction``, ``batch`` (realised size); ``grad_norm_mean`` (mean
            per-sample norm before clipping) on the private path, ``grad_norm_batch`` (norm of the
            stochastic gradient) on the non-private one
        """
        xb, yb = self.data_x[idx], self.data_y[idx]
        m = len(idx)
        try:
            if math.isinf(clip):
                g, loss = batch_gradient(self.model, self.loss_fn, xb, yb, params=params)
                g = g * (m / batch_size)
                stats = {"loss": loss, "clip_fraction": 0.0, "batch": float(m), "grad_norm_batch": float(g.norm())}
            else:
                gsum, cs = self._clipped_sum(self.model, self.loss_fn, xb, yb, clip, params=params)
                g = gsum / batch_size
                stats = {"loss": cs.mean_loss, "clip_fraction": cs.clip_fraction, "batch": float(m),
                         "grad_norm_mean": cs.mean_norm}
        except NonFiniteError as exc:
            raise NonFiniteError(f"node {self.node_id} at k={k}: {exc}", node=self.node_id, step=k) from exc
        return g.to(torch.float32), stats

    def check_k(self, k: int) -> int:
        """``k`` must index the plan's schedules: 0 <= k < num_iters."""
        if not 0 <= int(k) < self.plan.num_iters:
            raise ValueError(f"node {self.node_id}: iteration k must be in [0, {self.plan.num_iters}) (the plan's K), "
                             f"got {k}; prepare the plan with more num_iters")
        return int(k)

    def check_finite_(self, vec: torch.Tensor, what: str, k: int) -> None:
        """Raise :class:`NonFiniteError` naming node and k when ``vec`` has NaN/inf."""
        if not bool(torch.isfinite(vec).all()):
            bad = int((~torch.isfinite(vec)).sum())
            raise NonFiniteError(
                f"node {self.node_id} at k={k}: {what} has {bad} non-finite entries of {vec.numel()}, got NaN/inf; "
                "lower the learning rate or the noise", node=self.node_id, step=k)

    def push_shares(self, k: int, tensors: dict[str, torch.Tensor], weight: float | None,
                    payload_bits: int, weights: dict[int, float] | None = None) -> list[Share]:
        """Sender-scaled shares for the out-neighbours plus self.

        ``payload_bits`` is the cost of the tensors of one message; the push-sum weight adds
        32 bits when present; the self-share costs 0.
        """
        sw = self.topology.send_weights(self.node_id, k) if weights is None else weights
        bits_msg = payload_bits + (FLOAT_BITS if weight is not None else 0)
        out = []
        for r in sorted(sw):
            p = sw[r]
            out.append(Share(
                sender=self.node_id, receiver=r, k=k,
                tensors={name: t * p for name, t in tensors.items()},
                weight=None if weight is None else p * weight,
                wire_bits=0 if r == self.node_id else bits_msg,
            ))
        sent = sum(s.wire_bits for s in out)
        self._bits_sent += sent
        self._metrics["bits_sent"] = float(sent)
        self._metrics["bits_sent_total"] = float(self._bits_sent)
        return out

    def gaussian(self, k: int, std: float, d: int) -> torch.Tensor:
        """``N(0, std^2 I_d)`` from the private stream (key, node, "noise", k); zeros (no draw) when std == 0."""
        if self._prefetcher is not None:
            nxt = k + 1 if k + 1 < self.plan.num_iters else None
            return self._prefetcher.noise(self._private_key, self.node_id, k, std, d, next_k=nxt)
        gen = noise_generator(self._private_key, self.node_id, k) if std > 0 else None
        return gaussian_noise(d, std, gen, dtype=torch.float32, device=self.device)

    def release_gaussian(self, k: int, d: int) -> tuple[torch.Tensor, float]:
        """Iteration ``k``'s Gaussian noise release, drawn and charged in one call.

        Draws ``N(0, std^2 I_d)`` from the private stream (key, node, "noise", k) with the std of
        :meth:`Plan.release` and charges the accountant that release's steps (PrivSGP-VR: the sampled and
        the always-present part of the one draw).  Returns ``(noise, std)``.
        """
        if self.plan.heuristic:
            raise ValueError(f"{self.plan.algorithm!r} releases Laplace noise with a data-dependent scale, got a "
                             "call to release_gaussian; use release_laplace(k, d, scale)")
        if getattr(self.plan, "noise_sampler", "float") == "exact":
            raise ValueError(f"{self.plan.algorithm!r} node {self.node_id}: the plan is in exact mode, got a call to "
                             "release_gaussian (float noise); an exact release goes through private_gradient")
        rel = self.plan.release(self.node_id, k)
        noise = self.gaussian(k, rel.std, d)
        for step in rel.steps:
            self.accountant.charge(step)
        return noise, rel.std

    def private_gradient(self, k: int, params: torch.Tensor, idx: torch.Tensor, batch_size: int, clip: float):
        """Iteration ``k``'s noisy batch-mean gradient ``(g_noisy, stats, std)``, drawn and charged.

        ``noise_sampler="float"``: :meth:`grad_mean` plus :meth:`release_gaussian`'s noise (``g + noise``).
        ``"exact"``: the release is the int64 vector ``m`` of :func:`flower_dp.mechanisms.exact_release.exact_release`
        (kept in :attr:`last_release`) and ``g_noisy = (gamma / B) m``, post-processing of it; the discrete
        Gaussian is charged to the node's exact ledger (:mod:`flower_dp.privacy.discrete_gaussian`)."""
        if getattr(self.plan, "noise_sampler", "float") != "exact" or math.isinf(clip):
            g, stats = self.grad_mean(params, idx, batch_size, clip, k)
            noise, std = self.release_gaussian(k, g.numel())
            return g + noise, stats, std
        rel = self.plan.release(self.node_id, k)
        xb, yb = self.data_x[idx], self.data_y[idx]
        try:
            rows, cs = per_sample_clipped_grads(self.model, self.loss_fn, xb, yb, clip, params=params)
        except NonFiniteError as exc:
            raise NonFiniteError(f"node {self.node_id} at k={k}: {exc}", node=self.node_id, step=k) from exc
        if rows.shape[0] == 0:
            rows = torch.zeros(0, self.x.numel(), dtype=torch.float32)
        coins = exact_stream(self._private_key, self.node_id, "rounding", k)
        m, gamma, z, _ = exact_release(rows, clip, rel.std * batch_size, coins,
                                            exact_noise_stream(self._private_key, self.node_id, k))
        key = (float(self.plan.q[self.node_id]), float(z))
        self._exact_ledger[key] = self._exact_ledger.get(key, 0) + 1
        self.last_release = m
        g_noisy = torch.from_numpy(m.astype(np.float64) * (gamma / batch_size)).to(self.device, torch.float32)
        stats = {"loss": cs.mean_loss, "clip_fraction": cs.clip_fraction, "batch": float(len(idx)),
                 "grad_norm_mean": cs.mean_norm}
        return g_noisy, stats, rel.std

    def release_laplace(self, k: int, d: int, scale: float) -> torch.Tensor:
        """Iteration ``k``'s Laplace release (DPPS family), drawn and charged in one call.

        The scale is data dependent (the estimated sensitivity over b, known only at run time), so the
        caller gives it; the plan gives the multiplier charged for it (``LaplaceStep(gamma_n / b)``,
        heuristic: it holds only if the estimate bounds the true sensitivity).  Draws ``Lap(0, scale)^d``
        from the private stream (key, node, "noise", k).
        """
        if not self.plan.heuristic:
            raise ValueError(f"{self.plan.algorithm!r} plans Gaussian releases, got a call to release_laplace; "
                             "use release_gaussian(k, d)")
        gen = torch_generator(self._private_key, self.node_id, "noise", k, device=self.device)
        noise = laplace_noise(d, scale, gen, device=self.device)
        for step in self.plan.release(self.node_id, k).steps:
            self.accountant.charge(step)
        return noise


class DPSGDNode(PushSumNode):
    """D-PSGD-type node: the gradient step is taken at the node's own pre-mix x and
    applied after mixing, ``x = sum_j W[i,j] x_j - pending``; needs a doubly stochastic W, no weight.

    Subclasses set ``self.pending`` in ``local_step`` (DP2-SGD, A(DP)2SGD, PEDFL).
    """

    def __init__(self, plan: Plan, **kw) -> None:
        super().__init__(plan, **kw)
        if not self.topology.doubly_stochastic:
            raise ValueError(f"{plan.algorithm} needs a doubly stochastic topology (D-PSGD), got "
                             f"{self.topology.name!r}; use a ring, exp_one_peer, complete or d_out graph")
        self.pending = torch.zeros_like(self.x)

    def mix(self, inbox: list[Share]) -> None:
        """``x = sum_j W[i,j] x_j - pending``."""
        self.x = _sum_tensor(inbox, "x", self.x) - self.pending

    def _extra_state(self) -> dict:
        return {"pending": self.pending.cpu().clone()}

    def _load_extra_state(self, state: dict) -> None:
        self.pending = state["pending"].to(self.device)


def _sum_tensor(inbox: list[Share], name: str, like: torch.Tensor) -> torch.Tensor:
    """Sum of ``share.tensors[name]`` in inbox order (sender order: bitwise reproducible)."""
    if not inbox:
        raise ValueError("empty inbox, got no shares; every node receives at least its self-share")
    total = inbox[0].tensors[name].clone()
    for s in inbox[1:]:
        total += s.tensors[name]
    return total.to(like.dtype)
