"""Results files and checkpoints, written so that nothing half-written is ever read.

Every file is written to a temporary name in the same folder, flushed, fsynced and
renamed over the target (``os.replace`` is atomic on POSIX), so a crash leaves either
the old file or the new one.  Checkpoints carry a SHA-256 checksum of their payload
and are refused with :class:`flower_dp.errors.CheckpointError` when it does not match.

The results file (``results.json``) of a push-sum run has the same layout on every backend (built by
:func:`flower_dp.engine.results_document`)::

    {"name": ..., "status": "running|finished|stopped_by_budget|stopped|failed", "error": ..., "config": ...,
     "seed": ..., "algorithm": ..., "backend": ..., "history": [{"k": ..., "bits_total": ..., ...}, ...],
     "privacy": {"per_node": [{"node": i, "eps_rigorous": ..., "eps_paper": ..., ...}], "plan": ...},
     "bits_sent_per_node": [...], "wall_time_s": ..., "stop_reason": ... (a clean stop), "versions": {...}}

and ``history.csv`` holds the same history rows as a table.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import platform
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

from .errors import CheckpointError

__all__ = [
    "atomic_write_bytes",
    "write_json",
    "read_json",
    "write_csv",
    "ensure_writable_dir",
    "save_checkpoint",
    "load_checkpoint",
    "versions",
    "jsonable",
]

CHECKPOINT_NAME = "checkpoint.pt"
_OLD_MAGIC = b"FLOWERDP-CKPT1\n"  # torch.save pickles (flower-dp before typed checkpoints): refused, never read
_MAGIC = b"FLOWERDP-CKPT2\n"


def ensure_writable_dir(path: str | Path) -> Path:
    """Create ``path`` if needed and check it is writable; raise ``ValueError`` naming it otherwise."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=p, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise ValueError(
            f"results directory {str(p)!r} is not writable ({exc.strerror or exc}); "
            "pass --out with a folder you can write to"
        ) from exc
    return p


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file + fsync + rename)."""
    p = Path(path)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def jsonable(obj: Any) -> Any:
    """Convert numpy/torch scalars and arrays, paths and non-finite floats into JSON values.

    Non-finite floats become the strings ``"inf"``, ``"-inf"`` and ``"nan"`` (JSON has no such numbers).
    """
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):
        return jsonable(obj.tolist())
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    if hasattr(obj, "item"):
        return jsonable(obj.item())
    return str(obj)


def read_json(path: str | Path) -> Any | None:
    """The JSON document at ``path``, or None when it is missing or not valid JSON (e.g. never written)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def write_json(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON, atomically."""
    atomic_write_bytes(path, (json.dumps(jsonable(obj), indent=2, sort_keys=False) + "\n").encode())


def write_csv(path: str | Path, rows: list[dict[str, Any]]) -> None:
    """Write a list of flat dicts as CSV (union of keys as columns), atomically."""
    cols: list[str] = []
    for r in rows:
        for key in r:
            if key not in cols:
                cols.append(key)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols)
    w.writeheader()
    for r in rows:
        w.writerow({k: jsonable(v) for k, v in r.items()})
    atomic_write_bytes(path, buf.getvalue().encode())


def save_checkpoint(directory: str | Path, state: dict[str, Any]) -> Path:
    """Save ``state`` (tensors, arrays, numbers, strings, dicts, lists) to ``directory/checkpoint.pt`` with a checksum.

    The payload is typed (:func:`flower_dp.gossip.wire.to_bytes`: a JSON header and raw array bytes), never a
    pickle; RNG states round-trip (numpy ``bit_generator.state`` dicts, torch generator states as ``uint8`` tensors).
    """
    from .gossip import wire

    payload = wire.to_bytes(state)
    digest = hashlib.sha256(payload).hexdigest().encode()
    path = Path(directory) / CHECKPOINT_NAME
    atomic_write_bytes(path, _MAGIC + digest + b"\n" + payload)
    return path


def load_checkpoint(directory: str | Path) -> dict[str, Any]:
    """Load and verify a checkpoint written by :func:`save_checkpoint` (builds typed values only, never unpickles).

    Raises
    ------
    CheckpointError
        If the file is missing, truncated, its checksum does not match, or it was written by an older
        flower-dp (a pickle, ``FLOWERDP-CKPT1``): such a file is refused unread and must be deleted.
    """
    from .gossip import wire

    path = Path(directory) / CHECKPOINT_NAME
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {str(path)!r}; nothing to resume (run without --resume)")
    raw = path.read_bytes()
    if raw.startswith(_OLD_MAGIC):
        raise CheckpointError(
            f"checkpoint {str(path)!r} was written by an older version of flower-dp (a pickle, which is never loaded); "
            "delete it and rerun without --resume (the run starts from scratch)")
    if not raw.startswith(_MAGIC):
        raise CheckpointError(f"{str(path)!r} is not a flower-dp checkpoint (bad header); delete it or start a new run")
    rest = raw[len(_MAGIC) :]
    digest, _, payload = rest.partition(b"\n")
    if hashlib.sha256(payload).hexdigest().encode() != digest:
        raise CheckpointError(
            f"checkpoint {str(path)!r} is corrupted (checksum mismatch); it was not loaded. "
            "Delete it to restart from scratch"
        )
    try:
        return wire.from_bytes(payload)
    except (wire.WireError, TypeError) as exc:
        raise CheckpointError(f"checkpoint {str(path)!r} is unreadable ({exc}); delete it to restart from scratch") from exc


def versions() -> dict[str, str]:
    """Versions of Python and the packages that determine the numbers of a run."""
    out = {"python": platform.python_version(), "platform": platform.platform()}
    for pkg in ("flower-dp", "torch", "numpy", "dp-accounting", "flwr", "ray", "scipy"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out
