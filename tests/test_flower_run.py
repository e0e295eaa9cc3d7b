"""`flower_dp.experiments.flower_run`: the app it writes is one Flower itself accepts, run configuration values survive the trip,
bad references and values are refused at once, and a ServerApp's error comes back in the run's output."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from flower_dp.experiments.flower_run import run_app, write_app

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


@pytest.fixture
def made(monkeypatch) -> list[Path]:
    """The folders ``tempfile.mkdtemp`` makes during the test, in order."""
    import tempfile

    folders: list[Path] = []
    real_mkdtemp = tempfile.mkdtemp

    def mkdtemp(*a, **kw):
        folders.append(Path(real_mkdtemp(*a, **kw)))
        return str(folders[-1])

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    return folders


@pytest.mark.parametrize("way_out", [None, RuntimeError("flwr run failed"), TimeoutError("ran past timeout_s"),
                                     KeyboardInterrupt()])
def test_the_private_work_folder_with_the_own_data_is_removed_on_every_way_out(tmp_path, monkeypatch, way_out, made):
    """run_flower_experiment writes the caller's own tensors (sources.pkl) into a private folder: gone afterwards,
    whether flwr run finished, failed, timed out or was interrupted."""
    import torch

    import flower_dp.experiments.flower_backend as fb
    from flower_dp import sources
    from flower_dp.experiments import config_from_dict

    def fake_run_app(*a, work_dir, run_config, **kw):
        assert (Path(work_dir) / "sources.pkl").is_file() and oct(Path(work_dir).stat().st_mode)[-3:] == "700"
        if way_out is not None:
            raise way_out
        (Path(run_config["out-dir"]) / "results.json").write_text('{"status": "finished"}')
        return None

    key = sources.register(sources.PREFIX + "workdir-test", sources.OwnSource(
        lambda: torch.nn.Linear(2, 2), (torch.zeros(8, 2), torch.zeros(8, dtype=torch.long)),
        (torch.zeros(4, 2), torch.zeros(4, dtype=torch.long)), 2))
    monkeypatch.setattr(fb, "run_app", fake_run_app)
    cfg = config_from_dict({"run": {"name": "w"}, "data": {"dataset": key}, "model": {"name": key},
                            "topology": {"n_nodes": 2}})
    if way_out is None:
        assert fb.run_flower_experiment(cfg, out_dir=tmp_path / "out")["status"] == "finished"
    else:
        with pytest.raises(type(way_out)):
            fb.run_flower_experiment(cfg, out_dir=tmp_path / "out")
    assert len(made) == 1 and not made[0].exists()


@pytest.mark.parametrize("way_out", [None, RuntimeError("flwr run failed"), TimeoutError("ran past timeout_s"),
                                     KeyboardInterrupt()])
def test_the_gau_lrq_work_folder_with_the_secret_is_removed_on_every_way_out(tmp_path, monkeypatch, way_out, made):
    """Gau-LRQ's simulation writes the master secret and the caller's ClientApp into the same kind of private
    folder (flower_run.private_work_dir): gone afterwards however flwr run ends, a finished run's results read."""
    import flower_dp.experiments.flower_run as fr
    from flower_dp.experiments import gau_lrq

    def fake_run_app(*a, work_dir, run_config, **kw):
        assert Path(run_config["lrq-secret-file"]).read_bytes() == b"s" * 32
        assert oct(Path(work_dir).stat().st_mode)[-3:] == "700"
        if way_out is not None:
            raise way_out
        Path(run_config["results-file"]).write_text('{"finished": true, "results": {"stop_reason": "completed"}}')
        return None

    monkeypatch.setattr(fr, "run_app", fake_run_app)
    kw = dict(inputs={}, num_rounds=1, secret=b"s" * 32, client_app=None, num_cpus=1, round_timeout_s=5.0)
    strategy = {"secret_file": None, "num_clients": 2, "key_dir": str(tmp_path / "keys")}
    if way_out is None:
        assert gau_lrq._simulate(strategy, **kw) == {"stop_reason": "completed"}
    else:
        with pytest.raises(type(way_out)):
            gau_lrq._simulate(strategy, **kw)
    assert len(made) == 1 and not made[0].exists()


def test_flwr_run_output_is_streamed_as_it_comes_and_a_run_past_its_timeout_is_stopped():
    """The launcher hands each output line to its caller while the command still runs (progress on a long run),
    and stops a command that runs past its timeout (its whole process group), returning what it printed."""
    import sys
    import time

    from flower_dp.experiments.flower_run import _streamed

    seen: list[tuple[float, str]] = []
    t0 = time.monotonic()
    code = ("import sys, time\nprint('first', flush=True)\ntime.sleep(1.5)\nprint('second', file=sys.stderr, "
            "flush=True)\n")
    rc, text = _streamed([sys.executable, "-c", code], {}, 60, lambda line: seen.append((time.monotonic() - t0, line)))
    assert rc == 0 and [line for _, line in seen] == ["first", "second"] and "first" in text and "second" in text
    assert seen[1][0] - seen[0][0] > 1.0  # the first line came before the command ended
    rc, text = _streamed([sys.executable, "-c", "import time\nprint('begun', flush=True)\ntime.sleep(60)"], {}, 2, None)
    assert rc is None and "begun" in text


@pytest.mark.flower
def test_the_runs_own_ray_head_refuses_clients_without_its_token(tmp_path):
    """The Ray head flwr_run starts for a run (Ray's token authentication, the token in the caller's private
    folder): a process of another user, which lacks the token, cannot join it; one given the token can."""
    import os
    import subprocess
    import sys

    from flower_dp.experiments.flower_run import ray_head, ray_token_env

    folder = tmp_path / "work"
    folder.mkdir(mode=0o700)
    auth = ray_token_env(folder)
    assert oct(Path(auth["RAY_AUTH_TOKEN_PATH"]).stat().st_mode)[-3:] == "600"
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH") and k != "RAY_ADDRESS"}

    def join(address: str, env: dict[str, str]) -> subprocess.CompletedProcess:
        code = f"import ray; ray.init(address={address!r}, log_to_driver=False); print('JOINED')"
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)

    with ray_head({**base, **auth}, num_cpus=1) as address:
        outsider = join(address, base)
        assert "JOINED" not in outsider.stdout
        assert "AuthenticationError" in outsider.stderr or "token" in outsider.stderr.lower(), outsider.stderr[-2000:]
        assert "JOINED" in join(address, {**base, **auth}).stdout
