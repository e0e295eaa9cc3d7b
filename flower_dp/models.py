"""The papers' models, as plain ``torch.nn.Module`` s without BatchNorm.

| name | paper | parameters |
|---|---|---|
| ``shallow_cnn`` | Dyn-D2P / DP-CSGP Fashion-MNIST (FedAvg CNN, dyn-d2p.md 8 #11) | 582,026 |
| ``mlp_2layer`` | PrivSGP-VR MNIST (784-128-10, privsgp-vr.md decision) | 101,770 |
| ``partpsp_mlp`` | DPPS / PartPSP MNIST MLP (dpps-partpsp.md 4.3) | 24,324 |
| ``lenet`` | Gau-LRQ MNIST LeNet (gau-lrq.md 8.2 decision) | 61,706 |
| ``resnet18_cifar_gn`` | CIFAR ResNet-18, GroupNorm instead of BatchNorm | 11,173,962 |
| ``logreg`` | multinomial logistic regression (convex tests) | (in_features + 1) * classes |

Initialisation is deterministic from ``seed`` and never touches the global RNG.
"""

from __future__ import annotations

import torch
from torch import nn

from ._checks import check_choice, check_int

__all__ = ["build_model", "count_parameters", "shared_parameter_names", "MODELS", "PartPSPMLP"]


class ShallowCNN(nn.Module):
    """FedAvg-style CNN: Conv(1->32,5)+ReLU+Pool2, Conv(32->64,5)+ReLU+Pool2, FC(1024->512)+ReLU, FC(512->C)."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 32, 5)
        self.conv2 = nn.Conv2d(32, 64, 5)
        self.fc1 = nn.Linear(64 * 4 * 4, 512)
        self.fc2 = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class MLP2(nn.Module):
    """Two-layer net 784-128-C with ReLU (PrivSGP-VR's MNIST model)."""

    def __init__(self, num_classes: int = 10, in_features: int = 784, hidden: int = 128) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class PartPSPMLP(nn.Module):
    """PartPSP's three-layer tanh MLP (dpps-partpsp.md 4.3).

    ``structure="code10"`` (the PartPSP-1 network): ``h = tanh(W1 x + b1)``,
    ``out = h + tanh(W3 tanh(W2 h + b2) + b3)``; shared block = ``l1``.
    ``structure="res784"`` (PartPSP-2 and the fully shared model): ``z = x + tanh(W2 tanh(W1 x + b1) + b2)``,
    ``out = tanh(W3 z + b3)``; shared block = ``l1``, ``l2``.
    Parameter names: ``l1`` (784->10), ``l2`` (10->784), ``l3`` (784->10 or 10... see structure).
    """

    def __init__(self, num_classes: int = 10, in_features: int = 784, structure: str = "res784") -> None:
        super().__init__()
        self.structure = check_choice("structure", structure, ("code10", "res784"))
        self.l1 = nn.Linear(in_features, num_classes)
        self.l2 = nn.Linear(num_classes, in_features)
        self.l3 = nn.Linear(in_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        if self.structure == "code10":
            h = torch.tanh(self.l1(x))
            return h + torch.tanh(self.l3(torch.tanh(self.l2(h))))
        z = x + torch.tanh(self.l2(torch.tanh(self.l1(x))))
        return torch.tanh(self.l3(z))


class LeNet(nn.Module):
    """LeNet-5 for 28x28 inputs: Conv(1->6,5,pad 2)+ReLU+Pool, Conv(6->16,5)+ReLU+Pool, 400-120-84-C."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.fc1(x.flatten(1)))
        return self.fc3(torch.relu(self.fc2(x)))


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.gn1 = nn.GroupNorm(groups, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.gn2 = nn.GroupNorm(groups, cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.GroupNorm(groups, cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.gn1(self.conv1(x)))
        return torch.relu(self.gn2(self.conv2(out)) + self.shortcut(x))


class ResNet18GN(nn.Module):
    """CIFAR ResNet-18 (3x3 stem, no max-pool, BasicBlock [2,2,2,2]) with GroupNorm(32) instead of BatchNorm."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3, groups: int = 32) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False)
        self.gn1 = nn.GroupNorm(groups, 64)
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers.append(nn.Sequential(_Block(cin, cout, stride, groups), _Block(cout, cout, 1, groups)))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.gn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class LogReg(nn.Module):
    """Multinomial logistic regression (one Linear layer) for convex tests."""

    def __init__(self, num_classes: int = 10, in_features: int = 784) -> None:
        super().__init__()
        self.fc = nn.Linear(in_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


MODELS = {
    "shallow_cnn": ShallowCNN,
    "mlp_2layer": MLP2,
    "partpsp_mlp": PartPSPMLP,
    "lenet": LeNet,
    "resnet18_cifar_gn": ResNet18GN,
    "logreg": LogReg,
}

#: PartPSP splits: names of shared parameter prefixes per (model, split) (dpps-partpsp.md 4.3).
_SPLITS = {
    ("partpsp_mlp", "partpsp1"): ("l1.",),
    ("partpsp_mlp", "partpsp2"): ("l1.", "l2."),
    ("resnet18_cifar_gn", "partpsp1"): ("conv1.", "gn1.", "layer1."),
    ("resnet18_cifar_gn", "partpsp2"): ("conv1.", "gn1.", "layer1.", "layer2."),
}


def build_model(name: str, *, num_classes: int = 10, seed: int = 0, **kwargs) -> nn.Module:
    """Build a model by name with a deterministic initialisation from ``seed``.

    ``kwargs`` go to the model class (e.g. ``in_features`` for ``logreg``, ``structure`` for
    ``partpsp_mlp``).  The global torch RNG is left unchanged.
    """
    check_choice("model", name, MODELS)
    check_int("num_classes", num_classes, minimum=2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        try:
            return MODELS[name](num_classes=num_classes, **kwargs)
        except TypeError as exc:
            raise ValueError(f"bad keyword arguments {kwargs} for model {name!r}: {exc}") from exc


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def shared_parameter_names(model_name: str, split: str, model: nn.Module) -> list[str]:
    """Names of the parameters PartPSP shares for ``split`` in {"partpsp1", "partpsp2", "all"}.

    ``all`` (SGPDP) shares everything.  The rest is the node-local head, never sent.
    """
    names = [n for n, _ in model.named_parameters()]
    if split == "all":
        return names
    key = (model_name, split)
    if key not in _SPLITS:
        valid = sorted({s for (m, s) in _SPLITS if m == model_name} | {"all"})
        raise ValueError(f"unknown PartPSP split {split!r} for model {model_name!r}; valid choices are {valid}")
    prefixes = _SPLITS[key]
    return [n for n in names if n.startswith(prefixes)]
