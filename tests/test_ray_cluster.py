"""Runs on a Ray cluster started as a user starts one: ``ray start --head`` and a second ``ray start --address``.

One module-scoped cluster (two raylets on 127.0.0.1, one CPU each, no dashboard, their own ports and a private
temporary folder; every process of each raylet in a process group of its own, killed at the end, also on failure)
serves every test here:

* ``flower-dp run quickstart --backend ray --ray-address HEAD:PORT --reproducible`` puts its host actors on both Ray
  nodes and writes the history of ``--backend inprocess`` bit for bit;
* ``train_private(backend="ray", ray_address=...)`` and ``flower-dp reproduce ... --backend ray --ray-address``
  give the in-process numbers too;
* asking for more CPUs or GPUs than the cluster has, or an address nobody listens on, fails in seconds naming the
  fix, and the cluster stays up (a joined cluster is never stopped);
* last, a worker raylet killed mid-run: the segment fails naming the lost host and its Ray node, the checkpoint
  stays, and ``--resume`` finishes on the node that remains with the numbers of an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from flower_dp.experiments.flower_run import free_port, kill_group

pytestmark = pytest.mark.flower

RAY = str(Path(sys.executable).parent / "ray")


#: ``ray start`` for a second raylet on this machine's loopback.  Ray keeps a node on 127.0.0.1 only in its
#: macOS/Windows mode (flower_dp._ray_local), where ``ray start --address`` refuses to add a node; this lifts that
#: one refusal and keeps the given --node-ip-address, nothing else (on separate machines a plain ``ray start
#: --address=HEAD:PORT`` is what a user runs)
_LOOPBACK_WORKER = """
import sys
import ray._private.ray_constants as constants
import ray._private.services as services
constants.ENABLE_RAY_CLUSTER = True
services.resolve_ip_for_localhost = lambda host: host
from ray.scripts.scripts import main
sys.argv = ["ray", *sys.argv[1:]]
main()
"""


def _raylet(args: list[str], env: dict[str, str], *, head: bool, log: Path) -> subprocess.Popen:
    ports = [f"--node-manager-port={free_port()}", f"--object-manager-port={free_port()}",
             f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
             f"--runtime-env-agent-port={free_port()}", f"--metrics-export-port={free_port()}"]
    cmd = [RAY] if head else [sys.executable, "-c", _LOOPBACK_WORKER]
    return subprocess.Popen([*cmd, "start", "--block", "--node-ip-address=127.0.0.1", "--num-cpus=1",
                             "--disable-usage-stats", *ports, *args],
                            env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def _alive_nodes(address: str, env: dict[str, str]) -> int:
    code = (f"import ray; ray.init(address={address!r}, log_to_driver=False); "
            "print('ALIVE', sum(1 for n in ray.nodes() if n['Alive']))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("ALIVE ")]
    return int(lines[0].split()[1]) if lines else 0


@pytest.fixture(scope="module")
def cluster():
    """``{"address", "head", "worker"}`` of a two-raylet cluster started with ``ray start``; stopped at the end."""
    temp = tempfile.mkdtemp(prefix="rc", dir="/tmp")  # 0700; short: Ray's socket paths are length-limited
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
               PYTHONPATH=os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")]))
    port = free_port()
    address = f"127.0.0.1:{port}"
    procs: list[subprocess.Popen] = []
    try:
        procs.append(_raylet(["--head", f"--port={port}", f"--ray-client-server-port={free_port()}",
                              "--include-dashboard=false", f"--temp-dir={temp}"], env, head=True,
                             log=Path(temp) / "head.log"))
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # the GCS port answers once the head is up
            try:
                import socket

                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                time.sleep(0.5)
        for attempt in range(3):  # on a loaded machine a raylet may time out registering (Ray gives it 45 s)
            worker = _raylet([f"--address={address}"], env, head=False, log=Path(temp) / f"worker{attempt}.log")
            procs.append(worker)
            deadline = time.monotonic() + 300
            while worker.poll() is None and time.monotonic() < deadline and _alive_nodes(address, env) < 2:
                time.sleep(1)
            if worker.poll() is None and _alive_nodes(address, env) == 2:
                break
            kill_group(worker)
        else:
            raise AssertionError("the second raylet did not join in 3 attempts; its output:\n"
                                 + (Path(temp) / "worker2.log").read_text()[-3000:])
            time.sleep(1)
        yield {"address": address, "head": procs[0], "worker": procs[-1], "env": env}
    finally:
        for proc in reversed(procs):
            kill_group(proc)
        shutil.rmtree(temp, ignore_errors=True)


def _cli(*args: str) -> None:
    from flower_dp.cli import main

    assert main(list(args)) == 0


def _doc(folder: Path) -> dict:
    return json.loads((folder / "results.json").read_text())


def test_cli_run_on_the_cluster_spreads_hosts_and_equals_inprocess(cluster, tmp_path):
    common = ["--set", "run.num_iters=20", "--set", "run.eval_every=10", "--set", "data.test_samples=500",
              "--reproducible"]
    t = time.perf_counter()
    _cli("run", "quickstart", "--backend", "ray", "--ray-address", cluster["address"], "--out", str(tmp_path / "r"),
         *common)
    ray_s = time.perf_counter() - t
    _cli("run", "quickstart", "--backend", "inprocess", "--out", str(tmp_path / "i"), *common)
    ray_doc, ref = _doc(tmp_path / "r"), _doc(tmp_path / "i")
    assert ray_doc["status"] == "finished" and ray_doc["backend"] == "ray" and ref["backend"] == "inprocess"
    hosts = ray_doc["ray"]["hosts"]
    assert len({h["ray_node_id"] for h in hosts}) == 2, hosts  # one host per raylet (one CPU each)
    assert sorted(i for h in hosts for i in h["nodes"]) == list(range(8))
    assert ray_doc["ray"]["address"] == cluster["address"] and ray_doc["ray"]["own_instance"] is False
    assert ray_doc["history"] == ref["history"]  # bit for bit: every metric, the accuracy, the bits
    assert ray_doc["privacy"]["per_node"] == ref["privacy"]["per_node"]
    assert ray_s < 600
    assert _alive_nodes(cluster["address"], cluster["env"]) == 2  # joined, never stopped


def _model():
    import torch

    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(20, 3))


def test_train_private_on_the_cluster_equals_inprocess(cluster, tmp_path):
    import torch

    from flower_dp import train_private

    g = torch.Generator().manual_seed(0)
    x = torch.randn(400, 20, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    kw = {"n_nodes": 4, "num_iters": 6, "eval_every": 3, "target_epsilon": 3.0, "batch_size": 16, "seed": 3,
          "reproducible": True}
    ray_run = train_private(_model, (x[:320], y[:320]), (x[320:], y[320:]), backend="ray",
                            ray_address=cluster["address"], out_dir=tmp_path / "r", **kw)
    ref = train_private(_model, (x[:320], y[:320]), (x[320:], y[320:]), **kw)
    assert ray_run.backend == "ray" and ray_run.status == "finished"
    assert ray_run.history == ref.history
    assert ray_run.privacy_spent() == ref.privacy_spent()
    assert len({h["ray_node_id"] for h in _doc(tmp_path / "r")["ray"]["hosts"]}) == 2


def test_the_flower_route_joins_the_cluster_instead_of_starting_a_head(cluster, tmp_path):
    """train_private(backend="flower", ray_address=...): the Flower simulation runs on the given cluster (no head
    of its own) and ends with the in-process numbers; the cluster stays up."""
    import torch

    from flower_dp import train_private

    g = torch.Generator().manual_seed(1)
    x = torch.randn(300, 20, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    kw = {"n_nodes": 2, "num_iters": 4, "eval_every": 2, "target_epsilon": 3.0, "batch_size": 16, "seed": 3,
          "reproducible": True}
    run = train_private(_model, (x[:240], y[:240]), (x[240:], y[240:]), backend="flower", num_hosts=2,
                        ray_address=cluster["address"], out_dir=tmp_path / "f", **kw)
    ref = train_private(_model, (x[:240], y[:240]), (x[240:], y[240:]), **kw)
    assert run.status == "finished" and run.backend == "flower"
    assert [r["acc_avg"] for r in run.history] == [r["acc_avg"] for r in ref.history]
    assert [r["test_loss_avg"] for r in run.history] == [r["test_loss_avg"] for r in ref.history]
    assert _alive_nodes(cluster["address"], cluster["env"]) == 2


def test_reproduce_on_the_cluster_equals_inprocess(cluster, tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    run = ["reproduce", "dp-csgp", "--scale", "smoke", "--seeds", "1", "--reproducible", "--no-estimate",
           "--runs", "DP2-SGD-eps0.5-s0"]
    _cli(*run, "--backend", "ray", "--ray-address", cluster["address"], "--out", str(tmp_path / "r"))
    assert "RAY_ADDRESS" not in os.environ  # the sweep's address does not outlive it in this process
    _cli(*run, "--out", str(tmp_path / "i"))
    ray_runs = sorted((tmp_path / "r" / "runs").iterdir())
    assert ray_runs
    for folder in ray_runs:
        doc, ref = _doc(folder), _doc(tmp_path / "i" / "runs" / folder.name)
        assert doc["backend"] == "ray" and doc["history"] == ref["history"], folder.name


def _cfg(**run):
    from flower_dp.experiments import config_from_dict

    return config_from_dict({
        "run": {"name": "t", "seed": 1, "num_iters": 6, "eval_every": 3, "progress": False, "reproducible": True,
                "backend": "ray", **run},
        "data": {"dataset": "synthetic_fashion_mnist", "samples_per_node": 64, "test_samples": 200},
        "model": {"name": "logreg"},
        "topology": {"name": "exp_one_peer", "n_nodes": 4},
        "algorithm": {"name": "dyn_d2p", "params": {"variant": "dyn", "epsilon": 4.0, "delta": 1e-4,
                                                    "batch_size": 8, "lr": 0.1, "accountant": "rdp"}},
    })


def test_a_cluster_without_the_resources_asked_fails_in_seconds(cluster, tmp_path):
    from flower_dp.experiments import run_experiment
    from flower_dp.gossip.ray_backend import ResourceError

    for run, needle in (({"ray_num_gpus_per_host": 1.0}, "GPU"), ({"ray_num_hosts": 3}, "CPU"),
                        ({"ray_num_hosts": 2, "ray_placement": "STRICT_SPREAD"}, None)):
        t = time.perf_counter()
        if needle is None:  # two hosts on two nodes fit
            assert run_experiment(_cfg(**run), out_dir=tmp_path / "ok", ray_address=cluster["address"]).status \
                == "finished"
            continue
        with pytest.raises(ResourceError, match=needle) as err:
            run_experiment(_cfg(**run), out_dir=tmp_path / needle, ray_address=cluster["address"])
        assert "the cluster has 2 CPUs and 0 GPUs on 2 node(s)" in str(err.value) and "fix" in str(err.value)
        assert time.perf_counter() - t < 60  # connecting is most of it; no scheduling wait
    assert _alive_nodes(cluster["address"], cluster["env"]) == 2


def test_an_address_nobody_listens_on_fails_in_seconds(tmp_path):
    from flower_dp.experiments import run_experiment

    t = time.perf_counter()
    with pytest.raises(ConnectionError, match="does not answer") as err:
        run_experiment(_cfg(), out_dir=tmp_path, ray_address=f"127.0.0.1:{free_port()}")
    assert "ray start --head" in str(err.value) and time.perf_counter() - t < 10


def test_a_cluster_of_another_ray_version_fails_in_seconds_naming_the_fix(cluster):
    """This process posing as another Ray version (``ray.__version__``, which Ray compares with the cluster's)."""
    code = ("import ray, time; ray.__version__ = '2.0.0'\n"
            "from flower_dp.experiments.ray_cluster import ray_connection\n"
            "t = time.perf_counter()\n"
            "try:\n"
            f"    with ray_connection({cluster['address']!r}):\n"
            "        print('JOINED')\n"
            "except RuntimeError as exc:\n"
            "    print('REFUSED', round(time.perf_counter() - t, 1), exc)\n")
    out = subprocess.run([sys.executable, "-c", code], env=cluster["env"], capture_output=True, text=True,
                         timeout=120)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("REFUSED")), "")
    assert line, out.stdout[-2000:] + out.stderr[-2000:]
    assert "another Ray or Python version" in line and "pip install 'ray==" in line
    assert "Ray: 2.55" in line and "Ray: 2.0.0" in line  # the cluster's version and this process's
    assert float(line.split()[1]) < 30


