"""flower-dp as a user gets it: the sdist and the wheel, built, checked, installed into a fresh venv and run.

The build runs without isolation (setuptools, build and twine come from the test extra), so the test needs no
network; ``python -m build`` with isolation, as a user runs it, uses the same pyproject.toml.  The wheel is built
from the sdist, as a release is, so a file the sdist lacks is missing from the wheel too.

The fresh venv gets the wheel with ``--no-deps``; the heavy dependencies (torch, flwr, ...) come from this
environment's site-packages through a ``.pth`` file instead of a second download.  A directory added by a ``.pth``
line has its own ``.pth`` files ignored, so the editable install of this checkout (a ``.pth`` and a finder in this
environment's site-packages) cannot answer ``import flower_dp`` there; the tests check that the wheel does.
Commands run from an empty folder with no PYTHONPATH, so the source tree is not on ``sys.path``.
"""

from __future__ import annotations

import email
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import flower_dp
from flower_dp.data import FASHION_MNIST_DIR

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
# source folder -> where its files go in the wheel (pyproject.toml [tool.setuptools] package-dir)
SOURCE_DIRS = {"flower_dp": "flower_dp", "strategies": "flower_dp/strategies", "clients": "flower_dp/clients"}
# a warning of the build backend (setuptools' "SetuptoolsDeprecationWarning: ...", "WARNING Package ... is absent"),
# not a file the build copies
BUILD_WARNING = re.compile(r"(?i)warning|deprecat")
FILE_OPERATION = ("copying ", "adding ", "creating ", "hard linking ", "writing ", "removing ", "making ")


def _env(**extra: str) -> dict[str, str]:
    """This environment without PYTHONPATH (Ray may export one), warning filters or the no-bytecode switch (which
    makes setuptools print "byte-compiling is disabled"), plus ``extra``."""
    drop = {"PYTHONPATH", "PYTHONWARNINGS", "PYTHONDONTWRITEBYTECODE"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(extra)
    return env


def _run(cmd: list[str], what: str, **kwargs) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    assert out.returncode == 0, f"{what} failed (exit {out.returncode}): {' '.join(map(str, cmd))}\n" \
                                f"stdout:\n{out.stdout[-3000:]}\nstderr:\n{out.stderr[-3000:]}"
    return out


def _source_files() -> list[str]:
    """Files of the three source folders (tracked by git in a checkout; every file but bytecode otherwise)."""
    git = subprocess.run(["git", "-C", str(ROOT), "ls-files", *SOURCE_DIRS], capture_output=True, text=True)
    if git.returncode == 0 and git.stdout.strip():
        return [f for f in git.stdout.splitlines() if (ROOT / f).is_file()]
    return [str(p.relative_to(ROOT)) for d in SOURCE_DIRS for p in (ROOT / d).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]


def _wheel_name(source: str) -> str:
    top, _, rest = source.partition("/")
    return f"{SOURCE_DIRS[top]}/{rest}"


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict:
    """``python -m build --no-isolation``: the sdist, then the wheel built from it."""
    out = tmp_path_factory.mktemp("dist")
    res = _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
               "python -m build", env=_env(), timeout=600)
    (wheel,) = out.glob("flower_dp-*.whl")
    (sdist,) = out.glob("flower_dp-*.tar.gz")
    return {"wheel": wheel, "sdist": sdist, "log": res.stdout + res.stderr}


@pytest.fixture(scope="module")
def venv(dist, tmp_path_factory) -> Path:
    """A fresh venv holding only the wheel; the dependencies come from this environment through a ``.pth``."""
    venv = tmp_path_factory.mktemp("venv")
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], "creating the fresh venv")
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
          str(dist["wheel"])], "installing the wheel", env=_env())
    (site,) = (venv / "lib").glob("python3*/site-packages")
    deps = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]
    (site / "_flower_dp_test_dependencies.pth").write_text("".join(f"{p}\n" for p in deps))
    return venv


@pytest.fixture
def user_cwd(tmp_path) -> Path:
    """An empty working folder, away from the source tree."""
    return tmp_path


def test_build_prints_no_warning(dist):
    """Building the sdist and the wheel prints no warning (a deprecated field, an undeclared package, ...)."""
    warnings = [line for line in dist["log"].splitlines()
                if BUILD_WARNING.search(line) and not line.lstrip().startswith(FILE_OPERATION)]
    assert not warnings, "the build warns; fix pyproject.toml:\n" + "\n".join(warnings)


def test_twine_check_passes(dist):
    """`twine check --strict` accepts the sdist and the wheel (metadata and README render for the package index)."""
    _run([sys.executable, "-m", "twine", "check", "--strict", str(dist["sdist"]), str(dist["wheel"])],
         "twine check", env=_env())


