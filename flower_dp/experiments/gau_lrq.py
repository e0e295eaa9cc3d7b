"""Gau-LRQ experiments: the paper's MNIST/LeNet setting (Sec. VII, Table II) at a chosen scale.

One call runs one method (Gau-LRQ, Dynamic Gau-LRQ or a baseline of the paper's Sec. VII) with the real
:class:`~flower_dp.strategies.gau_lrq.GauLRQ` strategy and the real client mod, either in a Flower
simulation (``backend="simulation"``: ``flwr run`` on Ray, :mod:`flower_dp.experiments.gau_lrq_app`) or in
this process (``backend="inprocess"``, default): an :class:`InProcessGrid` hands each train message to the
same ``ClientApp`` (mods included) that the simulation runs, so the server and client code paths are the
same; only the transport differs.  Node ids differ between the two backends (Flower draws random ones), so
the two sample other clients: equal in law, not bit-identical.

    >>> from flower_dp.experiments.gau_lrq import run_gau_lrq
    >>> res = run_gau_lrq("gau-lrq", num_clients=40, clients_per_round=10, num_rounds=15, local_steps=16,
    ...                   noise_multiplier=0.05, dataset="fashion_mnist", seed=0, out_dir="runs/lrq")
    >>> res["accuracy_per_round"][-1], res["bits_per_round"], res["eps_rigorous"], res["eps_paper"]

The client side (:func:`train`) is ordinary PyTorch code that knows nothing about privacy; the
Gau-LRQ mod does the clipping and encoding.  Data follow the paper's Sec. VII: client ``p`` gets ``per_class``
samples of every class, drawn independently of other clients (overlap allowed), a deterministic
function of ``(seed, p)``; local training is SGD with momentum 0.9 and weight decay 5e-4, batch 32.
Results name the dataset used (Fashion-MNIST is the offline stand-in for MNIST).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import secrets
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode

from flower_dp._checks import check_choice, check_int, check_positive
from flower_dp.clients.lrq_mod import make_gau_lrq_mod
from flower_dp.data import load_dataset, num_classes, stratified_client_indices
from flower_dp.models import build_model
from flower_dp.results import ensure_writable_dir, write_json
from flower_dp.mechanisms.gau_lrq_codec import KEY_DIR_RUN_CONFIG, create_secret_file
from flower_dp.privacy.parties import check_party, gau_lrq_party_epsilon
from flower_dp.strategies.gau_lrq import GauLRQ

__all__ = ["METHODS", "SIX_METHODS", "run_gau_lrq", "run_table", "resolve_method", "InProcessGrid", "train",
           "make_client_app", "new_model", "model_to_arrays", "arrays_to_model", "client_data", "local_train",
           "evaluate", "evaluate_fn", "run_inputs", "ensure_secret_file", "new_secret_file", "seed_for"]

#: name -> (strategy method, default tau).  Paper names, their short forms and the strategy's own codes.
METHODS = {"gau-lrq": ("lrq", 1.0), "dynamic-gau-lrq": ("lrq", 0.9), "gau-sgd": ("gaussian", 1.0),
           "qg-sgd": ("qg", 1.0), "bq-sgd": ("bq", 1.0), "local-sgd": ("none", 1.0)}
_ALIASES = {"lrq": "gau-lrq", "lrq-sgd": "gau-lrq", "gau-lrq-sgd": "gau-lrq", "dlrq": "dynamic-gau-lrq",
            "dlrq-sgd": "dynamic-gau-lrq", "dynamic-gau-lrq-sgd": "dynamic-gau-lrq", "dynamic-lrq": "dynamic-gau-lrq",
            "gaussian": "gau-sgd", "qg": "qg-sgd", "bq": "bq-sgd", "none": "local-sgd"}
#: The six rows of the paper's Table IV, in its order.
SIX_METHODS = ("local-sgd", "gau-sgd", "qg-sgd", "bq-sgd", "gau-lrq", "dynamic-gau-lrq")
PAPER_TITLES = {"gau-lrq": "Gau-LRQ-SGD", "dynamic-gau-lrq": "Dynamic Gau-LRQ-SGD", "gau-sgd": "Gau-SGD",
                "qg-sgd": "QG-SGD", "bq-sgd": "BQ-SGD", "local-sgd": "Local SGD"}
#: Table II's decay factor on MNIST (the Dynamic default).
DYNAMIC_TAU = 0.9


def resolve_method(name: str) -> str:
    """Canonical method name (a key of :data:`METHODS`) for a paper name, alias or strategy code."""
    key = str(name).strip().lower().replace("_", "-").replace(" ", "-")
    key = _ALIASES.get(key, key)
    return check_choice("method", key, tuple(METHODS))


# ----------------------------------------------------------------------------------------------
# The user's side: plain PyTorch, nothing about privacy
# ----------------------------------------------------------------------------------------------
def new_model(name: str = "lenet", seed: int = 0, num_classes: int = 10) -> torch.nn.Module:
    """LeNet-5 (61,706 parameters) or another :func:`flower_dp.models.build_model` name."""
    return build_model(name, seed=seed, num_classes=num_classes)


def model_to_arrays(model: torch.nn.Module) -> ArrayRecord:
    return ArrayRecord({k: Array(v.detach().cpu().numpy().copy()) for k, v in model.state_dict().items()})


def arrays_to_model(arrays: ArrayRecord, model: torch.nn.Module) -> torch.nn.Module:
    model.load_state_dict({k: torch.from_numpy(a.numpy().copy()) for k, a in arrays.items()})
    return model


def client_data(dataset: str, pid: int, per_class: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Client ``pid``'s ``10 per_class`` training samples (class-balanced, overlap across clients allowed)."""
    ds = load_dataset(dataset, train=True)
    idx = torch.from_numpy(stratified_client_indices(ds.y.numpy(), pid, per_class=per_class, seed=seed))
    return ds.x[idx], ds.y[idx]


