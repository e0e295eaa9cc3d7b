"""All six methods of the Gau-LRQ paper (Table IV) in one Flower simulation, printed as a table.

    python examples/gau_lrq/run_table.py --out results/gau_lrq_table [--num-clients 40 --clients-per-round 10 ...]

Defaults come from pyproject.toml [tool.flwr.app.config]; flags override them.  Dynamic Gau-LRQ
(tau = 0.9, Table II) is calibrated so that its rigorous eps equals the fixed scheme's.
Writes <out>/<method>/results.json and <out>/table.json, <out>/table.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from flwr.app import Context  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402

from flower_dp.strategies.baselines import client_level_epsilon  # noqa: E402
from gau_lrq_app.client_app import build_app  # noqa: E402
from gau_lrq_app.server_app import evaluate_fn, make_strategy, train_config  # noqa: E402
from gau_lrq_app.task import ensure_secret_file, model_to_arrays, new_model  # noqa: E402

ROWS = [("Local SGD", "none", 1.0), ("Gau-SGD", "gaussian", 1.0), ("QG-SGD", "qg", 1.0), ("BQ-SGD", "bq", 1.0),
        ("Gau-LRQ-SGD", "lrq", 1.0), ("Dynamic Gau-LRQ-SGD", "lrq", 0.9)]


def main() -> None:
    rc = dict(tomllib.loads((HERE / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gau_lrq_table")
    for k, v in rc.items():
        if k not in ("method", "tau", "out-dir", "lrq-secret-file"):
            ap.add_argument(f"--{k}", type=type(v), default=v)
    args = vars(ap.parse_args())
    out = Path(args.pop("out")).resolve()
    rc.update({k.replace("_", "-"): v for k, v in args.items()})
    z = float(rc["noise-multiplier"])
    eps_fixed = client_level_epsilon([z] * int(rc["num-rounds"]), float(rc["delta"]),
                                     B=int(rc["clients-per-round"]), N=int(rc["num-clients"]))
    with tempfile.TemporaryDirectory() as tmp:
        secret_file = ensure_secret_file(str(Path(tmp) / "lrq.secret"))
        strategies = []
        for name, method, tau in ROWS:
            cfg = {**rc, "method": method, "tau": tau}
            if tau < 1:  # dynamic: calibrate to the fixed scheme's rigorous eps
                cfg.update({"noise-multiplier": 0.0, "epsilon": eps_fixed * (1 + 1e-6)})
            strategies.append((name, make_strategy(cfg, secret_file=secret_file, out_dir=str(out / name.replace(" ", "_")))))
        server = ServerApp()

        @server.main()
        def _main(grid: Grid, context: Context) -> None:
            for _, s in strategies:
                s.start(grid=grid, initial_arrays=model_to_arrays(new_model(int(rc["seed"]))),
                        num_rounds=int(rc["num-rounds"]), train_config=train_config(rc),
                        evaluate_fn=evaluate_fn(str(rc["dataset"]), int(rc["test-samples"])))

        from flwr.simulation import run_simulation

        run_simulation(server_app=server, client_app=build_app(secret_file), num_supernodes=int(rc["num-clients"]),
                       backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                       "init_args": {"include_dashboard": False, "num_cpus": 2,
                                                     "_node_ip_address": "127.0.0.1"}})
    rows = []
    for name, s in strategies:
        r = s.results()
        last = r["rounds"][-1] if r["rounds"] else {}
        rows.append({"algorithm": name, "accuracy": last.get("evaluate_serverapp", {}).get("accuracy"),
                     "rounds": r["rounds_completed"], "uplink_bits": r["total_bits_algorithmic"],
                     "uplink_MB_carried": r["total_bytes_carried"] / 1e6, "eps_rigorous": r["eps_rigorous"],
                     "eps_paper": r["eps_paper"], "stop": r["stop_reason"][:40]})
    md = ["| algorithm | test acc | rounds | uplink bits | bytes carried (MB) | eps rigorous | eps paper |",
          "|---|---|---|---|---|---|---|"]
    for row in rows:
        md.append(f"| {row['algorithm']} | {row['accuracy']:.4f} | {row['rounds']} | {row['uplink_bits']:.4g} | "
                  f"{row['uplink_MB_carried']:.3f} | {row['eps_rigorous']:.4g} | {row['eps_paper']:.4g} |")
    header = (f"dataset {rc['dataset']} (offline stand-in for MNIST), LeNet, N={rc['num-clients']}, "
              f"B={rc['clients-per-round']}, K={rc['num-rounds']}, Q={rc['local-steps']}, S2={rc['clip']}, z={z}, "
              f"delta={rc['delta']}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.json").write_text(json.dumps({"setting": header, "rows": rows}, indent=2))
    (out / "table.md").write_text(header + "\n\n" + "\n".join(md) + "\n")
    print(header)
    print("\n".join(md))


if __name__ == "__main__":
    main()
