"""A sweep rewrites its report after every run, so a report must render from any prefix of its records: here the
first record alone of every committed reproduction (e.g. only the non-private twin), which has crashed before on an
empty eps grid (an IndexError in the claims, a zero-column figure)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flower_dp.reproduce import rerender

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"
FOLDERS = sorted(p.parent.name for p in RESULTS.glob("*/records.json"))


@pytest.mark.parametrize("folder", FOLDERS)
def test_a_report_renders_from_its_first_record_alone(tmp_path, folder):
    doc = json.loads((RESULTS / folder / "records.json").read_text())
    doc["records"] = doc["records"][:1]
    (tmp_path / "records.json").write_text(json.dumps(doc))
    rerender(tmp_path, log=lambda m: None)
    text = (tmp_path / "report.md").read_text()
    assert "## Claims" in text and (tmp_path / "records.csv").is_file()