def local_train(model: torch.nn.Module, x, y, *, steps: int, lr: float, seed: int, batch: int = 32) -> float:
    """``steps`` SGD steps (momentum 0.9, weight decay 5e-4, paper Table II), fresh optimizer state."""
    torch.set_num_threads(1)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    g = torch.Generator().manual_seed(seed)
    model.train()
    loss = torch.tensor(0.0)
    for _ in range(steps):
        b = torch.randint(0, len(y), (batch,), generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[b]), y[b])
        loss.backward()
        opt.step()
    return float(loss.detach())


def evaluate(model: torch.nn.Module, dataset: str, n: int) -> tuple[float, float]:
    """(accuracy, loss) on the first ``n`` test images."""
    ds = load_dataset(dataset, train=False)
    model.eval()
    with torch.no_grad():
        out = model(ds.x[:n])
        acc = float((out.argmax(1) == ds.y[:n]).float().mean())
        return acc, float(torch.nn.functional.cross_entropy(out, ds.y[:n]))


def seed_for(seed: int, pid: int, rnd: int) -> int:
    """The local-training seed of client ``pid`` in round ``rnd`` (public; the LRQ streams use the client's key)."""
    return int(np.random.SeedSequence([seed, pid, rnd]).generate_state(1)[0])


def train(msg: Message, context: Context) -> Message:
    """A Flower train function as a user writes it: Q local steps, reply with the new weights."""
    rc, pid = msg.content["config"], int(context.node_config["partition-id"])
    dataset = str(rc.get("dataset", "fashion_mnist"))
    model = arrays_to_model(msg.content["arrays"], new_model(str(rc.get("model", "lenet")),
                                                             num_classes=num_classes(dataset)))
    seed = int(rc.get("seed", 0))
    x, y = client_data(dataset, pid, int(rc.get("per-class", 50)), seed)
    rnd = int(rc["server-round"])
    local_train(model, x, y, steps=int(rc.get("local-steps", 16)), lr=float(rc.get("lr", 0.01)),
                seed=seed_for(seed, pid, rnd))
    # num-examples = per-class x classes, fixed by the config (public); the training loss is a statistic of the
    # client's private data that nobody charges, so it stays here
    content = RecordDict({"arrays": model_to_arrays(model), "metrics": MetricRecord({"num-examples": len(y)})})
    return Message(content=content, reply_to=msg)


