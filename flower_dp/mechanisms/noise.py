"""Gaussian and Laplace noise vectors drawn from an explicit generator.

Randomness is always passed in.  Gaussian noise: derive the generator with
``flower_dp.rng.noise_generator(key, node, k)`` (a numpy ``Generator``), Laplace noise with
``flower_dp.rng.torch_generator(key, node, "noise", k)``; ``key`` is the node's private key
(``node_secret(plan.reproducible, plan.seed)``: a secret from OS entropy, or the seed in the
reproducible simulation mode, where every backend on the same kind of device draws the same noise: CUDA
nodes draw on the device with torch, see :func:`gaussian_sampler`), so nodes/iterations are
independent and nobody outside the node can recompute the noise.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from flower_dp._checks import check_int, check_nonnegative

__all__ = ["gaussian_noise", "laplace_noise", "NoisePrefetcher", "gaussian_sampler", "is_proven_sampler", "TAIL_CUT_STD",
           "TAIL_CUT_STD_BY_SAMPLER", "GAUSSIAN_SAMPLER", "CUDA_GAUSSIAN_SAMPLER", "PROVEN_SAMPLERS"]

#: The largest |draw| / std :func:`gaussian_noise` can produce.  numpy's float64 ziggurat draws the tail beyond
#: r = 3.654 by exact exponential rejection from 53-bit uniforms, so no draw exceeds r + 53 ln 2 / r = 13.7; the
#: tail mass it misses is ~1e-42 per coordinate (torch's float64 Box-Muller, the sampler before, stopped at
#: sqrt(2 ln 2^53) = 8.57, ~1e-17; its float32 one at 5.77).  The Gaussian accountants assume an untruncated
#: tail; what they miss per release, ``q * P(Z > TAIL_CUT_STD - sensitivity / std)``, is far below any delta.
TAIL_CUT_STD = 13.7
#: What results files record as the push-sum nodes' Gaussian sampler on the CPU (``noise.gaussian_sampler``, see
#: :func:`gaussian_sampler`).  Older records name the sampler they were drawn with: none (torch's float32 sampler,
#: cut at 5.77 std) or ``"torch-float64"`` (torch's float64 Box-Muller); numpy's float64 ziggurat is 2.3x faster.
GAUSSIAN_SAMPLER = "numpy-float64"
#: The sampler of nodes on a CUDA device: torch's CUDA float64 normal (``torch.randn(..., dtype=torch.float64)`` on
#: the device).  PyTorch's ``normal_and_transform`` (ATen/native/cuda/DistributionTemplates.h) draws float64 with
#: cuRAND's ``curand_normal2_double`` on Philox4x32-10: Box-Muller on uniforms of 53-bit resolution
#: (``_curand_uniform_double_hq``: u = z 2^-53 + 2^-54, z < 2^53), so no draw exceeds sqrt(-2 ln 2^-54) = 8.65 std,
#: the same kind of cut as torch's CPU float64 sampler (8.57 std, ``"torch-float64"``); the tail mass it misses is
#: ~1e-17 per coordinate.  Key size: these draws are keyed by a 64-bit Philox seed drawn from the node's noise stream
#: (:func:`flower_dp.rng.noise_generator`, itself keyed by the node's 256-bit secret and (node, k)), as torch's CPU
#: float64 sampler was by its 64-bit seed; numpy's SFC64 path uses the whole 256-bit key.
CUDA_GAUSSIAN_SAMPLER = "torch-cuda-float64"
#: Samplers whose draws the Gaussian accountants' proofs cover (tail intact to ~1e-17 or better).  A run whose nodes
#: ran on several kinds of device records the samplers joined with ``"+"`` (:func:`gaussian_sampler`); it is proven
#: when every part is (:func:`is_proven_sampler`).
PROVEN_SAMPLERS = ("torch-float64", "numpy-float64", CUDA_GAUSSIAN_SAMPLER)
#: The largest |draw| / std each proven sampler can produce (:data:`TAIL_CUT_STD` for numpy's; torch's float64
#: Box-Muller: sqrt(-2 ln 2^-53) on the CPU, sqrt(-2 ln 2^-54) on CUDA).
TAIL_CUT_STD_BY_SAMPLER = {
    GAUSSIAN_SAMPLER: TAIL_CUT_STD,
    "torch-float64": 8.57,
    CUDA_GAUSSIAN_SAMPLER: 8.65,
}


def _is_cuda(device) -> bool:
    return torch.device(device).type == "cuda"


def gaussian_sampler(device="cpu") -> str:
    """The name of the sampler :func:`gaussian_noise` draws with on ``device`` (what records and checkpoints name):
    :data:`GAUSSIAN_SAMPLER` (``"numpy-float64"``) on the CPU, :data:`CUDA_GAUSSIAN_SAMPLER`
    (``"torch-cuda-float64"``) on a CUDA device.  A list of devices (nodes on mixed hosts) gives the distinct names,
    sorted, joined with ``"+"``."""
    if isinstance(device, (list, tuple, set, frozenset)):
        names = sorted({gaussian_sampler(d) for d in device})
        return "+".join(names) if names else GAUSSIAN_SAMPLER
    return CUDA_GAUSSIAN_SAMPLER if _is_cuda(device) else GAUSSIAN_SAMPLER


def is_proven_sampler(label) -> bool:
    """Whether a record's ``gaussian_sampler`` label is proven: every ``"+"``-joined part in :data:`PROVEN_SAMPLERS`."""
    if not isinstance(label, str) or not label:
        return False
    return all(part in PROVEN_SAMPLERS for part in label.split("+"))


