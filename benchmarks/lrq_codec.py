"""LRQ codec cost and bytes on the wire (Gau-LRQ, Sec. IV).

Codec ratio: ``encode + decode`` of ``d`` coordinates divided by drawing the same shared
random numbers alone, once (one side: per 2^20-coordinate Philox chunk all of z ~ N(0,1), then
all of v = 1 - U[0,1), into preallocated buffers: the cheapest way to draw them).  Both sides
draw, so a codec that did nothing but draw would score 2.0.  The headline input is a clipped
update (unit L2 norm, d = 1e7, sigma = 0.5: |u| << sigma, the Gau-LRQ regime, almost every
m = 0); ``ratio_dense`` is the worst case, |u| ~ 3 sigma, where every coordinate needs the
layer arithmetic.  The codec runs as the package runs it when numba is installed: the fused
kernels (``FLOWER_DP_LRQ_KERNEL=numba``, issue 16; ``kernel`` says which ran); the pure-numpy path is
timed beside it in the same interleaved loop (``*_numpy``), and the two give the same bits
(checked here on the benchmark's own inputs: ``same_output``).

Wire ratio: one Gau-LRQ round run through the real code path -- ``GauLRQ.configure_train``
(LeNet weights, d = 61,706; N = 1920, B = 80, eps = 3 as in the paper's MNIST run) -> the client
mod ``flower_dp.clients.lrq_mod`` around a training function -> ``GauLRQ.aggregate_train`` --
and the bytes of each client's reply ``Message`` as Flower's transport ships it (all its
content-addressed objects, each deflated, as ``push_objects`` sends them; the one-shot protobuf
``message_to_proto`` size is reported beside it), summed over the round, divided by the algorithmic
bits / 8 (``d * ceil(log2 levels) + 32`` per client, :func:`lrq_message_bits`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from ._common import interleaved_times, missing

__all__ = ["run_codec", "run_wire"]


def _draw_only(d: int, chunk: int, seed: int, bufs: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """Draw what one side of the codec draws (z then v per chunk); into ``bufs`` if given."""
    entropy = int.from_bytes(hashlib.sha256(seed.to_bytes(8, "little")).digest(), "little")
    for c, start in enumerate(range(0, d, chunk)):
        n = min(chunk, d - start)
        gen = np.random.Generator(np.random.Philox(np.random.SeedSequence(entropy, spawn_key=(c,))))
        if bufs is None:
            gen.standard_normal(n)
            v = gen.random(n)
        else:
            gen.standard_normal(out=bufs[0][:n])
            v = bufs[1][:n]
            gen.random(out=v)
        np.subtract(1.0, v, out=v)


@contextlib.contextmanager
def _kernel(name: str):
    """Run the LRQ codec with ``FLOWER_DP_LRQ_KERNEL=name`` (restored afterwards)."""
    from flower_dp.mechanisms.lrq import KERNEL_ENV

    old = os.environ.get(KERNEL_ENV)
    os.environ[KERNEL_ENV] = name
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(KERNEL_ENV, None)
        else:
            os.environ[KERNEL_ENV] = old


def run_codec(quick: bool = False, *, d: int | None = None) -> dict:
    """Time encode+decode of ``d`` coordinates (1e7; 1e5 quick) against the random draws alone.

    The fused kernels (numba) and the numpy path run in one interleaved loop with the draws.
    ``ratio`` (the headline ``lrq_codec_ratio``) uses the minimum over the repeats (the least
    disturbed run on a shared machine), ``median_ratio`` the medians; the same for ``*_numpy``
    and ``*_dense``; ``cpu_*`` the same of each call's thread CPU time.
    """
    try:
        from flower_dp.mechanisms import lrq
    except ImportError as exc:
        return missing("flower_dp.mechanisms.lrq", exc)
    try:
        with _kernel("numba"):
            lrq._kernels(d or 1)  # imports numba and the kernels, or raises ImportError
        fused = "numba"
    except ImportError:
        fused = "numpy"  # numba is not installed: both figures are the numpy path's
    d = d if d is not None else (100_000 if quick else 10_000_000)
    sigma, clip = 0.5, 1.0
    rng = np.random.default_rng(0)
    u = rng.standard_normal(d)
    u *= clip / np.linalg.norm(u)  # a clipped update
    u_dense = rng.normal(0.0, 3.0 * sigma, d)  # worst case: m != 0 almost everywhere
    key = lrq.lrq_key(b"bench", 0, 0)
    chunk = lrq.DEFAULT_CHUNK
    bufs = (np.empty(min(chunk, d)), np.empty(min(chunk, d)))
    res = {}

    def codec(x, name, kernel):
        def run():
            with _kernel(kernel):
                msg = lrq.encode(x, sigma, key)
                res[name] = (msg, lrq.decode(msg, sigma, key))
        return run

    with _kernel(fused):  # the first call imports numba and loads (or compiles) the kernels: not timed
        lrq.decode(lrq.encode(u[:1000], sigma, key), sigma, key)
    fns = {
        "draw": lambda: _draw_only(d, chunk, 1, bufs),
        "draw_alloc": lambda: _draw_only(d, chunk, 1),
        "codec": codec(u, "sparse", fused),
        "codec_numpy": codec(u, "sparse_numpy", "numpy"),
        "codec_dense": codec(u_dense, "dense", fused),
        "codec_dense_numpy": codec(u_dense, "dense_numpy", "numpy"),
    }
    # beside the wall time, each call's CPU time in this thread: on a loaded machine it moves far less
    cpu: dict[str, list[float]] = {k: [] for k in fns}

    def cpu_timed(name, fn):
        def run():
            c0 = time.thread_time()
            fn()
            cpu[name].append(time.thread_time() - c0)
        return run

    warmup = 1
    times = interleaved_times({k: cpu_timed(k, f) for k, f in fns.items()}, repeats=2 if quick else 7,
                              warmup=warmup, shuffle_seed=0)
    cpu = {k: v[warmup:] for k, v in cpu.items()}
    best = {k: min(v) for k, v in times.items()}
    med = {k: float(np.median(v)) for k, v in times.items()}
    cpu_best = {k: min(v) for k, v in cpu.items()}
    cpu_med = {k: float(np.median(v)) for k, v in cpu.items()}
    msg, out = res["sparse"]
    msg_d, out_d = res["dense"]
    same = all(a[0].m.dtype == b[0].m.dtype and np.array_equal(a[0].m, b[0].m) and a[0].tag == b[0].tag
               and np.array_equal(a[1].view(np.uint64), b[1].view(np.uint64))
               for a, b in ((res["sparse"], res["sparse_numpy"]), (res["dense"], res["dense_numpy"])))
    err = out - u
    # where the codec's time goes, one side at a time (same input; minimum of 2, interleaved)
    sides = {}
    for kernel, tail in ((fused, ""), ("numpy", "_numpy")):
        for side, fn in (("encode_s", lambda: lrq.encode(u, sigma, key)), ("decode_s", lambda: lrq.decode(msg, sigma, key))):
            sides[side + tail] = _codec_side(fn, kernel)
    parts = {k: round(min(v), 4) for k, v in
             interleaved_times(sides, repeats=1 if quick else 2, warmup=0, shuffle_seed=1).items()}

    def ratio(name, how):
        return round(how[name] / how["draw"], 3)

    return {
        "d": d,
        "sigma": sigma,
        "kernel": fused,
        "encode_decode_s": round(best["codec"], 4),
        "draw_only_s": round(best["draw"], 4),
        "ratio": ratio("codec", best),
        "median_ratio": ratio("codec", med),
        "encode_decode_numpy_s": round(best["codec_numpy"], 4),
        "ratio_numpy": ratio("codec_numpy", best),
        "median_ratio_numpy": ratio("codec_numpy", med),
        **parts,
        "nonzero_fraction": round(float(np.count_nonzero(msg.m)) / d, 6),
        "draw_alloc_s": round(best["draw_alloc"], 4),
        "encode_decode_dense_s": round(best["codec_dense"], 4),
        "ratio_dense": ratio("codec_dense", best),
        "median_ratio_dense": ratio("codec_dense", med),
        "ratio_dense_numpy": ratio("codec_dense_numpy", best),
        "median_ratio_dense_numpy": ratio("codec_dense_numpy", med),
        "nonzero_fraction_dense": round(float(np.count_nonzero(msg_d.m)) / d, 4),
        # the same ratios of thread CPU time (min / median): what the codec costs when not descheduled
        "cpu_ratio": ratio("codec", cpu_best),
        "cpu_median_ratio": ratio("codec", cpu_med),
        "cpu_ratio_numpy": ratio("codec_numpy", cpu_best),
        "cpu_median_ratio_numpy": ratio("codec_numpy", cpu_med),
        "cpu_ratio_dense": ratio("codec_dense", cpu_best),
        "cpu_median_ratio_dense": ratio("codec_dense", cpu_med),
        "cpu_ratio_dense_numpy": ratio("codec_dense_numpy", cpu_best),
        "cpu_median_ratio_dense_numpy": ratio("codec_dense_numpy", cpu_med),
        "draw_only_cpu_s": round(cpu_best["draw"], 4),
        "same_output": bool(same),  # fused == numpy: m, tag and decoded bits, both inputs
        "error_std_over_sigma": round(float(err.std()) / sigma, 4),  # sanity: ~1 (exactly Gaussian error)
        "error_std_over_sigma_dense": round(float((out_d - u_dense).std()) / sigma, 4),
        "repeats": len(times["codec"]),
        "load_avg": _loadavg(),
    }


def _codec_side(fn, kernel: str):
    """``fn`` run under ``FLOWER_DP_LRQ_KERNEL=kernel``."""
    def run():
        with _kernel(kernel):
            fn()
    return run


def _loadavg() -> list[float] | None:
    """The 1/5/15-minute load averages at the end of the measurement (None where unknown)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _lrq_round(N: int, B: int, d_model: str = "lenet"):
    """One Gau-LRQ round in this process through the real strategy and client mod.

    Returns (strategy, train messages, replies).  Each client's training moves every weight by
    0.01 N(0, 1) (the update is then clipped to S2 = 1 by the mod, as in Alg. 1).
    """
    from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

    from flower_dp.clients.lrq_mod import make_gau_lrq_mod
    from flower_dp.models import build_model
    from flower_dp.strategies.gau_lrq import GauLRQ

    secret = b"flower-dp-benchmark-secret-0001"
    key_home = tempfile.mkdtemp(prefix="flower-dp-bench-keys-")  # one key file per client (0600, folder 0700)
    key_dir = str(Path(key_home) / "keys")

    def train(msg: Message, ctx: Context) -> Message:
        rng = np.random.default_rng(int(ctx.node_config["partition-id"]))
        arrays = msg.content["arrays"]
        new = {k: a.numpy() + 0.01 * rng.standard_normal(a.numpy().shape).astype(np.float32) for k, a in arrays.items()}
        return Message(RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in new.items()}),
                                   "metrics": MetricRecord({"num-examples": 500})}), reply_to=msg)

    def context(m: Message) -> Context:
        return Context(run_id=1, node_id=m.metadata.dst_node_id, node_config={"partition-id": m.metadata.dst_node_id - 100},
                       state=RecordDict(), run_config={})

    class _Grid:  # node ids (partition id = node id - 100), and GauLRQ's probe of the mod, answered by the mod
        def get_node_ids(self):
            return list(range(100, 100 + N))

        def send_and_receive(self, messages, timeout=None):
            probe_mod = make_gau_lrq_mod(key_dir=key_dir)
            return [probe_mod(m, context(m), train) for m in messages]

    strategy = GauLRQ(num_clients=N, clients_per_round=B, clip=1.0, num_rounds=30, epsilon=3.0, delta=1e-5,
                      secret=secret, stream_nonce="bench", key_dir=key_dir)
    model = build_model(d_model)
    arrays = ArrayRecord({k: Array(v.detach().numpy().copy()) for k, v in model.state_dict().items()})
    msgs = list(strategy.configure_train(1, arrays, ConfigRecord(), _Grid()))
    mod = make_gau_lrq_mod(key_dir=key_dir, debug_metrics=True)  # bits_fixed: a local measurement, never released
    replies = []
    for m in msgs:
        replies.append(mod(m, context(m), train))
    strategy.aggregate_train(1, replies)
    shutil.rmtree(key_home, ignore_errors=True)
    return strategy, msgs, replies


