"""A/B of the DP step's noise: numpy's float64 ziggurat rounded to float32 (what nodes draw since issue 16), torch's
float64 Box-Muller (what they drew from 4575d7e until then) and torch's float32 sampler (before; cut at 5.77 std).

``python -m benchmarks.noise_dtype_ab [ROUNDS]`` (default 60; not part of the suite).  One interleaved loop in a
shuffled order (``_common.interleaved_times``), 1 torch thread: for d of the 784-128-10 net (101,770) and of the
shallow CNN (582,026), the noise as drawn now (``gaussian_noise(..., out=buf)`` from ``noise_generator(key, 0, k)``),
and ``torch.randn`` in float64 (rounded into the buffer) and in float32 into the buffer on the per-iteration stream
``torch_generator(key, 0, "noise", k)``, beside the B = 64 non-private
step, the ghost clipping alone and the DP step of :func:`benchmarks.private_step.make_steps`.  Prints min and
median ms of each.
"""

from __future__ import annotations

import statistics
import sys

import torch

from ._common import interleaved_times
from .private_step import make_steps


def run(reps: int = 60) -> dict[str, tuple[float, float]]:
    """(min ms, median ms) of each callable (see the module docstring)."""
    from flower_dp.mechanisms.noise import gaussian_noise
    from flower_dp.rng import noise_generator, node_secret, torch_generator

    torch.set_num_threads(1)
    key = node_secret(False, 0)
    fns = {}
    for name, model, d in (("mlp", "mlp_2layer", 101770), ("cnn", "shallow_cnn", 582026)):
        buf, k = torch.empty(d), [0]

        def now(d=d, buf=buf, k=k):
            k[0] += 1
            return gaussian_noise(d, 1.0, noise_generator(key, 0, k[0]), out=buf)

        def t64(d=d, buf=buf, k=k):
            k[0] += 1
            return buf.copy_(torch.randn(d, generator=torch_generator(key, 0, "noise", k[0]), dtype=torch.float64))

        def f32(d=d, buf=buf, k=k):
            k[0] += 1
            return torch.randn(d, generator=torch_generator(key, 0, "noise", k[0]), out=buf)

        fns[f"{name}_noise_float64_now"] = now
        fns[f"{name}_noise_float64_torch_before"] = t64
        fns[f"{name}_noise_float32_randn"] = f32
        st = make_steps(model, 64)
        fns[f"{name}_nonprivate_b64"] = st["nonprivate"]
        fns[f"{name}_clip_fast_only_b64"] = st["clip_fast_only"]
        fns[f"{name}_dp_fast_b64"] = st["dp_fast"]
    t = interleaved_times(fns, repeats=reps, shuffle_seed=1)
    return {k: (min(v) * 1e3, statistics.median(v) * 1e3) for k, v in t.items()}


if __name__ == "__main__":
    for k, (lo, med) in run(int(sys.argv[1]) if len(sys.argv) > 1 else 60).items():
        print(f"{k:28s} min {lo:8.3f} ms  median {med:8.3f} ms")
