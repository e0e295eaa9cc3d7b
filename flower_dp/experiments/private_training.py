"""Private push-sum training of your own model on your own data: :func:`train_private`.

It turns a model factory, training data and a held-out test set into an experiment config whose dataset and model
name them (:mod:`flower_dp.sources`), then runs that config as every config runs: in process
(:func:`flower_dp.experiments.runner.run_experiment`) or as a Flower simulation on Ray
(:func:`flower_dp.experiments.flower_backend.run_flower_experiment`).  So it has what those runs have: the one node
builder, per-node privacy accounting, evaluation of the network-average model every ``eval_every`` iterations,
``results.json`` / ``history.csv`` / a checkpoint in ``out_dir``, and ``resume=True``.  The budget is either a
target eps (the noise multiplier is calibrated to it) or a given noise multiplier (its eps is reported).  Read
the eps spent with :meth:`PrivateRun.privacy_spent`.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import sources

__all__ = ["train_private", "PrivateRun", "BACKENDS"]

#: where :func:`train_private` runs the nodes
BACKENDS = ("inprocess", "ray", "flower")
#: algorithms whose Gaussian noise is ``noise_multiplier * clip / batch_size`` on the released batch mean
_MULTIPLIER_ALGORITHMS = ("dp2_sgd", "adp2_sgd", "privsgp")


@dataclass
class PrivateRun:
    """What :func:`train_private` produced (also in ``out_dir/results.json``)."""

    status: str
    history: list[dict[str, Any]]
    privacy: dict[str, Any]
    out_dir: Path | None
    backend: str
    plan: Any = field(default=None, repr=False)
    #: the party the run is calibrated to, and whether the nodes' states came back to the server (a checkpoint)
    party: str = "out_neighbour"
    states_to_server: bool = False

    @property
    def final_accuracy(self) -> float:
        """Test accuracy of the network-average model at the last evaluation (nan before any)."""
        return float(self.history[-1]["acc_avg"]) if self.history else float("nan")

    def privacy_spent(self, party: str | None = None):
        """The privacy spent, as :meth:`flower_dp.PushSumStrategy.privacy_spent` answers it (a ``PrivacySpent``:
        ``epsilon``, ``delta``, ``num_releases``, ``accounting_method`` naming the party), for ``party`` (default:
        the calibrated one, :mod:`flower_dp.privacy.parties`); None for a non-private run."""
        from flower_dp.strategies.flower_privacy import spent_over_nodes

        return spent_over_nodes(self.privacy.get("per_node", []), self.party if party is None else party,
                                self.states_to_server)


def _digest(model_fn: Callable[[], Any], train: tuple[Any, Any], test: tuple[Any, Any], seed: int) -> str:
    """A key naming this model and data: a hash of the tensors and of the model's parameter names and shapes."""
    import torch

    h = hashlib.sha256()
    for t in (*train, *test):
        t = t.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.numpy().tobytes())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_fn()
    h.update(type(model).__qualname__.encode())
    for name, p in model.named_parameters():
        h.update(f"{name}{tuple(p.shape)}".encode())
    return h.hexdigest()[:16]


def _algorithm_params(algorithm: str, params: dict[str, Any] | None, *, target_epsilon: float | None,
                      noise_multiplier: float | None, delta: float, clip: float, batch_size: int,
                      lr: float) -> dict[str, Any]:
    """The ``[algorithm.params]`` of the run: the keyword arguments mapped onto the algorithm's own names."""
    from flower_dp.clients.registry import param_names

    valid = set(param_names(algorithm))
    if target_epsilon is not None and noise_multiplier is not None:
        raise ValueError(f"give target_epsilon (the noise is calibrated to it) or noise_multiplier (its eps is "
                         f"reported), not both; got target_epsilon={target_epsilon}, "
                         f"noise_multiplier={noise_multiplier}")
    if noise_multiplier is not None and algorithm not in _MULTIPLIER_ALGORITHMS:
        raise ValueError(f"noise_multiplier is supported for the algorithms {list(_MULTIPLIER_ALGORITHMS)}, got "
                         f"algorithm={algorithm!r}; pass target_epsilon instead")
    out: dict[str, Any] = {"lr": lr, "batch_size": batch_size}
    if "G" in valid:
        out["G"] = clip
    if "delta" in valid:
        out["delta"] = delta
    if target_epsilon is not None:
        if "epsilon" not in valid:
            raise ValueError(f"algorithm {algorithm!r} has no privacy budget, got target_epsilon={target_epsilon}; "
                             "leave it unset or pick a private algorithm")
        out["epsilon"] = target_epsilon
    if noise_multiplier is not None:
        if not noise_multiplier > 0:
            raise ValueError(f"noise_multiplier must be > 0, got {noise_multiplier}; pass a positive number")
        out["noise_std"] = float(noise_multiplier) * float(clip) / int(batch_size)
    return {**out, **dict(params or {})}


