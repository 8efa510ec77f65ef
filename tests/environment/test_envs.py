import math

import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

from environment.gym_env import PortfolioEnv
from environment.kernel import cash_weights, portfolio_step, scores_to_weights, with_cash
from environment.observation import WindowGatherer
from environment.vector_env import VectorPortfolioEnv, episode_starts
from tests.synthetic import make_market, random_simplex

LOOKBACK, EPISODE_DAYS, COST = 8, 12, 0.0025


def test_costs_charged_exactly_as_documented():
    weights = torch.tensor([1.0, 0.0, 0.0])  # all cash
    target = torch.tensor([0.0, 0.5, 0.5])
    relatives = with_cash(torch.tensor([1.1, 0.9]))
    result = portfolio_step(weights, target, relatives, cost_rate=0.001)
    # Turnover counts the assets only: |0.5 - 0| + |0.5 - 0| = 1; growth 0.5 * 1.1 + 0.5 * 0.9 = 1.
    assert result.turnover.item() == pytest.approx(1.0)
    assert result.costs.item() == pytest.approx(0.001)
    assert result.rewards.item() == pytest.approx(math.log(1.0 * (1 - 0.001)), abs=1e-7)
    torch.testing.assert_close(result.next_weights, torch.tensor([0.0, 0.55, 0.45]))


def test_holding_still_costs_nothing_and_follows_prices():
    weights = torch.tensor([0.2, 0.3, 0.5])
    relatives = with_cash(torch.tensor([1.2, 0.8]))
    result = portfolio_step(weights, weights, relatives, cost_rate=0.01)
    growth = 0.2 + 0.3 * 1.2 + 0.5 * 0.8
    assert result.costs.item() == 0.0
    assert result.rewards.item() == pytest.approx(math.log(growth), abs=1e-7)
    torch.testing.assert_close(result.next_weights, torch.tensor([0.2, 0.36, 0.4]) / growth)


def test_window_gatherer_matches_plain_slicing(market):
    gatherer = WindowGatherer(market.features, LOOKBACK)
    days = torch.tensor([[LOOKBACK - 1, 100], [200, market.num_days - 1]])
    windows = gatherer.gather(days)
    for index in np.ndindex(*days.shape):
        day = int(days[index])
        expected = market.features[day - LOOKBACK + 1 : day + 1].permute(1, 0, 2).reshape(market.num_assets, -1)
        assert torch.equal(windows[index], expected)


@pytest.mark.parametrize("delay", [0, 1, 3])
def test_episode_windows_stay_inside_their_split(market, delay):
    starts = episode_starts(market.splits.train, lookback=LOOKBACK, episode_days=EPISODE_DAYS, execution_delay=delay)
    assert starts.start == LOOKBACK - 1  # first complete lookback window
    # The last window earns returns up to the train split's last day (its last target fills `delay` days after its
    # last decision and is held one day), not one day more.
    assert starts[-1] + EPISODE_DAYS - 1 + delay + 1 == market.splits.train.stop - 1
    validation = episode_starts(market.splits.validation, lookback=LOOKBACK, episode_days=5, execution_delay=delay)
    assert validation.start + delay + 1 == market.splits.validation.start  # the first target earns its first day


@pytest.mark.parametrize("delay", [0, 1])
def test_gymnasium_env_checker_passes(market, delay):
    env = PortfolioEnv(market, lookback=LOOKBACK, episode_days=EPISODE_DAYS, cost_rate=COST, execution_delay=delay)
    check_env(env, skip_render_check=True)


def test_gym_env_truncates_and_never_terminates(market):
    env = PortfolioEnv(market, lookback=LOOKBACK, episode_days=EPISODE_DAYS, cost_rate=COST, execution_delay=1)
    env.reset(seed=3)
    flags = [env.step(env.action_space.sample())[2:4] for _ in range(EPISODE_DAYS)]
    assert [terminated for terminated, _ in flags] == [False] * EPISODE_DAYS
    assert [truncated for _, truncated in flags] == [False] * (EPISODE_DAYS - 1) + [True]


