"""Gau-LRQ-SGD (and Dynamic Gau-LRQ-SGD, Gau-SGD, QG-SGD, BQ-SGD, Local SGD) as a Flower strategy.

Yan, Li, Lan, Wu, Song, arXiv:2312.07060 (Alg. 1, Sec. V); spec ``shared/specs/gau-lrq.md``.

==================  ============================  ============================================
paper               spec                          code
==================  ============================  ============================================
N, B, q = B/N       clients, sampled per round    ``num_clients``, ``clients_per_round``
K                   rounds                        ``num_rounds`` (Flower round r = k + 1)
S2                  L2 clip of one update         ``clip``
sigma_k             per-client std per coord.     ``sigma_k = z_k S2 / sqrt(B)`` (§5.3)
z_k                 noise multiplier on the SUM   :attr:`GauLRQ.z`
tau                 decay (Dynamic, §6)           ``tau`` (1 = fixed scheme)
hat-Delta^(i)       decoded update (Eq. 12)       :func:`flower_dp.mechanisms.gau_lrq_codec.decode_update`
==================  ============================  ============================================

Why a FedAvg subclass: it reuses FedAvg's evaluation (``fraction_evaluate``/``min_evaluate_nodes``),
metric aggregation (``train_metrics_aggr_fn``/``evaluate_metrics_aggr_fn``), record keys and summary;
a wrapper (like Flower's DP wrappers) cannot work because replies carry integer messages, not
weights, and the aggregation rule (weight 1/B, server lr 1, theta kept by the strategy) is part of
the mechanism.  ``configure_train``, ``aggregate_train`` and ``start`` are overridden.

Sampling and accounting [DECISION, replaces spec §5.3's Poisson approximation]: every round
draws exactly B of the N clients uniformly without replacement (sampling keyed by the run secret,
so the adversary cannot know it).  Each sampled client's decoded update carries its own
N(0, sigma^2 I), so the sum over the B clients carries N(0, B sigma^2 I) = N(0, (z S2)^2 I) exactly
when the sample size is fixed.  Under Poisson sampling the noise would grow with the sample size,
which the Poisson-subsampled Gaussian analysis does not cover.  The matching rigorous accountant
(:mod:`flower_dp.privacy.gau_lrq`) charges each round the tight dominating pair of B-of-N sampling
under replace-one client adjacency (replacing one client's data moves the sum by <= 2 S2), the
smaller of its PLD and RDP bounds.  Results also report the paper's closed form (``eps_paper``),
which is not a bound.

Faults: a sampled client that fails (error reply or none) is dropped from the average; the trusted
server adds N(0, sigma^2 I) per dropped client from its own keyed stream, so the released sum is
still "B vectors of norm <= S2 (0 for the dropped) + N(0, B sigma^2 I)" and the round's charge
stays valid.  A reply that does not decode (wrong stream, tampering) raises ``DecodeError``: it is
never silently averaged or dropped.  With ``out_dir``, ``results.json`` and a checksummed
``checkpoint.pt`` are written atomically after every round; ``resume=True`` continues from it
(client sampling, streams and dropout noise are keyed by the run secret and the public nonce
stored in the checkpoint, so the resumed run repeats the uninterrupted one exactly).
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import time
from collections.abc import Callable, Iterable
from logging import INFO, WARNING
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.common import log
from flwr.serverapp.strategy import FedAvg, Result

from flower_dp._checks import check_choice, check_delta, check_epsilon, check_int, check_positive
from flower_dp.errors import BudgetExceededError, CheckpointError, DecodeError
from flower_dp.mechanisms.lrq import lrq_key
from flower_dp.recorder import RunRecorder
from flower_dp.privacy.gau_lrq import Schedule, client_level_epsilon, gau_lrq_schedule
from flower_dp.rng import noise_record
from flower_dp.mechanisms.gau_lrq_codec import (KEYS, META_KEY, METHODS, PAPER_NAMES, PARTITION_META, PAYLOAD_KEY,
                                                PROBE_KEY, PROBE_TAG_META, SECRET_RUN_CONFIG, RoundSpec, create_secret_file,
                                                decode_update, load_secret, payload_bytes, probe_tag, public_bits,
                                                run_key)

from . import flower_privacy as fp

__all__ = ["GauLRQ", "Schedule", "gau_lrq_schedule", "client_level_epsilon", "message_bytes", "BQ_PRIVACY_NOTE"]

#: Methods whose noise has no DP proof: their eps is ``eps_heuristic`` (``eps_rigorous`` is None), with this note.
BQ_PRIVACY_NOTE = ("noise matched by variance to the Gaussian; no DP proof: BQ-SGD's binomial noise has the variance "
                   "of the Gaussian the accountant charges, and eps_heuristic is that Gaussian's eps")
HEURISTIC_METHODS = {"bq": BQ_PRIVACY_NOTE}
#: The note of an LRQ run with ``layer_dtype="float32"``: its layer centres and heights come from 24-bit uniforms
#: (numpy's float32 ``random``), so the layer half-width ``sigma sqrt(-2 ln y)`` stops at 5.77 sigma and takes coarse
#: values near there: the decoded error is not the exact Gaussian the accountant charges (as torch's float32 normal
#: sampler, README "Privacy accounting"), so its eps is ``eps_heuristic``.
FLOAT32_LAYER_NOTE = ("heuristic, not proven: layer_dtype='float32' draws the LRQ layers from 24-bit uniforms, so the "
                      "decoded error is cut near 5.77 sigma and is not exactly Gaussian; use layer_dtype='float64' "
                      "(the default) for a proven eps")

#: :meth:`GauLRQ.check_learning` warns when the noise norm on the averaged update exceeds this many clip norms
NOISE_TO_CLIP_LIMIT = 10.0

#: ``results()["noise"]["note"]`` of a run keyed by a secret (the default)
GAU_LRQ_SECRET_NOTE = ("client sampling, the LRQ streams and the Gaussian noise are keyed by a run secret that only the "
                       "server and the clients hold (trusted server) and a fresh random nonce per run; the seed keys "
                       "only public randomness (initial model, client data, local minibatches)")


class GauLRQ(FedAvg):
    """Server side of Gau-LRQ-SGD (Alg. 1) and its baselines (spec §7), Message API; a drop-in for ``FedAvg``.

    Drop-in: replace ``FedAvg(...)`` by ``GauLRQ(num_clients=N, clip=S2, epsilon=eps, ...)`` with the same
    arguments (FedAvg's ten, positional or keyword, come first in FedAvg's order; GauLRQ's own are keyword-only),
    and add the mod to the ClientApp.  Before the first train message carries the model, GauLRQ sends every node a
    probe that only ``gau_lrq_mod`` answers (with a keyed hash of the run secret) and stops with a ``RuntimeError``
    naming the nodes that do not, so a ClientApp without the mod never sends its weights.  FedAvg's arguments mean
    here:

    - ``fraction_train`` / ``min_train_nodes``: honoured as FedAvg would with N connected nodes: when
      ``clients_per_round`` is not given, B = ``max(int(N * fraction_train), min_train_nodes)`` (FedAvg's
      defaults 1.0 and 2 give B = N).  GauLRQ then samples exactly these B every round, uniformly without
      replacement and keyed by the run secret (the sampling its accountant charges).  Values that contradict
      ``clients_per_round``, or a ``min_available_nodes`` above N, raise one ``ValueError`` naming the
      equivalent GauLRQ setting.
    - ``min_available_nodes``: GauLRQ needs exactly N SuperNodes, which meets any value <= N: a different count
      raises ``ValueError`` at once in simulation, after ``node_wait_s`` on the deployment engine.
    - ``fraction_evaluate``, ``min_evaluate_nodes``, ``arrayrecord_key``, ``configrecord_key``: as in FedAvg
      (defaults included: client-side evaluation runs every round).
    - ``weighted_by_key``: used for metric aggregation; the model update is always averaged with weight 1/B
      (Alg. 1 line 15: the accountant's sensitivity needs equal weights, as Flower's own accounted DP wrappers
      require).
    - ``train_metrics_aggr_fn`` / ``evaluate_metrics_aggr_fn``: passing one publishes the clients' metrics
      (see ``debug_metrics``), aggregated by your function over the user's MetricRecords, unaltered.

    Parameters
    ----------
    num_clients : int
        N; the grid must hold exactly N SuperNodes (partition ids 0..N-1).  With ``accountant`` it defaults to
        the accountant's ``population_size``.
    clients_per_round : int or None
        B, sampled uniformly without replacement each round; the aggregate is ``(1/B) sum hat_D``.  None: from
        ``fraction_train`` / ``min_train_nodes`` as above.
    clip : float
        S2, L2 bound on one client's update (ignored by ``method="none"``).
    num_rounds : int or None
        K, the planned rounds (the schedule and the calibration are for K rounds).  None: ``start``'s
        ``num_rounds`` (give it once, in either place; given in both, ``start`` runs at most K rounds).
    epsilon, delta : float
        Client-level budget of the whole run (``method="none"``: ignored).  With ``accountant`` they default to
        its ``max_epsilon`` and ``target_delta``.
    method : {"lrq", "gaussian", "qg", "bq", "none"}
    tau : float in (0, 1]
        1: fixed scheme; < 1: Dynamic Gau-LRQ (z_k proportional to tau^(k/4), §6).
    noise_multiplier : float or None
        Fixed z for "budget-stop" mode: train until the next round would exceed the budget.
        None: z is calibrated so that K rounds spend exactly the budget.  z is the std of the noise on the SUM
        of the B clipped updates over S2: the same number as the ``noise_multiplier`` of Flower's DP wrappers
        (noise ``z C`` on the sum); Flower's ``GaussianPrivacyEvent`` of a GauLRQ round has ``z / 2`` (the
        replace-one sensitivity of the sum is 2 S2; :mod:`flower_dp.strategies.flower_privacy`).
    calibration : {"rigorous", "paper"}
        ``paper``: the closed form (Lemma 1/4), with a warning stating the rigorous eps.
    accountant : Flower ``PrivacyAccountant`` or None (Flower >= 1.41)
        Flower's accountant (e.g. ``flwr.serverapp.RdpAccountant(PrivacyConfig(...))``), as Flower's DP wrappers
        take it: each round is checked against its ``max_epsilon`` (Flower's ``PrivacyBudgetExhausted`` from
        ``configure_train``) and composed after aggregation.  The check uses GauLRQ's own rigorous eps at the
        accountant's ``target_delta`` (the number the run calibrates to, reports and ``privacy_spent()``
        returns), so ``max_epsilon`` and ``epsilon`` mean the same; Flower's RDP figure for the same releases,
        never below it, is reported beside it (``eps_flower``).  Accepted configurations and what each computes:
        the table in :mod:`flower_dp.strategies.flower_privacy` (POISSON + ADD_OR_REMOVE_ONE is the tightest).
    secret, secret_file : the run secret (bytes >= 16) or the path of the file holding it, shared with every
        ClientApp's mod (see :mod:`flower_dp.clients.lrq_mod`).  A ``secret_file`` that does not exist is created
        (32 random bytes from the OS, mode 0600, folders included) and its path logged as a WARNING: the mods must
        read that same file (run config ``"lrq-secret-file"``).  An existing file readable or writable by group or
        others raises ``ValueError`` (path, mode, ``chmod 600``); so does one shorter than 16 bytes.
    node_wait_s : float, default 30: on the deployment engine, how long to wait for exactly ``num_clients``
        SuperNodes before a ``ValueError``; in simulation a mismatch fails at once.
    server_lr : float, server step on the average (paper: 1).
    bq_bits : int, BQ-SGD's public bit width.
    layer_dtype : {"float64", "float32"}, default "float64": the LRQ layers' arithmetic (both sides).  "float32"
        draws them from 24-bit uniforms, so the decoded error is only approximately Gaussian: its eps is reported as
        ``eps_heuristic`` (:data:`FLOAT32_LAYER_NOTE`), never ``eps_rigorous``.
    out_dir : path or None, where ``results.json`` and a checksummed ``checkpoint.pt`` (theta, per-round
        records, public stream nonce; never the secret) are written atomically after every round.
    resume : bool, continue the run checkpointed in ``out_dir`` (same config and secret; raises
        :class:`~flower_dp.errors.CheckpointError` otherwise); it ends with exactly the numbers of an
        uninterrupted run.
    run_info : dict or None, public facts about the run (dataset, model, seed, ...) copied into the results.
    reproducible : bool, a label only: True when the caller derived ``secret`` and ``stream_nonce`` from a public
        seed (:func:`flower_dp.experiments.gau_lrq.run_gau_lrq` with ``reproducible=True``); ``results()["noise"]``
        then says the guarantee holds only against parties that do not know the seed.
    keep_decoded : bool, keep every round's theta_k, decoded updates and dropout noise (tests; memory B d per round).
    debug_metrics : bool, default False: the clients' train (and client-side evaluate) metrics are statistics
        of their private data that the accountant does not charge, so they are neither aggregated into the
        results nor into Flower's ``Result``, and failed clients are recorded as a count only (their ids would
        reveal part of the secret B-of-N sample).  True (or passing your own ``train_metrics_aggr_fn`` /
        ``evaluate_metrics_aggr_fn``: your aggregate, your responsibility) publishes them and the results say
        ``"uncharged_statistics_released": true``.
    max_failed_rounds : int, default 3: the run stops (``RuntimeError`` naming the clients' error; results saved as
        failed) after this many consecutive rounds in which every sampled client replied with an error: a
        systematic client failure (e.g. a bit width that cannot carry the noise) is not trained through on server
        noise alone.  A single such round is tolerated (the server adds the missing noise, as for any dropout).
    fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, min_available_nodes, weighted_by_key,
    arrayrecord_key, configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn : FedAvg's, see above.

    ``start`` returns Flower's ``Result``; ``result.evaluate_metrics_serverapp[r]`` holds, besides
    ``evaluate_fn``'s metrics, the privacy spent after round r: ``eps_rigorous`` (``eps_heuristic`` for BQ-SGD),
    ``eps_paper`` (the paper's closed form, not a bound) and, with ``accountant``, ``eps_flower``.
    """

    def __init__(self, fraction_train: float | None = None, fraction_evaluate: float = 1.0,
                 min_train_nodes: int | None = None, min_evaluate_nodes: int = 2,
                 min_available_nodes: int | None = None, weighted_by_key: str = "num-examples",
                 arrayrecord_key: str = "arrays", configrecord_key: str = "config",
                 train_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
                 evaluate_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None, *,
                 num_clients: int | None = None, clients_per_round: int | None = None,
                 clip: float | None = None, num_rounds: int | None = None, epsilon: float | None = None,
                 delta: float | None = None, method: str = "lrq", tau: float = 1.0,
                 noise_multiplier: float | None = None, calibration: str = "rigorous", accountant=None,
                 secret: bytes | None = None, secret_file: str | None = None, server_lr: float = 1.0, bq_bits: int = 4,
                 layer_dtype: str = "float64", out_dir: str | Path | None = None, keep_decoded: bool = False,
                 stream_nonce: str | None = None, resume: bool = False, run_info: dict | None = None,
                 debug_metrics: bool = False, reproducible: bool = False, max_failed_rounds: int = 3,
                 node_wait_s: float = 30.0) -> None:
        self.method = check_choice("method", method, METHODS)
        self.private = method != "none"
        self.layer_dtype = check_choice("layer_dtype", layer_dtype, ("float64", "float32"))
        self.accountant = accountant
        if accountant is not None:
            if not self.private or self.heuristic_note is not None:
                raise ValueError(f"accountant= needs a method with a DP proof ('lrq' with layer_dtype='float64', "
                                 f"'gaussian', 'qg'), got method={method!r}, layer_dtype={layer_dtype!r}; Flower's "
                                 "accountant would report a guarantee that does not exist; drop accountant")
            cfg = accountant.config
            num_clients = cfg.population_size if num_clients is None else num_clients
            epsilon = cfg.max_epsilon if epsilon is None else epsilon
            delta = cfg.target_delta if delta is None else delta
        if num_clients is None:
            raise ValueError("num_clients (N, the number of SuperNodes the accountant samples from) is required, got "
                             "None; pass num_clients=N (or accountant= with PrivacyConfig(population_size=N))")
        if clip is None and self.private:
            raise ValueError(f"clip (S2, the L2 bound on one client's update) is required for method={method!r}, got "
                             "None; pass clip=")
        self.N = check_int("num_clients", num_clients, minimum=1)
        self.B = self._resolve_sample_size(clients_per_round, fraction_train, min_train_nodes, min_available_nodes)
        if accountant is not None:
            fp.check_accountant(accountant, population_size=self.N, fixed_size=True, adjacency="replace_one")
        self.debug_metrics = bool(debug_metrics)
        self.max_failed_rounds = check_int("max_failed_rounds", max_failed_rounds, minimum=1)
        self._failed_streak = 0
        # client metrics are published only on an explicit opt-in (debug, or the user's own aggregation function)
        self.publish_train_metrics = self.debug_metrics or train_metrics_aggr_fn is not None
        self.publish_evaluate_metrics = self.debug_metrics or evaluate_metrics_aggr_fn is not None
        super().__init__(fraction_train=self.B / self.N, fraction_evaluate=fraction_evaluate,
                         min_train_nodes=self.B, min_evaluate_nodes=min_evaluate_nodes, min_available_nodes=self.N,
                         weighted_by_key=weighted_by_key, arrayrecord_key=arrayrecord_key,
                         configrecord_key=configrecord_key, train_metrics_aggr_fn=train_metrics_aggr_fn,
                         evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn)
        self.clip = check_positive("clip", clip) if self.private else float("inf")
        self.server_lr = check_positive("server_lr", server_lr)
        self.bq_bits = check_int("bq_bits", bq_bits, minimum=2, maximum=16)
        self.keep_decoded = bool(keep_decoded)
        self.resume = bool(resume)
        self.reproducible = bool(reproducible)
        if self.resume and out_dir is None:
            raise ValueError("resume=True needs out_dir (the folder holding checkpoint.pt), got out_dir=None")
        self.run_info = dict(run_info or {})
        self._nonce_given = stream_nonce is not None
        if secret is None and secret_file is not None:
            path, created = create_secret_file(secret_file)
            if created:
                log(WARNING, "GauLRQ: created the run secret file %s (32 random bytes, mode 0600); every ClientApp's "
                    "gau_lrq_mod must read this same file (run config '%s')", path, SECRET_RUN_CONFIG)
        self._secret = load_secret(secret, secret_file)  # never logged or saved
        self.node_wait_s = check_positive("node_wait_s", node_wait_s)
        self._probed: set[int] = set()
        self._probe_timeout = 3600.0  # start() sets its round timeout
        self.secret_file = None if secret_file is None else str(secret_file)
        # public per-run nonce: two runs sharing a secret never reuse a stream (§2.4 rule 1)
        self.stream_nonce = os.urandom(8).hex() if stream_nonce is None else str(stream_nonce)
        self._run_key = run_key(self._secret, self.stream_nonce)
        self.delta = check_delta(1e-5 if delta is None else delta)
        if self.private:
            if epsilon is None:
                raise ValueError(f"epsilon is required for method={method!r}, got None; or use method='none'")
            self.epsilon = check_epsilon(epsilon)
        else:
            self.epsilon = None
        self.tau, self.calibration, self.noise_multiplier = float(tau), calibration, noise_multiplier
        self.K: int | None = None
        self.schedule: Schedule | None = None
        if num_rounds is not None:
            self._plan(num_rounds)
        self.rounds: list[dict] = []
        self.decoded: dict[int, dict[int, np.ndarray]] = {}
        self.dropout_noise: dict[int, np.ndarray] = {}
        self.thetas: dict[int, list[np.ndarray]] = {}
        self.initial_evaluate: dict | None = None
        self.stop_reason = "not started"
        self._pending: dict | None = None
        # results.json and checkpoint.pt, stamped with the kind and the fingerprint (other settings are not resumed)
        self.recorder = RunRecorder(out_dir, identity=self._identity,
                                    refusals={"kind": _not_gau_lrq, "fingerprint": _other_settings})
        self.out_dir = self.recorder.out_dir

    def _resolve_sample_size(self, clients_per_round, fraction_train, min_train_nodes, min_available_nodes) -> int:
        """B from GauLRQ's ``clients_per_round`` or FedAvg's rule; one error listing every contradiction."""
        N = self.N
        if fraction_train is not None:
            fraction_train = float(fraction_train)
            if not 0.0 < fraction_train <= 1.0:
                raise ValueError(f"fraction_train must be in (0, 1], got {fraction_train}; GauLRQ trains B >= 1 "
                                 f"clients every round (set clients_per_round=B of num_clients={N})")
        fedavg_b = None
        if fraction_train is not None or min_train_nodes is not None:
            mt = min(2, N) if min_train_nodes is None else check_int("min_train_nodes", min_train_nodes, minimum=0)
            fedavg_b = max(int(N * (1.0 if fraction_train is None else fraction_train)), mt)
        problems = []
        if clients_per_round is None:
            B = fedavg_b if fedavg_b is not None else N  # FedAvg's defaults (fraction_train=1.0): every node
            if B > N:
                problems.append(f"min_train_nodes={min_train_nodes} is above num_clients={N}")
        else:
            B = check_int("clients_per_round", clients_per_round, minimum=1, maximum=N)
            if fraction_train is not None and fedavg_b != B:
                problems.append(f"fraction_train={fraction_train} (FedAvg would train max(int({N} * {fraction_train}), "
                                f"{min_train_nodes if min_train_nodes is not None else min(2, N)}) = {fedavg_b} of "
                                f"{N} nodes) contradicts clients_per_round={B}")
            elif min_train_nodes is not None and min_train_nodes > B:
                problems.append(f"min_train_nodes={min_train_nodes} is above clients_per_round={B}")
        if min_available_nodes is not None and min_available_nodes > N:
            problems.append(f"min_available_nodes={min_available_nodes} is above num_clients={N} (GauLRQ waits for "
                            f"exactly num_clients SuperNodes)")
        if problems:
            raise ValueError("GauLRQ trains exactly clients_per_round = B of num_clients = N SuperNodes every round "
                             "(uniformly without replacement: the sampling its accountant charges), got "
                             + "; ".join(problems) + "; set clients_per_round=B and num_clients=N (the number of "
                             "SuperNodes) and drop fraction_train / min_train_nodes / min_available_nodes")
        if B < 1:
            raise ValueError(f"fraction_train={fraction_train} gives no client to train (B = 0 of num_clients={N}), "
                             "got B = 0; set clients_per_round >= 1")
        return B

    def _plan(self, num_rounds: int) -> None:
        """Fix K and the noise schedule (calibrated to ``epsilon`` over K rounds, or the fixed z)."""
        self.K = check_int("num_rounds", num_rounds, minimum=1)
        if self.private:
            self.schedule = gau_lrq_schedule(epsilon=self.epsilon, delta=self.delta, num_rounds=self.K, B=self.B,
                                             N=self.N, tau=self.tau, calibration=self.calibration,
                                             noise_multiplier=self.noise_multiplier)
            for w in self.schedule.warnings:
                log(WARNING, "GauLRQ: %s", w)

    def check_learning(self, d: int) -> dict | None:
        """Compare the noise on the averaged update with the clip norm for a model of ``d`` parameters.

        The average of B clipped updates has L2 norm <= S2; round k adds noise of per-coordinate std
        ``z_k S2 / B``, so its norm is about ``z_k S2 sqrt(d) / B``.  When that is more than
        :data:`NOISE_TO_CLIP_LIMIT` times S2 for the smallest z_k, the update is drowned in noise and the model
        will most likely not learn: a ``WARNING`` gives the numbers and what would help.  Returns the numbers
        (``noise_norm``, ``clip``, ``ratio``, ``d``, ``B``), or None without a noise schedule.
        """
        if self.schedule is None or d <= 0:
            return None
        z = float(np.min(self.schedule.z))
        noise_norm = z * self.clip * math.sqrt(d) / self.B
        out = {"noise_norm": noise_norm, "clip": self.clip, "ratio": noise_norm / self.clip, "d": int(d), "B": self.B,
               "z": z}
        if out["ratio"] > NOISE_TO_CLIP_LIMIT:
            need_b = math.ceil(z * math.sqrt(d) / NOISE_TO_CLIP_LIMIT)
            log(WARNING, "GauLRQ: learning is implausible at these settings: the noise on the averaged update has norm "
                "%.3g (z = %.3g, S2 = %g, d = %d parameters, B = %d clients per round: z S2 sqrt(d) / B), %.0fx "
                "the clip norm S2 = %g that bounds the averaged update itself (warning above %gx). Client-level DP "
                "needs many clients per round: B >= %d at this z and model size; or a larger epsilon (smaller z), "
                "fewer rounds, or a smaller model (the ratio grows with sqrt(d))", noise_norm, z, self.clip, d, self.B,
                out["ratio"], self.clip, NOISE_TO_CLIP_LIMIT, need_b)
        return out

    # ------------------------------------------------------------------ schedule
    @property
    def z(self) -> np.ndarray | None:
        """Noise multipliers z_k (std of the noise on the sum over S2), shape (K,); None for "none"."""
        return None if self.schedule is None else self.schedule.z

    def sigma(self, k: int) -> float:
        """Per-client per-coordinate std of round k: ``z_k S2 / sqrt(B)`` (0 for "none")."""
        return 0.0 if self.schedule is None else float(self.schedule.z[k] * self.clip / math.sqrt(self.B))

    def round_spec(self, k: int) -> RoundSpec:
        return RoundSpec(self.method, k, self.sigma(k), self.clip, self.bq_bits, self.layer_dtype)

    def summary(self) -> None:
        log(INFO, "\t├──> GauLRQ: method %s (%s), N=%d, B=%d, K=%s, S2=%s", self.method, PAPER_NAMES[self.method],
            self.N, self.B, self.K, self.clip)
        if self.schedule is not None:
            log(INFO, "\t│\t└── z_0=%.4g z_K-1=%.4g, eps target %s (%s plan %.4g, paper %.4g)",
                self.schedule.z[0], self.schedule.z[-1], self.epsilon,
                "heuristic (no DP proof)" if self.heuristic_note is not None else "rigorous", self.schedule.eps_rigorous,
                self.schedule.eps_paper)
        if self.accountant is not None:
            now = self.accountant.get_privacy_spent()
            log(INFO, "\t├──> Privacy spent (Flower's accountant): epsilon=%.6f at delta=%g", now.epsilon,
                now.delta)
        super().summary()

    def privacy_spent(self):
        """The privacy spent so far, as Flower's DP strategies answer it (a ``PrivacySpent``).

        Always GauLRQ's own client-level eps at ``delta``: the rigorous bound the run calibrates to and stops on
        (``accounting_method`` says which bound; for BQ-SGD the variance-matched heuristic, no DP proof).  With
        ``accountant``, ``accounting_method`` also names Flower's own figure for the same releases
        (``eps_flower``, its RDP bound, never below this one).  None for ``method="none"``.
        """
        if not self.private:
            return None
        eps = self.schedule.eps_after(len(self.rounds), self.delta) if self.schedule is not None else 0.0
        how = ("heuristic: variance-matched Gaussian, no DP proof" if self.heuristic_note is not None else
               "flower-dp: min(PLD, RDP) of B-of-N sampling, replace-one client")
        if self.accountant is not None:
            now = self.accountant.get_privacy_spent()
            how += (f"; Flower's accountant ({now.accounting_method}) for the same releases: eps_flower = "
                    f"{now.epsilon:.6g} at delta = {now.delta:g}")
        return fp.spent(eps, self.delta, len(self.rounds), how)

    def _check_flower_budget(self, server_round: int, k: int) -> None:
        """A Flower budget (the accountant's ``max_epsilon``) is checked against the eps GauLRQ calibrates to and
        reports (at the accountant's ``target_delta``), the same number ``privacy_spent()`` answers; Flower's own
        RDP figure, which may be looser, is composed and reported beside it as ``eps_flower``."""
        cfg = None if self.accountant is None else self.accountant.config
        if cfg is None or cfg.max_epsilon is None or self.schedule is None:
            return
        eps_after = self.schedule.eps_after(k + 1, cfg.target_delta)
        if eps_after > cfg.max_epsilon * (1 + 1e-9):
            raise fp.BudgetExhausted(
                f"round {server_round}: it would bring the client-level eps (flower-dp's rigorous accounting) to "
                f"{eps_after:.4g}, above Flower's PrivacyConfig max_epsilon = {cfg.max_epsilon} at delta = "
                f"{cfg.target_delta}; the run stops here with its results saved (raise max_epsilon or the noise "
                "multiplier to train longer)", step=k, epsilon_spent=self.schedule.eps_after(k, cfg.target_delta),
                epsilon_limit=cfg.max_epsilon)

    def _flower_event(self, k: int):
        """Flower's event of round k: B of N, noise z_k S2 on the sum, replace-one (multiplier z_k / 2)."""
        return fp.gaussian_event(float(self.schedule.z[k]), sample_size=self.B, population_size=self.N,
                                 adjacency="replace_one")

    # ------------------------------------------------------------------ train
    def _sample(self, k: int, node_ids: list[int]) -> list[int]:
        """B of the N nodes, uniformly without replacement, keyed by the run secret (hidden from the adversary)."""
        seed = int.from_bytes(hashlib.sha256(b"flower_dp.gau_lrq.sample\x00" + self._run_key + k.to_bytes(8, "little"))
                              .digest(), "little")
        rng = np.random.default_rng(seed)
        ids = sorted(int(n) for n in node_ids)  # node ids are uint64: sample positions, not values
        return sorted(ids[int(i)] for i in rng.choice(len(ids), size=self.B, replace=False))

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
                        ) -> Iterable[Message]:
        """Charge round k's privacy (raises BudgetExhausted before any noise), sample B clients, send theta_k.

        ``BudgetExhausted`` is both flower-dp's ``BudgetExceededError`` and Flower's ``PrivacyBudgetExhausted``
        (Flower >= 1.41); :meth:`start` catches it and stops cleanly with the results saved.
        """
        k = server_round - 1
        if self.K is None:
            raise ValueError("GauLRQ has no planned number of rounds, got num_rounds=None; pass num_rounds to GauLRQ "
                             "or call start(num_rounds=...)")
        if k >= self.K:
            raise fp.BudgetExhausted(f"round {server_round} is beyond the planned K = {self.K} rounds the schedule "
                                      f"was calibrated for, got num_rounds > K; raise num_rounds in GauLRQ", step=k)
        eps_after = self.schedule.eps_after(k + 1, self.delta) if self.schedule is not None else float("inf")
        if self.private and eps_after > self.epsilon * (1 + 1e-9):
            raise fp.BudgetExhausted(
                f"round {server_round}: it would bring the client-level "
                f"{'heuristic eps (no DP proof)' if self.heuristic_note is not None else 'eps'} to {eps_after:.4g}, "
                "above the budget "
                f"eps = {self.epsilon} at delta = {self.delta}; the run stops here with its results saved "
                "(raise epsilon or the noise multiplier to train longer)",
                step=k, epsilon_spent=self.schedule.eps_after(k, self.delta), epsilon_limit=self.epsilon)
        event = self._flower_event(k) if self.accountant is not None else None
        self._check_flower_budget(server_round, k)
        node_ids = self._wait_for_nodes(grid)
        self._probe(grid, node_ids, server_round)
        sampled = self._sample(k, node_ids)
        spec = self.round_spec(k)
        cfg = ConfigRecord(dict(config))
        cfg.update({"server-round": server_round, KEYS["method"]: spec.method, KEYS["round"]: k,
                    KEYS["sigma"]: spec.sigma, KEYS["clip"]: spec.clip, KEYS["bq_bits"]: spec.bq_bits,
                    KEYS["layer_dtype"]: spec.layer_dtype, KEYS["nonce"]: self.stream_nonce})
        self._pending = {"k": k, "spec": spec, "sampled": sampled, "theta": [a.numpy() for a in arrays.values()],
                         "names": list(arrays.keys()), "eps": eps_after, "event": event}
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: cfg})
        msgs = [Message(content=record, message_type=MessageType.TRAIN, dst_node_id=n) for n in sampled]
        self._pending["downlink"] = sum(message_bytes(m) for m in msgs)
        return msgs

    def _wait_for_nodes(self, grid: Grid) -> list[int]:
        """The N node ids; raises ``ValueError`` at once on a size mismatch in simulation, after ``node_wait_s``
        on the deployment engine.

        In simulation (Flower's ``InMemoryGrid``, :class:`~flower_dp.experiments.gau_lrq.InProcessGrid`) every
        SuperNode registers at once, so a count that stays the same for 1 s is final.  On the deployment engine
        SuperNodes connect over time: GauLRQ waits up to ``node_wait_s`` for exactly N.
        """
        simulated = any(c.__name__ in ("InMemoryGrid", "InProcessGrid") for c in type(grid).__mro__)
        limit = self.node_wait_s
        t0 = last_change = time.monotonic()
        ids = list(grid.get_node_ids())
        if len(ids) != self.N and not simulated:
            log(INFO, "GauLRQ: %d of num_clients = %d SuperNodes connected; waiting up to node_wait_s = %g s",
                len(ids), self.N, limit)
        while len(ids) != self.N and time.monotonic() - t0 < limit:
            if simulated and ids and time.monotonic() - last_change >= 1.0:
                break  # the simulation registered its SuperNodes: the count is final
            time.sleep(0.2)
            now = list(grid.get_node_ids())
            if len(now) != len(ids):
                last_change = time.monotonic()
            ids = now
        if len(ids) != self.N:
            raise ValueError(f"GauLRQ was configured for num_clients N = {self.N} (the accountant's q = B/N), got "
                             f"{len(ids)} connected SuperNodes after {time.monotonic() - t0:.1f} s"
                             f"{'' if simulated else f' (node_wait_s = {limit:g})'}; set num_clients to the number "
                             "of SuperNodes (simulation: num-supernodes in the federation config)")
        return ids

    def _probe(self, grid: Grid, node_ids: list[int], server_round: int) -> None:
        """Confirm, before any train message carries the model, that every node runs ``gau_lrq_mod`` with this
        run's secret and its own partition id in [0, N).

        The probe is a train message holding only a ConfigRecord (no model); the mod answers it itself.  A
        ClientApp without the mod passes it to the user's train function, which finds no model in it: its
        reply (usually an error) is discarded unread and the run stops with a ``RuntimeError`` naming the nodes.
        """
        todo = [n for n in node_ids if int(n) not in self._probed]
        if not todo:
            return
        probe = ConfigRecord({PROBE_KEY: self.stream_nonce, "server-round": server_round})
        msgs = [Message(content=RecordDict({self.configrecord_key: probe}),
                        message_type=MessageType.TRAIN, dst_node_id=n) for n in todo]
        replies = {int(m.metadata.src_node_id): m for m in grid.send_and_receive(messages=msgs,
                                                                              timeout=self._probe_timeout)}
        problems, pids = [], {}
        for n in todo:
            m = replies.get(int(n))
            if m is None:
                problems.append(f"node {n}: no reply within {self._probe_timeout:g} s")
                continue
            if m.has_error():
                problems.append(f"node {n}: error reply: {m.error.reason}")
                continue
            meta = dict(m.content[META_KEY]) if META_KEY in m.content else {}
            if PROBE_TAG_META not in meta or PARTITION_META not in meta:
                problems.append(f"node {n}: replied without gau_lrq_mod's answer (records {list(m.content.keys())})")
                continue
            pid = int(meta[PARTITION_META])
            if not 0 <= pid < self.N or pid in pids:
                problems.append(f"node {n}: partition-id {pid}, got it twice or outside [0, {self.N})")
            elif meta[PROBE_TAG_META] != probe_tag(self._run_key, pid):
                problems.append(f"node {n} (partition {pid}): holds another run secret than the server")
            pids[pid] = n
        if problems:
            raise RuntimeError(
                f"GauLRQ: {len(problems)} of {len(todo)} ClientApps cannot take part (checked before any model was "
                f"sent): {'; '.join(problems[:5])}{' ...' if len(problems) > 5 else ''}. Every ClientApp needs "
                "ClientApp(mods=[gau_lrq_mod]) and the server's run secret file (run config 'lrq-secret-file'); "
                "without the mod a client would send its weights in the clear")
        self._probed.update(int(n) for n in todo)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Decode each reply (Eq. 12), average with weight 1/B, apply theta_{k+1} = theta_k + lr * mean.

        A sampled client that failed (an error reply, or no reply) is dropped from the average
        without touching the others' decoding.  Its share of the noise is then missing from the
        sum, so the trusted server adds N(0, sigma^2 I) per dropped client from its own keyed
        stream: the released sum is then exactly "sum over the B sampled of a vector of L2 norm
        <= S2 (0 for a dropped client) + N(0, B sigma^2 I)", the mechanism the accountant charged
        for this round (its charge does not depend on who replied).
        """
        p, self._pending = self._pending, None
        if p is None:
            raise RuntimeError("aggregate_train called without configure_train; call them in order")
        replies = list(replies)
        valid = [m for m in replies if not m.has_error()]
        failed = [int(m.metadata.src_node_id) for m in replies if m.has_error()]
        log(INFO, "aggregate_train: Received %s results and %s failures", len(valid), len(replies) - len(valid))
        for m in replies:
            if m.has_error():
                log(WARNING, "GauLRQ round %d: node %d replied with an error, dropped from the average: %s",
                    server_round, m.metadata.src_node_id, m.error.reason)
        self._failed_streak = self._failed_streak + 1 if (replies and not valid) else 0
        if self._failed_streak >= self.max_failed_rounds:
            reason = next(m.error.reason for m in replies if m.has_error())
            raise RuntimeError(f"GauLRQ: every sampled client replied with an error in {self._failed_streak} "
                               f"consecutive rounds (up to round {server_round}; max_failed_rounds="
                               f"{self.max_failed_rounds}); a client's error: {reason}. Fix the cause, or raise "
                               "max_failed_rounds to train through it on server noise")
        d = int(sum(t.size for t in p["theta"]))
        total = np.zeros(d, dtype=np.float64)
        seen: dict[int, int] = {}
        # Published counts are public figures: every message of a round has the size fixed by the public spec and
        # d (public_bits).  Counts measured on the data (the entropy of the sent integers, the clean-A bits) are
        # statistics of the clients' updates that the accountant does not charge: only with debug_metrics.
        diag = {"bits_entropy": 0.0, "bits_paper": 0.0, "bits_fixed": 0.0} if self.debug_metrics else {}
        payload_total, carried = 0, 0
        sampled = set(p["sampled"])
        for m in valid:
            src = int(m.metadata.src_node_id)
            if src not in sampled:
                raise DecodeError(f"round {server_round}: a reply came from node {src}, got it although only nodes "
                                  f"{sorted(sampled)} were sampled; replies must answer this round's train messages")
            meta = dict(m.content[META_KEY]) if META_KEY in m.content else {}
            if PAYLOAD_KEY not in m.content or PARTITION_META not in meta:
                raise DecodeError(f"reply from node {src} has no Gau-LRQ payload, got records "
                                  f"{list(m.content.keys())}; add gau_lrq_mod to the ClientApp's mods")
            pid = int(meta.pop(PARTITION_META))
            if pid in seen or not 0 <= pid < self.N:
                raise DecodeError(f"node {src} claims partition-id {pid}, got it twice or outside "
                                  f"[0, {self.N}); every SuperNode needs its own partition id")
            seen[pid] = src
            arrays = m.content[PAYLOAD_KEY]
            payload = {name: a.numpy() for name, a in arrays.items()}
            try:
                hat = decode_update(payload, meta, p["spec"], lrq_key(self._run_key, p["k"], pid))
            except DecodeError as exc:
                raise DecodeError(f"round {server_round}, node {src} (partition {pid}): {exc}") from exc
            if hat.shape != (d,):
                raise DecodeError(f"decoded update of partition {pid} has shape {hat.shape}, expected ({d},)")
            total += hat
            payload_total += payload_bytes(arrays.values())
            carried += message_bytes(arrays, m.content[META_KEY])  # the Gau-LRQ records only
            if diag:  # the mod's debug statistics (make_gau_lrq_mod(debug_metrics=True)), uncharged
                mrec = next(iter(m.content.metric_records.values()), None) or {}
                for key in diag:
                    diag[key] += float(mrec.get(f"gau-lrq.{key}", 0.0))
            if self.keep_decoded:
                self.decoded.setdefault(p["k"], {})[pid] = hat
        if self.keep_decoded:
            self.thetas[p["k"]] = [t.copy() for t in p["theta"]]
        dropped = self.B - len(seen)
        if dropped:
            log(WARNING, "GauLRQ round %d: %d of %d sampled clients replied; the others are dropped from the average "
                "(still divided by B = %d)%s", server_round, len(seen), self.B, self.B,
                "; the server adds their share of the noise" if self.private else "")
            if self.private:
                extra = math.sqrt(dropped) * p["spec"].sigma * self._dropout_rng(p["k"]).standard_normal(d)
                total += extra
                if self.keep_decoded:
                    self.dropout_noise[p["k"]] = extra
        mean = total / self.B  # Alg. 1 line 15: weight 1/B whatever num-examples says
        new, off = {}, 0
        for name, t in zip(p["names"], p["theta"]):
            step = mean[off: off + t.size].reshape(t.shape)
            new[name] = (t.astype(np.float64) + self.server_lr * step).astype(t.dtype)
            off += t.size
        metrics = (self.train_metrics_aggr_fn([m.content for m in valid], self.weighted_by_key)
                   if valid and self.publish_train_metrics else None)
        rec = {"round": server_round, "k": p["k"], "method": self.method, "sigma": p["spec"].sigma,
               "z": None if self.schedule is None else float(self.schedule.z[p["k"]]), "sampled": len(p["sampled"]),
               "received": len(seen), "dropped": dropped, "failed": len(failed), "d": d,
               **({"failed_nodes": failed} if self.debug_metrics else {}),
               "bytes_payload": payload_total, "bytes_carried": carried, "bytes_downlink": p["downlink"],
               "bits_algorithmic": public_bits(p["spec"], d) * len(seen), "bits_per_coord": public_bits(p["spec"], d) / d,
               **({"debug_uncharged": diag} if diag else {}),
               **self._eps_fields(p["eps"]), "eps_paper": self.schedule.eps_paper_after(p["k"] + 1, self.delta)
               if self.schedule is not None else float("inf"),
               "train_metrics": None if metrics is None else dict(metrics)}
        if self.private:
            log(INFO, "Privacy spent: epsilon=%.6f at delta=%g after %d releases (flower-dp, %s; paper's formula %.6f)",
                p["eps"], self.delta, p["k"] + 1, "heuristic, no DP proof" if self.heuristic_note is not None else
                "rigorous", rec["eps_paper"])
        if p["event"] is not None:  # the release happened: compose it into Flower's accountant (as its DP wrappers)
            rec["eps_flower"] = float(fp.compose(self.accountant, p["event"]).epsilon)
        self.rounds.append(rec)
        return ArrayRecord({n: _array(v) for n, v in new.items()}), metrics

    @property
    def heuristic_note(self) -> str | None:
        """Why this run's eps has no DP proof (it is then ``eps_heuristic``), or None for a proven mechanism."""
        if self.method in HEURISTIC_METHODS:
            return HEURISTIC_METHODS[self.method]
        if self.method == "lrq" and self.layer_dtype == "float32":
            return FLOAT32_LAYER_NOTE
        return None

    def _eps_fields(self, eps: float) -> dict:
        """``{"eps_rigorous": eps}``, or for a method without a DP proof (BQ-SGD) ``eps_rigorous: None`` and
        ``eps_heuristic: eps`` (the variance-matched Gaussian's eps)."""
        if self.heuristic_note is not None:
            return {"eps_rigorous": None, "eps_heuristic": eps}
        return {"eps_rigorous": eps}

    def _dropout_rng(self, k: int) -> np.random.Generator:
        """The server's own stream for round k's dropout noise (keyed by the run secret, so hidden and reproducible)."""
        seed = hashlib.sha256(b"flower_dp.gau_lrq.dropout\x00" + self._run_key + k.to_bytes(8, "little")).digest()
        return np.random.Generator(np.random.Philox(int.from_bytes(seed, "little")))

    # ------------------------------------------------------------------ loop
    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int | None = None, timeout: float = 3600,
              train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
              should_stop: Callable[[int, Result], bool] | None = None) -> Result:
        """Flower's template loop (FedAvg's signature, logging and summary), stopping cleanly when the budget is spent.

        ``should_stop(round, result)`` (Flower 1.43's early stop, accepted on 1.42 too): called after each round;
        True ends the loop there with the results saved and ``stop_reason = "should_stop: round r"``.

        ``num_rounds``: None runs the K rounds given to GauLRQ (Flower's default 3 when neither is given); a
        GauLRQ built without ``num_rounds`` plans its schedule for this many rounds.  The budget stop (the next
        round would exceed ``epsilon``, Flower's accountant's ``max_epsilon``, or K) ends the loop with the
        results saved and ``stop_reason = "budget: ..."``; ``Result`` holds the rounds done.  Per round,
        ``result.evaluate_metrics_serverapp[r]`` gets the privacy spent (class docstring) beside ``evaluate_fn``'s
        metrics.  With ``out_dir`` a checkpoint is written after every round; with ``resume=True`` the loop
        continues from it (``initial_arrays`` is then only used when no round was completed).  If anything else
        raises, the results so far are saved with ``stop_reason = "failed: ..."`` and the exception propagates.
        """
        if num_rounds is None:
            num_rounds = self.K if self.K is not None else 3
        num_rounds = check_int("num_rounds", num_rounds, minimum=1)
        if self.K is None:
            self._plan(num_rounds)
        log(INFO, "Starting %s strategy:", self.__class__.__name__)
        _log_start_info(num_rounds, initial_arrays, train_config, evaluate_config)
        self.summary()
        log(INFO, "")
        self._probe_timeout = float(timeout)
        self.check_learning(sum(int(np.prod(a.shape)) for a in initial_arrays.values()))
        if not self.publish_train_metrics:
            log(WARNING, "GauLRQ: the clients' train metrics (e.g. train_loss) are not published: they are statistics "
                "of the clients' private data that eps does not cover; pass train_metrics_aggr_fn (or "
                "debug_metrics=True) to publish them, uncharged")
        if self.fraction_evaluate > 0 and not self.publish_evaluate_metrics:
            log(WARNING, "GauLRQ: client-side evaluation runs (fraction_evaluate=%s) but its aggregated metrics are "
                "not published: they are statistics of the clients' private data that eps does not cover; pass "
                "evaluate_metrics_aggr_fn (or debug_metrics=True) to publish them, or fraction_evaluate=0.0 to skip "
                "client-side evaluation", self.fraction_evaluate)
        train_config = ConfigRecord() if train_config is None else train_config
        evaluate_config = ConfigRecord() if evaluate_config is None else evaluate_config
        arrays, first = initial_arrays, 1
        if self.resume:
            arrays, first = self._restore(initial_arrays)
            log(INFO, "GauLRQ: resuming from %s at round %d", self.out_dir, first)
        result = Result(arrays=arrays)
        self._fill_result(result)
        self.stop_reason = "running"
        t_start = time.time()
        try:
            if evaluate_fn and first == 1:
                res = evaluate_fn(0, arrays)
                log(INFO, "Initial global evaluation results: %s", res)
                if res is not None:
                    self.initial_evaluate = dict(res)
                    result.evaluate_metrics_serverapp[0] = res
            for rnd in range(first, num_rounds + 1):
                log(INFO, "")
                log(INFO, "[ROUND %s/%s]", rnd, num_rounds)
                try:
                    messages = list(self.configure_train(rnd, arrays, train_config, grid))
                except BudgetExceededError as exc:
                    self.stop_reason = f"budget: {exc}"
                    log(INFO, "GauLRQ: stopping before round %d: %s", rnd, exc)
                    break
                log(INFO, "configure_train: Sampled %s nodes (out of %s)", len(messages), self.N)
                replies = grid.send_and_receive(messages=messages, timeout=timeout)
                agg, train_metrics = self.aggregate_train(rnd, replies)
                if agg is not None:
                    result.arrays = arrays = agg
                if train_metrics is not None:
                    log(INFO, "\t└──> Aggregated MetricRecord: %s", train_metrics)
                    result.train_metrics_clientapp[rnd] = train_metrics
                ev_replies = grid.send_and_receive(messages=self.configure_evaluate(rnd, arrays, evaluate_config, grid),
                                                   timeout=timeout)
                ev = self.aggregate_evaluate(rnd, ev_replies)
                if ev is not None and self.publish_evaluate_metrics:
                    log(INFO, "\t└──> Aggregated MetricRecord: %s", ev)
                    result.evaluate_metrics_clientapp[rnd] = ev
                    self.rounds[-1]["evaluate_clientapp"] = dict(ev)
                res = None
                if evaluate_fn:
                    log(INFO, "Global evaluation")
                    res = evaluate_fn(rnd, arrays)
                    log(INFO, "\t└──> MetricRecord: %s", res)
                    if res is not None:
                        self.rounds[-1]["evaluate_serverapp"] = dict(res)
                server = self._server_metrics(self.rounds[-1])
                if server is not None:
                    result.evaluate_metrics_serverapp[rnd] = server
                self.save_results(arrays)
                if should_stop is not None and should_stop(rnd, result):
                    self.stop_reason = f"should_stop: round {rnd}"
                    log(INFO, "Stopping early after round %s", rnd)
                    break
            else:
                self.stop_reason = "completed"
        except BaseException as exc:
            self.stop_reason = f"failed: {type(exc).__name__}: {exc}"
            self.save_results()  # the checkpoint of the last completed round stays as it was
            raise
        self.save_results(arrays)
        log(INFO, "")
        log(INFO, "Strategy execution finished in %.2fs", time.time() - t_start)
        log(INFO, "")
        log(INFO, "Final results:")
        log(INFO, "")
        for line in io.StringIO(str(result)):
            log(INFO, "\t%s", line.strip("\n"))
        log(INFO, "")
        return result

    def _privacy_metrics(self, rec: dict) -> dict:
        """The privacy spent after a round (its record): eps_rigorous / eps_heuristic, eps_paper, eps_flower."""
        if not self.private:
            return {}
        out = {k: float(rec[k]) for k in ("eps_rigorous", "eps_heuristic", "eps_paper", "eps_flower")
               if rec.get(k) is not None}
        return out

    def _server_metrics(self, rec: dict) -> MetricRecord | None:
        """``evaluate_metrics_serverapp[r]``: ``evaluate_fn``'s metrics of round r plus the privacy spent."""
        merged = {**(rec.get("evaluate_serverapp") or {}), **self._privacy_metrics(rec)}
        return MetricRecord(merged) if merged else None

    # ------------------------------------------------------------------ checkpoints
    def _fingerprint(self) -> dict:
        """Everything that determines the numbers besides the secret, the nonce and the user's code."""
        return {"method": self.method, "N": self.N, "B": self.B, "K": self.K, "clip": self.clip,
                "epsilon": self.epsilon, "delta": self.delta, "tau": self.tau, "calibration": self.calibration,
                "noise_multiplier": self.noise_multiplier, "server_lr": self.server_lr, "bq_bits": self.bq_bits,
                "layer_dtype": self.layer_dtype, "z": None if self.schedule is None else self.schedule.z.tolist()}

    def _secret_check(self) -> str:
        """A one-way tag of the run key: tells a resume with another secret apart (not the secret; checkpoint only)."""
        return hashlib.sha256(b"flower_dp.gau_lrq.secret-check\x00" + self._run_key).hexdigest()[:16]

    def _identity(self) -> dict:
        """What a checkpoint must match to be resumed (the recorder stores it first and compares it)."""
        return {"kind": "gau_lrq", "fingerprint": self._fingerprint()}

    def _checkpoint(self, arrays: ArrayRecord) -> None:
        self.recorder.save_checkpoint({
            "stream_nonce": self.stream_nonce, "secret_check": self._secret_check(), "rounds": self.rounds,
            "initial_evaluate": self.initial_evaluate, "names": list(arrays.keys()), "arrays": [a.numpy() for a in arrays.values()]})

    def _restore(self, initial_arrays: ArrayRecord) -> tuple[ArrayRecord, int]:
        """Load ``out_dir/checkpoint.pt`` and return (theta after its last round, next round)."""
        ck = self.recorder.load_checkpoint()  # checksum, kind and fingerprint
        if self._nonce_given and self.stream_nonce != ck["stream_nonce"]:
            raise CheckpointError(f"cannot resume: stream_nonce {self.stream_nonce!r} differs from the checkpoint's "
                                  f"{ck['stream_nonce']!r}; leave stream_nonce unset when resuming")
        self.stream_nonce = ck["stream_nonce"]
        self._run_key = run_key(self._secret, self.stream_nonce)
        if self._secret_check() != ck["secret_check"]:
            raise CheckpointError(f"cannot resume {str(self.out_dir)!r}: the run secret differs from the one of the "
                                  "checkpointed run; use the same secret file")
        self.rounds = list(ck["rounds"])
        self.initial_evaluate = ck.get("initial_evaluate")
        if self.accountant is not None and self.accountant.num_releases == 0:  # Flower's accountant is not checkpointed
            for r in self.rounds:
                self.accountant.compose(self._flower_event(r["k"]))
        if not self.rounds:
            return initial_arrays, 1
        return ArrayRecord({n: _array(a) for n, a in zip(ck["names"], ck["arrays"])}), len(self.rounds) + 1

    def _fill_result(self, result: Result) -> None:
        """Put the metrics of already completed rounds (from a checkpoint) into ``result``."""
        if self.initial_evaluate is not None:
            result.evaluate_metrics_serverapp[0] = MetricRecord(self.initial_evaluate)
        for r in self.rounds:
            for key, attr in (("train_metrics", "train_metrics_clientapp"),
                              ("evaluate_clientapp", "evaluate_metrics_clientapp")):
                if r.get(key) is not None:
                    getattr(result, attr)[r["round"]] = MetricRecord(r[key])
            server = self._server_metrics(r)
            if server is not None:
                result.evaluate_metrics_serverapp[r["round"]] = server

    def results(self) -> dict:
        """Config (no secret), per-round records and totals, JSON-serialisable.

        Besides the per-round records (``rounds``), the most used series are given flat:
        ``accuracy_per_round`` (server-side evaluation, index 0 = before training, None where
        not evaluated), ``bits_per_round`` (uplink bits of all clients of a round: the public message size of the
        round's spec times the clients that replied), ``bytes_per_round`` (uplink bytes Flower carried for the
        Gau-LRQ records, payload and metadata, whose size is fixed by public values; the user's own metric records
        are not counted), ``eps_rigorous_per_round``.  Data-dependent counts (the entropy of the sent integers, the
        paper's bits from the clean max) appear only with ``debug_metrics``, under ``rounds[].debug_uncharged``.  BQ-SGD, whose
        noise has no DP proof: ``eps_rigorous`` None (per round too), ``eps_heuristic``,
        ``eps_heuristic_per_round`` and ``privacy_note``.
        """
        sch = self.schedule
        out = {"algorithm": PAPER_NAMES[self.method] if self.tau == 1 or not self.private else
               "Dynamic " + PAPER_NAMES[self.method],
               "config": {"method": self.method, "N": self.N, "B": self.B, "K": self.K, "clip": self.clip,
                          "epsilon": self.epsilon, "delta": self.delta, "tau": self.tau,
                          "calibration": self.calibration, "noise_multiplier": self.noise_multiplier,
                          "server_lr": self.server_lr, "bq_bits": self.bq_bits, "secret_file": self.secret_file,
                          "stream_nonce": self.stream_nonce},
               "run": self.run_info,
               "noise": noise_record(self.reproducible, note=None if self.reproducible else GAU_LRQ_SECRET_NOTE),
               "privacy": None if sch is None else {
                   "unit": "client", "adjacency": "replace_one", "sampling": "fixed-size B of N without replacement",
                   "accountant": "min(PLD, RDP) of the fixed-size dominating pair: PoissonSampled(B/N, Gaussian(z/2)) "
                                 "under add/remove, both orders (flower_dp.privacy.gau_lrq)",
                   "note": "client-level guarantee (a client's whole data replaced); record-level only when clients "
                           "hold disjoint data",
                   "z": sch.z.tolist(), **{f"{k}_plan": v for k, v in self._eps_fields(sch.eps_rigorous).items()},
                   "eps_paper_plan": sch.eps_paper, "warnings": list(sch.warnings),
                   **({"privacy_note": self.heuristic_note} if self.heuristic_note is not None else {})},
               "rounds": self.rounds, "stop_reason": self.stop_reason}
        published = self.publish_train_metrics or self.publish_evaluate_metrics
        out["uncharged_statistics_released"] = bool(published or not self.private)
        if published and self.private:
            out["release_warning"] = ("client train/evaluate metrics (statistics of the clients' private data) are "
                                      "published; the accountant does not charge them, so eps does not cover them")
        done = len(self.rounds)
        out["rounds_completed"] = done
        out.update(self._eps_fields(self.rounds[-1].get("eps_heuristic", self.rounds[-1]["eps_rigorous"]) if done
                                    else 0.0))
        if self.heuristic_note is not None:
            out["privacy_note"] = self.heuristic_note
        out["eps_paper"] = self.rounds[-1]["eps_paper"] if done else 0.0
        acc0 = (self.initial_evaluate or {}).get("accuracy")
        out["accuracy_per_round"] = [acc0] + [(r.get("evaluate_serverapp") or {}).get("accuracy") for r in self.rounds]
        out["final_accuracy"] = out["accuracy_per_round"][-1]
        out["bits_per_round"] = [r["bits_algorithmic"] for r in self.rounds]
        out["bytes_per_round"] = [r["bytes_carried"] for r in self.rounds]
        out["eps_rigorous_per_round"] = [r["eps_rigorous"] for r in self.rounds]
        if self.heuristic_note is not None:
            out["eps_heuristic_per_round"] = [r.get("eps_heuristic") for r in self.rounds]
        out["total_bits_algorithmic"] = float(sum(r["bits_algorithmic"] for r in self.rounds))
        out["total_bytes_carried"] = int(sum(r["bytes_carried"] for r in self.rounds))
        return out

    def save_results(self, arrays: ArrayRecord | None = None) -> None:
        """Write ``results.json`` (and, given the current weights, the checkpoint) into ``out_dir``, atomically."""
        if self.out_dir is not None:
            if arrays is not None:
                self._checkpoint(arrays)
            self.recorder.write(self.results())


