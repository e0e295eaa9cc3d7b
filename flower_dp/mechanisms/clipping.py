"""Per-sample L2 clipping of whole-model gradients (torch.func), and the plain batch gradient.

``clipL2_C(v) = v * min(1, C / ||v||_2)`` on the flattened gradient of *all* trainable
parameters together (Dyn-D2P, PrivSGP-VR and DP-CSGP all clip per sample in L2).  Per-sample gradients
come from ``vmap(grad(loss of one sample))`` over ``functional_call``; the model is never
modified and nothing is patched onto it.

What the accountant relies on: each record's contribution to the returned sum has L2 norm
<= ``clip`` (the add/remove sensitivity of the sum is ``clip``).  This holds only if the
loss of one sample depends on no other sample: BatchNorm breaks it and is refused
(:func:`check_no_batchnorm`; use GroupNorm).  Dividing the sum by the expected batch size
(Poisson sampling) and adding noise are the caller's job.

Dropout: ``vmap(..., randomness="different")`` gives each sample its own mask, drawn from torch's
global RNG (torch.func cannot take a generator); models without dropout (all of the papers'
models) are fully deterministic.  A faster "ghost norm" path with the same contract lives in
:mod:`flower_dp.mechanisms.ghost_clipping`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from flower_dp._checks import check_int, check_positive
from flower_dp.errors import NonFiniteError
from flower_dp.mechanisms.flat import flatten_params, trainable_named_parameters, unflatten_tensors

__all__ = ["ClipStats", "per_sample_clipped_grad_sum", "batch_gradient", "check_no_batchnorm", "per_sample_clipped_grads"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

_BATCHNORM = (nn.modules.batchnorm._BatchNorm, nn.SyncBatchNorm)


@dataclass(frozen=True)
class ClipStats:
    """Metrics of one clipping call (pfl-style).

    Attributes
    ----------
    clip_fraction : float
        Fraction of samples whose gradient norm exceeded ``clip`` (0 for an empty batch).
    mean_norm, max_norm : float
        Mean / max per-sample gradient L2 norm *before* clipping (0 for an empty batch).
    batch_size : int
        Realised number of samples (Poisson batches vary; may be 0).
    mean_loss : float
        Mean per-sample loss at the evaluation point (0 for an empty batch).
    """

    clip_fraction: float
    mean_norm: float
    max_norm: float
    batch_size: int
    mean_loss: float = 0.0


def check_no_batchnorm(model: nn.Module) -> None:
    """Refuse models with BatchNorm layers, whose per-sample gradients are not per-sample.

    Raises
    ------
    ValueError
        Naming every BatchNorm module found and the fix (GroupNorm).
    """
    bad = [f"{name or '<root>'} ({type(m).__name__})" for name, m in model.named_modules() if isinstance(m, _BATCHNORM)]
    if bad:
        raise ValueError(
            f"per-sample DP needs a model without BatchNorm (it mixes samples of a batch), got {len(bad)} "
            f"BatchNorm layer(s): {', '.join(bad)}; replace them with nn.GroupNorm (e.g. the model "
            "'resnet18_cifar_gn') or use a non-private run"
        )


def _params_dict(model: nn.Module, params: torch.Tensor | None) -> dict[str, torch.Tensor]:
    named = trainable_named_parameters(model)
    if params is None:
        return {n: p.detach() for n, p in named}
    if not isinstance(params, torch.Tensor):
        raise TypeError(f"params must be a 1-D torch.Tensor (a flat parameter vector), got {type(params).__name__}")
    views = unflatten_tensors(params.detach(), [p.shape for _, p in named])
    return {n: v for (n, _), v in zip(named, views)}


def _frozen_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Buffers and non-trainable parameters (held fixed)."""
    out = {n: b for n, b in model.named_buffers()}
    out.update({n: p.detach() for n, p in model.named_parameters() if not p.requires_grad})
    return out


