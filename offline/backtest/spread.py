"""A backtest over the processes of a ``torchrun`` job: each process (on a GPU pod, one GPU each) trains its part of
the folds as one-process runs, in worker processes of its own (``--jobs`` of them), and the leader writes the report.

* The folds are dealt in plan order, one to each process in turn (``placement.folds_of``): a job started again with
  the same number of processes gives every fold the process, and so the node, that holds its checkpoint.
* Every process checks what it was given before anything is written: the leader's plan on the leader's market, its
  own copy of the backtest's folder (on several nodes the folder need not be shared: each node writes the runs and
  results of its folds), its device's memory. A refusal in any process ends all of them with status 2.
* While the folds train, the processes exchange a small JSON status every second: a stop or a failure in one reaches
  all, a lost node ends the others within ``runtime.collective_timeout_s``, and the leader shows every process's
  folds and lines.
* At the end every fold result travels to the leader as JSON bytes over the host group (``Ranks.gather_bytes``, never
  pickles), and the leader writes the summary, the table and the plot.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from offline.backtest.progress import FoldBoard
from runtime.sharding import Ranks
from utils.errors import ConfigError, InputError

T = TypeVar("T")


def agree(ranks: Ranks, check: Callable[[], T]) -> T:
    """``check()`` on every process, and its value; if it refused (an InputError) in any of them, every process
    raises: the one that refused with its own message, the others naming the first that refused and why."""
    try:
        value, refusal = check(), None
    except InputError as error:
        value, refusal = None, error
    said = json.dumps(None if refusal is None else str(refusal)).encode()
    refusals = [json.loads(part) for part in ranks.gather_bytes(said)]
    if refusal is not None:
        raise refusal
    for rank, message in enumerate(refusals):
        if message is not None:
            raise InputError(f"process {rank} of the backtest refused it: {message}")
    return value  # type: ignore[return-value]


def require_leaders_plan(ranks: Ranks, plan: dict[str, Any]) -> None:
    """A ConfigError on a process whose settings or data give another plan (or market) than the leader's: a summary
    describes one plan on one market."""
    mine = json.dumps(plan, sort_keys=True).encode()
    if ranks.broadcast_bytes(mine if ranks.is_leader else None) != mine:
        raise ConfigError(
            f"process {ranks.rank} plans another backtest than the leader (its data or settings differ); give every "
            "node the same data and the same command"
        )


def status_exchange(ranks: Ranks, board: FoldBoard) -> Callable[[dict[str, Any]], list[dict[str, Any]]]:
    """What ``WorkerPool`` calls every second under torchrun: this process's status (with its board's new lines,
    running folds and count of finished folds) for every process's; the leader's board shows the others'."""

    def exchange(status: dict[str, Any]) -> list[dict[str, Any]]:
        mine = {**status, "lines": board.outbox, "running": board.running, "done": board.done}
        board.outbox = []
        statuses = [json.loads(part) for part in ranks.gather_bytes(json.dumps(mine).encode())]
        if ranks.is_leader:
            others = statuses[1:]
            board.elsewhere(
                [line for s in others for line in s["lines"]],
                {name: state for s in others for name, state in s["running"].items()},
                sum(s["done"] for s in others),
            )
        return statuses

    return exchange


def gather_results(ranks: Ranks, results: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every process's fold results (by fold name), as JSON bytes, merged."""
    merged: dict[str, dict[str, Any]] = {}
    for part in ranks.gather_bytes(json.dumps(results, allow_nan=False).encode()):
        merged.update(json.loads(part))
    return merged
