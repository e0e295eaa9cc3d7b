"""The run engine is the only place in the library that writes a results document, writes a checkpoint or decides a
run's status.

Like tests/test_layers.py for imports, this test reads the sources (``ast``) and imports nothing.  Outside
``flower_dp/engine.py`` (and the file layer it calls: ``flower_dp/recorder.py``, ``flower_dp/results.py``) no module
of ``flower_dp``, ``strategies`` or ``clients`` may:

* call ``save_checkpoint``, ``mark_clean_stop`` or a recorder's ``write`` (``recorder.write(...)``);
* call ``write_json``/``write_csv``/``atomic_write_bytes`` with ``results.json``, ``history.csv`` or
  ``checkpoint.pt`` in its arguments;
* decide a status: call ``completed_status``/``status_of_stop_reason``, or use ``FINISHED``, ``FAILED``,
  ``STOPPED``, ``STOPPED_BY_BUDGET`` other than in a comparison (reading a status is fine).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = {ROOT / "flower_dp" / "engine.py", ROOT / "flower_dp" / "recorder.py", ROOT / "flower_dp" / "results.py"}
STATUS_NAMES = {"FINISHED", "FAILED", "STOPPED", "STOPPED_BY_BUDGET"}
DECIDERS = {"completed_status", "status_of_stop_reason"}
RUN_FILES = ("results.json", "history.csv", "checkpoint.pt", "CHECKPOINT_NAME")


def _library_files() -> list[Path]:
    files = []
    for folder in ("flower_dp", "strategies", "clients"):
        files += sorted((ROOT / folder).rglob("*.py"))
    return [f for f in files if f not in ALLOWED]


def _callee(node: ast.Call) -> tuple[str, str]:
    """(name called, the source of what it is called on)."""
    f = node.func
    if isinstance(f, ast.Attribute):
        return f.attr, ast.unparse(f.value)
    if isinstance(f, ast.Name):
        return f.id, ""
    return "", ""


def violations(path: Path) -> list[str]:
    src = path.read_text()
    tree = ast.parse(src, filename=str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Call):
            name, on = _callee(node)
            if name in ("save_checkpoint", "mark_clean_stop") or (name == "write" and on.endswith("recorder")):
                found.append(f"{where}: {ast.unparse(node.func)}(...) writes the run's record")
            if name in ("write_json", "write_csv", "atomic_write_bytes") and any(
                    f in ast.unparse(a) for a in node.args for f in RUN_FILES):
                found.append(f"{where}: {name}(...) writes a run file")
            if name in DECIDERS:
                found.append(f"{where}: {name}(...) decides a status")
        elif isinstance(node, ast.Name) and node.id in STATUS_NAMES and isinstance(node.ctx, ast.Load):
            up = parents.get(node)
            while isinstance(up, (ast.Tuple, ast.List, ast.Set)):
                up = parents.get(up)
            if not isinstance(up, ast.Compare):
                found.append(f"{where}: {node.id} used outside a comparison (a status decided here)")
    return found


@pytest.mark.parametrize("path", _library_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_engine_records_a_run(path):
    assert not violations(path)


def test_the_check_catches_a_run_recorded_elsewhere(tmp_path):
    f = tmp_path / "bad.py"
    f.write_text("from flower_dp.recorder import FAILED\n"
                 "def run(self, rio, out):\n"
                 "    self.recorder.write({'status': FAILED})\n"
                 "    self.recorder.save_checkpoint({})\n"
                 "    rio.write_json(out / 'results.json', {})\n"
                 "    status = completed_status(3, 4)\n"
                 "    return status == FAILED\n")
    global ROOT
    old, ROOT = ROOT, tmp_path
    try:
        found = violations(f)
    finally:
        ROOT = old
    assert len(found) == 5, found
    assert not any(":7:" in v for v in found)  # the comparison reads a status, it decides none


def test_the_engine_itself_records_the_run():
    """The rule is not met by nobody recording: the engine does write the document, the checkpoint and the status."""
    src = (ROOT / "flower_dp" / "engine.py").read_text()
    for needle in ("recorder.write(", "save_checkpoint(", "mark_clean_stop(", "completed_status(", "FAILED"):
        assert needle in src, needle