def per_sample_clipped_grad_sum(
    model: nn.Module,
    loss_fn: LossFn,
    x: torch.Tensor,
    y: torch.Tensor,
    clip: float,
    *,
    params: torch.Tensor | None = None,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, ClipStats]:
    """Sum over the batch of per-sample gradients, each clipped to L2 norm ``clip``.

    Parameters
    ----------
    model : nn.Module
        Defines the forward pass (not modified).  Must contain no BatchNorm.
    loss_fn : callable ``(logits, y) -> scalar``
        Mean-reducing loss such as ``torch.nn.functional.cross_entropy``; it is called on
        batches of one sample, so the mean equals that sample's loss.
    x : Tensor, shape (B, ...)
        Inputs; ``B`` may be 0 (a Poisson batch can be empty).
    y : Tensor, shape (B, ...)
        Targets.
    clip : float
        L2 clip bound ``C`` > 0 on the whole flattened per-sample gradient; ``math.inf``
        disables clipping (the non-private reduction).
    params : Tensor, shape (d,), optional
        Flat vector at which to evaluate (e.g. ``z = x / w``); default the model's own parameters.
    chunk_size : int, optional
        Samples per vmap call (bounds memory at ``chunk_size * d`` floats); default all at once.

    Returns
    -------
    grad_sum : Tensor, shape (d,)
        ``sum_s clipL2_C(grad_s)``, in the parameters' dtype and device.
    stats : ClipStats

    Raises
    ------
    NonFiniteError
        If a per-sample loss or gradient is NaN/inf (names how many samples).
    """
    check_no_batchnorm(model)
    clip = check_positive("clip", clip, allow_inf=True, hint="clip is the per-sample L2 bound C; math.inf disables")
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x and y must have the same batch size, got {x.shape[0]} and {y.shape[0]}")
    batch = int(x.shape[0])
    pdict = _params_dict(model, params)
    frozen = _frozen_dict(model)
    names = list(pdict)
    if not names:
        raise ValueError("model must have trainable parameters, got none (all requires_grad=False)")
    ref = next(iter(pdict.values()))
    d = sum(v.numel() for v in pdict.values())
    total = torch.zeros(d, dtype=ref.dtype, device=ref.device)
    if batch == 0:
        return total, ClipStats(0.0, 0.0, 0.0, 0, 0.0)
    step = batch if chunk_size is None else check_int("chunk_size", chunk_size, minimum=1)

    def one_loss(p: dict[str, torch.Tensor], xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, {**frozen, **p}, (xs.unsqueeze(0),))
        return loss_fn(out, ys.unsqueeze(0))

    per_sample = vmap(grad_and_value(one_loss), in_dims=(None, 0, 0), randomness="different")
    sums = {n: torch.zeros_like(v) for n, v in pdict.items()}
    norms_all, losses_all = [], []
    for start in range(0, batch, step):
        grads, losses = per_sample(pdict, x[start : start + step], y[start : start + step])
        sq = sum(g.reshape(g.shape[0], -1).pow(2).sum(1) for g in grads.values())
        norms = sq.sqrt()
        if not bool(torch.isfinite(losses).all()) or not bool(torch.isfinite(norms).all()):
            bad = int((~(torch.isfinite(losses) & torch.isfinite(norms))).sum())
            raise NonFiniteError(
                f"per-sample loss or gradient is not finite for {bad} of {losses.numel()} samples "
                f"(batch offset {start}); got NaN/inf -- lower the learning rate or check the inputs"
            )
        # clipL2_C: factor min(1, C/||g||); a zero gradient keeps factor 1.
        factor = torch.clamp(clip / norms.clamp_min(torch.finfo(norms.dtype).tiny), max=1.0)
        for n in names:
            g = grads[n]
            sums[n] += torch.tensordot(factor.to(g.dtype), g, dims=1)
        norms_all.append(norms.detach())
        losses_all.append(losses.detach())
    norms = torch.cat(norms_all)
    losses = torch.cat(losses_all)
    torch.cat([sums[n].reshape(-1) for n in names], out=total)
    stats = ClipStats(
        clip_fraction=float((norms > clip).double().mean()) if math.isfinite(clip) else 0.0,
        mean_norm=float(norms.double().mean()),
        max_norm=float(norms.max()),
        batch_size=batch,
        mean_loss=float(losses.double().mean()),
    )
    return total, stats


