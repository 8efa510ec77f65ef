"""The market as the trainer sees it: one read-only feature tensor, price relatives and the splits.

Time conventions, used everywhere:

* Day ``t`` indexes rows of ``features`` and ``relatives``.
* ``relatives[t] = price[t] / price[t - 1]`` (row 0 uses the price before the kept rows; no decision earns it).
* A decision at day ``t`` sees ``features[t - L + 1 : t + 1]`` and the current weights, and its
  target weights are held from the close of ``t`` to the close of ``t + 1``, earning ``relatives[t + 1]``.
* A split is the range of days whose returns it earns: the decisions of split ``r`` are the days
  ``r.start - 1 .. r.stop - 2``. The lookback of a decision may reach into the previous split
  (features are causal), but no return of a later split is ever earned by an earlier one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Splits:
    """Half-open day ranges ``[start, stop)`` of ``features``, in time order, covering every row.

    ``gap`` lies between validation and holdout; no decision earns its returns. With ``len(gap)`` equal to
    the lookback, the first holdout decision's window holds no day that training or validation traded.
    """

    train: range
    validation: range
    holdout: range
    gap: range = range(0)


@dataclass(frozen=True)
class Market:
    """Everything the environments read, built once at start and never copied."""

    dates: tuple[str, ...]
    """ISO date (YYYY-MM-DD) of every row."""
    tickers: tuple[str, ...]
    """Asset names, in column order."""
    feature_names: tuple[str, ...]
    """Names of the K per-asset features."""
    features: torch.Tensor
    """(T, N, K) float32, normalised with training-range statistics, on the training device."""
    relatives: torch.Tensor
    """(T, N) float32 price relatives ``price[t] / price[t - 1]``, on the training device."""
    splits: Splits
    """Train, validation and holdout day ranges."""
    benchmark: torch.Tensor | None = None
    """(T,) float32 relatives of a benchmark index on the same days, when the data set has one."""
    feature_mean: torch.Tensor | None = None
    """(N, K) float32 mean of each raw (asset, feature) over the training rows, when built from prices."""
    feature_std: torch.Tensor | None = None
    """(N, K) float32 standard deviation used to scale it (1 where the feature is constant), likewise.

    ``features = clip((raw - feature_mean) / feature_std, -FEATURE_CLIP, FEATURE_CLIP)``; see ``environment.features``.
    """

    @property
    def num_days(self) -> int:
        return self.features.shape[0]

    @property
    def num_assets(self) -> int:
        return self.features.shape[1]

    @property
    def num_features(self) -> int:
        return self.features.shape[2]

    @property
    def device(self) -> torch.device:
        return self.features.device
