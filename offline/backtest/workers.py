"""Folds in worker processes: ``backtest --jobs N`` trains up to N folds at once, each in a process of its own that
runs it as one process would (``offline.backtest.results.run_fold``), with the torch threads every fold gets
(``offline.backtest.placement``).

Workers are spawned, not forked (a fork would copy torch's thread pools, and CUDA's state, half made), live for the
whole backtest and take one fold after another. The backtest's process and a worker speak JSON over a pipe, never
pickles: the backtest sends a fold or a stop; the worker sends what its fold does (each generation, each line of its
run) and how it ended: its result, stopped at a safe point, refused as bad input (one line), or a crash (a
traceback). A worker whose pipe ends without a word died (killed, out of memory): that is a crash too.

Stops: a terminal sends Ctrl-C to every process of its group, so a worker ignores SIGINT and the backtest relays the
stop, once (a second Ctrl-C ends the backtest at once, killing its workers). A SIGTERM to a worker alone stops its
fold, and with it the backtest. A worker dies with the backtest's process (``PR_SET_PDEATHSIG`` on Linux, elsewhere
at its next safe point), so a killed backtest leaves no fold training beside the command that continues it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import multiprocessing
import os
import signal
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import torch

from config import Config
from offline.backtest.plan import Fold
from offline.backtest.progress import FoldBoard
from offline.backtest.results import run_fold
from run.trainer import RunStopped
from runtime.sharding import LAUNCH_VARIABLES
from utils.errors import InputError
from utils.signals import StopRequest

PR_SET_PDEATHSIG = 1
"""Linux's prctl option: the signal a process gets when its parent dies."""
POLL_S = 0.2
"""How often the backtest looks at its own stop request between the workers' messages."""
LEAVE_S = 60.0
"""How long a worker the backtest hung up on has to leave before it is killed."""


class FoldsStopped(Exception):  # noqa: N818 (a stop, not an error)
    """A stop was asked (signal ``signum``; 0: asked of another process of the job, whose signal is unknown here);
    ``folds`` were running and keep their last checkpoint."""

    def __init__(self, signum: int, folds: list[str]) -> None:
        super().__init__(f"stopped by signal {signum} in {', '.join(folds) or 'no fold'}")
        self.signum, self.folds = signum, folds

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""


class FoldCrashedError(Exception):
    """A fold's worker failed with a bug or died (killed, out of memory); the message names the fold."""


# ---------------------------------------------------------------------------------------------- in a worker


def work(conn: Connection, parent: int, threads: int, gpu: str | None) -> None:
    """A worker process's life: folds read from ``conn`` one after another until the backtest hangs up.

    Args:
        conn: its end of the pipe to the backtest's process.
        parent: the backtest's process id.
        threads: torch's intra-op threads for every fold.
        gpu: its ``CUDA_VISIBLE_DEVICES`` (one GPU), or None to leave it.
    """
    _die_with(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    terminated: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: terminated.append(signum))
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # the backtest's stdout holds its report alone (--json)
    for name in LAUNCH_VARIABLES:  # under torchrun too, a fold is a one-process run
        os.environ.pop(name, None)
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu  # read when CUDA starts, on the fold's first use of it
    torch.set_num_threads(threads)
    asked: list[bool] = []

    def should_stop() -> bool:
        if not asked and (os.getppid() != parent or _stop_arrived(conn)):
            asked.append(True)
        return bool(asked or terminated)

    def send(message: dict[str, Any]) -> None:
        conn.send_bytes(json.dumps(message, allow_nan=False).encode())

    while True:
        try:
            message = json.loads(conn.recv_bytes())
        except EOFError:
            return
        if "fold" not in message:
            continue  # a stop that came as its fold ended
        folder, fold = Path(message["folder"]), _fold_from(message["fold"])
        try:
            result = run_fold(
                folder,
                fold,
                log=lambda line: send({"log": line}),
                should_stop=should_stop,
                on_generation=lambda row: send({"generation": row["generation"]}),
            )
        except RunStopped:
            send({"stopped": terminated[0] if terminated else 0})
        except InputError as error:
            send({"refused": str(error)})
        except Exception:
            send({"crashed": traceback.format_exc()})
            sys.exit(1)
        else:
            send({"done": result})


def _die_with(parent: int) -> None:
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the line above took effect
        os._exit(1)


