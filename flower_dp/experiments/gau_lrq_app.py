"""The Flower app of :func:`flower_dp.experiments.gau_lrq.run_gau_lrq` with ``backend="simulation"``.

:func:`simulate` runs :data:`server_app` and :data:`client_app` under ``flwr run`` on simulated SuperNodes
(:func:`flower_dp.flower_run.run_app`: a SuperLink and a Ray head of its own on 127.0.0.1).  Both apps run in other
processes and rebuild what they need from the run configuration, which holds plain values and paths only:

- ``spec-file``: a JSON file with GauLRQ's keyword arguments (never the secret), the rounds, the round timeout and
  the public inputs of :func:`~flower_dp.experiments.gau_lrq.run_inputs` (dataset, model, seed, ...);
- ``lrq-secret-file``: the path of the file (mode 0600) holding the run secret; the clients' Gau-LRQ mod reads it,
  and so does the ServerApp when the strategy names no ``secret_file`` of its own;
- ``client-app-file``: a caller's own ClientApp as a :mod:`flower_dp.handoff` file, or empty for
  :func:`~flower_dp.experiments.gau_lrq.make_client_app`;
- ``results-file``: where the ServerApp writes ``GauLRQ.results()`` and whether ``start`` finished.

The files live in a private temporary folder (0700), read only by the run that :func:`simulate` starts; the secret
file and the ClientApp's pickle are deleted when the run ends.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

__all__ = ["client_app", "server_app", "simulate"]

#: the ServerApp: builds GauLRQ from ``spec-file`` and the secret file, runs it, writes ``results-file``
server_app = ServerApp()
#: the ClientApp: ``client-app-file``'s ClientApp, or :func:`~flower_dp.experiments.gau_lrq.make_client_app` bound
#: to ``lrq-secret-file``; made once per process
client_app = ClientApp()
_APPS: dict[str, ClientApp] = {}


def _inner_app(run_config) -> ClientApp:
    """The ClientApp this run's SuperNodes run (made once per process and file)."""
    pickled, secret_file = str(run_config.get("client-app-file", "")), str(run_config["lrq-secret-file"])
    key = pickled or secret_file
    if key not in _APPS:
        if pickled:
            from flower_dp import handoff

            _APPS[key] = handoff.read(pickled)
        else:
            from .gau_lrq import make_client_app

            _APPS[key] = make_client_app(secret_file)
    return _APPS[key]


@client_app.train()
def _client_train(msg: Message, context: Context) -> Message:
    return _inner_app(context.run_config)(msg, context)


@client_app.evaluate()
def _client_evaluate(msg: Message, context: Context) -> Message:
    return _inner_app(context.run_config)(msg, context)


@client_app.query()
def _client_query(msg: Message, context: Context) -> Message:
    return _inner_app(context.run_config)(msg, context)


@server_app.main()
def _main(grid: Grid, context: Context) -> None:
    from flower_dp.mechanisms.gau_lrq_codec import load_secret
    from flower_dp.results import atomic_write_bytes
    from flower_dp.strategies.gau_lrq import GauLRQ

    from .gau_lrq import run_inputs

    rc = context.run_config
    spec = json.loads(Path(str(rc["spec-file"])).read_text())
    kw = spec["strategy"]
    secret = None if kw["secret_file"] is not None else load_secret(None, str(rc["lrq-secret-file"]))
    strategy = GauLRQ(**kw, secret=secret)
    initial, train_cfg, ev = run_inputs(**spec["inputs"])
    finished = False
    try:
        strategy.start(grid=grid, initial_arrays=initial, num_rounds=int(spec["num_rounds"]), train_config=train_cfg,
                       evaluate_fn=ev, timeout=float(spec["round_timeout_s"]))
        finished = True
    finally:  # also after a failure: the caller reports its stop reason
        doc = {"finished": finished, "results": strategy.results()}
        atomic_write_bytes(str(rc["results-file"]), json.dumps(doc, default=_plain).encode())


def _plain(obj: Any) -> Any:
    """numpy scalars and arrays as Python numbers and lists (JSON keeps non-finite floats as Infinity/NaN)."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"results hold a {type(obj).__name__} ({obj!r}), which JSON cannot carry")


def simulate(strategy_kwargs: dict, inputs: dict, *, num_rounds: int, secret: bytes | None,
             client_app: ClientApp | None, num_cpus: int, round_timeout_s: float) -> dict:
    """Run GauLRQ(**strategy_kwargs) for ``num_rounds`` on ``strategy_kwargs["num_clients"]`` simulated SuperNodes
    under ``flwr run``; return ``GauLRQ.results()`` of the run.

    ``strategy_kwargs``: plain values (absolute paths for ``out_dir`` and ``secret_file``); without a
    ``secret_file`` the run secret is ``secret``, written to a 0600 file in a private folder for the apps to read.
    ``inputs``: the keyword arguments of :func:`~flower_dp.experiments.gau_lrq.run_inputs`.  ``client_app``: a
    ClientApp of the caller's (it must use the Gau-LRQ mod), carried to the SuperNodes as a
    :mod:`flower_dp.handoff` file; None runs :func:`~flower_dp.experiments.gau_lrq.make_client_app`.  Raises
    ``RuntimeError`` with the stop reason and the end of Flower's output when the ServerApp did not finish.
    """
    from flower_dp import handoff
    from flower_dp.flower_run import run_app

    from .flower_backend import _user_paths

    work = Path(tempfile.mkdtemp(prefix="flower-dp-lrq-"))  # 0700: the secret and the ClientApp below
    private = []
    try:
        if strategy_kwargs["secret_file"] is not None:
            secret_file = str(strategy_kwargs["secret_file"])
        else:  # the apps read the secret from a file, never from the run config or a message
            secret_file = handoff.private_file(work / "lrq.secret", secret)
            private.append(secret_file)
        pickled = ""
        if client_app is not None:
            pickled = handoff.write(client_app, work / "client_app.pkl")
            private.append(pickled)
        spec = {"strategy": strategy_kwargs, "inputs": inputs, "num_rounds": int(num_rounds),
                "round_timeout_s": float(round_timeout_s)}
        (work / "spec.json").write_text(json.dumps(spec))
        results_file = work / "results.json"
        run = run_app("flower_dp.experiments.gau_lrq_app:server_app", "flower_dp.experiments.gau_lrq_app:client_app",
                      num_supernodes=int(strategy_kwargs["num_clients"]), work_dir=work, timeout_s=None,
                      pythonpath=_user_paths(), num_cpus=int(num_cpus),
                      run_config={"spec-file": str(work / "spec.json"), "lrq-secret-file": secret_file,
                                  "client-app-file": pickled, "results-file": str(results_file)})
    finally:
        for path in private:
            Path(path).unlink(missing_ok=True)
    doc = json.loads(results_file.read_text()) if results_file.is_file() else None
    if doc is None or not doc["finished"]:
        reason = "no results written" if doc is None else doc["results"]["stop_reason"]
        raise RuntimeError(f"the Flower simulation ended without finishing the ServerApp (stop reason {reason!r}; "
                           f"flwr run exited with {run.returncode}; Flower's files in {str(work)!r}); the end of its "
                           f"output:\n{run.tail()}")
    shutil.rmtree(work, ignore_errors=True)
    return doc["results"]
