"""The README and the pages under ``docs/`` as a reader meets them: every code block they show is run, parsed or
compared with the file it copies, every relative link and anchor resolves, and the README stays a front page.

Kinds of block and who checks them:

* ``diff``: the README's two swaps, FedAvg -> GauLRQ and the push-sum drop-in; ``test_readme_gau_lrq_diff.py``
  and ``test_push_sum_readme_diff.py`` apply them to an app in Flower's template layout and run ``flwr run``.
* ``python``: the README's own-model example, a copy of ``docs/snippets/own_model.py``, which its own test runs.
* ``toml``: a copy of the file named in the ``<!-- file: PATH -->`` line above it; ``load_config`` validates it.
* ``bash``: ``$ flower-dp accountant ...`` lines run here and must print exactly the lines shown after them
  (``...`` stands for an elided part of a line); every other ``flower-dp`` line is parsed by the CLI's own parser;
  ``bash scripts/X.sh`` names a script that exists.
* no language: a text figure (architecture.md's layer diagram).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README] + [ROOT / "docs" / f"{name}.md" for name in
                    ("flower", "privacy", "runs", "reproductions", "performance", "architecture")]
OWN_MODEL = ROOT / "docs" / "snippets" / "own_model.py"
OWN_MODEL_MARKER = "<!-- own-model example: docs/snippets/own_model.py -->"
DIFF_MARKERS = {  # the marker before each README diff -> the test that reads the diff after it
    "**FedAvg -> GauLRQ**": "test_readme_gau_lrq_diff.py",
    "**My own Flower app -> private push-sum**": "test_push_sum_readme_diff.py",
}
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)


def blocks(path: Path) -> list[tuple[str, str, str, int]]:
    """``(language, body, the text before the block, line number)`` of every fenced block of ``path``."""
    text = path.read_text()
    return [(m.group(1), m.group(2), text[:m.start()], text.count("\n", 0, m.start()) + 1)
            for m in FENCE.finditer(text)]


def commands(body: str) -> list[tuple[str, list[str]]]:
    """``(command, shown output lines)`` of a bash block: ``$ `` lines are commands followed by their output; in a
    block without ``$`` every line is a command.  Comments, ``nohup`` and a trailing ``&`` are dropped and
    backslash continuations joined."""
    prompt = any(line.startswith("$ ") for line in body.splitlines())
    out: list[tuple[str, list[str]]] = []
    cont = False
    for line in body.splitlines():
        if cont:
            out[-1] = (out[-1][0] + " " + line.strip(), out[-1][1])
        elif not line.strip() or line.lstrip().startswith("#"):
            continue
        elif prompt and not line.startswith("$ "):
            out[-1][1].append(line)
        else:
            out.append((line.removeprefix("$ "), []))
        cont = line.rstrip().endswith("\\")
    cleaned = []
    for cmd, shown in out:
        cmd = cmd.replace("\\", " ")
        cmd = re.sub(r"\s#.*$", "", cmd).strip()
        cmd = re.sub(r"^nohup\s+", "", cmd)
        cmd = re.sub(r"\s*&$", "", cmd)
        cleaned.append((" ".join(cmd.split()), shown))
    return cleaned


def all_blocks():
    return [(path, *b) for path in PAGES for b in blocks(path)]


def test_the_readme_is_a_front_page():
    """Under 250 lines, the two set-up commands in its first 40, and CI runs exactly set-up command 2."""
    lines = README.read_text().splitlines()
    assert len(lines) < 250, f"README.md has {len(lines)} lines; move detail to a page under docs/"
    head = "\n".join(lines[:40])
    assert "\nbash scripts/quickstart.sh\n" in head and "\nbash scripts/test.sh\n" in head
    ci = (ROOT / ".ci" / "run").read_text()
    assert "exec bash scripts/test.sh" in ci
    assert "flower-dp quickstart" in (ROOT / "scripts" / "quickstart.sh").read_text()
    assert OWN_MODEL_MARKER in README.read_text()


def test_every_block_is_of_a_kind_that_a_test_checks():
    """Each block's language is one this module (or the test it names) checks, and each is where it is allowed."""
    for path, lang, body, before, line in all_blocks():
        where = f"{path.relative_to(ROOT)}:{line}"
        if lang == "diff":
            assert path == README, f"{where}: a diff outside the README is read by no test"
            marker = max(DIFF_MARKERS, key=lambda m: before.rfind(m))
            assert before.rfind(marker) >= 0, f"{where}: a diff after none of the markers {list(DIFF_MARKERS)}"
            assert marker in (ROOT / "tests" / DIFF_MARKERS[marker]).read_text(), where
            # the test reads the first diff after its marker: this one
            assert "```diff" not in before[before.rfind(marker):], f"{where}: a second diff after {marker!r}"
        elif lang == "python":
            section = before[before.rfind("\n## "):]
            assert path == README and OWN_MODEL_MARKER in section, \
                f"{where}: a Python block that no test runs; show a tested example file or the own-model snippet"
            assert body.strip() == OWN_MODEL.read_text().strip(), \
                f"{where}: the own-model example differs from {OWN_MODEL.relative_to(ROOT)}"
        elif lang == "toml":
            m = re.search(r"<!-- file: (\S+) -->\s*$", before)
            assert m, f"{where}: a TOML block without a '<!-- file: PATH -->' line above it"
            assert body == (ROOT / m.group(1)).read_text(), f"{where}: differs from {m.group(1)}"
        elif lang == "bash":
            assert commands(body), f"{where}: an empty bash block"
        else:
            assert lang == "" and path.name == "architecture.md", f"{where}: a {lang or 'plain'} block no test checks"


