"""Re-accounting of finished reproductions: a new ``eps_rigorous`` for the noise a run recorded, no run repeated.

When the accountant's bound for a sampler changes, the committed records keep their accuracy (the noise
they drew did not change) and get the eps of that noise under the current accountant.  Each record moved
keeps its previous value as ``eps_rigorous_before`` and the reason as ``reaccounted``; its history rows'
``eps_rigorous`` (eps after each evaluated round) are recomputed the same way, and the report says what moved
and why (:func:`reaccounted_line`).

Covered here: the fixed-size samplers under replace-one, whose bound became the PLD of the symmetrised
dominating pair (:mod:`flower_dp.privacy.replace_one`):

- Gau-LRQ and its Gaussian baselines (``gau-lrq``): B of N clients per round, noise multiplier ``z`` per
  round (``z_first``/``z_last`` in the record; Dynamic Gau-LRQ's schedule shape is public, eq. 17/18);
- PrivSGP and PrivSGP-VR (``privsgp-vr``): one of ``J // b`` fixed blocks per step, the recorded noise std on
  the gradient (``history[].noise_std``), split and charged as the calibration does (PrivSGP-VR's table:
  the GDP bound over its hidden draws, :data:`TABLE_REASON`).

Every Gau-LRQ-family record also gets ``eps_by_party`` (:func:`gau_lrq_record_parties`): each party's eps of the
same recorded noise (:mod:`flower_dp.privacy.parties`), so a committed record names whom its eps protects against.

CLI: ``python -m flower_dp.reproduce.reaccount DIR [DIR ...] [--remade SWEEP_OUT ...]`` re-accounts and
re-renders each folder (``--remade``: records of runs made again replace the old ones).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["SYMMETRISED_PAIR_REASON", "TABLE_REASON", "proven_epsilon", "reaccount_record", "reaccount", "reaccounted_line",
           "gau_lrq_record_parties"]

SYMMETRISED_PAIR_REASON = (
    "fixed-size sampling under replace-one is charged the PLD of the symmetrised dominating pair, proven at every "
    "order (Zhu, Dong & Wang 2022; Dong, Roth & Su 2022), instead of the attained pair composed in each order "
    "(a lower bound, not a proof)")


def _gau_lrq_z(rec: dict[str, Any], cfg: dict[str, Any]) -> np.ndarray | None:
    """The per-round noise multipliers a Gau-LRQ-family run used (None: not a Gaussian-noise run)."""
    from ..privacy import paper

    from ..experiments.gau_lrq import METHODS

    z0, z1 = float(rec.get("z_first", math.nan)), float(rec.get("z_last", math.nan))
    rounds = int(rec.get("num_iters") or cfg["num_rounds"])
    if not (math.isfinite(z0) and math.isfinite(z1)):
        return None
    tau = float(cfg.get("tau") or METHODS[cfg["method"]][1])
    if tau == 1.0 or z0 == z1:
        return np.full(rounds, z0)
    shape = paper.gau_lrq_dynamic_noise_multipliers(float(cfg["epsilon"]), float(cfg["delta"]), num_rounds=int(cfg["num_rounds"]),
                                    B=int(cfg["clients_per_round"]), N=int(cfg["num_clients"]), tau=tau)
    z = z0 * shape / shape[0]
    if not math.isclose(float(z[rounds - 1]), z1, rel_tol=1e-6):
        raise ValueError(f"{rec['run_id']}: the schedule rebuilt from z_first ends at {z[rounds - 1]:.6g}, the "
                         f"record says z_last = {z1:.6g}; cannot re-account it")
    return z[:rounds]


def _gau_lrq_eps(rec: dict[str, Any], cfg: dict[str, Any]) -> Callable[[int], float] | None:
    from ..privacy.gau_lrq import client_level_epsilon

    if rec.get("eps_rigorous") is None or not math.isfinite(float(rec["eps_rigorous"])):
        return None  # heuristic (BQ-SGD) or non-private
    z = _gau_lrq_z(rec, cfg)
    if z is None:
        return None
    B, N, delta = int(cfg["clients_per_round"]), int(cfg["num_clients"]), float(cfg.get("delta", rec.get("delta")))
    return lambda k: client_level_epsilon(z[:k], delta, B=B, N=N)


#: ``eps_by_party`` of a run that adds no noise (Local SGD, the noise-free rows)
NOT_PRIVATE = "not private: no noise is added"


def gau_lrq_record_parties(rec: dict[str, Any], cfg: dict[str, Any]) -> dict[str, dict] | None:
    """Every Gau-LRQ party's entry for the noise ``rec`` recorded (``cfg``: its config, rebuilt from the paper's
    specs): :func:`flower_dp.privacy.parties.gau_lrq_eps_by_party` of its z schedule at its delta, with every
    client holding the run secret (the runs had no per-client keys); a heuristic record (BQ-SGD) gets
    ``eps_heuristic`` entries with its note; a run without noise, None entries.  None: not a Gau-LRQ record."""
    from ..privacy.parties import PARTIES, gau_lrq_eps_by_party

    if cfg is None or "clients_per_round" not in cfg:
        return None
    z = _gau_lrq_z(rec, cfg)
    if z is None or rec.get("eps_rigorous") is None and rec.get("eps_heuristic") is None:
        return {name: {"eps": None, "reason": NOT_PRIVATE} for name in PARTIES["gau_lrq"]}
    heuristic = rec.get("eps_rigorous") is None
    return gau_lrq_eps_by_party(z, float(cfg.get("delta", rec.get("delta"))), B=int(cfg["clients_per_round"]),
                                N=int(cfg["num_clients"]), per_client_keys=False,
                                heuristic_note=(rec.get("privacy_note") or "no DP proof") if heuristic else None)


def _privsgp_eps(rec: dict[str, Any], cfg: dict[str, Any]) -> Callable[[int], float] | None:
    from ..privacy.calibration_algos import privsgp_vr_calibration

    alg = cfg["algorithm"]["name"]
    if alg not in ("privsgp", "privsgp_vr") or rec.get("eps_rigorous") is None:
        return None
    stds = [float(h["noise_std"]) for h in rec.get("history") or [] if h.get("noise_std") is not None]
    if not stds or not math.isfinite(float(rec["eps_rigorous"])) or max(stds) == 0:
        return None
    if max(stds) - min(stds) > 1e-12 * max(stds):
        raise ValueError(f"{rec['run_id']}: the recorded noise std changes over the run ({min(stds)} .. {max(stds)}); "
                         "re-accounting expects one std")
    p = cfg["algorithm"]["params"]

    def eps(k: int) -> float:
        return privsgp_vr_calibration(float(p.get("epsilon", 1.0)), float(p["delta"]), num_iters=k,
                                      J=int(cfg["data"]["samples_per_node"]), G=float(p["G"]),
                                      block=int(p.get("batch_size", 1)), vr=alg == "privsgp_vr",
                                      accountant=p.get("accountant", "auto"), noise_std=stds[0]).eps_rigorous
    return eps


TABLE_REASON = (
    "PrivSGP-VR's table carries its hidden block draws into later releases, so it is charged GDP conditioned on "
    "the draws, mixed over their binomial law (bound gdp_table_draws), instead of one subsampled pair per step")

_EPS_OF = {"gau-lrq": _gau_lrq_eps, "privsgp-vr": _privsgp_eps}


def _reason(rec: dict[str, Any]) -> str:
    algorithm = ((rec.get("config") or {}).get("algorithm") or {}).get("name")
    return TABLE_REASON if algorithm == "privsgp_vr" else SYMMETRISED_PAIR_REASON


def _eps_after(paper: str, rec: dict[str, Any]) -> Callable[[int], float] | None:
    """eps after k steps of ``rec``'s recorded noise under today's accountant (``rec`` with its rebuilt
    ``config``); None for a record this module does not re-account (non-private, heuristic, another sampler)."""
    make = _EPS_OF.get(paper)
    cfg = rec.get("config")
    return make(rec, cfg) if make is not None and cfg is not None else None


def proven_epsilon(paper: str, rec: dict[str, Any]) -> float | None:
    """The eps of ``rec``'s recorded noise under today's accountant; None where :func:`_eps_after` has none."""
    eps_of = _eps_after(paper, rec)
    return None if eps_of is None else float(eps_of(int(rec["num_iters"])))


def reaccount_record(paper: str, rec: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
    """A copy of ``rec`` (with its rebuilt ``config``) with ``eps_rigorous`` of its noise under today's accountant;
    ``reason`` (default: the change that moved this kind of record) is kept in ``reaccounted``.  A Gau-LRQ record
    also gets every party's eps (``eps_by_party``, :func:`gau_lrq_record_parties`)."""
    out = _reaccount_eps(paper, rec, reason)
    if paper == "gau-lrq" and rec.get("config") is not None:
        parties = gau_lrq_record_parties(out, rec["config"])
        if parties is not None and parties != out.get("eps_by_party"):
            out = {**out, "eps_by_party": parties}
    return out


