"""``python main.py backtest``'s command line: the flags, the backtest's folder opened (or continued, once it is
checked to be the same plan on the same data), every fold run, and the report."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from config import Config, add_run_flags, flag_settings, override
from offline.backtest.plan import DEFAULT_FOLDS, Fold, plan_difference, plan_document, plan_folds
from offline.backtest.report import OUTPUTS, fmt, summarise, table, write_outputs
from offline.backtest.results import result_path, run_fold, stored_result
from persistence import checkpoint
from training.setup import resolve_device
from utils.cli import ArgumentParser
from utils.errors import ConfigError, InputError
from utils.paths import file_in_the_way


def open_backtest(folder: Path, config: Config, folds: list[Fold]) -> list[str]:
    """Create ``folder`` with its plan, or check that an existing one was asked the same, on the same data, and
    that its files can be used. Every check comes before anything is written.

    Returns:
        One line for each fold result that is damaged and will be recomputed from the fold's run.

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
    if not plan_path.exists() and not plan_path.is_symlink():
        if folder.is_dir() and any(folder.iterdir()):
            raise ConfigError(f"{folder} exists and is not a backtest; use another --name")
        folder.mkdir(parents=True, exist_ok=True)
        checkpoint.write_file_atomically(plan_path, (json.dumps(plan, indent=2, sort_keys=True) + "\n").encode())
        return []
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
    in_the_way += [folder / name for name in OUTPUTS if (folder / name).exists() and not (folder / name).is_file()]
    if in_the_way:
        kind = "a file" if in_the_way[0].name == "folds" else "a folder"
        raise ConfigError(
            f"{in_the_way[0]} is {kind}, not the backtest's {in_the_way[0].name}; "
            "move it away and run the same command again (finished folds are kept)"
        )
    notes = []
    for fold in folds:
        _, problem = stored_result(folder, fold)
        if problem is not None:
            notes.append(
                f"{result_path(folder, fold)} is not a valid fold result ({problem}); "
                f"recomputing it from the fold's run {folder / fold.name}"
            )
    return notes


def _parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="python main.py backtest",
        description="Walk-forward backtest: per test year and seed, train on the years before it, score the year.",
    )
    add_run_flags(parser)
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds, one run per seed and year (0,1,2)")
    parser.add_argument("--folds", type=int, help=f"test years: the last FOLDS years of the data ({DEFAULT_FOLDS})")
    parser.add_argument("--years", help="comma-separated test years instead of --folds")
    parser.add_argument("--checkpoint-uri", default="runs", help="local folder the backtest folder goes in (runs)")
    parser.add_argument("--name", default="backtest", help="the backtest's folder; the same name continues it")
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
    from config import preset
    from training.loop import RunStopped
    from utils.progress import GenerationProgress
    from utils.signals import StopRequest

    args = _parser().parse_args(list(argv))
    seeds = _integers(args.seeds, "--seeds")
    years = _integers(args.years, "--years") if args.years is not None else []
    if args.checkpoint_uri.startswith("gs://"):
        raise InputError("backtest writes to a local folder: give --checkpoint-uri a local path")
    if not args.name or args.name in (".", "..") or "/" in args.name or "\\" in args.name:
        raise InputError(f"--name must be a plain folder name, got {args.name!r}")
    settings = flag_settings(args)
    config = override(preset(args.preset), settings)
    folds = plan_folds(config, seeds=seeds, years=years, folds=args.folds)
    resolve_device(config.runtime.device)  # a device this machine lacks is refused before the plan is written
    folder = Path(args.checkpoint_uri) / args.name
    notes = open_backtest(folder, config, folds)

    results = []
    with StopRequest() as stop, GenerationProgress(enabled=not args.no_progress, unit="fold") as progress:
        # With --json, stdout holds the summary alone: the per-fold lines go to stderr.
        say = (lambda line: print(line, file=sys.stderr, flush=True)) if args.json else progress.write
        log = say if args.verbose else (lambda line: None)
        for note in notes:
            say(note)
        progress.reset(total=len(folds), initial=0)
        for fold in folds:
            progress.describe(f"{fold.name}")

            def on_generation(row: dict[str, Any], fold: Fold = fold) -> None:
                progress.describe(f"{fold.name}: generation {row['generation']}/{fold.config.runtime.generations}")

            try:
                result = run_fold(folder, fold, log=log, should_stop=stop, on_generation=on_generation)
            except RunStopped:
                progress.close()
                say(
                    f"stopped by {stop.name} in {fold.name}; finished folds and the last checkpoint are kept. "
                    f"Run the same command to continue."
                )
                return 128 + (stop.signum or 0)
            results.append(result)
            m = result["metrics"]
            gen = result["champion_generation"]
            crowned = f"crowned in generation {gen}" if gen else "equal weight (no agent proved an edge)"
            say(
                f"{fold.name}: champion Sharpe {fmt(m['champion']['sharpe'], '+.2f')} "
                f"(equal weight {fmt(m['equal_weight']['sharpe'], '+.2f')}), "
                f"{crowned}; deflated Sharpe {fmt(result.get('deflated_sharpe'), '.2f')}, "
                f"PBO {fmt(result.get('pbo'), '.2f')}"
            )
            progress.update()
    summary = summarise(results)
    written = write_outputs(folder, summary, results)
    if args.json:
        print(json.dumps(summary, allow_nan=False))
    else:
        print(f"backtest {folder}: {len(folds)} folds\n\n{table(summary)}\n\nreport: {folder} ({', '.join(written)})")
    return 0
