"""Random streams, one per (key, node, purpose, k), and the node secret that keys the private ones.

Every random draw comes from a stream keyed by a key, the node, the purpose
("data", "noise", "compress", "init", ...) and the iteration, so nodes' draws are independent,
a node redraws the same numbers for the same ``k`` (a relay node rebuilt between ``contribute(k)``
and ``local_step(k)`` replays ``k`` exactly) and nothing here touches global RNG state.

Threat model (docs/privacy.md).  The seed of a run is public:
it is written to ``results.json`` and the plan summary.  So the streams of the *private* purposes
(:data:`PRIVATE_PURPOSES`: ``"noise"`` - privacy noise - and ``"data"`` - private sampling: Poisson
batches, PrivSGP's block choice) are keyed by a **node secret**, not by the seed:

* secret mode (the default): :func:`node_secret` draws 256 bits from OS entropy
  (``secrets.randbits``) when a node is built.  The secret never leaves the node: it is not in
  ``state_dict`` / checkpoints, results, logs, the plan summary or any ``repr``.  Nodes need no
  shared secret: each node's noise only has to be unknown to everyone else and independent.  A
  node restored from a checkpoint (resume, a restart after a dead worker) draws a *fresh* secret:
  its later steps get fresh, independent noise, which is valid (the released steps were charged).
* reproducible mode (``reproducible=True``, ``[run] reproducible = true``, ``--reproducible``): the
  key is the run seed, so every backend draws the same
  numbers and a resumed run equals an uninterrupted one.  A simulation mode: the privacy guarantee
  holds only against parties that do not know the seed; results say so (:func:`noise_record`).

Public randomness (model init ``"init"``, ``"topology"``, compressor masks ``"compress"``,
``"eval"``, PrivSGP's block partition) stays keyed by the seed in both modes.

API: ``key = node_secret(plan.reproducible, plan.seed)`` once per node, then
``torch_generator(key, node, "noise", k)`` / ``numpy_rng(key, node, "data", k)``; the stream
functions take an int seed or a :class:`NodeKey`.
"""

from __future__ import annotations

import secrets

import numpy as np

__all__ = ["PURPOSES", "PRIVATE_PURPOSES", "NodeKey", "node_secret", "noise_record", "stream_seed", "numpy_rng", "noise_generator",
           "torch_generator", "SECRET_NOTE", "REPRODUCIBLE_NOTE", "KeyStream", "stream_key",
           "exact_noise_stream", "exact_stream"]

#: Known purposes; the integer code is part of the stream key and must never change.
PURPOSES = {"data": 0, "noise": 1, "compress": 2, "init": 3, "sample": 4, "lrq": 5, "topology": 6, "eval": 7,
            "rounding": 8}

#: Purposes whose draws must stay unknown outside the node (privacy noise, private sampling).
PRIVATE_PURPOSES = frozenset({"noise", "data", "sample", "lrq", "rounding"})

#: The ``note`` of :func:`noise_record` in each mode.
SECRET_NOTE = ("privacy noise and private sampling are drawn from a per-node 256-bit secret (OS entropy) that "
               "never leaves the node; the seed keys only public randomness (model init, topology, compression)")
REPRODUCIBLE_NOTE = ("reproducible simulation mode: privacy noise and private sampling are drawn from streams keyed "
                     "by the run seed, which this file publishes; the privacy guarantee holds only against parties "
                     "that do not know the seed (whoever holds the seed and the messages can subtract the noise)")


