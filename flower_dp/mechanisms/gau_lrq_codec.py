"""Gau-LRQ's wire format and update codecs (what a client sends, how the server reads it).

The core half of Gau-LRQ, shared by the client mod (:mod:`flower_dp.clients.lrq_mod`) and the server
strategy (:mod:`flower_dp.strategies.gau_lrq`), which never import each other.  No Flower import:
the keys below name the ConfigRecord / ArrayRecord entries, the functions work on numpy arrays.
The client-level accountant lives in :mod:`flower_dp.privacy.gau_lrq`.

Gau-LRQ (arXiv:2312.07060): Alg. 1, the baselines of Sec. VII, the bits a message costs.  Pure numpy, no Flower:
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

Keys and randomness.  The server holds a master secret; client ``i``'s key is ``HMAC(master, "client-key" || i)``
(:func:`client_key`, exported to that client alone as a key file, :func:`write_client_keys`), and its stream key of
a run is ``HMAC(key_i, "client-run" || nonce || i)`` (:func:`client_run_key`, the nonce public and fresh per run).
Everything client ``i`` draws comes from that stream key: the LRQ layers and dither through
``lrq_key(client_run_key, round, i)`` (§2.4), the baselines' noise and stochastic rounding through a
domain-separated hash of the same key.  The B-of-N sample and the server's own noise come from
``HMAC(master, "server-run" || nonce)`` (:func:`server_run_key`), which no client key reveals.  The server can
derive every key, so it sees each clipped update (up to the LRQ layer's width, or exactly for Gau-SGD): Gau-LRQ
gives no DP against the server.  Keys are never put in a payload, a metadata record or a log line.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from flower_dp._checks import check_choice, check_int, check_positive
from flower_dp.errors import DecodeError
from flower_dp.mechanisms import lrq

__all__ = ["METHODS", "PAPER_NAMES", "RoundSpec", "clip_update", "encode_update", "decode_update",
           "pack_ints", "unpack_ints", "bq_levels", "payload_bytes", "public_bits", "lrq_public_range", "KEYS",
           "PAYLOAD_KEY", "META_KEY", "SECRET_RUN_CONFIG", "KEY_DIR_RUN_CONFIG", "KEY_FILE_NODE_CONFIG", "KEY_ENV",
           "RELEASED_STATS", "PARTITION_META", "PARTITION_BYTES", "pack_partition_id", "unpack_partition_id",
           "PROBE_KEY", "PROBE_TAG_META", "probe_tag", "KEY_HEADER", "EXPORT_HINT", "ClientKey", "client_key",
           "client_run_key", "server_run_key", "run_key_check", "load_secret", "read_secret_file",
           "create_secret_file", "secret_path", "key_file_name", "key_file_bytes", "write_key_file",
           "write_client_keys", "read_key_file", "spec_from_config"]

# ---------------------------------------------------------------------------------------------
# Wire format: the record keys both sides use
# ---------------------------------------------------------------------------------------------
#: ConfigRecord keys the server sends (public values only).
KEYS = {"method": "gau-lrq.method", "round": "gau-lrq.round", "sigma": "gau-lrq.sigma",
        "clip": "gau-lrq.clip", "bq_bits": "gau-lrq.bq-bits", "layer_dtype": "gau-lrq.layer-dtype",
        "nonce": "gau-lrq.stream-nonce",
        # whether the server publishes the clients' own train metrics (a train_metrics_aggr_fn): only then does
        # the mod forward them, so a reply's size depends on nothing of the client's otherwise
        "forward_metrics": "gau-lrq.forward-metrics"}
PAYLOAD_KEY = "gau-lrq.payload"  # ArrayRecord in the reply
META_KEY = "gau-lrq.meta"  # ConfigRecord in the reply
#: run config key naming the server's master secret file (read by the ServerApp only, never by a client)
SECRET_RUN_CONFIG = "lrq-secret-file"
#: run config key naming a folder of client key files (``client-<partition id>.key``); each mod reads its own
KEY_DIR_RUN_CONFIG = "lrq-key-dir"
#: node config key naming this SuperNode's own key file (deployment: ``--node-config "lrq-key-file='...'"``)
KEY_FILE_NODE_CONFIG = "lrq-key-file"
#: environment variable naming this client's key file (the mod's last resort)
KEY_ENV = "FLOWER_DP_LRQ_KEY_FILE"
#: encode_update stats that are functions of public values only (the round's spec and d): sent in META_KEY as
#: "gau-lrq.<name>"
RELEASED_STATS = ("bits_algorithmic",)
#: META_KEY entry holding the partition id (selects the client's key on the server; public, not a metric), as
#: :data:`PARTITION_BYTES` big-endian bytes: a fixed width, so no byte count depends on which clients were sampled
PARTITION_META = "gau-lrq.partition-id"
PARTITION_BYTES = 8
#: ConfigRecord key of the probe: a train message carrying only a ConfigRecord with this key (value: the stream
#: nonce) is answered by ``gau_lrq_mod`` itself, never by the user's train function, with :data:`PROBE_TAG_META`
PROBE_KEY = "gau-lrq.probe"
#: META_KEY entry of the probe's answer: :func:`probe_tag` of the client's run key and partition id
PROBE_TAG_META = "gau-lrq.probe-tag"


def pack_partition_id(partition_id: int) -> bytes:
    """The partition id as it travels in :data:`META_KEY`: :data:`PARTITION_BYTES` big-endian bytes (fixed width)."""
    return int(check_int("partition_id", partition_id, minimum=0)).to_bytes(PARTITION_BYTES, "big")


def unpack_partition_id(value: Any) -> int:
    """Inverse of :func:`pack_partition_id`; raises ``DecodeError`` for anything else."""
    if not isinstance(value, bytes) or len(value) != PARTITION_BYTES:
        raise DecodeError(f"the partition id must travel as {PARTITION_BYTES} bytes (pack_partition_id), got "
                          f"{type(value).__name__} {value!r:.40}; client and server must run the same flower-dp")
    return int.from_bytes(value, "big")


# ---------------------------------------------------------------------------------------------
# Keys: the server's master secret, one key per client, the server's own stream
# ---------------------------------------------------------------------------------------------
#: first line of a client key file (a master secret file is raw bytes and has no header)
KEY_HEADER = "flower-dp gau-lrq client key v1"
#: the fix every refusal of a misplaced master secret names
EXPORT_HINT = ("give each client only its own key: flower-dp lrq-keys --secret-file SECRET --num-clients N --out DIR "
               "writes DIR/client-<i>.key (0600); a SuperNode reads its own file (--node-config "
               f"\"{KEY_FILE_NODE_CONFIG}='DIR/client-<i>.key'\"), a simulation gets the folder through "
               f"GauLRQ(key_dir=DIR) and run config '{KEY_DIR_RUN_CONFIG}'")


@dataclass(frozen=True)
class ClientKey:
    """Client ``partition_id``'s own key: ``key = HMAC-SHA256(master, "client-key" || partition_id)``.

    Only that client and the server (who derives it from the master secret) hold it.  It keys every random draw of
    the client (LRQ layers and dither, Gau-SGD/QG-SGD noise, BQ-SGD rounding) through :func:`client_run_key`; it
    reveals neither the master secret, nor another client's key, nor the server's stream (HMAC is a PRF).
    """

    partition_id: int
    key: bytes = field(repr=False)

    def __post_init__(self) -> None:
        check_int("partition_id", self.partition_id, minimum=0)
        if not isinstance(self.key, bytes) or len(self.key) < 16:
            raise ValueError(f"a client key must be bytes of length >= 16, got {type(self.key).__name__}; derive it "
                             "with client_key(master, partition_id)")


def _hmac(key: bytes, label: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"flower_dp.gau_lrq." + label + b"\x00" + b"\x00".join(parts), hashlib.sha256).digest()


def client_key(master: bytes, partition_id: int) -> ClientKey:
    """Client ``partition_id``'s key, derived by the server from its master secret (domain-separated HMAC-SHA256)."""
    pid = check_int("partition_id", partition_id, minimum=0)
    return ClientKey(pid, _hmac(master, b"client-key", pid.to_bytes(8, "big")))


