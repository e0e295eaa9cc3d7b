"""Deterministic random streams, one per (seed, node, purpose, k).

COMMON.md 2.1: every random draw comes from a stream keyed by the run seed, the node,
the purpose ("data", "noise", "compress", "init", ...) and the iteration, so every
backend (in-process, Ray, relay) draws exactly the same numbers and nodes' noise is
independent.  Nothing here touches global RNG state.
"""

from __future__ import annotations

import hashlib

import numpy as np

__all__ = ["PURPOSES", "stream_seed", "numpy_rng", "torch_generator"]

#: Known purposes; the integer code is part of the stream key and must never change.
PURPOSES = {"data": 0, "noise": 1, "compress": 2, "init": 3, "sample": 4, "lrq": 5, "topology": 6, "eval": 7}


def _purpose_code(purpose: str | int) -> int:
    if isinstance(purpose, int):
        return purpose
    if purpose not in PURPOSES:
        raise ValueError(f"unknown RNG purpose {purpose!r}; valid choices are {sorted(PURPOSES)}")
    return PURPOSES[purpose]


def stream_seed(seed: int, node: int, purpose: str | int, k: int = 0) -> int:
    """A 63-bit integer seed for the stream (seed, node, purpose, k).

    Built from ``numpy.random.SeedSequence(seed, spawn_key=(node, purpose, k))`` so
    streams for different keys are statistically independent.
    """
    ss = np.random.SeedSequence(int(seed), spawn_key=(int(node), _purpose_code(purpose), int(k)))
    a = ss.generate_state(2, dtype=np.uint32)
    return ((int(a[0]) << 32) | int(a[1])) & ((1 << 63) - 1)


def numpy_rng(seed: int, node: int, purpose: str | int, k: int = 0) -> np.random.Generator:
    """A ``numpy.random.Generator`` (PCG64) for the stream (seed, node, purpose, k)."""
    ss = np.random.SeedSequence(int(seed), spawn_key=(int(node), _purpose_code(purpose), int(k)))
    return np.random.default_rng(ss)


def torch_generator(seed: int, node: int, purpose: str | int, k: int = 0, device: str = "cpu"):
    """A ``torch.Generator`` on ``device`` seeded for the stream (seed, node, purpose, k)."""
    import torch

    g = torch.Generator(device=device)
    g.manual_seed(stream_seed(seed, node, purpose, k))
    return g


def key_digest(*parts: object) -> bytes:
    """A 32-byte digest of the parts (used to derive keyed streams from secrets)."""
    h = hashlib.sha256()
    for p in parts:
        h.update(repr(p).encode())
        h.update(b"\x00")
    return h.digest()
