"""The package's layers point one way, and no module imports another that (transitively) imports it back.

docs/architecture.md: the core (``flower_dp`` minus the application modules) < ``clients`` |
``strategies`` (siblings: neither imports the other) < the application (``flower_dp.experiments``,
``flower_dp.reproduce``, the audit and the CLIs).  Every ``import`` statement counts, the lazy ones inside
functions included: this test reads the source (``ast``), it does not import anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: import name prefix -> folder (pyproject's package-dir)
PACKAGES = {"flower_dp": ROOT / "flower_dp", "flower_dp.strategies": ROOT / "strategies",
            "flower_dp.clients": ROOT / "clients"}
APPLICATION = ("flower_dp.experiments", "flower_dp.reproduce", "flower_dp.audit", "flower_dp.audit_cli",
               "flower_dp.cli", "flower_dp.bench_cli")
RANK = {"core": 0, "clients": 1, "strategies": 1, "application": 2}


def _modules() -> dict[str, Path]:
    out = {}
    for prefix, folder in PACKAGES.items():
        for f in folder.rglob("*.py"):
            parts = list(f.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([prefix, *parts])] = f
    return out


def layer(module: str) -> str:
    if module.startswith("flower_dp.clients"):
        return "clients"
    if module.startswith("flower_dp.strategies"):
        return "strategies"
    if any(module == a or module.startswith(a + ".") for a in APPLICATION):
        return "application"
    return "core"


def _imported(name: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):  # every import, at module level or inside a function
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)
    return {m for m in found if m.startswith("flower_dp")}


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports (a name resolves to the longest module prefix; a module's own
    parent packages are not edges: Python initialises them first in any case)."""
    mods = _modules()
    graph = {}
    for name, path in mods.items():
        targets = set()
        for imp in _imported(name, path):
            while imp and imp not in mods:
                imp = imp.rsplit(".", 1)[0] if "." in imp else ""
            if imp and imp != name and not name.startswith(imp + "."):
                targets.add(imp)
        graph[name] = targets
    return graph


def test_layers_point_one_way():
    bad = []
    for src, targets in import_graph().items():
        for dst in targets:
            ls, ld = layer(src), layer(dst)
            if RANK[ld] > RANK[ls] or (RANK[ls] == RANK[ld] == 1 and ls != ld):
                bad.append(f"{src} ({ls}) imports {dst} ({ld})")
    assert not bad, "imports against the layers:\n" + "\n".join(sorted(bad))


def test_no_import_cycles():
    graph = import_graph()
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_the_check_sees_lazy_imports(tmp_path):
    """A function-level import is an edge too (the check would have caught clients -> experiments)."""
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from flower_dp.experiments.runner import run_experiment\n")
    assert "flower_dp.experiments.runner" in _imported("flower_dp.clients.m", f)
    assert layer("flower_dp.experiments.runner") == "application" and layer("flower_dp.mechanisms.lrq") == "core"


def _imports_flwr(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = []
    for node in ast.walk(tree):  # lazy imports inside functions count
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.append(node.module or "")
    return [n for n in names if n == "flwr" or n.startswith("flwr.")]


def test_no_core_module_imports_flwr():
    """The core knows nothing about Flower: only clients/, strategies/ and the application (which holds the
    ``flwr run`` launcher, ``flower_dp.experiments.flower_run``) import ``flwr``."""
    bad = {name: _imports_flwr(path) for name, path in _modules().items() if layer(name) == "core"}
    assert not {k: v for k, v in bad.items() if v}
