"""Packaging: one distribution, three import names, no stray top-level packages, one version source.

The built sdist and wheel, installed into a fresh venv, are tested in tests/test_wheel.py."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ["privacy", "mechanisms", "gossip", "topology.py", "data.py", "models.py", "rng.py", "errors.py", "_checks.py"]


def test_editable_install_imports_all_three_namespaces():
    """flower_dp, flower_dp.strategies and flower_dp.clients import; the last two map to their folders."""
    import flower_dp
    import flower_dp.clients
    import flower_dp.strategies

    assert Path(flower_dp.strategies.__file__).parent == ROOT / "strategies"
    assert Path(flower_dp.clients.__file__).parent == ROOT / "clients"
    assert flower_dp.__version__


def test_no_top_level_strategies_or_clients_importable():
    """Installing flower-dp must not shadow generic names such as `strategies`."""
    code = "import importlib.util,sys; sys.exit(int(any(importlib.util.find_spec(n) for n in ('strategies','clients'))))"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # Ray start-up may have exported one
    rc = subprocess.run([sys.executable, "-c", code], cwd="/", env=env).returncode
    assert rc == 0


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    mods: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            mods.add(("." * node.level) + node.module)
    return mods


def test_core_never_imports_flower_or_the_glue_packages():
    """The core knows nothing of Flower, clients or strategies.  Flower Datasets (``flwr_datasets``)
    is a data library, not the Flower runtime: ``flower_dp.data`` may use its partitioners (issue 2), lazily."""
    offenders = []
    for entry in CORE:
        p = ROOT / "flower_dp" / entry
        files = [p] if p.is_file() else sorted(p.rglob("*.py")) if p.exists() else []
        for f in files:
            for m in _imports(f):
                if (m.startswith("flwr") and not m.startswith("flwr_datasets")) or "clients" in m or "strategies" in m or m.startswith("..experiments"):
                    offenders.append(f"{f.relative_to(ROOT)} imports {m}")
    assert not offenders, offenders


def test_cli_help_runs():
    """`flower-dp --help` works after installation."""
    out = subprocess.run([sys.executable, "-m", "flower_dp.cli", "--help"], capture_output=True, text=True, check=True)
    assert "flower-dp" in out.stdout


def test_changelog_and_readme_name_the_current_version():
    """CHANGELOG.md's first entry and the README's wheel install line name flower_dp.__version__, the one version
    source (pyproject.toml reads it at build time)."""
    import flower_dp

    first = re.search(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert first and first.group(1) == flower_dp.__version__, \
        f"CHANGELOG.md's first entry is {first and first.group(1)!r}, got __version__ {flower_dp.__version__!r}: " \
        "add an entry for the new version at the top of CHANGELOG.md"
    wheels = set(re.findall(r"flower_dp-(\S+?)-py3-none-any\.whl", (ROOT / "README.md").read_text()))
    assert wheels == {flower_dp.__version__}, \
        f"README.md installs the wheel of version {sorted(wheels)}, got __version__ {flower_dp.__version__!r}"