def test_a_killed_raylet_stops_the_run_with_its_checkpoint_and_resume_finishes(cluster, tmp_path):
    """Last in the module: it kills the second raylet of the cluster."""
    from flower_dp.experiments import run_experiment
    from flower_dp.gossip import NodeFailureError

    cfg = _cfg(num_iters=160, eval_every=2)
    out = tmp_path / "run"

    def kill_after_first_segment():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if len(_doc(out)["history"]) >= 2:
                    break
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.05)
        kill_group(cluster["worker"])

    killer = threading.Thread(target=kill_after_first_segment, daemon=True)
    killer.start()
    with pytest.raises(NodeFailureError) as err:
        run_experiment(cfg, out_dir=out, ray_address=cluster["address"])
    killer.join(timeout=60)
    doc = _doc(out)
    lost = [h for h in doc["ray"]["hosts"] if h["host"] == err.value.host][0]
    assert lost["ray_node_id"] in str(err.value) and str(lost["nodes"]) in str(err.value)
    assert doc["status"] == "failed" and len(doc["history"]) >= 2
    assert (out / "checkpoint.pt").is_file()
    resumed = run_experiment(cfg, out_dir=out, resume=True, ray_address=cluster["address"])
    assert resumed.status == "finished"
    doc = _doc(out)
    assert len({h["ray_node_id"] for h in doc["ray"]["hosts"]}) == 1  # the node that remains
    ref = run_experiment(cfg.with_overrides({"run.backend": "inprocess"}), out_dir=tmp_path / "ref")
    assert doc["history"] == _doc(tmp_path / "ref")["history"]  # reproducible: resumed == uninterrupted
    assert ref.status == "finished"
