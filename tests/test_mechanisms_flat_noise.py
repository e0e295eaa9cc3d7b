"""flower_dp.mechanisms.flat and .noise: flat vectors round-trip; noise has the right law."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from flower_dp.mechanisms import (
    flatten_params,
    flatten_tensors,
    gaussian_noise,
    laplace_noise,
    load_flat_params_,
    param_slices,
    unflatten_tensors,
)
from flower_dp.rng import noise_generator


def torch_generator(seed, node, purpose, k):
    """Stand-in for flower_dp.rng.torch_generator keyed by SeedSequence(seed, spawn_key=(node, purpose, k)).

    (rng.stream_seed fails on numpy 2.4: uint64.dot(list) gives a float; reported to the lead.)
    """
    code = {"noise": 1, "compress": 2}[purpose]
    state = np.random.SeedSequence(seed, spawn_key=(node, code, k)).generate_state(1, dtype=np.uint64)
    return torch.Generator().manual_seed(int(state[0]) >> 1)


def _model():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    m[0].bias.requires_grad_(False)  # frozen parameters are not part of the flat vector
    return m


def test_flatten_roundtrip_and_slices():
    """flatten -> load is the identity; slices cover the trainable parameters in order."""
    m = _model()
    vec = flatten_params(m)
    assert vec.shape == (12 + 8 + 2,)  # 3*4 weights + (4*2 + 2); bias of layer 0 frozen
    sl = param_slices(m)
    assert list(sl) == ["0.weight", "2.weight", "2.bias"]
    assert torch.equal(vec[sl["2.bias"]], m[2].bias.detach())
    new = torch.arange(vec.numel(), dtype=vec.dtype)
    load_flat_params_(m, new)
    assert torch.equal(flatten_params(m), new)
    assert torch.equal(m[2].weight.detach().reshape(-1), new[sl["2.weight"]])
    vec2 = flatten_params(m)
    vec2 += 1  # a copy: the model is untouched
    assert torch.equal(flatten_params(m), new)


def test_unflatten_views_and_errors():
    """unflatten_tensors returns views with the right shapes and refuses a wrong length."""
    ts = [torch.ones(2, 3), torch.zeros(4)]
    flat = flatten_tensors(ts)
    parts = unflatten_tensors(flat, ts)
    assert [tuple(p.shape) for p in parts] == [(2, 3), (4,)]
    parts[1][0] = 7.0
    assert flat[6] == 7.0
    with pytest.raises(ValueError, match="got shape"):
        unflatten_tensors(torch.zeros(9), ts)


def test_gaussian_noise_std_mean_and_reproducible():
    """Empirical std within 1% (d = 4e5 -> SE 0.11%), mean ~ 0, same key -> same draw."""
    d, std = 400_000, 0.37
    n = gaussian_noise(d, std, noise_generator(1, 0, 0), dtype=torch.float64)
    assert n.shape == (d,) and n.dtype == torch.float64
    assert abs(float(n.std()) / std - 1) < 0.01
    assert abs(float(n.mean())) < 5 * std / math.sqrt(d)
    again = gaussian_noise(d, std, noise_generator(1, 0, 0), dtype=torch.float64)
    assert torch.equal(n, again)


def test_noise_independent_across_keys():
    """Different (node, k) streams are uncorrelated (|corr| < 5/sqrt(d))."""
    d = 200_000
    keys = [(0, 0), (1, 0), (0, 1)]
    draws = [gaussian_noise(d, 1.0, noise_generator(5, nd, k), dtype=torch.float64) for nd, k in keys]
    for i in range(3):
        for j in range(i + 1, 3):
            corr = float(torch.corrcoef(torch.stack([draws[i], draws[j]]))[0, 1])
            assert abs(corr) < 5 / math.sqrt(d), (keys[i], keys[j], corr)


def test_laplace_noise_law():
    """Laplace(0, b): E|n| = b and std = sqrt(2) b (DPPS invariant 8: mean |n| = S/b)."""
    d, b = 400_000, 0.8
    n = laplace_noise(d, b, torch_generator(2, 3, "noise", 4), dtype=torch.float64)
    assert abs(float(n.abs().mean()) / b - 1) < 0.01
    assert abs(float(n.std()) / (math.sqrt(2) * b) - 1) < 0.015
    assert abs(float(n.mean())) < 5 * math.sqrt(2) * b / math.sqrt(d)
    assert torch.equal(n, laplace_noise(d, b, torch_generator(2, 3, "noise", 4), dtype=torch.float64))


def test_zero_noise_and_errors():
    """std = 0 gives exact zeros; negative std / non-generator are refused naming the value."""
    g = torch_generator(0, 0, "noise", 0)
    assert torch.equal(gaussian_noise(5, 0.0, noise_generator(0, 0, 0)), torch.zeros(5))
    assert torch.equal(laplace_noise(5, 0.0, g), torch.zeros(5))
    with pytest.raises(ValueError, match="std must be >= 0.*got -1"):
        gaussian_noise(5, -1.0, noise_generator(0, 0, 0))
    with pytest.raises(TypeError, match="numpy.random.Generator"):
        gaussian_noise(5, 1.0, 42)
    with pytest.raises(TypeError, match="noise_generator"):
        gaussian_noise(5, 1.0, g)  # a torch generator: the Gaussian noise comes from numpy's float64 ziggurat
