"""The ClientApp: ordinary Flower + PyTorch training; Gau-LRQ is one mod (drop-in)."""

from __future__ import annotations

from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flower_dp.clients.lrq_mod import gau_lrq_mod, make_gau_lrq_mod  # gau_lrq_mod: run config "lrq-secret-file"

from .task import arrays_to_model, client_data, local_train, model_to_arrays, new_model, seed_for


def train(msg: Message, context: Context) -> Message:
    """Train LeNet for Q local steps and return the new weights (unchanged user code)."""
    rc, pid = msg.content["config"], int(context.node_config["partition-id"])  # hyperparameters from the server
    model = arrays_to_model(msg.content["arrays"], new_model())
    x, y = client_data(str(rc.get("dataset", "fashion_mnist")), pid, int(rc.get("per-class", 50)), int(rc.get("seed", 0)))
    rnd = int(msg.content["config"]["server-round"])
    loss = local_train(model, x, y, steps=int(rc.get("local-steps", 16)), lr=float(rc.get("lr", 0.01)),
                       seed=seed_for(int(rc.get("seed", 0)), pid, rnd))
    content = RecordDict({"arrays": model_to_arrays(model),
                          "metrics": MetricRecord({"num-examples": len(y), "train-loss": loss})})
    return Message(content=content, reply_to=msg)


app = ClientApp(mods=[gau_lrq_mod])
app.train()(train)


def build_app(secret_file: str) -> ClientApp:
    """The same ClientApp with the secret file bound (for run_simulation, which has no run config)."""
    a = ClientApp(mods=[make_gau_lrq_mod(secret_file)])
    a.train()(train)
    return a
