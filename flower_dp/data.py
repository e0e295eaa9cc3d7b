"""Datasets (offline first) and partitioning across nodes.

Fashion-MNIST is read from its IDX files: the Debian package ``dataset-fashion-mnist``
(``/usr/share/datasets/fashion-mnist/``), a torchvision-style root
(``<root>/FashionMNIST/raw/``), or a torchvision download where the network allows.
MNIST and CIFAR-10 come through torchvision when available.  A synthetic stand-in is
only ever used when asked for by name (``synthetic_mnist`` ...), and says so in its
``name`` and ``synthetic`` flag.

Partitions are lists of index arrays, deterministic given the seed; per-node sample
counts ``J_i = len(part_i)`` feed the accountants (sampling rate ``q = B / J_i``).
``partition(..., backend="flwr_datasets")`` uses Flower Datasets' ``DirichletPartitioner`` /
``IidPartitioner`` (optional: ``pip install flwr-datasets``) where they fit; the papers'
"shuffle and split evenly" (equal J, remainder dropped) has no flwr-datasets counterpart.
"""

from __future__ import annotations

import functools
import gzip
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ._checks import check_choice, check_int, check_positive

__all__ = [
    "ArrayDataset",
    "as_tensors",
    "load_dataset",
    "partition",
    "partition_sizes",
    "stratified_client_indices",
    "DATASETS",
    "num_classes",
    "PARTITION_SCHEMES",
    "SCALINGS",
    "PARTITION_BACKENDS",
    "FASHION_MNIST_DIR",
]

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
DATASETS = ("fashion_mnist", "mnist", "cifar10", "cifar100", "synthetic_fashion_mnist", "synthetic_mnist",
            "synthetic_cifar10", "synthetic_cifar100")
