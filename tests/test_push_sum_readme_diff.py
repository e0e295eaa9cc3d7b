"""The README's "My own Flower app -> private push-sum" diff, read from the README, applied to an app in the
layout of Flower's PyTorch template (``flwr new`` / quickstart-pytorch: ``pytorchexample/{task,client_app,
server_app}.py``) and run with ``flwr run`` in a local simulation (issue 31): the README and what runs cannot drift.

``flwr new`` fetches templates over the network in Flower 1.42, so the test writes a minimal copy of the template's
structure; its ``task.py`` keeps the template's names and signatures but makes small synthetic CIFAR-shaped data
(dict batches ``{"img", "label"}``, as flwr-datasets gives them) instead of downloading CIFAR-10.  The diff itself
is applied unchanged: each hunk's ``' '``/``'-'`` lines must occur exactly once in the file.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from flwr_run_helper import flwr_run

pytestmark = [pytest.mark.flower, pytest.mark.slow, pytest.mark.timeout(600)]

README = Path(__file__).resolve().parents[1] / "README.md"
N = 4  # the README diff's n (= num-supernodes)

PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "pytorchexample"
version = "1.0.0"
description = "a copy of the layout of Flower's PyTorch template"
license = "Apache-2.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "test"

[tool.flwr.app.components]
serverapp = "pytorchexample.server_app:app"
clientapp = "pytorchexample.client_app:app"

[tool.flwr.app.config]
num-server-rounds = 3
fraction-evaluate = 1.0
local-epochs = 1
learning-rate = 0.1
batch-size = 32
"""

TASK = '''\
"""pytorchexample: A Flower / PyTorch app (the template's task.py; synthetic data instead of CIFAR-10)."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader

SAMPLES = 80  # per partition, 80 % of it for training


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 5 * 5)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def _rows(seed, n):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    imgs = torch.randn(n, 3, 32, 32, generator=g) * 0.5 + labels[:, None, None, None] / 10.0
    return [{"img": imgs[i], "label": int(labels[i])} for i in range(n)]


def load_data(partition_id: int, num_partitions: int, batch_size: int):
    rows = _rows(1000 + partition_id, SAMPLES)
    cut = int(0.8 * SAMPLES)
    trainloader = DataLoader(rows[:cut], batch_size=batch_size, shuffle=True)
    testloader = DataLoader(rows[cut:], batch_size=batch_size)
    return trainloader, testloader


def load_centralized_dataset():
    return DataLoader(_rows(7, 200), batch_size=128)


def train(net, trainloader, epochs, lr, device):
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for batch in trainloader:
            optimizer.zero_grad()
            loss = criterion(net(batch["img"].to(device)), batch["label"].to(device))
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
    return running_loss / (epochs * len(trainloader))


def test(net, testloader, device):
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for batch in testloader:
            images, labels = batch["img"].to(device), batch["label"].to(device)
            outputs = net(images)
            loss += criterion(outputs, labels).item()
            correct += (torch.max(outputs.data, 1)[1] == labels).sum().item()
    return loss / len(testloader), correct / len(testloader.dataset)
'''

CLIENT = '''\
"""pytorchexample: A Flower / PyTorch app."""

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from pytorchexample.task import Net, load_data
from pytorchexample.task import test as test_fn
from pytorchexample.task import train as train_fn

# Flower ClientApp
app = ClientApp()


@app.train()
def train(msg: Message, context: Context):
    """Train the model on local data."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    trainloader, _ = load_data(partition_id, num_partitions, context.run_config["batch-size"])
    train_loss = train_fn(model, trainloader, context.run_config["local-epochs"], msg.content["config"]["lr"], device)
    metrics = MetricRecord({"train_loss": train_loss, "num-examples": len(trainloader.dataset)})
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context):
    """Evaluate the model on local data."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    _, valloader = load_data(context.node_config["partition-id"], context.node_config["num-partitions"],
                             context.run_config["batch-size"])
    eval_loss, eval_acc = test_fn(model, valloader, torch.device("cpu"))
    metrics = MetricRecord({"eval_loss": eval_loss, "eval_acc": eval_acc, "num-examples": len(valloader.dataset)})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)
'''

SERVER = '''\
"""pytorchexample: A Flower / PyTorch app."""

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from pytorchexample.task import Net, load_centralized_dataset, test

# Create ServerApp
app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Main entry point for the ServerApp."""

    # Read run config
    fraction_evaluate: float = context.run_config["fraction-evaluate"]
    num_rounds: int = context.run_config["num-server-rounds"]
    lr: float = context.run_config["learning-rate"]

    # Load global model
    global_model = Net()
    arrays = ArrayRecord(global_model.state_dict())

    # Initialize FedAvg strategy
    strategy = FedAvg(fraction_evaluate=fraction_evaluate)

    # Start strategy, run FedAvg for `num_rounds`
    result = strategy.start(
        grid=grid,
        initial_arrays=arrays,
        train_config=ConfigRecord({"lr": lr}),
        num_rounds=num_rounds,
        evaluate_fn=global_evaluate,
    )
    print("FINAL_ARRAYS", sorted(result.arrays.keys()))


def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    """Evaluate model on central data."""
    model = Net()
    model.load_state_dict(arrays.to_torch_state_dict())
    test_loss, test_acc = test(model, load_centralized_dataset(), torch.device("cpu"))
    return MetricRecord({"accuracy": test_acc, "loss": test_loss})
'''


