"""LRQ codec cost and bytes on the wire (Gau-LRQ, gau-lrq.md 3 and 12).

Codec ratio: ``encode + decode`` of ``d`` coordinates divided by drawing the same shared
random numbers alone (one side: z ~ N(0,1) then v ~ U(0,1], per 2^20-coordinate Philox
chunk, as :mod:`flower_dp.mechanisms.lrq` draws them).  Both sides draw, so a codec that
did nothing but draw would score 2.0.

Wire ratio: bytes of one client's LRQ upload serialised as a Flower ``RecordDict`` protobuf
(what the Message API ships) divided by the algorithmic bits / 8
(:func:`lrq_message_bits`: ``d * ceil(log2 levels) + 32``).
"""

from __future__ import annotations

import hashlib
import time

import numpy as np

from ._common import interleaved_medians, missing

__all__ = ["run_codec", "run_wire"]


def _draw_only(d: int, chunk: int, seed: int) -> None:
    entropy = int.from_bytes(hashlib.sha256(seed.to_bytes(8, "little")).digest(), "little")
    for c, start in enumerate(range(0, d, chunk)):
        n = min(chunk, d - start)
        gen = np.random.Generator(np.random.Philox(np.random.SeedSequence(entropy, spawn_key=(c,))))
        gen.standard_normal(n)
        v = gen.random(n)
        np.subtract(1.0, v, out=v)


def run_codec(quick: bool = False, *, d: int | None = None) -> dict:
    """Time encode+decode of ``d`` coordinates (1e7; 1e5 quick) against the random draws alone."""
    try:
        from flower_dp.mechanisms import lrq
    except ImportError as exc:
        return missing("flower_dp.mechanisms.lrq", exc)
    d = d if d is not None else (100_000 if quick else 10_000_000)
    sigma, clip = 0.5, 1.0
    u = np.random.default_rng(0).standard_normal(d)
    u *= clip / np.linalg.norm(u)  # a clipped update
    key = lrq.lrq_key(b"bench", 0, 0)
    res = {}

    def codec():
        msg = lrq.encode(u, sigma, key)
        res["out"] = lrq.decode(msg, sigma, key)

    med = interleaved_medians({"codec": codec, "draw": lambda: _draw_only(d, lrq.DEFAULT_CHUNK, 1)},
                              repeats=3 if not quick else 2, warmup=1)
    err = res["out"] - u
    return {
        "d": d,
        "sigma": sigma,
        "encode_decode_s": round(med["codec"], 4),
        "draw_only_s": round(med["draw"], 4),
        "ratio": round(med["codec"] / med["draw"], 3),
        "error_std_over_sigma": round(float(err.std()) / sigma, 4),  # sanity: ~1 (exactly Gaussian error)
    }


def run_wire(quick: bool = False, *, d: int = 61_706) -> dict:
    """Bytes of one LRQ upload (LeNet-sized, d = 61,706) as a Flower record vs algorithmic bits / 8."""
    try:
        from flower_dp.mechanisms import lrq
    except ImportError as exc:
        return missing("flower_dp.mechanisms.lrq", exc)
    try:
        from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
        from flwr.common.serde import recorddict_to_proto
    except ImportError as exc:
        return missing("flwr.app / flwr.common.serde", exc)
    sigma = 0.05
    u = np.random.default_rng(1).standard_normal(d)
    u *= 1.0 / np.linalg.norm(u)
    A = float(np.abs(u).max())
    msg = lrq.encode(u, sigma, lrq.lrq_key(b"bench", 0, 0))
    rec = msg.to_record()
    record = RecordDict({
        "lrq": ArrayRecord({"m": Array(np.ascontiguousarray(rec["m"]))}),
        "lrq_meta": ConfigRecord({k: v for k, v in rec.items() if k != "m"}),
    })
    wire = recorddict_to_proto(record).ByteSize()
    bits = lrq.lrq_message_bits(d, A, sigma)
    strategy = None
    try:  # the Gau-LRQ strategy, if it exists, may pack differently; report whether it was used
        import flower_dp.strategies.gau_lrq  # noqa: F401

        strategy = "flower_dp.strategies.gau_lrq exists; this figure packs LRQMessage.to_record() directly"
    except ImportError:
        strategy = "flower_dp.strategies.gau_lrq missing; packed LRQMessage.to_record() as a RecordDict"
    return {
        "d": d,
        "sigma": sigma,
        "A": A,
        "levels": lrq.lrq_levels(A, sigma),
        "bits_per_coordinate_fixed": lrq.lrq_bits_fixed(A, sigma),
        "m_dtype": str(msg.m.dtype),
        "wire_bytes": wire,
        "algorithmic_bytes": bits / 8,
        "ratio": round(wire / (bits / 8), 3),
        "entropy_bits_per_coordinate": round(lrq.empirical_entropy(msg.m), 3),
        "note": strategy,
        "quick": bool(quick),
    }
