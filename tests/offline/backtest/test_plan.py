"""A backtest's plan (``offline.backtest.plan``): folds that never see their test year, and plans the data cannot
train refused before anything is written."""

from __future__ import annotations

import datetime as dt

import pytest
import torch

from config import override
from environment.features import WARMUP_DAYS
from environment.loading import load_market
from offline.backtest.plan import plan_difference, plan_document, plan_folds
from tests.offline.backtest.builders import small_config
from utils.errors import ConfigError


def test_folds_never_let_a_training_or_validation_day_reach_the_test_year(prices):
    config = small_config(prices)
    folds = plan_folds(config, seeds=[0, 1], folds=3)
    assert [(f.year, f.seed) for f in folds] == [(y, s) for y in (2003, 2004, 2005) for s in (0, 1)]
    for fold in folds:
        market = load_market(fold.config, torch.device("cpu"))
        splits, dates = market.splits, market.dates
        first_test_day = dt.date(fold.year, 1, 1).isoformat()
        # Every day training or validation earns, and every day their observation windows show, is before it.
        assert dates[splits.validation.stop - 1] < first_test_day
        assert dates[splits.train.stop - 1] < dates[splits.validation.start]
        # The test year is the holdout, all of it and nothing else.
        test_dates = [dates[d] for d in splits.holdout]
        assert all(d.startswith(str(fold.year)) for d in test_dates)
        assert dates[splits.holdout.start - 1] < first_test_day <= test_dates[0]
        assert splits.holdout.stop == market.num_days
        # The gap: the first test decision's window (lookback days to its decision day, execution_delay days before
        # the eve of the test) holds no validation day, so no feature a test decision sees was earned by selection.
        lookback, delay = fold.config.env.lookback, fold.config.env.execution_delay
        assert len(splits.gap) == lookback + delay
        first_decision = splits.holdout.start - 1 - delay
        first_window = range(first_decision - lookback + 1, first_decision + 1)
        assert set(first_window) | set(range(first_decision + 1, splits.holdout.start)) == set(splits.gap)
        assert splits.validation.stop <= first_window.start
        # No row after the test year was even loaded.
        assert dates[-1] <= dt.date(fold.year, 12, 31).isoformat()
    assert WARMUP_DAYS > 0


def test_plans_that_cannot_be_run_are_refused(prices):
    config = small_config(prices)
    with pytest.raises(ConfigError, match="not in the data"):
        plan_folds(config, seeds=[0], years=[1999])
    with pytest.raises(ConfigError, match="--folds"):
        plan_folds(config, seeds=[0], folds=7)
    # Three years of data: the default four test years are named as the default, not as a flag nobody typed.
    with pytest.raises(ConfigError, match=r"^the default --folds 4: the data spans 3 calendar years"):
        plan_folds(override(config, {"data.start": "2003-01-01"}), seeds=[0])


def test_a_plan_holds_what_a_fold_computes_not_how_it_runs(prices):
    """A fold continues with any setting a resumed run may change but its length, as an older plan.json that still
    holds such settings does; a setting that changes what a fold computes is named."""
    config = small_config(prices)
    saved = plan_document(config, [])
    how = {
        "runtime.device": "cpu",
        "runtime.cuda_graphs": not config.runtime.cuda_graphs,
        "runtime.census_fraction": 1.0,
    }
    assert plan_difference(saved, plan_document(override(config, how), [])) is None
    older = {**saved, "config": {**saved["config"], "runtime": {**saved["config"]["runtime"], "cuda_graphs": False}}}
    assert plan_difference(older, plan_document(config, [])) is None
    changed = plan_document(override(config, {"runtime.generations": config.runtime.generations + 1}), [])
    assert plan_difference(saved, changed).startswith("runtime.generations (")
    changed = plan_document(override(config, {"runtime.matmul_precision": "high"}), [])
    assert plan_difference(saved, changed).startswith("runtime.matmul_precision (")


def test_a_plan_of_an_earlier_version_continues_with_what_it_ran_and_another_delay_is_named(prices):
    """A plan.json written before fills could wait (no ``env.execution_delay``, no ``data.universe``) ran at delay 0
    on the common universe: the same plan now continues, and another delay is a change of plan."""
    earlier = override(small_config(prices), {"env.execution_delay": 0, "data.universe": "common"})
    saved = plan_document(earlier, [])
    for section, key in (("env", "execution_delay"), ("data", "universe"), ("data", "features"), ("env", "cash_rate")):
        del saved["config"][section][key]
    assert plan_difference(saved, plan_document(earlier, [])) is None
    changed = plan_difference(saved, plan_document(override(earlier, {"env.execution_delay": 1}), []))
    assert changed == "env.execution_delay (0 in plan.json, now 1)"


def test_the_bundled_backtests_default_years_are_years_no_default_was_chosen_on():
    from config import DEFAULTS_CHOSEN_ON, preset
    from offline.backtest.plan import tuned_years

    config = override(preset("smoke"), {"runtime.generations": 1})
    assert tuned_years(config) == {2019, 2020, 2021} and DEFAULTS_CHOSEN_ON == (("2019-12-30", "2021-12-28"),)
    assert [fold.year for fold in plan_folds(config, seeds=[0])] == [2016, 2017, 2018, 2022]
    assert tuned_years(override(config, {"data.path": "prices.csv"})) == set()  # a user's data tuned nothing