def make_client_app(key_dir: str | os.PathLike | None = None) -> ClientApp:
    """:func:`train` under the Gau-LRQ mod; each node reads only its own key, ``client-<partition id>.key``, from
    ``key_dir`` (None: from the run config's ``lrq-key-dir`` or the node config's ``lrq-key-file``)."""
    app = ClientApp(mods=[make_gau_lrq_mod(key_dir=key_dir)])
    app.train()(train)
    return app


def run_inputs(*, dataset: str, model: str, seed: int, per_class: int, local_steps: int, lr: float,
               test_samples: int) -> tuple[ArrayRecord, ConfigRecord, object]:
    """What the server of one run starts from, all public: the initial model (from ``seed``), the train config
    every client gets, and the server-side evaluation on the first ``test_samples`` test images."""
    initial = model_to_arrays(new_model(model, int(seed), num_classes=num_classes(dataset)))
    train_cfg = ConfigRecord({"dataset": dataset, "model": model, "per-class": int(per_class),
                              "local-steps": int(local_steps), "lr": float(lr), "seed": int(seed)})
    return initial, train_cfg, evaluate_fn(dataset, int(test_samples), model)


def evaluate_fn(dataset: str, n: int, model: str = "lenet"):
    """Server-side evaluation on the first ``n`` test images: ``(round, arrays) -> MetricRecord``."""

    def fn(rnd: int, arrays: ArrayRecord) -> MetricRecord:
        acc, loss = evaluate(arrays_to_model(arrays, new_model(model, num_classes=num_classes(dataset))), dataset, n)
        return MetricRecord({"accuracy": acc, "loss": loss})

    return fn


def new_secret_file(path: str | os.PathLike, secret: bytes | None = None) -> str:
    """Write a fresh master secret (32 random bytes, or ``secret``; mode 0600) to ``path``, replacing any earlier
    one (never reused unasked); returns the expanded path."""
    p = Path(os.path.expanduser(str(path)))
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + f".tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_bytes(32) if secret is None else secret)
    os.replace(tmp, p)
    return str(p)


def reproducible_secret(seed: int) -> bytes:
    """The master secret of the seeded simulation mode (``reproducible=True``): a function of the public seed (so
    every client key and the server's stream are too)."""
    return hashlib.sha256(b"flower_dp.gau_lrq.reproducible-secret\x00" + str(int(seed)).encode()).digest()


def ensure_secret_file(path: str | os.PathLike) -> str:
    """Create the master secret (32 random bytes, mode 0600) if missing; returns the expanded path.

    Reuses an existing file: use it only for a path the user named (e.g. the example app's
    ``lrq-secret-file``); :func:`run_gau_lrq` writes a fresh secret per run (:func:`new_secret_file`).
    A reused secret still gives fresh streams, because every run draws a fresh random nonce.
    """
    return str(create_secret_file(path)[0])


# ----------------------------------------------------------------------------------------------
# In-process transport
# ----------------------------------------------------------------------------------------------
class InProcessGrid:
    """The part of Flower's ``Grid`` that :class:`GauLRQ` uses, serving ``num_clients`` nodes in this process.

    Node ``i`` has node id ``first_node_id + i`` (default ``i + 1``) and ``node_config = {"partition-id": i,
    "num-partitions": N}`` and keeps its ``Context`` across rounds.  A ClientApp that raises yields an error reply
    (``CLIENT_APP_RAISED_EXCEPTION``), as in a Flower simulation.
    """

    def __init__(self, client_app: ClientApp, num_clients: int, run_config: dict | None = None,
                 first_node_id: int = 1) -> None:
        self.app = client_app
        self.N = check_int("num_clients", num_clients, minimum=1)
        first = check_int("first_node_id", first_node_id, minimum=1)
        self.contexts = {first + i: Context(run_id=1, node_id=first + i, state=RecordDict(),
                                            run_config=dict(run_config or {}),
                                            node_config={"partition-id": i, "num-partitions": self.N})
                         for i in range(self.N)}

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages, *, timeout: float | None = None) -> list[Message]:
        replies = []
        for msg in messages:
            ctx = self.contexts[int(msg.metadata.dst_node_id)]
            try:
                replies.append(self.app(msg, ctx))
            except Exception as exc:  # noqa: BLE001 -- Flower turns a raising ClientApp into an error reply too
                replies.append(Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                                             reason=f"{type(exc).__name__}: {exc}"), reply_to=msg))
        return replies


