"""Client side of Gau-LRQ as a Flower mod: the user's training code does not change.

Spec ``shared/specs/gau-lrq.md`` §4 (Alg. 1 client lines), §2.3-2.4 (shared randomness, trust).
The mod wraps ``call_next``: it remembers the weights the server sent, lets the user's ClientApp
train, takes ``Delta = theta_{k,Q} - theta_k`` (flattened in the ArrayRecord's key order), clips it
to S2 (Eq. 10), encodes it with the method the server asked for (LRQ: Eq. 11, stream keyed by
(run secret, round, partition id)) and replaces the reply's weights by the bit-packed integer
message plus its public metadata.  Only :class:`flower_dp.strategies.gau_lrq.GauLRQ` can read it.

What leaves the client (DESIGN.md "Privacy: tell the truth")
-----------------------------------------------------------
The encoded update, its public metadata (in ``META_KEY``: the decoding parameters, the partition id
that keys the stream, and the message's bit count, :data:`RELEASED_STATS`, fixed by the public round spec
and d: every message of a round has the same size), and the user's own reply metrics, untouched.  The mod
adds nothing to the user's MetricRecord: the clean update's norm, max-abs value, clipped flag, the entropy
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
never sees it) with the partition id and :func:`probe_tag`, a keyed hash showing that this client holds the
server's run secret; an error reply if it cannot read the secret.  A ClientApp without the mod passes the
probe to the user's train function, which finds no model in it: the server stops before any weights leave.

Shared secret and trust model (§2.3-2.4)
---------------------------------------
The server is trusted: it holds the run secret and decodes each client's update.  Client and
server share a run secret ``S`` (>= 16 bytes); client ``i``'s stream for round ``k`` is keyed by
``lrq_key(run_key(S, nonce), k, i)`` (SHA-256, domain separated), ``i`` = ``node_config["partition-id"]``
and ``nonce`` a public per-run value chosen by the server (two runs sharing S never reuse a stream).  The
secret is read from, in this order: the ``secret_file`` given to :func:`make_gau_lrq_mod`, the
run config key ``"lrq-secret-file"``, the environment variable ``FLOWER_DP_LRQ_SECRET_FILE``.
Only the *path* ever appears in configs; the file content is never logged, sent or saved.  The file must
exist (the server's GauLRQ creates it when missing) and be readable by its owner only: a file that group or
others may read or write is refused (the reason names the path, its mode and ``chmod 600``).
Anyone holding ``S`` and a message ``m`` learns the clipped update exactly, so the uplink must be
confidential (TLS) and ``S`` must stay between the server and the clients.  In this simulation
set-up every client can derive every other client's key; in a deployment provision one
``client_seed[i]`` per client instead (the same functions work with ``S`` = that seed).
"""

from __future__ import annotations

import os
from logging import WARNING
from collections.abc import Callable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.common.logger import log

from flower_dp.mechanisms.lrq import lrq_key
from flower_dp.mechanisms.gau_lrq_codec import (  # the wire format lives in the core; re-exported here
    KEYS,
    META_KEY,
    PARTITION_META,
    PAYLOAD_KEY,
    PROBE_KEY,
    PROBE_TAG_META,
    RELEASED_STATS,
    SECRET_ENV,
    SECRET_RUN_CONFIG,
    encode_update,
    load_secret,
    probe_tag,
    run_key,
    spec_from_config,
)

__all__ = ["run_key", "gau_lrq_mod", "make_gau_lrq_mod", "make_lrq_client_app", "load_secret", "KEYS",
           "PAYLOAD_KEY", "META_KEY", "SECRET_ENV", "SECRET_RUN_CONFIG", "RELEASED_STATS", "PARTITION_META"]

_MOD = "gau_lrq_mod"


def _err(msg: Message, reason: str) -> Message:
    return Message(Error(code=ErrorCode.MOD_FAILED_PRECONDITION, reason=f"{_MOD}: {reason}"), reply_to=msg)


