"""Fast per-sample clipping by "book-keeping": ghost norms, one backward pass, no per-sample grads.

Returns exactly what :func:`flower_dp.mechanisms.clipping.per_sample_clipped_grad_sum` returns
(``sum_s clipL2_C(grad_s)`` over the flattened gradient of all trainable parameters, and a
:class:`ClipStats`), so callers switch between the two with a flag.

How (Bu et al., "Differentially private optimization on large model at small cost",
arXiv 2210.00038, book-keeping; Li et al. arXiv 2110.05679 ghost norms):

1. One forward pass of the batch.  Forward hooks (registered on the supported layers for
   this call only, and always removed) keep each layer's input ``a`` and output ``o``.
2. One backward pass ``torch.autograd.grad(sum_s loss_s, [o_layer ...])`` gives the output
   gradients ``g`` of every layer.  No parameter gradient is formed in this pass.
3. Per-sample squared norms per layer from ``a`` and ``g``, summed over layers, by the layer
   type's rule (:mod:`flower_dp.mechanisms.ghost_rules`, a registry keyed by layer type;
   :func:`~flower_dp.mechanisms.ghost_rules.register_ghost_rule` adds one):

   - Linear ``(B, in)``: ``||a_s||^2 ||g_s||^2``; with token dims ``(B, T, in)`` the Gram form
     ``sum_{t,t'} (a_t.a_t')(g_t.g_t')`` or the materialised ``g_s^T a_s``, whichever is cheaper.
   - Conv2d: patches ``U_s = unfold(a_s)`` ``(k, L)`` (one strided copy); materialised ``U_s g_s^T``
     (small for convs) or the Gram form over the ``L`` positions, whichever is cheaper; with few
     input channels, the per-sample gradients as one grouped conv instead (no patches).
   - GroupNorm / LayerNorm: per-sample weight/bias gradients are tiny and materialised
     (``sum g * x_hat``, ``sum g``).
   - Embedding: Gram form with an index-equality mask.

4. ``c_s = min(1, C / ||g_s||)`` and, per layer, ``sum_s c_s grad_s`` from the kept
   ``a`` and ``g`` (e.g. ``(c g)^T a`` for Linear): the clipped sum costs one extra
   weight-gradient product per layer, not a second backward pass.

A layer called several times (weight sharing) is handled: its calls are concatenated
along the token/position axis, which is exact.  Anything else that owns a trainable
parameter raises :class:`NotImplementedError` naming the layer and pointing to the
reference path.  Assumption as in the reference: each sample's loss depends on no other
sample (no BatchNorm; :func:`check_no_batchnorm`); ``loss_fn`` on a batch of one sample
is that sample's loss (per-sample losses are evaluated with ``vmap`` over ``loss_fn``).
Dropout draws one mask per sample either way, but not the same masks as the reference.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from flower_dp._checks import check_int, check_positive
from flower_dp.errors import NonFiniteError
from flower_dp.mechanisms.clipping import ClipStats, check_no_batchnorm
from flower_dp.mechanisms.flat import trainable_named_parameters, unflatten_tensors
from flower_dp.mechanisms.ghost_rules import (
    GHOST_SUPPORTED_LAYERS,
    GhostRule,
    ghost_rule_for,
    ghost_supported_layers,
    register_ghost_rule,
    registry_version,
)

__all__ = ["ghost_clipped_grad_sum", "GHOST_SUPPORTED_LAYERS", "check_ghost_supported", "register_ghost_rule"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _layers(model: nn.Module) -> dict[str, tuple[nn.Module, GhostRule]]:
    """Map module name -> (module, its rule) for every module that owns a trainable parameter.

    Raises NotImplementedError naming the first unsupported owner and the supported layer types.
    """
    modules = dict(model.named_modules())
    owners: dict[str, tuple[nn.Module, GhostRule]] = {}
    for pname, _ in trainable_named_parameters(model):
        mname, _, leaf = pname.rpartition(".")
        mod = modules[mname]
        rule = ghost_rule_for(mod) if leaf in ("weight", "bias") else None
        if rule is None:
            raise NotImplementedError(
                f"ghost clipping cannot handle parameter {pname!r} of layer {mname or '<root>'!r} "
                f"({type(mod).__name__}); supported layers are "
                f"{', '.join(t.__name__ for t in ghost_supported_layers())} (Embedding without max_norm / "
                "scale_grad_by_freq), got an unsupported one -- use the reference path "
                "flower_dp.mechanisms.per_sample_clipped_grad_sum for this model, or add a rule for the layer "
                "type with flower_dp.mechanisms.ghost_rules.register_ghost_rule"
            )
        owners[mname] = (mod, rule)
    return owners


@dataclass(frozen=True)
class _Plan:
    """What one call needs to know about a model's trainable parameters (cached per model)."""

    owners: dict[str, nn.Module]  # module name -> module owning trainable parameters
    rules: dict[str, GhostRule]  # module name -> its per-layer rule (flower_dp.mechanisms.ghost_rules)
    named: list[tuple[str, nn.Parameter]]  # trainable parameters, named_parameters order
    slices: dict[str, tuple[int, int, torch.Size]]  # parameter name -> (start, stop, shape) in the flat vector
    want: dict[str, set[str]]  # module name -> its trainable leaves ("weight", "bias")
    dests: dict[str, dict[str, str]]  # module name -> leaf -> parameter name
    owner_of: dict[str, str]  # parameter name -> module name
    d: int


