"""``python main.py evaluate TARGET``: the champion on data it never saw, against the baselines, as a report.

TARGET is a run folder (its newest intact generation), one generation's folder, or an exported champion (a folder
with ``actor.json``), local or ``gs://``. The market is rebuilt on the CPU from the data the run's config names
and must match the fingerprint the run recorded. The champion and the untrained baseline run in float32
(``offline.stored.in_float32``), whatever the run trained with, so a run and its export give the same figures.
``offline.holdout`` does the scoring; this module finds the champion, prints the table and writes the report:

* ``evaluation.json``: every figure of every strategy on both ranges, with the episodes' start days and the source,
  and the overfitting diagnostics of the run's choice (``offline.overfitting``: deflated Sharpe ratio and PBO, from
  the run's history; n/a for an export);
* ``evaluation.csv``: the same figures, one row per (range, strategy);
* ``daily.csv``: every strategy's daily log return, one row per day;
* ``equity.png``, ``drawdowns.png``, ``weights.png``: equity curves and drawdowns of the champion against the
  baselines, and the champion's weights over time; ``history.png``: fitness and validation across generations
  (a checkpoint only: an export has no history);
* ``report.html``: the tear sheet (``offline.tearsheet``), one self-contained page a practitioner reads: every figure
  above, the worst drawdowns, rolling Sharpe, calendar returns, turnover and costs, alpha and beta against the
  benchmark, and the selection verdict with the diagnostics;
* with ``--tensorboard``: the figures and the table as TensorBoard events in ``tensorboard/``.

The report goes to ``<run>/evaluation/gen-NNNNNN`` for a local run or generation, ``<export>/evaluation`` for a
local export, and ``./evaluation-<name>`` for a ``gs://`` target, unless ``--out`` names a folder. Files of an
earlier report in that folder are replaced; nothing else there is touched.
"""

from __future__ import annotations

import csv
import json
import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from config import Config, conventions, describe_conventions, override
from environment.book import Book
from environment.market import Market
from environment.observation import window_size
from models.networks import Actor
from offline import bundle, tearsheet
from offline.bundle import read_bundle
from offline.holdout import INDEX, RANGES, RangeResult, score_champion
from offline.overfitting import diagnose, unavailable
from offline.plots import SeriesPanel, WeightsPanel, plot_drawdowns, plot_equity, plot_history, plot_weights
from offline.procedures import TRADER_NAMES, Ensemble, deployed_members, trader_actor
from offline.risk import METRICS, drawdown_curve, equity_curve
from offline.stored import (
    champion_tensors,
    in_float32,
    locate,
    population_actor,
    read_generation,
    rebuild_market,
    run_config,
)
from persistence import checkpoint
from persistence.gcs import open_storage
from run.records import selection_verdict
from utils import tensorboard as board_log
from utils.cli import parse_command
from utils.errors import CheckpointError, ConfigError, InputError

METRIC_COLUMNS = ("days", *(metric.name for metric in METRICS), "under_a_year")
"""``evaluation.csv``'s figures of each strategy (``offline.risk.METRICS``, with the sample's length)."""
EXPOSURE_COLUMNS = (
    "gross_exposure",
    "net_exposure",
    "max_gross_exposure",
    "min_weight",
    "borrow_costs",
    "impact_costs",
    "trading_days",
)
"""What each strategy's book held and paid to hold it (``offline.holdout.Trace.exposure``); empty for the index."""
LABELS = {
    "champion": "champion",
    "best_on_validation": "best agent on validation",
    "ensemble": "ensemble of the best on validation",
    "untrained": "untrained (same seed)",
    "equal_weight": "equal weight, daily",
    "buy_and_hold": "equal weight, held",
    "cash": "cash",
}
"""How reports name each strategy; the benchmark is named for what it is (``Market.benchmark_label``)."""


def strategy_labels(market: Market) -> dict[str, str]:
    return {**LABELS, INDEX: market.benchmark_label}


