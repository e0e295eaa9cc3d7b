"""Issue 5 drop-in check: a user's Flower app (own model, own data loader) switched to PushSumStrategy.

``examples/push_sum_dropin`` is that app; its ClientApp is ``make_client_app(model_builder(Net,
load_data))`` and its ServerApp builds a ``PushSumStrategy`` from ``plan_spec(...)``.  The
Flower-on-Ray run (``flwr run``, Flower 1.42's replacement for ``run_simulation``) ends with the node parameters of
the in-process loop over the same nodes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.flower, pytest.mark.slow]

APP_DIR = Path(__file__).resolve().parents[1] / "examples" / "push_sum_dropin"


def test_user_app_switched_to_push_sum(tmp_path, monkeypatch):
    """`flwr run` of the example (local simulation, 4 SuperNodes, seeded mode): the run ends with the node
    parameters of the in-process loop over the same nodes."""
    from flwr_run_helper import flwr_run

    from flower_dp.gossip import run_iteration
    from flower_dp.results import load_checkpoint

    monkeypatch.syspath_prepend(str(APP_DIR))
    from dropin_app.task import NUM_PARTITIONS, SAMPLES, Net, load_data

    from flower_dp.clients.push_sum_app import model_builder, plan_spec

    out = tmp_path / "dropin_results"
    # Flower == in-process bit for bit needs the seeded simulation mode (run config reproducible = true)
    text = flwr_run(APP_DIR, tmp_path, federation_config=f"num-supernodes={NUM_PARTITIONS}",
                    run_config=f"reproducible=true out-dir='{out}'", timeout=400)
    assert (out / "results.json").is_file(), text[-4000:]
    doc = json.loads((out / "results.json").read_text())
    assert doc["status"] == "finished" and [h["k"] for h in doc["history"]] == [4, 8, 12]
    assert all(0 < p["eps_rigorous"] <= 3.0 + 1e-9 for p in doc["privacy"]["per_node"])
    # the same nodes, in-process
    spec = plan_spec("dyn_d2p", {"variant": "dyn", "epsilon": 3.0, "delta": 1e-4, "lr": 0.1, "batch_size": 8},
                     n_nodes=NUM_PARTITIONS, model_fn=Net, samples_per_node=SAMPLES, num_iters=12,
                     topology="random_irregular", topology_kwargs={"seed": 0}, reproducible=True)
    torch.set_num_threads(1)  # as in the host actors (threads_per_host = 1)
    build = model_builder(Net, load_data)
    nodes = [build(i, spec)(i, "cpu") for i in range(NUM_PARTITIONS)]
    for nd in nodes:
        nd.setup()
    for k in range(12):
        run_iteration(nodes, k)
    states = load_checkpoint(out)["nodes"]
    for nd in nodes:
        torch.testing.assert_close(states[nd.node_id]["x"], nd.x, rtol=0, atol=1e-6)
        assert states[nd.node_id]["w"] == pytest.approx(nd.w, abs=1e-12)


def test_the_readme_diff_calls_what_the_example_runs():
    """The README's push-sum drop-in diff builds its ClientApp and strategy with the calls the example (and the
    test above) runs: ``make_client_app(model_builder(Net, ...))``, ``plan_spec("dyn_d2p", ...)``,
    ``PushSumStrategy(...)``."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    after = readme[readme.index("**My own Flower app -> private push-sum**"):]
    start = after.index("```diff")
    diff = after[start:after.index("```", start + 3)]
    example = "".join(p.read_text() for p in (APP_DIR / "dropin_app").glob("*_app.py"))
    for call in ("make_client_app(model_builder(Net, ", 'plan_spec("dyn_d2p", {', "PushSumStrategy("):
        assert call in diff and call in example, call
