"""The ghost / book-keeping clipping fast path against the vmap reference and a per-sample loop."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from flower_dp.errors import NonFiniteError
from flower_dp.mechanisms.clipping import per_sample_clipped_grad_sum
from flower_dp.mechanisms.flat import flatten_params
from flower_dp.mechanisms.ghost_clipping import check_ghost_supported, ghost_clipped_grad_sum
from flower_dp.models import build_model

torch.set_num_threads(1)


def _data(shape, batch, seed=0, classes=10, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, *shape, generator=g, dtype=dtype), torch.randint(0, classes, (batch,), generator=g)


def _loop_reference(model, loss_fn, x, y, clip):
    """Independent reference: one sample at a time with plain autograd (Opacus microbatch style)."""
    params = [p for p in model.parameters() if p.requires_grad]
    total = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype)
    norms = []
    for i in range(x.shape[0]):
        grads = torch.autograd.grad(loss_fn(model(x[i : i + 1]), y[i : i + 1]), params)
        flat = torch.cat([g.reshape(-1) for g in grads])
        norms.append(float(flat.norm()))
        total += flat * min(1.0, clip / max(norms[-1], 1e-300))
    return total, norms


def _median_clip(model, x, y):
    """A clip bound at the median per-sample norm, so that about half the samples are clipped."""
    _, norms = _loop_reference(model, F.cross_entropy, x, y, math.inf)
    s = sorted(norms)
    return (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2  # strictly between two norms: no ties


@pytest.mark.parametrize(
    "name, shape, batch",
    [("shallow_cnn", (1, 28, 28), 12), ("mlp_2layer", (1, 28, 28), 16), ("lenet", (1, 28, 28), 16)],
)
def test_matches_vmap_reference_float64(name, shape, batch):
    """Clipped sum and every ClipStats field equal the vmap reference (float64, 1e-10)."""
    model = build_model(name, seed=3).double()
    x, y = _data(shape, batch)
    clip = _median_clip(model, x, y)
    ref, rs = per_sample_clipped_grad_sum(model, F.cross_entropy, x, y, clip)
    got, gs = ghost_clipped_grad_sum(model, F.cross_entropy, x, y, clip)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)
    assert 0 < gs.clip_fraction < 1
    assert gs.clip_fraction == rs.clip_fraction and gs.batch_size == rs.batch_size == batch
    for f in ("mean_norm", "max_norm", "mean_loss"):
        assert getattr(gs, f) == pytest.approx(getattr(rs, f), rel=1e-12)


@pytest.mark.parametrize("name", ["shallow_cnn", "mlp_2layer", "lenet"])
def test_matches_vmap_reference_float32(name):
    """In float32 the fast path agrees with the reference to 1e-5 (relative to the sum's scale)."""
    model = build_model(name, seed=1)
    x, y = _data((1, 28, 28), 16, dtype=torch.float32)
    ref, rs = per_sample_clipped_grad_sum(model, F.cross_entropy, x, y, 1.0)
    got, gs = ghost_clipped_grad_sum(model, F.cross_entropy, x, y, 1.0)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))
    assert gs.clip_fraction == rs.clip_fraction


def test_resnet18_groupnorm_matches_loop():
    """CIFAR ResNet-18 with GroupNorm (conv strides, 1x1 shortcuts, GroupNorm affine) vs a per-sample loop."""
    model = build_model("resnet18_cifar_gn", seed=0).double()
    x, y = _data((3, 16, 16), 3)  # small images keep the test fast; every layer type is exercised
    _, norms = _loop_reference(model, F.cross_entropy, x, y, math.inf)
    clip = sum(sorted(norms)[1:3]) / 2  # strictly between two norms: exactly one clipped
    ref, _ = _loop_reference(model, F.cross_entropy, x, y, clip)
    got, st = ghost_clipped_grad_sum(model, F.cross_entropy, x, y, clip)
    torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-11)
    assert st.clip_fraction == pytest.approx(1 / 3)
    assert st.max_norm == pytest.approx(max(norms), rel=1e-10)