@contextlib.contextmanager
def _task_identity():
    """Flower's messages read the process's task identity; set a local one if none is set (restored after)."""
    from flwr.supercore.task_identity import TaskIdentity

    old = (TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id)
    if old[0] is None:
        TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    try:
        yield
    finally:
        TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id = old


# ----------------------------------------------------------------------------------------------
# One experiment
# ----------------------------------------------------------------------------------------------
def run_gau_lrq(method: str, *, num_clients: int = 20, clients_per_round: int = 5, num_rounds: int = 10,
                local_steps: int = 16, epsilon: float | None = None, delta: float = 1e-5, tau: float | None = None,
                noise_multiplier: float | None = None, calibration: str = "rigorous", clip: float = 0.5,
                lr: float = 0.01, dataset: str = "fashion_mnist", model: str = "lenet", per_class: int = 50,
                test_samples: int = 2000, seed: int = 0, out_dir: str | os.PathLike | None = None,
                secret_file: str | os.PathLike | None = None, backend: str = "inprocess", resume: bool = False,
                bq_bits: int = 4, num_cpus: int = 2, client_app: ClientApp | None = None,
                round_timeout_s: float = 600.0, secret: bytes | None = None, reproducible: bool = False,
                party: str | None = None, run_timeout_s: float | None = None) -> dict:
    """Run one Gau-LRQ / baseline experiment and return its results dict (also ``out_dir/results.json``).

    Parameters
    ----------
    method : str
        ``"gau-lrq"``, ``"dynamic-gau-lrq"``, ``"gau-sgd"``, ``"qg-sgd"``, ``"bq-sgd"``, ``"local-sgd"``
        (paper names such as ``"Gau-LRQ-SGD"`` and the strategy codes ``lrq/gaussian/qg/bq/none`` also work).
    num_clients, clients_per_round, num_rounds, local_steps : int
        N, B, K and Q.  Each round samples exactly B of N clients without replacement.
    epsilon, delta : float
        Client-level budget.  Given ``epsilon`` (and no ``noise_multiplier``): z is calibrated so
        that K rounds spend exactly ``epsilon`` under the rigorous accountant (``calibration="paper"``:
        the paper's closed form instead, with a warning giving the rigorous eps).
    noise_multiplier : float or None
        Fixed z (noise std on the sum over S2; per-client sigma = z S2 / sqrt(B)).  With ``epsilon``
        also given: budget-stop mode (train until the next round would exceed ``epsilon``).  Without
        ``epsilon``: the budget is what K rounds at z cost, and Dynamic Gau-LRQ is calibrated to
        that same rigorous eps (its z_k decrease like tau^(k/4)).
    tau : float or None
        Decay of Dynamic Gau-LRQ (None: 0.9 for it, 1 otherwise).
    clip, lr, per_class, test_samples, bq_bits : S2, local learning rate, samples per class and
        client, test images evaluated per round, BQ-SGD's bit width.
    dataset, model : ``"fashion_mnist"`` (offline stand-in for MNIST), ``"mnist"``, ``"synthetic_*"``;
        ``"lenet"`` or another :mod:`flower_dp.models` name.
    seed : int
        Initial model, client data and local minibatches (public).  The client sampling, the LRQ
        streams and the Gaussian noise are keyed by the master secret (and the client keys derived from
        it) and a fresh random nonce.
    out_dir : path or None
        Gets ``results.json`` and ``checkpoint.pt`` after every round (and ``lrq.secret`` when no
        secret is given: keep that file private; nothing else ever holds the secret).
    secret_file, secret : path / bytes or None
        An explicit master secret, held by the server only (reused as asked; the run still draws a
        fresh random nonce, so its streams are fresh).  Each client gets only its own key, derived from it,
        in a private key folder that exists while the run lasts (run config ``lrq-key-dir``).  Neither: a fresh secret per run (32 bytes of
        OS entropy), written to ``out_dir/lrq.secret`` (0600, replacing an earlier one) for a later
        resume, or kept in memory without ``out_dir``.
    reproducible : bool
        Seeded simulation mode: secret and nonce are derived from ``seed`` (the same numbers every run;
        the guarantee holds only against parties that do not know the seed; ``results["noise"]`` says so).
    backend : ``"inprocess"`` or ``"simulation"`` (``flwr run`` on simulated SuperNodes, Ray on loopback only;
        the server and the clients run in other processes, :mod:`flower_dp.experiments.gau_lrq_app`).
    resume : bool
        Continue the run checkpointed in ``out_dir`` with its own secret (``out_dir/lrq.secret`` unless
        one is passed) and nonce (from the checkpoint); ends with exactly the numbers of an uninterrupted run.
    client_app : ClientApp or None
        Replace the ClientApp (it must use the Gau-LRQ mod reading its key from the run config:
        ``gau_lrq_mod`` or ``make_gau_lrq_mod()``); for fault-injection tests.  With
        ``backend="simulation"`` it travels to the SuperNodes as a :mod:`flower_dp.experiments.handoff` file (its functions must be
        importable there, or defined in ``__main__``).
    round_timeout_s : float
        How long the server waits for a round's replies (``backend="simulation"``); a client that has
        not replied by then is dropped from that round's average (recorded in ``rounds[k]["received"]``).
    party : str or None
        Whom the noise is calibrated to and ``eps_rigorous`` stated for (:mod:`flower_dp.privacy.parties`; GauLRQ's
        ``party``): None or ``"model_observer"`` (the released global models: the paper's adversary),
        ``"network_observer"`` (knows who sends: no amplification) or ``"client"`` (with per-client keys).
        Every party's eps is in ``eps_by_party``.
    run_timeout_s : float or None
        ``backend="simulation"``: how long the whole ``flwr run`` may take (None: no bound); past it the run is
        stopped and ``TimeoutError`` raised with its output so far.  Flower's output lines go to stderr as they come.

    Returns
    -------
    dict
        :meth:`GauLRQ.results` plus ``wall_time_s``: ``accuracy_per_round`` (index 0 = before
        training), ``bits_per_round``, ``bytes_per_round``, ``eps_rigorous``, ``eps_paper``,
        ``eps_rigorous_per_round``, ``rounds`` (per-round records), ``stop_reason``, ``run``
        (dataset, model, seed, Q, backend, ...), ``config``, ``privacy``.  BQ-SGD (no DP proof):
        ``eps_rigorous`` None, ``eps_heuristic``, ``eps_heuristic_per_round`` and ``privacy_note``.
    """
    name = resolve_method(method)
    code, default_tau = METHODS[name]
    tau = default_tau if tau is None else float(tau)
    if name != "dynamic-gau-lrq" and tau != 1.0 and code != "lrq":
        raise ValueError(f"tau < 1 is Dynamic Gau-LRQ only, got tau={tau} for method {method!r}; drop tau")
    backend = check_choice("backend", backend, ("inprocess", "simulation"))
    N, B, K = (check_int(n, v, minimum=1) for n, v in (("num_clients", num_clients),
                                                        ("clients_per_round", clients_per_round),
                                                        ("num_rounds", num_rounds)))
    Q = check_int("local_steps", local_steps, minimum=1)
    check_positive("lr", lr)
    check_positive("round_timeout_s", round_timeout_s)
    z = noise_multiplier
    if code != "none" and epsilon is None:
        if z is None:
            raise ValueError(f"method {method!r} needs epsilon or noise_multiplier, got neither; e.g. epsilon=8")
        epsilon = gau_lrq_party_epsilon(check_party("gau_lrq", party), np.full(K, float(z)), delta, B=B, N=N,
                                        per_client_keys=GauLRQ.per_client_keys)
        if epsilon is None:
            raise ValueError(f"party {party!r} has no eps in this run; calibrate to 'model_observer' or "
                             "'network_observer'")
        epsilon *= 1 + 1e-9
    if tau < 1:  # Dynamic: always calibrated (to epsilon, or to the rigorous eps of K rounds at the fixed z)
        z = None
    if out_dir is not None:
        out_dir = ensure_writable_dir(out_dir)
    secret, secret_file, nonce = _run_secret(name, int(seed), out_dir, secret, secret_file, resume, reproducible)
    run_info = {"method": name, "paper_name": PAPER_TITLES[name], "dataset": dataset,
                "dataset_note": "Fashion-MNIST, the offline stand-in for MNIST" if dataset == "fashion_mnist" else "",
                "model": model, "local_steps": Q, "lr": lr, "per_class": per_class, "test_samples": test_samples,
                "seed": int(seed), "backend": backend, "batch": 32}
    # GauLRQ's keyword arguments besides the secret: plain values, so the simulation's ServerApp can rebuild it
    strategy_kw = dict(num_clients=N, clients_per_round=B, clip=clip, num_rounds=K,
                       epsilon=None if code == "none" else epsilon, delta=delta, method=code, tau=tau,
                       noise_multiplier=z, calibration=calibration, party=party,
                       secret_file=None if secret_file is None else str(secret_file), bq_bits=bq_bits,
                       out_dir=None if out_dir is None else str(out_dir), resume=resume, run_info=run_info,
                       reproducible=reproducible,
                       stream_nonce=nonce,  # None: a fresh random nonce (resume: the checkpoint's)
                       fraction_evaluate=0.0)  # the server evaluates (evaluate_fn); no client-side evaluation
    inputs = dict(dataset=dataset, model=model, seed=int(seed), per_class=int(per_class), local_steps=Q, lr=float(lr),
                  test_samples=int(test_samples))
    # one key file per client (0600) in a private folder (0700) that lives as long as the run: each ClientApp's mod
    # reads only its own (run config "lrq-key-dir"); the master secret stays with the server
    with tempfile.TemporaryDirectory(prefix="flower-dp-lrq-keys-") as keys_home:
        strategy_kw["key_dir"] = str(Path(keys_home) / "keys")
        # built here for the simulation too: bad settings fail in this process, a missing secret_file is created
        strategy = GauLRQ(**strategy_kw, secret=secret)
        t0 = time.time()
        if backend == "inprocess":
            initial, train_cfg, ev = run_inputs(**inputs)
            grid = InProcessGrid(client_app or make_client_app(), N,
                                 run_config={KEY_DIR_RUN_CONFIG: strategy.key_dir})
            with _task_identity():
                strategy.start(grid=grid, initial_arrays=initial, num_rounds=K, train_config=train_cfg,
                               evaluate_fn=ev)
            out = strategy.results()
        else:
            # the ServerApp and the ClientApps run in other processes, whose working folder may differ
            strategy_kw.update({k: None if strategy_kw[k] is None else str(Path(strategy_kw[k]).expanduser().resolve())
                                for k in ("secret_file", "out_dir")})
            out = _simulate(strategy_kw, inputs, num_rounds=K, secret=secret, client_app=client_app,
                            num_cpus=num_cpus, round_timeout_s=round_timeout_s, run_timeout_s=run_timeout_s)
    out["wall_time_s"] = time.time() - t0
    return out


