"""`flower_dp.flower_run`: the app it writes is one Flower itself accepts, run configuration values survive the trip,
bad references and values are refused at once, and a ServerApp's error comes back in the run's output."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from flower_dp.flower_run import run_app, write_app

#: a ServerApp that fails at once with a recognisable message (run by test_a_server_error_comes_back_in_the_output)
FAILING = ServerApp()


@FAILING.main()
def _fail(grid: Grid, context: Context) -> None:
    raise ValueError(f"failing on purpose: {context.run_config['marker']}")


def test_written_app_is_one_flower_validates_and_keeps_the_run_config(tmp_path):
    from flwr.cli.config_utils import load_and_validate

    values = {"text": 'a "quoted" C:\\path\nnext line é', "count": 3, "rate": 0.25, "flag": True, "off": False,
              "tiny": 1e-300}
    app = write_app(tmp_path / "app", "flower_dp.experiments.flower_backend:server_app",
                    "flower_dp.experiments.flower_backend:client_app", values)
    config = tomllib.loads((app / "pyproject.toml").read_text())
    assert config["tool"]["flwr"]["app"]["config"] == values
    assert config["tool"]["flwr"]["app"]["components"] == {"serverapp": "flower_dp_run_app:server_app",
                                                           "clientapp": "flower_dp_run_app:client_app"}
    _, warnings = load_and_validate(app / "pyproject.toml")  # what `flwr run` checks first, modules included
    assert warnings == []
    namespace: dict = {}
    exec((app / "flower_dp_run_app.py").read_text(), namespace)
    from flower_dp.experiments import flower_backend

    assert namespace["server_app"] is flower_backend.server_app and namespace["client_app"] is flower_backend.client_app


@pytest.mark.parametrize("ref", ["flower_dp.experiments.flower_backend", ":server_app", "mod:not-an-identifier"])
def test_a_bad_app_reference_is_refused_naming_the_form(tmp_path, ref):
    with pytest.raises(ValueError, match=r"server_app = .*'package\.module:attribute'"):
        write_app(tmp_path, ref, "a.b:c")


def test_a_run_config_value_flower_cannot_hold_is_refused(tmp_path):
    with pytest.raises(TypeError, match=r"run config 'shape' = \[1, 2\].*bool, int, float or str"):
        write_app(tmp_path, "a.b:c", "a.b:d", {"shape": [1, 2]})
    with pytest.raises(ValueError, match="num_supernodes = 0"):
        run_app("a.b:c", "a.b:d", num_supernodes=0, work_dir=tmp_path)


@pytest.mark.flower
def test_a_server_error_comes_back_in_the_output(tmp_path):
    run = run_app("test_flower_run:FAILING", "flower_dp.experiments.flower_backend:client_app", num_supernodes=1,
                  work_dir=tmp_path, run_config={"marker": "xyzzy-42"}, pythonpath=[Path(__file__).parent],
                  timeout_s=300)
    assert "failing on purpose: xyzzy-42" in run.text, run.tail()
    assert run.status == "finished:failed" and not run.completed, run.tail()
    assert "failing on purpose: xyzzy-42" in run.status_details and run.tail().startswith("flwr run status: finished:failed")
    print(f"flwr run of a failing ServerApp: {run.wall_s:.1f} s")