def test_every_command_shown_parses():
    """Every ``flower-dp`` line parses with the CLI's own parser; every ``bash scripts/...`` script exists."""
    from flower_dp.cli import build_parser

    parser = build_parser()
    seen = 0
    for path, lang, body, _, line in all_blocks():
        if lang != "bash":
            continue
        for cmd, _ in commands(body):
            argv = shlex.split(cmd)
            if argv[0] == "flower-dp":
                try:
                    args = parser.parse_args(argv[1:])
                except SystemExit:
                    pytest.fail(f"{path.relative_to(ROOT)}:{line}: `{cmd}` does not parse")
                assert getattr(args, "func", None), f"`{cmd}` names no sub-command"
                seen += 1
            elif argv[0] == "bash":
                assert (ROOT / argv[1]).is_file(), f"{path.relative_to(ROOT)}:{line}: {argv[1]} does not exist"
            else:
                pytest.fail(f"{path.relative_to(ROOT)}:{line}: `{cmd}`: no test runs this kind of command")
    assert seen >= 10


def _accountant_examples():
    return [(path, line, cmd, shown) for path, lang, body, _, line in all_blocks() if lang == "bash"
            for cmd, shown in commands(body) if cmd.startswith("flower-dp accountant")]


@pytest.mark.parametrize("path, line, cmd, shown", _accountant_examples(),
                         ids=lambda v: v if isinstance(v, str) and v.startswith("flower-dp") else "")
def test_accountant_examples_print_what_the_docs_show(path, line, cmd, shown, capsys):
    """Each ``flower-dp accountant`` example runs; where the page shows its output, it prints exactly those
    lines (``...`` elides part of a line)."""
    from flower_dp.cli import main

    assert main(shlex.split(cmd)[1:]) == 0, f"{path.name}:{line}: `{cmd}` failed"
    printed = capsys.readouterr().out.splitlines()
    if not shown:
        return
    assert len(printed) == len(shown), f"{path.name}:{line}: `{cmd}` printed {printed}, the page shows {shown}"
    for want, got in zip(shown, printed):
        pattern = ".*".join(re.escape(part.strip()) for part in want.split("..."))
        assert re.fullmatch(pattern, got), f"{path.name}:{line}: printed {got!r}, the page shows {want!r}"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation other than '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_and_anchors_resolve():
    """Every relative link of the pages (and of the example apps' READMEs) names an existing file, and every
    ``#anchor`` a heading of its page."""
    for path in PAGES + sorted(ROOT.glob("examples/*/README.md")):
        text = FENCE.sub("", path.read_text())
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            assert dest.exists(), f"{path.relative_to(ROOT)}: link {target!r}: {dest} does not exist"
            if anchor:
                slugs = {_slug(h) for h in re.findall(r"^#+ (.*)$", FENCE.sub("", dest.read_text()), re.M)}
                assert anchor in slugs, f"{path.relative_to(ROOT)}: link {target!r}: no heading {anchor!r}"