def train_private(model_fn: Callable[[], Any], train: Any, test: Any, *, n_nodes: int = 4, num_iters: int = 100,
                  eval_every: int | None = None, target_epsilon: float | None = None,
                  noise_multiplier: float | None = None, delta: float = 1e-5, clip: float = 1.0,
                  batch_size: int = 32, lr: float = 0.05, algorithm: str = "dp2_sgd",
                  params: dict[str, Any] | None = None, topology: str = "exp_one_peer",
                  partition: str = "shuffle_split", seed: int = 0, reproducible: bool = False,
                  noise_sampler: str = "float",
                  out_dir: str | Path | None = None, resume: bool = False, backend: str = "inprocess",
                  ray_address: str | None = None, num_hosts: int | None = None, device: str = "cpu",
                  name: str = "train_private",
                  progress: bool = False, party: str | None = None) -> PrivateRun:
    """Train ``model_fn()`` with differentially private push-sum on ``n_nodes`` nodes that split ``train``.

    Parameters
    ----------
    model_fn : callable () -> torch.nn.Module
        Your model; every node calls it (under the run's seed, so they start alike).  For ``backend="ray"`` or
        ``"flower"`` it must pickle (a function of your script or module, or a class).
    train, test : data
        Training data (split over the nodes by ``partition``) and a held-out test set the network-average model is
        evaluated on: ``(x, y)`` tensors, a ``DataLoader`` or a dataset (:func:`flower_dp.data.as_tensors`).
        ``y`` holds class labels; the loss is cross-entropy.
    target_epsilon, noise_multiplier : float
        The budget: a target eps per node at ``delta`` (the noise multiplier is calibrated to meet it), or the noise
        multiplier std / (clip x sensitivity) itself (eps is then reported).  One of the two for a private
        algorithm.
    delta, clip, batch_size, lr : float, float, int, float
        delta of the guarantee, per-sample L2 clip bound, expected (Poisson) batch size, step size.
    algorithm, params : str, dict
        A :mod:`flower_dp.clients.registry` algorithm (default ``"dp2_sgd"``: DP-SGD steps mixed by push-sum) and
        extra parameters of it (they override the arguments above).
    n_nodes, num_iters, eval_every, topology, partition, seed, reproducible, device, noise_sampler
        As the ``[topology]``, ``[run]`` and ``[data]`` keys of a config (:mod:`flower_dp.experiments.config`);
        ``eval_every`` defaults to ``num_iters`` (one evaluation at the end).
    out_dir, resume : path, bool
        Where ``results.json``, ``history.csv`` and the checkpoint go (None: nothing written for ``"inprocess"`` and
        ``"ray"``; a temporary folder for ``"flower"``, removed at the end); ``resume=True`` continues from the
        checkpoint of the same call.
    backend, ray_address, num_hosts : str, str, int
        Where the nodes run: ``"inprocess"`` (this process), ``"ray"`` (Ray host actors driven by this process, no
        Flower: :mod:`flower_dp.experiments.ray_cluster`) or ``"flower"`` (a Flower simulation whose ClientApps
        register the nodes on Ray host actors: :mod:`flower_dp.experiments.flower_backend`).  ``ray_address``
        (``"HEAD:PORT"`` or ``"auto"``): the running Ray cluster ``"ray"`` and ``"flower"`` join (default
        ``RAY_ADDRESS``, else a Ray of the run's own on 127.0.0.1).  ``num_hosts``: the Ray host actors (default
        one per CPU of the cluster for ``"ray"``, 2 for ``"flower"``).  For ``"ray"`` and ``"flower"`` ``model_fn``
        must pickle (a function of your script or module, or a class).
    party : str
        Whom the eps is stated for (:mod:`flower_dp.privacy.parties`): ``"out_neighbour"`` (default),
        ``"model_observer"`` (the same eps: the network average is a post-processing of the shares) or
        ``"relay"`` (the same eps; refused when the nodes' states are checkpointed, i.e. with ``out_dir`` or with ``"flower"``).
        ``results.json`` reports every party (``eps_by_party``).

    Returns
    -------
    PrivateRun
        ``history`` (one row per evaluation: ``k``, ``acc_avg``, ``test_loss_avg``, ...), ``final_accuracy``,
        ``privacy_spent()``, ``status``, ``out_dir``.
    """
    from flower_dp._checks import check_choice
    from flower_dp.data import as_tensors
    from flower_dp.privacy.parties import check_push_sum_party

    from .config import config_from_dict

    check_choice("backend", backend, BACKENDS)
    checkpoint = out_dir is not None or backend == "flower"
    party = check_push_sum_party(party, states_to_server=checkpoint)
    if ray_address is not None and backend == "inprocess":
        raise ValueError(f"ray_address={ray_address!r} is for backend='ray' or 'flower', got backend='inprocess'; "
                         "pass backend='ray' or drop ray_address")
    x, y = as_tensors(train)
    x_test, y_test = as_tensors(test)
    num_classes = int(max(int(y.max()), int(y_test.max())) + 1)
    key = sources.PREFIX + _digest(model_fn, (x, y), (x_test, y_test), int(seed))
    sources.register(key, sources.OwnSource(model_fn, (x, y), (x_test, y_test), num_classes))
    cfg = config_from_dict({
        "run": {"name": name, "seed": int(seed), "num_iters": int(num_iters),
                "eval_every": int(eval_every or num_iters), "out_dir": None if out_dir is None else str(out_dir),
                "checkpoint": checkpoint, "progress": bool(progress),
                "device": device, "reproducible": bool(reproducible),
                "noise_sampler": noise_sampler,
                "backend": "ray" if backend == "ray" else "inprocess", "ray_address": ray_address,
                "ray_num_hosts": num_hosts if backend == "ray" else None},
        "data": {"dataset": key, "partition": partition},
        "model": {"name": key},
        "topology": {"name": topology, "n_nodes": int(n_nodes)},
        "algorithm": {"name": algorithm, "params": _algorithm_params(
            algorithm, params, target_epsilon=target_epsilon, noise_multiplier=noise_multiplier, delta=delta,
            clip=clip, batch_size=batch_size, lr=lr)},
        "privacy": {"party": party},
    })
    if backend in ("inprocess", "ray"):
        from .runner import run_experiment

        res = run_experiment(cfg, out_dir=out_dir, resume=resume, progress=progress)
        return PrivateRun(res.status, res.history, res.privacy, res.out_dir, backend, res.plan, party, checkpoint)
    from .flower_backend import run_flower_experiment

    tmp = None if out_dir is not None else Path(tempfile.mkdtemp(prefix="flower-dp-"))
    out = Path(out_dir) if out_dir is not None else tmp
    try:
        doc = run_flower_experiment(cfg, out_dir=out, num_hosts=int(num_hosts or 2), resume=resume,
                                    ray_address=ray_address)
    finally:
        if tmp is not None:  # nothing of the run (its checkpoint holds the nodes' models) stays behind
            shutil.rmtree(tmp, ignore_errors=True)
    return PrivateRun(str(doc["status"]), list(doc.get("history", [])), dict(doc.get("privacy", {})),
                      None if tmp is not None else out, backend, party=party,
                      states_to_server=checkpoint)
