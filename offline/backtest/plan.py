"""A backtest's plan: one fold per test year and seed, each trained on everything before its year, and the plan
document (``plan.json``) a backtest of the same name must match to be continued."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from config import DEFAULTS_CHOSEN_ON, Config, dotted, override, with_current_names, with_earlier_defaults
from environment.loading import load_market, load_table
from persistence.provenance import market_fingerprint
from persistence.run_folder.opening import RESUMABLE_CHANGES
from training.fitness import training_starts
from utils.errors import ConfigError, InputError

DEFAULT_FOLDS = 4
"""Test years when neither ``--folds`` nor ``--years`` is given: the last four of the data (of the bundled data, the
last four that no default was chosen on)."""
HOW_IT_RUNS = RESUMABLE_CHANGES - {"runtime.generations"}
"""Settings a fold may continue with changed (those of a resumed run, not the length): not part of the plan."""


@dataclass(frozen=True)
class Fold:
    year: int
    seed: int
    config: Config
    fingerprint: str
    """``persistence.provenance.market_fingerprint`` of the fold's market: what its run must be trained on."""
    num_assets: int = 0
    num_features: int = 0
    tradable_mask: bool = False
    """The market's shape, and whether its assets do not all trade every day: what sizes the run's memory
    (``offline.backtest.placement``)."""

    @property
    def name(self) -> str:
        return f"fold-{self.year}-seed-{self.seed}"


def plan_folds(
    config: Config, *, seeds: Sequence[int], years: Sequence[int] = (), folds: int | None = None
) -> list[Fold]:
    """One fold per test year and seed; ``years`` empty means the last ``folds`` (default 4) calendar years of the
    data, leaving out on the bundled data the years that overlap a range the defaults were chosen on
    (``config.DEFAULTS_CHOSEN_ON``). Every test year's market is built here (on the CPU), so a plan the data cannot
    train is refused, naming the year, before anything is written.

    Raises:
        ConfigError: a seed or year given twice, a test year the data does not hold, or one whose fold has too few
            days before it for the settings.
    """
    if not seeds:
        raise ConfigError("--seeds names no seed")
    _refuse_repeats(seeds, "--seeds", "seed")
    _refuse_repeats(years, "--years", "year")
    table = load_table(config)
    calendar = table.dates.year
    available = sorted(set(int(y) for y in calendar))
    if not years:
        untouched = [year for year in available if year not in tuned_years(config)]
        count = DEFAULT_FOLDS if folds is None else folds
        asked = f"--folds {folds}" if folds is not None else f"the default --folds {DEFAULT_FOLDS}"
        if count < 1:
            raise ConfigError("--folds must be >= 1")
        if count >= len(available):
            raise ConfigError(
                f"{asked}: the data spans {len(available)} calendar years ({available[0]} to {available[-1]}); "
                "leave one to train on (fewer --folds, or --years)"
            )
        years = untouched[-count:]
    missing = sorted(set(years) - set(available))
    if missing:
        raise ConfigError(f"test year {missing[0]} is not in the data ({available[0]} to {available[-1]})")
    plan = []
    for year in sorted(years):
        in_year = np.flatnonzero(calendar == year)
        fold_config = override(
            config,
            {
                "data.end": table.dates[in_year[-1]].strftime("%Y-%m-%d"),
                "data.holdout_days": len(in_year),
                # the first test decision's window (env.execution_delay days before the year's eve) holds no day that
                # training or validation earned
                "data.gap_days": config.env.lookback + config.env.execution_delay,
            },
        )
        try:
            market = load_market(fold_config, torch.device("cpu"))
            training_starts(fold_config, market)  # the fold's trainer checks this too: refused before the plan
        except InputError as error:
            raise ConfigError(f"test year {year}: {error}") from None
        fingerprint = market_fingerprint(market)
        for seed in seeds:
            seeded = override(fold_config, {"runtime.seed": seed})
            shape = (market.num_assets, market.num_features, market.tradable is not None)
            plan.append(Fold(year, seed, seeded, fingerprint, *shape))
    return plan


def tuned_years(config: Config) -> set[int]:
    """The calendar years of the run's data that overlap a range any default was chosen on: of the bundled data,
    ``config.DEFAULTS_CHOSEN_ON``'s; of a user's data, none."""
    if config.data.path:
        return set()
    return {year for first, last in DEFAULTS_CHOSEN_ON for year in range(int(first[:4]), int(last[:4]) + 1)}


def _refuse_repeats(values: Sequence[int], flag: str, what: str) -> None:
    """A value given twice would count its folds twice in every mean and fraction of the summary: refused, since the
    command cannot know whether another value was meant."""
    for value in values:
        if list(values).count(value) > 1:
            raise ConfigError(f"{flag} names {what} {value} twice; give each once")


def plan_document(config: Config, folds: list[Fold]) -> dict[str, Any]:
    base = config.to_dict()
    base["checkpoint"] = {k: v for k, v in base["checkpoint"].items() if k not in ("uri", "run_name", "local_dir")}
    base["runtime"] = {k: v for k, v in base["runtime"].items() if f"runtime.{k}" not in HOW_IT_RUNS}
    return {"config": base, "folds": [{"year": f.year, "seed": f.seed} for f in folds]}


def plan_difference(saved: dict[str, Any], plan: dict[str, Any]) -> str | None:
    """The first thing ``saved`` (plan.json) and ``plan`` (this command) disagree on, in words; None if nothing.
    Settings in ``HOW_IT_RUNS`` that an older plan.json holds are not compared."""
    if saved.get("folds") != plan["folds"]:
        before, now = _folds_text(saved.get("folds")), _folds_text(plan["folds"])
        return f"the test years and seeds ({before} in plan.json, now {now})"
    old, new = (
        {
            k: v
            for k, v in dotted(with_earlier_defaults(with_current_names(d["config"]))).items()
            if k not in HOW_IT_RUNS
        }
        for d in (saved, plan)
    )
    defaults = dotted(Config().to_dict())
    for key in sorted(old.keys() | new.keys()):
        if key not in old and key in defaults and new.get(key) == defaults[key]:
            continue  # a key added since plan.json was written, at the value that means what that version did
        if old.get(key, ...) != new.get(key, ...):
            before, now = (repr(d[key]) if key in d else "not set" for d in (old, new))
            return f"{key} ({before} in plan.json, now {now})"
    return None if saved.keys() == plan.keys() else "plan.json holds other keys"


def _folds_text(folds: Any) -> str:
    if not isinstance(folds, list) or not all(isinstance(f, dict) for f in folds):
        return "no valid list of folds"
    years = ", ".join(str(y) for y in dict.fromkeys(f.get("year") for f in folds))
    seeds = ", ".join(str(s) for s in dict.fromkeys(f.get("seed") for f in folds))
    return f"years {years or 'none'}, seeds {seeds or 'none'}"