PARTITION_SCHEMES = ("shuffle_split", "iid", "dirichlet")
#: input scaling: "standard" (per channel to mean 0, std 1 over the training set) or "unit" (pixels / 255, in [0, 1],
#: torchvision's ToTensor alone, as the DPPS authors' MNIST loader)
SCALINGS = ("standard", "unit")
PARTITION_BACKENDS = ("builtin", "flwr_datasets")
_STATS = {  # per-channel mean/std of the training sets
    "fashion_mnist": ((0.2860,), (0.3530,)),
    "mnist": ((0.1307,), (0.3081,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
_SHAPES = {"fashion_mnist": (1, 28, 28), "mnist": (1, 28, 28), "cifar10": (3, 32, 32), "cifar100": (3, 32, 32)}
_SIZES = {"fashion_mnist": (60000, 10000), "mnist": (60000, 10000), "cifar10": (50000, 10000),
          "cifar100": (50000, 10000)}
_CLASSES = {"fashion_mnist": 10, "mnist": 10, "cifar10": 10, "cifar100": 100}


def num_classes(name: str) -> int:
    """Number of classes of a dataset name (without loading it), e.g. 100 for ``"cifar100"``."""
    check_choice("dataset", name, DATASETS)
    return _CLASSES[name[len("synthetic_"):] if name.startswith("synthetic_") else name]


@dataclass(frozen=True)
class ArrayDataset:
    """An in-memory labelled dataset.

    Attributes
    ----------
    x : Tensor, shape (N, C, H, W), float32, normalised per channel (``scaling="unit"``: in [0, 1])
    y : Tensor, shape (N,), int64 class labels in [0, num_classes)
    num_classes : int
    name : str
        Includes ``synthetic`` for stand-ins.
    synthetic : bool
    """

    x: torch.Tensor
    y: torch.Tensor
    num_classes: int
    name: str
    synthetic: bool = False

    def __len__(self) -> int:
        return len(self.y)


def _read_idx(path: Path) -> np.ndarray:
    """Parse an unsigned-byte IDX file (gzipped or not) into a uint8 array of its stated shape."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    magic = int.from_bytes(data[0:4], "big") if len(data) >= 4 else -1
    ndim = magic & 0xFF
    if magic < 0 or magic >> 8 != 0x08 or not 1 <= ndim <= 4:
        raise ValueError(
            f"{path} is not an unsigned-byte IDX file, got magic number {magic:#x} (expected 0x801 or 0x803); "
            "re-download the dataset"
        )
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    expected = 4 + 4 * ndim + int(np.prod(dims))
    if len(data) != expected:
        raise ValueError(
            f"{path} is truncated or corrupt: header says shape {dims} ({expected} bytes), got {len(data)} bytes; "
            "re-download the dataset"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def _find_idx(folder: Path, stem: str) -> Path | None:
    for name in (f"{stem}.gz", stem):
        if (folder / name).is_file():
            return folder / name
    return None


def _idx_folders(root: str | None, tv_name: str) -> list[Path]:
    out = []
    if root:
        out += [Path(root), Path(root) / tv_name / "raw"]
    env = os.environ.get("FLOWER_DP_DATA")
    if env:
        out += [Path(env), Path(env) / tv_name / "raw"]
    if tv_name == "FashionMNIST":
        out.append(FASHION_MNIST_DIR)
    return out


def _default_cache() -> Path:
    return Path.home() / ".cache" / "flower_dp"


@functools.lru_cache(maxsize=8)
def _load_mnist_like(name: str, train: bool, root: str | None) -> tuple[np.ndarray, np.ndarray]:
    tv_name = {"fashion_mnist": "FashionMNIST", "mnist": "MNIST"}[name]
    prefix = "train" if train else "t10k"
    folders = _idx_folders(root, tv_name) + [_default_cache() / tv_name / "raw"]
    for folder in folders:
        img = _find_idx(folder, f"{prefix}-images-idx3-ubyte")
        lab = _find_idx(folder, f"{prefix}-labels-idx1-ubyte")
        if img and lab:
            x, y = _read_idx(img), _read_idx(lab)
            if len(x) != len(y):
                raise ValueError(f"{img} has {len(x)} images but {lab} has {len(y)} labels, got a mismatch")
            return x, y
    arrays, reason = _torchvision(name, train, root)
    if arrays is not None:
        return arrays
    hint = "apt-get install dataset-fashion-mnist, or " if name == "fashion_mnist" else ""
    raise FileNotFoundError(
        f"dataset {name!r} not found: no IDX files {prefix}-images-idx3-ubyte[.gz] in {[str(p) for p in folders]}, "
        f"and torchvision could not download it (got {reason}); {hint}put the IDX files under a folder and pass "
        f"it as root (or set FLOWER_DP_DATA), or ask for the clearly labelled stand-in 'synthetic_{name}'"
    )


def _torchvision(name: str, train: bool, root: str | None) -> tuple[tuple[np.ndarray, np.ndarray] | None, str]:
    """``((x uint8, y), "")`` through torchvision (download if needed), or ``(None, reason)``."""
    try:
        import torchvision.datasets as tvd
    except Exception as exc:  # torchvision missing or broken beside this torch
        return None, f"torchvision import failed: {type(exc).__name__}: {exc}"
    cls = {"fashion_mnist": "FashionMNIST", "mnist": "MNIST", "cifar10": "CIFAR10", "cifar100": "CIFAR100"}[name]
    target = root or os.environ.get("FLOWER_DP_DATA") or str(_default_cache())
    try:
        ds = getattr(tvd, cls)(target, train=train, download=True)
    except Exception as exc:  # no network, or a corrupt download
        return None, f"{type(exc).__name__}: {str(exc)[:200]}"
    return (np.asarray(ds.data), np.asarray(ds.targets)), ""


_BASE_CODE = {"fashion_mnist": 1, "mnist": 2, "cifar10": 3, "cifar100": 4}  # stable across processes (never hash())


@functools.lru_cache(maxsize=8)
def _synthetic(base: str, train: bool, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A learnable stand-in with the real dataset's shapes and sizes, uint8 like the real data.

    One fixed template per class ``T_c ~ U(0, 255)`` per pixel (shared by the train and test
    splits), each sample ``x = clip(T_y / 2 + N(127, 60^2) / 2, 0, 255)``, labels uniform.
    Deterministic in ``(base, train, seed)``, independent of the process.
    """
    shape = _SHAPES[base]
    n = _SIZES[base][0 if train else 1]
    code, k = _BASE_CODE[base], _CLASSES[base]
    templates = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(code, 0))).uniform(
        0, 255, size=(k, *shape)
    ).astype(np.float32)
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(code, 1 if train else 2)))
    y = rng.integers(0, k, size=n)
    x = np.empty((n, *shape), dtype=np.uint8)
    for lo in range(0, n, 5000):  # chunks keep the float32 temporaries small
        hi = min(n, lo + 5000)
        noise = rng.standard_normal((hi - lo, *shape), dtype=np.float32) * 60.0 + 127.0
        x[lo:hi] = np.clip(templates[y[lo:hi]] * 0.5 + noise * 0.5, 0, 255).astype(np.uint8)
    if shape[0] == 3:
        x = x.transpose(0, 2, 3, 1)  # store HWC like torchvision's CIFAR
    else:
        x = x[:, 0]
    return x, y


