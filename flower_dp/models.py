"""The papers' models, as plain ``torch.nn.Module`` s without BatchNorm.

| name | paper | parameters |
|---|---|---|
| ``shallow_cnn`` | Dyn-D2P / DP-CSGP Fashion-MNIST (FedAvg-style CNN) | 582,026 |
| ``mlp_2layer`` | PrivSGP-VR MNIST (784-128-10; App. E gives no width, 128 is our choice) | 101,770 |
| ``partpsp_mlp`` | DPPS / PartPSP MNIST MLP (the paper's experiments) | 24,324 |
| ``lenet`` | Gau-LRQ MNIST LeNet (Sec. VII; "about 6e4" parameters) | 61,706 |
| ``resnet18_cifar_gn`` | CIFAR ResNet-18, GroupNorm instead of BatchNorm | 11,173,962 |
| ``resnet34_cifar_gn`` | Gau-LRQ CIFAR-100 ResNet-34 (Sec. VII), GroupNorm | 21,282,122 (10 classes) |
| ``resnet18_tv_bn`` | DPPS FMNIST: torchvision ResNet-18 **with BatchNorm** (the paper's code) | 11,181,642 |
| ``logreg`` | multinomial logistic regression (convex tests) | (in_features + 1) * classes |

Every model except ``resnet18_tv_bn`` is free of BatchNorm and works with
``torch.func.functional_call`` + ``vmap`` (per-sample gradients).  ``resnet18_tv_bn`` exists
only to reproduce DPPS/PartPSP (batch-level L1 clipping, no record-level DP claimed); its
running statistics are node-local buffers, never shared, and the per-sample clipping code
refuses it.  ImageNet weights are not loaded (offline): it starts from a fresh initialisation.

Initialisation is deterministic from ``seed`` and leaves the global torch RNG unchanged
(``torch.random.fork_rng``; do not build models from several threads at once).
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from ._checks import check_choice, check_int

__all__ = ["build_model", "count_parameters", "max_pool2", "shared_parameter_names", "model_name_of", "MODELS", "PartPSPMLP",
           "cross_entropy_loss", "resolve_device"]


def cross_entropy_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The classification loss every experiment uses (mean cross-entropy); picklable, so Ray/relay nodes can share it."""
    return torch.nn.functional.cross_entropy(logits, y)


_POOL_BASE: dict[tuple, torch.Tensor] = {}