_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _signature(model: nn.Module) -> tuple:
    """The rule registry's version, then identity, type, parameters (identity, shape, requires_grad) of
    every submodule, in order."""
    return (registry_version(),) + tuple(
        (id(mod), type(mod), tuple((k, id(p), p.shape, p.requires_grad) for k, p in mod._parameters.items() if p is not None))
        for mod in model.modules()
    )


def _plan(model: nn.Module) -> _Plan:
    """The model's :class:`_Plan`, rebuilt (and the model re-checked) whenever its signature changes.

    Raises what :func:`check_ghost_supported` raises.
    """
    sig = _signature(model)
    cached = _PLANS.get(model)
    if cached is not None and cached[0] == sig:
        return cached[1]
    check_no_batchnorm(model)
    layers = _layers(model)
    owners = {m: mod for m, (mod, _) in layers.items()}
    rules = {m: rule for m, (_, rule) in layers.items()}
    named = trainable_named_parameters(model)
    slices, start = {}, 0
    for n, p in named:
        slices[n] = (start, start + p.numel(), p.shape)
        start += p.numel()
    want, dests, owner_of = {}, {}, {}
    for m in owners:
        dests[m] = {leaf: f"{m}.{leaf}".lstrip(".") for leaf in ("weight", "bias") if f"{m}.{leaf}".lstrip(".") in slices}
        want[m] = set(dests[m])
        owner_of.update({n: m for n in dests[m].values()})
    plan = _Plan(owners, rules, named, slices, want, dests, owner_of, start)
    _PLANS[model] = (sig, plan)
    return plan


def check_ghost_supported(model: nn.Module) -> None:
    """Raise NotImplementedError (naming the layer) if :func:`ghost_clipped_grad_sum` cannot run ``model``."""
    check_no_batchnorm(model)
    _layers(model)


#: Mean-reducing losses whose ``reduction="none"`` form is the per-sample loss (exact shortcut).
_ELEMENTWISE_LOSSES = (F.cross_entropy, F.nll_loss)


