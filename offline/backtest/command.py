"""``python main.py backtest``'s command line: the flags, the backtest's folder opened (or continued, once it is
checked to be the same plan on the same data), every fold run (here one after another, in worker processes with
``--jobs``, or over a torchrun job's processes), and the report."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from config import DEFAULTS_CHOSEN_ON, Config, add_run_flags, conventions, flag_settings, override
from offline import tearsheet
from offline.backtest import spread
from offline.backtest.placement import (
    FOLD_THREADS,
    check_jobs_fit,
    crowding_note,
    folds_of,
    torch_threads,
    visible_device,
    worker_gpus,
)
from offline.backtest.plan import DEFAULT_FOLDS, Fold, plan_difference, plan_document, plan_folds, tuned_years
from offline.backtest.progress import FoldBoard
from offline.backtest.report import OUTPUTS, summarise, table, write_outputs
from offline.backtest.results import result_path, run_fold, stored_result
from offline.backtest.workers import FoldCrashedError, FoldsStopped, WorkerPool
from persistence import committing
from runtime.device import resolve_device
from utils.cli import ArgumentParser
from utils.errors import ConfigError, InputError
from utils.paths import file_in_the_way


@dataclass
class Opening:
    """What ``check_backtest`` found in the backtest's folder, for the folds this process runs."""

    folder: Path
    plan: bytes | None
    """plan.json to write: a new backtest (None: one being continued)."""
    notes: list[str]
    """One line for each fold result that is damaged and will be recomputed from the fold's run."""
    finished: dict[str, dict[str, Any]]
    """Results of the folds done, by fold name."""
    pending: list[Fold]
    """The folds to train (or to finish, or to score again), in plan order."""

    def begin(self) -> None:
        """Create the folder and its plan (a new backtest); a continued one has both."""
        if self.plan is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
            committing.write_file_atomically(self.folder / "plan.json", self.plan)


def check_backtest(folder: Path, config: Config, folds: list[Fold], mine: list[Fold] | None = None) -> Opening:
    """Check that ``folder`` can hold this backtest: a new one, or one that was asked the same, on the same data,
    and whose files can be used; read the results of the folds done among ``mine`` (by default all). Writes
    nothing (``Opening.begin`` does).

    Raises:
        ConfigError: ``folder`` or a folder above it is a file; it holds something other than a backtest, or a
            backtest with another plan or trained on other data; a fold result is damaged with no run left to
            recompute it; a folder stands where a file of the backtest goes.
    """
    place = file_in_the_way(folder)
    if place is not None:
        fix = "use another --name" if place == folder else "give --checkpoint-uri a folder"
        raise ConfigError(f"{place} is a file, not a folder; {fix}")
    plan = json.loads(json.dumps(plan_document(config, folds)))  # as it reads back: tuples become lists
    plan_path = folder / "plan.json"
    new = not plan_path.exists() and not plan_path.is_symlink()
    if new:
        if folder.is_dir() and any(folder.iterdir()):
            raise ConfigError(f"{folder} exists and is not a backtest; use another --name")
    else:
        _check_continued(folder, plan)
    opening = Opening(folder, None, [], {}, [])
    if new:
        opening.plan = (json.dumps(plan, indent=2, sort_keys=True) + "\n").encode()
    for fold in folds if mine is None else mine:
        result, problem = stored_result(folder, fold)
        if result is not None:
            opening.finished[fold.name] = result
        else:
            opening.pending.append(fold)
        if problem is not None:
            opening.notes.append(
                f"{result_path(folder, fold)} is not a valid fold result ({problem}); "
                f"recomputing it from the fold's run {folder / fold.name}"
            )
    return opening