class _Exotic(nn.Module):
    """Grouped/strided/dilated/'same'/reflect convs, GroupNorm, a Linear used twice (weight sharing)."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(2, 4, 3, padding="same", padding_mode="reflect")  # few-channel path
        self.c2 = nn.Conv2d(4, 8, 3, stride=2, dilation=2, padding=1, groups=2)  # im2col path, groups
        self.c3 = nn.Conv2d(8, 8, 3, padding="same", bias=False)  # im2col path, 'same', no bias
        self.gn = nn.GroupNorm(2, 8)
        self.shared = nn.Linear(8, 8)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        h = self.gn(self.c3(torch.tanh(self.c2(torch.tanh(self.c1(x))))))
        h = torch.tanh(h.mean((2, 3)))
        return self.head(torch.tanh(self.shared(torch.tanh(self.shared(h)))))


class _Seq(nn.Module):
    """Token model: Embedding (padding_idx) -> LayerNorm -> token-wise Linear -> mean-pool -> Linear."""

    def __init__(self, width=16):
        super().__init__()
        self.emb = nn.Embedding(12, 6, padding_idx=0)
        self.ln = nn.LayerNorm(6)
        self.tok = nn.Linear(6, width)
        self.out = nn.Linear(width, 4)

    def forward(self, idx):
        return self.out(torch.tanh(self.tok(self.ln(self.emb(idx)))).mean(1))


@pytest.mark.parametrize("width", [3, 40])  # 3: Gram form is cheaper; 40: materialised form
def test_sequence_model_embedding_layernorm(width):
    """Linear with a token dim (both norm forms), LayerNorm and Embedding (repeated + padding indices)."""
    model = _Seq(width).double()
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 12, (6, 5), generator=g)
    x[0, :2] = 3  # repeated index inside one sample
    x[1, 0] = 0  # padding index: no gradient
    y = torch.randint(0, 4, (6,), generator=g)
    ref, rs = per_sample_clipped_grad_sum(model, F.cross_entropy, x, y, 0.05)
    got, gs = ghost_clipped_grad_sum(model, F.cross_entropy, x, y, 0.05)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)
    assert gs.clip_fraction == rs.clip_fraction


def test_exotic_convs_and_weight_sharing():
    """Grouped/strided/dilated/'same'/reflect-padded convs and a layer called twice agree with the loop."""
    model = _Exotic().double()
    x, y = _data((2, 11, 11), 5, classes=5)
    _, norms = _loop_reference(model, F.cross_entropy, x, y, math.inf)
    clip = sum(sorted(norms)[2:4]) / 2  # strictly between two norms: two clipped
    ref, _ = _loop_reference(model, F.cross_entropy, x, y, clip)
    got, st = ghost_clipped_grad_sum(model, F.cross_entropy, x, y, clip)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)
    assert st.clip_fraction == pytest.approx(2 / 5)


def test_params_vector_and_generic_loss():
    """``params=`` evaluates at another point; a loss without a fast path goes through vmap."""
    model = build_model("lenet", seed=0).double()
    x, y = _data((1, 28, 28), 6)
    z = flatten_params(model) * 0.5 + 0.01

    def loss_fn(out, t):  # not F.cross_entropy: exercised through vmap
        return F.cross_entropy(out, t) + 0.1 * out.pow(2).mean()

    ref, rs = per_sample_clipped_grad_sum(model, loss_fn, x, y, 0.3, params=z)
    got, gs = ghost_clipped_grad_sum(model, loss_fn, x, y, 0.3, params=z)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)
    assert gs.mean_loss == pytest.approx(rs.mean_loss, rel=1e-12)


def test_no_clipping_is_batch_size_times_mean_gradient_and_model_untouched():
    """clip=inf gives sum_s grad_s = B * (mean gradient); no hooks, attributes or grads are left behind."""
    model = build_model("mlp_2layer", seed=0).double()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    attrs = set(vars(model))
    x, y = _data((1, 28, 28), 8)
    got, st = ghost_clipped_grad_sum(model, F.cross_entropy, x, y, math.inf)
    loss = F.cross_entropy(model(x), y)
    mean = torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(model.parameters()))])
    torch.testing.assert_close(got, 8 * mean, rtol=1e-10, atol=1e-12)
    assert st.clip_fraction == 0.0
    assert set(vars(model)) == attrs
    assert all(not m._forward_hooks for m in model.modules())
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_empty_batch():
    """A Poisson batch may be empty: zeros and zero stats, as the reference."""
    model = build_model("mlp_2layer")
    x, y = torch.zeros(0, 1, 28, 28), torch.zeros(0, dtype=torch.long)
    got, st = ghost_clipped_grad_sum(model, F.cross_entropy, x, y, 1.0)
    assert got.shape == (101_770,) and not got.any()  # 784*128+128+128*10+10 (models.py table)
    assert st.batch_size == 0 and st.clip_fraction == 0.0


def test_frozen_parameters_are_excluded():
    """Only trainable parameters appear in the sum, in named_parameters order, as in the reference."""
    model = build_model("lenet", seed=0).double()
    model.conv1.weight.requires_grad_(False)
    model.fc3.bias.requires_grad_(False)
    x, y = _data((1, 28, 28), 5)
    ref, _ = per_sample_clipped_grad_sum(model, F.cross_entropy, x, y, 0.5)
    got, _ = ghost_clipped_grad_sum(model, F.cross_entropy, x, y, 0.5)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)


class _PReLUNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.act = nn.PReLU()

    def forward(self, x):
        return self.act(self.fc(x))


class _InplaceNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return torch.relu_(self.fc(x))


def test_errors_name_the_problem():
    """Unsupported layers, BatchNorm, in-place outputs, bad params and NaN inputs raise clear errors."""
    x, y = torch.randn(3, 4), torch.tensor([0, 1, 2])
    with pytest.raises(NotImplementedError, match=r"PReLU.*per_sample_clipped_grad_sum"):
        ghost_clipped_grad_sum(_PReLUNet(), F.cross_entropy, x, y, 1.0)
    with pytest.raises(NotImplementedError, match="PReLU"):
        check_ghost_supported(_PReLUNet())
    with pytest.raises(ValueError, match="BatchNorm"):
        ghost_clipped_grad_sum(nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)), F.cross_entropy, x, y, 1.0)
    with pytest.raises(ValueError, match="in place"):
        ghost_clipped_grad_sum(_InplaceNet(), F.cross_entropy, x, y, 1.0)
    with pytest.raises(ValueError, match="got"):
        ghost_clipped_grad_sum(_InplaceNet(), F.cross_entropy, x, y, 0.0)
    with pytest.raises(ValueError, match="params"):
        ghost_clipped_grad_sum(nn.Linear(4, 3), F.cross_entropy, x, y, 1.0, params=torch.zeros(3))
    with pytest.raises(NonFiniteError, match="1 of 3"):
        ghost_clipped_grad_sum(nn.Linear(4, 3), F.cross_entropy, torch.tensor([[0.0] * 4, [1.0] * 4, [math.nan] * 4]), y, 1.0)


def test_chunks_and_no_grad_context_give_the_same_result():
    """``chunk_size`` (as in the reference) and a caller's ``torch.no_grad()`` change nothing."""
    model = build_model("lenet", seed=2).double()
    x, y = _data((1, 28, 28), 7)
    full, fs = ghost_clipped_grad_sum(model, F.cross_entropy, x, y, 0.4)
    with torch.no_grad():
        chunked, cs = ghost_clipped_grad_sum(model, F.cross_entropy, x, y, 0.4, chunk_size=3)
    torch.testing.assert_close(chunked, full, rtol=1e-12, atol=1e-14)
    assert cs.batch_size == 7 and cs.clip_fraction == pytest.approx(fs.clip_fraction)
    assert cs.max_norm == pytest.approx(fs.max_norm) and cs.mean_norm == pytest.approx(fs.mean_norm)
    assert cs.mean_loss == pytest.approx(fs.mean_loss)


