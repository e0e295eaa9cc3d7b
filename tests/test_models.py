"""The papers' models: parameter counts from the specs, determinism, no BatchNorm."""

from __future__ import annotations

import pytest
import torch

from flower_dp.models import build_model, count_parameters, shared_parameter_names


@pytest.mark.parametrize(
    "name, kwargs, expected, shape",
    [
        ("shallow_cnn", {}, 582_026, (2, 1, 28, 28)),  # dyn-d2p.md 8 #11
        ("mlp_2layer", {}, 101_770, (2, 1, 28, 28)),  # privsgp-vr.md: 784-128-10
        ("partpsp_mlp", {}, 24_324, (2, 1, 28, 28)),  # dpps-partpsp.md 4.3: whole model d = 24,324
        ("lenet", {}, 61_706, (2, 1, 28, 28)),  # gau-lrq.md 8.2: about 6e4
        ("resnet18_cifar_gn", {}, 11_173_962, (2, 3, 32, 32)),  # CIFAR ResNet-18 + GroupNorm
        ("logreg", {"in_features": 20}, 210, (2, 20)),
    ],
)
def test_parameter_counts_and_forward(name, kwargs, expected, shape):
    m = build_model(name, **kwargs)
    assert count_parameters(m) == expected
    assert m(torch.zeros(shape)).shape == (2, 10)
    assert not any(isinstance(x, torch.nn.modules.batchnorm._BatchNorm) for x in m.modules())


def test_deterministic_init_and_global_rng_untouched():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = build_model("lenet", seed=5)
    after = torch.rand(1)
    b = build_model("lenet", seed=5)
    c = build_model("lenet", seed=6)
    assert torch.equal(before, after)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters()))


def test_partpsp_shared_blocks():
    """PartPSP-1 shares 7,850 parameters, PartPSP-2 16,474 (dpps-partpsp.md 4.3)."""
    m = build_model("partpsp_mlp")
    params = dict(m.named_parameters())
    s1 = shared_parameter_names("partpsp_mlp", "partpsp1", m)
    s2 = shared_parameter_names("partpsp_mlp", "partpsp2", m)
    assert sum(params[n].numel() for n in s1) == 7_850
    assert sum(params[n].numel() for n in s2) == 16_474
    assert shared_parameter_names("partpsp_mlp", "all", m) == list(params)
    with pytest.raises(ValueError, match="unknown PartPSP split 'x'"):
        shared_parameter_names("partpsp_mlp", "x", m)


def test_unknown_model():
    with pytest.raises(ValueError, match="unknown model 'vgg'; valid choices"):
        build_model("vgg")
