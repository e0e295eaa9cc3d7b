"""Datasets (offline Fashion-MNIST, labelled synthetic stand-ins) and partitioning."""

from __future__ import annotations

import numpy as np
import pytest

from flower_dp.data import FASHION_MNIST_DIR, load_dataset, partition

needs_fmnist = pytest.mark.skipif(
    not FASHION_MNIST_DIR.is_dir(), reason="apt-get install dataset-fashion-mnist (installed by scripts/test.sh)"
)


@needs_fmnist
def test_fashion_mnist_offline_sizes_and_normalisation():
    """60,000 / 10,000 samples, 10 classes, 1x28x28, normalised to mean ~0 and std ~1."""
    train = load_dataset("fashion_mnist", train=True)
    test = load_dataset("fashion_mnist", train=False)
    assert train.x.shape == (60000, 1, 28, 28) and test.x.shape == (10000, 1, 28, 28)
    assert train.y.min() == 0 and train.y.max() == 9 and not train.synthetic
    assert abs(float(train.x.mean())) < 1e-3 and abs(float(train.x.std()) - 1) < 1e-2
    assert np.bincount(train.y.numpy()).tolist() == [6000] * 10


def test_unit_scaling_keeps_pixels_in_0_1_and_is_a_config_key():
    """scaling="unit" is pixels / 255 (ToTensor alone, the DPPS authors' loader); "standard" is the same data
    standardised; the experiment config takes it as data.scaling and refuses other values."""
    from flower_dp.errors import ConfigError
    from flower_dp.experiments import config_from_dict

    unit = load_dataset("synthetic_fashion_mnist", train=False, scaling="unit")
    std = load_dataset("synthetic_fashion_mnist", train=False)
    assert float(unit.x.min()) >= 0.0 and float(unit.x.max()) <= 1.0 and (unit.y == std.y).all()
    assert np.allclose(((unit.x - 0.2860) / 0.3530).numpy(), std.x.numpy(), atol=1e-5)
    assert config_from_dict({"data": {"scaling": "unit"}}).data["scaling"] == "unit"
    assert config_from_dict({}).data["scaling"] == "standard"
    with pytest.raises(ConfigError, match="data.scaling must be 'standard' or 'unit', got 'minmax'"):
        config_from_dict({"data": {"scaling": "minmax"}})
    with pytest.raises(ValueError, match="scaling"):
        load_dataset("synthetic_fashion_mnist", scaling="minmax")


def test_fashion_mnist_from_torchvision_style_root(tmp_path):
    """IDX files under <root>/FashionMNIST/raw are found (gzip or not)."""
    import gzip

    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    imgs = np.arange(3 * 28 * 28, dtype=np.uint8).reshape(3, 28, 28)
    head = (0x00000803).to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in (3, 28, 28))
    (raw / "t10k-images-idx3-ubyte").write_bytes(head + imgs.tobytes())
    with gzip.open(raw / "t10k-labels-idx1-ubyte.gz", "wb") as f:
        f.write((0x00000801).to_bytes(4, "big") + (3).to_bytes(4, "big") + bytes([1, 2, 3]))
    ds = load_dataset("fashion_mnist", train=False, root=str(tmp_path))
    assert ds.x.shape == (3, 1, 28, 28) and ds.y.tolist() == [1, 2, 3]


def test_synthetic_only_by_name_and_labelled():
    ds = load_dataset("synthetic_cifar10", train=False)
    assert ds.synthetic and "synthetic" in ds.name and ds.x.shape == (10000, 3, 32, 32)


def test_missing_dataset_error_says_how_to_get_it(tmp_path, monkeypatch):
    import flower_dp.data as D

    monkeypatch.setattr(D, "FASHION_MNIST_DIR", tmp_path / "none")
    monkeypatch.setattr(D, "_torchvision", lambda *a: (None, "URLError: no network"))
    D._load_mnist_like.cache_clear()
    D.load_dataset.cache_clear()
    with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist.*synthetic_fashion_mnist"):
        D.load_dataset("fashion_mnist", root=str(tmp_path))
    D._load_mnist_like.cache_clear()
    D.load_dataset.cache_clear()
    with pytest.raises(ValueError, match="unknown dataset 'imagenet'; valid choices"):
        D.load_dataset("imagenet")


