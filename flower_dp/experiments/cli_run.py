"""``flower-dp run CONFIG`` and ``flower-dp quickstart``."""

from __future__ import annotations

import argparse
import json
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = ["register", "builtin_config_path", "parse_overrides"]


def builtin_config_path(name: str) -> Path:
    """Path of a config shipped with flower-dp (``flower_dp/experiments/configs/NAME.toml``)."""
    p = Path(str(resources.files("flower_dp.experiments") / "configs" / f"{name}.toml"))
    if not p.is_file():
        shipped = sorted(f.name[:-5] for f in p.parent.glob("*.toml"))
        raise ValueError(f"unknown built-in config {name!r}; shipped configs are {shipped}")
    return p


def parse_overrides(items: list[str] | None) -> dict[str, Any]:
    """Parse ``--set section.key=value`` items; values are read as JSON when possible."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or "." not in key:
            raise ValueError(f"--set expects section.key=value (e.g. run.num_iters=50), got {item!r}")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def _report_network(res) -> None:
    """An asynchronous run's nodes: speed, steps, eps from the node's own ledger, and why each stopped."""
    net = res.network
    print(f"network: async (virtual time), delay {net['delay']} mean {net['delay_mean']:g}, loss {net['loss']:g}; "
          f"ended at t = {net['time']:g}; messages sent {net['messages']['sent']}, lost {net['messages']['lost']}")
    eps = {int(p["node"]): p.get("eps_rigorous", p.get("eps_heuristic")) for p in res.privacy.get("per_node", [])}
    print("  node  speed  steps  eps      stopped")
    for r in net["per_node"]:
        e = eps.get(r["node"])
        print(f"  {r['node']:>4}  {r['speed']:>5.2f}  {r['steps']:>5}  {'-' if e is None else f'{e:.4f}':<7}  "
              f"{r['reason'] or 'running'}")


def _report(res) -> None:
    print(f"status: {res.status}   wall time: {res.wall_time_s:.1f} s")
    if res.history:
        last = res.history[-1]
        when = (f"virtual time t={last['t_virtual']:g}" if getattr(res, "network", None) else f"k={last['k']}")
        print(f"test accuracy (network-average model) after {when}: {last['acc_avg']:.4f}")
    if getattr(res, "network", None):
        _report_network(res)
    per_node = res.privacy.get("per_node", [])
    if per_node:
        eps_p = max(float(p.get("eps_paper", float("nan"))) for p in per_node)
        delta = per_node[0].get("delta")
        heur = [float(p["eps_heuristic"]) for p in per_node if p.get("eps_heuristic") is not None]
        if heur:  # DPPS family: no DP proof, never printed as rigorous
            print(f"privacy per node: heuristic eps = {max(heur):.4f} (delta = {delta}; no DP proof: "
                  f"{per_node[0].get('privacy_note', 'estimated sensitivity')}); paper formula's eps = {eps_p:.4f}")
        else:
            eps_r = max(float(p.get("eps_rigorous", float("nan"))) for p in per_node)
            print(f"privacy per node: rigorous eps = {eps_r:.4f} (delta = {delta}); paper formula's eps = {eps_p:.4f}")
    if res.eps_by_party:
        print(f"privacy calibrated to party {res.party!r}; every party: " + "; ".join(
            f"{name} {'eps = %.4f' % e['eps'] if e.get('eps') is not None else 'none (' + e['reason'] + ')'}"
            for name, e in res.eps_by_party.items()))
    noise = (res.privacy.get("plan") or {}).get("noise")
    if noise:
        print(f"noise: {noise['mode']}" + (" (simulation mode: " + noise["note"] + ")"
                                          if noise["mode"] == "reproducible" else ""))
    if res.out_dir is not None:
        print(f"results: {res.out_dir / 'results.json'}")


def _with_reproducible(overrides: dict[str, Any], flag: bool) -> dict[str, Any]:
    """``--reproducible`` = ``--set run.reproducible=true``."""
    return {**overrides, "run.reproducible": True} if flag else overrides


#: help of ``--reproducible`` (run, quickstart)
REPRODUCIBLE_HELP = ("simulation mode: draw privacy noise and private sampling from streams keyed by the run seed "
                     "(identical numbers on every backend and across resumes); the guarantee then holds only "
                     "against parties that do not know the seed, which results.json publishes.  Default: each "
                     "node's own secret from OS entropy")


def _with_party(overrides: dict[str, Any], party: str | None) -> dict[str, Any]:
    """``--party P`` = ``--set privacy.party=P``."""
    return {**overrides, "privacy.party": party} if party is not None else overrides


#: help of ``--party`` (run, quickstart)
PARTY_HELP = ("whom the eps is stated for and the noise calibrated to: out_neighbour (default), relay (needs "
              "run.checkpoint = false) or model_observer; results.json reports every party (eps_by_party)")


def _cmd_run(args: argparse.Namespace) -> int:
    from .config import load_config
    from .runner import run_experiment

    path = Path(args.config)
    if not path.exists() and not path.suffix:
        path = builtin_config_path(args.config)
    cfg = load_config(path, _with_party(_with_reproducible(parse_overrides(args.set), args.reproducible), args.party))
    out, resume = args.out, bool(args.resume)
    if isinstance(args.resume, str):  # --resume DIR
        if out is not None and out != args.resume:
            raise ValueError(f"--resume {args.resume!r} and --out {out!r} name different folders; give one of them")
        out = args.resume
    res = run_experiment(cfg, out_dir=out, resume=resume, backend=args.backend, ray_address=args.ray_address)
    _report(res)
    return 0


def _cmd_quickstart(args: argparse.Namespace) -> int:
    from .config import load_config
    from .runner import run_experiment

    overrides = _with_party(_with_reproducible(parse_overrides(args.set), args.reproducible), args.party)
    cfg = load_config(builtin_config_path("quickstart"), overrides)
    print(
        f"quickstart: {cfg.algorithm['name']} ({cfg.algorithm['params'].get('variant', '')}) on "
        f"{cfg.n_nodes} nodes, {cfg.data['dataset']}, model {cfg.model['name']}, topology {cfg.topology['name']}, "
        f"K = {cfg.run['num_iters']}, target eps = {cfg.algorithm['params'].get('epsilon')}"
    )
    res = run_experiment(cfg, out_dir=args.out)
    _report(res)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run an experiment config (in process or on a Ray cluster)",
                       description="Run a TOML experiment config.")
    p.add_argument("config", help="path of a .toml config, or the name of a built-in one (e.g. quickstart)")
    p.add_argument("--out", default=None, help="results folder (default: run.out_dir of the config)")
    p.add_argument("--resume", nargs="?", const=True, default=False, metavar="DIR",
                   help="continue a stopped run from the checkpoint in DIR (or in --out)")
    p.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a config value")
    p.add_argument("--reproducible", action="store_true", help=REPRODUCIBLE_HELP)
    p.add_argument("--party", default=None, help=PARTY_HELP)
    p.add_argument("--backend", choices=["inprocess", "ray"], default=None,
                   help="where the nodes run: in this process, or on Ray host actors spread over a Ray cluster "
                        "(default: the config's run.backend, inprocess)")
    p.add_argument("--ray-address", default=None, metavar="HEAD:PORT|auto",
                   help="with --backend ray: join this running Ray cluster (never started or stopped here); default "
                        "the config's run.ray_address, else RAY_ADDRESS, else a local Ray on 127.0.0.1 for this run")
    p.set_defaults(func=_cmd_run)

    q = sub.add_parser(
        "quickstart",
        help="train a small private decentralized run and print accuracy and the rigorous eps",
        description="Dyn-D2P on 8 nodes, Fashion-MNIST (offline), a couple of minutes on 2 CPU cores.",
    )
    q.add_argument("--out", default="runs/quickstart", help="results folder (default: runs/quickstart)")
    q.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a config value")
    q.add_argument("--reproducible", action="store_true", help=REPRODUCIBLE_HELP)
    q.add_argument("--party", default=None, help=PARTY_HELP)
    q.set_defaults(func=_cmd_quickstart)