@dataclass
class ChampionActor:
    """The champion actor a target holds, as evaluation needs it: the run's champion record is
    ``training.selection.ChampionRecord``; an exported bundle is ``offline.export``'s folder."""

    config: Config
    market: Market
    actor: nn.Module
    """The procedure that trades (selection.deploy): the champion, one agent, or an ``Ensemble``."""
    source: dict[str, Any]
    """Where the champion came from: kind, path, generation, and its record (champion generation, score, bound)."""
    history: list[dict[str, Any]] | None
    default_out: Path


def _load_params(actor: Actor, tensors: dict[str, torch.Tensor], where: str, *, squeezed: bool) -> None:
    own = dict(actor.named_parameters())
    if set(tensors) != set(own):
        missing = sorted(set(own) - set(tensors))
        raise CheckpointError(f"{where}: the actor's tensors do not match its architecture (missing {missing[:3]})")
    with torch.no_grad():
        for name, param in own.items():
            value = tensors[name].unsqueeze(0) if squeezed else tensors[name]
            if value.shape != param.shape:
                raise CheckpointError(f"{where}: {name} has shape {tuple(value.shape)}, expected {tuple(param.shape)}")
            if not torch.isfinite(value).all():
                raise CheckpointError(f"{where}: {name} holds NaN or infinite values")
            param.copy_(value)


def _with_benchmark(config: Config, benchmark: str | None) -> Config:
    """The run's config with the benchmark ``--benchmark`` names (the reports' alone: the market is the same)."""
    return config if not benchmark else override(config, {"data.benchmark": benchmark})


def _from_export(folder: Path, label: str, benchmark: str | None = None) -> ChampionActor:
    spec, tensors = read_bundle(folder, label)
    config = _with_benchmark(in_float32(run_config(spec["source"].get("config"), f"{label}/{bundle.SPEC}")), benchmark)
    market = rebuild_market(config, fingerprint=spec["source"].get("market_fingerprint"), where=label)
    size = window_size(config.env.lookback, market.num_features)
    procedure = spec.get("procedure") or {"deploy": "champion", "members": []}  # before version 5: the champion
    count = max(1, len(procedure["members"]))
    actor = Actor(count, size, config.model, book=Book.from_env(config.env)).requires_grad_(False)
    if count > 1:  # an ensemble: member{j}.NAME, stacked into one actor of its members
        tensors = _stacked_members(tensors, count)
    _load_params(actor, tensors, f"{label}/{bundle.TENSORS}", squeezed=count == 1)
    source = {
        "kind": "export",
        "procedure": procedure["deploy"],
        "members": procedure["members"],
        "path": label,
        "generation": spec.get("generation"),
        "champion_generation": spec.get("champion_generation"),
        "champion_score": spec.get("champion_score", spec.get("validation_score")),  # before version 3
        "champion_bound": spec.get("champion_bound"),
    }
    return ChampionActor(config, market, Ensemble(actor) if count > 1 else actor, source, None, folder / "evaluation")


def _stacked_members(tensors: dict[str, torch.Tensor], count: int) -> dict[str, torch.Tensor]:
    """An ensemble export's ``member{j}.NAME`` tensors as NAME -> (count, ...); a name some member lacks is left out
    (``_load_params`` names it)."""
    names = {key.split(".", 1)[1] for key in tensors if key.startswith("member") and "." in key}
    return {
        name: torch.stack([tensors[f"member{j}.{name}"] for j in range(count)])
        for name in sorted(names)
        if all(f"member{j}.{name}" in tensors for j in range(count))
    }