@pytest.mark.parametrize("delay", [0, 1, 2])
def test_vector_and_single_environments_agree_step_for_step(delay):
    market = make_market(seed=1)
    agents, episodes = 2, 3
    g = torch.Generator().manual_seed(0)
    starts = torch.tensor([LOOKBACK - 1, 50, 120])
    vector = VectorPortfolioEnv(
        market,
        num_agents=agents,
        num_episodes=episodes,
        episode_days=EPISODE_DAYS,
        lookback=LOOKBACK,
        cost_rate=COST,
        execution_delay=delay,
    )
    # Raw scores for the single env, which normalises them; the same normalisation for the vector env.
    scores = torch.rand(EPISODE_DAYS, agents, episodes, market.num_assets + 1, generator=g)
    scores[0, 0, 0] = 0.0  # an all-zero action means all cash
    actions = scores_to_weights(scores)
    obs = vector.reset(starts)
    windows, weights, rewards = [], [], []
    for step in range(EPISODE_DAYS):
        windows.append(obs.windows.clone())
        weights.append(obs.weights.clone())
        transition, obs = vector.step(actions[step])
        rewards.append(transition.rewards.clone())
        assert transition.truncated == (step == EPISODE_DAYS - 1)
    assert obs is None

    for p in range(agents):
        for e in range(episodes):
            single = PortfolioEnv(
                market, lookback=LOOKBACK, episode_days=EPISODE_DAYS, cost_rate=COST, execution_delay=delay
            )
            observation, _ = single.reset(options={"start_day": int(starts[e])})
            for step in range(EPISODE_DAYS):
                assert np.array_equal(observation["window"], windows[step][e].numpy())
                assert np.array_equal(observation["weights"], weights[step][p, e].clamp(0, 1).numpy())
                observation, reward, terminated, _truncated, _ = single.step(scores[step, p, e].numpy())
                assert reward == rewards[step][p, e].item()
                assert not terminated
    # The environment's own history is the per-step rewards.
    assert torch.equal(vector.rewards_per_episode, torch.stack(rewards, dim=-1))


def test_vector_env_reset_starts_in_cash_and_reuses_its_arrays(market):
    env = VectorPortfolioEnv(
        market,
        num_agents=2,
        num_episodes=2,
        episode_days=EPISODE_DAYS,
        lookback=LOOKBACK,
        cost_rate=COST,
        execution_delay=1,
    )
    first = env.reset(torch.tensor([LOOKBACK - 1, 60]))
    pointers = (first.windows.data_ptr(), first.weights.data_ptr(), env.rewards_per_episode.data_ptr())
    env.step(random_simplex(2, 2, market.num_assets + 1, generator=torch.Generator().manual_seed(0)))
    second = env.reset(torch.tensor([30, 90]))
    assert (second.windows.data_ptr(), second.weights.data_ptr(), env.rewards_per_episode.data_ptr()) == pointers
    assert torch.equal(second.weights, cash_weights((2, 2), market.num_assets))
    assert env.rewards_per_episode.abs().sum() == 0


def test_an_environment_from_a_config_trades_as_its_env_section_says(market):
    """``from_config`` reads every trading setting of the run's ``env`` section: its lookback, costs, delay and
    book (a long-short book at a cadence here, none of them a default)."""
    from config import override, preset
    from environment.book import Book

    settings = {"env.lookback": 7, "env.cost_rate": 0.0025, "env.execution_delay": 2}
    env_config = override(preset("smoke"), {**settings, "env.book": "long_short", "env.rebalance_every": 3}).env
    env = VectorPortfolioEnv.from_config(market, env_config, num_agents=3, num_episodes=2, episode_days=9)
    assert (env.num_agents, env.num_episodes, env.episode_days) == (3, 2, 9)
    assert (env.gatherer.lookback, env.cost_rate, env.execution_delay) == (7, 0.0025, 2)
    assert env.book == Book.from_env(env_config) and env.book.long_short and env.book.rebalance_every == 3


def test_a_blocks_observation_holds_each_days_windows(market):
    """``observe_block`` gathers the market's part of the next days of every episode at once, episode by episode:
    day k's windows are what ``observe`` gives after k steps; the weights, not known yet, are left out."""
    env = VectorPortfolioEnv(
        market, num_agents=2, num_episodes=3, episode_days=6, lookback=4, cost_rate=0.001, execution_delay=1
    )
    env.reset(torch.tensor([10, 14, 20]))
    block = env.observe_block(5, out=env.gatherer.empty(3, 6))
    assert block.weights is None and block.windows.shape == (3 * 5, market.num_assets, env.gatherer.window_size)
    windows = block.windows.view(3, 5, *block.windows.shape[1:]).clone()
    for day in range(5):
        assert torch.equal(windows[:, day], env.observe().windows)
        env.step(torch.softmax(torch.randn(2, 3, market.num_assets + 1), dim=-1))
