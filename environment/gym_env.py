"""One portfolio as a standard ``gymnasium.Env``, on the same step kernel as the vectorised one.

For users who want to plug the market into other RL code, and for tests that pin the vectorised
environment to a reference.

* Observation space: ``Dict(window=Box(-inf, inf, (N, L * K)), weights=Box(0, 1, (N + 1,)))``;
  the window holds the last L days of the K per-asset features, flattened per asset (days, then
  features); weights are the portfolio, cash first: the holdings at the decision's close with
  ``execution_delay`` 0, else the previous order (``environment.kernel.decision_step``; as sent where it fills after
  the decision in a market whose assets do not all trade every day, ``orders_seen_as_sent``). In a market whose assets
  do not all trade every day, ``tradable=MultiBinary(N)`` says which have a price on the decision day.
* Action space: ``Box(0, 1, (N + 1,))``, non-negative scores normalised to target weights (all
  zeros means all cash), filled ``execution_delay`` days later; weight on an asset that cannot trade then stays in
  cash. In a long-short book (``env.book``), ``Box(-G, G, (N + 1,))``: entries 1..N are the assets' target weights
  (entry 0 is ignored: cash is what they leave), shrunk at the fill to the book's limits (``environment.book``), and
  the observed weights lie in ``[-G, 1 + G]``. At a cadence (``env.rebalance_every`` k), only every k-th step's action
  trades; the book drifts on through the others.
* Reward: ``log(growth * (1 - cost_rate * turnover))`` over the day the target is held, see ``environment.kernel``.
* Episode end: never terminated; truncated after ``episode_days`` steps.
* Randomness: the start day, drawn uniformly by ``self.np_random`` unless ``options={"start_date": "YYYY-MM-DD"}``
  (or ``{"start_day": t}``, a row of the market) names it.
* ``info``: ``day`` and ``date``, the decision day of the observation returned (from ``reset`` and every ``step``),
  and after a step its ``turnover``, ``cost`` (impact included), ``impact`` and ``fees`` (borrow and financing).

``gymnasium.make("erl_trader/Portfolio-v0", data=PATH, split="train", settings={"env.lookback": 5})`` builds one from
a data file as a run would (``make_portfolio_env``; ``import environment`` registers it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch

from environment.book import LONG_ONLY, Book, cash_first
from environment.kernel import cash_weights, scores_to_weights, trade
from environment.market import Market
from environment.observation import WindowGatherer
from environment.vector_env import episode_starts, orders_seen_as_sent


class PortfolioEnv(gym.Env):
    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(
        self,
        market: Market,
        *,
        split: str = "train",
        lookback: int,
        episode_days: int,
        cost_rate: float,
        execution_delay: int,
        report_tradable: bool | None = None,
        book: Book = LONG_ONLY,
    ) -> None:
        """``report_tradable``: the observation holds ``tradable`` (the decision day's prices) even in a market whose
        assets all trade every day (a point-in-time universe: the space is the same whatever the panel); None: only
        where some asset-day has no price."""
        super().__init__()
        if split not in ("train", "validation", "holdout"):
            raise ValueError(f"split must be train, validation or holdout, got {split!r}")
        self.market = market
        self.episode_days = episode_days
        self.cost_rate = cost_rate
        self.execution_delay = execution_delay
        self.book = book
        self.sent = orders_seen_as_sent(market, execution_delay, book.rebalance_every)
        self.gatherer = WindowGatherer(market.features, lookback, market.tradable)
        self.starts = episode_starts(
            getattr(market.splits, split),
            lookback=lookback,
            episode_days=episode_days,
            execution_delay=execution_delay,
        )
        if len(self.starts) == 0:
            raise ValueError(f"the {split} split is too short for an episode of {episode_days} days")
        n = market.num_assets
        low, high = float(market.features.min()), float(market.features.max())
        spaces: dict[str, gym.Space] = {
            "window": gym.spaces.Box(low, high, (n, self.gatherer.window_size), np.float32),
            "weights": gym.spaces.Box(*self._weight_bounds(), (n + 1,), np.float32),
        }
        self.report_tradable = market.tradable is not None if report_tradable is None else report_tradable
        if self.report_tradable:
            spaces["tradable"] = gym.spaces.MultiBinary(n)
        self.observation_space = gym.spaces.Dict(spaces)
        reach = book.gross_leverage if book.long_short else 1.0
        self.action_space = gym.spaces.Box(-reach if book.long_short else 0.0, reach, (n + 1,), np.float32)
        self._weights = cash_weights((), n, device=market.device)
        self._held = self._weights
        self._day = self.starts.start
        self._step = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        options = options or {}
        if "start_date" in options:
            day = self._day_of(str(options["start_date"]))
        elif "start_day" in options:
            day = int(options["start_day"])
            if day not in self.starts:
                raise ValueError(f"start_day {day} outside {self.starts}")
        else:
            day = int(self.starts[self.np_random.integers(len(self.starts))])
        self._day = day
        self._step = 0
        self._weights = cash_weights((), self.market.num_assets, device=self.market.device)  # what a decision sees
        self._held = self._weights  # the previous order as it filled (``orders_seen_as_sent``)
        return self._observation(), self._info()

    def _day_of(self, date: str) -> int:
        """The market's row of a decision ``date`` that can start an episode here, or a ValueError saying why not."""
        dates = self.market.dates
        first, last = dates[self.starts.start], dates[self.starts.stop - 1]
        if date not in dates:
            raise ValueError(f"start_date {date} is not a trading day of the data ({dates[0]} to {dates[-1]})")
        day = dates.index(date)
        if day not in self.starts:
            raise ValueError(
                f"start_date {date} cannot start an episode of {self.episode_days} days in this split: its decisions "
                f"start from {first} to {last}"
            )
        return day

    def _weight_bounds(self) -> tuple[float, float]:
        """What an observed weight can be: [0, 1] long-only; [-G, 1 + G] long-short (cash holds short proceeds)."""
        if not self.book.long_short:
            return 0.0, 1.0
        return -self.book.gross_leverage, 1.0 + self.book.gross_leverage

    def _info(self) -> dict[str, Any]:
        return {"day": self._day, "date": self.market.dates[self._day]}

    def step(self, action: np.ndarray):
        action = torch.as_tensor(np.asarray(action, dtype=np.float32), device=self.market.device)
        target = cash_first(action[1:]) if self.book.long_short else scores_to_weights(action)
        fill = self.market.fill(
            torch.tensor(self._day, device=self.market.device), execution_delay=self.execution_delay
        )
        deciding = self._step % self.book.rebalance_every == 0  # off the cadence nothing trades
        rebalance = None if self.book.rebalance_every == 1 else torch.tensor(deciding, device=self.market.device)
        result = trade(self._held, target, fill, cost_rate=self.cost_rate, book=self.book, rebalance=rebalance)
        self._held = result.next_weights
        if self.sent:  # the order as sent; off the cadence none is, and the last one stands
            self._weights = target if deciding else self._weights
        else:
            self._weights = result.next_weights
        self._day += 1
        self._step += 1
        truncated = self._step >= self.episode_days
        info = {
            **self._info(),
            "turnover": float(result.turnover),
            "cost": float(result.costs),
            "impact": 0.0 if result.impact is None else float(result.impact),
            "fees": 0.0 if result.fees is None else float(result.fees),
        }
        return self._observation(), float(result.rewards), False, truncated, info

    def _observation(self) -> dict[str, np.ndarray]:
        window = self.gatherer.gather(torch.tensor([self._day], device=self.market.device))[0]
        # Drift can push a weight a hair outside its bounds in float32; the space says where they lie.
        weights = self._weights.clamp(*self._weight_bounds())
        observation = {"window": window.cpu().numpy(), "weights": weights.cpu().numpy().astype(np.float32)}
        if self.report_tradable:
            tradable = self.market.tradable_on(torch.tensor(self._day, device=self.market.device))
            observation["tradable"] = (
                np.ones(self.market.num_assets, np.int8) if tradable is None else tradable.cpu().numpy().astype(np.int8)
            )
        return observation


ENV_ID = "erl_trader/Portfolio-v0"
"""The id under which ``import environment`` registers ``make_portfolio_env`` with gymnasium."""


def make_portfolio_env(
    *, data: str | None = None, split: str = "train", settings: Mapping[str, Any] | None = None
) -> PortfolioEnv:
    """A single-portfolio env on the market a run of the ``default`` preset with ``settings`` would build.

    Args:
        data: a price file, as ``--data`` takes it; None: the bundled data set.
        split: ``train``, ``validation`` or ``holdout``: the days its episodes trade.
        settings: dotted config keys, as ``--set`` takes them (``{"env.lookback": 5, "data.universe": "common"}``;
            a value may be a string as on the command line).
    """
    from config import override, preset  # the config is the run's: its presets and checks
    from environment.loading import load_market

    values = {**({"data.path": str(data)} if data else {}), **dict(settings or {})}
    config = override(preset("default"), values)
    env = config.env
    return PortfolioEnv(
        load_market(config, torch.device("cpu")),
        split=split,
        lookback=env.lookback,
        episode_days=env.episode_days,
        cost_rate=env.cost_rate,
        execution_delay=env.execution_delay,
        report_tradable=True if config.data.universe == "point_in_time" else None,
        book=Book.from_env(env),
    )
