"""The floor the noise puts under a private step on the CPU, measured: ``python -m benchmarks.noise_floor [OUT.json]``.

Three figures for the MLP's noise vector (d = 101,770, the 784-128-10 net):

- ``draw_ms``: one draw of numpy's float64 ziggurat into a reused buffer, for each bit generator numpy ships
  (SFC64 is the one :func:`flower_dp.rng.noise_generator` uses), and the cost of making a node's generator
  (``SeedSequence`` from the 256-bit key) and of scaling and rounding a draw to float32;
- ``step_ms``: the median non-private MLP step (B = 64, 1 torch thread) alone, then beside a continuous draw on a
  second thread, then alone again: whether drawing the noise ahead on the other core slows the step down;
- ``floor_ratio``: draw / non-private step: how far below this a private step cannot go with its noise drawn ahead
  (one draw per step on one noise thread), whatever the clipping costs.

Minimum and median over ``repeats`` calls; one run, no timed assertion anywhere.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import numpy as np
import torch
import torch.nn.functional as F

D_MLP = 101_770


def _times(fn, repeats: int) -> dict[str, float]:
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return {"min_ms": round(ts[0] * 1e3, 4), "median_ms": round(ts[len(ts) // 2] * 1e3, 4)}


def run(repeats: int = 200, d: int = D_MLP) -> dict:
    from flower_dp.models import build_model
    from flower_dp.rng import node_secret, noise_generator

    torch.set_num_threads(1)
    buf = np.empty(d)
    out: dict = {"d": d, "repeats": repeats, "draw_ms": {}}
    key, k = node_secret(False, 0), [0]

    def make():
        k[0] += 1
        return noise_generator(key, 0, k[0])

    out["make_generator_ms"] = _times(make, repeats)
    for name, bitgen in (("SFC64", None), ("PCG64", np.random.PCG64), ("PCG64DXSM", np.random.PCG64DXSM),
                         ("Philox", np.random.Philox), ("MT19937", np.random.MT19937)):
        g = make() if bitgen is None else np.random.Generator(bitgen(1))
        out["draw_ms"][name] = _times(lambda g=g: g.standard_normal(out=buf), repeats)
    out["scale_and_round_ms"] = _times(lambda: torch.from_numpy(buf * 0.7).to(torch.float32), repeats)

    model = build_model("mlp_2layer", seed=0)
    x, y = torch.randn(64, 784), torch.randint(0, 10, (64,))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(50):
        step()
    alone = _times(step, 2 * repeats)
    stop, g = threading.Event(), make()

    def draw_forever():
        while not stop.is_set():
            g.standard_normal(out=np.empty(d))

    th = threading.Thread(target=draw_forever, daemon=True)
    th.start()
    beside = _times(step, 2 * repeats)
    stop.set()
    th.join()
    out["step_ms"] = {"alone": alone, "beside_a_draw": beside, "alone_again": _times(step, 2 * repeats)}
    base = min(out["step_ms"]["alone"]["median_ms"], out["step_ms"]["alone_again"]["median_ms"])
    out["floor_ratio_b64"] = round(out["draw_ms"]["SFC64"]["median_ms"] / base, 3)
    out["interference_ratio"] = round(out["step_ms"]["beside_a_draw"]["median_ms"] / base, 3)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    doc = run()
    text = json.dumps(doc, indent=1)
    if argv:
        with open(argv[0], "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