def _reaccount_eps(paper: str, rec: dict[str, Any], reason: str | None) -> dict[str, Any]:
    eps_of = _eps_after(paper, rec)
    if eps_of is None:
        return rec
    out = dict(rec)
    new = float(eps_of(int(rec["num_iters"])))
    old = float(rec["eps_rigorous"])
    if math.isclose(new, old, rel_tol=1e-9):
        return rec
    out["eps_rigorous"] = new
    out.setdefault("eps_rigorous_before", old)
    out["reaccounted"] = reason or _reason(rec)
    if rec.get("history"):
        out["history"] = [{**h, "eps_rigorous": float(eps_of(int(h["k"])))} if "eps_rigorous" in h and int(h["k"]) > 0
                          else h for h in rec["history"]]
    return out


def reaccounted_line(records: list[dict[str, Any]]) -> str | None:
    """The report's line on re-accounted records (what moved, and why), or None."""
    moved = [r for r in records if r.get("eps_rigorous_before") is not None]
    if not moved:
        return None
    ratio = [float(r["eps_rigorous"]) / float(r["eps_rigorous_before"]) for r in moved]
    reasons = sorted({str(r.get("reaccounted")) for r in moved})
    return (f"**Re-accounted without retraining** ({len(moved)} of {len(records)} runs; the noise they drew did not "
            f"change, so neither did their accuracy): eps rigorous moved from "
            f"{min(float(r['eps_rigorous_before']) for r in moved):.4g}-{max(float(r['eps_rigorous_before']) for r in moved):.4g} "
            f"to {min(float(r['eps_rigorous']) for r in moved):.4g}-{max(float(r['eps_rigorous']) for r in moved):.4g} "
            f"(x{min(ratio):.4f} to x{max(ratio):.4f}) because {'; '.join(reasons)}. Each record keeps the previous "
            "value as `eps_rigorous_before`.")


