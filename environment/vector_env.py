"""P agents x E episodes stepping in lockstep: the environment the trainer runs.

Every agent runs the same E episodes (common random numbers: fitness differences come from
the policies, not from luck of the draw). All state lives in arrays allocated here once; ``reset``
overwrites them with new start days.

Spaces, per agent and episode (see ``kernel`` for the step arithmetic):

* observation: the lookback window of features ending at the decision day, (N, L * K), shared by
  all agents, plus the agent's weights, (N + 1,), cash first: its holdings when targets fill at the close they
  observed, else its previous order (``environment.kernel.decision_step``): as it filled when that was at the
  decision's close, as it was sent when it fills later (``orders_seen_as_sent``); and, in a market whose assets do
  not all trade every day, which of them can.
* action: target weights on the simplex, (N + 1,), filled ``execution_delay`` days after the decision.
* reward: log of the portfolio's net growth over the day the target is held, costs of its fill included.
* episode end: after ``episode_days`` steps the window ends; that is a truncation (the market goes
  on, so targets bootstrap through it). Nothing terminates an episode: a long-only portfolio with
  costs below 100% cannot be ruined.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from config import EnvConfig
from environment.book import LONG_ONLY, Book
from environment.kernel import drift, equal_tradable_weights, trade
from environment.market import Market, first_decision
from environment.observation import Observation, WindowGatherer


class Step(NamedTuple):
    days: torch.Tensor
    """(E,) decision day of the step."""
    weights: torch.Tensor
    """(P, E, N + 1) weights the agents saw."""
    actions: torch.Tensor
    """(P, E, N + 1) target weights they chose."""
    rewards: torch.Tensor
    """(P, E) log net growth."""
    next_weights: torch.Tensor
    """(P, E, N + 1) the weights the next decision sees."""
    truncated: torch.Tensor
    """() bool, on the device: True on the last step of the window."""
    held: torch.Tensor | None = None
    """(P, E, N + 1) the previous order as it filled, which this trade started from, where the decision saw it as sent
    (``orders_seen_as_sent``); None where the two are the same."""


def orders_seen_as_sent(market: Market, execution_delay: int, rebalance_every: int = 1) -> bool:
    """Whether a decision sees the previous order as it was sent rather than as it filled: with a delay of two days or
    more that order fills after the decision, and in a market whose assets do not all trade every day its fill
    applies a tradability the decision cannot know yet; at a cadence of more than a day, a day off it fills the
    holdings as they drifted through its fill day, which it cannot know yet either. (With a delay of one day it
    fills at the decision's close.)"""
    return execution_delay >= 2 and (market.tradable is not None or rebalance_every > 1)


def episode_starts(split: range, *, lookback: int, episode_days: int, execution_delay: int) -> range:
    """Decision days on which an episode of ``episode_days`` steps can start inside ``split``.

    A window's decisions earn returns of days ``start + d + 1 .. start + d + episode_days`` (``d`` the execution
    delay), all inside ``split``, and its first lookback window must be complete.
    """
    first = max(first_decision(split, execution_delay), lookback - 1)
    last = split.stop - 1 - episode_days - execution_delay
    return range(first, max(first, last + 1))


class VectorPortfolioEnv:
    """P agents x E episodes of ``episode_days`` steps each, in lockstep, on ``market``'s device.

    ``apply`` is a day's step as device work only (the day within the window is counted on the device too), so a
    day can be captured once and replayed as a CUDA graph (``runtime.graphs``); ``step`` is ``apply`` with the
    window's end checked on the host, for loops that run eagerly.
    """

    def __init__(
        self,
        market: Market,
        *,
        num_agents: int,
        num_episodes: int,
        episode_days: int,
        lookback: int,
        cost_rate: float,
        execution_delay: int,
        book: Book = LONG_ONLY,
        record: bool = False,
    ) -> None:
        self.market = market
        self.num_agents = num_agents
        self.num_episodes = num_episodes
        self.episode_days = episode_days
        self.cost_rate = cost_rate
        self.execution_delay = execution_delay
        self.book = book
        self.gatherer = WindowGatherer(market.features, lookback, market.tradable)
        device = market.device
        n = market.num_assets
        # Everything the environment holds, allocated once.
        self.windows = self.gatherer.empty(num_episodes, device=device)  # (E, N, L * K), the current observation's
        self.weights = torch.zeros(num_agents, num_episodes, n + 1, device=device)  # (P, E, N + 1), likewise
        self.sent = orders_seen_as_sent(market, execution_delay, book.rebalance_every)
        # The previous order as it filled, where the decision sees it as sent; else the very weights it sees.
        self.held = torch.zeros_like(self.weights) if self.sent else self.weights  # (P, E, N + 1)
        self._days = torch.zeros(num_episodes, dtype=torch.long, device=device)  # (E,)
        self._day = torch.zeros(1, dtype=torch.long, device=device)  # (1,) the step within the window
        self._offsets = torch.arange(episode_days, device=device)  # (D,) a day's place in a block of days
        self._step = 0  # the same, counted on the host by ``step``
        self.rewards_per_episode = torch.zeros(num_agents, num_episodes, episode_days, device=device)
        self.turnover_per_episode = torch.zeros(num_agents, num_episodes, episode_days, device=device)
        # What a report shows beside the rewards (``record``): each day's holding fees, impact and the weights held.
        self.record = record
        if record:
            self.fees_per_episode = torch.zeros_like(self.rewards_per_episode)
            self.impact_per_episode = torch.zeros_like(self.rewards_per_episode)
            self.held_per_episode = torch.zeros(num_agents, num_episodes, episode_days, n + 1, device=device)

    @classmethod
    def from_config(
        cls, market: Market, env: EnvConfig, *, num_agents: int, num_episodes: int, episode_days: int
    ) -> VectorPortfolioEnv:
        """The environment a run's ``EnvConfig`` describes (its lookback, costs, delay and book) for ``num_agents``
        rows on ``num_episodes`` episodes of ``episode_days`` days."""
        return cls(
            market,
            num_agents=num_agents,
            num_episodes=num_episodes,
            episode_days=episode_days,
            lookback=env.lookback,
            cost_rate=env.cost_rate,
            execution_delay=env.execution_delay,
            book=Book.from_env(env),
        )

    @property
    def step_index(self) -> int:
        return self._step

    def reset(self, start_days: torch.Tensor) -> Observation:
        """Start every episode in cash at its decision day ``start_days[e]``."""
        if start_days.shape != (self.num_episodes,):
            raise ValueError(f"expected {self.num_episodes} start days, got shape {tuple(start_days.shape)}")
        self._days.copy_(start_days)
        self.weights.zero_()
        self.weights.select(-1, 0).fill_(1.0)  # fill_: a scalar assignment would copy from the host
        if self.sent:
            self.held.copy_(self.weights)
        self._day.zero_()
        self._step = 0
        self.rewards_per_episode.zero_()
        self.turnover_per_episode.zero_()
        if self.record:
            for history in (self.fees_per_episode, self.impact_per_episode):
                history.zero_()
            self.held_per_episode.zero_()
        return self.observe()

    def observe(self) -> Observation:
        """Today's observation: windows (E, N, L * K), shared by every agent, and weights (P, E, N + 1)."""
        return self.gatherer.observe(self._days, self.weights, out=self.windows)

    def observe_block(self, days: int, out: torch.Tensor) -> Observation:
        """The market's part of the next ``days`` decisions of every episode, gathered at once on the device: windows
        (E * days, N, L * K), episode by episode, into the front of ``out`` (a buffer from ``gatherer.empty(E, at
        least days)``); no weights, which only the days before will tell."""
        shape = (self.num_episodes, days, *out.shape[2:])
        block = out.view(-1)[: math.prod(shape)].view(shape)  # the buffer's front, contiguous
        observation = self.gatherer.observe(self._days[:, None] + self._offsets[:days], None, out=block)
        tradable = None if observation.tradable is None else observation.tradable.flatten(0, 1)
        return observation._replace(windows=observation.windows.flatten(0, 1), tradable=tradable)

    def tradable_today(self) -> torch.Tensor | None:
        """(E, N) the assets with a price on today's decision day; None when all always have one."""
        return self.market.tradable_on(self._days)

    def equal_weight(self, out: torch.Tensor) -> torch.Tensor:
        """Equal weight over today's tradable assets, into ``out`` (E, N + 1): the baseline's target (an ``out`` set to
        equal weight once stays right in a market whose assets always trade)."""
        tradable = self.tradable_today()
        return out if tradable is None else equal_tradable_weights(tradable, out=out)

    def weights_before_fill(self) -> torch.Tensor:
        """(P, E, N + 1) the holdings just before today's decisions fill: a target of these trades nothing (buy and
        hold's). With a delay, the previous order drifted through the fill day, which the decision cannot know."""
        if self.execution_delay == 0:
            return self.weights
        return drift(self.held, self.market.day_relatives(self._days, ahead=self.execution_delay))

    def apply(self, actions: torch.Tensor, *, transition: bool = True) -> Step | None:
        """One day of every episode with target weights (P, E, N + 1), on the device alone: the histories and the
        weights and days are written in place (the next observation is gathered by ``observe`` or
        ``observe_block``). Returns the day's transitions, or None without ``transition`` (validation keeps only the
        histories, and copies nothing for a replay buffer)."""
        fill = self.market.fill(self._days, execution_delay=self.execution_delay)  # each tensor (E, ...)
        every = self.book.rebalance_every
        rebalance = None if every == 1 else self._day % every == 0  # (1,): a decision day of the book's cadence
        result = trade(self.held, actions, fill, cost_rate=self.cost_rate, book=self.book, rebalance=rebalance)
        self.rewards_per_episode.index_copy_(2, self._day, result.rewards.unsqueeze(-1))
        self.turnover_per_episode.index_copy_(2, self._day, result.turnover.unsqueeze(-1))
        if self.record:
            self._record(result)
        # Off the cadence a decision is no order: the book holds on, as the decision saw it.
        decided = actions if rebalance is None else torch.where(rebalance, actions, self.weights)
        step = None
        if transition:
            step = Step(
                days=self._days.clone(),
                weights=self.weights.clone(),
                actions=decided,
                rewards=result.rewards,
                next_weights=decided if self.sent else result.next_weights,
                truncated=(self._day == self.episode_days - 1).squeeze(0),
                held=self.held.clone() if self.sent else None,
            )
        if self.sent:  # the next decision sees this order as sent; the next trade starts from it as it filled
            self.held.copy_(result.next_weights)
            self.weights.copy_(decided)
        else:
            self.weights.copy_(result.next_weights)
        self._days += 1
        self._day += 1
        return step

    def _record(self, result) -> None:
        """Writes the day's holding fees, impact and weights held into their histories (a book without fees or
        impact leaves them at the zeros ``reset`` wrote)."""
        for history, value in ((self.fees_per_episode, result.fees), (self.impact_per_episode, result.impact)):
            if value is not None:
                history.index_copy_(2, self._day, value.unsqueeze(-1))
        self.held_per_episode.index_copy_(2, self._day, result.target.unsqueeze(2))

    def step(self, actions: torch.Tensor) -> tuple[Step, Observation | None]:
        """``apply``; returns the transition and the next observation (None once the window is truncated)."""
        if self._step >= self.episode_days:
            raise RuntimeError("the episode is over; call reset()")
        step = self.apply(actions)
        self._step += 1
        return step, (None if self._step == self.episode_days else self.observe())
