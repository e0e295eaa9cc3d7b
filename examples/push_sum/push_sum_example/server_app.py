"""ServerApp: one Flower round = one segment of ``iters-per-round`` gossip iterations."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from flower_dp.strategies import PushSumStrategy

app = ServerApp()
log = logging.getLogger(__name__)


def _config_path(name: str) -> Path:
    """A paper config shipped here (``configs/NAME.toml``: dyn_d2p, privsgp_vr, dp_csgp, partpsp), a flower-dp
    built-in (quickstart), or a path."""
    here = Path(__file__).parent / "configs" / f"{name}.toml"
    if here.is_file():
        return here
    if Path(name).suffix:
        return Path(name)
    from flower_dp.experiments.cli_run import builtin_config_path

    return builtin_config_path(name)


def _spec(cfg: dict) -> tuple[dict, int, object]:
    """(node spec, K, evaluate_fn) from the run config."""
    n = int(cfg["n-nodes"])
    if cfg["experiment"] == "toy":
        spec = {"builder": "toy", "n_nodes": n, "topology": "random_irregular", "topology_kwargs": {"seed": 0},
                "node_kwargs": {"dim": 16, "seed": 0}}
        return spec, int(cfg["num-iters"]), None
    from flower_dp.clients import spec_from_config
    from flower_dp.data import load_dataset
    from flower_dp.experiments import evaluate_params, load_config
    from flower_dp.models import build_model

    ecfg = load_config(_config_path(cfg["experiment"])).with_overrides(
        {"topology.n_nodes": n, "run.num_iters": int(cfg["num-iters"])})
    spec = spec_from_config(ecfg)
    test = load_dataset(ecfg.data["dataset"], train=False, root=ecfg.data["root"])
    m = int(ecfg.data["test_samples"] or len(test.y))
    model = build_model(ecfg.model["name"], num_classes=test.num_classes, seed=int(ecfg.run["seed"]),
                        **{k: v for k, v in ecfg.model.items() if k != "name"})

    def evaluate(rnd, avg):
        acc, loss = evaluate_params(model, avg, test.x[:m], test.y[:m])
        return {"acc_avg": acc, "test_loss_avg": loss}

    return spec, int(spec["plan"].num_iters), evaluate


def _ray_kwargs(cfg: dict) -> dict:
    """Host actors; ``ray-address`` (run config, default empty): the Ray cluster every SuperNode joins on Flower's
    deployment engine (``"auto"`` or ``"HOST:PORT"``; empty: ``RAY_ADDRESS``, or the simulation's own Ray)."""
    kw = {"num_hosts": int(cfg["num-hosts"]), "num_gpus_per_host": float(cfg["num-gpus-per-host"])}
    if str(cfg.get("ray-address", "")).strip():
        kw["address"] = str(cfg["ray-address"]).strip()
    return kw


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = dict(context.run_config)
    spec, K, evaluate = _spec(cfg)
    strategy = PushSumStrategy(
        int(cfg["n-nodes"]), spec, num_iters=K, iters_per_round=int(cfg["iters-per-round"]),
        transport=str(cfg["transport"]), evaluate_fn=evaluate, out_dir=str(cfg["out-dir"]) or None,
        timeout_s=float(cfg["timeout-s"]),
        backend_kwargs=_ray_kwargs(cfg) if cfg["transport"] == "ray" else None,
    )
    strategy.start(grid)
    print("PUSH_SUM_DONE " + json.dumps({"history": strategy.history[-1], "timings": strategy.timings}))
