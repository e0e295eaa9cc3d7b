"""The round loop of :class:`flower_dp.strategies.GauLRQ`: Flower's ``Strategy.start`` template with a clean stop.

:class:`RoundLoop` runs the rounds as FedAvg's ``start`` does (its logging and summary): configure, send, aggregate,
evaluate on the clients and on the server, then record the round (``results.json`` and the checkpoint, through
:func:`flower_dp.engine.save_round`).  It stops cleanly, with the results saved, when the next round would exceed
the budget, when ``should_stop`` says so, or after an error (which it re-raises).
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from logging import INFO, WARNING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from flower_dp._checks import check_int
from flower_dp.errors import BudgetExceededError

from ._grid import exchange

__all__ = ["RoundLoop"]


class RoundLoop:
    """``GauLRQ.start`` and its parts (a mixin of :class:`flower_dp.strategies.GauLRQ`)."""

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int | None = None, timeout: float = 3600,
              train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
              should_stop: Callable[[int, Result], bool] | None = None) -> Result:
        """Flower's template loop (FedAvg's signature, logging and summary), stopping cleanly when the budget is spent.

        ``should_stop(round, result)`` (Flower 1.43's early stop, accepted on 1.42 too): called after each round;
        True ends the loop there with the results saved and ``stop_reason = "should_stop: round r"``.

        ``num_rounds``: None runs the K rounds given to GauLRQ (Flower's default 3 when neither is given); a
        GauLRQ built without ``num_rounds`` plans its schedule for this many rounds.  The budget stop (the next
        round would exceed ``epsilon``, Flower's accountant's ``max_epsilon``, or K) ends the loop with the
        results saved and ``stop_reason = "budget: ..."``; ``Result`` holds the rounds done.  Per round,
        ``result.evaluate_metrics_serverapp[r]`` gets the privacy spent (class docstring) beside ``evaluate_fn``'s
        metrics.  With ``out_dir`` a checkpoint is written after every round; with ``resume=True`` the loop
        continues from it (``initial_arrays`` is then only used when no round was completed).  If anything else
        raises, the results so far are saved with ``stop_reason = "failed: ..."`` and the exception propagates.
        """
        num_rounds = self._prepare_start(num_rounds, initial_arrays, timeout, train_config, evaluate_config)
        train_config = ConfigRecord() if train_config is None else train_config
        evaluate_config = ConfigRecord() if evaluate_config is None else evaluate_config
        arrays, first = initial_arrays, 1
        if self.resume:
            arrays, first = self._restore(initial_arrays)
            log(INFO, "GauLRQ: resuming from %s at round %d", self.out_dir, first)
        result = Result(arrays=arrays)
        self._fill_result(result)
        self.stop_reason = "running"
        t_start = time.time()
        try:
            if evaluate_fn and first == 1:
                res = evaluate_fn(0, arrays)
                log(INFO, "Initial global evaluation results: %s", res)
                if res is not None:
                    self.initial_evaluate = dict(res)
                    result.evaluate_metrics_serverapp[0] = res
            for rnd in range(first, num_rounds + 1):
                log(INFO, "")
                log(INFO, "[ROUND %s/%s]", rnd, num_rounds)
                try:
                    messages = list(self.configure_train(rnd, arrays, train_config, grid))
                except BudgetExceededError as exc:
                    self.stop_reason = f"budget: {exc}"
                    log(INFO, "GauLRQ: stopping before round %d: %s", rnd, exc)
                    break
                arrays = self._run_round(grid, rnd, messages, arrays, result, timeout, evaluate_config, evaluate_fn)
                self.save_results(arrays)
                if should_stop is not None and should_stop(rnd, result):
                    self.stop_reason = f"should_stop: round {rnd}"
                    log(INFO, "Stopping early after round %s", rnd)
                    break
            else:
                self.stop_reason = "completed"
        except BaseException as exc:
            self.stop_reason = f"failed: {type(exc).__name__}: {exc}"
            self.save_results()  # the checkpoint of the last completed round stays as it was
            raise
        self.save_results(arrays)
        log(INFO, "")
        log(INFO, "Strategy execution finished in %.2fs", time.time() - t_start)
        log(INFO, "")
        log(INFO, "Final results:")
        log(INFO, "")
        for line in io.StringIO(str(result)):
            log(INFO, "\t%s", line.strip("\n"))
        log(INFO, "")
        return result

    def _prepare_start(self, num_rounds: int | None, initial_arrays: ArrayRecord, timeout: float,
                       train_config: ConfigRecord | None, evaluate_config: ConfigRecord | None) -> int:
        """Plan the rounds (when GauLRQ got no ``num_rounds``), log what Flower's ``start`` logs and warn about
        what the settings leave unpublished or make implausible; return the number of rounds to run."""
        if num_rounds is None:
            num_rounds = self.K if self.K is not None else 3
        num_rounds = check_int("num_rounds", num_rounds, minimum=1)
        if self.K is None:
            self._plan(num_rounds)
        log(INFO, "Starting %s strategy:", self.__class__.__name__)
        _log_start_info(num_rounds, initial_arrays, train_config, evaluate_config)
        self.summary()
        log(INFO, "")
        self._probe_timeout = float(timeout)
        self.check_learning(sum(int(np.prod(a.shape)) for a in initial_arrays.values()))
        if not self.publish_train_metrics:
            log(WARNING, "GauLRQ: the clients' train metrics (e.g. train_loss) are not published: they are statistics "
                "of the clients' private data that eps does not cover; pass train_metrics_aggr_fn (or "
                "debug_metrics=True) to publish them, uncharged")
        if self.fraction_evaluate > 0 and not self.publish_evaluate_metrics:
            log(WARNING, "GauLRQ: client-side evaluation runs (fraction_evaluate=%s) but its aggregated metrics are "
                "not published: they are statistics of the clients' private data that eps does not cover; pass "
                "evaluate_metrics_aggr_fn (or debug_metrics=True) to publish them, or fraction_evaluate=0.0 to skip "
                "client-side evaluation", self.fraction_evaluate)
        return num_rounds

    def _run_round(self, grid: Grid, rnd: int, messages: list, arrays: ArrayRecord, result: Result, timeout: float,
                   evaluate_config: ConfigRecord, evaluate_fn) -> ArrayRecord:
        """One round after its train messages are made: train, aggregate, evaluate; return theta after it."""
        log(INFO, "configure_train: Sampled %s nodes (out of %s)", len(messages), self.N)
        replies = exchange(grid, messages, timeout)
        agg, train_metrics = self.aggregate_train(rnd, replies)
        if agg is not None:
            result.arrays = arrays = agg
        if train_metrics is not None:
            log(INFO, "\t└──> Aggregated MetricRecord: %s", train_metrics)
            result.train_metrics_clientapp[rnd] = train_metrics
        ev_replies = exchange(grid, self.configure_evaluate(rnd, arrays, evaluate_config, grid), timeout)
        ev = self.aggregate_evaluate(rnd, ev_replies)
        if ev is not None and self.publish_evaluate_metrics:
            log(INFO, "\t└──> Aggregated MetricRecord: %s", ev)
            result.evaluate_metrics_clientapp[rnd] = ev
            self.rounds[-1]["evaluate_clientapp"] = dict(ev)
        if evaluate_fn:
            log(INFO, "Global evaluation")
            res = evaluate_fn(rnd, arrays)
            log(INFO, "\t└──> MetricRecord: %s", res)
            if res is not None:
                self.rounds[-1]["evaluate_serverapp"] = dict(res)
        server = self._server_metrics(self.rounds[-1])
        if server is not None:
            result.evaluate_metrics_serverapp[rnd] = server
        return arrays


def _log_start_info(num_rounds: int, arrays: ArrayRecord, train_config: ConfigRecord | None,
                    evaluate_config: ConfigRecord | None) -> None:
    """The lines Flower's ``Strategy.start`` logs before its summary."""
    log(INFO, "\t├── Number of rounds: %d", num_rounds)
    log(INFO, "\t├── ArrayRecord (%.2f MB)", sum(len(a.data) for a in arrays.values()) / (1024 ** 2))
    for name, cfg in (("train", train_config), ("evaluate", evaluate_config)):
        log(INFO, "\t├── ConfigRecord (%s): %s", name, dict(cfg) if cfg else "(empty!)")
