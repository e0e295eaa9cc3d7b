"""Check, at import, that the installed versions meet flower-dp's own requirements (``pyproject.toml``).

Flower's runtime dependency installation (``flwr run`` without ``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1``)
runs ``uv sync`` on the app's ``pyproject.toml`` into a fresh environment: an app that pins, say,
``torch==2.8.0`` gets that torch beside flower-dp, which needs ``torch>=2.9``, and nothing else checks it.  This
check reads flower-dp's requirements from its installed metadata (no extras) and raises one ``ImportError`` that
names every installed version outside its range, the required range and the fix.  A requirement that is not
installed at all is left to the import that needs it (its ``ModuleNotFoundError`` names it); a flower-dp run from a
source tree without metadata is not checked.  ~0.05 s.
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys

__all__ = ["check_requirements", "unmet_requirements"]

DIST = "flower-dp"


def unmet_requirements(dist: str = DIST) -> list[tuple[str, str, str]]:
    """``(name, installed version, required specifier)`` for each installed requirement of ``dist`` (no extras)
    whose version is outside its range; empty when all are met or ``dist`` has no metadata."""
    try:
        reqs = metadata.requires(dist) or []
    except metadata.PackageNotFoundError:
        return []
    from packaging.requirements import Requirement

    out = []
    for text in reqs:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an extra's requirement (test, fast, bench) or another platform's
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            continue
        if not req.specifier.contains(have, prereleases=True):
            out.append((req.name, have, str(req.specifier)))
    return out


def check_requirements(dist: str = DIST) -> None:
    """Raise ``ImportError`` naming every installed requirement of ``dist`` whose version is out of range."""
    bad = unmet_requirements(dist)
    if not bad:
        return
    found = "; ".join(f"{name} {have} is installed, {dist} requires {name}{spec}" for name, have, spec in bad)
    pins = " ".join(f"'{name}{spec}'" for name, _, spec in bad)
    raise ImportError(
        f"{found} (environment {sys.prefix}). Flower's runtime dependency installation may have installed your "
        f"app's own pin: change the pin in the app's pyproject.toml to {pins}, or install those versions "
        f"(pip install {pins}), or run `flwr run` with FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 to use the "
        "environment flower-dp was installed in")
