"""Packaging: one distribution, three import names, no stray top-level packages."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

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


@pytest.mark.slow
def test_wheel_contains_only_the_flower_dp_namespace(tmp_path):
    """The built wheel holds flower_dp/..., including flower_dp/strategies and flower_dp/clients."""
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("flower_dp-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"flower_dp"}, tops
    assert "flower_dp/strategies/__init__.py" in names
    assert "flower_dp/clients/__init__.py" in names


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
    """DESIGN.md: the core knows nothing of Flower, clients or strategies.  Flower Datasets (``flwr_datasets``)
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