class _Unused(nn.Module):
    def __init__(self):
        super().__init__()
        self.used = nn.Linear(4, 3)
        self.spare = nn.Linear(4, 3)  # never called: zero gradient, as in the reference

    def forward(self, x):
        return self.used(x)


def test_layer_not_called_gets_zero_gradient():
    """A parameterised layer the forward pass skips contributes zeros (and the rest is unchanged)."""
    model = _Unused().double()
    x, y = torch.randn(5, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1])
    ref, _ = per_sample_clipped_grad_sum(model, F.cross_entropy, x, y, 0.5)
    got, _ = ghost_clipped_grad_sum(model, F.cross_entropy, x, y, 0.5)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-14)
    assert not got[15:].any()  # used.weight (12) + used.bias (3), then spare.*


def test_cached_plan_follows_changes_to_the_model():
    """The per-model plan is rebuilt when a parameter is frozen/unfrozen or a layer replaced between calls."""
    model = build_model("mlp_2layer", seed=4).double()
    x, y = _data((1, 28, 28), 6)
    for step in ("full", "freeze", "unfreeze", "replace", "batchnorm"):
        if step == "freeze":
            model.fc1.bias.requires_grad_(False)
        elif step == "unfreeze":
            model.fc1.bias.requires_grad_(True)
        elif step == "replace":
            model.fc2 = nn.Linear(128, 10).double()
        elif step == "batchnorm":
            model.fc2 = nn.Sequential(nn.BatchNorm1d(128), nn.Linear(128, 10)).double()
            with pytest.raises(ValueError, match="BatchNorm"):
                ghost_clipped_grad_sum(model, F.cross_entropy, x, y, 0.5)
            continue
        ref, _ = per_sample_clipped_grad_sum(model, F.cross_entropy, x, y, 0.5)
        got, _ = ghost_clipped_grad_sum(model, F.cross_entropy, x, y, 0.5)
        assert got.shape == ref.shape, step
        torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)