def batch_gradient(
    model: nn.Module,
    loss_fn: LossFn,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    params: torch.Tensor | None = None,
) -> tuple[torch.Tensor, float]:
    """Non-private mean gradient of ``loss_fn`` over the batch (one backward pass).

    Parameters
    ----------
    model, loss_fn, x, y, params
        As in :func:`per_sample_clipped_grad_sum` (BatchNorm is allowed here; it runs in
        the model's current train/eval mode, and its running stats are updated in train mode).

    Returns
    -------
    grad : Tensor, shape (d,)
        Gradient of the mean loss over the realised batch (zeros for an empty batch).
    loss : float
        Mean loss (0.0 for an empty batch).
    """
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x and y must have the same batch size, got {x.shape[0]} and {y.shape[0]}")
    if params is None:
        params = flatten_params(model)
    leaf = params.detach().clone().requires_grad_(True)
    if x.shape[0] == 0:
        return torch.zeros_like(leaf.detach()), 0.0
    named = trainable_named_parameters(model)
    views = unflatten_tensors(leaf, [p.shape for _, p in named])
    pdict = {n: v for (n, _), v in zip(named, views)}
    buffers = {n: b for n, b in model.named_buffers()}
    frozen = {n: p.detach() for n, p in model.named_parameters() if not p.requires_grad}
    loss = loss_fn(functional_call(model, {**buffers, **frozen, **pdict}, (x,)), y)
    if not bool(torch.isfinite(loss)):
        raise NonFiniteError(
            f"batch loss is not finite, got {float(loss.detach())}; lower the learning rate or check the inputs"
        )
    (g,) = torch.autograd.grad(loss, leaf)
    if not bool(torch.isfinite(g).all()):
        bad = int((~torch.isfinite(g)).sum())
        raise NonFiniteError(f"batch gradient is not finite in {bad} of {g.numel()} coordinates; got NaN/inf")
    return g.detach(), float(loss.detach())


def per_sample_clipped_grads(
    model: nn.Module, loss_fn: LossFn, x: torch.Tensor, y: torch.Tensor, clip: float, *,
    params: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ClipStats]:
    """The per-sample gradients, each clipped to L2 norm ``clip``, as rows of a (B, d) tensor (the exact-noise
    release rounds each one: :mod:`flower_dp.mechanisms.exact_release`); the same vmap as
    :func:`per_sample_clipped_grad_sum`, whose sum over rows it equals up to float summation order."""
    check_no_batchnorm(model)
    clip = check_positive("clip", clip, hint="clip is the per-sample L2 bound C")
    pdict = _params_dict(model, params)
    frozen = _frozen_dict(model)
    names = list(pdict)
    ref = next(iter(pdict.values()))
    d = sum(v.numel() for v in pdict.values())
    batch = int(x.shape[0])
    if batch == 0:
        return torch.zeros(0, d, dtype=ref.dtype, device=ref.device), ClipStats(0.0, 0.0, 0.0, 0, 0.0)

    def one_loss(p: dict[str, torch.Tensor], xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, {**frozen, **p}, (xs.unsqueeze(0),))
        return loss_fn(out, ys.unsqueeze(0))

    grads, losses = vmap(grad_and_value(one_loss), in_dims=(None, 0, 0), randomness="different")(pdict, x, y)
    flat = torch.cat([grads[n].reshape(batch, -1) for n in names], dim=1)
    norms = flat.norm(dim=1)
    if not bool(torch.isfinite(losses).all()) or not bool(torch.isfinite(norms).all()):
        bad = int((~(torch.isfinite(losses) & torch.isfinite(norms))).sum())
        raise NonFiniteError(f"per-sample loss or gradient is not finite for {bad} of {batch} samples; got NaN/inf "
                             "-- lower the learning rate or check the inputs")
    factor = torch.clamp(clip / norms.clamp_min(torch.finfo(norms.dtype).tiny), max=1.0)
    flat.mul_(factor.unsqueeze(1))
    stats = ClipStats(clip_fraction=float((norms > clip).double().mean()), mean_norm=float(norms.double().mean()),
                      max_norm=float(norms.max()), batch_size=batch, mean_loss=float(losses.double().mean()))
    return flat, stats
