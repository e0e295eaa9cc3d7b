"""Flower's PyTorch app template (``quickstart-pytorch``, the app ``flwr new`` makes), written by a test, and the
README's diffs applied to it as written.

``flwr new`` downloads its templates from Flower's hub in Flower 1.42, which is out of reach here, so
:func:`template_app` writes a copy of the template's files: ``pyproject.toml`` (its ``[tool.flwr.app.config]``
keys ``num-server-rounds``, ``fraction-evaluate``, ``local-epochs``, ``learning-rate``, ``batch-size``),
``pytorchexample/client_app.py`` and ``pytorchexample/server_app.py`` line for line (FedAvg with
``fraction_evaluate``, ``train_config={"lr": lr}``, ``evaluate_fn=global_evaluate`` on the centralized test set),
and ``pytorchexample/task.py`` with the template's names, signatures, CNN (62,006 parameters) and dict batches
``{"img", "label"}``, whose ``load_data`` makes a synthetic learnable 10-class task of 3x32x32 images instead of
downloading CIFAR-10.  The server prints ``FINAL_ARRAYS`` after ``strategy.start`` so a test sees the run end.

:func:`readme_diff` reads a ```diff block from the README after a bold marker and :func:`apply_readme_diff` applies
it: a line `` # path`` starts a file (``pyproject.toml`` or ``pytorchexample/NAME.py``; words after the path are a
comment), blank lines separate hunks, a hunk's `` ``/``-`` lines must occur exactly once as a block and are replaced
by its `` ``/``+`` lines, and a hunk of ``+`` lines only is appended at the file's end.
"""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"

PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "pytorchexample"
version = "1.0.0"
description = "a copy of Flower's PyTorch template (quickstart-pytorch)"
license = "Apache-2.0"
dependencies = []  # the template lists flwr, flwr-datasets, torch, torchvision: already in this environment

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

SAMPLES = {samples}  # per partition, 80 % of it for training


class Net(nn.Module):
    """Model (simple CNN adapted from 'PyTorch: A 60 Minute Blitz')"""

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


def synthetic_rows(seed, n):
    """n rows of a fixed 10-class task: the class's pattern (drawn from seed 0) plus pixel noise of std 0.5."""
    patterns = torch.randn(10, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    imgs = patterns[labels] + 0.5 * torch.randn(n, 3, 32, 32, generator=g)
    return [{{"img": imgs[i], "label": int(labels[i])}} for i in range(n)]


def load_data(partition_id: int, num_partitions: int, batch_size: int):
    """Load partition data: 80% train, 20% test."""
    rows = synthetic_rows(1000 + partition_id, SAMPLES)
    cut = int(0.8 * SAMPLES)
    trainloader = DataLoader(rows[:cut], batch_size=batch_size, shuffle=True)
    testloader = DataLoader(rows[cut:], batch_size=batch_size)
    return trainloader, testloader


def load_centralized_dataset():
    """Load test set and return dataloader."""
    return DataLoader(synthetic_rows(7, 500), batch_size=128)


def train(net, trainloader, epochs, lr, device):
    """Train the model on the training set."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for batch in trainloader:
            images = batch["img"].to(device)
            labels = batch["label"].to(device)
            optimizer.zero_grad()
            loss = criterion(net(images), labels)
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
    avg_trainloss = running_loss / (epochs * len(trainloader))
    return avg_trainloss


def test(net, testloader, device):
    """Validate the model on the test set."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for batch in testloader:
            images = batch["img"].to(device)
            labels = batch["label"].to(device)
            outputs = net(images)
            loss += criterion(outputs, labels).item()
            correct += (torch.max(outputs.data, 1)[1] == labels).sum().item()
    accuracy = correct / len(testloader.dataset)
    loss = loss / len(testloader)
    return loss, accuracy
'''

CLIENT_APP = '''\
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

    # Load the model and initialize it with the received weights
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model.to(device)

    # Load the data
    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    batch_size = context.run_config["batch-size"]
    trainloader, _ = load_data(partition_id, num_partitions, batch_size)

    # Call the training function
    train_loss = train_fn(
        model,
        trainloader,
        context.run_config["local-epochs"],
        msg.content["config"]["lr"],
        device,
    )

    # Construct and return reply Message
    model_record = ArrayRecord(model.state_dict())
    metrics = {
        "train_loss": train_loss,
        "num-examples": len(trainloader.dataset),
    }
    metric_record = MetricRecord(metrics)
    content = RecordDict({"arrays": model_record, "metrics": metric_record})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context):
    """Evaluate the model on local data."""

    # Load the model and initialize it with the received weights
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model.to(device)

    # Load the data
    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    batch_size = context.run_config["batch-size"]
    _, valloader = load_data(partition_id, num_partitions, batch_size)

    # Call the evaluation function
    eval_loss, eval_acc = test_fn(
        model,
        valloader,
        device,
    )

    # Construct and return reply Message
    metrics = {
        "eval_loss": eval_loss,
        "eval_acc": eval_acc,
        "num-examples": len(valloader.dataset),
    }
    metric_record = MetricRecord(metrics)
    content = RecordDict({"metrics": metric_record})
    return Message(content=content, reply_to=msg)
