"""When a decision's trade fills and what it may trade: the execution delay, assets without a price, cash's rate.

The conventions (``environment.market``, ``environment.kernel``): a decision observes the close of day t; its target
fills at the close of t + d (``env.execution_delay``) and earns day t + d + 1; with d >= 1 the weights a decision sees
are the previous order, which drifts through the fill day before the new one replaces it. An asset without a price
is untradable: the actor puts no weight on it, and at a fill a holding in it stays as it is (the target's other
weights fill the rest); after its last price a holding earns the delisting return and is paid out in cash.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
from pathlib import Path

import pytest
import torch

from environment.kernel import decision_step, drift, equal_tradable_weights, fill_untradable, portfolio_step, with_cash
from environment.observation import Observation
from environment.vector_env import VectorPortfolioEnv
from tests.synthetic import make_market, make_population, random_simplex

COST = 0.001


def test_a_decision_that_fills_at_its_own_close_is_the_portfolio_step():
    g = torch.Generator().manual_seed(0)
    weights, target = random_simplex(5, 4, generator=g), random_simplex(5, 4, generator=g)
    relatives = with_cash(1 + 0.02 * torch.randn(5, 3, generator=g))
    expected = portfolio_step(weights, target, relatives, cost_rate=COST)
    got = decision_step(weights, target, relatives, cost_rate=COST)
    for a, b in zip(got, expected, strict=True):
        assert (a is None and b is None) or torch.equal(a, b)  # delay 0 is today's arithmetic, bit for bit


def test_a_delayed_decision_trades_from_the_previous_order_drifted_through_the_fill_day():
    previous = torch.tensor([0.0, 1.0, 0.0])  # the last order: all in asset 1
    target = torch.tensor([0.0, 0.0, 1.0])
    fill_day = with_cash(torch.tensor([1.10, 0.90]))
    next_day = with_cash(torch.tensor([0.95, 1.20]))
    step = decision_step(previous, target, next_day, cost_rate=COST, fill_relatives=fill_day)
    # The previous order still holds asset 1 through the fill day (it drifts, but a one-asset portfolio stays one);
    # the new target sells all of it and buys asset 2 at the fill's close: turnover 2; then asset 2 earns 1.20.
    assert step.turnover.item() == pytest.approx(2.0)
    assert step.rewards.item() == pytest.approx(math.log(1.20) + math.log1p(-2 * COST), abs=1e-6)
    assert torch.equal(step.next_weights, target)  # the next decision sees this order


def test_the_drift_before_the_fill_is_what_costs_are_charged_on():
    previous = torch.tensor([0.0, 0.5, 0.5])
    fill_day = with_cash(torch.tensor([1.2, 0.8]))  # the previous order drifts to [0, 0.6, 0.4]
    step = decision_step(previous, previous, with_cash(torch.ones(2)), cost_rate=COST, fill_relatives=fill_day)
    assert step.turnover.item() == pytest.approx(0.2, abs=1e-6)  # rebalancing the drift back to 0.5 / 0.5
    torch.testing.assert_close(drift(previous, fill_day), torch.tensor([0.0, 0.6, 0.4]))


def test_a_holding_without_a_price_stays_and_the_targets_other_weights_fill_the_rest():
    # Nothing held in the asset without a price: the target's weight there goes nowhere, its other weights fill all.
    filled = fill_untradable(torch.tensor([0.1, 0.3, 0.6]), torch.tensor([1.0, 0.0, 0.0]), torch.tensor([True, False]))
    torch.testing.assert_close(filled, torch.tensor([0.25, 0.75, 0.0]))
    # A halted holding stays as it is: no order fills at a price nobody quoted, so a target equal to the holdings (buy
    # and hold's) trades nothing, and a policy's target (nothing on the halted asset) fills around it.
    held = torch.tensor([0.0, 0.5, 0.5])
    halted = torch.tensor([True, False])
    for target, expected in ((held, held), (torch.tensor([0.2, 0.8, 0.0]), torch.tensor([0.1, 0.4, 0.5]))):
        step = decision_step(held, target, with_cash(torch.tensor([1.0, 1.0])), cost_rate=COST, tradable=halted)
        torch.testing.assert_close(step.next_weights, expected)
        assert step.turnover.item() == pytest.approx(float((expected - held)[1:].abs().sum()))
    # A target that wants only the halted asset leaves what is free in cash.
    only = fill_untradable(torch.tensor([0.0, 0.0, 1.0]), held, halted)
    torch.testing.assert_close(only, torch.tensor([0.5, 0.0, 0.5]))


def test_equal_weight_is_equal_over_the_days_tradable_assets():
    tradable = torch.tensor([[True, True, True, True], [True, False, True, False], [False, False, False, False]])
    weights = equal_tradable_weights(tradable)
    torch.testing.assert_close(weights[0], torch.tensor([0.0, 0.25, 0.25, 0.25, 0.25]))
    torch.testing.assert_close(weights[1], torch.tensor([0.0, 0.5, 0.0, 0.5, 0.0]))
    torch.testing.assert_close(weights[2], torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0]))  # nothing trades: cash


def _oracle_rewards(delay: int) -> tuple[torch.Tensor, torch.Tensor]:
    """An agent that holds, from each decision, the asset that rises most on the next day (it peeks): its rewards
    in the vector environment at ``delay``, and the market."""
    market = make_market(seed=3, num_assets=4)
    episode_days, start = 30, 20
    env = VectorPortfolioEnv(
        market,
        num_agents=1,
        num_episodes=1,
        episode_days=episode_days,
        lookback=4,
        cost_rate=0.0,
        execution_delay=delay,
    )
    env.reset(torch.tensor([start]))
    for day in range(start, start + episode_days):
        best = int(market.relatives[day + 1].argmax())  # tomorrow's winner, as of the close of `day`
        target = torch.zeros(1, 1, market.num_assets + 1)
        target[..., 1 + best] = 1.0
        env.step(target)
    return env.rewards_per_episode[0, 0], market.relatives


@pytest.mark.parametrize("delay", [0, 1, 2])
def test_each_decision_earns_the_day_its_fill_is_held_through(delay):
    rewards, relatives = _oracle_rewards(delay)
    start = 20
    for k, reward in enumerate(rewards):
        decision = start + k
        best = int(relatives[decision + 1].argmax())
        earned = relatives[decision + delay + 1, best]  # filled at the close of decision + delay, held a day
        assert reward.item() == pytest.approx(math.log(earned), abs=1e-6)
    if delay:  # the peek at tomorrow pays only when the order fills at today's close
        assert rewards.sum() < _oracle_rewards(0)[0].sum() - 0.05


def test_the_actor_puts_no_weight_on_assets_without_a_price_before_its_softmax():
    population = make_population(3, 6, seed=1)
    g = torch.Generator().manual_seed(2)
    windows = torch.randn(5, 4, 6, generator=g)  # (M, N, L * K), every agent sees them
    weights = random_simplex(3, 5, 5, generator=g)
    tradable = torch.tensor([[True, False, True, True]] * 4 + [[False, False, False, False]])
    actions = population.actor(Observation(windows, weights, tradable))  # (P, M, N + 1)
    assert torch.all(actions[..., 1:][:, ~tradable] == 0.0)
    torch.testing.assert_close(actions.sum(-1), torch.ones(3, 5))
    assert torch.all(actions[:, 4, 0] == 1.0)  # nothing trades: all cash
    # Among the tradable assets the policy is what it was: a softmax over them alone.
    free = population.actor(Observation(windows, weights))
    expected = free[:, 0, [0, 1, 3, 4]] / free[:, 0, [0, 1, 3, 4]].sum(-1, keepdim=True)
    torch.testing.assert_close(actions[:, 0, [0, 1, 3, 4]], expected)


@pytest.mark.parametrize("delisting_return", [0.0, -1.0])
def test_a_delisted_holding_earns_its_delisting_return_then_is_paid_out_without_a_cost(delisting_return):
    market = make_market(seed=4, num_assets=3)
    tradable = torch.ones(market.num_days, 3, dtype=torch.bool)
    tradable[40:, 2] = False  # asset 2 trades for the last time on day 39
    relatives = market.relatives.clone()
    relatives[40:, 2] = 1.0  # nothing after its last price
    relatives[40, 2] = 1.0 + delisting_return  # but what its holders received the day after
    last_day = torch.tensor([market.num_days - 1, market.num_days - 1, 39])
    market = dataclasses.replace(market, tradable=tradable, relatives=relatives, last_day=last_day)
    env = VectorPortfolioEnv(
        market, num_agents=1, num_episodes=1, episode_days=6, lookback=2, cost_rate=COST, execution_delay=1
    )
    env.reset(torch.tensor([36]))
    half_in_two = torch.tensor([[[0.0, 0.5, 0.0, 0.5]]])
    steps = [env.step(half_in_two)[0] for _ in range(6)]
    turnover, rewards = env.turnover_per_episode[0, 0], env.rewards_per_episode[0, 0]
    # Decisions 36 .. 37 fill at 37 .. 38 and hold asset 2 through day 39; decision 38 fills at 39 and holds it through
    # day 40, the first day without its price, which pays the delisting return (-1: the whole holding is lost).
    assert turnover[0].item() == pytest.approx(1.0)
    held = steps[2].next_weights[0, 0]  # the order that held through day 40
    growth = held[1] * market.relatives[40, 0] + held[3] * (1.0 + delisting_return)
    assert rewards[2].item() == pytest.approx(math.log(growth) + math.log1p(-COST * turnover[2].item()), abs=1e-6)
    # Decision 39 fills at 40: the holding is paid out in cash (no trade, no cost), and the order's weight on the
    # delisted asset goes nowhere: its other weight fills all, bought with the payout.
    torch.testing.assert_close(steps[3].next_weights, torch.tensor([[[0.0, 1.0, 0.0, 0.0]]]))
    paid_out = held[3] * (1.0 + delisting_return) / growth  # the cash the payout brought
    assert turnover[3].item() == pytest.approx(float(paid_out), abs=1e-6)  # buying asset 0 with it, nothing more


def test_cash_earns_its_rate_in_the_environment():
    market = make_market(seed=5)
    daily = (1 + 0.05) ** (1 / 252)
    market = dataclasses.replace(market, cash_relatives=torch.full((market.num_days,), daily))
    env = VectorPortfolioEnv(
        market, num_agents=1, num_episodes=1, episode_days=10, lookback=2, cost_rate=COST, execution_delay=1
    )
    env.reset(torch.tensor([30]))
    cash = torch.tensor([[[1.0] + [0.0] * market.num_assets]])
    for _ in range(10):
        env.step(cash)
    torch.testing.assert_close(env.rewards_per_episode.sum(), torch.tensor(10 * math.log(daily)))


def test_the_gymnasium_env_says_which_assets_trade_and_passes_the_checker():
    from gymnasium.utils.env_checker import check_env

    from environment.gym_env import PortfolioEnv

    market = make_market(seed=6)
    tradable = torch.ones(market.num_days, market.num_assets, dtype=torch.bool)
    tradable[:, 1] = False
    market = dataclasses.replace(market, tradable=tradable)
    env = PortfolioEnv(market, lookback=3, episode_days=5, cost_rate=COST, execution_delay=1)
    check_env(env, skip_render_check=True)
    observation, _ = env.reset(seed=0)
    assert observation["tradable"].tolist() == [1, 0, 1, 1]
    env.step(torch.ones(market.num_assets + 1).numpy())  # scores on every asset: asset 1 never trades
    observation, *_ = env.step(torch.ones(market.num_assets + 1).numpy())
    # Nothing is held in asset 1, so the scores' other weights fill everything, cash included: a quarter each.
    assert observation["weights"][2] == 0.0 and observation["weights"][0] == pytest.approx(0.25)


def test_every_environment_and_the_learner_trade_through_the_one_fill_rule(monkeypatch):
    """``environment.kernel.trade`` is the fill rule: the vectorised env, the gymnasium env and the learner's model
    objective call it (with what ``Market.fill`` says a decision meets), and nothing else trades."""
    import environment.gym_env as gym_env
    import environment.vector_env as vector_env
    import models.learner as learner_module
    from config import override, preset
    from environment import kernel
    from environment.loading import load_market
    from run.trainer import Trainer

    calls: list[str] = []

    def counted(where):
        def wrapped(weights, target, fill, **terms):
            assert isinstance(fill, kernel.Fill)
            calls.append(where)
            return kernel.trade(weights, target, fill, **terms)

        return wrapped

    for module, where in ((vector_env, "vector"), (gym_env, "gym"), (learner_module, "learner")):
        monkeypatch.setattr(module, "trade", counted(where))
    for module in (vector_env, gym_env, learner_module):  # none trades by the arithmetic itself
        assert not hasattr(module, "decision_step") and not hasattr(module, "portfolio_step")
    config = override(preset("smoke"), {"runtime.device": "cpu", "learner.learning_starts": 1})

    market = load_market(config, torch.device("cpu"))
    with tempfile.TemporaryDirectory() as folder:
        trainer = Trainer(config, market, Path(folder), log=lambda line: None)
        trainer.rollouts.run(trainer.rollouts.sample_starts())
        trainer.update_phase.update()
        trainer.checkpoints.close()
    env = gym_env.PortfolioEnv(market, lookback=16, episode_days=3, cost_rate=0.001, execution_delay=1)
    env.reset(seed=0)
    env.step(env.action_space.sample())
    assert {"vector", "gym", "learner"} <= set(calls)


@pytest.mark.parametrize("delay", [0, 1, 2, 5])
def test_no_observation_sees_a_tradability_not_known_yet(delay):
    """Two markets that differ only in which assets trade on day 30: every observation of a decision made before day 30
    is the same in both, at every delay (a decision sees the previous order as it filled only where that fill was at
    its own close, else as it was sent)."""
    base = make_market(seed=9, num_assets=3)
    tradable = torch.rand(base.num_days, 3, generator=torch.Generator().manual_seed(2)) > 0.2
    other = tradable.clone()
    other[30] = ~other[30]
    seen = []
    for mask in (tradable, other):
        market = dataclasses.replace(base, tradable=mask)
        env = VectorPortfolioEnv(
            market, num_agents=2, num_episodes=1, episode_days=25, lookback=2, cost_rate=COST, execution_delay=delay
        )
        g = torch.Generator().manual_seed(0)
        observations = [env.reset(torch.tensor([10])).weights.clone()]
        for _ in range(19):  # decisions on days 10 .. 29
            _, observation = env.step(random_simplex(2, 1, 4, generator=g))
            observations.append(observation.weights.clone())
        seen.append(torch.stack(observations))  # decisions on days 10 .. 29
    torch.testing.assert_close(seen[0], seen[1], rtol=0, atol=0)
    assert env.sent == (delay >= 2)
