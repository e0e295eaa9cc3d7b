"""Gau-LRQ's wire format and update codecs (what a client sends, how the server reads it).

The core half of Gau-LRQ, shared by the client mod (:mod:`flower_dp.clients.lrq_mod`) and the server
strategy (:mod:`flower_dp.strategies.gau_lrq`), which never import each other.  No Flower import:
the keys below name the ConfigRecord / ArrayRecord entries, the functions work on numpy arrays.
The client-level accountant lives in :mod:`flower_dp.privacy.gau_lrq`.

Spec ``shared/specs/gau-lrq.md`` §4 (Alg. 1), §7 (baselines), §12 (bits).  Pure numpy, no Flower:
both :mod:`flower_dp.clients.lrq_mod` (client side) and :mod:`flower_dp.strategies.gau_lrq`
(server side) call these functions, so the two sides cannot drift apart.

=========  ==================  ==================================================================
method     paper name          client sends (per coordinate)                     server decodes
=========  ==================  ==================================================================
"lrq"      Gau-LRQ-SGD         m = floor((Dt + R - x) / w), bit-packed (Eq. 11)  m w + x (Eq. 12)
"gaussian" Gau-SGD             Dt + N(0, sigma^2), float32                       as is
"qg"       QG-SGD (Alg. 2)     Q_b[Dt + N(0, sigma^2)], b-bit grid on [-s, s]    grid value
"bq"       BQ-SGD              t + Binomial(m, 1/2), t = stoch. level of Dt      (t + o - m/2) dq - S2
"none"     Local SGD (oracle)  Delta (no clipping), float32                      as is
=========  ==================  ==================================================================

Randomness: the LRQ layers come from the shared stream keyed by ``lrq_key(secret, round, client)``
(§2.4); the baselines' noise and stochastic rounding come from a private stream derived from the
same key (domain-separated).  The server is trusted (§2.3), so it may know that stream; nobody
else does.  Secrets are never put in a payload, a metadata record or a log line.
"""

from __future__ import annotations

import hashlib
import math
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from flower_dp._checks import check_choice, check_int, check_positive
from flower_dp.errors import DecodeError
from flower_dp.mechanisms import lrq

__all__ = ["METHODS", "PAPER_NAMES", "RoundSpec", "clip_update", "encode_update", "decode_update",
           "pack_ints", "unpack_ints", "bq_levels", "payload_bytes", "public_bits", "lrq_public_range", "KEYS",
           "PAYLOAD_KEY", "META_KEY", "SECRET_ENV", "SECRET_RUN_CONFIG", "RELEASED_STATS", "PARTITION_META",
           "PROBE_KEY", "PROBE_TAG_META", "probe_tag", "load_secret", "read_secret_file", "create_secret_file",
           "secret_path", "run_key",
           "spec_from_config"]

# ---------------------------------------------------------------------------------------------
# Wire format: the record keys both sides use, the run secret and the per-run key
# ---------------------------------------------------------------------------------------------
#: ConfigRecord keys the server sends (public values only).
KEYS = {"method": "gau-lrq.method", "round": "gau-lrq.round", "sigma": "gau-lrq.sigma",
        "clip": "gau-lrq.clip", "bq_bits": "gau-lrq.bq-bits", "layer_dtype": "gau-lrq.layer-dtype",
        "nonce": "gau-lrq.stream-nonce"}
PAYLOAD_KEY = "gau-lrq.payload"  # ArrayRecord in the reply
META_KEY = "gau-lrq.meta"  # ConfigRecord in the reply
SECRET_ENV = "FLOWER_DP_LRQ_SECRET_FILE"
SECRET_RUN_CONFIG = "lrq-secret-file"
#: encode_update stats that are functions of public values only (the round's spec and d): sent in META_KEY as
#: "gau-lrq.<name>"
RELEASED_STATS = ("bits_algorithmic",)
#: META_KEY entry holding the partition id (keys the client's stream; public, not a metric)
PARTITION_META = "gau-lrq.partition-id"
#: ConfigRecord key of the probe: a train message carrying only a ConfigRecord with this key (value: the stream
#: nonce) is answered by ``gau_lrq_mod`` itself, never by the user's train function, with :data:`PROBE_TAG_META`
PROBE_KEY = "gau-lrq.probe"
#: META_KEY entry of the probe's answer: :func:`probe_tag` of the client's run key and partition id
PROBE_TAG_META = "gau-lrq.probe-tag"