'''

SERVER_APP = '''\
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

    # Load the model and initialize it with the received weights
    model = Net()
    model.load_state_dict(arrays.to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model.to(device)

    # Load entire test set
    test_dataloader = load_centralized_dataset()

    # Evaluate the global model on the test set
    test_loss, test_acc = test(model, test_dataloader, device)

    # Return the evaluation metrics
    return MetricRecord({"accuracy": test_acc, "loss": test_loss})
'''

FILES = {"pyproject.toml": PYPROJECT, "pytorchexample/client_app.py": CLIENT_APP,
         "pytorchexample/server_app.py": SERVER_APP}


def template_app(root: Path, samples: int = 80) -> Path:
    """Write the template app under ``root/app`` (``samples`` rows per partition) and return its folder."""
    app = root / "app"
    (app / "pytorchexample").mkdir(parents=True)
    (app / "pytorchexample" / "__init__.py").write_text('"""pytorchexample: A Flower / PyTorch app."""\n')
    (app / "pytorchexample" / "task.py").write_text(TASK.format(samples=samples))
    for name, text in FILES.items():
        (app / name).write_text(text)
    return app


def readme_diff(marker: str, text: str | None = None) -> dict[str, list[list[str]]]:
    """The first ```diff block after ``marker`` in the README: ``{file path: [hunk lines, ...]}``."""
    text = README.read_text() if text is None else text
    assert marker in text, f"README: no {marker!r}"
    m = re.compile(r"```diff\n(.*?)```", re.S).search(text, text.index(marker))
    assert m is not None, f"README: no ```diff block after {marker!r}"
    files: dict[str, list[list[str]]] = {}
    cur = None
    for line in m.group(1).splitlines():
        head = re.fullmatch(r" # (\S+\.(?:py|toml))(?:\s.*)?", line)
        if head:
            cur = head.group(1)
            assert cur in FILES, f"README diff names {cur}; the template's files are {sorted(FILES)}"
            files[cur] = [[]]
        elif not line.strip():
            if cur is not None:
                files[cur].append([])
        else:
            assert cur is not None and line[0] in " -+", f"README diff: line {line!r} outside a file or unprefixed"
            files[cur][-1].append(line)
    return {name: [h for h in hunks if h] for name, hunks in files.items()}


def apply_hunks(source: str, hunks: list[list[str]], name: str) -> str:
    """Each hunk replaces its ' '/'-' lines (exactly once in ``source``, as a block) by its ' '/'+' lines; a hunk
    of '+' lines only is appended at the end."""
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


def apply_readme_diff(app: Path, marker: str) -> dict[str, str]:
    """Apply the README's diff after ``marker`` to the template app at ``app``; return the changed files' texts."""
    out = {}
    for name, hunks in readme_diff(marker).items():
        path = app / name
        path.write_text(apply_hunks(path.read_text(), hunks, name))
        out[name] = path.read_text()
    return out


def last_global_accuracy(log: str) -> float:
    """The accuracy of the last ``global_evaluate`` in a Flower log (``MetricRecord: {'accuracy': ...``)."""
    found = re.findall(r"MetricRecord: \{'accuracy': ([0-9.eE+-]+)", log)
    assert found, "no global evaluation in the log:\n" + log[-4000:]
    return float(found[-1])
