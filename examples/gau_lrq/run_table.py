"""All six methods of the Gau-LRQ paper (Table IV) at a small scale, printed as a table.

    python examples/gau_lrq/run_table.py --out results/gau_lrq_table \
        --num-clients 40 --clients-per-round 10 --num-rounds 15 --noise-multiplier 0.05 --lr 0.05

Every method runs with the real GauLRQ strategy and client mod (``--backend inprocess``: in this
process, fast; ``--backend simulation``: a Flower simulation on Ray).  Defaults come from
pyproject.toml [tool.flwr.app.config]; flags override them.  With ``--noise-multiplier`` > 0 and
no ``--target-epsilon`` the private methods run at that z and Dynamic Gau-LRQ (tau = 0.9, Table II)
is calibrated to the same rigorous eps.  Writes <out>/<method>/results.json, <out>/table.json and
<out>/table.md.  Library form: :func:`flower_dp.experiments.gau_lrq.run_table`.
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

from flower_dp.experiments.gau_lrq import run_table

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> None:
    rc = dict(tomllib.loads((HERE / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gau_lrq_table")
    ap.add_argument("--backend", default="inprocess", choices=("inprocess", "simulation"))
    ap.add_argument("--target-epsilon", type=float, default=None,
                    help="calibrate every private method to this client-level eps (instead of a fixed z)")
    ap.add_argument("--model", default="lenet")
    for k, v in rc.items():
        if k not in ("method", "tau", "out-dir", "lrq-secret-file", "lrq-key-dir", "epsilon"):
            ap.add_argument(f"--{k}", type=type(v), default=v)
    a = vars(ap.parse_args(argv))
    z = float(a["noise_multiplier"])
    table = run_table(a["out"], num_clients=a["num_clients"], clients_per_round=a["clients_per_round"],
                      num_rounds=a["num_rounds"], local_steps=a["local_steps"], lr=a["lr"], clip=a["clip"],
                      epsilon=a["target_epsilon"], delta=a["delta"],
                      noise_multiplier=z if z > 0 and a["target_epsilon"] is None else None,
                      dataset=a["dataset"], model=a["model"], per_class=a["per_class"],
                      test_samples=a["test_samples"], seed=a["seed"], backend=a["backend"])
    print(table["markdown"])


if __name__ == "__main__":
    main()
