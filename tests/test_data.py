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
    monkeypatch.setattr(D, "_torchvision", lambda *a: None)
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
