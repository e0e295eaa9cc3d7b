"""``flower-dp accountant`` through flower_dp.cli.main."""

from __future__ import annotations

import re

import pytest

from flower_dp.cli import main
from flower_dp.privacy import GaussianStep, rigorous_epsilon


def test_accountant_prints_eps(capsys):
    rc = main(["accountant", "--noise-multiplier", "1", "--q", "0.01", "--steps", "1000", "--delta", "1e-5", "--accountant", "both"])
    out = capsys.readouterr().out
    assert rc == 0
    assert re.search(r"rdp: eps = 2\.101", out)  # issue test value 2.1014
    assert re.search(r"pld: eps = 1\.8[23]", out)  # about 1.828


def test_the_readme_shows_the_accountant_output_as_it_is(capsys):
    """The README's first ``flower-dp accountant`` example prints exactly the lines the README shows."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert "$ flower-dp accountant --noise-multiplier 1 --q 0.01 --steps 1000 --delta 1e-5\n" in readme
    assert main(["accountant", "--noise-multiplier", "1", "--q", "0.01", "--steps", "1000", "--delta", "1e-5"]) == 0
    for line in capsys.readouterr().out.splitlines():
        assert line in readme.splitlines(), line


def test_accountant_calibrates_noise(capsys):
    rc = main(["accountant", "--epsilon", "2.1014", "--q", "0.01", "--steps", "1000", "--delta", "1e-5",
               "--accountant", "rdp"])
    out = capsys.readouterr().out
    assert rc == 0
    nu = float(re.search(r"noise multiplier = ([0-9.]+)", out).group(1))
    assert nu == pytest.approx(1.0, abs=2e-3)
    assert rigorous_epsilon([GaussianStep(0.01, nu, 1000)], 1e-5, accountant="rdp") <= 2.1014 + 1e-3


def test_accountant_errors_name_the_problem(capsys):
    assert main(["accountant", "--q", "0.01", "--steps", "10", "--delta", "1e-5"]) == 2
    assert "exactly one of --noise-multiplier" in capsys.readouterr().err
    assert main(["accountant", "--noise-multiplier", "1", "--q", "2", "--steps", "10", "--delta", "1e-5"]) == 2
    assert "q must be in (0, 1], got 2.0" in capsys.readouterr().err


def test_accountant_fixed_size_sampling_gau_lrq_mnist(capsys):
    """The paper's Gau-LRQ MNIST setting, B = 80 of N = 1920 clients, replace-one: one line per bound, each naming
    it; the reported (smaller) one is in [51.2, 53.0], the PLD of the symmetrised dominating pair (51.23)."""
    rc = main(["accountant", "--noise-multiplier", "0.51624", "--batch", "80", "--population", "1920", "--steps", "30",
               "--delta", "1e-5", "--sampling", "fixed_size", "--adjacency", "replace_one"])
    out = capsys.readouterr().out
    assert rc == 0
    vals = {k: float(v) for k, v in re.findall(r"^(pld|rdp|reported)[^:]*: eps = ([0-9.]+)", out, re.M)}
    assert set(vals) == {"pld", "rdp", "reported"}
    assert 51.2 <= vals["reported"] <= 53.0 and vals["reported"] == min(vals["pld"], vals["rdp"])
    assert "80 of 1920 without replacement" in out
    reported = [line for line in out.splitlines() if line.startswith("reported")][0]
    assert "bound: pld_symmetrised_pair, PLD of the symmetrised dominating pair" in reported
    assert "bound: rdp_without_replacement" in out


def test_accountant_fixed_size_needs_replace_one(capsys):
    assert main(["accountant", "--noise-multiplier", "1", "--batch", "8", "--population", "100", "--steps", "10",
                 "--delta", "1e-5", "--sampling", "fixed_size"]) == 2
    assert "--adjacency replace_one" in capsys.readouterr().err
