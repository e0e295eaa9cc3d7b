"""The record of a Gau-LRQ run: :class:`RunRecord`, a mixin of :class:`flower_dp.strategies.GauLRQ`.

What a run publishes (``results()``: config without the secret, per-round records, totals, the privacy spent) and
what its checkpoint holds (theta, the per-round records, the public stream nonce and a one-way tag of the server's
run key; never a secret or a key), both written after every round through :func:`flower_dp.engine.save_round`.
``resume=True`` continues from the checkpoint: client sampling, the clients' streams and the dropout noise are keyed
by derivations of the master secret and the public nonce, so the resumed run repeats the uninterrupted one exactly.
"""

from __future__ import annotations


from flwr.app import ArrayRecord, MetricRecord
from flwr.serverapp.strategy import Result

from flower_dp.engine import save_round, with_status
from flower_dp.errors import CheckpointError
from flower_dp.mechanisms.gau_lrq_codec import PAPER_NAMES, run_key_check
from flower_dp.privacy.accountant import BOUNDS
from flower_dp.privacy.parties import PARTIES, gau_lrq_party_epsilon_and_bound
from flower_dp.rng import noise_record

from ._gau_lrq_aggregate import _array

__all__ = ["RunRecord", "GAU_LRQ_SECRET_NOTE", "not_gau_lrq", "other_settings"]

#: ``results()["noise"]["note"]`` of a run keyed by a secret (the default)
GAU_LRQ_SECRET_NOTE = ("client sampling and the server's dropout noise are keyed by the server's master secret, each "
                       "client's LRQ layers and noise by its own key (derived from the master secret; only that client "
                       "and the trusted server hold it), with a fresh random nonce per run; the seed keys only public "
                       "randomness (initial model, client data, local minibatches)")


