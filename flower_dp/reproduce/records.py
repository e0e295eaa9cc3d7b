"""A reproduction's records: one record per finished run (labels, seed, config and its hash, accuracies, bits, the
privacy per node with the bound that proves it), how a committed record is found again for a run, how older
records are read with today's field names, and the records files (``records.json`` / ``records.csv``).  A ``spec``
argument is a :class:`flower_dp.reproduce.core.RunSpec`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .. import results as rio

#: a run's statuses that count as done: its record is final
_DONE = ("finished", "stopped_by_budget")

def _same_config(stored: Any, cfg: Any) -> bool:
    """Whether a run's stored config is ``cfg``: compared after both pass through today's config parser, so a
    key added later with its default (what the run in fact used) does not make a finished run look different.
    ``[run] device`` is left out of the comparison: a run finished on a GPU is the same run as on the CPU."""
    from ..errors import ConfigError
    from ..experiments import config_from_dict

    def placeless(conf: dict[str, Any]) -> dict[str, Any]:
        # where and how the nodes ran, not what they computed: the same results (prefetched noise is bit for bit)
        from ..experiments.config import PLACE_KEYS

        skip = ("device", "prefetch_noise", *PLACE_KEYS)
        return {**conf, "run": {k: v for k, v in conf.get("run", {}).items() if k not in skip}}

    if not isinstance(stored, dict):
        return False
    want = placeless(cfg.to_dict())
    if placeless(stored) == want:
        return True
    try:
        return placeless(config_from_dict(stored).to_dict()) == want
    except (ConfigError, TypeError, ValueError):
        return False


def _per_node(doc: dict[str, Any], key: str) -> list[float]:
    return [float(p.get(key, float("nan"))) for p in doc.get("privacy", {}).get("per_node", [])]


#: Mechanisms without an implemented DP proof: their eps is ``eps_heuristic`` (``eps_rigorous`` null), with a note.
#: Push-sum algorithm name (``config.algorithm.name``) or Gau-LRQ method (``config.method``) -> why.
HEURISTIC_MECHANISMS: dict[str, str] = {
    **{a: ("heuristic, no DP proof: Laplace noise scaled to a data-dependent sensitivity estimate broadcast in the "
           "clear (L1 clipping off by default, so the true sensitivity is unbounded); per node-message, not "
           "record-level") for a in ("partpsp", "sgpdp", "pedfl")},
    **{m: "heuristic, no DP proof: binomial noise matched by variance to the Gaussian" for m in ("bq-sgd", "bq")},
}


def _heuristic_note(config: dict[str, Any] | None) -> str | None:
    """The note of a heuristic mechanism for a run config (push-sum or Gau-LRQ), or None for a proven one."""
    cfg = config or {}
    name = (cfg.get("algorithm") or {}).get("name") if isinstance(cfg.get("algorithm"), dict) else None
    return HEURISTIC_MECHANISMS.get(name or cfg.get("method") or "")


#: The privacy note of a push-sum run whose Gaussian noise came from torch's float32 sampler (before commit 4575d7e):
#: its eps is an ideal Gaussian's at the run's noise levels, so it is kept as ``eps_heuristic``, never ``eps_rigorous``.
FLOAT32_SAMPLER_NOTE = (
    "heuristic, not proven for the noise drawn: an ideal Gaussian's eps at this run's noise levels, but the noise came "
    "from torch's float32 sampler (24-bit uniforms, no draw beyond 5.77 std, coarse tail beyond ~4.4 std), which "
    "leaves an uncharged delta; re-run it (the float64 sampler, noise.gaussian_sampler = torch-float64) for a proven eps"
)


def with_sampler(rec: dict[str, Any], kind: str | None) -> dict[str, Any]:
    """``rec`` (a new dict) naming its Gaussian sampler: a push-sum record from before results named it
    (``gaussian_sampler`` missing or None) drew torch's float32 noise, cut at 5.77 std (before commit 4575d7e)."""
    out = dict(rec)
    if out.get("gaussian_sampler") is None and kind == "pushsum":
        out["gaussian_sampler"] = "torch-float32"
    return out


def _float32_private(rec: dict[str, Any]) -> bool:
    """A private record (finite ``eps_rigorous``) whose noise came from torch's float32 sampler, not yet demoted."""
    try:
        private = math.isfinite(float(rec.get("eps_rigorous")))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        private = False
    return private and rec.get("gaussian_sampler") == "torch-float32"


