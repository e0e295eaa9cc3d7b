"""Your own model and data under a name an experiment config can carry.

An experiment config names its dataset and model (``data.dataset``, ``model.name``) so that every backend can
rebuild the same nodes from it.  A model factory and tensors of the caller's own are registered here under a key
``"own:<digest>"``; a config that names that key as its dataset and model is built from them by the one node
builder (:func:`flower_dp.clients.builder.build_parts`).  The digest is a hash of the data and of the model's
architecture, so a resume with other data or another model is refused as a different config.  The registry is
per process: a backend that builds nodes in other processes takes a :func:`snapshot` with it and :func:`install`\\ s
it there (the push-sum ClientApp does).  This module imports neither torch nor Flower.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["OwnSource", "PREFIX", "register", "lookup", "is_own", "snapshot", "install"]

#: the prefix of a registered key in ``data.dataset`` and ``model.name``
PREFIX = "own:"


@dataclass(frozen=True)
class OwnSource:
    """A caller's model factory, training tensors and held-out test tensors."""

    model_fn: Callable[[], Any]
    train: tuple[Any, Any]
    test: tuple[Any, Any]
    num_classes: int


_SOURCES: dict[str, OwnSource] = {}


def register(key: str, source: OwnSource) -> str:
    """Register ``source`` under ``key`` (which must start with :data:`PREFIX`) and return the key."""
    if not key.startswith(PREFIX):
        raise ValueError(f"an own source's key must start with {PREFIX!r}, got {key!r}")
    _SOURCES[key] = source
    return key


def is_own(name: Any) -> bool:
    """Whether a config's dataset or model name refers to a registered own source."""
    return isinstance(name, str) and name.startswith(PREFIX)


def lookup(key: str) -> OwnSource:
    """The source registered under ``key``."""
    try:
        return _SOURCES[key]
    except KeyError:
        raise KeyError(f"no own model and data registered under {key!r} in this process (registered: "
                       f"{sorted(_SOURCES)}); run it through flower_dp.train_private, which registers them") from None


def snapshot() -> dict[str, OwnSource]:
    """Every registered source (to carry to the processes that build nodes)."""
    return dict(_SOURCES)


def install(sources: dict[str, OwnSource]) -> None:
    """Register every source of a :func:`snapshot` in this process."""
    _SOURCES.update(sources)
