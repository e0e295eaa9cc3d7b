"""The nodes' Gaussian noise on one device: time and law (``python -m benchmarks.gpu_noise_check --device cuda
--out FILE.json``).

Times ``flower_dp.mechanisms.noise.gaussian_noise`` as a node calls it (``PushSumNode.gaussian``: a numpy generator
from ``flower_dp.rng.noise_generator(key, node, k)`` with a secret ``NodeKey``, float32 out, on the device) for
d = 101,770 / 582,026 / 11.2M (MLP / shallow CNN / ResNet-18-GN), min / median ms over synchronized repeats; then
checks the law of the device's sampler: KS p-value on 1e6 draws, counts beyond 5, 5.5 and 6 std against their
expectations (over all the tail draws), the largest |z| (CUDA: over 1e9 draws, beyond torch's float32 cut 5.77 unless by a 4e-4 chance; CPU:
1e7 draws by default, numpy's ziggurat path).  Needs torch, numpy, scipy (no flwr); the JSON is rewritten after
each section.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flower_dp.mechanisms.noise import TAIL_CUT_STD_BY_SAMPLER, gaussian_noise, gaussian_sampler
from flower_dp.rng import NodeKey, node_secret, noise_generator

SIZES = {"mlp": 101_770, "shallow_cnn": 582_026, "resnet18_gn": 11_200_000}


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_noise(device: str, d: int, repeats: int, std: float = 0.9) -> dict[str, Any]:
    """ms per call of a node's noise draw of length ``d`` (a fresh generator per k, as ``PushSumNode.gaussian``)."""
    key = node_secret(False, 0)
    buf = torch.empty(d, dtype=torch.float32, device=device)
    times = []
    for k in range(repeats + 2):  # 2 warm-up calls
        _sync(device)
        t = time.perf_counter()
        gaussian_noise(d, std, noise_generator(key, 1, k), dtype=torch.float32, device=device, out=buf)
        _sync(device)
        if k >= 2:
            times.append((time.perf_counter() - t) * 1e3)
    return {"d": d, "repeats": repeats, "min_ms": min(times), "median_ms": statistics.median(times)}


def _p_abs_beyond(t: float) -> float:
    return math.erfc(t / math.sqrt(2))


def law(device: str, total: int, chunk: int) -> dict[str, Any]:
    """KS on 1e6 draws; counts beyond 5 / 5.5 / 6 std and max |z| over ``total`` draws
    (:func:`benchmarks.gpu_noise_tail.count_tail`)."""
    from scipy import stats

    from .gpu_noise_tail import count_tail

    key = NodeKey(2 ** 255 + 12345, reproducible=False)
    std = 0.37
    ks = gaussian_noise(1_000_000, std, noise_generator(key, 3, 11), dtype=torch.float32, device=device)
    ks_p = float(stats.kstest(ks.double().cpu().numpy() / std, "norm").pvalue)
    again = gaussian_noise(1_000_000, std, noise_generator(key, 3, 11), dtype=torch.float32, device=device)
    other_k = gaussian_noise(1_000_000, std, noise_generator(key, 3, 12), dtype=torch.float32, device=device)
    buf = torch.empty(1_000_000, dtype=torch.float32, device=device)
    into = gaussian_noise(1_000_000, std, noise_generator(key, 3, 11), device=device, out=buf)
    tail = count_tail(total, device, chunk, cuts=(5.0, 5.5, 6.0), key=key)
    beyond = tail["beyond"]
    return {
        "ks_p_1e6": ks_p, "ks_ok": ks_p > 1e-3,
        "same_key_same_numbers": bool(torch.equal(ks, again)), "out_bit_identical": bool(torch.equal(into, ks)),
        "other_k_differs": not bool(torch.equal(ks, other_k)),
        "count_draws": tail["draws"], "counts_beyond": {c: v["count"] for c, v in beyond.items()},
        "expected_beyond": {c: v["expected"] for c, v in beyond.items()},
        "total_draws": tail["draws"], "max_abs_z": tail["max_abs"],
        "p_none_beyond_5.77": math.exp(-tail["draws"] * _p_abs_beyond(5.77)),
        "max_beyond_float32_cut_5.77": tail["max_abs"] > 5.77,
        "tail_draw_s": tail["seconds"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--tail-draws", type=float, default=None,
                    help="draws for the max |z| (default 1e9 on CUDA, 1e7 on the CPU)")
    args = ap.parse_args(argv)
    device = args.device
    cuda = torch.device(device).type == "cuda"
    total = int(args.tail_draws if args.tail_draws is not None else (1e9 if cuda else 1e7))
    doc: dict[str, Any] = {
        "device": device, "sampler": gaussian_sampler(device),
        "tail_cut_std": TAIL_CUT_STD_BY_SAMPLER[gaussian_sampler(device)],
        "env": {"python": sys.version.split()[0], "torch": torch.__version__, "numpy": np.__version__,
                "platform": platform.platform(),
                "gpu": torch.cuda.get_device_name(torch.device(device)) if cuda else None},
        "timing": {}, "law": None, "errors": {},
    }
    out = Path(args.out)

    def save() -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=2))

    save()
    for name, d in SIZES.items():
        try:
            doc["timing"][name] = time_noise(device, d, args.repeats)
            print(f"{name:12s} d={d:>10,d}  min {doc['timing'][name]['min_ms']:8.3f} ms  "
                  f"median {doc['timing'][name]['median_ms']:8.3f} ms", flush=True)
        except Exception as e:  # noqa: BLE001 - recorded, the other sections still run
            doc["errors"][f"timing/{name}"] = repr(e)
        save()
    try:
        doc["law"] = law(device, total, chunk=50_000_000 if cuda else 5_000_000)
        print(json.dumps(doc["law"], indent=1), flush=True)
    except Exception as e:  # noqa: BLE001
        doc["errors"]["law"] = repr(e)
    save()
    print(f"wrote {out}" + (f"; errors: {doc['errors']}" if doc["errors"] else ""), flush=True)
    return 1 if doc["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