def unproven_sampler(rec: dict[str, Any]) -> dict[str, Any]:
    """A record whose Gaussian noise was drawn by torch's float32 sampler, with its eps demoted to ``eps_heuristic``
    (:data:`FLOAT32_SAMPLER_NOTE`; history rows too).  Other records, and ones already demoted, come back unchanged
    (a new dict; idempotent).  Only a finite ``eps_rigorous`` is demoted: a non-private run drew no noise."""
    if not _float32_private(rec):
        return dict(rec)
    out = {k: v for k, v in rec.items() if k != "eps_rigorous"}
    out.update(eps_rigorous=None, eps_heuristic=rec["eps_rigorous"], privacy_note=FLOAT32_SAMPLER_NOTE)
    if isinstance(rec.get("history"), list):
        out["history"] = [{("eps_heuristic" if hk == "eps_rigorous" else hk): hv for hk, hv in h.items()}
                          for h in rec["history"]]
    return out


def drew_float32_noise(rec: dict[str, Any]) -> bool:
    """Whether a record is a private run whose noise came from torch's float32 sampler (demoted or not yet)."""
    return rec.get("privacy_note") == FLOAT32_SAMPLER_NOTE or _float32_private(rec)


def _privacy_fields(doc: dict[str, Any], config: dict[str, Any] | None) -> dict[str, Any]:
    """``eps_rigorous`` (max over nodes) or, for a mechanism without a proof, ``eps_rigorous: None`` with
    ``eps_heuristic`` and ``privacy_note``.  A results file from before the rename (a heuristic mechanism's
    number under ``eps_rigorous``) is read as heuristic."""
    per_node = doc.get("privacy", {}).get("per_node", []) or []
    note = next((p.get("privacy_note") for p in per_node if p.get("eps_heuristic") is not None
                 and p.get("privacy_note")), None) or _heuristic_note(config)
    if note is None and any(p.get("heuristic") for p in per_node if "eps_heuristic" not in p and
                            p.get("eps_rigorous") is not None):
        note = "heuristic, no DP proof"
    if note is None:
        eps_r = [float(p.get("eps_rigorous", float("nan"))) for p in per_node]
        return {"eps_rigorous": max(eps_r) if eps_r else float("nan")}
    vals = [p.get("eps_heuristic", p.get("eps_rigorous")) for p in per_node]
    vals = [float(v) for v in vals if v is not None]
    return {"eps_rigorous": None, "eps_heuristic": max(vals) if vals else float("nan"), "privacy_note": note}


#: Paper labels of the heuristic mechanisms (records written without their config): label -> HEURISTIC_MECHANISMS key.
HEURISTIC_LABELS = {"PartPSP-1": "partpsp", "PartPSP-2": "partpsp", "SGPDP": "sgpdp", "PEDFL": "pedfl",
                    "BQ-SGD": "bq-sgd"}


def migrate_record(rec: dict[str, Any], config: dict[str, Any] | None = None) -> dict[str, Any]:
    """A record written before ``eps_heuristic`` existed, with the names of today (a new dict; idempotent).

    A mechanism without a proof (:data:`HEURISTIC_MECHANISMS`, found from ``config``, the record's own
    ``config`` or its algorithm label) gets ``eps_rigorous: None``, ``eps_heuristic`` (the number it carried)
    and ``privacy_note``, and its history rows' ``eps_rigorous`` becomes ``eps_heuristic``.  Other records
    are returned unchanged.
    """
    note = _heuristic_note(config if config is not None else rec.get("config"))
    if note is None and config is None:
        note = HEURISTIC_MECHANISMS.get(HEURISTIC_LABELS.get(str((rec.get("labels") or {}).get("algorithm")), ""))
    if note is None or "eps_heuristic" in rec:
        return dict(rec)
    out: dict[str, Any] = {}
    for k, v in rec.items():
        if k == "eps_rigorous":
            out["eps_rigorous"], out["eps_heuristic"], out["privacy_note"] = None, v, note
        elif k == "history":
            out[k] = [{("eps_heuristic" if hk == "eps_rigorous" else hk): hv for hk, hv in h.items()} for h in v]
        else:
            out[k] = v
    return out