def _simulate(strategy_kwargs: dict, inputs: dict, *, num_rounds: int, secret: bytes | None,
             client_app: ClientApp | None, num_cpus: int, round_timeout_s: float, run_timeout_s: float | None = None,
             progress: bool = True) -> dict:
    """Run GauLRQ(**strategy_kwargs) for ``num_rounds`` on ``strategy_kwargs["num_clients"]`` simulated SuperNodes
    under ``flwr run``; return ``GauLRQ.results()`` of the run.

    ``strategy_kwargs``: plain values (absolute paths for ``out_dir``, ``secret_file`` and ``key_dir``); without a
    ``secret_file`` the master secret is ``secret``, written to a 0600 file in a private folder for the ServerApp to
    read.  The ClientApps read only their own key files, from ``key_dir`` (run config ``lrq-key-dir``).
    ``inputs``: the keyword arguments of :func:`~flower_dp.experiments.gau_lrq.run_inputs`.  ``client_app``: a
    ClientApp of the caller's (it must use the Gau-LRQ mod), carried to the SuperNodes as a
    :mod:`flower_dp.experiments.handoff` file; None runs :func:`~flower_dp.experiments.gau_lrq.make_client_app`.  Raises
    ``RuntimeError`` with the stop reason and the end of Flower's output when the ServerApp did not finish, and
    ``TimeoutError`` when ``flwr run`` runs past ``run_timeout_s`` (None: no bound).  ``progress``: Flower's output
    lines go to stderr as they come.  The private work folder is removed however the run ends.
    """
    from flower_dp.experiments import handoff
    from flower_dp.experiments.flower_run import private_work_dir, run_app

    from .flower_backend import _user_paths, flower_progress

    with private_work_dir("flower-dp-lrq-") as work:  # the master secret and the ClientApp below
        if strategy_kwargs["secret_file"] is not None:
            secret_file = str(strategy_kwargs["secret_file"])
        else:  # the ServerApp reads the secret from a file, never from the run config or a message
            secret_file = handoff.private_file(work / "lrq.secret", secret)
        pickled = handoff.write(client_app, work / "client_app.pkl") if client_app is not None else ""
        spec = {"strategy": strategy_kwargs, "inputs": inputs, "num_rounds": int(num_rounds),
                "round_timeout_s": float(round_timeout_s)}
        (work / "spec.json").write_text(json.dumps(spec))
        results_file = work / "results.json"
        run = run_app("flower_dp.experiments.gau_lrq_app:server_app", "flower_dp.experiments.gau_lrq_app:client_app",
                      num_supernodes=int(strategy_kwargs["num_clients"]), work_dir=work, timeout_s=run_timeout_s,
                      pythonpath=_user_paths(), num_cpus=int(num_cpus), on_line=flower_progress if progress else None,
                      run_config={"spec-file": str(work / "spec.json"), "lrq-secret-file": secret_file,
                                  KEY_DIR_RUN_CONFIG: str(strategy_kwargs["key_dir"]), "client-app-file": pickled,
                                  "results-file": str(results_file)})
        doc = json.loads(results_file.read_text()) if results_file.is_file() else None
    if doc is None or not doc["finished"]:
        reason = "no results written" if doc is None else doc["results"]["stop_reason"]
        raise RuntimeError(f"the Flower simulation ended without finishing the ServerApp (stop reason {reason!r}; "
                           f"flwr run exited with {run.returncode}); the end of its output:\n{run.tail()}")
    return doc["results"]