def client_run_key(key: ClientKey, nonce: str) -> bytes:
    """Client ``key.partition_id``'s stream key of one run: HMAC of its key, the public nonce and its partition id
    (so one key file serves every run, and two runs never share a stream)."""
    return _hmac(key.key, b"client-run", str(nonce).encode(), int(key.partition_id).to_bytes(8, "big"))


def server_run_key(master: bytes, nonce: str) -> bytes:
    """The server's own stream key of one run (the B-of-N sample, the dropped clients' noise): a third
    domain-separated HMAC of the master secret, which no client key reveals."""
    return _hmac(master, b"server-run", str(nonce).encode())


def probe_tag(run_key_: bytes, partition_id: int) -> str:
    """The probe's answer: a keyed hash proving the client holds ITS OWN run key (reveals nothing about it)."""
    return _hmac(run_key_, b"probe", int(partition_id).to_bytes(8, "big")).hex()[:32]


def load_secret(secret: bytes | None = None, secret_file: str | os.PathLike | None = None) -> bytes:
    """The server's master secret (bytes, >= 16), from ``secret`` or ``secret_file``.

    The file must exist and be readable by its owner only (:func:`read_secret_file`); a client key file is refused.
    Raises ``ValueError`` naming the sources tried and the fix (never the content).
    """
    if secret is not None:
        if not isinstance(secret, bytes) or len(secret) < 16:
            raise ValueError(f"secret must be bytes of length >= 16, got {type(secret).__name__} of length "
                             f"{len(secret) if isinstance(secret, (bytes, str)) else '?'}; use secrets.token_bytes(32)")
        return secret
    if secret_file is None:
        raise ValueError("no LRQ master secret, got neither secret nor secret_file; pass secret_file= (GauLRQ "
                         "creates it, mode 0600, when it does not exist yet)")
    return read_secret_file(secret_file)


