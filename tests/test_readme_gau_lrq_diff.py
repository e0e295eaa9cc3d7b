"""The README's FedAvg -> GauLRQ diff, read from the README, applied to an app in Flower's template layout, run
with ``flwr run`` (local simulation: a SuperLink and a Ray head of the test's own on 127.0.0.1).

``flwr new`` needs the network in Flower 1.42 (it downloads the app from Flower's hub), so the test writes a
minimal app in the layout and with the lines of the PyTorch template (``pytorchexample/{client_app, server_app,
task}.py``, ``pyproject.toml`` with ``[tool.flwr.app.config]``): the template's CNN (62k parameters), its train /
evaluate functions and its ServerApp, which runs FedAvg and saves ``final_model.pt``.  Its ``load_data`` (a
``flwr-datasets`` download in the template) is swapped, here in the test and not in the diff, for a synthetic
10-class task of 3x32x32 images: small fixed partitions per SuperNode.
"""

from __future__ import annotations

import re
import stat
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARKER = "**FedAvg -> GauLRQ**"
NUM_SUPERNODES = 100  # the README's setting: num_clients=100, fraction-train 0.5 -> B = 50
RUN_CONFIG = "num-server-rounds=5 lr=0.1 local-epochs=2"  # the README's run line

PYPROJECT = '''\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "pytorchexample"
version = "1.0.0"
description = ""
license = "Apache-2.0"
dependencies = []  # the template lists flwr, flwr-datasets, torch, torchvision: already in this environment

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "flwrlabs"

[tool.flwr.app.components]
serverapp = "pytorchexample.server_app:app"
clientapp = "pytorchexample.client_app:app"

[tool.flwr.app.config]
num-server-rounds = 3
fraction-train = 0.5
local-epochs = 1
lr = 0.01
batch-size = 32
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
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    device = torch.device("cpu")
    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    trainloader, _ = load_data(partition_id, num_partitions, context.run_config["batch-size"])
    train_loss = train_fn(model, trainloader, context.run_config["local-epochs"], msg.content["config"]["lr"], device)
    model_record = ArrayRecord(model.state_dict())
    metrics = {"train_loss": train_loss, "num-examples": len(trainloader.dataset)}
    content = RecordDict({"arrays": model_record, "metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context):
    """Evaluate the model on local data."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    _, valloader = load_data(partition_id, num_partitions, context.run_config["batch-size"])
    eval_loss, eval_acc = test_fn(model, valloader, torch.device("cpu"))
    metrics = {"eval_loss": eval_loss, "eval_acc": eval_acc, "num-examples": len(valloader.dataset)}
    return Message(content=RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)
'''

SERVER_APP = '''\
"""pytorchexample: A Flower / PyTorch app."""

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from pytorchexample.task import Net

# Create ServerApp
app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Main entry point for the ServerApp."""
    fraction_train: float = context.run_config["fraction-train"]
    num_rounds: int = context.run_config["num-server-rounds"]
    lr: float = context.run_config["lr"]

    global_model = Net()
    arrays = ArrayRecord(global_model.state_dict())

    # Initialize FedAvg strategy
    strategy = FedAvg(fraction_train=fraction_train)

    result = strategy.start(
        grid=grid,
        initial_arrays=arrays,
        train_config=ConfigRecord({"lr": lr}),
        num_rounds=num_rounds,
    )

    print("\\nSaving final model to disk...")
    state_dict = result.arrays.to_torch_state_dict()
    torch.save(state_dict, "final_model.pt")
'''

TASK = '''\
"""pytorchexample: A Flower / PyTorch app (load_data swapped by the test for a synthetic task)."""

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    """The template's CNN for 3x32x32 images: two conv + pool layers, three linear layers (62,006 parameters)."""

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


def synthetic(seed: int, n: int):
    """n images of a fixed 10-class task: class pattern (from seed 0) + Gaussian pixel noise of std 0.5."""
    patterns = np.random.default_rng(0).normal(size=(10, 3, 32, 32)).astype(np.float32)
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 10, size=n)
    x = patterns[y] + 0.5 * rng.normal(size=(n, 3, 32, 32)).astype(np.float32)
    return TensorDataset(torch.from_numpy(x), torch.from_numpy(y))


def load_data(partition_id: int, num_partitions: int, batch_size: int):
    """Partition partition_id: 64 training and 16 validation images (the test's swap for flwr-datasets)."""
    train = synthetic(1000 + 2 * partition_id, 64)
    val = synthetic(1001 + 2 * partition_id, 16)
    return DataLoader(train, batch_size=batch_size, shuffle=True), DataLoader(val, batch_size=batch_size)


def train(net, trainloader, epochs, lr, device):
    """SGD with momentum 0.9 over the loader for ``epochs``; returns the mean batch loss."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for images, labels in trainloader:
            optimizer.zero_grad()
            loss = criterion(net(images.to(device)), labels.to(device))
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
    return running_loss / (epochs * len(trainloader))


def test(net, testloader, device):
    """(mean batch loss, accuracy) of ``net`` on the loader."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for images, labels in testloader:
            outputs = net(images.to(device))
            loss += criterion(outputs, labels.to(device)).item()
            correct += (torch.max(outputs.data, 1)[1] == labels.to(device)).sum().item()
    return loss / len(testloader), correct / len(testloader.dataset)
'''