def readme_diff(text: str) -> dict[str, list[list[str]]]:
    """The push-sum drop-in diff of the README: ``{file name: [hunk lines]}``; hunks are separated by blank
    lines, a file starts at a context line `` # NAME.py``."""
    m = re.search(r"\*\*My own Flower app -> private push-sum\*\*.*?```diff\n(.*?)```", text, re.S)
    assert m, "README: no ```diff block after '**My own Flower app -> private push-sum**'"
    files: dict[str, list[list[str]]] = {}
    cur = None
    for line in m.group(1).splitlines():
        head = re.match(r"^ # (\w+\.py)\b", line)
        if head:
            cur = head.group(1)
            files[cur] = [[]]
        elif not line.strip():
            if cur is not None:
                files[cur].append([])
        else:
            assert cur is not None and line[0] in " -+", f"README diff: line {line!r} outside a file or unprefixed"
            files[cur][-1].append(line)
    return {name: [h for h in hunks if h] for name, hunks in files.items()}


def apply_diff(source: str, hunks: list[list[str]], name: str) -> str:
    """Each hunk replaces its ' '/'-' lines (exactly once in ``source``) by its ' '/'+' lines; a hunk of '+'
    lines only is appended at the end."""
    for hunk in hunks:
        old = [line[1:] for line in hunk if line[0] in " -"]
        new = "\n".join(line[1:] for line in hunk if line[0] in " +") + "\n"
        if not old:
            source = source.rstrip("\n") + "\n\n" + new
            continue
        block = "\n".join(old) + "\n"
        assert source.count(block) == 1, f"{name}: the README's lines {old} occur {source.count(block)} times"
        source = source.replace(block, new)
    return source


def test_readme_diff_parses_into_the_two_template_files():
    hunks = readme_diff(README.read_text())
    assert set(hunks) == {"client_app.py", "server_app.py"}
    assert apply_diff(CLIENT, hunks["client_app.py"], "client_app.py") != CLIENT
    assert "FedAvg(" not in apply_diff(SERVER, hunks["server_app.py"], "server_app.py").split("strategy.start")[0] \
        .split("# Load global model")[1]


def test_readme_push_sum_diff_runs_on_the_pytorch_template_with_flwr_run(tmp_path):
    """The diffed template app runs under `flwr run --stream` (local simulation, 4 SuperNodes, 2 rounds): a
    [ROUND r/2] line per segment with the iterations, global_evaluate's accuracy and the eps spent (<= 3)."""
    app = tmp_path / "app"
    (app / "pytorchexample").mkdir(parents=True)
    (app / "pyproject.toml").write_text(PYPROJECT)
    (app / "pytorchexample" / "__init__.py").write_text('"""pytorchexample: A Flower / PyTorch app."""\n')
    (app / "pytorchexample" / "task.py").write_text(TASK)
    hunks = readme_diff(README.read_text())
    for name, source in (("client_app.py", CLIENT), ("server_app.py", SERVER)):
        (app / "pytorchexample" / name).write_text(apply_diff(source, hunks[name], name))
    t0 = time.monotonic()
    text = flwr_run(app, tmp_path, federation_config=f"num-supernodes={N}", run_config="num-server-rounds=2",
                    timeout=480)
    wall = time.monotonic() - t0
    for r in (1, 2):
        assert f"[ROUND {r}/2]" in text, text[-6000:]
        assert f"iterations {10 * r}/20 done" in text, text[-6000:]
    eps = [float(e) for e in re.findall(r"privacy spent \(largest over 4 nodes at delta 1e-05\): eps_rigorous ([0-9.]+)",
                                        text)]
    assert len(eps) == 2 and 0 < eps[0] < eps[1] <= 3.0 + 1e-9, text[-6000:]
    assert len(re.findall(r"network average: accuracy [0-9.]+, loss", text)) == 2, text[-6000:]
    assert "FINAL_ARRAYS ['conv1.bias', 'conv1.weight'" in text, text[-6000:]
    print(f"README push-sum diff on the PyTorch template: flwr run {wall:.1f} s; eps per round {eps}; its log:")
    print("\n".join(line for line in text.splitlines() if "[ROUND" in line or "──>" in line))
