"""Gau-LRQ-SGD (and Dynamic Gau-LRQ-SGD, Gau-SGD, QG-SGD, BQ-SGD, Local SGD) as a Flower strategy.

:class:`GauLRQ` is a drop-in for Flower's ``FedAvg`` (Yan, Li, Lan, Wu, Song, arXiv:2312.07060, Alg. 1, Sec. V;
Alg. 1) that samples exactly B of N clients per round, decodes their low-resolution
quantized noisy updates on the server and accounts client-level privacy rigorously.  It subclasses ``FedAvg`` to
reuse its evaluation, metric aggregation, record keys and summary (a wrapper cannot work: the replies carry integer
messages, not weights, and the aggregation rule is part of the mechanism); its parts live beside it: who takes part
and what they are sent (:mod:`._gau_lrq_admission`), decoding and averaging (:mod:`._gau_lrq_aggregate`), the
round loop (:mod:`._gau_lrq_loop`) and the run's record (:mod:`._gau_lrq_record`).

==================  ============================  ============================================
paper               spec                          code
==================  ============================  ============================================
N, B, q = B/N       clients, sampled per round    ``num_clients``, ``clients_per_round``
K                   rounds                        ``num_rounds`` (Flower round r = k + 1)
S2                  L2 clip of one update         ``clip``
sigma_k             per-client std per coord.     ``sigma_k = z_k S2 / sqrt(B)`` (§5.3)
z_k                 noise multiplier on the SUM   :attr:`GauLRQ.noise_multiplier`
tau                 decay (Dynamic, §6)           ``tau`` (1 = fixed scheme)
hat-Delta^(i)       decoded update (Eq. 12)       :func:`flower_dp.mechanisms.gau_lrq_codec.decode_update`
==================  ============================  ============================================
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from logging import INFO, WARNING
from pathlib import Path

import numpy as np
from flwr.app import MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp.strategy import FedAvg

from flower_dp._checks import check_choice, check_delta, check_epsilon, check_int, check_positive
from flower_dp.mechanisms.gau_lrq_codec import (KEY_DIR_RUN_CONFIG, METHODS, PAPER_NAMES, RoundSpec, client_key,
                                                client_run_key, create_secret_file, load_secret, server_run_key,
                                                write_client_keys)
from flower_dp.privacy.gau_lrq import Schedule, client_level_epsilon, gau_lrq_schedule
from flower_dp.privacy.parties import PARTIES, check_party, party_label
from flower_dp.recorder import RunRecorder

from . import flower_privacy as fp
from ._gau_lrq_admission import RoundAdmission
from ._gau_lrq_aggregate import RoundAggregation, message_bytes
from ._gau_lrq_loop import RoundLoop
from ._gau_lrq_record import RunRecord, not_gau_lrq, other_settings

__all__ = ["GauLRQ", "Schedule", "gau_lrq_schedule", "client_level_epsilon", "message_bytes", "BQ_PRIVACY_NOTE"]

#: Methods whose noise has no DP proof: their eps is ``eps_heuristic`` (``eps_rigorous`` is None), with this note.
BQ_PRIVACY_NOTE = ("noise matched by variance to the Gaussian; no DP proof: BQ-SGD's binomial noise has the variance "
                   "of the Gaussian the accountant charges, and eps_heuristic is that Gaussian's eps")
HEURISTIC_METHODS = {"bq": BQ_PRIVACY_NOTE}
#: The note of an LRQ run with ``layer_dtype="float32"``: its layer centres and heights come from 24-bit uniforms
#: (numpy's float32 ``random``), so the layer half-width ``sigma sqrt(-2 ln y)`` stops at 5.77 sigma and takes coarse
#: values near there: the decoded error is not the exact Gaussian the accountant charges (as torch's float32 normal
#: sampler, docs/privacy.md "The Gaussian samplers"), so its eps is ``eps_heuristic``.
FLOAT32_LAYER_NOTE = ("heuristic, not proven: layer_dtype='float32' draws the LRQ layers from 24-bit uniforms, so the "
                      "decoded error is cut near 5.77 sigma and is not exactly Gaussian; use layer_dtype='float64' "
                      "(the default) for a proven eps")

#: :meth:`GauLRQ.check_learning` warns when the noise norm on the averaged update exceeds this many clip norms
NOISE_TO_CLIP_LIMIT = 10.0


class GauLRQ(RoundLoop, RoundAdmission, RoundAggregation, RunRecord, FedAvg):
    """Server side of Gau-LRQ-SGD (Alg. 1) and its baselines (Sec. VII), Message API; a drop-in for ``FedAvg``.

    Drop-in: replace ``FedAvg(...)`` by ``GauLRQ(num_clients=N, clip=S2, epsilon=eps, ...)`` with the same
    arguments (FedAvg's ten, positional or keyword, come first in FedAvg's order; GauLRQ's own are keyword-only),
    and add the mod to the ClientApp.  Before the first train message carries the model, GauLRQ sends every node a
    probe that only ``gau_lrq_mod`` answers (with a keyed hash of that client's own key) and stops with a
    ``RuntimeError`` naming the nodes that do not (or that hold the master secret or another client's key), so a
    ClientApp without the mod never sends its weights.  FedAvg's arguments mean
    here:

    - ``fraction_train`` / ``min_train_nodes``: honoured as FedAvg would with N connected nodes: when
      ``clients_per_round`` is not given, B = ``max(int(N * fraction_train), min_train_nodes)`` (FedAvg's
      defaults 1.0 and 2 give B = N).  GauLRQ then samples exactly these B every round, uniformly without
      replacement and keyed by the server's own stream (the sampling its accountant charges).  Values that contradict
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
      (see ``debug_metrics``), aggregated by your function over the user's MetricRecords, unaltered.  Without a
      ``train_metrics_aggr_fn`` (and ``debug_metrics``) the mod keeps the user's train metrics on the client: a
      reply is then the encoded update and its public metadata only, of a size that depends on nothing private.

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
    party : str, default "model_observer"
        The party the noise is calibrated to, the budget checked for and ``privacy_spent()`` answers for
        (:mod:`flower_dp.privacy.parties`): ``"model_observer"`` (the released global models only: the Gau-LRQ
        paper's adversary), ``"network_observer"`` (also who sends when: the sample is known, no amplification),
        ``"client"`` (another client, holding only its own key: :attr:`per_client_keys`).  ``"server"`` has no
        eps (it decodes each update) and cannot be calibrated to.  Every party's eps is reported beside it
        (``results()["eps_by_party"]``).
    accountant : Flower ``PrivacyAccountant`` or None (Flower >= 1.41)
        Flower's accountant (e.g. ``flwr.serverapp.RdpAccountant(PrivacyConfig(...))``), as Flower's DP wrappers
        take it: each round is checked against its ``max_epsilon`` (Flower's ``PrivacyBudgetExhausted`` from
        ``configure_train``) and composed after aggregation.  The check uses GauLRQ's own rigorous eps at the
        accountant's ``target_delta`` (the number the run calibrates to, reports and ``privacy_spent()``
        returns), so ``max_epsilon`` and ``epsilon`` mean the same; Flower's RDP figure for the same releases,
        never below it, is reported beside it (``eps_flower``).  Accepted configurations and what each computes:
        the table in :mod:`flower_dp.strategies.flower_privacy` (WITHOUT_REPLACEMENT + REPLACE_ONE is the tightest
        accepted; POISSON + ADD_OR_REMOVE_ONE is refused: it has no proof for B-of-N sampling).  An explicit
        ``delta`` other than the accountant's ``target_delta`` raises ``ValueError`` (the run would calibrate at one
        delta and check the budget at the other).
    secret, secret_file : the server's master secret (bytes >= 16) or the path of the file holding it; it never
        leaves the server.  Client i's key is derived from it (HMAC-SHA256 of the master and i,
        :func:`~flower_dp.mechanisms.gau_lrq_codec.client_key`) and each client holds only its own; the B-of-N sample
        and the server's noise come from a third derivation no client key reveals.  A ``secret_file`` that does not
        exist is created (32 random bytes from the OS, mode 0600, folders included) and its path logged as a
        WARNING.  An existing file readable or writable by group or others raises ``ValueError`` (path, mode,
        ``chmod 600``); so does one shorter than 16 bytes, or a client's key file.
    key_dir : path or None, a folder (created mode 0700) where GauLRQ writes one key file per client,
        ``client-<i>.key`` (mode 0600), when it is built: a simulation's mods read their own file from it (run config
        ``"lrq-key-dir"``, :mod:`flower_dp.clients.lrq_mod`).  On the deployment engine export each SuperNode's
        file with ``flower-dp lrq-keys`` instead and give it only its own (docs/flower.md).
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

    #: Each client's randomness (dither, layers, noise) comes from a key only that client and the server hold
    #: (:func:`~flower_dp.mechanisms.gau_lrq_codec.client_key`), so another client (party ``"client"``) sees the
    #: released models and whether it was itself sampled, and is charged for exactly that.  Records made when every
    #: client held the run secret are re-accounted with ``per_client_keys=False`` (no eps for ``"client"``).
    per_client_keys: bool = True

    def __init__(self, fraction_train: float | None = None, fraction_evaluate: float = 1.0,
                 min_train_nodes: int | None = None, min_evaluate_nodes: int = 2,
                 min_available_nodes: int | None = None, weighted_by_key: str = "num-examples",
                 arrayrecord_key: str = "arrays", configrecord_key: str = "config",
                 train_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
                 evaluate_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None, *,
                 num_clients: int | None = None, clients_per_round: int | None = None,
                 clip: float | None = None, num_rounds: int | None = None, epsilon: float | None = None,
                 delta: float | None = None, method: str = "lrq", tau: float = 1.0,
                 noise_multiplier: float | None = None, calibration: str = "rigorous", party: str | None = None,
                 accountant=None,
                 secret: bytes | None = None, secret_file: str | None = None, key_dir: str | Path | None = None,
                 server_lr: float = 1.0, bq_bits: int = 4,
                 layer_dtype: str = "float64", out_dir: str | Path | None = None, keep_decoded: bool = False,
                 stream_nonce: str | None = None, resume: bool = False, run_info: dict | None = None,
                 debug_metrics: bool = False, reproducible: bool = False, max_failed_rounds: int = 3,
                 node_wait_s: float = 30.0) -> None:
        self.method = check_choice("method", method, METHODS)
        self.private = method != "none"
        self.layer_dtype = check_choice("layer_dtype", layer_dtype, ("float64", "float32"))
        self.accountant = accountant
        self.party = check_party("gau_lrq", party)
        num_clients, epsilon, delta = self._accountant_defaults(num_clients, epsilon, delta)
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
        self._take_secret(secret, secret_file, stream_nonce, key_dir)
        self.node_wait_s = check_positive("node_wait_s", node_wait_s)
        self._probed: set[int] = set()
        self._probe_timeout = 3600.0  # start() sets its round timeout
        self.delta = check_delta(1e-5 if delta is None else delta)
        if self.private:
            if epsilon is None:
                raise ValueError(f"epsilon is required for method={method!r}, got None; or use method='none'")
            self.epsilon = check_epsilon(epsilon)
        else:
            self.epsilon = None
        self.tau, self.calibration, self._fixed_noise_multiplier = float(tau), calibration, noise_multiplier
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
                                    refusals={"kind": not_gau_lrq, "fingerprint": other_settings})
        self.out_dir = self.recorder.out_dir

    def _accountant_defaults(self, num_clients, epsilon, delta):
        """N, epsilon and delta, defaulting to Flower's accountant's ``population_size``, ``max_epsilon`` and
        ``target_delta``; an accountant beside a method without a DP proof is refused."""
        if self.accountant is None:
            return num_clients, epsilon, delta
        if not self.private or self.heuristic_note is not None:
            raise ValueError(f"accountant= needs a method with a DP proof ('lrq' with layer_dtype='float64', "
                             f"'gaussian', 'qg'), got method={self.method!r}, layer_dtype={self.layer_dtype!r}; "
                             "Flower's accountant would report a guarantee that does not exist; drop accountant")
        cfg = self.accountant.config
        if delta is not None and float(delta) != float(cfg.target_delta):
            raise ValueError(f"delta = {delta} differs from Flower's accountant's PrivacyConfig target_delta = "
                             f"{cfg.target_delta}: the run would calibrate at one delta and check the budget at the "
                             f"other; drop delta (it defaults to target_delta) or build PrivacyConfig(target_delta="
                             f"{delta}, ...)")
        return (cfg.population_size if num_clients is None else num_clients,
                cfg.max_epsilon if epsilon is None else epsilon, cfg.target_delta if delta is None else delta)

    def _take_secret(self, secret: bytes | None, secret_file: str | None, stream_nonce: str | None,
                     key_dir: str | Path | None) -> None:
        """The master secret (from ``secret`` or ``secret_file``, created when missing), the public per-run nonce, the
        server's own run key and, with ``key_dir``, one key file per client."""
        self._nonce_given = stream_nonce is not None
        if secret is None and secret_file is not None:
            path, created = create_secret_file(secret_file)
            if created:
                log(WARNING, "GauLRQ: created the master secret file %s (32 random bytes, mode 0600); it stays with "
                    "the server: each client gets only its own key (key_dir=, or flower-dp lrq-keys)", path)
        self._secret = load_secret(secret, secret_file)  # never logged or saved, never sent
        self.secret_file = None if secret_file is None else str(secret_file)
        # public per-run nonce: two runs sharing a secret never reuse a stream (§2.4 rule 1)
        self.stream_nonce = os.urandom(8).hex() if stream_nonce is None else str(stream_nonce)
        self._set_run_keys()
        self.key_dir = None if key_dir is None else str(write_client_keys(self._secret, self.N, key_dir))
        if self.key_dir is not None:
            log(INFO, "GauLRQ: wrote one key file per client (client-<i>.key, mode 0600) into %s; each ClientApp's "
                "gau_lrq_mod reads only its own (run config '%s')", self.key_dir, KEY_DIR_RUN_CONFIG)

    def _set_run_keys(self) -> None:
        """The server's own run key (sample, dropout noise) of this nonce; the clients' run keys are derived lazily."""
        self._server_key = server_run_key(self._secret, self.stream_nonce)
        self._client_keys: dict[int, bytes] = {}

    def _client_run_key(self, partition_id: int) -> bytes:
        """Client ``partition_id``'s run key (what its mod derives from its own key file and the nonce)."""
        pid = int(partition_id)
        if pid not in self._client_keys:
            self._client_keys[pid] = client_run_key(client_key(self._secret, pid), self.stream_nonce)
        return self._client_keys[pid]

    def _plan(self, num_rounds: int) -> None:
        """Fix K and the noise schedule (calibrated to ``epsilon`` over K rounds, or the fixed z)."""
        self.K = check_int("num_rounds", num_rounds, minimum=1)
        if self.private:
            self.schedule = gau_lrq_schedule(epsilon=self.epsilon, delta=self.delta, num_rounds=self.K, B=self.B,
                                             N=self.N, tau=self.tau, calibration=self.calibration,
                                             noise_multiplier=self._fixed_noise_multiplier, party=self.party,
                                             per_client_keys=self.per_client_keys)
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
        z = float(np.min(self.schedule.noise_multiplier))
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

    @property
    def noise_multiplier(self) -> np.ndarray | None:
        """The noise multiplier of every round, z_k (std of the noise on the sum over S2), shape (K,); None for
        "none" or before the rounds are planned (the argument ``noise_multiplier``, when given, is every z_k)."""
        return None if self.schedule is None else self.schedule.noise_multiplier

    def sigma(self, k: int) -> float:
        """Per-client per-coordinate std of round k: ``z_k S2 / sqrt(B)`` (0 for "none")."""
        return 0.0 if self.schedule is None else float(self.schedule.noise_multiplier[k] * self.clip / math.sqrt(self.B))

    def round_spec(self, k: int) -> RoundSpec:
        return RoundSpec(self.method, k, self.sigma(k), self.clip, self.bq_bits, self.layer_dtype)

    def summary(self) -> None:
        log(INFO, "\t├──> GauLRQ: method %s (%s), N=%d, B=%d, K=%s, S2=%s", self.method, PAPER_NAMES[self.method],
            self.N, self.B, self.K, self.clip)
        if self.schedule is not None:
            log(INFO, "\t│\t└── z_0=%.4g z_K-1=%.4g, eps target %s for party %s (%s plan %.4g, paper %.4g)",
                self.schedule.noise_multiplier[0], self.schedule.noise_multiplier[-1], self.epsilon, self.party,
                "heuristic (no DP proof)" if self.heuristic_note is not None else "rigorous", self.schedule.eps_rigorous,
                self.schedule.eps_paper)
        if self.accountant is not None:
            now = self.accountant.get_privacy_spent()
            log(INFO, "\t├──> Privacy spent (Flower's accountant): epsilon=%.6f at delta=%g", now.epsilon,
                now.delta)
        super().summary()

    def privacy_spent(self, party: str | None = None):
        """The privacy spent so far, as Flower's DP strategies answer it (a ``PrivacySpent``).

        GauLRQ's own client-level eps at ``delta`` for ``party`` (default: the party the run is calibrated to,
        :attr:`party`; :mod:`flower_dp.privacy.parties`): for the calibrated party, the rigorous bound the run
        calibrates to and stops on.  ``accounting_method`` names the party and the bound (for BQ-SGD the
        variance-matched heuristic, no DP proof).  With ``accountant``, ``accounting_method`` also names Flower's own
        figure for the same releases (``eps_flower``, its RDP bound for the model observer, never below ours).
        None for ``method="none"``; a party with no eps (the server; another client without per-client keys)
        raises ``ValueError`` with the reason.
        """
        if not self.private:
            return None
        party = self.party if party is None else check_party("gau_lrq", party)
        if self.schedule is None:
            eps = 0.0
        else:
            eps = self.schedule.eps_after(len(self.rounds), self.delta, party=party)
            if eps is None:
                reason = self.schedule.eps_by_party(0, self.delta)[party]["reason"]
                raise ValueError(f"no eps holds for party {party!r}: {reason}; ask for one of "
                                 f"{sorted(p for p in PARTIES['gau_lrq'] if p != party)}")
        bound = ("GDP conditioned on the known sample, mixed over Binomial(K, B/N)" if party == "network_observer" else
                 "min(PLD, RDP) of B-of-N sampling, replace-one client")
        how = (f"{party_label('gau_lrq', party)}: " +
               ("heuristic: variance-matched Gaussian, no DP proof" if self.heuristic_note is not None else
                f"flower-dp: {bound}"))
        if self.accountant is not None:
            now = self.accountant.get_privacy_spent()
            how += (f"; Flower's accountant ({now.accounting_method}) for the same releases: eps_flower = "
                    f"{now.epsilon:.6g} at delta = {now.delta:g}")
        return fp.spent(eps, self.delta, len(self.rounds), how)

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