def _per_sample_losses(loss_fn: LossFn, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """loss_fn on each sample as a batch of one, vectorised: shape (B,)."""
    if loss_fn in _ELEMENTWISE_LOSSES and out.dim() == 2 and y.dim() == 1:
        return loss_fn(out, y, reduction="none")
    return vmap(lambda o, t: loss_fn(o.unsqueeze(0), t.unsqueeze(0)))(out, y)


def ghost_clipped_grad_sum(
    model: nn.Module,
    loss_fn: LossFn,
    x: torch.Tensor,
    y: torch.Tensor,
    clip: float,
    *,
    params: torch.Tensor | None = None,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, ClipStats]:
    """Sum over the batch of per-sample gradients, each clipped to L2 norm ``clip`` (fast path).

    Same contract as :func:`flower_dp.mechanisms.per_sample_clipped_grad_sum` (which see), at
    about the cost of one non-private step plus one weight-gradient product per layer.

    Parameters
    ----------
    model : nn.Module
        Every trainable parameter must be the ``weight``/``bias`` of a Linear, Conv2d,
        GroupNorm, LayerNorm or Embedding layer.  Not modified (hooks are added for the
        call and removed).  No BatchNorm; no in-place op on a supported layer's output.
    loss_fn : callable ``(logits, y) -> scalar``
        Mean-reducing loss such as ``torch.nn.functional.cross_entropy``; applied per sample.
    x : Tensor, shape (B, ...)
    y : Tensor, shape (B, ...)
    clip : float
        Per-sample L2 bound ``C`` > 0 on the whole flattened gradient; ``math.inf`` disables.
    params : Tensor, shape (d,), optional
        Flat vector at which to evaluate; default the model's own parameters.
    chunk_size : int, optional
        Samples per forward/backward pass (bounds activation memory); default all at once.

    Returns
    -------
    grad_sum : Tensor, shape (d,)
        ``sum_s clipL2_C(grad_s)`` in ``model.named_parameters()`` order (trainable only).
    stats : ClipStats

    Raises
    ------
    NotImplementedError
        If a parameter belongs to an unsupported layer (use the reference path).
    NonFiniteError
        If a per-sample loss or gradient norm is NaN/inf.
    """
    plan = _plan(model)
    clip = check_positive("clip", clip, allow_inf=True, hint="clip is the per-sample L2 bound C; math.inf disables")
    _check_batch(plan, x, y, params)
    if chunk_size is not None and check_int("chunk_size", chunk_size, minimum=1) < x.shape[0]:
        return _chunked(model, loss_fn, x, y, clip, params, int(chunk_size))
    ref = plan.named[0][1]
    batch = int(x.shape[0])
    if batch == 0:
        return torch.zeros(plan.d, dtype=ref.dtype, device=ref.device), ClipStats(0.0, 0.0, 0.0, 0, 0.0)
    records, losses = _recorded_forward(model, plan, loss_fn, x, y, params)
    per_layer, sq = _layer_norms(plan, records, losses)
    if sq is None:
        sq = torch.zeros(batch, dtype=losses.dtype, device=losses.device)
    norms = sq.clamp_min(0).sqrt_()
    norm_list, loss_list = _finite_norms_and_losses(norms, losses.detach(), batch)
    # clipL2_C exactly as the reference: factor min(1, C/||g||); a zero gradient keeps factor 1.
    factor = torch.clamp_max(clip / norms.clamp_min(torch.finfo(norms.dtype).tiny), 1.0)
    if factor.dtype != ref.dtype:
        factor = factor.to(ref.dtype)
    total = _clipped_sum_of_layers(plan, per_layer, factor, ref)
    stats = ClipStats(
        clip_fraction=sum(v > clip for v in norm_list) / batch if math.isfinite(clip) else 0.0,
        mean_norm=math.fsum(norm_list) / batch,
        max_norm=max(norm_list),
        batch_size=batch,
        mean_loss=math.fsum(loss_list) / batch,
    )
    return total, stats


def _check_batch(plan: _Plan, x: torch.Tensor, y: torch.Tensor, params: torch.Tensor | None) -> None:
    """The arguments' errors, each naming the fix."""
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x and y must have the same batch size, got {x.shape[0]} and {y.shape[0]}")
    if not plan.named:
        raise ValueError("model has no trainable parameter, got none with requires_grad; nothing to clip")
    d = plan.d
    if params is not None and (not isinstance(params, torch.Tensor) or params.dim() != 1 or params.numel() != d):
        raise ValueError(
            f"params must be a 1-D tensor of the model's {d} trainable parameters, got "
            f"{type(params).__name__} of shape {tuple(getattr(params, 'shape', ()))}; use flatten_params(model)"
        )


def _recorded_forward(model: nn.Module, plan: _Plan, loss_fn: LossFn, x: torch.Tensor, y: torch.Tensor,
                      params: torch.Tensor | None):
    """One forward pass with hooks on the supported layers: ``(records, per-sample losses)``, where
    ``records[layer]`` lists ``(input, output, output version)`` of each call of the layer."""
    owners, named = plan.owners, plan.named
    records: dict[str, list[tuple[torch.Tensor, torch.Tensor, int]]] = {m: [] for m in owners}

    def make_hook(mname: str):
        def hook(mod, inputs, output):
            if not output.requires_grad:
                # Depends on nothing we differentiate: a leaf is exact and keeps the graph small.
                output = output.detach().requires_grad_(True)
            records[mname].append((inputs[0].detach(), output, output._version))
            return output

        return hook

    handles = [mod.register_forward_hook(make_hook(m)) for m, mod in owners.items()]
    try:
        with torch.enable_grad():  # also inside a caller's torch.no_grad()
            if params is None:
                out = model(x)
            else:
                views = unflatten_tensors(params.detach(), [p.shape for _, p in named])
                pdict = {n: v for (n, _), v in zip(named, views)}
                out = functional_call(model, pdict, (x,), strict=False)
            losses = _per_sample_losses(loss_fn, out, y)
    finally:
        for h in handles:
            h.remove()
    return records, losses


def _layer_norms(plan: _Plan, records: dict, losses: torch.Tensor):
    """One backward pass to the layers' outputs, then each layer's rule: ``(per_layer, sq)`` with
    ``per_layer[layer]`` the rule's clipped-sum function and ``sq`` the per-sample squared gradient norms summed
    over the layers (None when no layer has a trainable parameter in use)."""
    owners = plan.owners
    used = [(m, r) for m, rs in records.items() for r in rs]
    for m, (_, o, v) in used:
        if o._version != v:
            raise ValueError(
                f"the output of layer {m!r} ({type(owners[m]).__name__}) was modified in place (e.g. "
                "ReLU(inplace=True)), got a changed tensor version; use out-of-place ops or the reference path"
            )
    outs = [o for _, (_, o, _) in used]
    with torch.enable_grad():
        grads = torch.autograd.grad(losses.sum(), outs, allow_unused=True) if outs else ()
    per_layer = {}
    sq = None
    gi = 0
    for m, rs in records.items():
        ins, gs = [], []
        for a, o, _ in rs:
            g = grads[gi]
            gi += 1
            if g is not None:
                ins.append(a)
                gs.append(g.detach())
        if not ins:
            continue  # layer unused by the forward: zero gradient
        sq_m, clipped = plan.rules[m](owners[m], ins, gs, plan.want[m])
        if isinstance(sq_m, torch.Tensor):  # a layer with no trainable parameter in ``want`` gives 0
            sq = sq_m if sq is None else sq.add_(sq_m)  # each layer's sq_m is a fresh tensor
        per_layer[m] = clipped
    return per_layer, sq


def _finite_norms_and_losses(norms: torch.Tensor, losses: torch.Tensor, batch: int) -> tuple[list, list]:
    """The per-sample norms and losses as lists (one host sync); NonFiniteError when one is NaN/inf."""
    norm_list, loss_list = torch.stack((norms, losses.to(norms.dtype))).tolist()
    if not (all(map(math.isfinite, norm_list)) and all(map(math.isfinite, loss_list))):
        bad = sum(not (math.isfinite(a) and math.isfinite(b)) for a, b in zip(norm_list, loss_list))
        raise NonFiniteError(
            f"per-sample loss or gradient is not finite for {bad} of {batch} samples; "
            "got NaN/inf -- lower the learning rate or check the inputs"
        )
    return norm_list, loss_list


def _clipped_sum_of_layers(plan: _Plan, per_layer: dict, factor: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """``sum_s factor_s grad_s`` written into the flat vector, layer by layer (zero for unused layers)."""
    slices = plan.slices
    total = torch.empty(plan.d, dtype=ref.dtype, device=ref.device)  # every slice is written below
    with torch.no_grad():
        for m, clipped in per_layer.items():
            dest = {leaf: total[slices[n][0] : slices[n][1]].view(slices[n][2]) for leaf, n in plan.dests[m].items()}
            rest = clipped(factor, dest)
            for leaf, val in rest.items():
                dest[leaf].copy_(val.reshape(dest[leaf].shape))
        for n, (lo, hi, _) in slices.items():
            if plan.owner_of[n] not in per_layer:  # a layer the forward pass did not use: zero gradient
                total[lo:hi] = 0
    return total


def _chunked(model, loss_fn, x, y, clip, params, chunk) -> tuple[torch.Tensor, ClipStats]:
    """:func:`ghost_clipped_grad_sum` over slices of ``chunk`` samples, sums and statistics combined."""
    total, parts = None, []
    for start in range(0, x.shape[0], chunk):
        xs, ys = x[start : start + chunk], y[start : start + chunk]
        t, st = ghost_clipped_grad_sum(model, loss_fn, xs, ys, clip, params=params)
        total = t if total is None else total.add_(t)
        parts.append(st)
    b = sum(p.batch_size for p in parts)
    stats = ClipStats(
        clip_fraction=sum(p.clip_fraction * p.batch_size for p in parts) / b,
        mean_norm=sum(p.mean_norm * p.batch_size for p in parts) / b,
        max_norm=max(p.max_norm for p in parts),
        batch_size=b,
        mean_loss=sum(p.mean_loss * p.batch_size for p in parts) / b,
    )
    return total, stats