def test_wheel_holds_every_source_file_and_only_the_flower_dp_namespace(dist):
    """Every file of flower_dp/, strategies/ and clients/ (modules, configs, data) is in the wheel, under flower_dp/;
    nothing else is installed at the top level."""
    names = set(zipfile.ZipFile(dist["wheel"]).namelist())
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"flower_dp"}, tops
    missing = sorted(f for f in _source_files() if _wheel_name(f) not in names)
    assert not missing, f"{len(missing)} source files are missing from the wheel (declare their package or data in " \
                        f"pyproject.toml [tool.setuptools] packages / package-data): {missing}"


def test_sdist_holds_the_build_inputs(dist):
    """The sdist carries what the wheel is built from: pyproject.toml, README.md, LICENSE and the quickstart config."""
    names = {n.split("/", 1)[1] for n in tarfile.open(dist["sdist"]).getnames() if "/" in n}
    need = {"pyproject.toml", "README.md", "LICENSE", "flower_dp/experiments/configs/quickstart.toml"}
    assert need <= names, f"missing from the sdist: {sorted(need - names)}"


def test_wheel_metadata_version_license_and_entry_point(dist):
    """One version (flower_dp.__version__), an SPDX license with its text, and the flower-dp console script."""
    wheel = zipfile.ZipFile(dist["wheel"])
    info = f"flower_dp-{flower_dp.__version__}.dist-info"
    assert dist["wheel"].name.startswith(f"flower_dp-{flower_dp.__version__}-"), dist["wheel"].name
    meta = email.message_from_bytes(wheel.read(f"{info}/METADATA"))
    assert meta["Version"] == flower_dp.__version__
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert "Apache License" in wheel.read(f"{info}/licenses/LICENSE").decode()
    assert "flower-dp = flower_dp.cli:main" in wheel.read(f"{info}/entry_points.txt").decode()


def test_installed_wheel_is_what_imports(venv, user_cwd):
    """In the fresh venv flower_dp, its Flower glue and its configs come from the installed wheel, not this
    checkout, and no top-level `strategies` or `clients` package exists."""
    code = (
        "import importlib.util, json, importlib.metadata as md\n"
        "from importlib import resources\n"
        "import flower_dp, flower_dp.clients, flower_dp.strategies\n"
        "print(json.dumps({'files': [flower_dp.__file__, flower_dp.clients.__file__, flower_dp.strategies.__file__,\n"
        "  str(resources.files('flower_dp.experiments') / 'configs' / 'quickstart.toml')],\n"
        "  'version': flower_dp.__version__, 'dist_version': md.version('flower-dp'),\n"
        "  'stray': [n for n in ('strategies', 'clients') if importlib.util.find_spec(n)]}))\n"
    )
    out = _run([str(venv / "bin" / "python"), "-c", code], "importing the installed wheel", cwd=user_cwd, env=_env())
    got = json.loads(out.stdout)
    site = next((venv / "lib").glob("python3*/site-packages"))
    outside = [f for f in got["files"] if not Path(f).resolve().is_relative_to(site.resolve())]
    assert not outside, f"imported from outside the fresh venv's {site}: {outside}"
    assert Path(got["files"][-1]).is_file(), "the quickstart config is missing from the installed wheel"
    assert got["version"] == got["dist_version"] == flower_dp.__version__, got
    assert got["stray"] == [], got["stray"]


def test_installed_wheel_runs_the_cli(venv, user_cwd):
    """The console script of the wheel answers `flower-dp --version` and `flower-dp accountant`."""
    script = venv / "bin" / "flower-dp"
    assert script.is_file(), f"no {script}: the wheel declares no flower-dp console script ([project.scripts])"
    out = _run([str(script), "--version"], "flower-dp --version", cwd=user_cwd, env=_env())
    assert out.stdout.strip() == f"flower-dp {flower_dp.__version__}"
    out = _run([str(script), "accountant", "--noise-multiplier", "1", "--q", "0.01", "--steps", "1000", "--delta", "1e-5"],
               "flower-dp accountant", cwd=user_cwd, env=_env())
    assert re.search(r"^reported .*eps = \d", out.stdout, re.M), out.stdout


@pytest.mark.skipif(not FASHION_MNIST_DIR.is_dir(), reason="needs dataset-fashion-mnist (scripts/test.sh installs it)")
def test_installed_wheel_runs_the_quickstart(venv, user_cwd):
    """`flower-dp quickstart` from the wheel (its shipped config, 4 iterations) finishes and writes its results."""
    cmd = [str(venv / "bin" / "flower-dp"), "quickstart", "--out", "q", "--set", "run.num_iters=4",
           "--set", "run.eval_every=2"]
    out = _run(cmd, "flower-dp quickstart", cwd=user_cwd, env=_env(OMP_NUM_THREADS="1"), timeout=600)
    assert "status: finished" in out.stdout, out.stdout
    res = json.loads((user_cwd / "q" / "results.json").read_text())
    assert res["versions"]["flower-dp"] == flower_dp.__version__
    assert len(res["history"]) >= 1