def secret_path(path: str | os.PathLike) -> Path:
    """``path`` with ``~`` expanded (the form every message about a secret file names)."""
    return Path(os.path.expanduser(str(path)))


def _read_private(p: Path, what: str) -> bytes:
    mode = p.stat().st_mode & 0o777
    if mode & 0o077:
        raise ValueError(f"the {what} {str(p)!r} is readable or writable by group or others, got mode {mode:04o}; "
                         f"anyone who reads it can decode the updates it keys: run chmod 600 {str(p)!r} (mode 0600, "
                         "owner only)")
    return p.read_bytes()


def read_secret_file(path: str | os.PathLike) -> bytes:
    """The content of an existing master secret file that only its owner can read.

    Raises ``ValueError`` for a missing file (what it is and how to make one), a file that group or others may
    read or write (its mode and ``chmod 600``), one shorter than 16 bytes, or a client key file.
    """
    p = secret_path(path)
    if not p.is_file():
        raise ValueError(f"the LRQ master secret file {str(p)!r} does not exist, got no file there; it holds the "
                         "server's secret (>= 16 random bytes) from which every client's key is derived: "
                         "GauLRQ(secret_file=...) creates it (mode 0600) when it starts, or make one with python -c "
                         f"\"import os, secrets; fd = os.open({str(p)!r}, os.O_WRONLY | os.O_CREAT | os.O_EXCL, "
                         "0o600); os.write(fd, secrets.token_bytes(32))\"")
    data = _read_private(p, "LRQ master secret file")
    if data.startswith(KEY_HEADER.encode()):
        raise ValueError(f"{str(p)!r} is a client key file, got it as the server's master secret; the server reads "
                         "the master secret (the file GauLRQ(secret_file=...) created), clients read their own key")
    if len(data) < 16:
        raise ValueError(f"the LRQ master secret file {str(p)!r} must hold >= 16 bytes, got {len(data)}; write "
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


def key_file_name(partition_id: int) -> str:
    """The name of client ``partition_id``'s key file in a key folder."""
    return f"client-{check_int('partition_id', partition_id, minimum=0)}.key"


def key_file_bytes(key: ClientKey) -> bytes:
    """A key file's content: :data:`KEY_HEADER`, ``partition-id <i>`` and the key in hex, one per line."""
    return f"{KEY_HEADER}\npartition-id {int(key.partition_id)}\n{key.key.hex()}\n".encode()


def write_key_file(path: str | os.PathLike, key: ClientKey) -> Path:
    """Write ``key`` to ``path`` (mode 0600, atomically, replacing an earlier file); returns the expanded path."""
    p = secret_path(path)
    tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key_file_bytes(key))
    os.replace(tmp, p)
    return p