def readme_diff() -> str:
    """The first ```diff block after the FedAvg -> GauLRQ marker in README.md."""
    text = (ROOT / "README.md").read_text()
    at = text.index(MARKER)
    m = re.compile(r"```diff\n(.*?)```", re.S).search(text, at)
    assert m is not None, f"no ```diff block after {MARKER!r} in README.md"
    return m.group(1)


def apply_diff(app: Path, diff: str) -> dict[str, str]:
    """Apply the README's diff: per ``# <file>`` section, a context line (leading space) moves the cursor past its
    match, ``-line`` deletes its match (at or after the cursor), ``+line`` is inserted at the cursor.  Lines
    must match exactly; a line that is not found fails the test, naming it.  Returns the new texts."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in diff.splitlines():
        head = re.fullmatch(r" # (\S+\.(?:py|toml))", line)
        if head:
            current = sections.setdefault(head.group(1), [])
        elif line.strip():
            assert current is not None, f"diff line before any '# <file>' header: {line!r}"
            current.append(line)
    out = {}
    for name, lines in sections.items():
        path = app / name
        assert path.is_file(), f"the diff names {name}, which the template app does not have"
        body = path.read_text().splitlines()
        cur = 0
        for line in lines:
            kind, text = line[0], line[1:]
            if kind == "+":
                body.insert(cur, text)
                cur += 1
                continue
            assert kind in " -", f"not a diff line in the README: {line!r}"
            try:
                at = body.index(text, cur)
            except ValueError:
                raise AssertionError(f"README diff line {line!r} not found in {name} (after line {cur})") from None
            if kind == "-":
                del body[at]
                cur = at
            else:
                cur = at + 1
        path.write_text("\n".join(body) + "\n")
        out[name] = path.read_text()
    return out


def template_app(root: Path) -> Path:
    app = root / "app"
    (app / "pytorchexample").mkdir(parents=True)
    (app / "pyproject.toml").write_text(PYPROJECT)
    (app / "pytorchexample" / "__init__.py").write_text('"""pytorchexample: A Flower / PyTorch app."""\n')
    for name, text in (("client_app.py", CLIENT_APP), ("server_app.py", SERVER_APP), ("task.py", TASK)):
        (app / "pytorchexample" / name).write_text(text)
    return app


def test_readme_diff_applies_to_the_template_layout(tmp_path):
    """Every line the diff removes or keeps is in the template app, and the result names GauLRQ and the mod."""
    texts = apply_diff(template_app(tmp_path), readme_diff())
    assert set(texts) == {"pyproject.toml", "pytorchexample/client_app.py", "pytorchexample/server_app.py"}
    assert "ClientApp(mods=[gau_lrq_mod])" in texts["pytorchexample/client_app.py"]
    assert "GauLRQ(" in texts["pytorchexample/server_app.py"] and "FedAvg(" not in texts["pytorchexample/server_app.py"]
    compile(texts["pytorchexample/server_app.py"], "server_app.py", "exec")
    compile(texts["pytorchexample/client_app.py"], "client_app.py", "exec")


@pytest.mark.slow
def test_readme_diff_runs_as_written_with_flwr_run_and_learns(tmp_path, monkeypatch):
    """Template app + the README's diff -> `flwr run` (100 SuperNodes, the README's run line): GauLRQ creates the
    secret file (0600, path logged), trains 5 rounds at eps 8, and the saved final model is well above chance (0.1)
    on held-out data (an in-process replay of this setting, seeds 1 and 2: 0.755 and 0.755)."""
    import torch

    from flwr_run_helper import flwr_run

    app = template_app(tmp_path)
    apply_diff(app, readme_diff())
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))  # "~/.flower_dp/gau_lrq.secret" of the diff lands here
    monkeypatch.chdir(tmp_path)  # the template saves final_model.pt in the working directory
    text = flwr_run(app, tmp_path, federation_config=f"num-supernodes={NUM_SUPERNODES}",
                    run_config=RUN_CONFIG, timeout=600)
    secret = home / ".flower_dp" / "gau_lrq.secret"
    assert secret.is_file(), text[-5000:]
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and str(secret) in text
    assert secret.read_bytes().hex() not in text
    model_file = next(iter(tmp_path.rglob("final_model.pt")), None)
    assert model_file is not None, text[-5000:]
    assert "learning is implausible" not in text  # the README's setting is below the warning threshold
    monkeypatch.syspath_prepend(str(app))
    sys.modules.pop("pytorchexample", None)
    from pytorchexample.task import Net, synthetic, test as test_fn

    net = Net()
    net.load_state_dict(torch.load(model_file))
    _, acc = test_fn(net, torch.utils.data.DataLoader(synthetic(7, 1000), batch_size=100), torch.device("cpu"))
    print(f"README setting: accuracy {acc:.3f} after 5 rounds (chance 0.1)")
    assert acc > 0.3, (acc, text[-3000:])
