"""The node spec of a push-sum run over Flower: what every ClientApp's node builder gets, as a frozen, typed value.

:class:`NodeSpec` names the fields the built-in builders read (the registry builder's config and plan, the toy
builder's network) and keeps any other field a custom builder needs in ``extra``.  It is never changed after the
strategy is made; the per-run values that the ClientApps also need (the relay session, where the Ray host actors
live) travel beside it on the wire (:meth:`NodeSpec.wire`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

__all__ = ["NodeSpec"]


def _frozen(m: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    return None if m is None else MappingProxyType(dict(m))


@dataclass(frozen=True)
class NodeSpec:
    """What each ClientApp's node builder needs (sent once per node in the ``register`` message).

    Attributes (None: not given; the builder's default applies)
    ----------
    builder : str
        ``"registry"`` (a config's algorithm, :func:`flower_dp.clients.push_sum_node.build_registry_node`), ``"toy"``
        or a name the ClientApp was made with.
    algorithm : str
        The algorithm's name, as the results document reports it (default ``"custom"``).
    config : mapping
        The experiment config (``ExperimentConfig.to_dict()``) of the registry builder.
    plan : object
        The plan of the run (:class:`flower_dp.clients.base.Plan`): its K, noise and privacy ledger.
    device : str
        Where relay nodes run (``"cpu"``, ``"cuda"``, ``"auto"``).
    n_nodes, topology, topology_kwargs, node_kwargs
        The toy builder's network and node settings.
    extra : mapping
        Any other field of the spec, passed to the builder unchanged.
    """

    builder: str | None = None
    algorithm: str | None = None
    config: Mapping[str, Any] | None = None
    plan: Any = None
    device: str | None = None
    n_nodes: int | None = None
    topology: Any = None
    topology_kwargs: Mapping[str, Any] | None = None
    node_kwargs: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def of(cls, spec: NodeSpec | Mapping[str, Any] | None) -> NodeSpec:
        """``spec`` as a NodeSpec (a mapping's unknown keys go to ``extra``); a ``ValueError`` names a private key."""
        if isinstance(spec, NodeSpec):
            return spec
        spec = dict(spec or {})
        private = sorted(key for key in spec if str(key).startswith("_"))
        if private:
            raise ValueError(f"the node spec has the reserved key(s) {private}; keys starting with '_' are the "
                             "strategy's own (the relay session, the Ray placement): rename them")
        named = {f.name for f in fields(cls)} - {"extra"}
        kw = {key: spec.pop(key) for key in list(spec) if key in named}
        for key in ("config", "topology_kwargs", "node_kwargs"):
            if kw.get(key) is not None:
                kw[key] = _frozen(kw[key])
        return cls(**kw, extra=MappingProxyType(spec))

    @property
    def algorithm_name(self) -> str:
        """The algorithm as the results document names it (``"custom"`` when not given)."""
        return self.algorithm or "custom"

    def as_dict(self) -> dict[str, Any]:
        """The spec as the node builders read it: every given field (plain dicts), ``extra`` merged in."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "extra" or v is None:
                continue
            out[f.name] = dict(v) if isinstance(v, MappingProxyType) else v
        out.update(self.extra)
        return out

    def wire(self, *, session: str, ray: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """What a ``register`` message carries: :meth:`as_dict` plus this run's relay ``session`` and, for the Ray
        transport, where the host actors live (the ClientApp reads them as ``_session`` and ``_ray``)."""
        out = self.as_dict()
        out["_session"] = session
        if ray is not None:
            out["_ray"] = dict(ray)
        return out
