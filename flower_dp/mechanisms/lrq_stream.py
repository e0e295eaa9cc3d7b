"""The LRQ key and the randomness client and server share (Gau-LRQ paper, Sec. IV-B, the paragraph before Alg. 1).

The key of (the client's run key, round, client) (:func:`lrq_key`) is hashed into a ``SeedSequence``; chunk ``c`` of
``chunk_size`` coordinates (in flattened-parameter order) uses ``Generator(Philox(SeedSequence(entropy,
spawn_key=(c,))))`` and draws all of z (``standard_normal``) then all of v (``1 - random``), in the layer dtype.
A second, domain-separated hash of the key keys the message's HMAC tag.  Both sides draw the same stream, so the
quantizer (:mod:`flower_dp.mechanisms.lrq`) decodes what was encoded.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np

from flower_dp._checks import check_int

__all__ = ["lrq_key", "key_bytes", "stream_entropy", "mac_key", "chunk_rng", "draw", "stream_zr", "stream_blocks"]


def lrq_key(run_secret: bytes | str | int, round_k: int, client: int) -> bytes:
    """The 32-byte LRQ key of (a secret: Gau-LRQ passes the client's run key, round, client); never reuse one."""
    if isinstance(run_secret, str):
        run_secret = run_secret.encode()
    elif isinstance(run_secret, int) and not isinstance(run_secret, bool):
        run_secret = b"int:" + str(run_secret).encode()
    elif not isinstance(run_secret, bytes):
        raise TypeError(f"run_secret must be bytes, str or int, got {type(run_secret).__name__}")
    k = check_int("round_k", round_k, minimum=0)
    c = check_int("client", client, minimum=0)
    return hashlib.sha256(b"flower_dp.lrq.key\x00" + run_secret + struct.pack("<QQ", k, c)).digest()


def key_bytes(key: bytes | int) -> bytes:
    if isinstance(key, (bytes, bytearray)):
        if len(key) == 0:
            raise ValueError("key must be non-empty bytes, got b''; derive one with lrq_key(secret, round, client)")
        return b"bytes:" + bytes(key)
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        if key < 0:
            raise ValueError(f"key must be a non-negative int or bytes, got {key}")
        return b"int:" + str(int(key)).encode()
    raise TypeError(f"key must be bytes or a non-negative int, got {type(key).__name__}")


def stream_entropy(kb: bytes) -> int:
    return int.from_bytes(hashlib.sha256(b"flower_dp.lrq.stream\x00" + kb).digest(), "little")


def mac_key(kb: bytes) -> bytes:
    return hashlib.sha256(b"flower_dp.lrq.mac\x00" + kb).digest()


def chunk_rng(entropy: int, c: int) -> np.random.Generator:
    return np.random.Generator(np.random.Philox(np.random.SeedSequence(entropy, spawn_key=(c,))))


def draw(gen: np.random.Generator, n: int, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """z ~ N(0,1) then v ~ U(0,1], in that order."""
    z = gen.standard_normal(n, dtype=dtype)
    v = gen.random(n, dtype=dtype)
    np.subtract(1.0, v, out=v)
    return z, v


def stream_zr(entropy: int, d: int, chunk_size: int, dtype: str, block: int):
    """Each chunk's stream drawn once, in the order of :func:`draw`: yields ``(pos, z, r)`` per block.

    All of the chunk's z is drawn into one buffer first, then r ~ U[0, 1) block by block into a
    small buffer (consecutive draws continue the same stream); ``v = 1 - r``.  The arrays are
    views of buffers reused by the next block.
    """
    zbuf = np.empty(min(chunk_size, d), dtype=dtype)
    rbuf = np.empty(block, dtype=dtype)
    for c, start in enumerate(range(0, d, chunk_size)):
        n = min(chunk_size, d - start)
        gen = chunk_rng(entropy, c)
        z = zbuf[:n]
        gen.standard_normal(out=z, dtype=dtype)
        for b in range(0, n, block):
            k = min(block, n - b)
            r = rbuf[:k]
            gen.random(out=r, dtype=dtype)
            yield start + b, z[b : b + k], r


def stream_blocks(entropy: int, d: int, chunk_size: int, dtype: str, block: int):
    """:func:`stream_zr` with ``v = 1 - r`` too: yields ``(pos, z, r, v)`` per block."""
    vbuf = np.empty(block, dtype=dtype)
    for pos, z, r in stream_zr(entropy, d, chunk_size, dtype, block):
        v = vbuf[: r.size]
        np.subtract(1.0, r, out=v)
        yield pos, z, r, v
