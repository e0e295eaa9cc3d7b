"""The Flower app of :func:`flower_dp.experiments.gau_lrq.run_gau_lrq` with ``backend="simulation"``.

``run_gau_lrq`` runs :data:`server_app` and :data:`client_app` under ``flwr run`` on simulated SuperNodes
(:func:`flower_dp.experiments.flower_run.run_app`: a SuperLink and a Ray head of its own on 127.0.0.1).  Both apps run in other
processes and rebuild what they need from the run configuration, which holds plain values and paths only:

- ``spec-file``: a JSON file with GauLRQ's keyword arguments (never the secret), the rounds, the round timeout and
  the public inputs of :func:`~flower_dp.experiments.gau_lrq.run_inputs` (dataset, model, seed, ...);
- ``lrq-secret-file``: the path of the file (mode 0600) holding the server's master secret; only the ServerApp reads
  it, when the strategy names no ``secret_file`` of its own;
- ``lrq-key-dir``: the folder (mode 0700) of the clients' key files, ``client-<partition id>.key`` (mode 0600); each
  ClientApp's Gau-LRQ mod reads only its own;
- ``client-app-file``: a caller's own ClientApp as a :mod:`flower_dp.experiments.handoff` file, or empty for
  :func:`~flower_dp.experiments.gau_lrq.make_client_app`;
- ``results-file``: where the ServerApp writes ``GauLRQ.results()`` and whether ``start`` finished.

The files live in private temporary folders (0700), read only by the run that ``run_gau_lrq`` starts; the secret
file, the key files and the ClientApp's hand-off file are deleted when the run ends.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from flower_dp.experiments.flower_run import client_app_from_config

__all__ = ["client_app", "server_app"]

#: the ServerApp: builds GauLRQ from ``spec-file`` and the secret file, runs it, writes ``results-file``
server_app = ServerApp()


def _inner_app(run_config) -> ClientApp:
    """The ClientApp this run's SuperNodes run: the caller's, or ``make_client_app`` (keys from ``lrq-key-dir``)."""
    pickled = str(run_config.get("client-app-file", ""))
    if pickled:
        from flower_dp.experiments import handoff

        return handoff.read(pickled)
    from .gau_lrq import make_client_app

    return make_client_app()


#: the ClientApp: ``client-app-file``'s ClientApp, or :func:`~flower_dp.experiments.gau_lrq.make_client_app` (each
#: node's mod reads its own key from ``lrq-key-dir``); made once per process and file
client_app = client_app_from_config(_inner_app, key=lambda rc: str(rc.get("client-app-file", "")) or "make_client_app")


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
