"""``offline.overfitting``: block means, the deflated Sharpe ratio and CSCV's PBO against their definitions, and the
diagnostics a run's history gives."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import scipy.stats
import torch

from offline.overfitting import (
    cscv,
    deflated_sharpe,
    diagnose,
    expected_max_sharpe,
    half_splits,
    probabilistic_sharpe,
    read_deflated_sharpe,
    read_pbo,
    series_moments,
)
from run.records import block_means

# ---------------------------------------------------------------------------------------------- block means


def test_block_means_cut_the_days_as_array_split_does():
    excess = np.random.default_rng(0).normal(size=(3, 37))
    # 37 days in 16 blocks: the first 37 % 16 = 5 blocks hold 3 days, the other 11 hold 2.
    sizes = [3] * 5 + [2] * 11
    edges = [0, *itertools.accumulate(sizes)]
    expected = np.array([[row[a:b].sum() / (b - a) for a, b in itertools.pairwise(edges)] for row in excess])
    np.testing.assert_allclose(block_means(excess), expected, rtol=1e-12)
    by_split = np.stack([part.mean(axis=1) for part in np.array_split(excess, 16, axis=1)], axis=1)
    np.testing.assert_allclose(block_means(excess), by_split, rtol=1e-12)
    np.testing.assert_array_equal(block_means(torch.from_numpy(excess)), block_means(excess))
    assert block_means(excess).dtype == np.float64


def test_block_means_refuse_too_few_days_and_a_wrong_shape():
    with pytest.raises(ValueError, match="cannot be cut"):
        block_means(np.zeros((2, 15)))
    with pytest.raises(ValueError, match="candidates, days"):
        block_means(np.zeros(40))


# ---------------------------------------------------------------------------------------------- deflated Sharpe


def test_one_trial_gives_the_probabilistic_sharpe_ratio_against_zero():
    sharpe, days, skewness, kurtosis = 0.08, 504, -0.4, 5.2
    by_hand = scipy.stats.norm.cdf(
        sharpe * math.sqrt(days - 1) / math.sqrt(1 - skewness * sharpe + (kurtosis - 1) / 4 * sharpe**2)
    )
    value = deflated_sharpe(sharpe, days=days, trials=1, variance=0.01, skewness=skewness, kurtosis=kurtosis)
    assert value == pytest.approx(by_hand, rel=1e-12)
    assert probabilistic_sharpe(sharpe, 0.0, days=days, skewness=skewness, kurtosis=kurtosis) == value


def test_the_bar_is_the_expected_maximum_of_unskilled_trials():
    trials, variance = 640, 0.003
    gamma = np.euler_gamma
    by_hand = math.sqrt(variance) * (
        (1 - gamma) * scipy.stats.norm.ppf(1 - 1 / trials) + gamma * scipy.stats.norm.ppf(1 - 1 / (trials * math.e))
    )
    assert expected_max_sharpe(trials, variance) == pytest.approx(by_hand, rel=1e-12)
    assert expected_max_sharpe(1, variance) == 0.0
    # A Sharpe ratio exactly at the bar is a coin flip.
    assert deflated_sharpe(by_hand, days=252, trials=trials, variance=variance) == pytest.approx(0.5, abs=1e-12)


def test_more_trials_and_more_spread_deflate_more():
    by_trials = [deflated_sharpe(0.1, days=504, trials=n, variance=0.002) for n in (1, 2, 10, 100, 1000, 13000)]
    assert all(a > b for a, b in itertools.pairwise(by_trials))
    by_variance = [deflated_sharpe(0.1, days=504, trials=100, variance=v) for v in (0.0, 1e-4, 1e-3, 1e-2)]
    assert all(a > b for a, b in itertools.pairwise(by_variance))
    # Fat tails and negative skew make the same Sharpe ratio less convincing.
    normal = deflated_sharpe(0.1, days=504, trials=100, variance=1e-3)
    assert deflated_sharpe(0.1, days=504, trials=100, variance=1e-3, skewness=-1.0, kurtosis=8.0) < normal


def test_the_best_of_unskilled_trials_rarely_passes_once_deflated():
    """Null strategies: the best of 20 passes a naive 95% test most of the time, the deflated one rarely."""
    generator = np.random.default_rng(7)
    deflated, naive = [], []
    for _ in range(200):
        daily = generator.normal(0.0, 0.01, size=(20, 250))
        sharpes = daily.mean(axis=1) / daily.std(axis=1, ddof=1)
        best = float(sharpes.max())
        variance = float(np.var(sharpes, ddof=1))
        deflated.append(deflated_sharpe(best, days=250, trials=20, variance=variance))
        naive.append(probabilistic_sharpe(best, 0.0, days=250))
    assert np.mean(np.array(naive) > 0.95) > 0.4
    assert np.mean(np.array(deflated) > 0.95) < 0.05


def test_series_moments_match_scipy():
    daily = np.random.default_rng(1).standard_t(5, size=300) * 0.01 + 0.001
    moments = series_moments(daily)
    assert moments.sharpe == pytest.approx(daily.mean() / daily.std(ddof=1), rel=1e-12)
    assert moments.skewness == pytest.approx(scipy.stats.skew(daily), rel=1e-10)
    assert moments.kurtosis == pytest.approx(scipy.stats.kurtosis(daily, fisher=True) + 3.0, rel=1e-10)
    assert moments.days == 300


@pytest.mark.parametrize(
    ("call", "phrase"),
    [
        (lambda: deflated_sharpe(0.1, days=252, trials=0, variance=0.01), "trials must be >= 1"),
        (lambda: deflated_sharpe(0.1, days=252, trials=5, variance=-0.01), "finite and >= 0"),
        (lambda: deflated_sharpe(0.1, days=1, trials=5, variance=0.01), "at least two days"),
        # A two-point series (kurtosis = 1 + skewness^2) at Sharpe 2 / skewness: the estimate has no variance.
        (lambda: deflated_sharpe(1.0, days=252, trials=5, variance=0.01, skewness=2.0, kurtosis=5.0), "no variance"),
        (lambda: series_moments(np.full(50, 0.002)), "constant"),
        (lambda: series_moments([0.01, math.nan, 0.0]), "finite"),
    ],
)
def test_degenerate_input_is_a_clear_error(call, phrase):
    with pytest.raises(ValueError, match=phrase):
        call()


# ---------------------------------------------------------------------------------------------- CSCV


def cscv_by_definition(blocks: np.ndarray) -> np.ndarray:
    """The logits of Bailey et al.'s CSCV, one split at a time, with means and average ranks."""
    candidates, count = blocks.shape
    logits = []
    for chosen in itertools.combinations(range(count), count // 2):
        rest = [b for b in range(count) if b not in chosen]
        best = int(np.argmax(blocks[:, list(chosen)].mean(axis=1)))
        rank = scipy.stats.rankdata(blocks[:, rest].mean(axis=1), method="average")[best]
        w = rank / (candidates + 1)
        logits.append(math.log(w / (1 - w)))
    return np.array(logits)


def test_cscv_follows_its_definition():
    blocks = np.random.default_rng(2).normal(size=(7, 8))
    result = cscv(blocks)
    expected = cscv_by_definition(blocks)
    np.testing.assert_allclose(result.logits, expected, rtol=1e-12, atol=1e-12)
    assert result.pbo == np.mean(expected <= 0)
    assert result.median_logit == pytest.approx(np.median(expected))


def test_the_splits_are_every_half_and_symmetric():
    splits = half_splits(16)
    assert splits.shape == (12870, 16) and (splits.sum(axis=1) == 8).all()
    assert len({row.tobytes() for row in splits}) == 12870
    assert {row.tobytes() for row in 1.0 - splits} == {row.tobytes() for row in splits}


@pytest.mark.slow
def test_null_candidates_overfit_half_the_time():
    generator = np.random.default_rng(3)
    pbos = [cscv(generator.normal(size=(50, 16))).pbo for _ in range(100)]
    assert np.mean(pbos) == pytest.approx(0.5, abs=0.05)


def test_a_candidate_better_in_every_block_never_overfits():
    blocks = np.random.default_rng(4).normal(size=(50, 16))
    blocks[17] += 3.0
    result = cscv(blocks)
    assert result.pbo == 0.0
    np.testing.assert_allclose(result.logits, math.log(50))  # ranked first of 50: w = 50 / 51


def test_when_one_half_takes_what_the_other_gives_the_best_is_always_worst():
    blocks = np.random.default_rng(5).normal(size=(50, 16))
    blocks -= blocks.mean(axis=1, keepdims=True)  # every candidate's total is 0: out-of-sample = -in-sample
    result = cscv(blocks)
    assert result.pbo == 1.0
    np.testing.assert_allclose(result.logits, math.log(1 / 50))


def test_chunking_does_not_change_the_result():
    blocks = np.random.default_rng(6).normal(size=(30, 16))
    whole = cscv(blocks, chunk=len(half_splits(16)))
    for chunk in (1, 13, None):
        parts = cscv(blocks, chunk=chunk)
        assert parts.pbo == whole.pbo
        np.testing.assert_array_equal(parts.logits, whole.logits)


def test_ties_are_broken_the_same_way_every_time():
    # All alike: the in-sample best shares the middle rank, w = 1/2, logit 0 (counted as overfit).
    result = cscv(np.ones((5, 4)))
    np.testing.assert_array_equal(result.logits, np.zeros(6))
    assert result.pbo == 1.0
    # A duplicated best: the copies share their mid-rank; the same logits on every call.
    blocks = np.random.default_rng(8).normal(size=(6, 8))
    blocks[3] = blocks[1] = blocks[1] + 2.0
    first, second = cscv(blocks), cscv(blocks)
    np.testing.assert_array_equal(first.logits, second.logits)
    np.testing.assert_allclose(first.logits, math.log(5.5 / 1.5))  # ranks 5 and 6 of 6 share 5.5: w = 5.5 / 7


@pytest.mark.parametrize(
    ("blocks", "phrase"),
    [
        (np.zeros((1, 16)), "two candidates"),
        (np.zeros((4, 15)), "even number"),
        (np.full((4, 16), np.nan), "NaN"),
        (np.zeros(16), "matrix"),
    ],
)
def test_cscv_refuses_what_it_cannot_rank(blocks, phrase):
    with pytest.raises(ValueError, match=phrase):
        cscv(blocks)


# ---------------------------------------------------------------------------------------------- readings


def test_readings_say_what_the_figures_mean():
    edge = "the champion's validation edge over equal weight"
    assert read_deflated_sharpe(0.97, trials=640, edge=edge) == (
        "deflated Sharpe 0.97: the champion's validation edge over equal weight stands out against what the best of "
        "640 unskilled trials is expected to show: unlikely to be the best of 640 lucky tries"
    )
    assert "rule out luck" in read_deflated_sharpe(0.8, trials=640, edge=edge)
    assert "no evidence of skill" in read_deflated_sharpe(0.2, trials=640, edge="the best candidate's")
    pooled = read_deflated_sharpe(0.2, trials=480, edge="the edge over every test day", as_many_days=True)
    assert pooled.endswith("unskilled trials is expected to show on as many days: no evidence of skill")
    assert read_pbo(0.62) == (
        "PBO 0.62: in 62% of the splits of the validation days, the candidate best on one half ranks at or below "
        "the median on the other: choosing by validation return here is mostly luck"
    )
    assert "partly luck" in read_pbo(0.3)
    assert "stays ahead" in read_pbo(0.05)


# ---------------------------------------------------------------------------------------------- from a run's history


@pytest.fixture
def rows(add_validation_keys):
    return add_validation_keys([{"generation": g} for g in range(3)], popsize=4, days=126, seed=11)


def test_diagnose_a_crowned_champion(rows):
    champion_excess = np.random.default_rng(12).normal(0.001, 0.01, size=126)
    found = diagnose(rows, champion_excess, crowned=True)
    sharpes = np.concatenate([row["validation_sharpe"] for row in rows])
    moments = series_moments(champion_excess)
    expected = deflated_sharpe(
        moments.sharpe,
        days=126,
        trials=12,
        variance=float(np.var(sharpes, ddof=1)),
        skewness=moments.skewness,
        kurtosis=moments.kurtosis,
    )
    assert found["deflated_sharpe"] == pytest.approx(expected, rel=1e-12)
    assert found["deflated_sharpe_of"] == "champion" and found["trials"] == 12
    assert found["deflated_sharpe_reading"] == read_deflated_sharpe(
        expected, trials=12, edge="the champion's validation edge over equal weight"
    )
    expected_pbo = cscv(np.concatenate([row["validation_blocks"] for row in rows])).pbo
    assert found["pbo"] == expected_pbo and found["pbo_reading"] == read_pbo(expected_pbo)
    json.dumps(found, allow_nan=False)


def test_with_no_agent_crowned_the_best_candidate_is_deflated(rows):
    found = diagnose(rows, np.zeros(126), crowned=False)  # an equal-weight champion has no excess
    best = max(s for row in rows for s in row["validation_sharpe"])
    variance = float(np.var([s for row in rows for s in row["validation_sharpe"]], ddof=1))
    assert found["deflated_sharpe"] == pytest.approx(deflated_sharpe(best, days=126, trials=12, variance=variance))
    assert found["deflated_sharpe_of"] == "best candidate"
    assert found["deflated_sharpe_reading"].endswith("(no agent was crowned: not the champion's)")
    assert "best candidate's validation edge" in found["deflated_sharpe_reading"]


def test_rows_of_an_earlier_version_give_n_a_with_the_reason(rows):
    older = [{"generation": g} for g in range(3)]
    found = diagnose(older, np.zeros(126), crowned=False)
    assert found["deflated_sharpe"] is None and found["pbo"] is None
    assert found["deflated_sharpe_reading"] == (
        "deflated Sharpe n/a (3 of 3 generations were recorded without validation_sharpe, by an earlier version)"
    )
    assert found["pbo_reading"].startswith("PBO n/a (3 of 3 generations were recorded without validation_blocks")
    # A run resumed across the change: part of its trials unknown, so no figure.
    mixed = [older[0], *rows[1:]]
    assert diagnose(mixed, np.zeros(126), crowned=False)["pbo_reading"].startswith("PBO n/a (1 of 3 generations")
    assert diagnose(None, np.zeros(126), crowned=False)["pbo_reading"] == "PBO n/a (the run has no history)"


def test_malformed_rows_give_n_a_not_a_traceback(rows):
    ragged = [*rows[:2], {**rows[2], "validation_blocks": [[0.1] * 16, [0.2] * 15]}]
    assert "malformed" in diagnose(ragged, np.zeros(126), crowned=False)["pbo_reading"]
    nulls = [*rows[:2], {**rows[2], "validation_sharpe": [None, 0.1, 0.2, 0.3]}]
    assert "not finite" in diagnose(nulls, np.zeros(126), crowned=False)["deflated_sharpe_reading"]
    constant = diagnose(rows, np.full(126, 0.001), crowned=True)
    assert constant["deflated_sharpe"] is None and "constant" in constant["deflated_sharpe_reading"]
    assert constant["pbo"] is not None