def reaccount(out: str | Path, *, remade: list[str | Path] = (), log=print):
    """Re-account every record of the reproduction in ``out`` and re-render it (:func:`flower_dp.reproduce.rerender`).

    ``remade``: folders of sweeps that made some of ``out``'s runs again (``flower-dp reproduce ... --runs PATTERNS
    --out SRC``, e.g. runs whose calibration changed): their finished records replace those of the same run id,
    as they stand; only the other records are re-accounted.
    """
    from .. import results as rio
    from . import _revive, rerender

    meta = (rio.read_json(Path(out) / "records.json") or {}).get("meta", {})
    paper = meta.get("paper")
    fresh: dict[str, dict[str, Any]] = {}
    for src in remade:
        doc = rio.read_json(Path(src) / "records.json") or {}
        if doc.get("meta", {}).get("paper") != paper:
            raise ValueError(f"{str(src)!r} holds no {paper!r} records.json; pass the --out folder of a sweep of it")
        fresh.update({r["run_id"]: _revive(r) for r in doc.get("records", []) if r.get("status") == "finished"})

    def transform(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out_records = []
        for r in records:
            if r.get("run_id") in fresh:
                log(f"{r['run_id']}: the re-made run replaces the record")
                out_records.append({**fresh[r["run_id"]], "config": r.get("config")})
            else:
                out_records.append(reaccount_record(paper, r))
        return out_records

    return rerender(out, transform=transform, log=log)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    remade: list[str] = []
    while "--remade" in args:
        i = args.index("--remade")
        remade.append(args[i + 1])
        del args[i:i + 2]
    if not args:
        print("usage: python -m flower_dp.reproduce.reaccount DIR [DIR ...] [--remade SWEEP_OUT ...]  (reproduction "
              "folders with records.json; --remade: sweeps whose finished records replace the same run ids)",
              file=sys.stderr)
        return 2
    for d in args:
        reaccount(d, remade=remade)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