def _to_dataset(x: np.ndarray, y: np.ndarray, base: str, name: str, synthetic: bool,
                scaling: str = "standard") -> ArrayDataset:
    xt = torch.from_numpy(np.array(x, dtype=np.float32)) / 255.0
    if xt.ndim == 3:
        xt = xt.unsqueeze(1)
    elif xt.ndim == 4 and xt.shape[-1] == 3:
        xt = xt.permute(0, 3, 1, 2).contiguous()
    if scaling == "standard":
        mean, std = _STATS[base]
        xt = (xt - torch.tensor(mean).view(-1, 1, 1)) / torch.tensor(std).view(-1, 1, 1)
    return ArrayDataset(xt, torch.from_numpy(np.array(y, dtype=np.int64)), _CLASSES[base], name, synthetic)


@functools.lru_cache(maxsize=8)
def load_dataset(name: str, *, train: bool = True, root: str | None = None, scaling: str = "standard") -> ArrayDataset:
    """Load a dataset by name.

    Parameters
    ----------
    name : str
        One of ``fashion_mnist``, ``mnist``, ``cifar10``, ``cifar100`` or a stand-in ``synthetic_<name>``.
    train : bool
        Training split (60,000 / 50,000 samples) or test split (10,000).
    root : str, optional
        Folder holding the IDX files (or a torchvision root).
    scaling : str
        ``"standard"`` (per channel to mean 0, std 1) or ``"unit"`` (pixels / 255, in [0, 1]); see :data:`SCALINGS`.

    The result is cached per process (many nodes load the same data); treat it as read-only.
    """
    check_choice("dataset", name, DATASETS)
    check_choice("scaling", scaling, SCALINGS)
    if name.startswith("synthetic_"):
        base = name[len("synthetic_") :]
        x, y = _synthetic(base, train)
        return _to_dataset(x, y, base, name, synthetic=True, scaling=scaling)
    if name in ("cifar10", "cifar100"):
        arrays, reason = _torchvision(name, train, root)
        if arrays is None:
            folder = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}[name]
            raise FileNotFoundError(
                f"dataset {name!r} needs torchvision and network access, got {reason}; or pass as root (or set "
                f"FLOWER_DP_DATA to) a torchvision root that already holds {folder}/, or ask for "
                f"'synthetic_{name}' for a clearly labelled stand-in"
            )
        return _to_dataset(*arrays, name, name, synthetic=False, scaling=scaling)
    x, y = _load_mnist_like(name, train, root)
    return _to_dataset(x, y, name, name, synthetic=False, scaling=scaling)


