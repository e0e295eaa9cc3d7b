"""The papers' models: parameter counts from the specs, determinism, no BatchNorm, torch.func compatibility."""

from __future__ import annotations

import pytest
import torch

from flower_dp.models import MODELS, build_model, count_parameters, model_name_of, shared_parameter_names


def _resnet_cifar_count(blocks, num_classes, in_channels=3):
    """Closed-form parameter count of a CIFAR BasicBlock ResNet with GroupNorm (independent of the code)."""
    total = in_channels * 64 * 9 + 2 * 64  # stem conv (no bias) + GN affine
    cin = 64
    for cout, nb, stride in zip((64, 128, 256, 512), blocks, (1, 2, 2, 2)):
        for b in range(nb):
            c_in = cin if b == 0 else cout
            total += 9 * c_in * cout + 2 * cout + 9 * cout * cout + 2 * cout
            if b == 0 and (stride != 1 or c_in != cout):
                total += c_in * cout + 2 * cout  # 1x1 projection shortcut + GN
        cin = cout
    return total + 512 * num_classes + num_classes


@pytest.mark.parametrize(
    "name, kwargs, expected, shape",
    [
        ("shallow_cnn", {}, 582_026, (2, 1, 28, 28)),  # FedAvg-style CNN
        ("mlp_2layer", {}, 101_770, (2, 1, 28, 28)),  # PrivSGP-VR App. E's 2-layer net (width 128 our choice)
        ("partpsp_mlp", {}, 24_324, (2, 1, 28, 28)),  # PartPSP's MLP: whole model d = 24,324
        ("partpsp_mlp", {"structure": "code10"}, 24_324, (2, 784)),
        ("lenet", {}, 61_706, (2, 1, 28, 28)),  # Gau-LRQ Sec. VII: "about 6e4"
        ("resnet18_cifar_gn", {}, 11_173_962, (2, 3, 32, 32)),  # PrivSGP-VR Sec. 5.1 / DP-CSGP
        ("resnet18_tv_bn", {}, 11_181_642, (2, 1, 28, 28)),  # DPPS's code (torchvision, FMNIST grey)
        ("logreg", {"in_features": 20}, 210, (2, 20)),
    ],
)
def test_parameter_counts_and_forward(name, kwargs, expected, shape):
    m = build_model(name, **kwargs)
    assert count_parameters(m) == expected
    assert m(torch.zeros(shape)).shape == (2, 10)
    has_bn = any(isinstance(x, torch.nn.modules.batchnorm._BatchNorm) for x in m.modules())
    assert has_bn == (name == "resnet18_tv_bn")  # the only BatchNorm model
    assert model_name_of(m) == name


def test_resnet_counts_match_closed_form():
    """ResNet-18 closed form reproduces 11,173,962; ResNet-34 (Gau-LRQ: "about 21.3M") for CIFAR-100."""
    assert _resnet_cifar_count((2, 2, 2, 2), 10) == 11_173_962
    m34 = build_model("resnet34_cifar_gn", num_classes=100)
    n34 = count_parameters(m34)
    assert n34 == _resnet_cifar_count((3, 4, 6, 3), 100)
    assert abs(n34 - 21.3e6) / 21.3e6 < 0.01
    assert not any(isinstance(x, torch.nn.modules.batchnorm._BatchNorm) for x in m34.modules())


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


@pytest.mark.parametrize(
    "name, shape, kwargs",
    [
        ("shallow_cnn", (1, 28, 28), {}),
        ("mlp_2layer", (1, 28, 28), {}),
        ("partpsp_mlp", (1, 28, 28), {}),
        ("partpsp_mlp", (1, 28, 28), {"structure": "code10"}),
        ("lenet", (1, 28, 28), {}),
        ("logreg", (12,), {"in_features": 12}),
        ("resnet18_cifar_gn", (3, 16, 16), {"groups": 8}),
    ],
)
def test_vmap_per_sample_grads_match_microbatch(name, shape, kwargs):
    """functional_call + vmap(grad) gives the same per-sample gradients as one backward pass per sample."""
    from torch.func import functional_call, grad, vmap

    torch.set_num_threads(1)
    model = build_model(name, seed=0, **kwargs).double()
    params = {k: v.detach() for k, v in model.named_parameters()}
    g = torch.Generator().manual_seed(0)
    x = torch.randn((3, *shape), generator=g, dtype=torch.float64)
    y = torch.tensor([0, 3, 9])
    x_before = x.clone()

    def loss(p, xi, yi):
        out = functional_call(model, p, (xi.unsqueeze(0),))
        return torch.nn.functional.cross_entropy(out, yi.unsqueeze(0))

    per_sample = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    assert torch.equal(x, x_before)  # no in-place ops on inputs
    for i in range(3):
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        bad = [k for k, p in model.named_parameters() if not torch.allclose(per_sample[k][i], p.grad, atol=1e-10)]
        assert not bad, f"sample {i}: per-sample gradient mismatch in {bad}"