def test_the_reproduction_tables_named_exist():
    """Every ``--table`` name in reproductions.md's table of tables is one ``flower-dp reproduce`` accepts."""
    from flower_dp.reproduce import get_paper

    text = (ROOT / "docs" / "reproductions.md").read_text()
    rows = re.findall(r"^\| (Dyn-D2P|PrivSGP-VR|DP-CSGP|PartPSP|Gau-LRQ) \| (.*) \| (.*) \|$", text, re.M)
    assert {r[0] for r in rows} == {"Dyn-D2P", "PrivSGP-VR", "DP-CSGP", "PartPSP", "Gau-LRQ"}
    for paper, cpu, cifar in rows:
        tables = get_paper(paper.lower()).tables
        named = set(re.findall(r"`([\w-]+)`", cpu + cifar))
        assert named <= set(tables), f"{paper}: {sorted(named - set(tables))} are not tables of {list(tables)}"


def test_the_config_keys_shown_are_the_config_keys():
    """runs.md's ``[run]`` and ``[data]`` rows list exactly the keys the config loader accepts."""
    from flower_dp.experiments.config import SECTIONS

    text = (ROOT / "docs" / "runs.md").read_text()
    for section in ("run", "data"):
        row = re.search(rf"^\| `\[{section}\]` \| (.*?) \|", text, re.M)
        assert row, f"runs.md has no [{section}] row"
        assert set(re.findall(r"`(\w+)`", row.group(1))) == set(SECTIONS[section]), section


def test_the_quickstart_config_shown_loads():
    """The TOML block that runs.md copies from the quickstart config is a valid config."""
    from flower_dp.experiments import load_config

    cfg = load_config(ROOT / "flower_dp" / "experiments" / "configs" / "quickstart.toml")
    assert cfg.algorithm["name"] == "dyn_d2p" and cfg.n_nodes == 8


def _trace_module():
    """``scripts/trace_config_value.py``, imported from its path."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("trace_config_value", ROOT / "scripts" / "trace_config_value.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("key, climbs_only", [("algorithm.params.lr", False), ("algorithm.params.epsilon", True)])
def test_the_config_walk_in_architecture_md_is_todays(key, climbs_only, tmp_path):
    """The walk of a config value from ``flower-dp run`` to the nodes that architecture.md shows is what
    ``scripts/trace_config_value.py`` traces today (line numbers aside), and each climbs a layer at most twice."""
    trace = _trace_module()
    steps = trace.trace(trace.DEFAULT_CONFIG, key, tmp_path / "run")
    got = trace.report(steps)
    if climbs_only:
        got = got[got.index("climbs:"):]
    text = (ROOT / "docs" / "architecture.md").read_text()
    m = re.search(rf"<!-- trace: scripts/trace_config_value.py {re.escape(key)}[^>]*-->\n```\n(.*?)```", text, re.S)
    assert m, f"architecture.md shows no trace of {key}"
    strip = lambda s: re.sub(r":\d+", "", s).strip()  # noqa: E731
    assert strip(m.group(1)) == strip(got), f"re-run `python scripts/trace_config_value.py {key}`; today:\n{got}"
    assert sum(s.climb for s in steps) <= 2


def test_the_readme_run_lines_are_the_ones_the_diff_tests_run():
    """The ``flwr run`` line after each README diff uses the SuperNode count (and, for GauLRQ, the run config)
    with which its test runs the diffed app."""
    readme = " ".join(README.read_text().split())
    gau = (ROOT / "tests" / "test_readme_gau_lrq_diff.py").read_text()
    n = re.search(r"^NUM_SUPERNODES = (\d+)", gau, re.M).group(1)
    run_config = re.search(r'^RUN_CONFIG = "([^"]+)"', gau, re.M).group(1)
    assert f'flwr run . --stream --federation-config "num-supernodes={n}" --run-config "{run_config}"' in readme
    push_sum = (ROOT / "tests" / "test_push_sum_readme_diff.py").read_text()
    n = re.search(r"^N = (\d+)", push_sum, re.M).group(1)
    assert f'flwr run . --stream --federation-config "num-supernodes={n}"' in readme