def _from_checkpoint(target: str, scratch: Path, benchmark: str | None = None) -> ChampionActor:
    located = locate(target, scratch)
    gen = located.gen
    state, config, market = read_generation(located, refusal="cannot evaluate", benchmark=benchmark)
    config = in_float32(config)
    size = window_size(config.env.lookback, market.num_features)
    champion = Actor(1, size, config.model, book=Book.from_env(config.env)).requires_grad_(False)
    names = [name for name, _ in champion.named_parameters()]
    _load_params(champion, champion_tensors(gen, names), str(gen.path), squeezed=False)
    actor, chosen = champion, []
    if config.selection.deploy != "champion":
        population = population_actor(gen, config, size)
        chosen = deployed_members(market, config, population)
        actor = trader_actor(population, chosen)
    history = checkpoint.read_document(gen, "history")
    source = {
        "kind": "checkpoint",
        "procedure": config.selection.deploy,
        "members": chosen,
        "path": str(target).rstrip("/") if str(target).startswith("gs://") else str(gen.path),
        "generation": gen.generation,
        "champion_generation": state.get("champion_generation"),
        "champion_score": state.get("champion_score"),
        "champion_bound": state["champion_bound"],
    }
    run_dir = located.run_dir
    default = (run_dir if run_dir is not None else gen.path.parent) / "evaluation" / gen.path.name
    return ChampionActor(config, market, actor, source, history if isinstance(history, list) else None, default)


def describe_champion(source: dict[str, Any]) -> str:
    """One line: where the champion comes from and what selection saw in it; for another procedure
    (``selection.deploy``), which agents trade."""
    procedure = source.get("procedure") or "champion"
    if procedure != "champion":
        agents = ", ".join(str(i) for i in source.get("members") or [])
        return (
            f"{TRADER_NAMES.get(procedure, procedure)} of {source['path']} (generation {source.get('generation')}; "
            f"selection.deploy={procedure}: agent{'s' if len(source.get('members') or []) != 1 else ''} {agents} "
            "of the population, ranked by validation log return, no gate)"
        )
    score = source.get("champion_score")
    score_text = "n/a" if score is None else f"{score:+.4f}"
    where = f"champion of {source['path']} (generation {source.get('generation')}"
    if source.get("champion_generation") == 0:
        return (
            f"{where}: equal weight; no agent's edge over it survived the selection test, "
            f"validation log return {score_text})"
        )
    bound = source.get("champion_bound")  # None for an export before version 3
    edge_text = "" if bound is None else f", edge lower bound {bound * 100:+.1f}%/y"
    generation = source.get("champion_generation")
    return f"{where}, found in generation {generation}, validation log return {score_text}{edge_text})"


def _remote_export(uri: str, scratch: Path) -> Path | None:
    """Download an exported actor at ``uri`` into ``scratch``; None if ``uri`` holds no ``actor.json``. The bucket is
    checked first (``check_read_access``), so an unreachable one is reported promptly, naming ``uri``."""
    storage = open_storage(uri)
    try:
        storage.check_read_access()
        if storage.stat(bundle.SPEC) is None:
            return None
        scratch.mkdir(parents=True, exist_ok=True)
        for name in (bundle.SPEC, bundle.TENSORS):
            storage.download_file(name, scratch / name)
    finally:
        storage.close()
    return scratch


def load_champion(target: str, scratch: Path, *, benchmark: str | None = None) -> ChampionActor:
    """The champion of a run, a generation or an export (local or gs://), with its config and rebuilt market (with
    ``benchmark``, a total-return file, as its benchmark instead of the run's).

    Raises:
        InputError: The target cannot be read (CheckpointError for a damaged or foreign one).
    """
    if target.startswith("gs://"):
        folder = _remote_export(target.rstrip("/"), scratch / "export")
        name = target.rstrip("/").rsplit("/", 1)[-1]
        if folder is not None:
            champion = _from_export(folder, target.rstrip("/"), benchmark)
        else:
            (scratch / "checkpoint").mkdir()
            champion = _from_checkpoint(target, scratch / "checkpoint", benchmark)
            generation = checkpoint.generation_dirname(champion.source["generation"])
            name = f"{champion.config.checkpoint.run_name or name}-{generation}"
        champion.default_out = Path(f"evaluation-{name}")
        return champion
    path = Path(target).expanduser()
    if bundle.holds_bundle(path):
        return _from_export(path, str(path), benchmark)
    return _from_checkpoint(target, scratch, benchmark)


# ---------------------------------------------------------------------------------------------- the report


