"""``flower-dp accountant`` through flower_dp.cli.main."""

from __future__ import annotations

import re

import pytest

from flower_dp.cli import main
from flower_dp.privacy import GaussianStep, rigorous_epsilon


def test_accountant_prints_eps(capsys):
    rc = main(["accountant", "--sigma", "1", "--q", "0.01", "--steps", "1000", "--delta", "1e-5", "--accountant", "both"])
    out = capsys.readouterr().out
    assert rc == 0
    assert re.search(r"rdp: eps = 2\.101", out)  # issue test value 2.1014
    assert re.search(r"pld: eps = 1\.8[23]", out)  # about 1.828


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
    assert "exactly one of --sigma" in capsys.readouterr().err
    assert main(["accountant", "--sigma", "1", "--q", "2", "--steps", "10", "--delta", "1e-5"]) == 2
    assert "q must be in (0, 1], got 2.0" in capsys.readouterr().err
