"""Typed values on the wire and in checkpoints: plain values + raw arrays, never a pickle.

Everything push-sum sends between processes through Flower (relay requests and replies, node specs,
node states kept in ``context.state``) and every checkpoint goes through this codec.  A value is split
into a JSON *tree* (numbers, strings, lists, tagged dicts, tuples, bytes, allow-listed dataclasses) and
a list of raw numeric arrays (numpy arrays and torch tensors, dtype and shape kept, bit-exact).
Decoding builds only these types: it never imports a module or calls a constructor named by the data,
except the dataclasses registered with :func:`register` (a fixed allow-list kept in this process).

Two forms:

* :func:`pack` / :func:`unpack`: ``(tree: str, arrays: list[np.ndarray])``; the relay puts the tree in a
  ``ConfigRecord`` and the arrays in an ``ArrayRecord`` (Flower serialises those with
  ``np.save(allow_pickle=False)``).
* :func:`to_bytes` / :func:`from_bytes`: one self-describing byte string (header length, JSON header with the
  tree and each array's dtype and shape, then the raw array bytes), for checkpoints and ``context.state``.

Supported: ``None``, ``bool``, ``int`` (any size: numpy ``bit_generator.state`` dicts round-trip), ``float``
(``nan``/``inf`` too), ``str``, ``bytes``, ``list``, ``tuple``, ``dict`` (any keys of these types),
``np.ndarray`` and numpy scalars (numeric/bool dtypes), ``torch.Tensor`` (CPU copy; generator states as
``uint8`` tensors), and registered dataclasses.  Anything else raises ``TypeError`` naming the type.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import struct
from typing import Any

import numpy as np

__all__ = ["pack", "unpack", "to_bytes", "from_bytes", "register", "WireError", "MAGIC"]

MAGIC = b"FDPWIRE1"
_TAG = "$"
_REGISTRY: dict[str, type] = {}


class WireError(ValueError):
    """A byte string or tree that this codec did not write (or a type it does not allow)."""


def register(cls: type, name: str | None = None) -> type:
    """Allow the dataclass ``cls`` on the wire (decoded by calling ``cls(**fields)``); returns ``cls``."""
    if not dataclasses.is_dataclass(cls) or not isinstance(cls, type):
        raise TypeError(f"only dataclass types can be registered on the wire, got {cls!r}")
    _REGISTRY[name or _type_name(cls)] = cls
    return cls


def _type_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _check_dtype(dt: np.dtype) -> np.dtype:
    if dt.kind not in "biufc" or dt.fields is not None:
        raise WireError(f"array dtype {dt} is not allowed on the wire; valid kinds are bool, int, uint, float, "
                        "complex (object and structured arrays never travel)")
    return dt


def _enc(obj: Any, arrays: list[np.ndarray]) -> Any:
    if isinstance(obj, np.generic):  # before float: np.float64 is a float subclass, its type is kept
        arr = np.asarray(obj)
        _check_dtype(arr.dtype)
        arrays.append(arr.reshape(()))
        return {_TAG: "np", "i": len(arrays) - 1}
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return float(obj)
    if isinstance(obj, list):
        return [_enc(v, arrays) for v in obj]
    if isinstance(obj, tuple):
        return {_TAG: "tuple", "v": [_enc(v, arrays) for v in obj]}
    if isinstance(obj, dict):
        return {_TAG: "dict", "k": [_enc(k, arrays) for k in obj], "v": [_enc(v, arrays) for v in obj.values()]}
    if isinstance(obj, (bytes, bytearray)):
        return {_TAG: "bytes", "v": base64.b64encode(bytes(obj)).decode("ascii")}
    if isinstance(obj, np.ndarray):
        arrays.append(np.ascontiguousarray(obj))
        _check_dtype(obj.dtype)
        return {_TAG: "nd", "i": len(arrays) - 1}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        name = _type_name(type(obj))
        fields = {f.name: _enc(getattr(obj, f.name), arrays) for f in dataclasses.fields(obj) if f.init}
        return {_TAG: "dc", "type": name, "f": fields}
    try:
        import torch
    except ImportError:  # pragma: no cover
        torch = None
    if torch is not None and isinstance(obj, torch.Tensor):
        t = obj.detach().to("cpu").contiguous()
        if t.dtype == torch.bfloat16:
            arrays.append(t.view(torch.int16).numpy().copy())
            return {_TAG: "t", "i": len(arrays) - 1, "bf16": True}
        arrays.append(t.numpy().copy())
        _check_dtype(arrays[-1].dtype)
        return {_TAG: "t", "i": len(arrays) - 1}
    raise TypeError(f"{type(obj).__module__}.{type(obj).__qualname__} cannot go on the wire; valid types are None, "
                    "bool, int, float, str, bytes, list, tuple, dict, numpy arrays/scalars, torch tensors and "
                    "dataclasses registered with flower_dp.gossip.wire.register")


def _dec(node: Any, arrays: list[np.ndarray]) -> Any:
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if isinstance(node, list):
        return [_dec(v, arrays) for v in node]
    if not isinstance(node, dict) or _TAG not in node:
        raise WireError(f"malformed wire tree node {str(node)[:80]!r}; it was not written by flower_dp.gossip.wire")
    tag = node[_TAG]
    if tag == "tuple":
        return tuple(_dec(v, arrays) for v in node["v"])
    if tag == "dict":
        return {_dec(k, arrays): _dec(v, arrays) for k, v in zip(node["k"], node["v"], strict=True)}
    if tag == "bytes":
        return base64.b64decode(node["v"])
    if tag in ("nd", "np", "t"):
        i = node["i"]
        if not isinstance(i, int) or not 0 <= i < len(arrays):
            raise WireError(f"array index {i!r} out of range 0..{len(arrays) - 1}")
        arr = np.array(arrays[i], copy=True)  # own, writable memory
        _check_dtype(arr.dtype)
        if tag == "nd":
            return arr
        if tag == "np":
            return arr.reshape(())[()]
        import torch

        t = torch.from_numpy(arr)
        return t.view(torch.bfloat16) if node.get("bf16") else t
    if tag == "dc":
        cls = _REGISTRY.get(node["type"])
        if cls is None:
            raise WireError(f"type {node['type']!r} is not allowed on the wire (allowed: {sorted(_REGISTRY)}); "
                            "register it with flower_dp.gossip.wire.register on the receiving side")
        return cls(**{k: _dec(v, arrays) for k, v in node["f"].items()})
    raise WireError(f"unknown wire tag {tag!r}; this value was not written by flower_dp.gossip.wire")


def pack(obj: Any) -> tuple[str, list[np.ndarray]]:
    """``obj`` as a JSON tree and its arrays (see the module docstring)."""
    arrays: list[np.ndarray] = []
    tree = json.dumps(_enc(obj, arrays), separators=(",", ":"), allow_nan=True)
    return tree, arrays


def unpack(tree: str, arrays: list[np.ndarray]) -> Any:
    """Inverse of :func:`pack`."""
    try:
        node = json.loads(tree)
    except (TypeError, json.JSONDecodeError) as exc:
        raise WireError(f"wire tree is not valid JSON ({exc}); it was not written by flower_dp.gossip.wire") from exc
    return _dec(node, list(arrays))


def to_bytes(obj: Any) -> bytes:
    """``obj`` as one byte string: MAGIC, header length (8 bytes LE), JSON header, raw array bytes."""
    tree, arrays = pack(obj)
    header = json.dumps({"tree": tree, "arrays": [[a.dtype.str, list(a.shape)] for a in arrays]},
                        separators=(",", ":")).encode()
    return b"".join([MAGIC, struct.pack("<Q", len(header)), header, *(a.tobytes(order="C") for a in arrays)])


def from_bytes(data: bytes) -> Any:
    """Inverse of :func:`to_bytes`; raises :class:`WireError` on anything else (e.g. an old pickle)."""
    data = bytes(data)
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 8:
        raise WireError("not a flower-dp wire value (bad header); values written by torch.save/pickle are refused")
    (n,) = struct.unpack_from("<Q", data, len(MAGIC))
    start = len(MAGIC) + 8
    try:
        header = json.loads(data[start:start + n])
        arrays, off = [], start + n
        for dstr, shape in header["arrays"]:
            dt = _check_dtype(np.dtype(str(dstr)))
            shape = tuple(int(s) for s in shape)
            size = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            if off + size > len(data):
                raise WireError(f"wire value truncated: array of {size} bytes at offset {off}, only {len(data)} bytes")
            arrays.append(np.frombuffer(data, dtype=dt, count=size // dt.itemsize if dt.itemsize else 0,
                                        offset=off).reshape(shape))
            off += size
        tree = header["tree"]
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as exc:
        if isinstance(exc, WireError):
            raise
        raise WireError(f"malformed wire header ({exc})") from exc
    return unpack(tree, arrays)
