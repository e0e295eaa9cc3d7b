"""The run engine: one loop drives a push-sum run segment by segment on any backend and keeps its record.

A *backend* (:class:`SegmentBackend`) runs the nodes: the in-process loop
(:class:`flower_dp.experiments.runner.InProcessBackend`), the Ray host actors and the Flower relay (both driven by
:class:`flower_dp.strategies.PushSumStrategy`).  :func:`run_segments` owns everything around the iterations, for
every backend alike: the start or the resume from a checkpoint (with :func:`~flower_dp.privacy.budget.charge_replay`
of the segment a crash may have sent), the non-finite check of the network average, the history rows, the
checkpoint after every segment, the clean stop (a stop file or a ``should_stop`` callback), the run's status and the
one results document (:func:`results_document`).  This module is the only place in the library that writes a
results document or a checkpoint or decides a status (a test reads the sources to keep it so);
:class:`flower_dp.strategies.GauLRQ`, whose rounds are Flower's and not push-sum segments, records its rounds
through :func:`save_round` and :func:`with_status`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from . import results as rio
from .errors import CheckpointError, NonFiniteError
from .privacy.budget import charge_replay
from .privacy.parties import push_sum_eps_by_party_from_reports
from .recorder import FAILED, FINISHED, RUNNING, STOPPED, STOPPED_BY_BUDGET, RunRecorder

__all__ = ["SegmentBackend", "SegmentPlan", "RunHeader", "RunProgress", "run_segments", "results_document",
           "completed_status", "status_of_stop_reason", "save_round", "with_status", "STOP_FILE_ENV", "stop_requested",
           "flat_rows"]

#: Names a file whose existence asks every in-process run (of this process and of the processes it starts) to stop at
#: the end of its current segment: the checkpoint is written, no iteration after it runs, and the run's status is
#: ``"stopped"``.  ``flower-dp reproduce`` sets it to ``OUT/STOP`` for its runs (``touch OUT/STOP`` ends a sweep
#: without losing or double-charging anything; the same command resumes).
STOP_FILE_ENV = "FLOWER_DP_STOP_FILE"


def stop_requested() -> bool:
    """Whether the file named by :data:`STOP_FILE_ENV` exists (a stop at the end of the current segment)."""
    path = os.environ.get(STOP_FILE_ENV)
    return bool(path) and Path(path).exists()


def completed_status(num_iters_run: int, num_iters_requested: int) -> str:
    """The status of a run that has run every iteration of its plan: ``finished`` or ``stopped_by_budget``.

    Fewer iterations run than the config asked for -> ``stopped_by_budget``; as many or more -> ``finished``.  What
    cuts K short is the privacy budget's pre-flight truncation (``budget_epsilon``,
    :func:`flower_dp.clients.registry.prepare`).  PrivSGP-VR's K* (``kstar_A``/``kstar_L``, eq. 12) replaces the
    requested K by its own: a K* above the request is ``finished``; one below it reads ``stopped_by_budget``, as a
    budget stop does (the plan's warnings name the cause).
    """
    return FINISHED if int(num_iters_run) >= int(num_iters_requested) else STOPPED_BY_BUDGET


def status_of_stop_reason(stop_reason: str) -> str:
    """The status of a round-by-round run (GauLRQ) from its ``stop_reason``: ``completed`` -> finished,
    ``budget: ...`` -> stopped_by_budget, ``should_stop: ...`` -> stopped, ``failed: ...`` -> failed, else running."""
    for prefix, status in (("completed", FINISHED), ("budget:", STOPPED_BY_BUDGET), ("should_stop:", STOPPED),
                           ("failed:", FAILED)):
        if stop_reason.startswith(prefix):
            return status
    return RUNNING


def save_round(recorder: RunRecorder, document: dict[str, Any], checkpoint: dict[str, Any] | None = None) -> None:
    """Record a round-by-round run after a round (or at its end): its checkpoint state (given) and its results
    document, whose ``"status"`` is decided here from its ``"stop_reason"`` (:func:`status_of_stop_reason`)."""
    if checkpoint is not None:
        recorder.save_checkpoint(checkpoint)
    recorder.write(with_status(document))


def with_status(document: dict[str, Any]) -> dict[str, Any]:
    """A round-by-round run's results ``document`` with its ``"status"``, decided from its ``"stop_reason"``."""
    return {**document, "status": status_of_stop_reason(str(document.get("stop_reason", "")))}


#: Restores every node at the start of the segment about to run: ``() -> {node_id: state}`` (see :func:`run_segments`).
Restore = Callable[[], dict[int, Any]]


class SegmentBackend(Protocol):
    """What :func:`run_segments` drives: n push-sum nodes that run segments of iterations where they live.

    ``start(k, restore)`` sets the nodes up (``k == 0``) or loads the states ``restore()`` returns (iteration ``k``,
    already charged for a replay).  ``run_segment(k0, k1, debug_metrics=..., restore=...)`` runs iterations
    ``k0 .. k1 - 1`` and returns a :class:`~flower_dp.gossip.protocol.SegmentResult`; a backend that can lose its
    nodes mid-segment may restart them and call ``restore()`` for their states at ``k0``.  ``network_average()``
    (float32 flat vector), ``privacy_reports()`` and ``state_dicts()`` (``{node_id: ...}``) answer for the state
    after the last segment; ``shutdown()`` releases what the backend holds.
    """

    def start(self, k: int, restore: Restore) -> None: ...

    def run_segment(self, k0: int, k1: int, *, debug_metrics: bool, restore: Restore) -> Any: ...

    def network_average(self) -> Any: ...

    def privacy_reports(self) -> dict[int, dict[str, Any]]: ...

    def state_dicts(self) -> dict[int, Any]: ...

    def shutdown(self) -> None: ...


@dataclass(frozen=True)
class SegmentPlan:
    """The public schedule of a run: how many iterations, in segments of how many.

    Attributes
    ----------
    n_nodes : int
    num_iters : int
        K, the iterations the run executes (after the budget's pre-flight truncation).
    iters_per_segment : int
        Iterations per segment (``run.eval_every``; one Flower round).
    num_iters_requested : int
        K the config asked for (:func:`completed_status` compares the two).
    num_segments : int, optional
        Run at most this many segments (Flower's ``num_rounds``); default all of them.
    replay_plan : object, optional
        The nodes' plan (:class:`flower_dp.clients.base.Plan`): a secret-mode restore charges the segment after the
        checkpoint again with it (:func:`~flower_dp.privacy.budget.charge_replay`); None charges nothing.
    flower_rows : bool
        The history rows of the Flower strategy (``round``, ``k``, ``bits_total``, metrics, evaluation under
        ``"eval"``) instead of the in-process runner's (``k``, evaluation, ``bits_total``, metrics).
    budget_cut : bool, optional
        An asynchronous run (:class:`flower_dp.gossip.asynchronous.AsyncSegments`), whose segments are virtual-time
        windows, not iterations: whether the budget's pre-flight truncation cut the nodes' K (a completed run is then
        ``stopped_by_budget``, else ``finished``).  None: :func:`completed_status` of ``num_iters`` and
        ``num_iters_requested``.
    """

    n_nodes: int
    num_iters: int
    iters_per_segment: int
    num_iters_requested: int
    num_segments: int | None = None
    replay_plan: Any = None
    flower_rows: bool = False
    budget_cut: bool | None = None

    def segments(self) -> Iterator[tuple[int, int, int]]:
        """``(round, k0, k1)`` of every segment, round counted from 1."""
        rounds = -(-self.num_iters // self.iters_per_segment) if self.num_segments is None else self.num_segments
        for rnd in range(1, int(rounds) + 1):
            k0 = (rnd - 1) * self.iters_per_segment
            k1 = min(self.num_iters, k0 + self.iters_per_segment)
            if k0 >= k1:
                return
            yield rnd, k0, k1


@dataclass(frozen=True)
class RunHeader:
    """What a results document says besides the run's progress: who ran what, where (built by the caller when the
    document is written, so that values known late, such as the nodes' devices, are current)."""

    name: str
    backend: str
    algorithm: str
    config: Mapping[str, Any]
    seed: Any
    noise: Mapping[str, Any]
    released: Mapping[str, Any]
    plan_summary: Mapping[str, Any]
    num_iters_requested: int
    num_iters: int
    iters_per_round: int | None = None
    info: Mapping[str, Any] | None = None
    extras: Mapping[str, Any] = field(default_factory=dict)
    #: the party the run is calibrated to (:mod:`flower_dp.privacy.parties`), the transport that carries the shares
    #: (``"inprocess"``, ``"ray"``, ``"relay"``) and whether the nodes' states come back to the server
    party: str = "out_neighbour"
    transport: str | None = None
    states_to_server: bool = False


@dataclass
class RunProgress:
    """A run's state between segments: the history, the bits and privacy spent so far, the last network average."""

    n_nodes: int
    k: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    bits: np.ndarray = None  # type: ignore[assignment]
    privacy: list[dict[str, Any]] = field(default_factory=list)
    train_cpu_s: float = 0.0
    last_average: Any = None
    status: str = RUNNING
    error: str | None = None
    stop_reason: str | None = None
    started: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        if self.bits is None:
            self.bits = np.zeros(self.n_nodes, dtype=np.int64)

    def checkpoint_state(self, states: dict[int, Any]) -> dict[str, Any]:
        return {"k": self.k, "nodes": [states[i] for i in range(self.n_nodes)], "history": list(self.history),
                "bits": self.bits.tolist(), "privacy": self.privacy, "train_cpu_s": self.train_cpu_s}

    def load(self, ck: Mapping[str, Any]) -> None:
        self.k = int(ck["k"])
        self.history = list(ck["history"])
        self.bits = np.asarray(ck["bits"], dtype=np.int64)
        self.privacy = list(ck.get("privacy") or [])
        self.train_cpu_s = float(ck.get("train_cpu_s", 0.0))


def flat_rows(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """History rows as published: a row's ``"eval"`` entries moved into the row itself."""
    return [{**{key: v for key, v in row.items() if key != "eval"}, **(row.get("eval") or {})} for row in history]


def results_document(header: RunHeader, progress: RunProgress) -> dict[str, Any]:
    """The results document of a segment-by-segment run (``results.json``; its layout: :mod:`flower_dp.results`)."""
    doc: dict[str, Any] = {"name": header.name, "status": progress.status, "error": progress.error,
                           "config": dict(header.config), "seed": header.seed, "noise": dict(header.noise),
                           "algorithm": header.algorithm, "backend": header.backend,
                           "num_iters_requested": int(header.num_iters_requested), "num_iters": int(header.num_iters)}
    if header.iters_per_round is not None:
        doc["iters_per_round"] = int(header.iters_per_round)
    if header.info is not None:
        doc["info"] = dict(header.info)
    doc["history"] = flat_rows(progress.history)
    doc.update(header.released)
    doc["privacy"] = {"per_node": progress.privacy, "plan": dict(header.plan_summary)}
    doc["party"] = header.party
    doc["eps_by_party"] = push_sum_eps_by_party_from_reports(progress.privacy, transport=header.transport,
                                                             states_to_server=header.states_to_server)
    doc["bits_sent_per_node"] = progress.bits.tolist()
    doc["wall_time_s"] = time.perf_counter() - progress.started
    if progress.stop_reason is not None:
        doc["stop_reason"] = progress.stop_reason
    doc.update(header.extras)
    doc["versions"] = rio.versions()
    return doc


class _Restorer:
    """The nodes' states at the start of a segment: from the last checkpoint (file or, without one, memory), charged
    again for the segment a lost run may have sent (secret mode)."""

    def __init__(self, recorder: RunRecorder, plan: SegmentPlan, keep_in_memory: bool) -> None:
        self.recorder, self.plan, self.keep_in_memory = recorder, plan, keep_in_memory
        self.snapshot: dict[str, Any] | None = None

    def keep(self, state: dict[str, Any]) -> None:
        if self.recorder.checkpoint:
            self.recorder.save_checkpoint(state)
            self.snapshot = None  # restore from the checksummed file
        elif self.keep_in_memory:
            self.snapshot = state

    def states_at(self, k0: int, *, replayed: bool = True) -> dict[int, Any]:
        ck = self.snapshot
        if ck is None or int(ck["k"]) != k0:
            if not self.recorder.checkpoint:
                raise CheckpointError(f"no checkpoint at k={k0} to restore the nodes from, got none; run with an "
                                      "out_dir and checkpoint=True")
            ck = self.recorder.load_checkpoint()  # refuses a corrupted file (checksum) or another run's
        if int(ck["k"]) != k0:
            raise CheckpointError(f"the checkpoint in {self.recorder.where} is at k={ck['k']}, the nodes must be "
                                  f"restored at k={k0}; got a stale file, start a new out_dir")
        if self.recorder.checkpoint:  # the identity known now (e.g. the devices the nodes came up on) must match
            self.recorder.check_identity(ck)
        states = {i: st for i, st in enumerate(ck["nodes"])}
        plan = self.plan.replay_plan
        if replayed and plan is not None:  # secret mode: the steps after the checkpoint are charged again
            k1 = min(self.plan.num_iters, k0 + self.plan.iters_per_segment)
            states = {i: charge_replay(st, plan, i, k0, k1) for i, st in states.items()}
        return states


def _row(plan: SegmentPlan, rnd: int, k: int, bits_total: int, means: dict[str, float],
         evaluation: dict[str, float] | None) -> dict[str, Any]:
    if plan.flower_rows:
        row: dict[str, Any] = {"round": rnd, "k": k, "bits_total": bits_total, **means}
        if evaluation:
            row["eval"] = {key: float(v) for key, v in evaluation.items()}
        return row
    return {"k": k, **(evaluation or {}), "bits_total": bits_total, **means}


def run_segments(backend: SegmentBackend, plan: SegmentPlan, *, recorder: RunRecorder,
                 header: Callable[[RunProgress], RunHeader],
                 evaluate: Callable[[int, Any], dict[str, float] | None] | None = None, resume: bool = False,
                 should_stop: Callable[[int, RunProgress], bool] | None = None,
                 stop_file: Callable[[], bool] | None = None,
                 debug_metrics: bool = False, keep_states: bool | None = None,
                 on_segment: Callable[[int, int, int, RunProgress], None] | None = None,
                 upgrade: Callable[[dict[str, Any]], None] | None = None,
                 progress: RunProgress | None = None) -> RunProgress:
    """Run ``plan``'s segments on ``backend``, recording each, and return the run's progress.

    Parameters
    ----------
    backend : SegmentBackend
    plan : SegmentPlan
    recorder : RunRecorder
        Where the results document and the checkpoints go (its identity stamps every checkpoint).
    header : callable (progress) -> RunHeader
        The document's description of the run, asked at every write.
    evaluate : callable (round, network average) -> dict, optional
        Evaluation of the network-average model after each segment (a row's evaluation entries).
    resume : bool
        Continue from the recorder's checkpoint (same identity); in secret mode the segment after it is charged
        again, unless the run stopped cleanly right there.
    should_stop : callable (round, progress) -> bool, optional
        Asked after each segment's checkpoint: True ends the run there, cleanly (status ``"stopped"``,
        ``stop_reason = "should_stop: round r"``); after the last segment the run is complete whatever it answers.
    stop_file : callable () -> bool, optional
        Also stop cleanly when it answers True after a segment (with a checkpoint only; :func:`stop_requested`: the
        file named by :data:`STOP_FILE_ENV` exists).
    debug_metrics : bool
        Passed to the backend: also return the nodes' uncharged training statistics.
    keep_states : bool, optional
        Ask the backend for the nodes' states after each segment even without a checkpoint file (kept in memory for
        a backend's restart); default: only for the checkpoint.
    on_segment : callable (round, k0, k1, progress), optional
        Called after each segment's row is recorded, before the results are written.
    upgrade : callable (checkpoint) -> None, optional
        Fills in what older checkpoints lack before they are checked.
    progress : RunProgress, optional
        The object to record into (a caller that reads the history while the run goes).

    A run that fails after its start writes ``status = "failed"`` with the error, then re-raises; the backend is
    shut down in every case.
    """
    prog = progress if progress is not None else RunProgress(plan.n_nodes)
    keep = recorder.checkpoint if keep_states is None else bool(keep_states) or recorder.checkpoint
    restorer = _Restorer(recorder, plan, keep_in_memory=keep)

    def write() -> None:
        recorder.write(results_document(header(prog), prog), flat_rows(prog.history))

    clean_at = recorder.take_clean_stop()  # consumed before any iteration: it vouches for one checkpoint only
    started = False
    try:
        if resume:
            if recorder.out_dir is None:
                raise ValueError("resume=True needs an out_dir holding a checkpoint; got out_dir=None")
            restorer.snapshot = recorder.load_checkpoint(upgrade=upgrade)
            prog.load(restorer.snapshot)
        k_start = prog.k  # the nodes are restored even at the end (a resumed finished run reports their state)
        replayed = clean_at != k_start
        backend.start(k_start, lambda: restorer.states_at(k_start, replayed=replayed) if k_start else {})
        started = True
        for rnd, k0, k1 in plan.segments():
            if k1 <= prog.k:
                continue  # finished before the resume
            c0 = time.process_time()
            seg = backend.run_segment(k0, k1, debug_metrics=debug_metrics,
                                      restore=lambda k0=k0: restorer.states_at(k0) if k0 else {})
            prog.train_cpu_s += time.process_time() - c0
            prog.bits += np.asarray(seg.bits_sent, dtype=np.int64)
            prog.k = k1
            avg = backend.network_average()
            if not bool(avg.isfinite().all()):
                raise NonFiniteError(f"the network-average model became non-finite by iteration {k1 - 1}",
                                     step=k1 - 1)
            prog.last_average = avg
            prog.privacy = [dict(r, node=i) for i, r in sorted(backend.privacy_reports().items())]
            ev = evaluate(rnd, avg) if evaluate is not None else None
            prog.history.append(_row(plan, rnd, k1, int(prog.bits.sum()), seg.metric_means(), ev))
            if keep:
                restorer.keep(prog.checkpoint_state(backend.state_dicts()))
            if on_segment is not None:
                on_segment(rnd, k0, k1, prog)
            asked = should_stop is not None and should_stop(rnd, prog)  # asked every segment, the last one too
            if k1 < plan.num_iters and asked:
                prog.stop_reason = f"should_stop: round {rnd}"
            elif k1 < plan.num_iters and stop_file is not None and recorder.checkpoint and stop_file():
                prog.stop_reason = f"stop file: round {rnd}"
            if prog.stop_reason is not None:
                recorder.mark_clean_stop(k1)  # after the checkpoint: nothing runs after k1
                prog.status = STOPPED
                break
            write()
        else:
            prog.status = (completed_status(plan.num_iters, plan.num_iters_requested) if plan.budget_cut is None
                           else STOPPED_BY_BUDGET if plan.budget_cut else FINISHED)
    except Exception as exc:
        prog.status, prog.error = FAILED, f"{type(exc).__name__}: {exc}"
        if started or prog.history:  # a run refused before its start leaves no document
            write()
        raise
    finally:
        backend.shutdown()
    write()
    return prog
