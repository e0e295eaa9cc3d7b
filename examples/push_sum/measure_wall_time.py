"""Wall time of the same 8-node run in-process and as a Flower simulation on Ray (issue 5 note).

    .venv/bin/python examples/push_sum/measure_wall_time.py --iters 60 --per-round 20

Runs the quickstart config (Dyn-D2P, 8 nodes, Fashion-MNIST, shallow CNN) with fewer iterations,
first with the in-process runner, then with PushSumStrategy under ``run_simulation`` (Ray host
actors, loopback only, no dashboard), and prints the wall times, the strategy's own timings
(backend start, first registration = building the nodes on their hosts, gossip segments) and
Flower's fixed cost (run_simulation wall time minus the strategy's ``start``).  Both runs
evaluate the network-average model on the same test samples after every round.
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--per-round", type=int, default=20)
    ap.add_argument("--hosts", type=int, default=2)
    args = ap.parse_args()

    import torch

    from flower_dp.experiments import load_config, run_experiment
    from flower_dp.experiments.cli_run import builtin_config_path

    cfg = load_config(builtin_config_path("quickstart"), {"run.num_iters": args.iters, "run.eval_every": args.per_round,
                                                          "run.progress": False, "run.checkpoint": False,
                                                          "run.reproducible": True})  # same_accuracy: seeded mode
    torch.set_num_threads(1)  # the host actors use one thread each
    from flower_dp.clients.push_sum_app import spec_from_config

    t = time.perf_counter()
    spec_from_config(cfg)  # the privacy calibration, once (cached for both runs below)
    calib = time.perf_counter() - t
    t = time.perf_counter()
    ref = run_experiment(cfg, out_dir=None, progress=False)
    inproc = time.perf_counter() - t

    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    from flower_dp.clients.push_sum_app import make_client_app
    from flower_dp.data import load_dataset
    from flower_dp.experiments.runner import evaluate_params
    from flower_dp.models import build_model
    from flower_dp.strategies.push_sum import PushSumStrategy

    t = time.perf_counter()
    spec = spec_from_config(cfg)
    plan_s = time.perf_counter() - t
    test = load_dataset("fashion_mnist", train=False)
    m = int(cfg.data["test_samples"])
    model = build_model(cfg.model["name"], num_classes=10, seed=int(cfg.run["seed"]))
    seen: dict = {}
    server = ServerApp()

    @server.main()
    def run(grid: Grid, context: Context) -> None:
        seen["main_started"] = time.perf_counter()

        def evaluate(rnd, avg):
            acc, loss = evaluate_params(model, avg, test.x[:m], test.y[:m])
            return {"acc_avg": acc, "test_loss_avg": loss}

        strat = PushSumStrategy(cfg.n_nodes, spec, num_iters=spec["plan"].num_iters, iters_per_round=args.per_round,
                                evaluate_fn=evaluate, checkpoint=False, max_retries=0,
                                backend_kwargs={"num_hosts": args.hosts})
        strat.start(grid)
        seen["strategy"] = strat

    from flower_dp._ray_local import use_loopback

    use_loopback()  # the simulation's Ray binds 127.0.0.1
    t = time.perf_counter()
    run_simulation(server_app=server, client_app=make_client_app(), num_supernodes=cfg.n_nodes,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"_node_ip_address": "127.0.0.1"}})
    flower = time.perf_counter() - t
    strat = seen["strategy"]
    tm = strat.timings
    out = {
        "iters": spec["plan"].num_iters, "per_round": args.per_round, "hosts": args.hosts,
        "plan_calibration_s (once, before both runs)": round(calib, 2),
        "inprocess_s": round(inproc, 2),
        "flower_total_s": round(flower, 2),
        "flower_server_plan_s": round(plan_s, 2),
        "flower_fixed_s (run_simulation minus strategy.start)": round(flower - tm["total_s"], 2),
        "until_main_s": round(seen["main_started"] - t, 2),
        "wait_for_flower_ray_s": round(tm.get("wait_for_ray_s", 0), 2),
        "backend_start_s (incl. that wait)": round(tm.get("backend_start_s", 0), 2),
        "first_registration_s (nodes built on hosts)": round(tm.get("register_first_round_s", 0), 2),
        "gossip_s": round(tm.get("gossip_s", 0), 2),
        "rest_s (evaluation, privacy reports, per-round registration)": round(
            tm["total_s"] - tm.get("backend_start_s", 0) - tm.get("register_first_round_s", 0) - tm.get("gossip_s", 0), 2),
        "strategy_total_s": round(tm["total_s"], 2),
        "same_accuracy": [h["eval"]["acc_avg"] for h in strat.history] == [h["acc_avg"] for h in ref.history],
        "acc_inprocess": [h["acc_avg"] for h in ref.history],
        "acc_flower": [h["eval"]["acc_avg"] for h in strat.history],
    }
    print("WALL_TIME " + json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
