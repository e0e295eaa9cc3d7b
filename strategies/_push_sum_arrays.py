"""The network-average model of a push-sum run as Flower's ``ArrayRecord``: the user's model, its buffers kept.

A push-sum node works on one flat vector of its model's trainable parameters; :func:`average_arrays` turns the
network average back into named arrays that load with ``model.load_state_dict(record.to_torch_state_dict())``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord

__all__ = ["average_arrays"]


def average_arrays(flat: Any, layout: list | None, template: ArrayRecord | None) -> ArrayRecord:
    """The flat vector ``flat`` (a tensor) as the nodes' model.

    ``layout`` (``[[name, start, stop, shape]]`` of the trainable parameters, reported by node 0) names and shapes
    the parameters; ``template`` (Flower's ``initial_arrays``) gives the buffers and dtypes.  Without a layout (a
    node without a model, the toy node): ``template``'s shapes when their sizes add up to d, else ``{"x": flat}``.
    """
    flat = flat.detach().cpu()
    if layout is not None:
        params = {name: flat[a:b].reshape(shape) for name, a, b, shape in layout}
        if template is None:
            return ArrayRecord({name: Array(np.ascontiguousarray(t.numpy())) for name, t in params.items()})
        out = {}
        for name, arr in template.items():
            ref = arr.numpy()
            out[name] = Array(np.ascontiguousarray(params[name].numpy().astype(ref.dtype).reshape(ref.shape))
                              if name in params else ref)
        return ArrayRecord(out)
    if template is not None and sum(int(np.prod(a.shape)) for a in template.values()) == flat.numel():
        out, pos = {}, 0
        for name, arr in template.items():
            ref = arr.numpy()
            out[name] = Array(np.ascontiguousarray(flat[pos:pos + ref.size].numpy().astype(ref.dtype).reshape(ref.shape)))
            pos += ref.size
        return ArrayRecord(out)
    return ArrayRecord({"x": Array(flat.numpy().copy())})
