"""The exact-noise mode's cost: discrete Gaussian samples per second per core, and the exact private step.

``python -m benchmarks --only exact_noise``.  Samples/s at sigma in {1, 10, 1e3, 1e6} grid units: our exact sampler
(:func:`flower_dp.mechanisms.discrete_gaussian.discrete_gaussian`: ChaCha20 keystream + CKS in integers; numba when
installed), numpy's float64 ziggurat (SFC64) beside it, and OpenDP's discrete Gaussian when ``opendp`` imports (its
``make_gaussian`` on an integer vector domain; null with the reason otherwise).  The private step: one exact release
(per-sample clipped gradients, conditional randomised rounding, discrete Gaussian; ``noise_sampler="exact"``) over
the non-private step, for the CNN and the MLP at B 64, beside the float mode's (ghost clipping + float Gaussian).
Minimum of interleaved repeats, one torch thread.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

from ._common import interleaved_times

__all__ = ["run", "SIGMAS"]

SIGMAS = (1.0, 10.0, 1e3, 1e6)


def _rate(fn, n: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(n)
        best = min(best, time.perf_counter() - t0)
    return n / best


def _opendp(sigma: float, n: int):
    """OpenDP's discrete Gaussian on n integers, or None and why."""
    try:
        import opendp.prelude as dp
    except Exception as exc:  # noqa: BLE001
        return None, f"opendp not importable: {type(exc).__name__}: {exc}"
    dp.enable_features("contrib")
    space = dp.vector_domain(dp.atom_domain(T=int)), dp.l2_distance(T=int)
    meas = space >> dp.m.then_gaussian(scale=sigma)
    return (lambda m: meas([0] * m)), getattr(dp, "__version__", None) or "opendp"


def run(quick: bool = False) -> dict:
    from flower_dp.mechanisms.discrete_gaussian import _kernel, discrete_gaussian
    from flower_dp.rng import exact_noise_stream

    _kernel()
    discrete_gaussian(100, 3.0, exact_noise_stream(7, 0, 0))  # numba compiles at the first call: outside the timing
    n = 20_000 if quick else 1_000_000
    reps = 1 if quick else 3
    out: dict = {"exact": {}, "numpy_float_ziggurat": {}, "opendp": {}}
    key = [0]

    def exact(sigma):
        def draw(m):
            key[0] += 1
            return discrete_gaussian(m, sigma, exact_noise_stream(7, 0, key[0]))
        return draw

    for sigma in SIGMAS:
        out["exact"][f"{sigma:g}"] = round(_rate(exact(sigma), n, reps))
    g = np.random.Generator(np.random.SFC64(0))
    buf = np.empty(n)
    out["numpy_float_ziggurat"]["any"] = round(_rate(lambda m: g.standard_normal(out=buf[:m]), n, reps))
    n_odp = 2_000 if quick else 20_000
    for sigma in SIGMAS:
        try:
            fn, version = _opendp(sigma, n_odp)
        except Exception as exc:  # noqa: BLE001
            fn, version = None, f"opendp failed: {type(exc).__name__}: {exc}"
        out["opendp"][f"{sigma:g}"] = round(_rate(fn, n_odp, reps)) if fn is not None else None
        out["opendp_version"] = version
    out["exact_best_over_numpy"] = round(max(out["exact"].values()) / out["numpy_float_ziggurat"]["any"], 4)
    out["steps"] = _steps(quick)
    return out


def _steps(quick: bool) -> dict:
    from flower_dp.mechanisms.clipping import per_sample_clipped_grads
    from flower_dp.mechanisms.exact_release import exact_release
    from flower_dp.mechanisms.ghost_clipping import ghost_clipped_grad_sum
    from flower_dp.mechanisms.noise import gaussian_noise
    from flower_dp.models import build_model
    from flower_dp.rng import exact_noise_stream, noise_generator, numpy_rng

    models = {"cnn": "shallow_cnn", "mlp": "mlp_2layer"}
    batch = 8 if quick else 64
    out = {}
    for short, name in models.items():
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(batch, 1, 28, 28, generator=gen)
        y = torch.randint(0, 10, (batch,), generator=gen)
        model = build_model(name, seed=0)
        d = sum(p.numel() for p in model.parameters())
        k = [0]

        def nonprivate():
            model.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()

        def float_step():
            gsum, _ = ghost_clipped_grad_sum(model, F.cross_entropy, x, y, 1.0)
            k[0] += 1
            gsum.add_(gaussian_noise(d, 1.0, noise_generator(3, 0, k[0])))

        def exact_step():
            rows, _ = per_sample_clipped_grads(model, F.cross_entropy, x, y, 1.0)
            k[0] += 1
            m, gamma, _, _ = exact_release(rows, 1.0, 1.0, numpy_rng(3, 0, "noise", k[0]),
                                           exact_noise_stream(3, 0, k[0]))
            torch.from_numpy(m.astype(np.float64) * (gamma / batch))

        def noise_only():
            from flower_dp.mechanisms.discrete_gaussian import discrete_gaussian
            from flower_dp.mechanisms.exact_release import grid_scale

            k[0] += 1
            discrete_gaussian(d, 1.0 / grid_scale(1.0, d), exact_noise_stream(3, 0, k[0]))

        times = interleaved_times({"nonprivate": nonprivate, "float": float_step, "exact": exact_step,
                                   "exact_noise_only": noise_only}, repeats=2 if quick else 8)
        best = {kk: min(v) for kk, v in times.items()}
        out[f"{short}_b{batch}"] = {
            "d": d,
            "nonprivate_ms": round(best["nonprivate"] * 1e3, 3),
            "float_ms": round(best["float"] * 1e3, 3),
            "exact_ms": round(best["exact"] * 1e3, 3),
            "exact_noise_only_ms": round(best["exact_noise_only"] * 1e3, 3),
            "ratio_float": round(best["float"] / best["nonprivate"], 3),
            "ratio_exact": round(best["exact"] / best["nonprivate"], 3),
            "exact_over_float": round(best["exact"] / best["float"], 3),
        }
    return out
