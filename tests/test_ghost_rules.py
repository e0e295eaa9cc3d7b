"""Ghost clipping's per-layer rules: a registry keyed by layer type (issue 13)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from flower_dp.mechanisms.clipping import per_sample_clipped_grad_sum
from flower_dp.mechanisms.ghost_clipping import check_ghost_supported, ghost_clipped_grad_sum
from flower_dp.mechanisms.ghost_rules import (
    GHOST_SUPPORTED_LAYERS,
    ghost_rule_for,
    ghost_supported_layers,
    register_ghost_rule,
    unregister_ghost_rule,
)


class _Scale(nn.Module):
    """``y = x * weight`` (one weight per feature): no built-in rule."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, d, dtype=torch.float64))

    def forward(self, x):
        return x * self.weight


def _scale_rule(mod, ins, gs, want):
    """Per-sample weight gradient ``g_s * a_s`` (B, d), materialised."""
    per = sum(g * a for a, g in zip(ins, gs))
    sq = per.square().sum(1)

    def clipped(c, dest):
        return {"weight": torch.tensordot(c, per, dims=1)}

    return sq, clipped


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), _Scale(5), nn.Linear(5, 3)).double()


def test_a_registered_rule_runs_and_matches_the_reference():
    model = _net()
    x = torch.randn(9, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2])
    with pytest.raises(NotImplementedError, match=r"_Scale.*supported layers are Linear, Conv2d, GroupNorm, "
                                                   r"LayerNorm, Embedding.*register_ghost_rule"):
        check_ghost_supported(model)
    register_ghost_rule(_Scale, _scale_rule)
    try:
        assert ghost_supported_layers()[-1] is _Scale and _Scale not in GHOST_SUPPORTED_LAYERS
        check_ghost_supported(model)
        got, gs = ghost_clipped_grad_sum(model, F.cross_entropy, x, y, 0.3)
        ref, rs = per_sample_clipped_grad_sum(model, F.cross_entropy, x, y, 0.3)
        torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)
        assert gs.clip_fraction == rs.clip_fraction > 0
        assert gs.mean_norm == pytest.approx(rs.mean_norm, rel=1e-10)
    finally:
        unregister_ghost_rule(_Scale)
    # the driver's per-model cache notices the registry changed: unsupported again
    with pytest.raises(NotImplementedError, match="_Scale"):
        ghost_clipped_grad_sum(model, F.cross_entropy, x, y, 0.3)


def test_rules_match_by_class_then_base_class_and_respect_supports():
    class MyLinear(nn.Linear):
        pass

    assert ghost_rule_for(MyLinear(2, 2)) is ghost_rule_for(nn.Linear(2, 2)) is not None
    assert ghost_rule_for(nn.Embedding(5, 2)) is not None
    assert ghost_rule_for(nn.Embedding(5, 2, max_norm=1.0)) is None  # refused by the Embedding rule's check
    assert ghost_rule_for(nn.PReLU()) is None
    with pytest.raises(TypeError, match="subclass of torch.nn.Module"):
        register_ghost_rule(int, _scale_rule)
    with pytest.raises(KeyError, match="no ghost rule is registered"):
        unregister_ghost_rule(_Scale)


@pytest.mark.parametrize("kernel", [(1, 1), (3, 3), (5, 3), (2, 4)])
@pytest.mark.parametrize("dilation", [(1, 1), (2, 1), (2, 3)])
@pytest.mark.parametrize("padding", [0, 1, (2, 1)])
@pytest.mark.parametrize("stride", [(1, 1), (2, 2), (3, 1)])
def test_strided_unfold_equals_torch_unfold(kernel, dilation, padding, stride):
    """The Conv2d rule's im2col (one strided copy) gives ``F.unfold``'s numbers bit for bit, also for a
    non-contiguous input and one with a storage offset."""
    from flower_dp.mechanisms.ghost_rules import _unfold

    g = torch.Generator().manual_seed(0)
    base = torch.randn(5, 4, 13, 11, generator=g)
    for x in (base[:3], base.transpose(2, 3), base[2:]):
        try:
            ref = F.unfold(x, kernel, dilation=dilation, padding=padding, stride=stride)
        except RuntimeError:  # kernel larger than the padded input: both refuse
            with pytest.raises(RuntimeError):
                _unfold(x, kernel, dilation, padding, stride)
            continue
        assert torch.equal(_unfold(x, kernel, dilation, padding, stride), ref)
