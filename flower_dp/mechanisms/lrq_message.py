"""The LRQ message: the integer symbols a client sends, their public metadata and an integrity tag.

The tag is an HMAC-SHA256 over the metadata and the integer payload, keyed by a domain-separated hash of the
round's key (:func:`flower_dp.mechanisms.lrq_stream.mac_key`).  Decoding with another key (wrong round, client or
secret) or a tampered message fails the tag.  The tag is a deterministic function of (m, key) and changes
nothing about the decoded value; the key is never stored in the message.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass, field

import numpy as np

from flower_dp.errors import DecodeError

from .lrq_stream import mac_key

__all__ = ["LRQMessage", "message_tag", "FORMAT_VERSION"]

#: version of the tagged header layout
FORMAT_VERSION = 1


@dataclass(frozen=True, repr=False, eq=False)
class LRQMessage:
    """What a client sends: the integer vector m plus public metadata and an integrity tag.

    Attributes
    ----------
    m : ndarray, shape (d,), smallest signed int dtype holding its range (read-only)
    d : int
    sigma : float
        Error std per coordinate (public).
    dtype : str
        Float dtype of the layer arithmetic, ``"float64"`` (default) or ``"float32"``.
    chunk_size : int
        Coordinates per keyed stream chunk.
    tag : bytes
        HMAC-SHA256 over (version, d, sigma, dtype, chunk_size, m dtype, m bytes); not the key.
    """

    m: np.ndarray
    d: int
    sigma: float
    dtype: str
    chunk_size: int
    tag: bytes = field(default=b"")

    @property
    def levels_used(self) -> int:
        """Number of integer values spanned, ``max(m) - min(m) + 1`` (0 if d == 0)."""
        return int(self.m.max()) - int(self.m.min()) + 1 if self.d else 0

    def to_record(self) -> dict:
        """Plain ``{name: ndarray | int | float | str}`` for transport (e.g. a Flower record)."""
        return {"m": self.m, "d": self.d, "sigma": self.sigma, "dtype": self.dtype,
                "chunk_size": self.chunk_size, "tag": self.tag.hex()}

    @classmethod
    def from_record(cls, rec: dict) -> LRQMessage:
        """Inverse of :meth:`to_record` (the tag is checked later, by :func:`decode`)."""
        try:
            m = np.asarray(rec["m"])
            return cls(m=m, d=int(rec["d"]), sigma=float(rec["sigma"]), dtype=str(rec["dtype"]),
                       chunk_size=int(rec["chunk_size"]), tag=bytes.fromhex(str(rec["tag"])))
        except (KeyError, ValueError, TypeError) as exc:
            raise DecodeError(f"malformed LRQ record, got keys {sorted(rec)}: {exc}") from exc

    def __repr__(self) -> str:
        rng = f"[{int(self.m.min())}, {int(self.m.max())}]" if self.d else "[]"
        return (f"LRQMessage(d={self.d}, sigma={self.sigma!r}, dtype={self.dtype!r}, m.dtype={self.m.dtype}, "
                f"m range={rng}, chunk_size={self.chunk_size})")

    __str__ = __repr__


def message_tag(kb: bytes, d: int, sigma: float, dtype: str, chunk: int, m: np.ndarray) -> bytes:
    """HMAC-SHA256 of a message's metadata and symbols, keyed by the MAC key of the key bytes ``kb``."""
    mle = m.astype(m.dtype.newbyteorder("<"), copy=False)
    header = struct.pack("<IQdQ", FORMAT_VERSION, d, sigma, chunk) + dtype.encode() + b"|" + mle.dtype.str.encode()
    h = hmac.new(mac_key(kb), header, hashlib.sha256)
    h.update(np.ascontiguousarray(mle).view(np.uint8))
    return h.digest()