def message_bytes(*objects) -> int:
    """Bytes of a message (or of records) as Flower serializes it for transport: all its deflated objects
    (metadata, records, arrays).

    Walks the public ``children`` / ``deflate()`` of Flower's message objects; each object is counted once
    (by ``object_id``), as Flower ships it once.
    """
    seen: dict[str, int] = {}
    todo = list(objects)
    while todo:
        obj = todo.pop()
        if obj.object_id in seen:
            continue
        seen[obj.object_id] = len(obj.deflate())
        todo.extend((obj.children or {}).values())
    return int(sum(seen.values()))


def _log_start_info(num_rounds: int, arrays: ArrayRecord, train_config: ConfigRecord | None,
                    evaluate_config: ConfigRecord | None) -> None:
    """The lines Flower's ``Strategy.start`` logs before its summary."""
    log(INFO, "\t├── Number of rounds: %d", num_rounds)
    log(INFO, "\t├── ArrayRecord (%.2f MB)", sum(len(a.data) for a in arrays.values()) / (1024 ** 2))
    for name, cfg in (("train", train_config), ("evaluate", evaluate_config)):
        log(INFO, "\t├── ConfigRecord (%s): %s", name, dict(cfg) if cfg else "(empty!)")


def _not_gau_lrq(where: str, kind, _mine) -> str:
    return (f"checkpoint in {where} is not a GauLRQ checkpoint, got kind {kind!r}; point out_dir at a GauLRQ run or "
            "drop resume")


def _other_settings(where: str, theirs: dict | None, mine: dict) -> str:
    theirs = theirs or {}
    diff = {k: (theirs.get(k), mine[k]) for k in mine if theirs.get(k) != mine[k]}
    return (f"cannot resume {where}: the strategy differs from the checkpointed run in {sorted(diff)} "
            f"(checkpoint, now) = {diff}; use the same settings")


def _array(v: np.ndarray):
    from flwr.app import Array

    return Array(np.ascontiguousarray(v))