def partition(
    labels: np.ndarray | torch.Tensor,
    n_nodes: int,
    *,
    scheme: str = "shuffle_split",
    alpha: float = 0.5,
    seed: int = 0,
    backend: str = "builtin",
) -> list[np.ndarray]:
    """Split sample indices over ``n_nodes`` nodes.

    Parameters
    ----------
    labels : array, shape (N,)
        Class labels (used by ``dirichlet``; only the length matters otherwise).
    n_nodes : int
    scheme : str
        ``shuffle_split`` / ``iid`` (the papers': shuffle, then split into equal parts; the
        remainder ``N mod n`` is dropped so every ``J_i`` is equal), or ``dirichlet``
        (label skew: each class is spread over nodes with proportions ~ Dirichlet(alpha)).
    alpha : float
        Dirichlet concentration (> 0; smaller = more skew).
    seed : int
    backend : str
        ``builtin`` (default; no extra dependency) or ``flwr_datasets``: Flower Datasets'
        ``DirichletPartitioner`` (``self_balancing=False``, ``min_partition_size=1``, seeded
        with ``seed``) for ``dirichlet`` and ``IidPartitioner`` on a seeded shuffle for ``iid``
        (sizes then differ by at most one and cover every sample).  Both backends are
        deterministic given the seed, but they draw different partitions.

    Returns
    -------
    list of n_nodes sorted int64 index arrays, disjoint; they cover all samples except the
    dropped remainder of ``shuffle_split`` / builtin ``iid`` (every node
    gets ``J = floor(N / n)``).  ``dirichlet`` covers all samples and gives every node >= 1.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be a 1-D array of class labels, got shape {labels.shape}")
    seed = check_int("seed", seed, minimum=0)
    n = len(labels)
    n_nodes = check_int("n_nodes", n_nodes, minimum=1)
    check_choice("partition scheme", scheme, PARTITION_SCHEMES)
    check_choice("partition backend", backend, PARTITION_BACKENDS)
    if n_nodes > n:
        raise ValueError(
            f"n_nodes must be <= the number of samples ({n}) so every node gets data, got {n_nodes}; "
            "use fewer nodes or a larger dataset"
        )
    if backend == "flwr_datasets":
        return _partition_flwr_datasets(labels, n_nodes, scheme, alpha, seed)
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(n_nodes, 17)))
    if scheme in ("shuffle_split", "iid"):
        perm = rng.permutation(n)
        per = n // n_nodes
        return [np.sort(perm[i * per : (i + 1) * per]).astype(np.int64) for i in range(n_nodes)]
    alpha = check_positive("alpha", alpha)
    parts: list[list[int]] = [[] for _ in range(n_nodes)]
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        props = rng.dirichlet(np.full(n_nodes, alpha))
        cuts = (np.cumsum(props)[:-1] * len(idx)).astype(int)
        for i, chunk in enumerate(np.split(idx, cuts)):
            parts[i].extend(chunk.tolist())
    # every node gets at least one sample: move one from the largest part to each empty one
    for i in range(n_nodes):
        if not parts[i]:
            donor = max(range(n_nodes), key=lambda j: len(parts[j]))
            parts[i].append(parts[donor].pop())
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def _partition_flwr_datasets(labels: np.ndarray, n_nodes: int, scheme: str, alpha: float, seed: int) -> list[np.ndarray]:
    """``partition(..., backend="flwr_datasets")``: run a Flower Datasets partitioner on an index/label table."""
    if scheme == "shuffle_split":
        raise ValueError(
            "partition scheme 'shuffle_split' (equal J, remainder dropped) has no flwr-datasets partitioner, "
            "got backend='flwr_datasets'; use backend='builtin', or scheme 'iid' / 'dirichlet'"
        )
    try:
        import datasets
        from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner
    except ImportError as exc:
        raise ImportError(
            f"partition backend 'flwr_datasets' needs the flwr-datasets package, got {type(exc).__name__}: {exc}; "
            "pip install flwr-datasets, or use backend='builtin'"
        ) from exc
    n = len(labels)
    table = datasets.Dataset.from_dict({"label": labels.astype(np.int64), "index": np.arange(n, dtype=np.int64)})
    if scheme == "iid":
        perm = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(n_nodes, 17))).permutation(n)
        table = table.select(perm)  # IidPartitioner shards contiguously: shuffle first
        partitioner = IidPartitioner(num_partitions=n_nodes)
    else:
        partitioner = DirichletPartitioner(
            num_partitions=n_nodes, partition_by="label", alpha=check_positive("alpha", alpha),
            min_partition_size=1, self_balancing=False, shuffle=False, seed=seed,
        )
    partitioner.dataset = table
    return [np.sort(np.asarray(partitioner.load_partition(i)["index"], dtype=np.int64)) for i in range(n_nodes)]


def partition_sizes(parts: list[np.ndarray]) -> list[int]:
    """Per-node sample counts ``J_i = len(parts[i])`` (the accountants' ``q = B / J_i``)."""
    return [int(len(p)) for p in parts]


def stratified_client_indices(
    labels: np.ndarray | torch.Tensor, partition_id: int, *, per_class: int, seed: int = 0
) -> np.ndarray:
    """Gau-LRQ's client data (its Sec. VII setting): ``per_class`` indices of every class, drawn without
    replacement, independently of the other clients (overlap between clients allowed).

    A deterministic function of ``(seed, partition_id)``, so 48,000 clients need not be
    materialised.  Returns sorted int64 indices, ``num_classes * per_class`` of them.
    """
    labels = np.asarray(labels)
    partition_id = check_int("partition_id", partition_id, minimum=0)
    per_class = check_int("per_class", per_class, minimum=1)
    seed = check_int("seed", seed, minimum=0)
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(partition_id, 23)))
    out = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        if per_class > len(idx):
            raise ValueError(
                f"per_class must be <= the {len(idx)} samples of class {c}, got {per_class}; use a smaller per_class"
            )
        out.append(rng.choice(idx, size=per_class, replace=False))
    return np.sort(np.concatenate(out)).astype(np.int64)


