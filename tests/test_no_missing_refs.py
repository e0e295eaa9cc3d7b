"""What the repository's code and docs point a reader to is in the repository.

Every ``*.md`` file named in a ``.py`` or ``.md`` file (a bare name such as ``privacy.md`` or a relative path such
as ``docs/privacy.md``) exists here, and nothing cites the internal notes the project was planned from (they do
not ship).  The README's python blocks and the examples import only from the public modules ``flower_dp``,
``flower_dp.clients`` and ``flower_dp.strategies``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP = {".venv", ".git", "runs", "node_modules", "__pycache__", "build", "dist"}
#: names of planning notes that are not part of the repository
_NOTES = "|".join(rf"{n}\.md" for n in ("DESIGN", "COMMON", "STYLE"))
NOT_SHIPPED = re.compile(r"\b(" + _NOTES + "|shared" + r"/specs)\b")
#: a section of those notes (a section number after the word, or "the ...'s defaults"): the reader cannot look it up
_SPEC = "[Ss]" + "pec"
SPEC_SECTION = re.compile(rf"\b{_SPEC}('s)? §?\d|\bthe {_SPEC}'s\b|\s\({_SPEC}\)")
#: a ``.md`` file name or relative path, not part of a URL (``://`` before it) and not a longer word
MD_REF = re.compile(r"(?<![\w./:-])((?:\.{1,2}/)?(?:[\w.-]+/)*[\w.-]+\.md)\b")
URL = re.compile(r"[a-z][a-z0-9+.-]*://\S+", re.IGNORECASE)


def _files(*suffixes: str) -> list[Path]:
    return sorted(p for p in ROOT.rglob("*") if p.suffix in suffixes and p.is_file()
                  and not SKIP.intersection(p.relative_to(ROOT).parts))


def _md_names() -> tuple[set[str], set[str]]:
    """(relative paths, bare names) of every ``.md`` file in the repository."""
    paths = {p.relative_to(ROOT).as_posix() for p in _files(".md")}
    return paths, {Path(p).name for p in paths}


def _written_at_run_time() -> set[str]:
    """Names of ``.md`` files the library writes into an output folder (``out / "report.md"``)."""
    return {m.group(1) for p in (ROOT / "flower_dp").rglob("*.py")
            for m in re.finditer(r'/\s*"([\w.-]+\.md)"', p.read_text(encoding="utf-8"))}


def _exists(ref: str, source: Path, paths: set[str], names: set[str], written: set[str]) -> bool:
    if "/" not in ref:
        return ref in names or ref in written
    first = ref.split("/")[0]
    if Path(ref).name in written and first not in {".", ".."} and not (ROOT / first).is_dir():
        return True  # a run's output folder (``out/README.md``, ``dp-csgp/report.md``), not a file of the repository
    for base in (source.parent, ROOT):  # relative to the citing file (links) or to the repository root
        try:
            rel = (base / ref).resolve().relative_to(ROOT).as_posix()
        except ValueError:
            continue
        if rel in paths:
            return True
    return False


def test_the_pattern_finds_names_and_paths_and_skips_urls():
    text = "see docs/privacy.md and (architecture.md), not https://x.org/a/README.md nor my_file.mdx"
    assert [m.group(1) for m in MD_REF.finditer(URL.sub(" ", text))] == ["docs/privacy.md", "architecture.md"]
    spec = "sp" + "ec"
    for cited in (f"({spec} 4.3)", f"{spec} §5.2", f"the {spec}'s defaults", f"Sp{spec[2:]} 10.1:",
                  f"defaults ({spec})"):
        assert SPEC_SECTION.search(cited), cited
    for fine in ("plan_spec(spec)", "bytes(spec)", f"this {spec}'s config_sha", "module_from_spec(spec)",
                 f"the relay {spec}'s device"):
        assert not SPEC_SECTION.search(fine), fine
    paths, names = _md_names()
    written = _written_at_run_time()
    md = ".md"  # spelled apart, so that this file names no missing file itself
    readme, example = ROOT / "README.md", ROOT / "examples" / "gau_lrq" / "README.md"
    assert not _exists("docs/nothing" + md, readme, paths, names, written)
    assert not _exists("docs/report" + md, readme, paths, names, written)  # docs/ is the repository's, not an output
    assert not _exists("nothing" + md, readme, paths, names, written)
    assert not _exists("../docs/privacy" + md, example, paths, names, written)  # relative to the citing file
    assert _exists("privacy.md", readme, paths, names, written)
    assert _exists("../../docs/privacy" + md, example, paths, names, written)
    assert _exists("out/README.md", ROOT / "flower_dp" / "reproduce" / "cli.py", paths, names, written)


def test_every_md_file_named_exists():
    paths, names = _md_names()
    written = _written_at_run_time()
    assert {"report.md", "table.md"} <= written, written
    missing = []
    for source in _files(".py", ".md"):
        for n, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
            for m in MD_REF.finditer(URL.sub(" ", line)):
                if not _exists(m.group(1), source, paths, names, written):
                    missing.append(f"{source.relative_to(ROOT)}:{n}: {m.group(1)}")
    assert not missing, "names of .md files that are not in the repository:\n" + "\n".join(missing)


def test_no_reference_to_the_planning_notes():
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()[:120]}"
             for p in _files(".py", ".md", ".toml", ".sh")
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if NOT_SHIPPED.search(line) or SPEC_SECTION.search(line)]
    assert not found, "cites files that do not ship (say what the reader needs instead):\n" + "\n".join(found)


PUBLIC = {"flower_dp", "flower_dp.clients", "flower_dp.strategies"}
#: example apps that reuse the reproduction's own training/evaluation code, so that the app and
#: ``flower-dp reproduce`` run the same code: (file, module) pairs, each named here on purpose
APPLICATION_REUSE = {
    ("examples/gau_lrq/gau_lrq_app/task.py", "flower_dp.experiments.gau_lrq"),
    ("examples/gau_lrq/gau_lrq_app/server_app.py", "flower_dp.experiments.gau_lrq"),
    ("examples/gau_lrq/run_table.py", "flower_dp.experiments.gau_lrq"),
    ("examples/push_sum/push_sum_example/server_app.py", "flower_dp.experiments"),
    ("examples/push_sum/push_sum_example/server_app.py", "flower_dp.experiments.cli_run"),
    ("examples/push_sum/push_sum_example/server_app.py", "flower_dp.data"),
    ("examples/push_sum/push_sum_example/server_app.py", "flower_dp.models"),
}


def _imported_modules(source: str) -> list[str]:
    mods = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            mods.append(node.module)
        elif isinstance(node, ast.Import):
            mods.extend(a.name for a in node.names)
    return [m for m in mods if m == "flower_dp" or m.startswith("flower_dp.")]


def _readme_python() -> list[str]:
    """The README's python blocks, and the added lines of its diff blocks (the code a Flower user pastes)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    out = [m.group(1) for m in re.finditer(r"```python\n(.*?)```", text, re.S)]
    for m in re.finditer(r"```diff\n(.*?)```", text, re.S):
        out.extend(line[1:].strip() for line in m.group(1).splitlines()
                   if line.startswith("+") and not line.startswith("+++")
                   and re.match(r"\s*(from|import)\s+flower_dp", line[1:]))
    return out


def test_readme_and_examples_import_only_the_public_modules():
    blocks = _readme_python()
    assert any("flower_dp" in b for b in blocks), "found no flower_dp import in the README's code"
    bad = [f"README.md: {m}" for b in blocks for m in _imported_modules(b) if m not in PUBLIC]
    examples = _files(".py")
    examples = [p for p in examples if p.relative_to(ROOT).parts[0] == "examples"]
    assert examples
    for p in examples:
        rel = p.relative_to(ROOT).as_posix()
        bad += [f"{rel}: {m}" for m in _imported_modules(p.read_text(encoding="utf-8"))
                if m not in PUBLIC and (rel, m) not in APPLICATION_REUSE]
    assert not bad, ("import these names from flower_dp, flower_dp.clients or flower_dp.strategies "
                     "(export them there if they are missing):\n" + "\n".join(bad))