def _run_secret(name: str, seed: int, out_dir: Path | None, secret: bytes | None, secret_file, resume: bool,
                reproducible: bool) -> tuple[bytes | None, str | None, str | None]:
    """``(secret, secret_file, stream_nonce)`` of one run (one of the first two is None; nonce None = fresh random)."""
    if secret is not None and secret_file is not None:
        raise ValueError("pass secret or secret_file, got both; give one of them")
    if reproducible:
        if secret is not None or secret_file is not None:
            raise ValueError("reproducible=True derives the master secret from the seed, got an explicit secret too; "
                             "drop secret/secret_file or reproducible")
        return reproducible_secret(seed), None, f"{name}-seed-{seed}"
    if secret is not None or secret_file is not None:  # the caller's secret, reused as asked
        return secret, None if secret_file is None else str(secret_file), None
    if resume:  # the checkpointed run's own secret
        path = None if out_dir is None else Path(out_dir) / "lrq.secret"
        if path is None or not path.is_file():
            raise ValueError(f"resume=True needs the master secret of the checkpointed run, got no {path}; pass "
                             "secret_file= (the file that run used)")
        return None, str(path), None
    if out_dir is not None:  # fresh, kept beside the checkpoint for a later resume
        return None, new_secret_file(Path(out_dir) / "lrq.secret"), None
    return secrets.token_bytes(32), None, None