def max_pool2(x: torch.Tensor) -> torch.Tensor:
    """``F.max_pool2d(x, 2)``, the same numbers bit for bit (values and gradients, ties included), about 2x faster
    on a CPU.

    PyTorch's CPU kernel took 3.4 ms of a 4.0 ms forward + backward for a (32, 32, 24, 24) input (the shallow CNN's
    first pooling, B = 32; measured 2026-11-26): 12 % of a Dyn-D2P node step.  Here the maximum of the four strided
    views gives each window's winner, the first maximum in row-major order as that kernel picks it (offsets 0, 1, W,
    W + 1 from uint8 masks), and ``gather`` takes it: differentiable, ``vmap``-able, and its backward scatters each
    output gradient to the winner as max-pooling's does; a window holding a NaN gives NaN.  Falls back to
    ``F.max_pool2d`` for an input that is not (B, C, H, W) with even H and W (up to 254).
    """
    if x.dim() != 4 or x.shape[2] % 2 or x.shape[3] % 2 or x.shape[3] > 254 or not x.is_floating_point():
        return nn.functional.max_pool2d(x, 2)
    b, c, h, w = x.shape
    with torch.no_grad():
        q = (x[..., 0::2, 0::2], x[..., 0::2, 1::2], x[..., 1::2, 0::2], x[..., 1::2, 1::2])
        top = torch.maximum(torch.maximum(q[0], q[1]), torch.maximum(q[2], q[3]))
        key = (h, w, x.device)
        base = _POOL_BASE.get(key)
        if base is None:  # the flat index of each window's top-left element
            base = _POOL_BASE[key] = (torch.arange(0, h, 2, device=x.device).view(-1, 1) * w
                                      + torch.arange(0, w, 2, device=x.device).view(1, -1))
        na, nb, nc = ((v != top).to(torch.uint8) for v in q[:3])
        idx = (na * (nb * (nc + (w - 1)) + 1) + base).view(b, c, -1)
        nan = torch.isnan(top)
    out = x.reshape(b, c, h * w).gather(2, idx).view(b, c, h // 2, w // 2)
    return torch.where(nan, top, out)  # a window with a NaN gives NaN, as max-pooling does (no branch: vmap-able)


def resolve_device(name: str, *, log: bool = True) -> str:
    """``auto`` -> ``cuda`` when a GPU is visible, else ``cpu``; ``cuda`` without a GPU falls back to CPU with a log
    line (``log=False``: silently, for a caller predicting where nodes elsewhere will run)."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        if log:
            print(f"flower-dp: run.device={name!r} but no GPU is visible; running on the CPU", file=sys.stderr)
        return "cpu"
    return name


class ShallowCNN(nn.Module):
    """FedAvg-style CNN: Conv(1->32,5)+ReLU+Pool2, Conv(32->64,5)+ReLU+Pool2, FC(1024->512)+ReLU, FC(512->C)."""

    registry_name = "shallow_cnn"

    def __init__(self, num_classes: int = 10, in_channels: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 32, 5)
        self.conv2 = nn.Conv2d(32, 64, 5)
        self.fc1 = nn.Linear(64 * 4 * 4, 512)
        self.fc2 = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = max_pool2(torch.relu(self.conv1(x)))
        x = max_pool2(torch.relu(self.conv2(x)))
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class MLP2(nn.Module):
    """Two-layer net 784-128-C with ReLU (PrivSGP-VR's MNIST model)."""

    registry_name = "mlp_2layer"

    def __init__(self, num_classes: int = 10, in_features: int = 784, hidden: int = 128) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class PartPSPMLP(nn.Module):
    """PartPSP's three-layer tanh MLP (the paper's MNIST experiments).

    ``structure="code10"`` (the PartPSP-1 network): ``h = tanh(W1 x + b1)``,
    ``out = h + tanh(W3 tanh(W2 h + b2) + b3)``; shared block = ``l1``.
    ``structure="res784"`` (PartPSP-2 and the fully shared model): ``z = x + tanh(W2 tanh(W1 x + b1) + b2)``,
    ``out = tanh(W3 z + b3)``; shared block = ``l1``, ``l2``.
    Both structures have the same parameters: ``l1`` Linear(784, C) (7,850), ``l2`` Linear(C, 784)
    (8,624), ``l3`` Linear(784, C) (7,850); d = 24,324 for C = 10.  Build PartPSP-1 runs with
    ``build_model("partpsp_mlp", structure="code10")``.  Input (N, 784) or (N, 1, 28, 28);
    output (N, C) bounded logits.
    """

    registry_name = "partpsp_mlp"

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

    registry_name = "lenet"

    def __init__(self, num_classes: int = 10, in_channels: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = max_pool2(torch.relu(self.conv1(x)))
        x = max_pool2(torch.relu(self.conv2(x)))
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


class ResNetGN(nn.Module):
    """CIFAR ResNet (3x3 stride-1 stem, no max-pool, BasicBlocks, widths 64-128-256-512, strides 1-2-2-2,
    global average pool, Linear head) with GroupNorm(``groups``) in place of BatchNorm.

    Input (N, in_channels, H, W) float32, e.g. (N, 3, 32, 32); output (N, num_classes) logits.
    Parameter names follow torchvision (``conv1``, ``gn1``, ``layer1..4``, ``fc``).
    """

    registry_name = "resnet_cifar_gn"

    def __init__(self, blocks=(2, 2, 2, 2), num_classes: int = 10, in_channels: int = 3, groups: int = 32) -> None:
        super().__init__()
        check_int("groups", groups, minimum=1)
        if 64 % groups:
            raise ValueError(f"groups must divide 64 (the smallest width), got {groups}; use 1, 2, 4, 8, 16, 32 or 64")
        self.conv1 = nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False)
        self.gn1 = nn.GroupNorm(groups, 64)
        layers, cin = [], 64
        for (cout, stride), nb in zip(((64, 1), (128, 2), (256, 2), (512, 2)), blocks):
            rest = [_Block(cout, cout, 1, groups) for _ in range(nb - 1)]
            layers.append(nn.Sequential(_Block(cin, cout, stride, groups), *rest))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.gn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class ResNet18GN(ResNetGN):
    """CIFAR ResNet-18 ([2, 2, 2, 2]) with GroupNorm; d = 11,173,962 for 10 classes (PrivSGP-VR, Sec. 5.1)."""

    registry_name = "resnet18_cifar_gn"

    def __init__(self, num_classes: int = 10, in_channels: int = 3, groups: int = 32) -> None:
        super().__init__((2, 2, 2, 2), num_classes, in_channels, groups)


class ResNet34GN(ResNetGN):
    """CIFAR ResNet-34 ([3, 4, 6, 3]) with GroupNorm (Gau-LRQ, Sec. VII, CIFAR-100)."""

    registry_name = "resnet34_cifar_gn"

    def __init__(self, num_classes: int = 10, in_channels: int = 3, groups: int = 32) -> None:
        super().__init__((3, 4, 6, 3), num_classes, in_channels, groups)


class ResNet18TVBN(nn.Module):
    """torchvision ResNet-18 (7x7 stem, max-pool, BatchNorm) with a ``num_classes`` head (DPPS's FMNIST runs).

    The submodules are torchvision's own (same parameter names: ``conv1``, ``bn1``,
    ``layer1..4``, ``fc``).  Grey (N, 1, H, W) inputs are replicated to 3 channels, as in the
    DPPS code; no resizing.  Has BatchNorm: not for per-sample DP.
    """

    registry_name = "resnet18_tv_bn"

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        try:
            from torchvision.models import resnet18
        except Exception as exc:  # pragma: no cover - torchvision is installed here
            raise ImportError(f"model 'resnet18_tv_bn' needs torchvision, got {type(exc).__name__}: {exc}") from exc
        net = resnet18(weights=None, num_classes=num_classes)
        for part in ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4", "avgpool", "fc"):
            setattr(self, part, getattr(net, part))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class LogReg(nn.Module):
    """Multinomial logistic regression (one Linear layer) for convex tests."""

    registry_name = "logreg"

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
    "resnet34_cifar_gn": ResNet34GN,
    "resnet18_tv_bn": ResNet18TVBN,
    "logreg": LogReg,
}

#: PartPSP splits: shared parameter-name prefixes per (model, split) (the PartPSP paper's partitions).
_SPLITS = {
    ("partpsp_mlp", "partpsp1"): ("l1.",),
    ("partpsp_mlp", "partpsp2"): ("l1.", "l2."),
}
for _m, _norm in (("resnet18_cifar_gn", "gn1."), ("resnet34_cifar_gn", "gn1."), ("resnet18_tv_bn", "bn1.")):
    _SPLITS[(_m, "partpsp1")] = ("conv1.", _norm, "layer1.")
    _SPLITS[(_m, "partpsp2")] = ("conv1.", _norm, "layer1.", "layer2.")
SPLITS = ("partpsp1", "partpsp2", "all", "all_but_head")


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


def model_name_of(model: nn.Module) -> str:
    """The registry name of a model built by :func:`build_model` (e.g. ``"partpsp_mlp"``)."""
    name = getattr(type(model), "registry_name", None)
    if name not in MODELS:
        raise ValueError(
            f"model must be one built by build_model (one of {sorted(MODELS)}), got {type(model).__name__}; "
            "pass the registry name explicitly: shared_parameter_names(name, split, model)"
        )
    return name


def shared_parameter_names(model: nn.Module | str, split: str, module: nn.Module | None = None) -> list[str]:
    """Names of the parameters PartPSP shares (gossips) for ``split``; the rest is the node-local head.

    Parameters
    ----------
    model : nn.Module or str
        A model from :func:`build_model`; or its registry name, followed by the module as
        ``module`` (the older form ``shared_parameter_names(name, split, model)``).
    split : str
        ``"partpsp1"`` / ``"partpsp2"`` (the PartPSP paper: MLP d_s = 7,850 / 16,474;
        torchvision ResNet-18 d_s = 157,504 / 683,072), ``"all"`` (SGPDP / SGP: every
        parameter, our choice) or ``"all_but_head"`` (every parameter except the
        last Linear layer, the code's "full" variant offered as an option).

    Returns
    -------
    list of str, in ``named_parameters`` order.
    """
    if isinstance(model, str):
        if module is None:
            raise ValueError(f"shared_parameter_names({model!r}, {split!r}) needs the module too, got None; "
                             "pass the model object instead of its name")
        name = check_choice("model", model, MODELS)
    else:
        module, name = model, model_name_of(model)
    check_choice("PartPSP split", split, SPLITS)
    names = [n for n, _ in module.named_parameters()]
    if split == "all":
        return names
    if split == "all_but_head":
        last = [m for m, mod in module.named_modules() if isinstance(mod, nn.Linear)][-1]
        return [n for n in names if not n.startswith(last + ".")]
    key = (name, split)
    if key not in _SPLITS:
        valid = sorted({s for (m, s) in _SPLITS if m == name} | {"all", "all_but_head"})
        raise ValueError(
            f"unknown PartPSP split {split!r} for model {name!r}, got no such split; valid choices are {valid}"
        )
    return [n for n in names if n.startswith(_SPLITS[key])]
