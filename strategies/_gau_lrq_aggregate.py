"""Decoding and averaging one Gau-LRQ round on the server: :class:`RoundAggregation`, a mixin of
:class:`flower_dp.strategies.GauLRQ`.

Each sampled client's reply is decoded (Eq. 12) with that client's run key (derived from the master secret); the decoded updates are averaged with weight
1/B and applied to theta.  A sampled client that failed (an error reply, or none) is dropped from the average
without touching the others' decoding; the trusted server then adds N(0, sigma^2 I) per dropped client from its own
stream (no client key reveals it), so the released sum is still "B vectors of norm <= S2 (0 for the dropped) + N(0, B sigma^2 I)", the
mechanism the accountant charged.  A reply that does not decode (wrong stream, tampering) raises ``DecodeError``:
it is never silently averaged or dropped.

Log records at INFO and above name no sampled or failed node or partition: only counts (those ids would reveal part
of the hidden sample to whoever reads the logs).  The ids go to DEBUG records, which are the server's own view.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from logging import DEBUG, INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord
from flwr.common import log

from flower_dp.errors import DecodeError
from flower_dp.mechanisms.gau_lrq_codec import (META_KEY, PARTITION_META, PAYLOAD_KEY, decode_update, payload_bytes,
                                                public_bits, unpack_partition_id)
from flower_dp.mechanisms.lrq import lrq_key

from . import flower_privacy as fp

__all__ = ["RoundAggregation", "message_bytes"]


class RoundAggregation:
    """``GauLRQ.aggregate_train`` and its parts."""

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Decode each reply (Eq. 12), average with weight 1/B, apply theta_{k+1} = theta_k + lr * mean.

        A sampled client that failed (an error reply, or no reply) is dropped from the average; the server adds
        its share of the noise (module docstring), so the round's charge does not depend on who replied.
        """
        p, self._pending = self._pending, None
        if p is None:
            raise RuntimeError("aggregate_train called without configure_train; call them in order")
        replies = list(replies)
        valid = [m for m in replies if not m.has_error()]
        failed = [int(m.metadata.src_node_id) for m in replies if m.has_error()]
        self._note_failures(server_round, replies, valid)
        d = int(sum(t.size for t in p["theta"]))
        total, got = self._decode_replies(server_round, p, valid, d)
        if self.keep_decoded:
            self.thetas[p["k"]] = [t.copy() for t in p["theta"]]
        dropped = self.B - got["received"]
        if dropped:
            total += self._dropped_share(server_round, p, dropped, d, got["received"])
        new = self._server_step(p, total / self.B)  # Alg. 1 line 15: weight 1/B whatever num-examples says
        metrics = (self.train_metrics_aggr_fn([m.content for m in valid], self.weighted_by_key)
                   if valid and self.publish_train_metrics else None)
        rec = self._round_record(server_round, p, got, failed, dropped, d, metrics)
        if self.private:
            log(INFO, "Privacy spent: epsilon=%.6f at delta=%g after %d releases (flower-dp, party %s, %s; paper's "
                "formula %.6f)", p["eps"], self.delta, p["k"] + 1, self.party,
                "heuristic, no DP proof" if self.heuristic_note is not None else "rigorous", rec["eps_paper"])
        if p["event"] is not None:  # the release happened: compose it into Flower's accountant (as its DP wrappers)
            rec["eps_flower"] = float(fp.compose(self.accountant, p["event"]).epsilon)
        self.rounds.append(rec)
        return ArrayRecord({n: _array(v) for n, v in new.items()}), metrics

    def _note_failures(self, server_round: int, replies: list[Message], valid: list[Message]) -> None:
        """Log the error replies (a count at WARNING; node ids only at DEBUG, the server's own view: they would reveal
        part of the hidden sample); stop after ``max_failed_rounds`` consecutive rounds where every client failed."""
        log(INFO, "aggregate_train: Received %s results and %s failures", len(valid), len(replies) - len(valid))
        errors = [m for m in replies if m.has_error()]
        if errors:  # a client's error reason may name it (or hold its data): DEBUG, beside its node id
            log(WARNING, "GauLRQ round %d: %d sampled client(s) replied with an error and are dropped from the average "
                "(node ids and reasons at DEBUG only: they would reveal part of the hidden sample)", server_round,
                len(errors))
        for m in errors:
            log(DEBUG, "GauLRQ round %d: node %d replied with an error: %s", server_round, m.metadata.src_node_id,
                m.error.reason)
        self._failed_streak = self._failed_streak + 1 if (replies and not valid) else 0
        if self._failed_streak >= self.max_failed_rounds:
            reason = next(m.error.reason for m in replies if m.has_error())
            raise RuntimeError(f"GauLRQ: every sampled client replied with an error in {self._failed_streak} "
                               f"consecutive rounds (up to round {server_round}; max_failed_rounds="
                               f"{self.max_failed_rounds}); a client's error: {reason}. Fix the cause, or raise "
                               "max_failed_rounds to train through it on server noise")

    def _decode_replies(self, server_round: int, p: dict, valid: list[Message], d: int
                        ) -> tuple[np.ndarray, dict[str, Any]]:
        """The sum of the decoded updates (float64, (d,)) and the round's counts: ``received``, ``bytes_payload``,
        ``bytes_carried`` and, with ``debug_metrics``, the mod's uncharged statistics (``diag``)."""
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
                raise DecodeError(f"round {server_round}: a reply came from node {src}, which was not sampled; "
                                  "replies must answer this round's train messages")
            meta = dict(m.content[META_KEY]) if META_KEY in m.content else {}
            if PAYLOAD_KEY not in m.content or PARTITION_META not in meta:
                raise DecodeError(f"round {server_round}: a sampled client's reply has no Gau-LRQ payload, got records "
                                  f"{list(m.content.keys())}; add gau_lrq_mod to the ClientApp's mods")
            pid = unpack_partition_id(meta.pop(PARTITION_META))
            if pid in seen or not 0 <= pid < self.N:
                log(DEBUG, "GauLRQ round %d: node %d claims partition-id %d", server_round, src, pid)
                raise DecodeError(f"round {server_round}: a sampled client claims a partition-id twice or outside "
                                  f"[0, {self.N}) (the node at DEBUG); every SuperNode needs its own partition id")
            seen[pid] = src
            arrays = m.content[PAYLOAD_KEY]
            payload = {name: a.numpy() for name, a in arrays.items()}
            try:
                hat = decode_update(payload, meta, p["spec"], lrq_key(self._client_run_key(pid), p["k"], pid))
            except DecodeError as exc:
                log(DEBUG, "GauLRQ round %d: node %d (partition %d) does not decode", server_round, src, pid)
                raise DecodeError(f"round {server_round}: a sampled client's reply does not decode with its "
                                  f"partition's key (node and partition at DEBUG): {exc}") from exc
            if hat.shape != (d,):
                raise DecodeError(f"a decoded update has shape {hat.shape}, expected ({d},)")
            total += hat
            payload_total += payload_bytes(arrays.values())
            carried += message_bytes(arrays, m.content[META_KEY])  # the Gau-LRQ records only
            if diag:  # the mod's debug statistics (make_gau_lrq_mod(debug_metrics=True)), uncharged
                mrec = next(iter(m.content.metric_records.values()), None) or {}
                for key in diag:
                    diag[key] += float(mrec.get(f"gau-lrq.{key}", 0.0))
            if self.keep_decoded:
                self.decoded.setdefault(p["k"], {})[pid] = hat
        return total, {"received": len(seen), "bytes_payload": payload_total, "bytes_carried": carried, "diag": diag}

    def _dropped_share(self, server_round: int, p: dict, dropped: int, d: int, received: int) -> np.ndarray:
        """The noise the dropped clients would have carried, drawn by the server (zeros for a non-private run)."""
        log(WARNING, "GauLRQ round %d: %d of %d sampled clients replied; the others are dropped from the average "
            "(still divided by B = %d)%s", server_round, received, self.B, self.B,
            "; the server adds their share of the noise" if self.private else "")
        if not self.private:
            return np.zeros(d, dtype=np.float64)
        extra = math.sqrt(dropped) * p["spec"].sigma * self._dropout_rng(p["k"]).standard_normal(d)
        if self.keep_decoded:
            self.dropout_noise[p["k"]] = extra
        return extra

    def _server_step(self, p: dict, mean: np.ndarray) -> dict[str, np.ndarray]:
        """theta_{k+1} = theta_k + server_lr * mean, per named array (in theta's dtype)."""
        new, off = {}, 0
        for name, t in zip(p["names"], p["theta"]):
            step = mean[off: off + t.size].reshape(t.shape)
            new[name] = (t.astype(np.float64) + self.server_lr * step).astype(t.dtype)
            off += t.size
        return new

    def _round_record(self, server_round: int, p: dict, got: dict, failed: list[int], dropped: int, d: int,
                      metrics: MetricRecord | None) -> dict:
        """The round's entry of ``results()["rounds"]``: public counts, sizes and the privacy spent."""
        bits = public_bits(p["spec"], d)
        return {"round": server_round, "k": p["k"], "method": self.method, "sigma": p["spec"].sigma,
                "z": None if self.schedule is None else float(self.schedule.noise_multiplier[p["k"]]), "sampled": len(p["sampled"]),
                "received": got["received"], "dropped": dropped, "failed": len(failed), "d": d,
                **({"failed_nodes": failed} if self.debug_metrics else {}),
                "bytes_payload": got["bytes_payload"], "bytes_carried": got["bytes_carried"],
                "bytes_downlink": p["downlink"], "bits_algorithmic": bits * got["received"], "bits_per_coord": bits / d,
                **({"debug_uncharged": got["diag"]} if got["diag"] else {}),
                **self._eps_fields(p["eps"]), "eps_paper": self.schedule.eps_paper_after(p["k"] + 1, self.delta)
                if self.schedule is not None else float("inf"),
                "train_metrics": None if metrics is None else dict(metrics)}

    def _dropout_rng(self, k: int) -> np.random.Generator:
        """The server's own stream for round k's dropout noise (no client key reveals it; reproducible on resume)."""
        seed = hashlib.sha256(b"flower_dp.gau_lrq.dropout\x00" + self._server_key + k.to_bytes(8, "little")).digest()
        return np.random.Generator(np.random.Philox(int.from_bytes(seed, "little")))


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


def _array(v: np.ndarray):
    from flwr.app import Array

    return Array(np.ascontiguousarray(v))