def load_secret(secret: bytes | None = None, secret_file: str | os.PathLike | None = None,
                context: Any = None) -> bytes:
    """The run secret (bytes, >= 16), from ``secret``, ``secret_file``, the run config of ``context`` (a Flower
    Context) or the env var.

    The file must exist and be readable by its owner only (:func:`read_secret_file`).  Raises ``ValueError``
    naming the sources tried and the fix (never the content).
    """
    if secret is not None:
        if not isinstance(secret, bytes) or len(secret) < 16:
            raise ValueError(f"secret must be bytes of length >= 16, got {type(secret).__name__} of length "
                             f"{len(secret) if isinstance(secret, (bytes, str)) else '?'}; use secrets.token_bytes(32)")
        return secret
    path = secret_file
    if path is None and context is not None:
        path = context.run_config.get(SECRET_RUN_CONFIG) or None
    if path is None:
        path = os.environ.get(SECRET_ENV) or None
    if path is None:
        raise ValueError(f"no LRQ run secret, got none of: secret_file, run config '{SECRET_RUN_CONFIG}', env "
                         f"{SECRET_ENV}; point one of them at the secret file the server's GauLRQ uses (GauLRQ "
                         "creates it, mode 0600, when its secret_file does not exist yet)")
    return read_secret_file(path)


def secret_path(path: str | os.PathLike) -> Path:
    """``path`` with ``~`` expanded (the form every message about a secret file names)."""
    return Path(os.path.expanduser(str(path)))


def read_secret_file(path: str | os.PathLike) -> bytes:
    """The content of an existing secret file that only its owner can read.

    Raises ``ValueError`` for a missing file (what it is and how to make one), a file that group or others may
    read or write (its mode and ``chmod 600``), or one shorter than 16 bytes.
    """
    p = secret_path(path)
    if not p.is_file():
        raise ValueError(f"the LRQ run secret file {str(p)!r} does not exist, got no file there; it holds the "
                         "secret shared by the server and the clients (>= 16 random bytes): GauLRQ(secret_file=...) "
                         "creates it (mode 0600) when it starts, or make one with python -c \"import os, secrets; "
                         f"fd = os.open({str(p)!r}, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600); "
                         "os.write(fd, secrets.token_bytes(32))\"")
    mode = p.stat().st_mode & 0o777
    if mode & 0o077:
        raise ValueError(f"the LRQ run secret file {str(p)!r} is readable or writable by group or others, got mode "
                         f"{mode:04o}; anyone who reads it can decode every client's update: run chmod 600 "
                         f"{str(p)!r} (mode 0600, owner only)")
    data = p.read_bytes()
    if len(data) < 16:
        raise ValueError(f"the LRQ run secret file {str(p)!r} must hold >= 16 bytes, got {len(data)}; write "
                         "secrets.token_bytes(32) into it")
    return data


def create_secret_file(path: str | os.PathLike) -> tuple[Path, bool]:
    """Create ``path`` (and its folder) holding 32 random bytes, mode 0600, if it does not exist.

    Returns (the expanded path, True if it was created now).  An existing file is left as it is (and checked
    when read).
    """
    p = secret_path(path)
    if p.exists():
        return p, False
    p.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process created it meanwhile
        return p, False
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_bytes(32))
    return p, True


def run_key(secret: bytes, nonce: str) -> bytes:
    """Per-run stream secret: ``SHA-256(secret || nonce)``; the public nonce keeps runs sharing a secret apart."""
    return hashlib.sha256(b"flower_dp.gau_lrq.run\x00" + secret + b"\x00" + str(nonce).encode()).digest()


def probe_tag(run_key_: bytes, partition_id: int) -> str:
    """The probe's answer: a keyed hash proving the client holds the run secret (reveals nothing about it)."""
    return hashlib.sha256(b"flower_dp.gau_lrq.probe\x00" + run_key_ + int(partition_id).to_bytes(8, "little")
                          ).hexdigest()[:32]


def spec_from_config(cfg) -> "RoundSpec":
    """The round's :class:`RoundSpec` from the server's ConfigRecord (a mapping with :data:`KEYS`)."""
    return RoundSpec(method=str(cfg[KEYS["method"]]), round_k=int(cfg[KEYS["round"]]), sigma=float(cfg[KEYS["sigma"]]),
                     clip=float(cfg[KEYS["clip"]]), bq_bits=int(cfg.get(KEYS["bq_bits"], 4)),
                     layer_dtype=str(cfg.get(KEYS["layer_dtype"], "float64")))