_SCRATCH = threading.local()  # one float64 draw buffer per thread, grown to the largest d drawn there


def _scratch(d: int) -> np.ndarray:
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.shape[0] < d:
        buf = np.empty(max(d, 1), dtype=np.float64)
        _SCRATCH.buf = buf
    return buf[:d]


def _check_gen(generator, device) -> None:
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator, got {type(generator).__name__}; "
            "use flower_dp.rng.torch_generator(key, node, 'noise', k) with key = node_secret(...)"
        )
    if torch.device(generator.device).type != torch.device(device).type:
        raise ValueError(
            f"generator device must match device {str(device)!r}, got generator on {str(generator.device)!r}; "
            "pass torch_generator(..., device=device)"
        )


def gaussian_noise(
    d: int, std: float, generator: np.random.Generator, *, dtype: torch.dtype = torch.float32, device="cpu",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """i.i.d. ``N(0, std^2)`` noise.

    On a CPU ``device``: numpy's float64 ziggurat (``Generator.standard_normal``: 256 layers at 51-bit resolution,
    the tail by exact exponential rejection), times ``std`` in float64, then rounded to ``dtype`` (see
    :data:`TAIL_CUT_STD`).  On a CUDA ``device``: drawn there with torch's CUDA float64 normal
    (:data:`CUDA_GAUSSIAN_SAMPLER`, cut at 8.65 std) from a ``torch.Generator`` on the device seeded with a 64-bit
    integer drawn from ``generator``, times ``std`` in float64, then rounded to ``dtype``; copying a CPU draw to the
    GPU was most of a private step there (ResNet-18: 166 of 194 ms on an H200).  GPU runs therefore draw other
    numbers than CPU runs (they never agreed bit for bit on a GPU: float arithmetic differs there); the reproducible
    mode stays reproducible on the same device.  ``out`` gives the same numbers as a new tensor, bit for bit.

    Parameters
    ----------
    d : int
        Length of the vector (>= 0).
    std : float
        Standard deviation per coordinate (>= 0), in the units of the vector it is added to.
        ``std == 0`` returns zeros and draws nothing from ``generator``.
    generator : numpy.random.Generator
        The node's noise stream: ``flower_dp.rng.noise_generator(key, node, k)``.
    out : Tensor, shape (d,), optional
        Contiguous buffer of ``dtype`` on ``device`` to draw into (overwritten and returned).

    Returns
    -------
    Tensor, shape (d,), ``dtype`` on ``device`` (``out`` when given)
    """
    d = check_int("d", d, minimum=0)
    std = check_nonnegative("std", std, hint="std is a standard deviation; 0 means no noise")
    if out is not None and (tuple(out.shape) != (d,) or out.dtype != dtype or out.device.type != torch.device(device).type
                            or not out.is_contiguous()):
        raise ValueError(f"out must be a contiguous ({d},) {dtype} tensor on {device!r}, got shape {tuple(out.shape)}, "
                         f"{out.dtype} on {out.device}; pass a buffer of the noise's shape")
    if std == 0.0:
        return torch.zeros(d, dtype=dtype, device=device) if out is None else out.zero_()
    if not isinstance(generator, np.random.Generator):
        raise TypeError(f"generator must be a numpy.random.Generator, got {type(generator).__name__}; use "
                        "flower_dp.rng.noise_generator(key, node, k) with key = node_secret(...)")
    # float64 whatever ``dtype``: a float32 sampler cuts the tail (torch's at 5.77 std, from 24-bit uniforms), an
    # output region a neighbouring input reaches and this one cannot: a delta no Gaussian accountant charges.
    if _is_cuda(device):
        # a 64-bit Philox seed from the node's secret stream (keyed by its 256-bit secret and (node, k))
        g = torch.Generator(device=device)
        g.manual_seed(int(generator.integers(0, 2**64, dtype=np.uint64)))
        z_dev = torch.randn(d, dtype=torch.float64, device=device, generator=g)
        z_dev.mul_(std)
        if out is not None:
            return out.copy_(z_dev)  # rounded as .to(dtype) rounds: the new tensor's numbers, bit for bit
        return z_dev if dtype == torch.float64 else z_dev.to(dtype)
    z = _scratch(d)
    generator.standard_normal(out=z)
    return _scaled(z, std, dtype, device, out)


def _scaled(z: np.ndarray, std: float, dtype: torch.dtype, device, out: torch.Tensor | None) -> torch.Tensor:
    """``std * z`` (``z`` standard normals in float64, scaled in place) rounded to ``dtype``, in new memory or ``out``."""
    z *= std
    draw = torch.from_numpy(z)
    if out is not None:
        return out.copy_(draw)  # rounded to out's dtype as .to(dtype) rounds: the new tensor's numbers, bit for bit
    return draw.to(device=device, dtype=dtype, copy=True)  # own memory (z is a reused buffer)


_EXECUTOR: ThreadPoolExecutor | None = None
_EXECUTOR_LOCK = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    """The process's noise thread (one worker: numpy fills arrays without the GIL, so it runs beside torch)."""
    global _EXECUTOR
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flower-dp-noise")
        return _EXECUTOR


def _forget_executor() -> None:  # a forked child has none of its parent's threads: it makes its own
    global _EXECUTOR, _EXECUTOR_LOCK
    _EXECUTOR, _EXECUTOR_LOCK = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_executor)