def run_wire(quick: bool = False) -> dict:
    """Bytes Flower carries for one Gau-LRQ round's uploads (LeNet, d = 61,706) / algorithmic bits / 8."""
    try:
        from flwr.common.serde import message_to_proto
        from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
        from flwr.supercore.task_identity import TaskIdentity

        from flower_dp.clients.lrq_mod import META_KEY, PAYLOAD_KEY
        from flower_dp.mechanisms.gau_lrq_codec import payload_bytes
    except ImportError as exc:
        return missing("flwr serde / flower_dp.strategies.gau_lrq / flower_dp.clients.lrq_mod", exc)
    N, B = (40, 4) if quick else (1920, 80)
    # Messages need a run id outside a running Flower app; set one for this measurement only
    saved = (TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id)
    try:
        TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
        t0 = time.perf_counter()
        strategy, msgs, replies = _lrq_round(N, B)
        round_s = time.perf_counter() - t0
        errors = [r.error.reason for r in replies if r.has_error()]
        if errors:
            return {"value": None, "note": f"failed: the mod replied with errors: {errors[:2]}"}
        # Flower's transport ships a message as its content-addressed objects (Message, RecordDict,
        # records, arrays, array chunks), each deflated to bytes (flwr push_objects)
        by_type: dict[str, int] = {}
        for r in replies:
            for o in get_all_nested_objects(r).values():
                by_type[type(o).__name__] = by_type.get(type(o).__name__, 0) + len(o.deflate())
        wire = sum(by_type.values())
        proto = sum(message_to_proto(r).ByteSize() for r in replies)
        payload = sum(payload_bytes(r.content[PAYLOAD_KEY].values()) for r in replies)
        metrics = [next(iter(r.content.metric_records.values())) for r in replies]
        bits_fixed = sum(float(mr["gau-lrq.bits_fixed"]) for mr in metrics)
        bits_packed = sum(float(mr["gau-lrq.bits_algorithmic"]) for mr in metrics)
        bits_paper = sum(float(mr["gau-lrq.bits_paper"]) for mr in metrics)
        bits_entropy = sum(float(mr["gau-lrq.bits_entropy"]) for mr in metrics)
        meta = dict(replies[0].content[META_KEY])
        rnd = strategy.rounds[-1]
        downlink = sum(len(o.deflate()) for o in get_all_nested_objects(msgs[0]).values())
    finally:
        TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id = saved
    d = int(meta["d"])
    return {
        "d": d,
        "clients": len(replies),
        "N": N,
        "sigma": float(meta["sigma"]),
        "packed_width_bits": int(meta["width"]),
        "wire_bytes": wire,
        "wire_bytes_per_client": round(wire / len(replies), 1),
        "wire_bytes_per_client_by_object": {k: round(v / len(replies), 1) for k, v in sorted(by_type.items())},
        "message_proto_bytes": proto,
        "payload_bytes": payload,
        "strategy_bytes_carried": rnd.get("bytes_carried"),
        "algorithmic_bytes": bits_fixed / 8,
        "ratio": round(wire / (bits_fixed / 8), 4),
        "ratio_vs_packed_width": round(wire / (bits_packed / 8), 4),
        "paper_bits_per_coordinate": round(bits_paper / (d * len(replies)), 4),
        "entropy_bits_per_coordinate": round(bits_entropy / (d * len(replies)), 4),
        "downlink_bytes_per_client": downlink,
        "round_s": round(round_s, 2),
        "note": "replies of GauLRQ.configure_train -> lrq_mod -> (aggregate_train decodes them), as Flower ships them "
                "(sum of deflated nested objects); algorithmic = fixed-length bits d*ceil(log2 levels)+32",
        "quick": bool(quick),
    }
