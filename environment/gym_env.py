"""One portfolio as a standard ``gymnasium.Env``, on the same step kernel as the vectorised one.

For users who want to plug the market into other RL code, and for tests that pin the vectorised
environment to a reference.

* Observation space: ``Dict(window=Box(-inf, inf, (N, L * K)), weights=Box(0, 1, (N + 1,)))``;
  the window holds the last L days of the K per-asset features, flattened per asset (days, then
  features); weights are the current portfolio, cash first.
* Action space: ``Box(0, 1, (N + 1,))``, non-negative scores normalised to target weights (all
  zeros means all cash).
* Reward: ``log(growth * (1 - cost_rate * turnover))``, see ``environment.kernel``.
* Episode end: never terminated; truncated after ``episode_days`` steps.
* Randomness: the start day, drawn uniformly by ``self.np_random`` unless
  ``options={"start_day": t}`` names it.
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch

from environment.kernel import cash_weights, portfolio_step, scores_to_weights, with_cash
from environment.market import Market
from environment.observation import WindowGatherer
from environment.vector_env import episode_starts


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
    ) -> None:
        super().__init__()
        self.market = market
        self.episode_days = episode_days
        self.cost_rate = cost_rate
        self.gatherer = WindowGatherer(market.features, lookback)
        self.starts = episode_starts(getattr(market.splits, split), lookback=lookback, episode_days=episode_days)
        if len(self.starts) == 0:
            raise ValueError(f"the {split} split is too short for an episode of {episode_days} days")
        n = market.num_assets
        low, high = float(market.features.min()), float(market.features.max())
        self.observation_space = gym.spaces.Dict(
            {
                "window": gym.spaces.Box(low, high, (n, self.gatherer.window_size), np.float32),
                "weights": gym.spaces.Box(0.0, 1.0, (n + 1,), np.float32),
            }
        )
        self.action_space = gym.spaces.Box(0.0, 1.0, (n + 1,), np.float32)
        self._weights = cash_weights((), n, device=market.device)
        self._day = self.starts.start
        self._step = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        if options and "start_day" in options:
            day = int(options["start_day"])
            if day not in self.starts:
                raise ValueError(f"start_day {day} outside {self.starts}")
        else:
            day = int(self.starts[self.np_random.integers(len(self.starts))])
        self._day = day
        self._step = 0
        self._weights = cash_weights((), self.market.num_assets, device=self.market.device)
        return self._observation(), {"day": day}

    def step(self, action: np.ndarray):
        target = scores_to_weights(torch.as_tensor(np.asarray(action, dtype=np.float32), device=self.market.device))
        relatives = with_cash(self.market.relatives[self._day + 1])
        result = portfolio_step(self._weights, target, relatives, cost_rate=self.cost_rate)
        self._weights = result.next_weights
        self._day += 1
        self._step += 1
        truncated = self._step >= self.episode_days
        info = {"day": self._day, "turnover": float(result.turnover), "cost": float(result.costs)}
        return self._observation(), float(result.rewards), False, truncated, info

    def _observation(self) -> dict[str, np.ndarray]:
        window = self.gatherer.gather(torch.tensor([self._day], device=self.market.device))[0]
        # Drift can push a weight a hair outside [0, 1] in float32; the space says [0, 1].
        weights = self._weights.clamp(0.0, 1.0)
        return {"window": window.cpu().numpy(), "weights": weights.cpu().numpy().astype(np.float32)}