# ----------------------------------------------------------------------------------------------
# The six methods of Table IV
# ----------------------------------------------------------------------------------------------
def run_table(out_dir: str | os.PathLike, *, methods=SIX_METHODS, **kwargs) -> dict:
    """Run every method in ``methods`` with the same settings; write ``table.json`` and ``table.md``.

    ``kwargs`` go to :func:`run_gau_lrq` (each method gets its own fresh secret and nonce, in
    ``out_dir/<method>/lrq.secret``, unless ``secret_file`` / ``secret`` is passed).  With a
    ``noise_multiplier`` and no ``epsilon``, every private method runs at that z and Dynamic
    Gau-LRQ is calibrated to the same rigorous eps.  Returns ``{"setting": str, "rows": [...]}``.
    """
    out = ensure_writable_dir(out_dir)
    rows = []
    for m in methods:
        name = resolve_method(m)
        r = run_gau_lrq(name, out_dir=out / name, **kwargs)
        rows.append({"algorithm": PAPER_TITLES[name], "method": name, "accuracy": r["final_accuracy"],
                     "rounds": r["rounds_completed"], "uplink_bits": r["total_bits_algorithmic"],
                     "bits_per_coord": float(np.mean([x["bits_per_coord"] for x in r["rounds"]]))
                     if r["rounds"] else None,
                     "uplink_MB_carried": r["total_bytes_carried"] / 1e6, "eps_rigorous": r["eps_rigorous"],
                     **({"eps_heuristic": r["eps_heuristic"], "privacy_note": r.get("privacy_note")}
                        if "eps_heuristic" in r else {}),
                     "eps_paper": r["eps_paper"],
                     "z": (r["privacy"] or {}).get("z", [None])[0],
                     "stop": r["stop_reason"][:60], "wall_time_s": r["wall_time_s"]})
    kw = {"num_clients": 20, "clients_per_round": 5, "num_rounds": 10, "local_steps": 16, "dataset": "fashion_mnist",
          "model": "lenet", "clip": 0.5, "lr": 0.01, "delta": 1e-5, "seed": 0, **kwargs}
    setting = (f"dataset {kw['dataset']}{' (offline stand-in for MNIST)' if kw['dataset'] == 'fashion_mnist' else ''}, "
               f"{kw['model']}, N={kw['num_clients']}, B={kw['clients_per_round']}, K={kw['num_rounds']}, "
               f"Q={kw['local_steps']}, S2={kw['clip']}, lr={kw['lr']}, z={kw.get('noise_multiplier')}, "
               f"eps target={kw.get('epsilon')}, delta={kw['delta']}, seed={kw['seed']}")
    md = ["| algorithm | test acc | rounds | uplink bits | bits/coord | bytes carried (MB) | eps rigorous | "
          "eps paper |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        acc = "n/a" if row["accuracy"] is None else f"{row['accuracy']:.4f}"
        bpc = "n/a" if row["bits_per_coord"] is None else f"{row['bits_per_coord']:.3g}"
        md.append(f"| {row['algorithm']} | {acc} | {row['rounds']} | {row['uplink_bits']:.4g} | {bpc} | "
                  f"{row['uplink_MB_carried']:.3f} | {_fmt_eps_row(row)} | "
                  f"{_fmt_eps(row['eps_paper'])} |")
    table = {"setting": setting, "rows": rows}
    write_json(out / "table.json", table)
    (out / "table.md").write_text(setting + "\n\n" + "\n".join(md) + "\n")
    table["markdown"] = setting + "\n\n" + "\n".join(md)
    return table


def _fmt_eps_row(row: dict) -> str:
    """The eps cell of a table row: rigorous, or for BQ-SGD (no DP proof) the heuristic number, labelled."""
    if row.get("eps_heuristic") is not None:
        return f"{_fmt_eps(row['eps_heuristic'])} (heuristic: no DP proof)"
    return _fmt_eps(row["eps_rigorous"])


def _fmt_eps(v) -> str:
    return "inf (no privacy)" if v is None or (isinstance(v, float) and math.isinf(v)) else f"{v:.4g}"
