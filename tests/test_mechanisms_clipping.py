"""Per-sample clipping (torch.func) against a one-sample-at-a-time reference."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from flower_dp.errors import NonFiniteError
from flower_dp.mechanisms import (
    batch_gradient,
    check_no_batchnorm,
    flatten_params,
    load_flat_params_,
    per_sample_clipped_grad_sum,
)


def _cnn():
    torch.manual_seed(1)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.GroupNorm(2, 4), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 3 * 3, 5)
    ).double()


def _mlp():
    torch.manual_seed(2)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 5)).double()


def _data(b=9):
    g = torch.Generator().manual_seed(3)
    return torch.randn(b, 1, 8, 8, generator=g, dtype=torch.float64), torch.randint(0, 5, (b,), generator=g)


def _reference(model, x, y, clip):
    """Loop over samples with ordinary autograd: (sum of clipped grads, per-sample norms)."""
    total, norms = 0, []
    for i in range(x.shape[0]):
        model.zero_grad()
        F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        g = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        norms.append(float(g.norm()))
        total = total + g * min(1.0, clip / float(g.norm()))
    return total, torch.tensor(norms, dtype=torch.float64)


def _mismatch(a, b, tol):
    bad = (a - b).abs() > tol
    return f"{int(bad.sum())} of {a.numel()} coordinates differ, max {float((a - b).abs().max()):.3g}"


@pytest.mark.parametrize("make", [_cnn, _mlp], ids=["cnn", "mlp"])
def test_matches_per_sample_loop(make):
    """vmap result equals the python loop to 1e-6 (float64); clip fraction and norms agree."""
    torch.set_num_threads(1)
    model = make()
    x, y = _data()
    _, norms = _reference(model, x, y, math.inf)
    srt = norms.sort().values
    clip = float(srt[4] + srt[5]) / 2  # 4 of 9 samples clipped; no norm sits at the threshold
    ref, _ = _reference(model, x, y, clip)
    before = flatten_params(model)
    got, stats = per_sample_clipped_grad_sum(model, F.cross_entropy, x, y, clip, chunk_size=4)
    assert torch.allclose(got, ref, atol=1e-6, rtol=0), _mismatch(got, ref, 1e-6)
    assert torch.equal(flatten_params(model), before)  # the model is not touched
    assert stats.batch_size == 9
    assert stats.clip_fraction == pytest.approx(float((norms > clip).double().mean()))
    assert stats.clip_fraction == pytest.approx(4 / 9)
    assert stats.max_norm == pytest.approx(float(norms.max()), rel=1e-9)
    assert stats.mean_norm == pytest.approx(float(norms.mean()), rel=1e-9)
    # each clipped contribution has norm <= clip, so the sum is bounded by B * clip
    assert float(got.norm()) <= 9 * clip * (1 + 1e-9)


def test_chunking_and_unclipped_sum():
    """chunk_size does not change the result; clip = inf gives B x the mean batch gradient."""
    model = _mlp()
    x, y = _data(7)
    a, _ = per_sample_clipped_grad_sum(model, F.cross_entropy, x, y, 0.3)
    b, _ = per_sample_clipped_grad_sum(model, F.cross_entropy, x, y, 0.3, chunk_size=2)
    assert torch.allclose(a, b, atol=1e-12)
    full, stats = per_sample_clipped_grad_sum(model, F.cross_entropy, x, y, math.inf)
    mean, loss = batch_gradient(model, F.cross_entropy, x, y)
    assert stats.clip_fraction == 0.0
    assert torch.allclose(full, 7 * mean, atol=1e-12)
    assert loss == pytest.approx(stats.mean_loss, rel=1e-12)


def test_params_argument_evaluates_elsewhere():
    """params=z evaluates at z (e.g. x/w), as if z were loaded into the model."""
    model = _cnn()
    x, y = _data(5)
    z = flatten_params(model) * 0.5 + 0.01
    got, _ = per_sample_clipped_grad_sum(model, F.cross_entropy, x, y, 0.2, params=z)
    other = _cnn()
    load_flat_params_(other, z)
    ref, _ = _reference(other, x, y, 0.2)
    assert torch.allclose(got, ref, atol=1e-10), _mismatch(got, ref, 1e-10)
    g1, _ = batch_gradient(model, F.cross_entropy, x, y, params=z)
    g2, _ = batch_gradient(other, F.cross_entropy, x, y)
    assert torch.allclose(g1, g2, atol=1e-12)


def test_empty_batch():
    """A Poisson batch can be empty: zeros and batch_size 0."""
    model = _mlp()
    x, y = _data(3)
    got, stats = per_sample_clipped_grad_sum(model, F.cross_entropy, x[:0], y[:0], 1.0)
    assert torch.equal(got, torch.zeros_like(flatten_params(model)))
    assert stats.batch_size == 0 and stats.clip_fraction == 0.0
    g, loss = batch_gradient(model, F.cross_entropy, x[:0], y[:0])
    assert torch.equal(g, torch.zeros_like(got)) and loss == 0.0


def test_batchnorm_refused():
    """BatchNorm mixes samples: refused with an error naming the layer and the GroupNorm fix."""
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(72, 5)).double()
    with pytest.raises(ValueError, match=r"got 1 BatchNorm.*1 \(BatchNorm2d\).*GroupNorm"):
        check_no_batchnorm(model)
    x, y = _data(2)
    with pytest.raises(ValueError, match="GroupNorm"):
        per_sample_clipped_grad_sum(model, F.cross_entropy, x, y, 1.0)
    check_no_batchnorm(_cnn())  # GroupNorm is fine


def test_nonfinite_and_bad_clip():
    """NaN inputs raise NonFiniteError naming the count; clip <= 0 is refused with 'got'."""
    model = _mlp()
    x, y = _data(4)
    x[2, 0, 0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match="1 of 4 samples"):
        per_sample_clipped_grad_sum(model, F.cross_entropy, x, y, 1.0)
    with pytest.raises(NonFiniteError, match="not finite"):
        batch_gradient(model, F.cross_entropy, x, y)
    with pytest.raises(ValueError, match="clip must be > 0.*got -1"):
        per_sample_clipped_grad_sum(model, F.cross_entropy, x, y, -1.0)
