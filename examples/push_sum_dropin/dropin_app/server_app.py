"""ServerApp.  Before (FedAvg):

    strategy = FedAvg(fraction_train=1.0)
    strategy.start(grid=grid, initial_arrays=ArrayRecord(Net().state_dict()), num_rounds=3)

After: the same Net, Dyn-D2P with a rigorous (eps, delta) per node, one round = a gossip segment.
"""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from flower_dp.clients import plan_spec
from flower_dp.strategies import PushSumStrategy

from .task import NUM_PARTITIONS, SAMPLES, Net

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = {"num-iters": 12, "iters-per-round": 4, "out-dir": "dropin_results", "reproducible": False,
           **dict(context.run_config)}
    # reproducible = false: each node's noise and batches come from its own secret (OS entropy);
    # true: the seeded simulation mode (same numbers every run; private only against whoever lacks the seed)
    spec = plan_spec("dyn_d2p", {"variant": "dyn", "epsilon": 3.0, "delta": 1e-4, "lr": 0.1, "batch_size": 8},
                     n_nodes=NUM_PARTITIONS, model_fn=Net, samples_per_node=SAMPLES, num_iters=int(cfg["num-iters"]),
                     topology="random_irregular", topology_kwargs={"seed": 0}, reproducible=bool(cfg["reproducible"]))
    strategy = PushSumStrategy(NUM_PARTITIONS, spec, num_iters=spec["plan"].num_iters,
                               iters_per_round=int(cfg["iters-per-round"]), out_dir=str(cfg["out-dir"]),
                               backend_kwargs={"num_hosts": 2})
    strategy.start(grid)