METHODS = ("lrq", "gaussian", "qg", "bq", "none")
PAPER_NAMES = {"lrq": "Gau-LRQ-SGD", "gaussian": "Gau-SGD", "qg": "QG-SGD", "bq": "BQ-SGD", "none": "Local SGD"}


@dataclass(frozen=True)
class RoundSpec:
    """The public per-round parameters the server broadcasts (nothing secret).

    Attributes
    ----------
    method : one of :data:`METHODS`
    round_k : int, 0-based round index k (keys the streams)
    sigma : float, per-client per-coordinate noise std (0 for "none")
    clip : float, L2 bound S2 on one client's update (inf for "none")
    bq_bits : int, BQ-SGD's public bit width b (s + m <= 2^b), unused otherwise
    layer_dtype : {"float64", "float32"}, LRQ layer arithmetic (both sides must agree)
    """

    method: str
    round_k: int
    sigma: float
    clip: float
    bq_bits: int = 4
    layer_dtype: str = "float64"

    def __post_init__(self) -> None:
        check_choice("method", self.method, METHODS)
        check_int("round_k", self.round_k, minimum=0)
        if self.method != "none":
            check_positive("sigma", self.sigma, hint="sigma is the per-client noise std of a private method")
            check_positive("clip", self.clip, hint="clip is the L2 bound S2 on a client's update")
        check_int("bq_bits", self.bq_bits, minimum=2, maximum=16)


def clip_update(delta: np.ndarray, clip: float) -> tuple[np.ndarray, float]:
    """Eq. 10: ``Dt = Delta / max(1, ||Delta||_2 / S2)``; returns (Dt float64 (d,), ||Delta||_2)."""
    delta = np.asarray(delta, dtype=np.float64)
    norm = float(np.linalg.norm(delta))
    return (delta * (clip / norm) if norm > clip else delta.copy()), norm


def _private_rng(key: bytes) -> np.random.Generator:
    return np.random.Generator(np.random.Philox(int.from_bytes(hashlib.sha256(b"flower_dp.baseline\x00" + key).digest(), "little")))


def pack_ints(m: np.ndarray, lo: int | None = None, width: int | None = None) -> tuple[np.ndarray, int, int]:
    """Bit-pack a 1-D int vector: ``(packed uint8, lo, width)`` with ``m - lo`` in ``width`` bits each.

    ``lo`` and ``width`` given (public values): the packed size is ``ceil(d width / 8)`` whatever ``m`` holds;
    ``m`` outside ``[lo, lo + 2^width)`` raises ``ValueError``.  Not given: from ``m``'s range (data-dependent).
    """
    m = np.asarray(m)
    if m.size == 0:
        return np.zeros(0, np.uint8), (0 if lo is None else int(lo)), (0 if width is None else int(width))
    if lo is None or width is None:
        lo, hi = int(m.min()), int(m.max())
        width = max(1, (hi - lo).bit_length())
    elif int(m.min()) < lo or int(m.max()) >= lo + (1 << width):
        raise ValueError(f"values must lie in [{lo}, {lo + (1 << width) - 1}] for the public width {width}, got "
                         f"[{int(m.min())}, {int(m.max())}]; the public bound is too small")
    u = (m.astype(np.int64) - lo).astype(np.uint64)
    planes = ((u[:, None] >> np.arange(width, dtype=np.uint64)) & np.uint64(1)).astype(np.uint8)
    return np.packbits(planes.ravel()), lo, width


def unpack_ints(packed: np.ndarray, lo: int, width: int, d: int, dtype: str) -> np.ndarray:
    """Inverse of :func:`pack_ints` (shape (d,), dtype ``dtype``)."""
    if d == 0:
        return np.zeros(0, dtype=dtype)
    bits = np.unpackbits(np.asarray(packed, dtype=np.uint8), count=d * width)
    if bits.size != d * width:
        raise DecodeError(f"packed payload too short: need {d * width} bits, got {bits.size}")
    vals = bits.reshape(d, width).astype(np.int64) @ (1 << np.arange(width, dtype=np.int64))
    return (vals + lo).astype(dtype)


