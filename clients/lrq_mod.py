"""Client side of Gau-LRQ as a Flower mod: the user's training code does not change.

Gau-LRQ paper (arXiv:2312.07060): Alg. 1's client lines; shared randomness and trust as in its Sec. IV-B.
The mod wraps ``call_next``: it remembers the weights the server sent, lets the user's ClientApp
train, takes ``Delta = theta_{k,Q} - theta_k`` (flattened in the ArrayRecord's key order), clips it
to S2 (Eq. 10), encodes it with the method the server asked for (LRQ: Eq. 11, stream keyed by
(this client's own key, round, partition id)) and replaces the reply's weights by the bit-packed integer
message plus its public metadata.  Only :class:`flower_dp.strategies.gau_lrq.GauLRQ` can read it.

What leaves the client (docs/privacy.md)
-----------------------------------------------------------
The encoded update, its public metadata (in ``META_KEY``: the decoding parameters, the partition id
that selects the key (fixed width), and the message's bit count, :data:`RELEASED_STATS`, fixed by the public round spec
and d: every message of a round has the same size), and the user's own reply metrics, untouched, only when the
server publishes them (a ``train_metrics_aggr_fn``, or ``debug_metrics``: the round config's
``KEYS["forward_metrics"]``); otherwise they stay on the client, so that a reply's size depends on nothing of the
client's data (integers travel as varints: ``num-examples`` would show in it).  The mod adds nothing to the
user's MetricRecord: the clean update's norm, max-abs value, clipped flag, the entropy
of the sent integers and the bit counts derived from the clean A (``bits_paper``, ``bits_fixed``) stay on
the client unless the mod is built with
``debug_metrics=True`` (then they go into the MetricRecord as ``gau-lrq.*``, uncharged).  For
``method="none"`` (no privacy claim, the update is sent in the clear) every statistic is a function of
the message and goes into the metadata.  A non-finite local update (diverged training, a data-dependent
event) is replaced by a zero update, logged on the client, instead of an error reply the server would
count (``method="none"`` keeps the error).

GauLRQ's probe
--------------
Before it sends the model, :class:`~flower_dp.strategies.gau_lrq.GauLRQ` sends each node a train message
holding only a ConfigRecord with :data:`PROBE_KEY`.  The mod answers it itself (the user's train function
never sees it) with the partition id and :func:`probe_tag`, a keyed hash showing that this client holds ITS OWN
key; an error reply if it cannot read its key, or if the file it was given is the server's master secret or
another client's key (the reason names the fix).  A ClientApp without the mod passes the probe to the user's
train function, which finds no model in it: the server stops before any weights leave.

Keys and trust model (§2.3-2.4)
-------------------------------
The server holds a master secret ``S`` (``GauLRQ(secret_file=...)``) and derives from it one key per client,
``key_i = HMAC(S, "client-key" || i)``, ``i`` = ``node_config["partition-id"]``
(:func:`~flower_dp.mechanisms.gau_lrq_codec.client_key`).  A client holds only its own key, in a key file
(mode 0600) whose header names its kind and partition id; its stream for round ``k`` is keyed by
``lrq_key(client_run_key(key_i, nonce), k, i)`` (HMAC-SHA256, domain separated), ``nonce`` a public per-run value
chosen by the server (one key file serves many runs, which never share a stream).  Every random draw of the client
(LRQ layers and dither, Gau-SGD/QG-SGD noise, BQ-SGD rounding) comes from that key; the B-of-N sample and the
server's own noise come from a server-only stream no client key reveals.  So another client learns nothing of
this client's noise or of who was sampled: its view is the released models.  The mod reads the key, in this
order, from: ``key`` / ``key_file`` / ``key_dir`` given to :func:`make_gau_lrq_mod`, the node config key
``"lrq-key-file"`` (a deployment's SuperNode: ``--node-config "lrq-key-file='client-3.key'"``), the run config
key ``"lrq-key-dir"`` (a folder of ``client-<i>.key`` files; the mod reads only its own), the environment
variable ``FLOWER_DP_LRQ_KEY_FILE``.  Only *paths* ever appear in configs; a key is never logged, sent or saved.
A file that group or others may read is refused (its mode and ``chmod 600``); so is the server's master secret
(a client holding it could re-derive every other client's noise and the sample) and another client's key file.
``flower-dp lrq-keys --secret-file S --num-clients N --out DIR`` exports the key files.

The server is trusted: it derives every key, so it decodes each client's clipped update up to the LRQ layer's
width (Gau-SGD: exactly): Gau-LRQ gives no DP against the server (the paper's adversary observes the aggregate).
Anyone holding ``key_i`` and client ``i``'s message learns its clipped update the same way, so the uplink must be
confidential (TLS).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from logging import WARNING

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.common.logger import log

from flower_dp.mechanisms.gau_lrq_codec import (  # the wire format lives in the core; re-exported here
    EXPORT_HINT,
    KEY_DIR_RUN_CONFIG,
    KEY_ENV,
    KEY_FILE_NODE_CONFIG,
    KEYS,
    META_KEY,
    PARTITION_META,
    PAYLOAD_KEY,
    PROBE_KEY,
    PROBE_TAG_META,
    RELEASED_STATS,
    SECRET_RUN_CONFIG,
    ClientKey,
    client_run_key,
    encode_update,
    key_file_name,
    pack_partition_id,
    probe_tag,
    read_key_file,
    spec_from_config,
)
from flower_dp.mechanisms.lrq import lrq_key

__all__ = ["gau_lrq_mod", "make_gau_lrq_mod", "make_lrq_client_app", "load_client_key", "ClientKey", "KEYS",
           "PAYLOAD_KEY", "META_KEY", "KEY_DIR_RUN_CONFIG", "KEY_FILE_NODE_CONFIG", "KEY_ENV", "RELEASED_STATS",
           "PARTITION_META"]

_MOD = "gau_lrq_mod"


def _err(msg: Message, reason: str) -> Message:
    return Message(Error(code=ErrorCode.MOD_FAILED_PRECONDITION, reason=f"{_MOD}: {reason}"), reply_to=msg)


def load_client_key(ctx: Context, *, key: ClientKey | None = None, key_file: str | os.PathLike | None = None,
                    key_dir: str | os.PathLike | None = None) -> ClientKey:
    """This node's own key (partition id from ``ctx.node_config``), from the first source given (module docstring).

    Raises ``ValueError`` naming the sources tried and the fix: no key, a key of another partition, the server's
    master secret, a file others may read.
    """
    pid = int(ctx.node_config["partition-id"])
    if key is not None:
        if not isinstance(key, ClientKey) or key.partition_id != pid:
            got = f"client {key.partition_id}'s key" if isinstance(key, ClientKey) else type(key).__name__
            raise ValueError(f"key must be this client's ClientKey (partition {pid}), got {got}; {EXPORT_HINT}")
        return key
    path = key_file
    if path is None and key_dir is not None:
        path = os.path.join(os.path.expanduser(str(key_dir)), key_file_name(pid))
    if path is None:
        path = ctx.node_config.get(KEY_FILE_NODE_CONFIG) or None
    if path is None and ctx.run_config.get(KEY_DIR_RUN_CONFIG):
        path = os.path.join(os.path.expanduser(str(ctx.run_config[KEY_DIR_RUN_CONFIG])), key_file_name(pid))
    if path is None:
        path = os.environ.get(KEY_ENV) or None
    if path is None:
        master = (f"; run config '{SECRET_RUN_CONFIG}' names the server's master secret, which a client must never "
                  "hold" if ctx.run_config.get(SECRET_RUN_CONFIG) else "")
        raise ValueError(f"no LRQ client key for partition {pid}, got none of: key_file / key_dir, node config "
                         f"'{KEY_FILE_NODE_CONFIG}', run config '{KEY_DIR_RUN_CONFIG}', env {KEY_ENV}{master}; "
                         f"{EXPORT_HINT}")
    return read_key_file(path, pid)


def make_gau_lrq_mod(key_file: str | os.PathLike | None = None, *, key: ClientKey | None = None,
                     key_dir: str | os.PathLike | None = None, debug_metrics: bool = False):
    """A Flower mod ``(msg, ctx, call_next) -> Message`` bound to a key source (see module docstring).

    ``key_file``: this client's key file; ``key``: its :class:`ClientKey`; ``key_dir``: a folder of key files, of
    which each node reads only ``client-<its partition id>.key`` (one ClientApp serving several simulated nodes).
    None of them: the node config, the run config, the environment (module docstring).

    ``debug_metrics=True`` also puts the clean update's statistics (norm, max-abs, clipped flag, bits
    from the clean A) into the reply's MetricRecord as ``gau-lrq.*``: not charged by the accountant.
    """

    def mod(msg: Message, ctx: Context, call_next) -> Message:
        if msg.metadata.message_type != MessageType.TRAIN:
            return call_next(msg, ctx)
        if (len(msg.content.array_records) == 0 and len(msg.content.config_records) == 1
                and PROBE_KEY in next(iter(msg.content.config_records.values()))):
            return _answer_probe(msg, ctx, key, key_file, key_dir)
        if len(msg.content.array_records) != 1 or len(msg.content.config_records) != 1:
            return _err(msg, f"expects exactly one ArrayRecord and one ConfigRecord in the train message, got "
                        f"{len(msg.content.array_records)} and {len(msg.content.config_records)}; use the GauLRQ "
                        "strategy in the ServerApp")
        cfg = next(iter(msg.content.config_records.values()))
        missing = [k for k in (KEYS["method"], KEYS["round"], KEYS["sigma"], KEYS["clip"], KEYS["nonce"]) if k not in cfg]
        if missing:
            return _err(msg, f"requires the keys {missing} in the ConfigRecord, got keys {sorted(cfg.keys())}; "
                        "ensure the `GauLRQ` strategy is used in the ServerApp")
        if "partition-id" not in ctx.node_config:
            return _err(msg, f"requires node_config['partition-id'] (keys the client's stream), got keys "
                        f"{sorted(ctx.node_config)}; set it in the SuperNode's --node-config")
        try:
            spec = spec_from_config(cfg)
            own = load_client_key(ctx, key=key, key_file=key_file, key_dir=key_dir)
            stream = lrq_key(client_run_key(own, str(cfg[KEYS["nonce"]])), spec.round_k, own.partition_id)
        except (ValueError, TypeError, OSError) as exc:
            return _err(msg, f"cannot set up the encoder: {exc}")
        sent = next(iter(msg.content.array_records.values()))
        names = list(sent.keys())
        theta_k = [a.numpy() for a in sent.values()]

        out = call_next(msg, ctx)
        if out.has_error():
            return out
        if len(out.content.array_records) != 1:
            return _err(out, f"expects exactly one ArrayRecord in the ClientApp's reply, got "
                        f"{len(out.content.array_records)}; return the trained weights only")
        rkey, rec = next(iter(out.content.array_records.items()))
        if list(rec.keys()) != names:
            return _err(out, f"expects the reply's ArrayRecord keys to equal the received ones {names[:4]}..., got "
                        f"{list(rec.keys())[:4]}...; return the model under the same keys")
        new = [a.numpy() for a in rec.values()]
        if any(n.shape != o.shape for n, o in zip(new, theta_k)):
            return _err(out, "expects the reply's arrays to have the received shapes, got "
                        f"{[n.shape for n in new]} for {[o.shape for o in theta_k]}")
        delta = np.concatenate([(n.astype(np.float64) - o.astype(np.float64)).ravel() for n, o in zip(new, theta_k)])
        if not np.all(np.isfinite(delta)):
            bad = int((~np.isfinite(delta)).sum())
            if spec.method == "none":  # no privacy claim: say so to the server
                return _err(out, f"the update has {bad} non-finite entries; got a diverged local training (lower "
                            "the learning rate)")
            # An error reply would tell the server (and the published received/dropped counts) that this client's
            # data made training diverge, a release nobody charges.  A zero update is inside the clip ball, so
            # the charged mechanism covers it, and it is distributed exactly like a dropped client the server
            # compensates (noise only).  The client logs it; nothing leaves.
            log(WARNING, "%s: the local update has %d non-finite entries (diverged local training; lower the "
                "learning rate); sending a zero update so that the divergence stays private", _MOD, bad)
            delta = np.zeros_like(delta)
        payload, meta, stats = encode_update(delta, spec, stream)
        del out.content.array_records[rkey]
        out.content[PAYLOAD_KEY] = ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in payload.items()})
        meta[PARTITION_META] = pack_partition_id(own.partition_id)  # fixed width: counted bytes hide the id
        for k, v in stats.items():  # only functions of the sent message (all of them for the clear "none")
            if k in RELEASED_STATS or spec.method == "none":
                meta[f"gau-lrq.{k}"] = float(v)
        out.content[META_KEY] = ConfigRecord(meta)
        if spec.method != "none" and not bool(cfg.get(KEYS["forward_metrics"], False)):
            for name in list(out.content.metric_records):  # the server does not publish them: they stay here
                del out.content[name]
        if debug_metrics and spec.method != "none":  # explicit opt-in: statistics of the clean update, uncharged
            if len(out.content.metric_records) == 0:
                out.content["metrics"] = MetricRecord({})
            mrec = next(iter(out.content.metric_records.values()))
            for k, v in stats.items():
                mrec[f"gau-lrq.{k}"] = float(v)
        return out

    mod.__name__ = _MOD
    return mod


def _answer_probe(msg: Message, ctx: Context, key: ClientKey | None, key_file, key_dir) -> Message:
    """GauLRQ's probe, answered here and never passed to the user's train function: the partition id and a keyed
    hash proving this client holds its own key (an error reply naming the problem otherwise)."""
    if "partition-id" not in ctx.node_config:
        return _err(msg, f"requires node_config['partition-id'] (selects the client's key), got keys "
                    f"{sorted(ctx.node_config)}; set it in the SuperNode's --node-config")
    try:
        own = load_client_key(ctx, key=key, key_file=key_file, key_dir=key_dir)
        rk = client_run_key(own, str(next(iter(msg.content.config_records.values()))[PROBE_KEY]))
    except (ValueError, TypeError, OSError) as exc:
        return _err(msg, f"cannot set up the encoder: {exc}")
    meta = ConfigRecord({PARTITION_META: pack_partition_id(own.partition_id),
                         PROBE_TAG_META: probe_tag(rk, own.partition_id)})
    return Message(content=RecordDict({META_KEY: meta}), reply_to=msg)


#: The mod reading this node's key from the node config, the run config or the environment (module docstring).
gau_lrq_mod = make_gau_lrq_mod()


def make_lrq_client_app(train_fn: Callable[[Message, Context], Message],
                        evaluate_fn: Callable[[Message, Context], Message] | None = None,
                        *, key_file: str | os.PathLike | None = None, key_dir: str | os.PathLike | None = None,
                        debug_metrics: bool = False) -> ClientApp:
    """A ClientApp running the user's unchanged ``train_fn`` (and ``evaluate_fn``) under the Gau-LRQ mod.

    ``train_fn(msg, ctx) -> Message`` is an ordinary Flower train function: it receives the global
    weights (one ArrayRecord) and a ConfigRecord, and replies with the trained weights under the
    same keys plus a MetricRecord (``num-examples``, ...).
    """
    app = ClientApp(mods=[make_gau_lrq_mod(key_file, key_dir=key_dir, debug_metrics=debug_metrics)])
    app.train()(train_fn)
    if evaluate_fn is not None:
        app.evaluate()(evaluate_fn)
    return app
