"""Learning that does not fool itself, end to end on markets with a known answer (``environment.synthetic``).

Small versions of ``benchmarks/learning.py`` (5 assets, small networks, few generations), so they run in CI: a
market with no signal must leave the champion at equal weight; a planted one-day reversal must be learned where an
order fills at the close that revealed it, and a persistent signal where it fills a day later (the default). A
one-day signal is gone by then (``benchmarks/execution_delay.py``).
"""

from __future__ import annotations

import pytest

from benchmarks.learning import SMALL_MARKET, run_one, small_config

pytestmark = pytest.mark.slow  # each test trains runs of 10 to 25 generations on synthetic markets


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_a_market_without_signal_leaves_the_champion_at_equal_weight(tmp_path, seed):
    row = run_one("random_walk", seed, small_config(10), tmp_path, lambda line: None, **SMALL_MARKET)
    assert row["crowned"] == 0, row  # no agent's luck passed the selection test
    assert row["turnover_ratio"] <= 2.0, row
    assert abs(row["return_gap"]) <= 2.0, row


@pytest.mark.slow
def test_a_planted_one_day_reversal_is_learned_where_orders_fill_at_the_close_they_observed(tmp_path):
    config = small_config(25, **{"env.execution_delay": 0})
    row = run_one("reversal", 0, config, tmp_path, lambda line: None, **SMALL_MARKET, strength=0.02)
    assert row["crowned"] > 0, row
    # A quarter of what the rule that knows the signal earns over equal weight, on the holdout year.
    assert row["champion"] >= row["equal_weight"] + 0.25 * (row["rule"] - row["equal_weight"]), row


@pytest.mark.slow
def test_a_planted_persistent_signal_is_learned_where_orders_fill_the_next_day(tmp_path):
    row = run_one("leaders", 0, small_config(25), tmp_path, lambda line: None, **SMALL_MARKET, strength=0.01)
    assert row["crowned"] > 0, row
    assert row["champion"] >= row["equal_weight"] + 0.25 * (row["rule"] - row["equal_weight"]), row