#: batch-dict keys tried, in order, for the inputs and the labels (Flower's templates and flwr-datasets use "img"
#: / "image" and "label")
INPUT_KEYS = ("img", "image", "x", "pixel_values", "features", "input", "inputs")
LABEL_KEYS = ("label", "labels", "y", "target", "targets", "fine_label")


def _batch_pair(batch: object, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels) of one batch: a ``(x, y)`` pair or a dict with one input key and one label key."""
    if isinstance(batch, dict):
        xk = next((k for k in INPUT_KEYS if k in batch), None)
        yk = next((k for k in LABEL_KEYS if k in batch), None)
        if xk is None or yk is None:
            raise ValueError(f"{where}: a batch with keys {sorted(batch)} has no input key (one of {INPUT_KEYS}) "
                             f"or no label key (one of {LABEL_KEYS}); rename the columns, or return (x, y) tensors")
        batch = (batch[xk], batch[yk])
    if not isinstance(batch, (tuple, list)) or len(batch) < 2:
        raise ValueError(f"{where}: a batch must be (inputs, labels) or a dict of columns, got {type(batch).__name__}")
    x, y = batch[0], batch[1]
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise ValueError(f"{where}: a batch holds {type(x).__name__} inputs and {type(y).__name__} labels, tensors "
                         "are needed; give the dataset a transform that makes tensors (flwr-datasets / Hugging Face: "
                         "partition.with_transform(...) or partition.with_format('torch'))")
    return x, y


def as_tensors(data: object, *, batch_size: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """All of a node's training samples as ``(x, y)`` tensors, from what a data loader of a Flower app returns.

    ``data`` may be ``(x, y)`` tensors or arrays; a ``torch.utils.data.DataLoader`` (or any iterable of batches,
    each ``(x, y)`` or a dict such as ``{"img": ..., "label": ...}``), read once in full; a map-style dataset
    (a ``torch.utils.data.Dataset`` or a flwr-datasets / Hugging Face partition with a tensor transform), read in
    batches of ``batch_size``; or a ``(trainloader, testloader)`` pair, as Flower's PyTorch template's
    ``load_data`` returns it, of which the first is used.  The samples' order is the loader's (shuffled or not):
    the node draws its own batches from all of them.
    """
    if isinstance(data, tuple) and len(data) == 2:
        first, second = data
        if isinstance(first, (torch.Tensor, np.ndarray)) and isinstance(second, (torch.Tensor, np.ndarray)):
            return torch.as_tensor(first), torch.as_tensor(second)
        data = first  # (trainloader, testloader): train on the first
    from torch.utils.data import DataLoader

    if isinstance(data, dict):
        raise ValueError(f"load_data returned a dict (keys {sorted(data)}); valid: (x, y) tensors, a DataLoader, a "
                         "dataset (torch or flwr-datasets partition) or a (trainloader, testloader) pair")
    if not isinstance(data, DataLoader) and hasattr(data, "__len__") and hasattr(data, "__getitem__"):
        data = DataLoader(data, batch_size=check_int("batch_size", batch_size, minimum=1), shuffle=False)
    if not hasattr(data, "__iter__"):
        raise ValueError(f"load_data returned {type(data).__name__}; valid: (x, y) tensors, a DataLoader, a dataset "
                         "(torch or flwr-datasets partition) or a (trainloader, testloader) pair")
    xs, ys = [], []
    for batch in data:
        x, y = _batch_pair(batch, f"load_data's {type(data).__name__}")
        xs.append(x)
        ys.append(y)
    if not xs:
        raise ValueError(f"load_data's {type(data).__name__} yielded no batch: the node's partition is empty")
    return torch.cat(xs), torch.cat(ys)