def write_client_keys(master: bytes, num_clients: int, out_dir: str | os.PathLike,
                      partition_ids: Iterable[int] | None = None) -> Path:
    """Write one key file per client (``out_dir/client-<i>.key``, mode 0600) into ``out_dir`` (mode 0700, created
    if missing); ``partition_ids`` (default ``range(num_clients)``) picks some.  Returns the expanded folder.

    Raises ``ValueError`` for a folder that group or others may enter or list (its mode and ``chmod 700``).
    """
    n = check_int("num_clients", num_clients, minimum=1)
    ids = range(n) if partition_ids is None else [check_int("partition_id", i, minimum=0, maximum=n - 1)
                                                  for i in partition_ids]
    d = secret_path(out_dir)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    mode = d.stat().st_mode & 0o777
    if mode & 0o077:
        raise ValueError(f"the LRQ key folder {str(d)!r} is open to group or others, got mode {mode:04o}; each file "
                         f"in it is one client's key: run chmod 700 {str(d)!r} or name a new folder")
    master = load_secret(master)
    for i in ids:
        write_key_file(d / key_file_name(i), client_key(master, i))
    return d


def read_key_file(path: str | os.PathLike, partition_id: int | None = None) -> ClientKey:
    """The client key in ``path`` (a file :func:`write_key_file` wrote, mode 0600).

    Raises ``ValueError`` naming the fix for a missing file, one that group or others may read, the server's master
    secret (a file without the key header), or another client's key (``partition_id`` given and different).
    """
    p = secret_path(path)
    if not p.is_file():
        raise ValueError(f"the LRQ client key file {str(p)!r} does not exist, got no file there; {EXPORT_HINT}")
    data = _read_private(p, "LRQ client key file")
    lines = data.split(b"\n")
    if lines[0] != KEY_HEADER.encode():
        raise ValueError(f"{str(p)!r} has no client key header ({KEY_HEADER!r}), got a file that looks like the "
                         f"server's master secret: a client holding it could re-derive every other client's noise "
                         f"and the sample; this is the server's master secret; {EXPORT_HINT}")
    try:
        label, pid_text = lines[1].decode().split(" ")
        if label != "partition-id":
            raise ValueError(label)
        key = ClientKey(int(pid_text), bytes.fromhex(lines[2].decode()))
    except (IndexError, ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"the LRQ client key file {str(p)!r} is malformed ({exc}), got {len(lines)} lines; write it "
                         "again with flower-dp lrq-keys") from None
    if partition_id is not None and key.partition_id != int(partition_id):
        raise ValueError(f"{str(p)!r} holds client {key.partition_id}'s key, got it on the client with partition-id "
                         f"{int(partition_id)}; every client holds only its own key "
                         f"({key_file_name(int(partition_id))}); {EXPORT_HINT}")
    return key


def run_key_check(server_key: bytes) -> str:
    """A one-way tag of the server's run key: tells a resume with another master secret apart (not the secret)."""
    return _hmac(server_key, b"secret-check").hex()[:16]


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
    update has max|Dt| <= ||Dt||_2 <= S2 (Lemma 3 with A = S2); ``width = ceil(log2(2 L + 1))`` bits."""
    L = math.ceil(spec.clip * (1 + 1e-9) / lrq.lrq_w_min(spec.sigma))
    return -L, max(1, (2 * L).bit_length())


def public_bits(spec: "RoundSpec", d: int) -> float:
    """Uplink bits of one client's message, a function of the public round spec and the model size d only."""
    if spec.method in ("none", "gaussian"):
        return 32.0 * d
    if spec.method == "lrq":
        return float(d * lrq_public_range(spec)[1])
    if spec.method == "qg":
        return float(d * lrq_public_range(spec)[1] + 32)  # b as LRQ's, + the float32 scale
    s_lv, m_tr = bq_levels(spec.sigma, spec.clip, spec.bq_bits)
    return float(d * math.ceil(math.log2(s_lv + m_tr)))


def bq_levels(sigma: float, clip: float, bits: int) -> tuple[int, int]:
    """BQ-SGD's (s, m): largest s >= 2 with ``s + m <= 2^b``, ``m = ceil(sigma^2 (s-1)^2 / S2^2)`` (our rule).

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
        ``lrq_key(client_run_key(client_key, nonce), k, client)`` (secret; never sent).

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
        # b is LRQ's public width (the paper: "b the same as LRQ"), a function of sigma and S2 only, so the
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
