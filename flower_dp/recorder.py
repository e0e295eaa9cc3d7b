"""One run's files: ``results.json``, ``history.csv`` and the checksummed ``checkpoint.pt``, and the resume check.

A :class:`RunRecorder` decides where and how a run's files are written (atomically, :mod:`flower_dp.results`),
stamps every checkpoint with the run's *identity* (the config or settings that determine the numbers) and refuses,
with :class:`~flower_dp.errors.CheckpointError`, a checkpoint that is corrupted (checksum), written by an older
flower-dp (a pickle) or by a run of another identity.  What goes into the files, and when, is decided by the run
engine (:mod:`flower_dp.engine`), its only caller.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from . import results as rio
from .errors import CheckpointError

__all__ = ["RunRecorder", "RUNNING", "FINISHED", "STOPPED_BY_BUDGET", "FAILED", "STOPPED", "STATUSES"]

#: ``results.json["status"]``: while segments run, after the last one, cut short by the privacy budget, after an error
RUNNING, FINISHED, STOPPED_BY_BUDGET, FAILED = "running", "finished", "stopped_by_budget", "failed"
#: stopped on request at the end of a segment, checkpoint written (:data:`flower_dp.engine.STOP_FILE_ENV`):
#: not finished, resumes with nothing charged twice
STOPPED = "stopped"
STATUSES = (RUNNING, FINISHED, STOPPED_BY_BUDGET, FAILED, STOPPED)


#: ``refusal(where, checkpoint's value, this run's value) -> message`` for one identity field
Refusal = Callable[[str, Any, Any], str]


def _different_run(where: str, got: Any, want: Any) -> str:
    return (f"the checkpoint in {where} was written by a different run ({got}), got {want}; resume with the same "
            "settings or use a new out_dir")


def sampler_identity(device="cpu") -> dict[str, str]:
    """The identity field naming the Gaussian sampler the run's noise comes from (the nodes' ``device``, or a list
    of devices: :func:`flower_dp.mechanisms.noise.gaussian_sampler`): a checkpoint written with another (or before
    the field: torch's float32 sampler, cut at 5.77 std; or on another kind of device) cannot be resumed, since
    the noise it already drew would make the run's eps unproven or the run's record name the wrong sampler."""
    from .mechanisms.noise import gaussian_sampler

    return {"gaussian_sampler": gaussian_sampler(device)}


def plan_summary(plan: Any, device="cpu") -> dict[str, Any]:
    """``plan.summary(device)`` (its ``noise`` entry names the sampler of the nodes' ``device``); ``{}`` for a plan
    without a summary."""
    summary = getattr(plan, "summary", None)
    return summary(device) if callable(summary) else {}


def _other_sampler(where: str, got: Any, want: Any) -> str:
    from .mechanisms.noise import is_proven_sampler

    if is_proven_sampler(got):  # proven too, but one run's noise comes from one sampler (its record names it)
        why = "a run's noise comes from one sampler, the one its results name"
    else:
        why = "resuming it would leave the noise drawn so far unproven"
    return (f"the checkpoint in {where} holds noise drawn with the Gaussian sampler "
            f"{got or 'torch-float32 (before the field existed)'}, this run draws with {want}: {why}; start the run "
            "again (delete the checkpoint or use a new out_dir)")


#: The refusal of a checkpoint whose noise came from another sampler (with :func:`sampler_identity`).
SAMPLER_REFUSAL: dict[str, Refusal] = {"gaussian_sampler": _other_sampler}


class RunRecorder:
    """Writes one run's results and checkpoints into ``out_dir`` and checks a checkpoint before a resume.

    Parameters
    ----------
    out_dir : path or None
        Created if needed (``ValueError`` naming it when not writable); None: the recorder writes nothing.
    identity : dict or callable returning one
        Fields stored first in every checkpoint (e.g. ``{"config": cfg.to_dict()}``); :meth:`load_checkpoint`
        refuses a checkpoint whose fields differ.  A callable is asked each time (settings fixed late).
    checkpoint : bool
        Write ``checkpoint.pt`` at all (False: :meth:`save_checkpoint` does nothing).
    refusals : dict, optional
        Per identity field, ``refusal(where, checkpoint's value, this run's value) -> message`` of the
        CheckpointError raised when they differ (default: "written by a different run (...)").
    """

    def __init__(self, out_dir: str | Path | None, *, identity: Mapping[str, Any] | Callable[[], Mapping[str, Any]],
                 checkpoint: bool = True, refusals: Mapping[str, Refusal] | None = None) -> None:
        self.out_dir = rio.ensure_writable_dir(out_dir) if out_dir else None
        self.checkpoint = bool(checkpoint) and self.out_dir is not None
        self._identity = identity
        self._refusals = dict(refusals or {})

    @property
    def where(self) -> str:
        """The folder as error messages quote it."""
        return repr(str(self.out_dir))

    def identity(self) -> dict[str, Any]:
        """The identity fields of this run, as its checkpoints store them."""
        return dict(self._identity() if callable(self._identity) else self._identity)

    def write(self, doc: dict[str, Any], rows: list[dict[str, Any]] | None = None) -> None:
        """Write ``doc`` to ``results.json`` and, given, the history ``rows`` to ``history.csv``, each atomically."""
        if self.out_dir is None:
            return
        if doc.get("status", RUNNING) not in STATUSES:
            raise ValueError(f"results status must be one of {STATUSES}, got {doc['status']!r}")
        rio.write_json(self.out_dir / "results.json", doc)
        if rows is not None:
            rio.write_csv(self.out_dir / "history.csv", rows)

    #: Written beside the checkpoint by a run that stopped on request: ``{"k": k}``, the checkpoint's iteration, after
    #: which nothing ran (:meth:`mark_clean_stop`, :meth:`take_clean_stop`).
    CLEAN_STOP_NAME = "clean_stop.json"

    def mark_clean_stop(self, k: int) -> None:
        """Record that the run stopped on request right after its checkpoint at iteration ``k`` (call it after
        :meth:`save_checkpoint`, and run nothing after it)."""
        if self.checkpoint:
            rio.write_json(self.out_dir / self.CLEAN_STOP_NAME, {"k": int(k)})

    def take_clean_stop(self) -> int | None:
        """The iteration of a clean stop recorded by :meth:`mark_clean_stop` (None if none or unreadable), deleting
        the record: a resume consumes it before its first iteration, so it never vouches for a later checkpoint."""
        if self.out_dir is None:
            return None
        marker = self.out_dir / self.CLEAN_STOP_NAME
        doc = rio.read_json(marker)
        marker.unlink(missing_ok=True)
        try:
            return int(doc["k"]) if isinstance(doc, dict) else None
        except (KeyError, TypeError, ValueError):
            return None

    def save_checkpoint(self, state: dict[str, Any]) -> Path | None:
        """Save the identity fields and ``state`` to ``checkpoint.pt`` (checksummed, atomic; never a pickle)."""
        if not self.checkpoint:
            return None
        return rio.save_checkpoint(self.out_dir, {**self.identity(), **state})

    def load_checkpoint(self, upgrade: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """The checkpoint in ``out_dir``, checked: ``upgrade`` first fills in what older checkpoints lack.

        Raises
        ------
        CheckpointError
            If there is none, it is corrupted or from an older flower-dp (:func:`flower_dp.results.load_checkpoint`),
            or an identity field differs from this run's (checked in the order given).
        """
        if self.out_dir is None:
            raise CheckpointError("no out_dir, so no checkpoint to resume from; pass the run's out_dir")
        ck = rio.load_checkpoint(self.out_dir)
        if upgrade is not None:
            upgrade(ck)
        self.check_identity(ck)
        return ck

    def check_identity(self, ck: Mapping[str, Any]) -> None:
        """Raise :class:`CheckpointError` when a field of the checkpoint ``ck`` differs from this run's identity now
        (checked in the order given; the identity may have been completed since the checkpoint was loaded)."""
        for key, want in self.identity().items():
            if ck.get(key) != want:
                raise CheckpointError(self._refusals.get(key, _different_run)(self.where, ck.get(key), want))