@pytest.mark.parametrize("scheme", ["shuffle_split", "iid", "dirichlet"])
def test_partitions_disjoint_deterministic(scheme):
    labels = np.repeat(np.arange(10), 100)
    a = partition(labels, 7, scheme=scheme, seed=3)
    b = partition(labels, 7, scheme=scheme, seed=3)
    c = partition(labels, 7, scheme=scheme, seed=4)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    allidx = np.concatenate(a)
    assert len(np.unique(allidx)) == len(allidx) and all(len(p) >= 1 for p in a)
    if scheme != "dirichlet":
        assert {len(p) for p in a} == {1000 // 7}


def test_dirichlet_skews_labels():
    labels = np.repeat(np.arange(10), 500)
    parts = partition(labels, 10, scheme="dirichlet", alpha=0.1, seed=0)
    dominant = [np.bincount(labels[p], minlength=10).max() / len(p) for p in parts]
    assert np.mean(dominant) > 0.5  # IID would be ~0.1


def test_partition_errors():
    with pytest.raises(ValueError, match="n_nodes must be <= the number of samples \\(5\\).*got 6"):
        partition(np.zeros(5), 6)
    with pytest.raises(ValueError, match="alpha must be > 0"):
        partition(np.zeros(50), 2, scheme="dirichlet", alpha=0)


@needs_fmnist
def test_fashion_mnist_cached_and_typed():
    """Loaded once per process (many nodes share it); float32 images, int64 labels, real data."""
    a = load_dataset("fashion_mnist", train=False)
    assert load_dataset("fashion_mnist", train=False) is a
    assert a.x.dtype.is_floating_point and str(a.x.dtype) == "torch.float32" and str(a.y.dtype) == "torch.int64"
    assert a.num_classes == 10 and a.name == "fashion_mnist" and len(a) == 10000


@pytest.mark.parametrize("name, shape", [("synthetic_mnist", (1, 28, 28)), ("synthetic_fashion_mnist", (1, 28, 28)),
                                         ("synthetic_cifar10", (3, 32, 32))])
def test_synthetic_shapes_and_learnable(name, shape):
    """Same shapes as the real data; a nearest-class-mean rule fitted on test samples classifies
    held-out samples well (the stand-in is learnable, and train/test share the class templates)."""
    test = load_dataset(name, train=False)
    assert test.synthetic and test.x.shape == (10000, *shape) and int(test.y.min()) == 0 and int(test.y.max()) == 9
    x = test.x.flatten(1).numpy()[:4000]
    y = test.y.numpy()[:4000]
    means = np.stack([x[:2000][y[:2000] == c].mean(0) for c in range(10)])
    pred = ((x[2000:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
    assert (pred == y[2000:]).mean() > 0.9


def test_synthetic_deterministic_across_processes():
    """The stand-in does not depend on PYTHONHASHSEED (no hash()): a fresh process agrees with this one."""
    import hashlib
    import os
    import subprocess
    import sys

    code = ("import hashlib; from flower_dp.data import load_dataset; d = load_dataset('synthetic_mnist', train=False);"
            "print(hashlib.sha256(d.x[:50].numpy().tobytes() + d.y.numpy().tobytes()).hexdigest())")
    here = load_dataset("synthetic_mnist", train=False)
    want = hashlib.sha256(here.x[:50].numpy().tobytes() + here.y.numpy().tobytes()).hexdigest()
    for hs in ("12345",):
        env = dict(os.environ, PYTHONHASHSEED=hs)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == want


def test_shuffle_split_covers_when_divisible_and_drops_remainder():
    """Equal J = floor(N / n); covering when n divides N."""
    from flower_dp.data import partition_sizes

    parts = partition(np.zeros(1000), 8, seed=1)
    assert partition_sizes(parts) == [125] * 8
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(1000))
    parts = partition(np.zeros(1000), 7, seed=1)
    assert partition_sizes(parts) == [142] * 7 and len(np.unique(np.concatenate(parts))) == 994
    # the papers' 20-node Fashion-MNIST split: J = 3000
    assert partition_sizes(partition(np.zeros(60000), 20)) == [3000] * 20


def test_dirichlet_covers_and_every_node_gets_data_even_when_extreme():
    labels = np.repeat(np.arange(3), 10)
    parts = partition(labels, 25, scheme="dirichlet", alpha=0.01, seed=0)
    assert all(len(p) >= 1 for p in parts)
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(30))


def test_stratified_client_indices():
    """Gau-LRQ's data: per_class samples of each class, without replacement, deterministic in (seed, id)."""
    from flower_dp.data import stratified_client_indices

    labels = np.repeat(np.arange(10), 100)
    a = stratified_client_indices(labels, 3, per_class=50, seed=7)
    assert len(a) == 500 and len(np.unique(a)) == 500
    assert np.bincount(labels[a], minlength=10).tolist() == [50] * 10
    assert np.array_equal(a, stratified_client_indices(labels, 3, per_class=50, seed=7))
    assert not np.array_equal(a, stratified_client_indices(labels, 4, per_class=50, seed=7))
    with pytest.raises(ValueError, match="per_class must be <= the 100 samples of class 0, got 101"):
        stratified_client_indices(labels, 0, per_class=101)


def test_corrupt_idx_and_bad_labels_errors(tmp_path):
    import flower_dp.data as D

    bad = tmp_path / "x-idx3-ubyte"
    bad.write_bytes((0x00000803).to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in (3, 28, 28)) + b"\0" * 9)
    with pytest.raises(ValueError, match="truncated or corrupt.*got 25 bytes"):
        D._read_idx(bad)
    bad.write_bytes(b"\x12\x34\x56\x78")
    with pytest.raises(ValueError, match="not an unsigned-byte IDX file, got magic number 0x12345678"):
        D._read_idx(bad)
    with pytest.raises(ValueError, match="labels must be a 1-D array.*got shape \\(2, 5\\)"):
        partition(np.zeros((2, 5)), 2)
    with pytest.raises(ValueError, match="unknown partition scheme 'pathological'"):
        partition(np.zeros(10), 2, scheme="pathological")
    with pytest.raises(ValueError, match="seed must be >= 0, got -1"):
        partition(np.zeros(10), 2, seed=-1)


def test_mnist_and_cifar_without_network_say_how_to_get_them(tmp_path, monkeypatch):
    """No silent synthetic fallback: the error names the torchvision failure, root, and the stand-in."""
    import flower_dp.data as D

    monkeypatch.setattr(D, "_torchvision", lambda *a: (None, "URLError: no network"))
    monkeypatch.setenv("HOME", str(tmp_path))
    D._load_mnist_like.cache_clear()
    D.load_dataset.cache_clear()
    with pytest.raises(FileNotFoundError, match="'mnist' not found.*got URLError: no network.*'synthetic_mnist'"):
        D.load_dataset("mnist", root=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="'cifar10' needs torchvision.*got URLError.*'synthetic_cifar10'"):
        D.load_dataset("cifar10", root=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="'cifar100' needs.*FLOWER_DP_DATA.*cifar-100-python/.*'synthetic_cifar100'"):
        D.load_dataset("cifar100", root=str(tmp_path))
    D._load_mnist_like.cache_clear()
    D.load_dataset.cache_clear()


def test_flwr_datasets_backend_dirichlet_and_iid():
    """Issue 2: Flower Datasets' partitioners where they fit (optional dependency flwr-datasets)."""
    pytest.importorskip("flwr_datasets")
    from flower_dp.data import partition_sizes

    labels = np.repeat(np.arange(10), 200)
    a = partition(labels, 8, scheme="dirichlet", alpha=0.1, seed=5, backend="flwr_datasets")
    b = partition(labels, 8, scheme="dirichlet", alpha=0.1, seed=5, backend="flwr_datasets")
    assert all(np.array_equal(x, y) for x, y in zip(a, b))  # deterministic given the seed
    assert np.array_equal(np.sort(np.concatenate(a)), np.arange(2000))  # disjoint and covering
    assert min(partition_sizes(a)) >= 1
    dominant = [np.bincount(labels[p], minlength=10).max() / len(p) for p in a]
    assert np.mean(dominant) > 0.4  # label skew (IID would be ~0.1)
    iid = partition(labels, 7, scheme="iid", seed=5, backend="flwr_datasets")
    assert sorted(set(partition_sizes(iid))) == [285, 286] and len(np.unique(np.concatenate(iid))) == 2000
    # shuffled before sharding: every node sees (nearly) every class
    assert all(len(np.unique(labels[p])) == 10 for p in iid)


def test_flwr_datasets_backend_errors(monkeypatch):
    import builtins

    with pytest.raises(ValueError, match="unknown partition backend 'hf'; valid choices"):
        partition(np.zeros(10), 2, backend="hf")
    with pytest.raises(ValueError, match="'shuffle_split' .* has no flwr-datasets partitioner"):
        partition(np.zeros(10), 2, scheme="shuffle_split", backend="flwr_datasets")
    real_import = builtins.__import__

    def no_fds(name, *args, **kwargs):
        if name.startswith("flwr_datasets"):
            raise ImportError("No module named 'flwr_datasets'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_fds)
    with pytest.raises(ImportError, match="needs the flwr-datasets package.*pip install flwr-datasets"):
        partition(np.zeros(10), 2, scheme="dirichlet", backend="flwr_datasets")


def test_cifar100_stand_in_has_100_classes_and_models_follow():
    """CIFAR-100 (Gau-LRQ Table IV): 100 classes end to end, from the dataset to the model's head."""
    from flower_dp.data import num_classes
    from flower_dp.experiments.gau_lrq import new_model

    d = load_dataset("synthetic_cifar100", train=False)
    assert d.num_classes == 100 == num_classes("cifar100") and int(d.y.max()) == 99 and d.x.shape == (10000, 3, 32, 32)
    assert num_classes("synthetic_fashion_mnist") == 10
    assert new_model("resnet34_cifar_gn", num_classes=100)(d.x[:2]).shape == (2, 100)
    with pytest.raises(ValueError, match="cifar1000"):
        num_classes("cifar1000")
