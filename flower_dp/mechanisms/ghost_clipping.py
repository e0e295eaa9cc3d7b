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
3. Per-sample squared norms per layer from ``a`` and ``g``, summed over layers:

   - Linear ``(B, in)``: ``||a_s||^2 ||g_s||^2``; with token dims ``(B, T, in)`` the Gram form
     ``sum_{t,t'} (a_t.a_t')(g_t.g_t')`` or the materialised ``g_s^T a_s``, whichever is cheaper.
   - Conv2d: patches ``U_s = unfold(a_s)`` ``(k, L)``; materialised ``g_s U_s^T`` (small for
     convs) or the Gram form over the ``L`` positions, whichever is cheaper.
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

__all__ = ["ghost_clipped_grad_sum", "GHOST_SUPPORTED_LAYERS", "check_ghost_supported"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

#: Layer types whose per-sample gradient norms this module computes.
GHOST_SUPPORTED_LAYERS: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv2d, nn.GroupNorm, nn.LayerNorm, nn.Embedding)


def _layers(model: nn.Module) -> dict[str, nn.Module]:
    """Map module name -> module for every module that owns a trainable parameter.

    Raises NotImplementedError naming the first unsupported owner.
    """
    modules = dict(model.named_modules())
    owners: dict[str, nn.Module] = {}
    for pname, _ in trainable_named_parameters(model):
        mname, _, leaf = pname.rpartition(".")
        mod = modules[mname]
        supported = isinstance(mod, GHOST_SUPPORTED_LAYERS) and leaf in ("weight", "bias")
        if isinstance(mod, nn.Embedding) and (mod.max_norm is not None or mod.scale_grad_by_freq):
            supported = False
        if not supported:
            raise NotImplementedError(
                f"ghost clipping cannot handle parameter {pname!r} of layer {mname or '<root>'!r} "
                f"({type(mod).__name__}); supported layers are "
                f"{', '.join(t.__name__ for t in GHOST_SUPPORTED_LAYERS)} (Embedding without max_norm / "
                "scale_grad_by_freq), got an unsupported one -- use the reference path "
                "flower_dp.mechanisms.per_sample_clipped_grad_sum for this model"
            )
        owners[mname] = mod
    return owners


@dataclass(frozen=True)
class _Plan:
    """What one call needs to know about a model's trainable parameters (cached per model)."""

    owners: dict[str, nn.Module]  # module name -> module owning trainable parameters
    named: list[tuple[str, nn.Parameter]]  # trainable parameters, named_parameters order
    slices: dict[str, tuple[int, int, torch.Size]]  # parameter name -> (start, stop, shape) in the flat vector
    want: dict[str, set[str]]  # module name -> its trainable leaves ("weight", "bias")
    dests: dict[str, dict[str, str]]  # module name -> leaf -> parameter name
    owner_of: dict[str, str]  # parameter name -> module name
    d: int


_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _signature(model: nn.Module) -> tuple:
    """Identity, type, parameters (identity, shape, requires_grad) of every submodule, in order."""
    return tuple(
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
    owners = _layers(model)
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
    plan = _Plan(owners, named, slices, want, dests, owner_of, start)
    _PLANS[model] = (sig, plan)
    return plan


def check_ghost_supported(model: nn.Module) -> None:
    """Raise NotImplementedError (naming the layer) if :func:`ghost_clipped_grad_sum` cannot run ``model``."""
    check_no_batchnorm(model)
    _layers(model)


# ---------------------------------------------------------------------------------------------
# per-layer maths.  Each returns (per-sample squared norm (B,), clipped-sum fn(c) -> {leaf: grad})
# a: layer input(s), g: gradient of sum_s loss_s w.r.t. the layer output, both with batch dim 0.


def _sqnorm(t: torch.Tensor) -> torch.Tensor:
    """Per-row squared L2 norm of ``t`` viewed as (N, -1), in one pass (no squared copy)."""
    return torch.linalg.vector_norm(t.reshape(t.shape[0], -1), dim=1).square()


def _cat(ts: list[torch.Tensor], dim: int) -> torch.Tensor:
    return ts[0] if len(ts) == 1 else torch.cat(ts, dim)


def _ghost_tokens(a: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-sample ``||g_s a_s^T||_F^2`` for a (N, p, T), g (N, q, T) (feature-major, T tokens).

    Returns the squared norms (N,) and the materialised per-sample products (N, q, p) when
    that is the cheaper way (cost N T p q) versus the Gram form (cost N T^2 (p + q)).
    """
    n, p, t = a.shape
    q = g.shape[1]
    if t * t * (p + q) < t * p * q:
        aa = torch.bmm(a.transpose(1, 2), a)  # (N, T, T)
        gg = torch.bmm(g.transpose(1, 2), g)
        return (aa * gg).sum((1, 2)), None
    per = torch.bmm(g, a.transpose(1, 2))  # (N, q, p)
    return _sqnorm(per), per


def _linear_rows(a: torch.Tensor, g: torch.Tensor, want: set[str]):
    """Linear layer called once on (B, in) rows: the common case, with the fewest tensor ops.

    Per-sample weight gradient ``g_s a_s^T`` has squared norm ``|a_s|^2 |g_s|^2`` and the bias
    gradient is ``g_s``, so the sum is ``|g_s|^2 (|a_s|^2 + 1)`` (weight and bias).
    """
    gg = _sqnorm(g)
    if "weight" in want:
        aa = _sqnorm(a)  # a fused reduction: no (B, in) temporary (large ones cost page faults)
        sq = gg * aa.add_(1.0) if "bias" in want else gg * aa
    else:
        sq = gg

    def clipped(c: torch.Tensor, dest: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        cg = g * c.unsqueeze(1)
        if "weight" in want:
            torch.mm(cg.t(), a, out=dest["weight"])
        if "bias" in want:
            torch.sum(cg, 0, out=dest["bias"])
        return {}

    return sq, clipped


def _linear(mod: nn.Linear, ins: list[torch.Tensor], gs: list[torch.Tensor], want: set[str]):
    if len(ins) == 1 and ins[0].dim() == 2:
        return _linear_rows(ins[0], gs[0], want)
    b = ins[0].shape[0]
    a = _cat([x.reshape(b, -1, x.shape[-1]) for x in ins], 1)  # (B, T, in)
    g = _cat([y.reshape(b, -1, y.shape[-1]) for y in gs], 1)  # (B, T, out)
    tokens = a.shape[1]
    sq = 0
    per = None
    if "weight" in want:
        if tokens == 1:  # ||g_s a_s^T||_F^2 = ||a_s||^2 ||g_s||^2
            sq = _sqnorm(a) * _sqnorm(g)
        else:
            sq, per = _ghost_tokens(a.transpose(1, 2), g.transpose(1, 2))
    gb = (g.reshape(b, -1) if tokens == 1 else g.sum(1)) if "bias" in want else None
    if gb is not None:
        sq = sq + _sqnorm(gb)

    def clipped(c: torch.Tensor, dest: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {}  # what is not written straight into ``dest`` (views of the result vector)
        if "weight" in want:
            if per is not None:
                out["weight"] = torch.tensordot(c, per, dims=1)
            else:
                cg = g * c.view(b, 1, 1)
                torch.mm(cg.reshape(-1, g.shape[2]).t(), a.reshape(-1, a.shape[2]), out=dest["weight"])
        if gb is not None:
            torch.mv(gb.t(), c, out=dest["bias"])
        return out

    return sq, clipped


def _conv2d_few_channels(mod: nn.Conv2d, ins: list[torch.Tensor], gs: list[torch.Tensor], want: set[str]):
    """Per-sample weight gradients of a conv with few input channels as one grouped conv.

    ``per[b, o, i, p, q] = sum_{h,w} g[b,o,h,w] x_pad[b,i, h s + p d, w s + q d]`` is a conv of
    the input (batch <-> channel swapped) with the output gradients as ``B`` groups of kernels
    (stride and dilation swap roles).  Avoids the im2col copy, which dominates when ``C_in`` is
    small (e.g. the first layer of an image model).
    """
    b = ins[0].shape[0]
    cout, cin = mod.out_channels, mod.in_channels
    kh, kw = mod.kernel_size
    per = 0
    for x, g in zip(ins, gs):
        if mod.padding_mode != "zeros" or isinstance(mod.padding, str):
            mode = "constant" if mod.padding_mode == "zeros" else mod.padding_mode
            x, padding = F.pad(x, mod._reversed_padding_repeated_twice, mode=mode), 0
        else:
            padding = mod.padding
        ho, wo = g.shape[2], g.shape[3]
        out = F.conv2d(
            x.transpose(0, 1), g.reshape(b * cout, 1, ho, wo), None,
            stride=mod.dilation, padding=padding, dilation=mod.stride, groups=b,
        )  # (Cin, B*Cout, >=kh, >=kw)
        per = per + out[:, :, :kh, :kw].reshape(cin, b, cout, kh, kw)
    sq = torch.linalg.vector_norm(per, dim=(0, 2, 3, 4)).square()
    gb = None
    if "bias" in want:
        gb = sum(g.sum((2, 3)) for g in gs)
        sq = sq + _sqnorm(gb)

    def clipped(c: torch.Tensor, dest: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {"weight": torch.einsum("ibokl,b->oikl", per, c)}
        if gb is not None:
            out["bias"] = c.matmul(gb)
        return out

    return sq, clipped


#: Below this many input channels (and groups == 1) the grouped-conv form replaces im2col.
_FEW_CHANNELS = 8


def _conv2d(mod: nn.Conv2d, ins: list[torch.Tensor], gs: list[torch.Tensor], want: set[str]):
    if mod.groups == 1 and mod.in_channels <= _FEW_CHANNELS and "weight" in want:
        return _conv2d_few_channels(mod, ins, gs, want)
    b = ins[0].shape[0]
    groups = mod.groups
    cout = mod.out_channels
    patches = []
    for x in ins:
        if mod.padding_mode != "zeros" or isinstance(mod.padding, str):
            mode = "constant" if mod.padding_mode == "zeros" else mod.padding_mode
            x = F.pad(x, mod._reversed_padding_repeated_twice, mode=mode)
            padding = 0
        else:
            padding = mod.padding
        # (B, Cin * kh * kw, L), rows ordered (channel, kh, kw): group j owns a contiguous block
        patches.append(F.unfold(x, mod.kernel_size, dilation=mod.dilation, padding=padding, stride=mod.stride))
    u = _cat(patches, 2)
    g = _cat([y.reshape(b, cout, -1) for y in gs], 2)  # (B, Cout, L)
    length = u.shape[2]
    k = u.shape[1] // groups
    sq = 0
    per = None
    if "weight" in want:
        # one (sample, group) pair = one token problem: (B*G, k, L) and (B*G, Cout/G, L), views
        sq_w, per = _ghost_tokens(u.view(b * groups, k, length), g.view(b * groups, cout // groups, length))
        sq = sq_w.view(b, groups).sum(1)
    gb = g.sum(2) if "bias" in want else None
    if gb is not None:
        sq = sq + _sqnorm(gb)
    wshape = mod.weight.shape

    def clipped(c: torch.Tensor, dest: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {}
        if "weight" in want:
            if per is not None:  # (B*G, Cout/G, k)
                w = torch.tensordot(c, per.view(b, -1), dims=1)
            else:
                cg = (g * c.view(b, 1, 1)).view(b, groups, cout // groups, length)
                w = torch.einsum("bgol,bgkl->gok", cg, u.view(b, groups, k, length))
            out["weight"] = w.reshape(wshape)
        if gb is not None:
            out["bias"] = c.matmul(gb)
        return out

    return sq, clipped


def _norm_layer(mod: nn.Module, ins: list[torch.Tensor], gs: list[torch.Tensor], want: set[str]):
    pw = 0
    pb = 0
    for x, g in zip(ins, gs):
        if isinstance(mod, nn.GroupNorm):
            xhat = F.group_norm(x, mod.num_groups, None, None, mod.eps)
            red = tuple(range(2, x.dim()))  # per-channel: sum over spatial dims
        else:
            xhat = F.layer_norm(x, mod.normalized_shape, None, None, mod.eps)
            red = tuple(range(1, x.dim() - len(mod.normalized_shape)))  # sum over token dims
        if "weight" in want:
            pw = pw + ((g * xhat).sum(red) if red else g * xhat)
        if "bias" in want:
            pb = pb + (g.sum(red) if red else g)
    per = {}
    if "weight" in want:
        per["weight"] = pw
    if "bias" in want:
        per["bias"] = pb
    sq = sum(_sqnorm(v) for v in per.values())

    def clipped(c: torch.Tensor, dest: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {leaf: torch.tensordot(c, v, dims=1) for leaf, v in per.items()}

    return sq, clipped


def _embedding(mod: nn.Embedding, ins: list[torch.Tensor], gs: list[torch.Tensor], want: set[str]):
    b = ins[0].shape[0]
    idx = _cat([i.reshape(b, -1) for i in ins], 1)  # (B, T)
    g = _cat([y.reshape(b, -1, y.shape[-1]) for y in gs], 1)  # (B, T, D)
    if mod.padding_idx is not None:
        g = g * (idx != mod.padding_idx).unsqueeze(-1).to(g.dtype)
    same = (idx.unsqueeze(2) == idx.unsqueeze(1)).to(g.dtype)  # (B, T, T)
    sq = (torch.bmm(g, g.transpose(1, 2)) * same).sum((1, 2))

    def clipped(c: torch.Tensor, dest: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        w = torch.zeros(mod.num_embeddings, g.shape[2], dtype=g.dtype, device=g.device)
        w.index_add_(0, idx.reshape(-1), (g * c.view(b, 1, 1)).reshape(-1, g.shape[2]))
        return {"weight": w}

    return sq, clipped


def _layer_maths(mod: nn.Module):
    if isinstance(mod, nn.Linear):
        return _linear
    if isinstance(mod, nn.Conv2d):
        return _conv2d
    if isinstance(mod, nn.Embedding):
        return _embedding
    return _norm_layer


# ---------------------------------------------------------------------------------------------


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
    owners, named, slices = plan.owners, plan.named, plan.slices
    clip = check_positive("clip", clip, allow_inf=True, hint="clip is the per-sample L2 bound C; math.inf disables")
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x and y must have the same batch size, got {x.shape[0]} and {y.shape[0]}")
    if not named:
        raise ValueError("model has no trainable parameter, got none with requires_grad; nothing to clip")
    if chunk_size is not None and check_int("chunk_size", chunk_size, minimum=1) < x.shape[0]:
        return _chunked(model, loss_fn, x, y, clip, params, int(chunk_size))
    ref = named[0][1]
    d = plan.d
    batch = int(x.shape[0])
    if x.shape[0] == 0:
        return torch.zeros(d, dtype=ref.dtype, device=ref.device), ClipStats(0.0, 0.0, 0.0, 0, 0.0)
    total = torch.empty(d, dtype=ref.dtype, device=ref.device)  # every slice is written below

    records: dict[str, list[tuple[torch.Tensor, torch.Tensor, int]]] = {m: [] for m in owners}

    def make_hook(mname: str):
        def hook(mod, inputs, output):
            if not output.requires_grad:
                # Depends on nothing we differentiate: a leaf is exact and keeps the graph small.
                output = output.detach().requires_grad_(True)
            records[mname].append((inputs[0].detach(), output, output._version))
            return output

        return hook

    if params is not None and (not isinstance(params, torch.Tensor) or params.dim() != 1 or params.numel() != d):
        raise ValueError(
            f"params must be a 1-D tensor of the model's {d} trainable parameters, got "
            f"{type(params).__name__} of shape {tuple(getattr(params, 'shape', ()))}; use flatten_params(model)"
        )
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
        sq_m, clipped = _layer_maths(owners[m])(owners[m], ins, gs, plan.want[m])
        if isinstance(sq_m, torch.Tensor):  # a layer with no trainable parameter in ``want`` gives 0
            sq = sq_m if sq is None else sq.add_(sq_m)  # each layer's sq_m is a fresh tensor
        per_layer[m] = clipped
    if sq is None:
        sq = torch.zeros(batch, dtype=losses.dtype, device=losses.device)
    norms = sq.clamp_min(0).sqrt_()
    losses = losses.detach()
    # one host sync for every statistic (small models: per-call overhead matters)
    norm_list, loss_list = torch.stack((norms, losses.to(norms.dtype))).tolist()
    if not (all(map(math.isfinite, norm_list)) and all(map(math.isfinite, loss_list))):
        bad = sum(not (math.isfinite(a) and math.isfinite(b)) for a, b in zip(norm_list, loss_list))
        raise NonFiniteError(
            f"per-sample loss or gradient is not finite for {bad} of {batch} samples; "
            "got NaN/inf -- lower the learning rate or check the inputs"
        )
    # clipL2_C exactly as the reference: factor min(1, C/||g||); a zero gradient keeps factor 1.
    factor = torch.clamp_max(clip / norms.clamp_min(torch.finfo(norms.dtype).tiny), 1.0)
    if factor.dtype != ref.dtype:
        factor = factor.to(ref.dtype)
    with torch.no_grad():
        for m, clipped in per_layer.items():
            dest = {leaf: total[slices[n][0] : slices[n][1]].view(slices[n][2]) for leaf, n in plan.dests[m].items()}
            rest = clipped(factor, dest)
            for leaf, val in rest.items():
                dest[leaf].copy_(val.reshape(dest[leaf].shape))
        for n, (lo, hi, _) in slices.items():
            if plan.owner_of[n] not in per_layer:  # a layer the forward pass did not use: zero gradient
                total[lo:hi] = 0
    stats = ClipStats(
        clip_fraction=sum(v > clip for v in norm_list) / batch if math.isfinite(clip) else 0.0,
        mean_norm=math.fsum(norm_list) / batch,
        max_norm=max(norm_list),
        batch_size=batch,
        mean_loss=math.fsum(loss_list) / batch,
    )
    return total, stats


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