def record_from_doc(spec: Any, doc: dict[str, Any]) -> dict[str, Any]:
    """One flat record of a finished run (what the report and the CSV are made of)."""
    hist = doc.get("history", [])
    accs = [float(h.get("acc_avg", float("nan"))) for h in hist]
    eps_p = _per_node(doc, "eps_paper")
    info = doc.get("info", {})
    rec = {
        "run_id": spec.run_id,
        **{f"label_{k}": v for k, v in spec.labels.items()},
        "seed": spec.seed,
        "status": doc.get("status"),
        "num_iters": doc.get("num_iters"),
        "final_acc": accs[-1] if accs else float("nan"),
        "best_acc": max(accs) if accs else float("nan"),
        "final_loss": float(hist[-1].get("test_loss_avg", float("nan"))) if hist else float("nan"),
        "bits_total": float(hist[-1].get("bits_total", float("nan"))) if hist else float("nan"),
        **_privacy_fields(doc, spec.config),
        "eps_paper": max(eps_p) if eps_p else float("nan"),
        "delta": (doc.get("privacy", {}).get("per_node") or [{}])[0].get("delta"),
        "dataset": info.get("dataset", doc.get("dataset")),
        "synthetic_data": info.get("synthetic_data", False),
        "backend": doc.get("backend", "inprocess"),
        "device": info.get("device") or ((doc.get("config") or {}).get("run") or {}).get("device", "cpu"),
        "wall_time_s": float(doc.get("wall_time_s", float("nan"))),
        "train_cpu_s": float(doc.get("train_cpu_s", float("nan"))),
        "reused": bool(doc.get("_reused", False)),
        # debug_metrics runs (e.g. Dyn-D2P Fig. 1): training statistics the accountant did not charge are in the history
        "uncharged_statistics_released": bool(doc.get("uncharged_statistics_released", False)),
        # where the privacy noise came from (flower_dp.rng.noise_record); a run from before secret noise was seeded
        "noise_mode": (doc.get("noise") or {}).get("mode", "reproducible"),
        # push-sum noise drawn before the float64 sampler (commit 4575d7e) was torch's float32 (with_sampler)
        "gaussian_sampler": (doc.get("noise") or {}).get("gaussian_sampler"),
    }
    if doc.get("eps_by_party") is not None:  # every party's eps (flower_dp.privacy.parties)
        rec["eps_by_party"] = doc["eps_by_party"]
    rec.update(doc.get("extra_record", {}))
    rec["config_sha"] = config_sha(spec.config)
    rec["labels"] = dict(spec.labels)
    if spec.kind == "pushsum" and not rec["uncharged_statistics_released"]:
        from ..releases import public_history_row

        hist = [public_history_row(h) for h in hist]  # a reused run from before the releases were filtered
    rec["history"] = hist
    return unproven_sampler(with_sampler(rec, spec.kind))


def config_sha(config: dict[str, Any]) -> str:
    """A short fingerprint of a run's config (canonical JSON, SHA-256): a committed record is reused only for
    the config that produced it."""
    import hashlib
    import json

    blob = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def committed_records(out: Path) -> dict[str, dict[str, Any]]:
    """The finished records of ``out/records.json`` (what a previous session committed), by run id."""
    doc = rio.read_json(Path(out) / "records.json") or {}
    return {r["run_id"]: r for r in doc.get("records", []) if isinstance(r, dict) and r.get("run_id")
            and r.get("status") in _DONE}


def _same_config_record(spec: Any, committed: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The committed record of ``spec``'s run id, if it was made from exactly this config (``config_sha``)."""
    rec = committed.get(spec.run_id)
    return rec if rec is not None and rec.get("config_sha") == config_sha(spec.config) else None


def _float32_record(spec: Any, committed: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The committed record of exactly ``spec``'s config whose private noise came from torch's float32 sampler:
    its eps is not proven, so the run is made again (the record stands in records.json until then)."""
    rec = _same_config_record(spec, committed)
    return rec if rec is not None and _drew_float32(rec, spec) else None


def _drew_float32(rec: dict[str, Any], spec: Any) -> bool:
    return drew_float32_noise(with_sampler(rec, spec.kind))


def _committed_record(spec: Any, run_dir: Path, committed: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The committed record to reuse for ``spec``: made from exactly this config (``config_sha``), its noise
    proven (not :func:`_float32_record`), and the run folder holds no finished run of its own (a finished one wins:
    it may be newer; an unfinished one, with or without a checkpoint, does not: the committed run is complete)."""
    rec = _same_config_record(spec, committed)
    if rec is None or _drew_float32(rec, spec):
        return None
    for name in ("results.json", "reproduce_doc.json"):
        doc = rio.read_json(run_dir / name)
        if doc and doc.get("status") in _DONE:
            return None
    return rec


def _note_cpu(run_dir: Path, cpu: float) -> None:
    rio.write_json(run_dir / "cpu_time.json", {"cpu_time_s": cpu})


def _read_cpu(run_dir: Path) -> float:
    doc = rio.read_json(run_dir / "cpu_time.json")
    return float(doc["cpu_time_s"]) if doc else float("nan")


_CSV_SKIP = ("labels", "history", "config", "eps_by_party")


def _csv_row(r: dict[str, Any]) -> dict[str, Any]:
    """A record as a CSV row: nested fields left out, every party's eps as a column ``eps_<party>``."""
    row = {k: v for k, v in r.items() if k not in _CSV_SKIP}
    for name, entry in (r.get("eps_by_party") or {}).items():
        row[f"eps_{name}"] = entry.get("eps")
    return row


def _write_records(out: Path, records: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    rio.write_json(out / "records.json", {"meta": meta, "records": records})
    rio.write_csv(out / "records.csv", [_csv_row(r) for r in records])
