"""The market as the trainer sees it: one read-only feature tensor, price relatives and the splits.

Time conventions, used everywhere:

* Day ``t`` indexes rows of ``features`` and ``relatives``.
* ``relatives[t] = price[t] / price[t - 1]`` (row 0 uses the price before the kept rows; no decision earns it).
* A decision at day ``t`` sees ``features[t - L + 1 : t + 1]`` (what is known at the close of ``t``) and its weights.
  Its target fills ``d = env.execution_delay`` days later, at the close of ``t + d``, and is held to the close of
  ``t + d + 1``, earning ``relatives[t + d + 1]``. ``d = 1`` (the default) is a market order sent after the close
  that fills at the next one; ``d = 0`` fills at the very close the decision observed, which no one can trade:
  an optimistic convention, kept for comparison.
* A split is the range of days whose returns it earns: the decisions of split ``r`` are the days
  ``r.start - 1 - d .. r.stop - 2 - d`` (``first_decision``). The lookback of a decision may reach into the previous
  split (features are causal), but no return of a later split is ever earned by an earlier one.
* An asset trades on the days it has a price (``tradable``), from its first price to its last. On the other days
  its features are neutral, no order fills in it (a holding stays at the value it last had: its relative is 1) and
  the day trading resumes earns the move from its last price; the first day after its last price earns its delisting
  return, and from then on (``last_day``) a holding is paid out in cash at the next fill (``fill``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from environment.book import TRADING_DAYS
from environment.kernel import Fill, with_cash

__all__ = ["TRADING_DAYS", "Market", "Splits", "first_decision"]


def first_decision(split: range, execution_delay: int) -> int:
    """The decision day whose target earns the first day of ``split``."""
    return split.start - 1 - execution_delay


@dataclass(frozen=True)
class Splits:
    """Half-open day ranges ``[start, stop)`` of ``features``, in time order, covering every row.

    ``embargo`` lies between training and validation, ``gap`` between validation and holdout; no decision earns
    their returns. With ``len(gap)`` equal to the lookback plus the execution delay, the first holdout decision's
    window holds no day that training or validation traded; likewise ``embargo`` keeps validation's features from
    the days the gradient fitted.
    """

    train: range
    validation: range
    holdout: range
    gap: range = range(0)
    embargo: range = range(0)


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
    benchmark_label: str = "index"
    """What the benchmark is, as reports name it (a price index without dividends is labelled so)."""
    tradable: torch.Tensor | None = None
    """(T, N) bool: the assets that have a price on each day; None when every asset has one every day."""
    tradable_fraction: float = 1.0
    """The fraction of asset-days on which the asset has a price (counted on the host, where the market was built)."""
    feature_definitions: tuple[str, ...] = ()
    """How each feature's raw value of day ``t`` is made, in ``feature_names`` order."""
    cash_relatives: torch.Tensor | None = None
    """(T,) float32 what cash earns each day (``1 + rate`` a day, from the close before); None when it earns nothing."""
    feature_mean: torch.Tensor | None = None
    """(N, K) float32 mean of each raw (asset, feature) over the training rows, when built from prices."""
    last_day: torch.Tensor | None = None
    """(N,) long, each asset's last day with a price (negative: before the first day kept); a holding is paid out in
    cash from the day after (its delisting return earned that day). None when every asset trades to the end."""
    notes: tuple[str, ...] = ()
    """What the panel became, for a run's first lines: tickers a size limit left out, tickers that list late, delist
    or halt (``environment.features.universe_notes``)."""
    impact: torch.Tensor | None = None
    """(T, N) float32 each asset's square-root impact scale on each fill day (``environment.features.size_terms``);
    None without a volume column: costs do not grow with size."""
    capacity: torch.Tensor | None = None
    """(T, N) float32 the most of the book's value a fill on each day can trade in each asset; None likewise."""
    feature_std: torch.Tensor | None = None
    """(N, K) float32 standard deviation used to scale it (1 where the feature is constant), likewise.

    ``features = clip((raw - feature_mean) / feature_std, -FEATURE_CLIP, FEATURE_CLIP)``; see ``environment.features``.
    """

    def __post_init__(self) -> None:
        # Every day's relatives with cash's first, made once: a step reads its day's row (one gather) instead of
        # gathering, making a column of ones and concatenating (four kernels) every day. Not a field: derived.
        object.__setattr__(self, "_with_cash", with_cash(self.relatives, self.cash_relatives))  # (T, N + 1)
        object.__setattr__(self, "_spans", {1: self._with_cash})  # days -> (T, N + 1) growth over as many days

    def span_relatives(self, days: int) -> torch.Tensor:
        """(T, N + 1) each day's growth over ``days`` days from it, cash first: what a holding bought the close
        before earns until it is traded again (a buy-and-hold's drift); the days after the last count as 1."""
        if days not in self._spans:
            grown = self._with_cash.clone()
            for ahead in range(1, days):
                grown[:-ahead] *= self._with_cash[ahead:]
            self._spans[days] = grown
        return self._spans[days]

    def day_relatives(self, days: torch.Tensor, *, ahead: int = 0) -> torch.Tensor:
        """The relatives of ``days + ahead`` (``days`` (...)), cash first: (..., N + 1). ``ahead`` shifts a view, so
        the days a step reads after its decision cost no addition."""
        return self._with_cash[ahead:][days]

    def fill(self, days: torch.Tensor, *, execution_delay: int, held_days: int = 1) -> Fill:
        """What decisions made on ``days`` (...) meet at their fill, ``execution_delay`` days later (``Fill``), their
        targets held ``held_days`` days (the learner's model of a decision at a cadence; the environments step a
        day at a time)."""
        ahead = execution_delay + 1
        held = self.day_relatives(days, ahead=ahead) if held_days == 1 else self.span_relatives(held_days)[ahead:][days]
        return Fill(
            held=held,  # (..., N + 1)
            drift=None if execution_delay == 0 else self.day_relatives(days, ahead=execution_delay),
            tradable=self.tradable_on(days, ahead=execution_delay),
            delisted=None if self.last_day is None else (days + execution_delay).unsqueeze(-1) > self.last_day,
            impact=None if self.impact is None else self.impact[execution_delay:][days],
            capacity=None if self.capacity is None else self.capacity[execution_delay:][days],
            days=held_days,
        )

    def tradable_on(self, days: torch.Tensor, *, ahead: int = 0) -> torch.Tensor | None:
        """(..., N) the assets that can trade on ``days + ahead`` (``days`` (...)); None when every asset always can."""
        return None if self.tradable is None else self.tradable[ahead:][days]

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