class NodeKey:
    """The key of a node's private streams: a secret (hidden in ``repr``/``str``, not JSON-serialisable)
    or, in reproducible mode, the run seed.  Pass it to :func:`torch_generator` / :func:`numpy_rng`."""

    __slots__ = ("_value", "reproducible")

    def __init__(self, value: int, reproducible: bool = False) -> None:
        self._value = int(value)
        self.reproducible = bool(reproducible)

    @property
    def mode(self) -> str:
        """``"reproducible"`` or ``"secret"``."""
        return "reproducible" if self.reproducible else "secret"

    def __repr__(self) -> str:
        return "NodeKey(reproducible, seed)" if self.reproducible else "NodeKey(secret)"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NodeKey) and other._value == self._value and other.reproducible == self.reproducible

    def __hash__(self) -> int:
        return hash((NodeKey, self._value))

    def __getstate__(self):  # pickling moves a node between its own processes (Ray host, relay cache)
        return (self._value, self.reproducible)

    def __setstate__(self, state) -> None:
        self._value, self.reproducible = state

    def to_bytes(self) -> bytes:
        """The key as bytes (value, then the mode flag), for node-local storage only (a relay node's ``context.state``)."""
        n = max(32, (self._value.bit_length() + 7) // 8)
        return self._value.to_bytes(n, "big", signed=False) + bytes([self.reproducible])

    @classmethod
    def from_bytes(cls, data: bytes) -> NodeKey:
        """Inverse of :meth:`to_bytes`."""
        data = bytes(data)
        return cls(int.from_bytes(data[:-1], "big"), bool(data[-1]))


def node_secret(reproducible: bool, seed: int) -> NodeKey:
    """The key of one node's private streams: the run ``seed`` when ``reproducible``, else a fresh
    256-bit secret from OS entropy (``secrets.randbits(256)``).  Call once per node, where it is built."""
    if reproducible:
        return NodeKey(int(seed), reproducible=True)
    return NodeKey(secrets.randbits(256), reproducible=False)


def noise_record(reproducible: bool, note: str | None = None, device="cpu", sampler: str = "float") -> dict[str, str]:
    """The ``"noise"`` entry of a results file: ``{"mode": "secret" | "reproducible", "note": ...,
    "gaussian_sampler": ...}`` (``note`` replaces the default note of the mode; the sampler is
    :func:`flower_dp.mechanisms.noise.gaussian_sampler` of ``device``, where the nodes draw their noise: a device
    or a list of them, e.g. ``"numpy-float64"`` on the CPU, ``"torch-cuda-float64"`` on CUDA).  ``sampler``
    (``"float"`` | ``"exact"``, the run's ``noise_sampler``) is recorded as ``"sampler"``; in the exact mode the
    Gaussian sampler is the discrete Gaussian on a ChaCha20 keystream (``"cks-discrete-chacha20"``)."""
    from flower_dp.mechanisms.exact_release import EXACT_SAMPLER_LABEL, check_noise_sampler
    from flower_dp.mechanisms.noise import gaussian_sampler

    mode = "reproducible" if reproducible else "secret"
    exact = check_noise_sampler(sampler) == "exact"
    return {"mode": mode, "note": note or (REPRODUCIBLE_NOTE if reproducible else SECRET_NOTE),
            "sampler": sampler, "gaussian_sampler": EXACT_SAMPLER_LABEL if exact else gaussian_sampler(device)}


def _seed_int(key: int | NodeKey) -> int:
    return key._value if isinstance(key, NodeKey) else int(key)


def _purpose_code(purpose: str | int) -> int:
    if isinstance(purpose, int):
        return purpose
    if purpose not in PURPOSES:
        raise ValueError(f"unknown RNG purpose {purpose!r}; valid choices are {sorted(PURPOSES)}")
    return PURPOSES[purpose]


def stream_seed(seed: int | NodeKey, node: int, purpose: str | int, k: int = 0) -> int:
    """A 63-bit integer seed for the stream (seed, node, purpose, k); ``seed`` is the run seed or a :class:`NodeKey`.

    Built from ``numpy.random.SeedSequence(seed, spawn_key=(node, purpose, k))`` so
    streams for different keys are statistically independent.
    """
    ss = np.random.SeedSequence(_seed_int(seed), spawn_key=(int(node), _purpose_code(purpose), int(k)))
    a = ss.generate_state(2, dtype=np.uint32)
    return ((int(a[0]) << 32) | int(a[1])) & ((1 << 63) - 1)


def numpy_rng(seed: int | NodeKey, node: int, purpose: str | int, k: int = 0) -> np.random.Generator:
    """A ``numpy.random.Generator`` (PCG64) for the stream (seed, node, purpose, k)."""
    ss = np.random.SeedSequence(_seed_int(seed), spawn_key=(int(node), _purpose_code(purpose), int(k)))
    return np.random.default_rng(ss)


def noise_generator(seed: int | NodeKey, node: int, k: int = 0) -> np.random.Generator:
    """A ``numpy.random.Generator`` (SFC64) for node ``node``'s Gaussian noise stream (seed, node, "noise", k), the
    generator :func:`flower_dp.mechanisms.noise.gaussian_noise` draws from.  Seeded through ``SeedSequence`` from
    the whole key (a 256-bit secret in secret mode)."""
    ss = np.random.SeedSequence(_seed_int(seed), spawn_key=(int(node), PURPOSES["noise"], int(k)))
    return np.random.Generator(np.random.SFC64(ss))


def torch_generator(seed: int | NodeKey, node: int, purpose: str | int, k: int = 0, device: str = "cpu"):
    """A ``torch.Generator`` on ``device`` seeded for the stream (seed, node, purpose, k)."""
    import torch

    g = torch.Generator(device=device)
    g.manual_seed(stream_seed(seed, node, purpose, k))
    return g




class KeyStream:
    """A ChaCha20 keystream (RFC 8439 block function, via the ``cryptography`` package) read as words.

    The 256-bit ChaCha key is BLAKE2b-256 of the node key and ``(node, purpose, k)`` (personalised
    ``flower-dp/keystr``): streams of different keys, nodes, purposes or iterations are computationally independent,
    and the same key gives the same words on every machine.  Not picklable (it is a live cipher state)."""

    __slots__ = ("_enc",)

    def __init__(self, key: bytes) -> None:
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

        if len(key) != 32:
            raise ValueError(f"key must be 32 bytes, got {len(key)}")
        self._enc = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()

    def bytes(self, n: int) -> bytes:
        """The next ``n`` keystream bytes."""
        return self._enc.update(bytes(int(n)))

    def words64(self, n: int) -> np.ndarray:
        """The next ``n`` keystream words as uint64 (little-endian)."""
        n = int(n)
        out = np.empty(n, dtype="<u8")
        view = memoryview(out).cast("B")
        step = 1 << 20
        zeros = bytes(min(8 * n, step))
        for a in range(0, 8 * n, step):
            b = min(8 * n, a + step)
            self._enc.update_into(zeros[:b - a], view[a:b])  # noqa: the keystream XOR zeros is the keystream
        return out.view(np.uint64)

    def words62(self, n: int) -> np.ndarray:
        """The next ``n`` words, each a uniform integer in [0, 2^62) (its top 62 bits), as int64."""
        w = self.words64(n)
        w >>= np.uint64(2)
        return w.view(np.int64)

    def uniform53(self, n: int) -> np.ndarray:
        """The next ``n`` words as float64 uniforms on the grid ``{0, 2^-53, ..., 1 - 2^-53}`` (each exactly
        ``w 2^-53`` for a uniform 53-bit integer ``w``: no rounding)."""
        w = self.words64(n)
        w >>= np.uint64(11)
        return w.astype(np.float64) * 2.0 ** -53

    def below(self, n: int, num: int, den: int) -> np.ndarray:
        """``n`` independent Bernoulli(``num / den``) outcomes, exactly: a uniform integer in ``[0, den)`` (64-bit
        words, those above the largest multiple of ``den`` redrawn) compared with ``num``."""
        num, den, n = int(num), int(den), int(n)
        if not 0 < den < 2 ** 63 or not 0 <= num <= den:
            raise ValueError(f"need 0 <= num <= den and 0 < den < 2^63, got num={num}, den={den}")
        limit = np.uint64((2 ** 64 // den) * den - 1)
        u = self.words64(n)
        bad = np.flatnonzero(u > limit)
        while bad.size:
            u[bad] = self.words64(bad.size)
            bad = bad[u[bad] > limit]
        return (u % np.uint64(den)) < np.uint64(num)

    def __reduce__(self):
        raise TypeError("a KeyStream is a live cipher state and is not picklable; make a new one where it is used")


def stream_key(seed: int | NodeKey, node: int, purpose: str | int, k: int = 0) -> bytes:
    """The 256-bit ChaCha20 key of the stream (seed, node, purpose, k): BLAKE2b-256 of the whole key (every bit of
    a 256-bit secret) and the stream's coordinates."""
    import hashlib

    value = _seed_int(seed)
    if value < 0:
        raise ValueError(f"seed must be >= 0, got {value}")
    vb = value.to_bytes(max(32, (value.bit_length() + 7) // 8), "big")
    h = hashlib.blake2b(digest_size=32, person=b"flower-dp/keystr")
    for part in (len(vb).to_bytes(8, "big"), vb, int(node).to_bytes(8, "big", signed=True),
                 _purpose_code(purpose).to_bytes(8, "big"), int(k).to_bytes(8, "big", signed=True)):
        h.update(part)
    return h.digest()


def exact_stream(seed: int | NodeKey, node: int, purpose: str, k: int = 0) -> KeyStream:
    """Node ``node``'s ChaCha20 keystream for ``purpose`` at iteration ``k``: the exact mode draws its noise
    (``"noise"``), its Poisson sample (``"data"``) and its rounding coins (``"rounding"``) from these."""
    return KeyStream(stream_key(seed, node, purpose, k))


def exact_noise_stream(seed: int | NodeKey, node: int, k: int = 0) -> KeyStream:
    """Node ``node``'s ChaCha20 keystream for its exact-mode noise at iteration ``k`` (purpose ``"noise"``): what
    :func:`flower_dp.mechanisms.discrete_gaussian.discrete_gaussian` reads."""
    return KeyStream(stream_key(seed, node, "noise", k))