def lrq_public_range(spec: "RoundSpec") -> tuple[int, int]:
    """(lo, width) of an LRQ message from public values only: ``|m| <= L = ceil(S2 / w_min)`` since the clipped
    update has max|Dt| <= ||Dt||_2 <= S2 (spec §3.7 with A = S2); ``width = ceil(log2(2 L + 1))`` bits."""
    L = math.ceil(spec.clip * (1 + 1e-9) / lrq.lrq_w_min(spec.sigma))
    return -L, max(1, (2 * L).bit_length())


def public_bits(spec: "RoundSpec", d: int) -> float:
    """Uplink bits of one client's message, a function of the public round spec and the model size d only."""
    if spec.method in ("none", "gaussian"):
        return 32.0 * d
    if spec.method == "lrq":
        return float(d * lrq_public_range(spec)[1])
    if spec.method == "qg":
        return float(d * lrq_public_range(spec)[1] + 32)  # b as LRQ's (spec §12), + the float32 scale
    s_lv, m_tr = bq_levels(spec.sigma, spec.clip, spec.bq_bits)
    return float(d * math.ceil(math.log2(s_lv + m_tr)))


def bq_levels(sigma: float, clip: float, bits: int) -> tuple[int, int]:
    """BQ-SGD's (s, m) (spec §7.4 DECISION): largest s >= 2 with ``s + m <= 2^b``, ``m = ceil(sigma^2 (s-1)^2 / S2^2)``.

    Noise variance per coordinate ``m dq^2 / 4`` with ``dq = 2 S2 / (s-1)`` is then >= sigma^2
    (a Gaussian approximation of the binomial mechanism, not a rigorous DP proof).
    """
    cap = 1 << check_int("bits", bits, minimum=2)
    best = None
    for s in range(2, cap + 1):
        m = max(2, math.ceil(sigma**2 * (s - 1) ** 2 / clip**2))
        m += m % 2  # even m: m/2 is an integer offset
        if s + m <= cap:
            best = (s, m)
    if best is None:
        raise ValueError(f"bq_bits={bits} too small for sigma/S2={sigma / clip:.4g}: need s + m <= 2^b with s >= 2, "
                         f"got m = {max(2, math.ceil(sigma**2 / clip**2))}; raise bq_bits")
    return best


