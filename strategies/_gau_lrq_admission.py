"""Who takes part in a Gau-LRQ round, and what they are sent: :class:`RoundAdmission`, a mixin of
:class:`flower_dp.strategies.GauLRQ`.

Every round draws exactly B of the N clients uniformly without replacement, keyed by the server's own stream (a
derivation of the master secret that no client key reveals, so no client can know the sample); each sampled
client's decoded update carries its own N(0, sigma^2 I), so the sum carries
N(0, (z S2)^2 I) exactly because the sample size is fixed (the accountant, :mod:`flower_dp.privacy.gau_lrq`, charges
B-of-N sampling under replace-one client adjacency).  Before a round is sent its privacy is checked against the
budget, exactly N SuperNodes must be connected, and every node must have answered the probe of ``gau_lrq_mod``
with a keyed hash of ITS OWN key (not the master secret, not another client's key), so that a ClientApp without
the mod never receives the model.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable
from logging import INFO

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.common import log
from flwr.serverapp import Grid

from flower_dp._checks import check_int
from flower_dp.errors import DecodeError
from flower_dp.mechanisms.gau_lrq_codec import (EXPORT_HINT, KEYS, META_KEY, PARTITION_META, PROBE_KEY, PROBE_TAG_META,
                                                ClientKey, client_key, client_run_key, probe_tag,
                                                unpack_partition_id)

from . import flower_privacy as fp
from ._grid import exchange
from ._gau_lrq_aggregate import message_bytes

__all__ = ["RoundAdmission"]


class RoundAdmission:
    """``GauLRQ.configure_train`` and its checks: the budget, the SuperNodes, the probe, the sample."""

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
                f"{'heuristic eps (no DP proof)' if self.heuristic_note is not None else 'eps'} of party "
                f"{self.party!r} to {eps_after:.4g}, "
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
                    KEYS["layer_dtype"]: spec.layer_dtype, KEYS["nonce"]: self.stream_nonce,
                    KEYS["forward_metrics"]: bool(self.publish_train_metrics)})
        self._pending = {"k": k, "spec": spec, "sampled": sampled, "theta": [a.numpy() for a in arrays.values()],
                         "names": list(arrays.keys()), "eps": eps_after, "event": event}
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: cfg})
        msgs = [Message(content=record, message_type=MessageType.TRAIN, dst_node_id=n) for n in sampled]
        # the records each message carries, B times: the routing metadata (the destination node id, a varint) is
        # left out so that no count depends on which nodes were sampled
        self._pending["downlink"] = len(msgs) * message_bytes(record)
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
        """Confirm, before any train message carries the model, that every node runs ``gau_lrq_mod`` with its own
        key and its own partition id in [0, N).

        The probe is a train message holding only a ConfigRecord (no model); the mod answers it itself with a keyed
        hash of its run key (:func:`~flower_dp.mechanisms.gau_lrq_codec.probe_tag`).  A node whose answer was made
        with the master secret or with another client's key is refused, named, with the fix.  A ClientApp without the
        mod passes the probe to the user's train function, which finds no model in it: its reply (usually an error)
        is discarded unread and the run stops with a ``RuntimeError`` naming the nodes.
        """
        todo = [n for n in node_ids if int(n) not in self._probed]
        if not todo:
            return
        probe = ConfigRecord({PROBE_KEY: self.stream_nonce, "server-round": server_round})
        msgs = [Message(content=RecordDict({self.configrecord_key: probe}),
                        message_type=MessageType.TRAIN, dst_node_id=n) for n in todo]
        replies = {int(m.metadata.src_node_id): m for m in exchange(grid, msgs, self._probe_timeout)}
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
            try:
                pid = unpack_partition_id(meta[PARTITION_META])
            except DecodeError as exc:
                problems.append(f"node {n}: {exc}")
                continue
            if not 0 <= pid < self.N or pid in pids:
                problems.append(f"node {n}: partition-id {pid}, got it twice or outside [0, {self.N})")
            elif meta[PROBE_TAG_META] != probe_tag(self._client_run_key(pid), pid):
                why = (self._wrong_key(pid, str(meta[PROBE_TAG_META])) if len(problems) < 5 else  # the ones shown
                       "holds a key that is not its own")
                problems.append(f"node {n} (partition {pid}): {why}")
            pids[pid] = n
        if problems:
            raise RuntimeError(
                f"GauLRQ: {len(problems)} of {len(todo)} ClientApps cannot take part (checked before any model was "
                f"sent): {'; '.join(problems[:5])}{' ...' if len(problems) > 5 else ''}. Every ClientApp needs "
                "ClientApp(mods=[gau_lrq_mod]) and its own key file, derived from the server's master secret "
                "(GauLRQ(key_dir=...) with run config 'lrq-key-dir', or flower-dp lrq-keys); without the mod a client "
                "would send its weights in the clear")
        self._probed.update(int(n) for n in todo)

    def _wrong_key(self, pid: int, tag: str) -> str:
        """What a probe answer that is not client ``pid``'s was made with: the master secret used as a key, another
        client's key, or a key of another master secret."""
        nonce = self.stream_nonce
        if tag == probe_tag(client_run_key(ClientKey(pid, self._secret), nonce), pid):
            return ("presents the server's master secret as its key; a client holding it could re-derive every "
                    f"other client's noise and the sample: this is the server's master secret; {EXPORT_HINT}")
        for j in range(self.N):
            other = ClientKey(pid, client_key(self._secret, j).key)  # client j's key under this node's id
            if j != pid and tag == probe_tag(client_run_key(other, nonce), pid):
                return f"holds client {j}'s key, not its own; every client holds only its own key; {EXPORT_HINT}"
        return ("holds a key that is not derived from this server's master secret (another secret, or a key file of "
                f"another deployment); {EXPORT_HINT}")

    def _sample(self, k: int, node_ids: list[int]) -> list[int]:
        """B of the N nodes, uniformly without replacement, keyed by the server's own stream (no client knows it)."""
        seed = int.from_bytes(hashlib.sha256(b"flower_dp.gau_lrq.sample\x00" + self._server_key
                                             + k.to_bytes(8, "little")).digest(), "little")
        rng = np.random.default_rng(seed)
        ids = sorted(int(n) for n in node_ids)  # node ids are uint64: sample positions, not values
        return sorted(ids[int(i)] for i in rng.choice(len(ids), size=self.B, replace=False))

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
        return fp.gaussian_event(float(self.schedule.noise_multiplier[k]), sample_size=self.B, population_size=self.N,
                                 adjacency="replace_one")
