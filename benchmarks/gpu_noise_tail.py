"""The Gaussian tail of the nodes' noise, counted: ``python -m benchmarks.gpu_noise_tail DRAWS OUT.json [--device D]``.

Draws ``DRAWS`` N(0, 1) values with :func:`flower_dp.mechanisms.noise.gaussian_noise` exactly as a node draws them
(a fresh secret key, one stream per chunk of 1e8, float64 kept) and counts the draws beyond 3, 4, 4.5, 5, 5.5, 6 and
6.5 std against their expectation ``DRAWS * erfc(c / sqrt 2)`` (with the deviation in Poisson standard deviations),
the largest ``|z|``, and the first moments.  A sampler that cuts or thins its tail (torch's float32 sampler stops
at 5.77 std) shows as a deficit in the high rows.  On an NVIDIA H200, 5e10 CUDA draws take ~9 s
(``docs/benchmarks/gpu_noise_tail_h200.json``); on a CPU keep DRAWS near 1e8-1e9.
"""

from __future__ import annotations

import argparse
import json
import math
import secrets
import time

import torch

from flower_dp.mechanisms.noise import gaussian_noise, gaussian_sampler
from flower_dp.rng import NodeKey, noise_generator

CUTS = (3.0, 4.0, 4.5, 5.0, 5.5, 6.0, 6.5)
CHUNK = 100_000_000


def count_tail(draws: int, device: str = "cuda", chunk: int = CHUNK, *, cuts: tuple[float, ...] = CUTS,
               key: NodeKey | None = None) -> dict:
    """Tail counts of ``draws`` noise values drawn on ``device`` beyond each of ``cuts`` (see the module docstring);
    ``key`` defaults to a fresh secret."""
    key = NodeKey(secrets.randbits(256), reproducible=False) if key is None else key
    counts = dict.fromkeys(cuts, 0)
    n = k = 0
    top = s1 = s2 = s4 = 0.0
    t0 = time.perf_counter()
    while n < draws:
        m = min(chunk, draws - n)
        z = gaussian_noise(m, 1.0, noise_generator(key, 0, k), dtype=torch.float64, device=device)
        a = z.abs()
        for c in cuts:
            counts[c] += int((a > c).sum())
        top = max(top, float(a.max()))
        s1, s2, s4 = s1 + float(z.sum()), s2 + float((z * z).sum()), s4 + float((z**4).sum())
        n, k = n + m, k + 1
        del z, a
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    expect = {c: n * math.erfc(c / math.sqrt(2)) for c in cuts}
    return {"device": device, "sampler": gaussian_sampler(device), "draws": n, "seconds": time.perf_counter() - t0,
            "max_abs": top, "mean": s1 / n, "var": s2 / n, "fourth_moment": s4 / n,
            "beyond": {str(c): {"count": counts[c], "expected": expect[c],
                                "poisson_sd": (counts[c] - expect[c]) / math.sqrt(expect[c])} for c in cuts}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_noise_tail", description=__doc__.split("\n\n")[0])
    parser.add_argument("draws", type=float, help="how many draws (e.g. 5e10 on a GPU, 1e8 on a CPU)")
    parser.add_argument("out", help="JSON file to write")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    if args.draws < 1:
        parser.error(f"draws must be >= 1, got {args.draws:g}")
    res = count_tail(int(args.draws), args.device)
    print(json.dumps(res, indent=1))
    with open(args.out, "w") as fh:
        json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