def _stop_arrived(conn: Connection) -> bool:
    """Whether the backtest asked this worker's fold to stop (or hung up), without waiting."""
    if not conn.poll():
        return False
    try:
        return "stop" in json.loads(conn.recv_bytes())
    except EOFError:
        return True


def _fold_document(fold: Fold) -> dict[str, Any]:
    return {
        "year": fold.year,
        "seed": fold.seed,
        "config": fold.config.to_dict(),
        "fingerprint": fold.fingerprint,
        "num_assets": fold.num_assets,
        "num_features": fold.num_features,
        "tradable_mask": fold.tradable_mask,
    }


def _fold_from(document: dict[str, Any]) -> Fold:
    return Fold(
        document["year"],
        document["seed"],
        Config.from_dict(document["config"]),
        document["fingerprint"],
        document["num_assets"],
        document["num_features"],
        document["tradable_mask"],
    )


# ---------------------------------------------------------------------------------------------- the backtest's side


@dataclass(eq=False)
class _Worker:
    process: Any  # multiprocessing's SpawnProcess
    conn: Connection
    fold: Fold | None = None
    """The fold it runs, None when idle."""
    ended: bool = False
    """Its pipe is closed: the backtest hung up, or the worker left."""
    crashed: bool = False


class WorkerPool:
    """Folds in worker processes, one at a time in each, and their results.

    Args:
        folder: the backtest's folder.
        threads: torch threads of every worker.
        gpus: each worker's ``CUDA_VISIBLE_DEVICES`` (None: as this process's), one entry per worker.
        board: where the folds' generations and lines go.
        stop: this process's stop request (SIGTERM, Ctrl-C).
        exchange: under torchrun, this process's status in, every process's out (``offline.backtest.spread``);
            called every ``exchange_s`` seconds by every process, so that all of them stop, fail or finish as one.
    """

    def __init__(
        self,
        folder: Path,
        *,
        threads: int,
        gpus: Sequence[str | None],
        board: FoldBoard,
        stop: StopRequest,
        exchange: Callable[[dict[str, Any]], list[dict[str, Any]]] | None = None,
        exchange_s: float = 1.0,
    ) -> None:
        self.folder, self.threads, self.gpus = folder, threads, list(gpus)
        self.board, self.stop = board, stop
        self.exchange, self.exchange_s = exchange, exchange_s

    def run(self, folds: Sequence[Fold]) -> dict[str, dict[str, Any]]:
        """Train ``folds``; their results by fold name.

        Raises:
            FoldsStopped: a stop was asked (here, of a worker, or of another process of the job); every running
                fold stopped at its next safe point.
            InputError: a worker refused its fold as bad input; the others stopped at their next safe point.
            FoldCrashedError: a worker failed with a bug or died; the others stopped at their next safe point.
        """
        self.pending = deque(folds)
        self.workers: list[_Worker] = []
        self.results: dict[str, dict[str, Any]] = {}
        self.signum, self.halted = 0, False
        self.stopped: list[str] = []
        self.failure: Exception | None = None
        context = multiprocessing.get_context("spawn")
        try:
            for gpu in self.gpus[: len(self.pending)]:
                ours, theirs = context.Pipe()
                process = context.Process(
                    target=work, args=(theirs, os.getpid(), self.threads, gpu), name="backtest-worker", daemon=True
                )
                process.start()
                theirs.close()  # its end lives in the worker now: the pipe ends when the worker does
                self.workers.append(_Worker(process, ours))
            for worker in self.workers:
                self._give(worker)
            statuses = self._supervise()
        except BaseException:  # a second Ctrl-C, or a bug here: every worker ends now
            for worker in self.workers:
                worker.process.kill()
            raise
        finally:
            for worker in self.workers:
                self._hang_up(worker)
                worker.process.join(timeout=LEAVE_S)
                if worker.process.is_alive():
                    worker.process.kill()
                    worker.process.join()
        return self._outcome(statuses)

    def _supervise(self) -> list[dict[str, Any]]:
        """Read the workers until every fold here, and under torchrun everywhere, is done or stopped; the last
        statuses (every process's, or this one's)."""
        next_exchange = time.monotonic()
        while True:
            wait([w.conn for w in self.workers if not w.ended], timeout=POLL_S)
            for worker in self.workers:
                while not worker.ended and worker.conn.poll():
                    self._receive(worker)
            running = any(w.fold is not None for w in self.workers)
            if self.stop.signum and not self.halted and (running or self.pending):
                self._halt(self.stop.signum)
            quiet = not running and (self.halted or not self.pending)
            if self.exchange is None:
                if quiet:
                    return [self._status(quiet)]
                continue
            if time.monotonic() < next_exchange:
                continue
            next_exchange = time.monotonic() + self.exchange_s
            statuses = self.exchange(self._status(quiet))
            signum = max(s["signum"] for s in statuses)
            if not self.halted and (signum or any(s["failure"] for s in statuses)):
                self._halt(signum)
            if all(s["quiet"] for s in statuses):
                return statuses

    def _status(self, quiet: bool) -> dict[str, Any]:
        failure = None if self.failure is None else ("input" if isinstance(self.failure, InputError) else "crash")
        return {"quiet": quiet, "signum": self.signum, "failure": failure, "stopped": self.stopped}

    def _receive(self, worker: _Worker) -> None:
        try:
            message = json.loads(worker.conn.recv_bytes())
        except (EOFError, OSError):
            self._gone(worker)
            return
        fold = worker.fold
        assert fold is not None, f"a worker spoke without a fold: {sorted(message)}"
        if "generation" in message:
            self.board.generation(fold, message["generation"])
            return
        if "log" in message:
            self.board.log(fold, message["log"])
            return
        worker.fold = None
        if "done" in message:
            self.results[fold.name] = message["done"]
            self.board.finished(fold, message["done"])
        else:
            self.board.left(fold)
        if "stopped" in message:
            self.stopped.append(fold.name)
            self._halt(message["stopped"])
        elif "refused" in message:
            self._fail(InputError(f"{fold.name}: {message['refused']}"))
        elif "crashed" in message:
            worker.crashed = True
            sys.stderr.write(message["crashed"])
            self._fail(FoldCrashedError(f"{fold.name} failed in its worker process with the error above{_KEPT}"))
        self._give(worker)

    def _gone(self, worker: _Worker) -> None:
        """The worker's pipe ended without a word: it died (a crash already said so)."""
        self._hang_up(worker)
        if worker.crashed:
            return
        worker.process.join(timeout=5.0)
        how = _exit_text(worker.process.exitcode)
        if worker.fold is not None:
            fold, worker.fold = worker.fold, None
            self.board.left(fold)
            self._fail(FoldCrashedError(f"the worker process running {fold.name} died ({how}){_KEPT}"))
        else:
            self._fail(FoldCrashedError(f"a worker process died between folds ({how}){_KEPT}"))

    def _give(self, worker: _Worker) -> None:
        """The next fold to an idle worker; with none left (or the backtest halted), hang up: it leaves."""
        if worker.ended:
            return
        if not self.pending or self.halted:
            self._hang_up(worker)
            return
        fold = self.pending.popleft()
        worker.fold = fold
        worker.conn.send_bytes(json.dumps({"folder": str(self.folder), "fold": _fold_document(fold)}).encode())
        self.board.started(fold)

    @staticmethod
    def _hang_up(worker: _Worker) -> None:
        if not worker.ended:
            worker.ended = True
            worker.conn.close()

    def _halt(self, signum: int) -> None:
        """No fold starts any more; the running ones stop at their next safe point."""
        self.signum = self.signum or signum
        if self.halted:
            return
        self.halted = True
        self.pending.clear()
        for worker in self.workers:
            if worker.fold is None:
                self._hang_up(worker)
                continue
            with contextlib.suppress(OSError):  # it is dying: its end of the pipe says so next
                worker.conn.send_bytes(json.dumps({"stop": True}).encode())

    def _fail(self, error: Exception) -> None:
        if self.failure is None:
            self.failure = error
        self._halt(0)

    def _outcome(self, statuses: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        if self.failure is not None:
            raise self.failure
        failed = [(rank, s["failure"]) for rank, s in enumerate(statuses) if s["failure"]]
        if failed:
            rank, kind = failed[0]
            message = f"process {rank} of the backtest failed with the error it printed{_KEPT}"
            raise InputError(message) if kind == "input" else FoldCrashedError(message)
        signum = max(s["signum"] for s in statuses)
        if signum or any(s["stopped"] for s in statuses):
            raise FoldsStopped(signum, [name for s in statuses for name in s["stopped"]])
        return self.results


_KEPT = (
    "; the other running folds stopped at a safe point, finished folds and the last checkpoints are kept: "
    "run the same command to continue"
)


def _exit_text(exitcode: int | None) -> str:
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        return f"killed by {signal.Signals(-exitcode).name}"
    return f"exit status {exitcode}"