def _fill(generator: np.random.Generator, buf: np.ndarray) -> np.ndarray:
    generator.standard_normal(out=buf)
    return buf


class NoisePrefetcher:
    """One node's Gaussian noise with the next iteration's draw made ahead, on a background thread.

    :meth:`noise` returns exactly what :func:`gaussian_noise` returns for the same stream, bit for bit: the
    standard normals of stream ``(key, node, k)`` are the first ``d`` draws of
    ``flower_dp.rng.noise_generator(key, node, k)`` whichever thread makes them, and the scaling and the rounding
    happen at release time, with the std of that release.  Given ``next_k``, it then starts drawing the standard
    normals of ``(key, node, next_k)`` into its own float64 buffer (``8 d`` bytes per node) on the process's noise
    thread, so the next release finds them drawn while this node (or the others of the process) computed its
    gradients: numpy fills the array without holding the GIL.  A draw made ahead for another key (a node restored
    from a checkpoint draws from a fresh secret), another iteration or another length is dropped, never used.
    What is drawn ahead never leaves the node and nothing is charged for it: a release is charged when it is made.

    ``streams`` is the function of the noise streams, ``streams(key, node, k) -> numpy Generator``: pass
    :func:`flower_dp.rng.noise_generator` (given, not imported here: ``flower_dp.rng`` names this module's samplers
    in its records, so this module must not import it back).

    CPU only: nodes on a CUDA device draw on the device (:func:`gaussian_noise`), already asynchronously.
    """

    def __init__(self, streams: Callable[[object, int, int], np.random.Generator]) -> None:
        if not callable(streams):
            raise TypeError(f"streams must be callable, got {type(streams).__name__}; pass "
                            "flower_dp.rng.noise_generator (the node's noise streams)")
        self._streams = streams
        self._buf: np.ndarray | None = None
        self._pending: tuple[object, int, int, int, Future] | None = None  # (key, node, k, d, future)

    def _take(self, key, node: int, k: int, d: int) -> np.ndarray | None:
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        pkey, pnode, pk, pd, fut = pending
        z = fut.result()  # also when it is dropped: the buffer is free again once the draw is over
        return z if (pkey is key and pnode == node and pk == k and pd == d) else None

    def noise(self, key, node: int, k: int, std: float, d: int, *, next_k: int | None = None,
              dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``N(0, std^2 I_d)`` of stream ``(key, node, k)`` on the CPU (as :func:`gaussian_noise`), then the draw of
        ``(key, node, next_k)`` started in the background when ``next_k`` is given and ``std > 0``."""
        d = check_int("d", d, minimum=0)
        std = check_nonnegative("std", std, hint="std is a standard deviation; 0 means no noise")
        z = self._take(key, node, k, d)
        if std == 0.0:
            return torch.zeros(d, dtype=dtype)
        if z is None:
            if self._buf is None or self._buf.shape[0] != d:
                self._buf = np.empty(d, dtype=np.float64)
            z = _fill(self._streams(key, node, k), self._buf)
        out = _scaled(z, std, dtype, "cpu", None)
        if next_k is not None:
            self._pending = (key, int(node), int(next_k), d,
                             _executor().submit(_fill, self._streams(key, node, next_k), z))
        return out

    def cancel(self) -> None:
        """Drop the draw made ahead (waits for it to end, so the buffer is free)."""
        if self._pending is not None:
            self._pending[-1].result()
            self._pending = None


def laplace_noise(
    d: int, scale: float, generator: torch.Generator, *, dtype: torch.dtype = torch.float32, device="cpu"
) -> torch.Tensor:
    """i.i.d. ``Laplace(0, scale)`` noise (density ``exp(-|t|/scale) / (2 scale)``).

    Drawn as the difference of two independent ``Exp(1)`` vectors times ``scale`` (exact,
    no inverse-CDF edge cases), so ``E|n| = scale`` and ``std = sqrt(2) scale``.

    Parameters
    ----------
    d : int
        Length of the vector (>= 0).
    scale : float
        Laplace scale ``b`` (>= 0; DPPS's ``S/b``).  0 returns zeros and draws nothing.
    generator : torch.Generator

    Returns
    -------
    Tensor, shape (d,), ``dtype`` on ``device``
    """
    d = check_int("d", d, minimum=0)
    scale = check_nonnegative("scale", scale, hint="scale is the Laplace b; 0 means no noise")
    if scale == 0.0:
        return torch.zeros(d, dtype=dtype, device=device)
    _check_gen(generator, device)
    e1 = torch.empty(d, dtype=dtype, device=device).exponential_(1.0, generator=generator)
    e2 = torch.empty(d, dtype=dtype, device=device).exponential_(1.0, generator=generator)
    return e1.sub_(e2).mul_(scale)