class RunRecord:
    """``GauLRQ.results``, ``save_results`` and the checkpoint's contents, identity and restore."""

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

    def _eps_by_party(self, rounds: int) -> dict:
        """Every party's entry after ``rounds`` rounds (:meth:`flower_dp.privacy.gau_lrq.Schedule.eps_by_party`),
        computed once per round count."""
        cache = self.__dict__.setdefault("_party_cache", {})
        if rounds not in cache:
            cache.clear()
            cache[rounds] = self.schedule.eps_by_party(rounds, self.delta, heuristic_note=self.heuristic_note)
        return cache[rounds]

    def _accountant_label(self) -> str:
        """What computed the calibrated party's eps of the planned K rounds: the bound actually used."""
        sch = self.schedule
        _, bound = gau_lrq_party_epsilon_and_bound(self.party, sch.noise_multiplier, self.delta, B=self.B, N=self.N,
                                                   per_client_keys=self.per_client_keys)
        return (f"{bound}: {BOUNDS[bound]}; B of N = {self.B} of {self.N} without replacement, charged to party "
                f"{self.party!r} (flower_dp.privacy.parties)")

    def _fingerprint(self) -> dict:
        """Everything that determines the numbers besides the secret, the nonce and the user's code."""
        return {"method": self.method, "N": self.N, "B": self.B, "K": self.K, "clip": self.clip,
                "epsilon": self.epsilon, "delta": self.delta, "tau": self.tau, "calibration": self.calibration,
                **({"party": self.party} if self.party != "model_observer" else {}),
                "noise_multiplier": self._fixed_noise_multiplier, "server_lr": self.server_lr, "bq_bits": self.bq_bits,
                "layer_dtype": self.layer_dtype, "z": None if self.schedule is None else self.schedule.noise_multiplier.tolist()}

    def _secret_check(self) -> str:
        """A one-way tag of the server's run key: tells a resume with another master secret apart (checkpoint only)."""
        return run_key_check(self._server_key)

    def _identity(self) -> dict:
        """What a checkpoint must match to be resumed (the recorder stores it first and compares it)."""
        return {"kind": "gau_lrq", "fingerprint": self._fingerprint()}

    def _checkpoint_state(self, arrays: ArrayRecord) -> dict:
        return {"stream_nonce": self.stream_nonce, "secret_check": self._secret_check(), "rounds": self.rounds,
                "initial_evaluate": self.initial_evaluate, "names": list(arrays.keys()),
                "arrays": [a.numpy() for a in arrays.values()]}

    def _restore(self, initial_arrays: ArrayRecord) -> tuple[ArrayRecord, int]:
        """Load ``out_dir/checkpoint.pt`` and return (theta after its last round, next round)."""
        ck = self.recorder.load_checkpoint()  # checksum, kind and fingerprint
        if self._nonce_given and self.stream_nonce != ck["stream_nonce"]:
            raise CheckpointError(f"cannot resume: stream_nonce {self.stream_nonce!r} differs from the checkpoint's "
                                  f"{ck['stream_nonce']!r}; leave stream_nonce unset when resuming")
        self.stream_nonce = ck["stream_nonce"]
        self._set_run_keys()
        if self._secret_check() != ck["secret_check"]:
            raise CheckpointError(f"cannot resume {str(self.out_dir)!r}: the master secret differs from the one of the "
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
        """Config (no secret), per-round records and totals, JSON-serialisable; ``status`` as the run engine decides
        it from ``stop_reason`` (:func:`flower_dp.engine.with_status`).

        Besides the per-round records (``rounds``), the most used series are given flat:
        ``accuracy_per_round`` (server-side evaluation, index 0 = before training, None where
        not evaluated), ``bits_per_round`` (uplink bits of all clients of a round: the public message size of the
        round's spec times the clients that replied), ``bytes_per_round`` (uplink bytes Flower carried for the
        Gau-LRQ records, payload and metadata, whose size is fixed by public values; the user's own metric records
        are not counted), ``eps_rigorous_per_round``.  Data-dependent counts (the entropy of the sent integers, the
        paper's bits from the clean max) appear only with ``debug_metrics``, under ``rounds[].debug_uncharged``.  BQ-SGD, whose
        noise has no DP proof: ``eps_rigorous`` None (per round too), ``eps_heuristic``,
        ``eps_heuristic_per_round`` and ``privacy_note``.

        Every eps above is the calibrated party's (``party``, :mod:`flower_dp.privacy.parties`); ``eps_by_party``
        holds every party's after the rounds done (party name -> ``{"eps", "delta", "bound"}`` or ``{"eps": None,
        "reason"}``), ``privacy.eps_by_party_plan`` after the planned K.
        """
        sch = self.schedule
        out = {"algorithm": PAPER_NAMES[self.method] if self.tau == 1 or not self.private else
               "Dynamic " + PAPER_NAMES[self.method],
               "config": {"method": self.method, "N": self.N, "B": self.B, "K": self.K, "clip": self.clip,
                          "epsilon": self.epsilon, "delta": self.delta, "tau": self.tau,
                          "calibration": self.calibration, "party": self.party,
                          "noise_multiplier": self._fixed_noise_multiplier, "server_lr": self.server_lr,
                          "bq_bits": self.bq_bits, "secret_file": self.secret_file,
                          "stream_nonce": self.stream_nonce},
               "run": self.run_info,
               "noise": noise_record(self.reproducible, note=None if self.reproducible else GAU_LRQ_SECRET_NOTE),
               "privacy": None if sch is None else {
                   "unit": "client", "adjacency": "replace_one", "sampling": "fixed-size B of N without replacement",
                   "party": self.party, "accountant": self._accountant_label(),
                   "note": "client-level guarantee (a client's whole data replaced); record-level only when clients "
                           "hold disjoint data",
                   "z": sch.noise_multiplier.tolist(), **{f"{k}_plan": v for k, v in self._eps_fields(sch.eps_rigorous).items()},
                   "eps_paper_plan": sch.eps_paper, "eps_by_party_plan": self._eps_by_party(len(sch.noise_multiplier)),
                   "warnings": list(sch.warnings),
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
        out["party"] = self.party
        out["eps_by_party"] = (self._eps_by_party(done) if sch is not None else
                               {name: {"eps": None, "reason": "not private: method='none' adds no noise"}
                                for name in PARTIES["gau_lrq"]})
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
        return with_status(out)  # its "status" from its stop_reason

    def save_results(self, arrays: ArrayRecord | None = None) -> None:
        """Write ``results.json`` (and, given the current weights, the checkpoint) into ``out_dir``, atomically
        (:func:`flower_dp.engine.save_round`)."""
        if self.out_dir is not None:
            save_round(self.recorder, self.results(), None if arrays is None else self._checkpoint_state(arrays))


def not_gau_lrq(where: str, kind, _mine) -> str:
    return (f"checkpoint in {where} is not a GauLRQ checkpoint, got kind {kind!r}; point out_dir at a GauLRQ run or "
            "drop resume")


def other_settings(where: str, theirs: dict | None, mine: dict) -> str:
    theirs = theirs or {}
    diff = {k: (theirs.get(k), mine[k]) for k in mine if theirs.get(k) != mine[k]}
    return (f"cannot resume {where}: the strategy differs from the checkpointed run in {sorted(diff)} "
            f"(checkpoint, now) = {diff}; use the same settings")
