"""``flower_dp.models.max_pool2`` (issue 15/16 speed-up of the shallow CNN and LeNet) is ``F.max_pool2d(x, 2)`` bit
for bit: values, gradients (ties go to the first maximum in row-major order, as PyTorch's kernel sends them), NaN
windows, per-sample gradients under ``vmap``, and the fallback for odd sizes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import grad, vmap

from flower_dp.models import build_model, max_pool2


def _both(x, gout):
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = F.max_pool2d(xa, 2), max_pool2(xb)
    (ga,), (gb,) = torch.autograd.grad(ya, xa, gout), torch.autograd.grad(yb, xb, gout)
    return ya, yb, ga, gb


@pytest.mark.parametrize("shape", [(32, 32, 24, 24), (32, 64, 8, 8), (3, 6, 28, 28), (1, 1, 2, 2)])
def test_values_and_gradients_equal_max_pool2d(shape):
    g = torch.Generator().manual_seed(0)
    x = torch.relu(torch.randn(*shape, generator=g))  # ReLU outputs: many tied zeros, as in the models
    gout = torch.randn(shape[0], shape[1], shape[2] // 2, shape[3] // 2, generator=g)
    ya, yb, ga, gb = _both(x, gout)
    assert torch.equal(ya, yb) and torch.equal(ga, gb)


def test_ties_go_to_the_first_maximum_of_the_window():
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 3, (16, 4, 6, 6), generator=g).float()  # three values only: ties everywhere
    gout = torch.randn(16, 4, 3, 3, generator=g)
    _, _, ga, gb = _both(x, gout)
    assert torch.equal(ga, gb)
    # one window by hand: all four equal -> the top-left element gets the gradient
    _, _, _, gb = _both(torch.ones(1, 1, 2, 2), torch.full((1, 1, 1, 1), 3.0))
    assert gb.flatten().tolist() == [3.0, 0.0, 0.0, 0.0]


def test_nan_and_inf_windows_and_the_odd_size_fallback():
    x = torch.randn(2, 3, 6, 6)
    x[0, 1, 2, 3], x[1, 0, 0, 0], x[1, 2, 5, 5] = float("nan"), float("inf"), float("-inf")
    a, b = F.max_pool2d(x, 2), max_pool2(x)
    assert torch.equal(a.isnan(), b.isnan()) and torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))
    odd = torch.randn(2, 3, 7, 5)
    assert torch.equal(max_pool2(odd), F.max_pool2d(odd, 2))


def test_per_sample_gradients_under_vmap_and_the_models_use_it():
    w = torch.randn(4, 1, 3, 3, generator=torch.Generator().manual_seed(2))
    xs = torch.randn(5, 1, 10, 10, generator=torch.Generator().manual_seed(3))

    def loss(pool):
        return lambda w_, x: (pool(F.conv2d(x.unsqueeze(0), w_)) ** 2).sum()

    ours = vmap(grad(loss(max_pool2)), in_dims=(None, 0))(w, xs)
    ref = vmap(grad(loss(lambda t: F.max_pool2d(t, 2))), in_dims=(None, 0))(w, xs)
    assert torch.equal(ours, ref)


@pytest.mark.parametrize("name", ["shallow_cnn", "lenet"])
def test_the_models_give_max_pool2d_numbers_bit_for_bit(name, monkeypatch):
    import flower_dp.models as models

    x = torch.randn(8, 1, 28, 28, generator=torch.Generator().manual_seed(4))
    y = torch.arange(8) % 10

    def run():
        model = build_model(name, seed=0)
        out = model(x)
        grads = torch.autograd.grad(F.cross_entropy(out, y), list(model.parameters()))
        return out, grads

    ours = run()
    monkeypatch.setattr(models, "max_pool2", lambda t: F.max_pool2d(t, 2))
    ref = run()
    assert torch.equal(ours[0], ref[0]) and all(torch.equal(a, b) for a, b in zip(ours[1], ref[1]))
