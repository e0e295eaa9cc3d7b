"""A/B of ways to draw the DP step's N(0, std^2) noise (d = 101,770 float32: the 784-128-10 MLP), interleaved.

``python -m benchmarks.noise_samplers [--repeats 400] [--tails 0]``; not part of the suite (it informs the
choice of sampler, the suite times the step).  Every variant that reseeds does it the way nodes do: one
generator per iteration from the stream (node key, node, "noise", k) -- torch: ``torch_generator`` (mt19937
seeded from the stream's 63-bit seed), numpy: a bit generator on the stream's ``SeedSequence`` -- so secret
and reproducible mode keep their meaning with any of them.  ``--tails N`` also counts, over N draws of each
float32 sampler, the values beyond 5.5 sigma (N(0,1): P(|Z| > 5.5) = 3.8e-8) and the largest one.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
import torch

from ._common import interleaved_times

__all__ = ["run", "main"]

D = 101_770


def _variants(std: float = 0.7) -> dict:
    from flower_dp.mechanisms.noise import gaussian_noise
    from flower_dp.rng import PURPOSES, node_secret, noise_generator, torch_generator

    key = node_secret(False, 0)
    k = [0]
    buf_t = torch.empty(D)
    buf_n = np.empty(D, dtype=np.float32)
    view_n = torch.from_numpy(buf_n)  # zero-copy

    def nxt() -> int:
        k[0] += 1
        return k[0]

    def numpy_stream(bitgen):
        def draw():
            ss = np.random.SeedSequence(key._value, spawn_key=(3, PURPOSES["noise"], nxt()))
            np.random.Generator(bitgen(ss)).standard_normal(dtype=np.float32, out=buf_n)
            return view_n.mul_(std)
        return draw

    once_t = torch.Generator().manual_seed(1)
    once_n = np.random.Generator(np.random.SFC64(1))
    return {
        "numpy_float64_ziggurat_new_tensor (nodes)": lambda: gaussian_noise(D, std, noise_generator(key, 3, nxt())),
        "numpy_float64_ziggurat_into_buffer": lambda: gaussian_noise(D, std, noise_generator(key, 3, nxt()), out=buf_t),
        "torch_float64_box_muller (nodes until issue 16)": lambda: torch.randn(
            D, generator=torch_generator(key, 3, "noise", nxt()), dtype=torch.float64).mul_(std).float(),
        "torch_float32_box_muller (cut at 5.77 std)": lambda: torch.randn(
            D, generator=torch_generator(key, 3, "noise", nxt())).mul_(std),
        "numpy_pcg64_ziggurat": numpy_stream(np.random.PCG64),
        "numpy_sfc64_ziggurat": numpy_stream(np.random.SFC64),
        "numpy_philox_ziggurat": numpy_stream(np.random.Philox),
        "draw_only_torch": lambda: buf_t.normal_(generator=once_t),
        "draw_only_numpy_sfc64": lambda: once_n.standard_normal(dtype=np.float32, out=buf_n),
        "seed_only_torch_generator": lambda: torch_generator(key, 3, "noise", nxt()),
    }


def _tails(n: int) -> dict:
    g = torch.Generator().manual_seed(0)
    rng = np.random.Generator(np.random.SFC64(0))
    t, z = torch.empty(10_000_000), np.empty(10_000_000, dtype=np.float32)
    out = {}
    for name, draw in (("torch_float32", lambda: t.normal_(generator=g).abs().numpy()),
                       ("numpy_float32_ziggurat", lambda: np.abs(rng.standard_normal(dtype=np.float32, out=z)))):
        beyond, biggest, done = 0, 0.0, 0
        while done < n:
            a = draw()
            beyond += int((a > 5.5).sum())
            biggest = max(biggest, float(a.max()))
            done += a.size
        out[name] = {"draws": done, "beyond_5.5": beyond, "expected_beyond_5.5": round(done * 3.7976e-8, 1),
                     "max_abs": biggest}
    return out


def run(repeats: int = 400, tails: int = 0) -> dict:
    torch.set_num_threads(1)
    times = interleaved_times(_variants(), repeats=repeats, shuffle_seed=0)
    out = {"d": D, "repeats": repeats, "torch_threads": 1,
           "ms_min": {k: round(min(v) * 1e3, 4) for k, v in times.items()},
           "ms_median": {k: round(statistics.median(v) * 1e3, 4) for k, v in times.items()}}
    if tails:
        out["tails"] = _tails(tails)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.noise_samplers", description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=400)
    p.add_argument("--tails", type=int, default=0, help="also count the far tail over this many draws per sampler")
    a = p.parse_args(argv)
    with open("/proc/loadavg") as f:
        load0 = f.read().split()[:3]
    res = run(a.repeats, a.tails)
    with open("/proc/loadavg") as f:
        load1 = f.read().split()[:3]
    print(f"load average at start {load0}, at end {load1}; d = {D}; {a.repeats} interleaved rounds (random order)")
    for name in res["ms_min"]:
        print(f"  {name:32s} min {res['ms_min'][name]:7.3f} ms   median {res['ms_median'][name]:7.3f} ms")
    for name, t in (res.get("tails") or {}).items():
        print(f"  tail {name}: {t}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
