"""Going between an ``nn.Module`` and the flat 1-D vectors that node state is kept in.

Every per-node quantity (x, w, x_hat, table rows) is one 1-D tensor of length
``d`` = number of *trainable* parameters, in ``model.named_parameters()`` order.  Buffers
(e.g. GroupNorm has none; BatchNorm running stats) are node-local and never flattened.
The helpers follow SGP's ``flatten_tensors`` / ``unflatten_tensors``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = [
    "trainable_named_parameters",
    "flatten_params",
    "load_flat_params_",
    "param_slices",
    "flatten_tensors",
    "unflatten_tensors",
    "unflatten_to_dict",
]


def trainable_named_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The ``(name, parameter)`` pairs with ``requires_grad``, in registration order."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def flatten_tensors(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Concatenate tensors into one new 1-D tensor (a copy, detached from autograd).

    Parameters
    ----------
    tensors : sequence of Tensor
        Any shapes, one dtype and device.

    Returns
    -------
    Tensor, shape (sum of numel,)
    """
    if len(tensors) == 0:
        return torch.zeros(0)
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def unflatten_tensors(vec: torch.Tensor, like: Sequence[torch.Tensor | torch.Size | tuple]) -> list[torch.Tensor]:
    """Split a 1-D tensor into views shaped like ``like`` (tensors or shapes).

    Parameters
    ----------
    vec : Tensor, shape (d,)
        ``d`` must equal the total number of elements of ``like``.
    like : sequence of Tensor or shapes

    Returns
    -------
    list of Tensor
        Views into ``vec`` (no copy); reshaped in order.
    """
    shapes = [tuple(t.shape) if isinstance(t, torch.Tensor) else tuple(t) for t in like]
    sizes = [int(torch.Size(s).numel()) for s in shapes]
    if vec.dim() != 1 or vec.numel() != sum(sizes):
        raise ValueError(
            f"vec must be 1-D with {sum(sizes)} elements (the total size of the target shapes), "
            f"got shape {tuple(vec.shape)}; flatten with flatten_params/flatten_tensors of the same model"
        )
    out, start = [], 0
    for shape, size in zip(shapes, sizes):
        out.append(vec[start : start + size].view(shape))
        start += size
    return out


def flatten_params(model: nn.Module) -> torch.Tensor:
    """A detached copy of the model's trainable parameters as one vector.

    Returns
    -------
    Tensor, shape (d,)
        Same dtype and device as the parameters; ``d`` = number of trainable parameters.
    """
    return flatten_tensors([p for _, p in trainable_named_parameters(model)])


def param_slices(model: nn.Module) -> dict[str, slice]:
    """Where each trainable parameter lives in the flat vector: ``name -> slice``."""
    out, start = {}, 0
    for name, p in trainable_named_parameters(model):
        out[name] = slice(start, start + p.numel())
        start += p.numel()
    return out


def unflatten_to_dict(model: nn.Module, vec: torch.Tensor) -> dict[str, torch.Tensor]:
    """``name -> view of vec`` shaped like each trainable parameter (for ``functional_call``)."""
    named = trainable_named_parameters(model)
    views = unflatten_tensors(vec, [p.shape for _, p in named])
    return {name: v for (name, _), v in zip(named, views)}


def load_flat_params_(model: nn.Module, vec: torch.Tensor) -> None:
    """Copy a flat vector into the model's trainable parameters, in place.

    Parameters
    ----------
    model : nn.Module
        Changed in place (only ``requires_grad`` parameters; buffers untouched).
    vec : Tensor, shape (d,)
        Cast to each parameter's dtype/device.
    """
    named = trainable_named_parameters(model)
    views = unflatten_tensors(vec, [p.shape for _, p in named])
    with torch.no_grad():
        for (_, p), v in zip(named, views):
            p.copy_(v)
