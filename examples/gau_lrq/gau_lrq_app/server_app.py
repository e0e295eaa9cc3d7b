"""The ServerApp: GauLRQ (or a baseline) on LeNet, server-side evaluation on the test split."""

from __future__ import annotations

from pathlib import Path

from flwr.app import ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from flower_dp.experiments.gau_lrq import evaluate_fn
from flower_dp.strategies import GauLRQ

from .task import ensure_secret_file, model_to_arrays, new_model

app = ServerApp()


def make_strategy(rc: dict, *, secret_file: str, out_dir: str | None = None, key_dir: str | None = None) -> GauLRQ:
    """GauLRQ from a run config (keys as in pyproject.toml [tool.flwr.app.config]); ``key_dir``: where GauLRQ writes
    each client's own key file (the ClientApps read it through run config ``lrq-key-dir``)."""
    z = float(rc.get("noise-multiplier", 0.0))
    return GauLRQ(num_clients=int(rc["num-clients"]), clients_per_round=int(rc["clients-per-round"]),
                  clip=float(rc["clip"]), num_rounds=int(rc["num-rounds"]), epsilon=float(rc["epsilon"]),
                  delta=float(rc["delta"]), method=str(rc["method"]), tau=float(rc.get("tau", 1.0)),
                  noise_multiplier=z if z > 0 else None, secret_file=secret_file, key_dir=key_dir, out_dir=out_dir,
                  fraction_evaluate=0.0,  # as with FedAvg: this ClientApp has no evaluate(); the server evaluates
                  run_info={"dataset": str(rc.get("dataset", "fashion_mnist")), "model": "lenet",
                            "local_steps": int(rc.get("local-steps", 16)), "lr": float(rc.get("lr", 0.01)),
                            "seed": int(rc.get("seed", 0))})


TRAIN_KEYS = ("dataset", "per-class", "local-steps", "lr", "seed")


def train_config(rc: dict) -> ConfigRecord:
    """Training hyperparameters the ClientApp reads from each train message."""
    return ConfigRecord({k: rc[k] for k in TRAIN_KEYS if k in rc})


@app.main()
def main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    secret_file = ensure_secret_file(str(rc["lrq-secret-file"]))
    out = Path(str(rc.get("out-dir", "gau_lrq_results"))).resolve() / str(rc["method"])
    # simulation: GauLRQ writes each client's key into lrq-key-dir; deployment (lrq-key-dir=''): the SuperNodes were
    # given their own key files (flower-dp lrq-keys, --node-config lrq-key-file=...)
    key_dir = str(rc.get("lrq-key-dir", "")) or None
    strategy = make_strategy(rc, secret_file=secret_file, out_dir=str(out), key_dir=key_dir)
    strategy.start(grid=grid, initial_arrays=model_to_arrays(new_model(seed=int(rc.get("seed", 0)))),
                   num_rounds=int(rc["num-rounds"]), train_config=train_config(rc),
                   timeout=float(rc.get("round-timeout-s", 600.0)),
                   evaluate_fn=evaluate_fn(str(rc.get("dataset", "fashion_mnist")), int(rc.get("test-samples", 2000))))