def make_gau_lrq_mod(secret_file: str | os.PathLike | None = None, *, secret: bytes | None = None,
                     debug_metrics: bool = False):
    """A Flower mod ``(msg, ctx, call_next) -> Message`` bound to a secret source (see module docstring).

    ``debug_metrics=True`` also puts the clean update's statistics (norm, max-abs, clipped flag, bits
    from the clean A) into the reply's MetricRecord as ``gau-lrq.*``: not charged by the accountant.
    """

    def mod(msg: Message, ctx: Context, call_next) -> Message:
        if msg.metadata.message_type != MessageType.TRAIN:
            return call_next(msg, ctx)
        if (len(msg.content.array_records) == 0 and len(msg.content.config_records) == 1
                and PROBE_KEY in next(iter(msg.content.config_records.values()))):
            return _answer_probe(msg, ctx, secret, secret_file)
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
            rk = run_key(load_secret(secret, secret_file, ctx), str(cfg[KEYS["nonce"]]))
            key = lrq_key(rk, spec.round_k, int(ctx.node_config["partition-id"]))
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
        payload, meta, stats = encode_update(delta, spec, key)
        del out.content.array_records[rkey]
        out.content[PAYLOAD_KEY] = ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in payload.items()})
        meta[PARTITION_META] = int(ctx.node_config["partition-id"])
        for k, v in stats.items():  # only functions of the sent message (all of them for the clear "none")
            if k in RELEASED_STATS or spec.method == "none":
                meta[f"gau-lrq.{k}"] = float(v)
        out.content[META_KEY] = ConfigRecord(meta)
        if debug_metrics and spec.method != "none":  # explicit opt-in: statistics of the clean update, uncharged
            if len(out.content.metric_records) == 0:
                out.content["metrics"] = MetricRecord({})
            mrec = next(iter(out.content.metric_records.values()))
            for k, v in stats.items():
                mrec[f"gau-lrq.{k}"] = float(v)
        return out

    mod.__name__ = _MOD
    return mod


def _answer_probe(msg: Message, ctx: Context, secret: bytes | None, secret_file) -> Message:
    """GauLRQ's probe, answered here and never passed to the user's train function: the partition id and a keyed
    hash proving this client holds the run secret (an error reply naming the problem otherwise)."""
    if "partition-id" not in ctx.node_config:
        return _err(msg, f"requires node_config['partition-id'] (keys the client's stream), got keys "
                    f"{sorted(ctx.node_config)}; set it in the SuperNode's --node-config")
    pid = int(ctx.node_config["partition-id"])
    try:
        rk = run_key(load_secret(secret, secret_file, ctx),
                     str(next(iter(msg.content.config_records.values()))[PROBE_KEY]))
    except (ValueError, TypeError, OSError) as exc:
        return _err(msg, f"cannot set up the encoder: {exc}")
    meta = ConfigRecord({PARTITION_META: pid, PROBE_TAG_META: probe_tag(rk, pid)})
    return Message(content=RecordDict({META_KEY: meta}), reply_to=msg)


#: The mod reading the secret from the run config / environment (see module docstring).
gau_lrq_mod = make_gau_lrq_mod()


def make_lrq_client_app(train_fn: Callable[[Message, Context], Message],
                        evaluate_fn: Callable[[Message, Context], Message] | None = None,
                        *, secret_file: str | os.PathLike | None = None, debug_metrics: bool = False) -> ClientApp:
    """A ClientApp running the user's unchanged ``train_fn`` (and ``evaluate_fn``) under the Gau-LRQ mod.

    ``train_fn(msg, ctx) -> Message`` is an ordinary Flower train function: it receives the global
    weights (one ArrayRecord) and a ConfigRecord, and replies with the trained weights under the
    same keys plus a MetricRecord (``num-examples``, ...).
    """
    app = ClientApp(mods=[make_gau_lrq_mod(secret_file, debug_metrics=debug_metrics)])
    app.train()(train_fn)
    if evaluate_fn is not None:
        app.evaluate()(evaluate_fn)
    return app
