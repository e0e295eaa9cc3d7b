"""flower-dp checks its own requirements at import (issue 31): an app's torch pin installed by Flower's runtime
dependency installation fails with the installed and the required version, not somewhere later."""

from __future__ import annotations

import importlib.metadata as metadata

import pytest

from flower_dp import _requirements


def _fake(monkeypatch, versions):
    reqs = ["flwr[simulation]<1.43,>=1.41", "torch>=2.9", "numpy>=1.24", 'pytest>=7; extra == "test"']
    monkeypatch.setattr(_requirements.metadata, "requires", lambda dist: reqs)

    def version(name):
        if name not in versions:
            raise metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(_requirements.metadata, "version", version)


def test_an_old_torch_is_named_with_the_required_range_and_the_fix(monkeypatch):
    """torch 2.8.0 (the quickstart-pytorch pin) beside flower-dp: ImportError naming 2.8.0, >=2.9 and the fixes."""
    _fake(monkeypatch, {"flwr": "1.42.0", "torch": "2.8.0", "numpy": "2.1.0", "pytest": "6.0"})
    assert _requirements.unmet_requirements() == [("torch", "2.8.0", ">=2.9")]  # extras are not checked
    with pytest.raises(ImportError, match=r"torch 2\.8\.0 is installed, flower-dp requires torch>=2\.9.*"
                                          r"FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1"):
        _requirements.check_requirements()


def test_met_or_missing_requirements_pass(monkeypatch):
    """Versions in range, a local build tag, and a requirement not installed at all (left to its import) pass."""
    _fake(monkeypatch, {"flwr": "1.42.0", "torch": "2.13.0+cpu"})
    _requirements.check_requirements()
    assert _requirements.unmet_requirements() == []


def test_this_environment_meets_the_requirements():
    assert _requirements.unmet_requirements() == []