def _strategies(result: RangeResult) -> list[str]:
    return list(result.traces)


def diagnostics(champion: ChampionActor, results: dict[str, RangeResult]) -> dict[str, Any]:
    """The deflated Sharpe ratio and PBO of the run's choice (``offline.overfitting``): the trials come from the
    checkpoint's history, the champion's daily validation excess over equal weight from ``results``."""
    if champion.source["kind"] == "export":
        return unavailable("an export has no run history")
    validation = results["validation"].traces
    excess = validation["champion"].log_returns - validation["equal_weight"].log_returns  # (D,)
    return diagnose(champion.history, excess, crowned=bool(champion.source.get("champion_generation")))


def selection_reading(champion: ChampionActor) -> str:
    """What the run's selection gate concluded by the champion's generation (``run.records.selection_verdict``):
    the champion's evidence, or how many validation days would prove the agent closest to proof."""
    if champion.source["kind"] == "export":
        return "selection: n/a (an export has no run history)"
    rows = [row for row in champion.history or [] if isinstance(row, dict)]
    verdict = selection_verdict(rows[-1], validation_days=champion.config.data.validation_days) if rows else None
    return f"selection: {verdict or 'n/a (no metrics row of this version)'}"


def report_document(
    champion: ChampionActor, results: dict[str, RangeResult], overfitting: dict[str, Any]
) -> dict[str, Any]:
    """Everything ``evaluation.json`` holds; ``overfitting`` is ``diagnostics``' answer."""
    env = champion.config.env
    labels = strategy_labels(champion.market)
    return {
        "source": champion.source,
        "cost_rate": env.cost_rate,
        "episode_days": env.episode_days,
        "lookback": env.lookback,
        "conventions": conventions(champion.config),
        "tickers": list(champion.market.tickers),
        "strategies": {name: labels[name] for name in _strategies(results["holdout"])},
        "ranges": {
            name: {
                "first_day": result.dates[0],
                "last_day": result.dates[-1],
                "episode_starts": result.episode_starts,
                "metrics": {
                    strategy: {**m.to_dict(), **result.traces[strategy].exposure()}
                    for strategy, m in result.metrics.items()
                },
            }
            for name, result in results.items()
        },
        "diagnostics": overfitting,
        "selection": selection_reading(champion).removeprefix("selection: "),
    }


def _percent(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100 * value:+.1f}%"


def _ratio(value: float) -> str:
    return "n/a" if math.isnan(value) or math.isinf(value) else f"{value:+.2f}"


def table(result: RangeResult, *, cost_rate: float, labels: dict[str, str] = LABELS) -> str:
    """The metrics of one range as a fixed-width table, each strategy by its name in ``labels``. A range under a year
    says so: its annualised figures are marked ``~`` (scaled up from its days) and Calmar is not given."""
    role = "out of sample" if result.name == "holdout" else "in sample: it chose the champion"
    short = any(m.under_a_year for m in result.metrics.values())
    header = (
        f"{result.name} ({role}) {result.dates[0]} to {result.dates[-1]}: "
        f"{len(result.dates)} days from cash, costs {cost_rate * 1e4:g} bp per unit of turnover"
    )
    if short:
        header += f"; under a year: ~ marks figures annualised from {len(result.dates)} days, and no Calmar"

    def marked(cell: str) -> str:  # a figure scaled up from under a year
        return cell + "~" if short and cell != "n/a" else cell

    width = max(22, *(len(labels[strategy]) + 2 for strategy in result.metrics))
    lines = [header, f"{'strategy':<{width}}" + "".join(f"{metric.short:>11}" for metric in METRICS)]
    for strategy, m in result.metrics.items():
        cells = []
        for metric in METRICS:
            cell = "n/a" if metric.needs_a_year and m.under_a_year else metric.format(getattr(m, metric.name))
            cells.append(marked(cell) if metric.annualised else cell)
        lines.append(f"{labels[strategy]:<{width}}" + "".join(f"{cell:>11}" for cell in cells))
    return "\n".join(lines)