def _check_continued(folder: Path, plan: dict[str, Any]) -> None:
    """An existing backtest's plan.json must hold ``plan``, and nothing may stand where its files go."""
    plan_path = folder / "plan.json"
    try:
        saved = json.loads(plan_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        saved = None
    if not isinstance(saved, dict) or not isinstance(saved.get("config"), dict) or "folds" not in saved:
        raise ConfigError(f"{plan_path} is not a backtest plan; use another --name")
    difference = plan_difference(saved, plan)
    if difference is not None:
        raise ConfigError(
            f"backtest {folder} was started with other settings: {difference}; "
            "run it with the same ones to continue it, or use another --name"
        )
    in_the_way = [folder / "folds"] if (folder / "folds").exists() and not (folder / "folds").is_dir() else []
    outputs = (*OUTPUTS, tearsheet.PAGE)
    in_the_way += [folder / name for name in outputs if (folder / name).exists() and not (folder / name).is_file()]
    if in_the_way:
        kind = "a file" if in_the_way[0].name == "folds" else "a folder"
        raise ConfigError(
            f"{in_the_way[0]} is {kind}, not the backtest's {in_the_way[0].name}; "
            "move it away and run the same command again (finished folds are kept)"
        )


def _parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="python main.py backtest",
        description="Walk-forward backtest: per test year and seed, train on the years before it, score the year.",
    )
    add_run_flags(parser)
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds, one run per seed and year (0,1,2)")
    parser.add_argument(
        "--folds",
        type=int,
        help=f"test years: the last FOLDS years of the data ({DEFAULT_FOLDS}; of the bundled data, the last that no "
        "default was chosen on)",
    )
    parser.add_argument("--years", help="comma-separated test years instead of --folds")
    parser.add_argument("--checkpoint-uri", default="runs", help="local folder the backtest folder goes in (runs)")
    parser.add_argument("--name", default="backtest", help="the backtest's folder; the same name continues it")
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="folds trained at once, each in a worker process of its own (1: one after another, in this process); "
        "under torchrun, in each process",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=FOLD_THREADS,
        help=f"torch threads of every fold ({FOLD_THREADS}): a fold's figures depend on them, never on --jobs",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.add_argument("--verbose", action="store_true", help="print every generation's line")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def _integers(text: str, flag: str) -> list[int]:
    try:
        values = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise InputError(f"{flag} expects comma-separated integers, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise InputError(f"{flag} expects comma-separated integers >= 0, got {text!r}")
    return values


def main(argv: Sequence[str]) -> int:
    """``backtest``'s command line; returns the exit status (InputError propagates to ``main.py``)."""
    from runtime.sharding import Ranks
    from utils.progress import GenerationProgress
    from utils.signals import StopRequest

    args = _parser().parse_args(list(argv))
    config, folds, folder = _plan(args)

    with contextlib.ExitStack() as stack:
        # Under torchrun, one process of several: each trains its part of the folds (offline.backtest.spread).
        ranks = Ranks.connect(timeout_s=config.runtime.collective_timeout_s) if Ranks.launched() else Ranks()
        stack.callback(ranks.close)
        # A device this machine lacks is refused before the plan is written.
        device = spread.agree(ranks, lambda: resolve_device(config.runtime.device, ranks))
        if ranks.distributed:
            plan = {**plan_document(config, folds), "markets": [fold.fingerprint for fold in folds]}
            spread.agree(ranks, lambda: spread.require_leaders_plan(ranks, plan))
        mine = folds_of(folds, ranks)
        opening = spread.agree(ranks, lambda: check_backtest(folder, config, folds, mine))
        in_process = args.jobs == 1 and not ranks.distributed  # as before --jobs: the folds one after another, here
        workers = 0 if in_process else min(args.jobs, len(opening.pending))
        gpus = worker_gpus(device, workers, ranks)
        node_processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if ranks.distributed else 1
        if workers:
            spread.agree(
                ranks,
                lambda: check_jobs_fit(
                    opening.pending, device=device, gpus=gpus, host_runs=workers * node_processes, jobs=args.jobs
                ),
            )
        opening.begin()

        stop = stack.enter_context(StopRequest())
        progress = stack.enter_context(
            GenerationProgress(enabled=not args.no_progress and ranks.is_leader, unit="fold")
        )
        # With --json, stdout holds the summary alone: the per-fold lines go to stderr.
        say = (lambda line: print(line, file=sys.stderr, flush=True)) if args.json else progress.write
        board = FoldBoard(progress, say=say, verbose=args.verbose, speaks=ranks.is_leader)
        crowded = crowding_note(workers=max(workers, 1), threads=args.threads, processes=node_processes)
        for note in _notes(config, folds, opening.notes, crowded if device.type == "cpu" and opening.pending else None):
            board.say(note)
        progress.reset(total=len(folds), initial=0)
        for fold in mine:
            if fold.name in opening.finished:
                board.finished(fold, opening.finished[fold.name])
        try:
            if in_process:
                trained = _run_here(folder, opening.pending, threads=args.threads, board=board, stop=stop)
            else:
                pool = WorkerPool(
                    folder,
                    threads=args.threads,
                    gpus=[visible_device(gpu) for gpu in gpus],
                    board=board,
                    stop=stop,
                    exchange=spread.status_exchange(ranks, board) if ranks.distributed else None,
                )
                trained = pool.run(opening.pending)
        except FoldsStopped as stopped:
            progress.close()
            where = f" in {', '.join(stopped.folds)}" if stopped.folds else ""
            if ranks.is_leader:
                say(
                    f"stopped by {stopped.name or 'a signal'}{where}; finished folds and the last checkpoints are "
                    "kept. Run the same command to continue."
                )
            return 128 + stopped.signum
        except FoldCrashedError as crashed:
            progress.close()
            print(f"error: {crashed}", file=sys.stderr, flush=True)
            return 1
        results = {**opening.finished, **trained}
        if ranks.distributed:
            results = spread.gather_results(ranks, results)
    if ranks.is_leader:
        _report(folder, config, folds, results, as_json=args.json)
    return 0


def _notes(config: Config, folds: list[Fold], opening: list[str], crowded: str | None) -> list[str]:
    """What the backtest says before it trains: the opening's notes, test years the defaults were chosen on, and a
    CPU crowded by its workers' threads."""
    notes = list(opening)
    tuned = sorted({fold.year for fold in folds} & tuned_years(config))
    if tuned:
        notes.append(
            f"note: test year(s) {', '.join(map(str, tuned))} overlap the dates the defaults were chosen on "
            f"({', '.join('..'.join(span) for span in DEFAULTS_CHOSEN_ON)}): their figures use the defaults "
            "in-sample (RESULTS.md, Years that tuned nothing)"
        )
    return notes if crowded is None else [*notes, crowded]


def _plan(args: argparse.Namespace) -> tuple[Config, list[Fold], Path]:
    """The flags checked, the config they give and its plan of folds, and the backtest's folder."""
    from config import preset

    seeds = _integers(args.seeds, "--seeds")
    years = _integers(args.years, "--years") if args.years is not None else []
    for flag, value in (("--jobs", args.jobs), ("--threads", args.threads)):
        if value < 1:
            raise InputError(f"{flag} must be >= 1, got {value}")
    if args.checkpoint_uri.startswith("gs://"):
        raise InputError("backtest writes to a local folder: give --checkpoint-uri a local path")
    if not args.name or args.name in (".", "..") or "/" in args.name or "\\" in args.name:
        raise InputError(f"--name must be a plain folder name, got {args.name!r}")
    config = override(preset(args.preset), flag_settings(args))
    folds = plan_folds(config, seeds=seeds, years=years, folds=args.folds)
    return config, folds, Path(args.checkpoint_uri) / args.name


def _report(
    folder: Path, config: Config, folds: list[Fold], results: dict[str, dict[str, Any]], *, as_json: bool
) -> None:
    """The summary, its files and the tear sheet, from the results as they read back from their files (whichever
    process or run gave them: the same summary bytes); printed as a table, or as JSON."""
    from environment.loading import benchmark_label
    from offline.evaluate import LABELS
    from offline.holdout import INDEX

    ordered = [json.loads(json.dumps(results[fold.name], allow_nan=False)) for fold in folds]
    summary = summarise(
        ordered, trading=conventions(config), alpha=config.selection.alpha, min_edge=config.selection.min_edge
    )
    label = benchmark_label(config)
    written = write_outputs(folder, summary, ordered, benchmark=label)
    # The tear sheet: the test years chained per seed, every procedure against the baselines, the summary's figures.
    labels, title = {**LABELS, INDEX: label or "index"}, f"Tear sheet: walk-forward backtest {folder}"
    sheet = tearsheet.backtest_sheet(summary, ordered, labels=labels, title=title)
    written.append(tearsheet.write_page(folder / tearsheet.PAGE, sheet))
    if as_json:
        print(json.dumps(summary, allow_nan=False))
    else:
        summary_table = table(summary, benchmark=label)
        print(f"backtest {folder}: {len(folds)} folds\n\n{summary_table}\n\nreport: {folder} ({', '.join(written)})")


def _run_here(
    folder: Path, folds: list[Fold], *, threads: int, board: FoldBoard, stop: Callable[[], bool]
) -> dict[str, dict[str, Any]]:
    """The folds one after another in this process (``--jobs 1``), with the torch threads every fold gets."""
    from run.trainer import RunStopped

    results = {}
    with torch_threads(threads):
        for fold in folds:
            board.started(fold)
            try:
                result = run_fold(
                    folder,
                    fold,
                    log=lambda line, fold=fold: board.log(fold, line),
                    should_stop=stop,
                    on_generation=lambda row, fold=fold: board.generation(fold, row["generation"]),
                )
            except RunStopped:
                raise FoldsStopped(getattr(stop, "signum", None) or 0, [fold.name]) from None
            results[fold.name] = result
            board.finished(fold, result)
    return results