def encode_update(delta: np.ndarray, spec: RoundSpec, key: bytes) -> tuple[dict, dict, dict]:
    """Client side: clip, privatize and compress one update.

    Parameters
    ----------
    delta : ndarray, shape (d,)
        Raw update ``theta_{k,Q} - theta_k`` flattened in the ArrayRecord's key order.
    spec : RoundSpec
    key : bytes
        ``lrq_key(secret, k, client)`` (secret; never sent).

    Returns
    -------
    payload : dict[str, ndarray]   arrays to send
    meta : dict[str, int | float | str]   public metadata to send (includes the LRQ integrity tag)
    stats : dict[str, float]   metrics: norm before clipping, clipped flag, A = ||Dt||_inf, bits.
        Only ``bits_algorithmic`` (:func:`public_bits`: every message of a round has the same size, fixed by
        the public spec and d) is public; the others (LRQ's ``bits_entropy`` of the sent integers, and
        ``bits_paper`` / ``bits_fixed`` from the clean A) are statistics of private data that
        :mod:`flower_dp.clients.lrq_mod` keeps on the client unless ``debug_metrics``.
    """
    d = int(np.asarray(delta).size)
    if spec.method == "none":
        u = np.asarray(delta, dtype=np.float64)
        st = {"norm": float(np.linalg.norm(u)), "clipped": 0.0, "linf": float(np.abs(u).max(initial=0.0)),
              "bits_algorithmic": 32.0 * d}
        return {"u": u.astype(np.float32)}, {"d": d}, st
    dt, norm = clip_update(delta, spec.clip)
    A = float(np.abs(dt).max(initial=0.0))
    st = {"norm": norm, "clipped": float(norm > spec.clip), "linf": A}
    if spec.method == "lrq":
        msg = lrq.encode(dt, spec.sigma, key, dtype=spec.layer_dtype, bound=spec.clip * (1 + 1e-9))
        lo, width = lrq_public_range(spec)
        packed, lo, width = pack_ints(msg.m, lo, width)
        st.update(bits_paper=d * lrq.lrq_bits_paper(A, spec.sigma), bits_fixed=float(lrq.lrq_message_bits(d, A, spec.sigma)),
                  bits_entropy=d * lrq.empirical_entropy(msg.m), bits_algorithmic=public_bits(spec, d))
        meta = {"d": d, "sigma": msg.sigma, "layer_dtype": msg.dtype, "chunk_size": msg.chunk_size,
                "tag": msg.tag.hex(), "lo": lo, "width": width, "m_dtype": str(msg.m.dtype)}
        return {"m": packed}, meta, st
    rng = _private_rng(key)
    if spec.method == "gaussian":
        v = dt + spec.sigma * rng.standard_normal(d)
        st["bits_algorithmic"] = public_bits(spec, d)
        return {"u": v.astype(np.float32)}, {"d": d}, st
    if spec.method == "qg":  # Alg. 2: noise first, then a b-bit unbiased stochastic grid on [-s, s]
        v = dt + spec.sigma * rng.standard_normal(d)
        s = float(np.float32(np.abs(v).max(initial=0.0))) or 1.0
        # b is LRQ's public width (spec §12: "b the same as LRQ"), a function of sigma and S2 only, so the
        # message size says nothing about the update; the scale s (the noised range) goes to the trusted server
        b = lrq_public_range(spec)[1]
        levels = (1 << b) - 1
        pos = (v + s) / (2 * s) * levels
        t = np.clip(np.floor(pos + rng.random(d)), 0, levels).astype(np.int64)
        packed, lo, width = pack_ints(t, 0, b)
        st["bits_algorithmic"] = public_bits(spec, d)
        return {"t": packed}, {"d": d, "scale": s, "b": b, "lo": lo, "width": width}, st
    s_lv, m_tr = bq_levels(spec.sigma, spec.clip, spec.bq_bits)
    dq = 2 * spec.clip / (s_lv - 1)
    pos = (dt + spec.clip) / dq
    t = np.clip(np.floor(pos + rng.random(d)), 0, s_lv - 1).astype(np.int64)
    t += rng.binomial(m_tr, 0.5, size=d)
    packed, lo, width = pack_ints(t, 0, math.ceil(math.log2(s_lv + m_tr)))
    st["bits_algorithmic"] = public_bits(spec, d)
    return {"t": packed}, {"d": d, "s": s_lv, "m": m_tr, "lo": lo, "width": width}, st


def decode_update(payload: dict, meta: dict, spec: RoundSpec, key: bytes) -> np.ndarray:
    """Server side: the decoded update ``hat_D`` (float64, shape (d,)) of one client.

    Raises
    ------
    DecodeError
        Malformed payload; for "lrq" also a wrong key (round, client or secret) or a tampered
        message (the keyed integrity tag fails), or a sigma differing from this round's.
    """
    try:
        d = int(meta["d"])
        if spec.method in ("none", "gaussian"):
            u = np.asarray(payload["u"], dtype=np.float64)
            if u.shape != (d,):
                raise DecodeError(f"payload 'u' must have shape ({d},), got {u.shape}")
            return u
        if spec.method == "lrq":
            m = unpack_ints(payload["m"], int(meta["lo"]), int(meta["width"]), d, str(meta["m_dtype"]))
            msg = lrq.LRQMessage(m=m, d=d, sigma=float(meta["sigma"]), dtype=str(meta["layer_dtype"]),
                                 chunk_size=int(meta["chunk_size"]), tag=bytes.fromhex(str(meta["tag"])))
            return lrq.decode(msg, spec.sigma, key)
        t = unpack_ints(payload["t"], int(meta["lo"]), int(meta["width"]), d, "int64").astype(np.float64)
        if spec.method == "qg":
            s, levels = float(meta["scale"]), (1 << int(meta["b"])) - 1
            return -s + 2 * s * t / levels
        s_lv, m_tr = int(meta["s"]), int(meta["m"])
        return (t - m_tr / 2) * (2 * spec.clip / (s_lv - 1)) - spec.clip
    except DecodeError:
        raise
    except (KeyError, ValueError, TypeError) as exc:
        raise DecodeError(f"malformed {spec.method!r} update, got payload keys {sorted(payload)} and meta keys "
                          f"{sorted(meta)}: {exc}") from exc


def payload_bytes(arrays) -> int:
    """Bytes Flower really carries for a payload: sum of the serialized ``Array.data`` lengths."""
    return int(sum(len(a.data) for a in arrays))