WEIGHTS_FILE = "weights.csv"
"""The champion's order as sent at each decision date of both ranges: what ``trade`` prints for a day, given the
data up to it (``tests/offline/test_trade.py`` holds the two to each other)."""


def _write_orders(path: Path, tickers: Sequence[str], results: dict[str, RangeResult]) -> None:
    rows = []
    for result in results.values():
        trace = result.traces["champion"]
        rows.extend(zip(trace.decided, trace.orders.tolist(), strict=True))
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["date", "cash", *tickers])
        for date, weights in sorted(rows):
            writer.writerow([date, *(repr(float(w)) for w in weights)])


def _write_csvs(out: Path, results: dict[str, RangeResult]) -> None:
    with (out / "evaluation.csv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["range", "strategy", *METRIC_COLUMNS, *EXPOSURE_COLUMNS])
        for name, result in results.items():
            for strategy, m in result.metrics.items():
                values = {**dict.fromkeys(EXPOSURE_COLUMNS), **m.to_dict(), **result.traces[strategy].exposure()}
                cells = (
                    "" if values[c] is None else int(values[c]) if isinstance(values[c], bool) else values[c]
                    for c in (*METRIC_COLUMNS, *EXPOSURE_COLUMNS)
                )
                writer.writerow([name, strategy, *cells])
    with (out / "daily.csv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        strategies = _strategies(results["holdout"])
        writer.writerow(["date", "range", *(f"{s}_log_return" for s in strategies)])
        for name, result in results.items():
            for day, date in enumerate(result.dates):
                writer.writerow([date, name, *(repr(float(result.traces[s].log_returns[day])) for s in strategies)])


def _write_plots(out: Path, champion: ChampionActor, results: dict[str, RangeResult]) -> list[str]:
    title = f"champion of {champion.source['path']} (generation {champion.source['generation']})"
    labels = strategy_labels(champion.market)

    def panel_title(result: RangeResult) -> str:
        return f"{result.name}: {result.dates[0]} to {result.dates[-1]}"

    def curves(result: RangeResult, transform) -> SeriesPanel:
        # Points are closes: the day before the first return, then every day a return is earned.
        dates = [_day_before(champion.market, result.dates[0]), *result.dates]
        series = {labels[s]: list(transform(t.log_returns)) for s, t in result.traces.items()}
        return SeriesPanel(panel_title(result), dates, series)

    results_in_order = [results[name] for name in RANGES]
    plot_equity(
        out / "equity.png",
        [curves(r, equity_curve) for r in results_in_order],
        title=f"Growth of 1: {title}",
        highlight=LABELS["champion"],
    )
    plot_drawdowns(
        out / "drawdowns.png",
        [curves(r, lambda x: drawdown_curve(equity_curve(x))) for r in results_in_order],
        title=f"Drawdowns: {title}",
        highlight=LABELS["champion"],
    )
    labels = ["cash", *champion.market.tickers]
    plot_weights(
        out / "weights.png",
        [
            WeightsPanel(panel_title(r), r.dates, labels, r.traces["champion"].weights.tolist())
            for r in results_in_order
        ],
        title=f"Target weights held each day: {title}",
    )
    written = ["equity.png", "drawdowns.png", "weights.png"]
    if champion.history:
        rows = champion.history

        def column(key: str) -> list[Any]:
            return [row.get(key) for row in rows]

        plot_history(
            out / "history.png",
            generations=[row["generation"] for row in rows],
            best_fitness=column("best_fitness"),
            mean_fitness=column("mean_fitness"),
            worst_fitness=column("worst_fitness"),
            validation_best=column("validation_best"),
            champion_score=column("champion_score"),
            title=f"Fitness and validation by generation: {champion.source['path']}",
        )
        written.append("history.png")
    return written


def _day_before(market: Market, date: str) -> str:
    return market.dates[market.dates.index(date) - 1]


def write_report(
    out: Path, champion: ChampionActor, results: dict[str, RangeResult], overfitting: dict[str, Any]
) -> list[str]:
    """Write the report files into ``out`` (created if needed); returns their names."""
    if out.exists() and not out.is_dir():
        raise InputError(f"report folder {out} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    document = report_document(champion, results, overfitting)
    (out / "evaluation.json").write_text(json.dumps(document, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    _write_csvs(out, results)
    _write_orders(out / WEIGHTS_FILE, champion.market.tickers, results)
    written = ["evaluation.json", "evaluation.csv", "daily.csv", WEIGHTS_FILE, *_write_plots(out, champion, results)]
    market = champion.market
    sheet = tearsheet.evaluation_sheet(
        results,
        labels=strategy_labels(market),
        tickers=market.tickers,
        calendar=market.dates,
        title=f"Tear sheet: champion of {champion.source['path']} (generation {champion.source['generation']})",
        lines=[describe_champion(champion.source), f"trading: {describe_conventions(conventions(champion.config))}"],
        overfitting=overfitting,
        selection=selection_reading(champion),
    )
    return [*written, tearsheet.write_page(out / tearsheet.PAGE, sheet)]


def _tensorboard(out: Path, written: Sequence[str], tables: str, step: int) -> Path:
    log_dir = out / "tensorboard"
    with board_log.TensorBoardLog(log_dir) as board:
        for name in written:
            if name.endswith(".png"):
                board.figure(f"evaluation/{name[:-4]}", out / name, step=step)
        board.text("evaluation/metrics", "```\n" + tables + "\n```", step=step)
    return log_dir


def run(
    target: str,
    *,
    out: str | None,
    tensorboard: bool,
    as_json: bool,
    benchmark: str | None = None,
    log: Callable[[str], None] = print,
) -> Path:
    """Evaluate, print and write the report; returns the report folder."""
    if tensorboard and not board_log.tensorboard_available():  # before any work: the flag cannot be honoured
        raise InputError(board_log.MISSING_MESSAGE)
    with tempfile.TemporaryDirectory(prefix="erl-evaluate-") as scratch:
        champion = load_champion(target, Path(scratch), benchmark=benchmark)
    try:
        results = score_champion(champion.market, champion.config, champion.actor)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    overfitting = diagnostics(champion, results)
    folder = Path(out).expanduser() if out else champion.default_out
    written = write_report(folder, champion, results, overfitting)
    labels = strategy_labels(champion.market)
    tables = "\n\n".join(
        table(results[name], cost_rate=champion.config.env.cost_rate, labels=labels) for name in RANGES
    )
    if tensorboard:
        _tensorboard(folder, written, tables, step=int(champion.source.get("generation") or 0))
    if as_json:
        log(json.dumps(report_document(champion, results, overfitting), allow_nan=False))
    else:
        log(
            f"{describe_champion(champion.source)}\ntrading: {describe_conventions(conventions(champion.config))}\n\n"
            f"{tables}\n\n"
            f"{overfitting['deflated_sharpe_reading']}\n{overfitting['pbo_reading']}\n{selection_reading(champion)}\n\n"
            f"report: {folder} ({', '.join(written)}{', tensorboard/' if tensorboard else ''})"
        )
    return folder


def main(argv: Sequence[str]) -> int:
    """``evaluate``'s command line; returns the exit status (InputError propagates to ``main.py``)."""
    args = parse_command(
        argv,
        "evaluate",
        "Score a champion on the validation and holdout ranges against baselines; write a report.",
        ("target", {"help": "a run folder, a gen-NNNNNN folder or an exported actor; local or gs://"}),
        ("--out", {"help": "report folder (default: <run>/evaluation/gen-NNNNNN, see the docs)"}),
        ("--json", {"action": "store_true", "help": "print the report as one JSON object"}),
        ("--tensorboard", {"action": "store_true", "help": "also write the figures as TensorBoard events"}),
        (
            "--benchmark",
            {"help": "the benchmark: a total-return series (a date and a level per row); default: the run's"},
        ),
    )
    run(args.target, out=args.out, tensorboard=args.tensorboard, as_json=args.json, benchmark=args.benchmark)
    return 0
