"""The push-sum drop-in takes what a Flower app's ``load_data`` returns (issue 31): tensors, a DataLoader with
``(x, y)`` or dict batches, a dataset (torch or a flwr-datasets partition), or a (trainloader, testloader) pair."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from flower_dp.data import as_tensors

X = torch.arange(24, dtype=torch.float32).reshape(12, 2)
Y = torch.arange(12) % 3


def _sorted(x, y):
    order = torch.argsort(x[:, 0])
    return x[order], y[order]


@pytest.mark.parametrize("make", [
    lambda: (X, Y),
    lambda: (X.numpy(), Y.numpy()),
    lambda: DataLoader(TensorDataset(X, Y), batch_size=5, shuffle=True),
    lambda: DataLoader([{"img": X[i], "label": int(Y[i])} for i in range(12)], batch_size=5),
    lambda: (DataLoader([{"image": X[i], "labels": int(Y[i])} for i in range(12)], batch_size=4), None),
    lambda: TensorDataset(X, Y),
], ids=["tensors", "arrays", "loader-pairs", "loader-dicts", "train-test-pair", "dataset"])
def test_every_form_gives_all_samples(make):
    x, y = _sorted(*as_tensors(make()))
    assert torch.equal(x, X) and torch.equal(y, Y)


def test_flwr_datasets_partition_with_a_torch_format():
    datasets = pytest.importorskip("datasets")
    part = datasets.Dataset.from_dict({"img": X.tolist(), "label": Y.tolist()}).with_format("torch")
    x, y = as_tensors(part)
    assert torch.equal(x, X) and torch.equal(y, Y)


def test_unusable_batches_name_the_keys_and_the_fix():
    with pytest.raises(ValueError, match=r"keys \['a', 'b'\] has no input key.*rename the columns"):
        as_tensors(DataLoader([{"a": X[i], "b": Y[i]} for i in range(4)], batch_size=2))
    with pytest.raises(ValueError, match=r"list inputs and Tensor labels.*with_transform"):  # images not transformed
        as_tensors([{"img": "a.png", "label": 1}, {"img": "b.png", "label": 0}])
    with pytest.raises(ValueError, match="yielded no batch"):
        as_tensors(DataLoader(TensorDataset(X[:0], Y[:0]), batch_size=2))
