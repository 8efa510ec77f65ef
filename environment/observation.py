"""What an agent observes, rebuilt from the one feature tensor whenever it is needed.

An observation is the market's part, the lookback window of every asset's features, and the portfolio's weights
(``Observation``). Nothing stores observations: the market's part is identified by its decision day, and
``WindowGatherer`` gathers ``features[t - L + 1 : t + 1]`` on demand (``observe``: a day's observation from its
decision day and weights, for the environments and the replay buffer alike). The gather reads a strided view of
``features`` (no copy) and writes into a caller-owned buffer, so a steady-state step allocates nothing.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


def window_size(lookback: int, num_features: int) -> int:
    """Values per asset in one observation window: its L days of K features (L * K)."""
    return lookback * num_features


class Observation(NamedTuple):
    """What an agent sees at a decision: the networks read the market's part (``models.networks``, ``features``) and
    the weights (``decide``) apart."""

    windows: torch.Tensor
    """(..., N, L * K) the lookback window of every asset's features; a leading agent dimension, or none when every
    agent sees the same windows."""
    weights: torch.Tensor | None
    """(P, ..., N + 1) the portfolio's weights, cash first; None for a block of days whose weights are not known yet."""
    tradable: torch.Tensor | None = None
    """(..., N) bool, the assets that have a price on the decision day, like ``windows`` without its agent dimension;
    None when every asset of the market always has one. The actor puts no weight on the others."""


class WindowGatherer:
    """Gathers (N, L, K) lookback windows for batches of decision days.

    Args:
        features: (T, N, K) contiguous feature tensor (read, never written).
        lookback: L, days per window.
        tradable: (T, N) bool, the assets that have a price on each day (``Market.tradable``), or None.
    """

    def __init__(self, features: torch.Tensor, lookback: int, tradable: torch.Tensor | None = None) -> None:
        if not features.is_contiguous():
            raise ValueError("features must be contiguous")
        num_days, num_assets, num_features = features.shape
        if lookback > num_days:
            raise ValueError(f"lookback {lookback} exceeds the {num_days} days of features")
        self.lookback = lookback
        self.tradable = tradable
        self.num_assets = num_assets
        self.num_features = num_features
        # (T - L + 1, N, L, K): row s is features[s : s + L] with assets first; a view, no copy.
        stride_day, stride_asset, stride_feature = features.stride()
        self._windows = features.as_strided(
            (num_days - lookback + 1, num_assets, lookback, num_features),
            (stride_day, stride_asset, stride_day, stride_feature),
        )

    @property
    def window_size(self) -> int:
        """Values per asset in one window: L * K."""
        return window_size(self.lookback, self.num_features)

    def empty(self, *shape: int, device: torch.device | None = None) -> torch.Tensor:
        """A buffer for ``gather``: (*shape, N, L * K)."""
        device = device or self._windows.device
        return torch.empty(*shape, self.num_assets, self.window_size, device=device)

    def observe(
        self, days: torch.Tensor, weights: torch.Tensor | None, *, out: torch.Tensor | None = None
    ) -> Observation:
        """The observation at decision days ``days`` of portfolios holding ``weights``: the market's part gathered
        (into ``out``, from ``empty(*days.shape)``), the weights as given."""
        tradable = None if self.tradable is None else self.tradable[days]
        return Observation(self.gather(days, out=out), weights, tradable)

    def gather(self, days: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Windows ending at ``days`` (inclusive): (*days.shape, N, L * K).

        Args:
            days: integer decision days, each >= L - 1.
            out: optional buffer from ``empty(*days.shape)``, overwritten and returned.
        """
        if out is None:
            out = self.empty(*days.shape)
        flat = out.view(-1, self.num_assets, self.lookback, self.num_features)
        torch.index_select(self._windows, 0, (days.reshape(-1) - (self.lookback - 1)).long(), out=flat)
        return out