def test_partpsp_shared_blocks():
    """The PartPSP paper: MLP PartPSP-1 shares 7,850 parameters, PartPSP-2 16,474; torchvision ResNet-18
    PartPSP-1 157,504 and PartPSP-2 683,072."""
    m = build_model("partpsp_mlp")
    params = dict(m.named_parameters())
    size = lambda mod, names: sum(dict(mod.named_parameters())[n].numel() for n in names)  # noqa: E731
    assert size(m, shared_parameter_names(m, "partpsp1")) == 7_850
    assert size(m, shared_parameter_names(m, "partpsp2")) == 16_474
    assert shared_parameter_names(m, "all") == list(params)
    # the older call form (registry name, split, module) gives the same answer
    assert shared_parameter_names("partpsp_mlp", "partpsp2", m) == shared_parameter_names(m, "partpsp2")
    r = build_model("resnet18_tv_bn")
    assert size(r, shared_parameter_names(r, "partpsp1")) == 157_504
    assert size(r, shared_parameter_names(r, "partpsp2")) == 683_072
    assert shared_parameter_names(r, "all_but_head") == [n for n, _ in r.named_parameters() if not n.startswith("fc.")]
    g = build_model("resnet18_cifar_gn")
    s1 = shared_parameter_names(g, "partpsp1")
    assert s1[:3] == ["conv1.weight", "gn1.weight", "gn1.bias"] and all(
        n.startswith(("conv1.", "gn1.", "layer1.")) for n in s1
    )
    assert size(g, s1) == 1_728 + 128 + 147_968  # CIFAR stem 3x3x3x64 + GN, then layer1 as in torchvision


def test_errors():
    m = build_model("partpsp_mlp")
    with pytest.raises(ValueError, match="unknown PartPSP split 'x'; valid choices"):
        shared_parameter_names(m, "x")
    with pytest.raises(ValueError, match="unknown PartPSP split 'partpsp1' for model 'lenet'"):
        shared_parameter_names(build_model("lenet"), "partpsp1")
    with pytest.raises(ValueError, match="needs the module too, got None"):
        shared_parameter_names("partpsp_mlp", "partpsp1")
    with pytest.raises(ValueError, match="model must be one built by build_model.*got Linear"):
        shared_parameter_names(torch.nn.Linear(2, 2), "all")
    with pytest.raises(ValueError, match="unknown model 'vgg'; valid choices"):
        build_model("vgg")
    with pytest.raises(ValueError, match="bad keyword arguments \\{'width': 3\\} for model 'lenet'"):
        build_model("lenet", width=3)
    with pytest.raises(ValueError, match="num_classes must be >= 2, got 1"):
        build_model("logreg", num_classes=1)
    with pytest.raises(ValueError, match="groups must divide 64.*got 5"):
        build_model("resnet18_cifar_gn", groups=5)
    assert set(MODELS) >= {"shallow_cnn", "mlp_2layer", "partpsp_mlp", "lenet", "resnet18_cifar_gn", "logreg"}


def test_models_pickle_and_match_torchvision_forward():
    """Models are module-level classes (plain pickle works); resnet18_tv_bn computes torchvision's function."""
    import io

    from torchvision.models import resnet18

    for name in ("lenet", "resnet18_tv_bn"):
        m = build_model(name, seed=1)
        buf = io.BytesIO()
        torch.save(m, buf)
        buf.seek(0)
        copy = torch.load(buf, weights_only=False)
        assert all(torch.equal(p, q) for p, q in zip(m.parameters(), copy.parameters()))
    m = build_model("resnet18_tv_bn", seed=1).eval()
    ref = resnet18(weights=None, num_classes=10).eval()
    ref.load_state_dict(m.state_dict())
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(m(x), ref(x))
    torch.testing.assert_close(m(x[:, :1]), ref(x[:, :1].expand(-1, 3, -1, -1)))
