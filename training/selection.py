"""Choosing the champion without fooling ourselves: an edge over equal weight that survives the count of tries.

A run compares P agents in each of G generations on the same validation days, so the best of them looks good
partly by luck, and on a market with no signal at all the best of P x G candidates always "wins". Selection
therefore asks for evidence, not for the highest score.

**The statistic.** A candidate's daily log returns on the validation range (net of costs, one continuous episode
from cash) are compared with equal weight's on the same days, ``excess[t] = r[t] - r_equal_weight[t]``, and
summarised by the t statistic ``t = sqrt(D) * mean(excess) / std(excess)``.

**The gate (``method="bootstrap"``, the default).** The candidates of a run are near-clones (elites survive,
offspring are small mutations of parents), so a test that treats them as independent, as Bonferroni does, pays
for an independence that is not there. The gate instead takes the distribution of the *largest* t of a
generation's candidates from a bootstrap of the validation days, with every candidate resampled on the same days
so that their correlation is kept (the max-statistic test of White's Reality Check, studentized and recentred
as in Hansen's SPA test: a candidate clearly worse than equal weight is not let into the maximum). The days are
resampled by the stationary bootstrap (random blocks of mean length ``b``; ``b`` chosen from the data by the
Politis-White rule, ``block_length``), so a dependence between days is kept too.

Every generation looks again at the same days, so the looks are handled as a group-sequential test: one set of
bootstrap resamples serves the whole run (the same day indices every generation), a resample "crosses" once
the largest bootstrap t of some generation passed that generation's critical value, and the critical value of
generation g is the smallest one that keeps the share of crossed resamples at or below ``spent(g) = alpha * g /
(g + h)`` (``h``: ``selection.half_spent_at``). ``spent(g) < alpha`` for every g, so a run may be extended on
resume without touching the guarantee. If generation g's candidates are clones of earlier ones, the resamples
where they look good crossed already and the critical value barely moves; the test pays only for new evidence.

**The guarantee.** The candidates are made without looking at the validation days (evolution selects on
training fitness only), so under the null hypothesis that no candidate of the run has a positive expected
daily excess over equal weight, the chance that the run ever crowns an agent is at most ``alpha`` up to the
bootstrap's approximation error, whatever the number of generations and the correlation between candidates
(family-wise, for every generation together). The false-positive rate is measured, not assumed: on independent
and on cloned null candidates in ``tests/training/test_selection.py`` and ``benchmarks/selection_power.py``.

**The champion.** Equal weight has an edge of exactly 0 and is the champion until a candidate's t passes the
critical value. ``edges`` gives each candidate's edge, its annualised mean excess; ``edge_bounds`` turns the critical
value into the edge's lower confidence bound: positive exactly when the candidate passes. The edge a candidate must
exceed to be proven is its edge less its bound. Among the proven candidates, ``selection.choose_by`` picks:
``return`` (the default), the highest validation return, crowned if above the current champion's on the same days;
or ``bound``, the highest bound, crowned if above the champion's.

``method="bonferroni"`` keeps the earlier test for comparison: ``z`` the normal quantile of ``1 - alpha / (P g
(g + 1))``, which holds whatever the correlation but needs an annualised information ratio over equal weight of
about ``z / sqrt(D / 252)`` (z = 4.3 in generation 20 for 16 agents: 3.1 on two years of validation).
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import NamedTuple

import numpy as np
import torch

from config import ChooseBy

TRADING_DAYS = 252
_CHUNK_ELEMENTS = 1 << 22
"""Resampled values held at once while the gate computes its bootstrap statistics (32 MB of float64)."""


class ValidationReturns(NamedTuple):
    """A generation's daily log returns on the validation days, net of costs, on the host (float64), by whose."""

    rows: torch.Tensor
    """(P + 2, D) as validation runs them: the agents in slot order, then the champion, then equal weight."""

    @property
    def agents(self) -> torch.Tensor:
        """(P, D)."""
        return self.rows[:-2]

    @property
    def champion(self) -> torch.Tensor:
        """(D,) the champion's (equal weight's until an agent is crowned)."""
        return self.rows[-2]

    @property
    def equal_weight(self) -> torch.Tensor:
        """(D,) equal weight's, rebalanced daily: the baseline."""
        return self.rows[-1]

    @property
    def candidates(self) -> torch.Tensor:
        """(P + 1, D) the agents and the champion: what is compared with the baseline."""
        return self.rows[:-1]

    @property
    def excess(self) -> torch.Tensor:
        """(P, D) each agent's daily excess over equal weight."""
        return self.agents - self.equal_weight

    @property
    def totals(self) -> torch.Tensor:
        """(P + 2,) validation log returns, in the order of ``rows``."""
        return self.rows.sum(dim=1)


class Champion(NamedTuple):
    """The run's champion, as one value: equal weight (generation 0) until an agent proves an edge over it."""

    score: float
    """Its validation log return (on the days every candidate is compared on); -inf before the first look."""
    bound: float
    """The lower confidence bound of its annualised edge over equal weight (``edge_bounds``); 0 for equal weight."""
    generation: int
    """The generation that crowned it; 0: equal weight."""


EQUAL_WEIGHT = Champion(score=-math.inf, bound=0.0, generation=0)
"""The champion before any agent is crowned."""


def selection_z(popsize: int, generation: int, alpha: float) -> float:
    """Bonferroni's one-sided normal quantile for ``generation`` (1-based): ``method="bonferroni"``."""
    if popsize < 1 or generation < 1 or not 0.0 < alpha < 1.0:
        raise ValueError(f"need popsize, generation >= 1 and alpha in (0, 1), got {popsize}, {generation}, {alpha}")
    return NormalDist().inv_cdf(1.0 - alpha / (popsize * generation * (generation + 1)))


def spent_alpha(generation: int, alpha: float, half_spent_at: int) -> float:
    """Error budget the gate may have spent by ``generation`` (1-based): rises to ``alpha``, never reaches it."""
    if generation < 1 or half_spent_at < 1:
        raise ValueError(f"need generation, half_spent_at >= 1, got {generation}, {half_spent_at}")
    return alpha * generation / (generation + half_spent_at)


def t_statistics(excess: torch.Tensor) -> torch.Tensor:
    """(S, D) daily excess returns -> (S,) ``sqrt(D) * mean / std``; 0 for a series with no spread (equal weight)."""
    days = excess.shape[-1]
    spread = excess.std(dim=-1, correction=1)
    t = math.sqrt(days) * excess.mean(dim=-1) / spread.clamp_min(torch.finfo(excess.dtype).tiny)
    return torch.where(spread > 0, t, torch.zeros_like(t))


def block_length(series: np.ndarray) -> float:
    """Mean block length of the stationary bootstrap for the mean of ``series`` (D,), by the rule of Politis and
    White (2004) with the correction of Patton, Politis and White (2009); at least 1 (no dependence: plain
    resampling of days)."""
    x = np.asarray(series, dtype=np.float64)
    n = len(x)
    if n < 4:
        return 1.0
    x = x - x.mean()
    variance = float(x @ x) / n
    if variance == 0.0:
        return 1.0
    run = max(5, math.ceil(math.sqrt(math.log10(n))))  # K_n: insignificant autocorrelations in a row
    max_lag = min(n - 1, math.ceil(math.sqrt(n)) + run)
    autocov = np.array([float(x[: n - k] @ x[k:]) / n for k in range(max_lag + 1)])
    rho = autocov[1:] / variance
    # The first lag after which K_n autocorrelations in a row are insignificant (half the flat-top window's width).
    bound = 2.0 * math.sqrt(math.log10(n) / n)
    insignificant = np.abs(rho) < bound
    m_hat = len(rho)
    for m in range(len(rho) - run + 1):
        if insignificant[m : m + run].all():
            m_hat = m
            break
    if m_hat == 0:
        return 1.0
    width = min(2 * m_hat, max_lag)
    lags = np.arange(-width, width + 1)
    weights = np.clip(2.0 * (1.0 - np.abs(lags) / width), 0.0, 1.0)  # flat top: 1 up to width / 2
    covs = autocov[np.abs(lags)]
    g_hat = float(np.sum(weights * np.abs(lags) * covs))
    long_run = float(np.sum(weights * covs))
    if long_run <= 0.0 or g_hat == 0.0:
        return 1.0
    b = (g_hat**2 / long_run**2) ** (1.0 / 3.0) * n ** (1.0 / 3.0)  # (2 G^2 / D_SB)^(1/3), D_SB = 2 g(0)^2
    return float(min(max(b, 1.0), math.ceil(min(3.0 * math.sqrt(n), n / 3.0))))


def validation_block_length(relatives: torch.Tensor) -> float:
    """The gate's block length from the market alone: the longest Politis-White length over the assets' daily log
    returns in excess of equal weight's on the validation days (D, N) -> a candidate's excess is a mix of these."""
    log_relatives = relatives.to(torch.float64).log()
    equal_weight = relatives.to(torch.float64).mean(dim=1).log()
    excess = (log_relatives - equal_weight[:, None]).numpy()  # (D, N)
    return max(block_length(excess[:, asset]) for asset in range(excess.shape[1]))


def stationary_bootstrap(days: int, *, draws: int, mean_block: float, generator: torch.Generator) -> torch.Tensor:
    """(draws, days) int64 day indices of the stationary bootstrap (Politis and Romano, 1994): blocks start on
    uniform days, continue to the next day (wrapping around) and end with probability ``1 / mean_block`` a day."""
    starts = torch.randint(days, (draws, days), generator=generator)
    restart = torch.rand((draws, days), generator=generator, dtype=torch.float64) < 1.0 / mean_block
    restart[:, 0] = True
    step = torch.arange(days).expand(draws, days)
    last_restart = torch.where(restart, step, torch.zeros_like(step)).cummax(dim=1).values  # (B, D)
    return (starts.gather(1, last_restart) + step - last_restart) % days


class SequentialGate:
    """The bootstrap gate of the module docstring: one set of resamples for the run, and which have crossed.

    Args:
        days: validation days D.
        alpha: the run's error budget.
        draws: bootstrap resamples B (the resolution of the spent budget is 1 / B).
        mean_block: the stationary bootstrap's mean block length, in days.
        half_spent_at: the generation by which half of ``alpha`` may be spent.
        generator: draws the resamples once; a run's gate must see the same ones at every look and on resume.
    """

    def __init__(
        self,
        days: int,
        *,
        alpha: float,
        draws: int,
        mean_block: float,
        half_spent_at: int,
        generator: torch.Generator,
    ) -> None:
        self.alpha, self.half_spent_at = alpha, half_spent_at
        self.mean_block = mean_block
        self.resamples = stationary_bootstrap(days, draws=draws, mean_block=mean_block, generator=generator)  # (B, D)
        self.crossed = torch.zeros(draws, dtype=torch.bool)  # (B,)
        self._recentre_below = -math.sqrt(max(2.0 * math.log(max(math.log(days), 1e-12)), 0.0))

    def look(self, excess: torch.Tensor, generation: int) -> float:
        """The critical t of ``generation``'s candidates, and the crossed resamples updated with it.

        Args:
            excess: (S, D) daily excess log returns over equal weight of the generation's candidates (host).
            generation: 1-based; each generation looks once.

        Returns:
            The critical value: a candidate whose ``t_statistics`` is above it has a proven edge. ``inf`` when no
            candidate differs from equal weight.
        """
        excess = excess.to(torch.float64)
        days = excess.shape[1]
        spread = excess.std(dim=-1, correction=1)  # (S,)
        t = t_statistics(excess)
        valid = spread > 0
        if not bool(valid.any()):
            return math.inf
        excess, spread, t = excess[valid], spread[valid], t[valid]
        # SPA's recentring: a candidate far below equal weight stays at its own mean, out of the maximum's way.
        centre = torch.where(t < self._recentre_below, torch.zeros_like(t), excess.mean(dim=-1))
        maxima = torch.empty(len(self.resamples), dtype=torch.float64)  # (B,)
        chunk = max(1, _CHUNK_ELEMENTS // (len(excess) * days))
        for first in range(0, len(self.resamples), chunk):
            drawn = excess[:, self.resamples[first : first + chunk]]  # (S, b, D)
            drawn_spread = drawn.std(dim=-1, correction=1)
            drawn_spread = torch.where(drawn_spread > 0, drawn_spread, spread[:, None])
            statistic = math.sqrt(days) * (drawn.mean(dim=-1) - centre[:, None]) / drawn_spread  # (S, b)
            maxima[first : first + chunk] = statistic.max(dim=0).values
        allowed = math.floor(spent_alpha(generation, self.alpha, self.half_spent_at) * len(self.resamples))
        room = allowed - int(self.crossed.sum())  # resamples this look may still let cross
        open_maxima = maxima[~self.crossed].sort(descending=True).values
        critical = float(open_maxima[min(max(room, 0), len(open_maxima) - 1)]) if len(open_maxima) else math.inf
        critical = max(critical, 0.0)  # a positive mean is needed in any case
        self.crossed |= maxima > critical
        return critical

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {"crossed": self.crossed.to(torch.uint8)}

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        crossed = tensors["crossed"]
        if crossed.shape != self.crossed.shape:
            raise ValueError(f"the gate has {len(self.crossed)} resamples, the checkpoint {tuple(crossed.shape)}")
        self.crossed.copy_(crossed.to(torch.bool))


def edges(daily: torch.Tensor, baseline: torch.Tensor) -> torch.Tensor:
    """(S, D) daily log returns of S candidates, (D,) the baseline's -> (S,) annualised mean excess: the edge, whose
    lower bound ``edge_bounds`` gives."""
    return (daily - baseline).mean(dim=-1) * TRADING_DAYS


def edge_bounds(daily: torch.Tensor, baseline: torch.Tensor, *, z: float) -> torch.Tensor:
    """Annualised lower confidence bounds of the mean daily excess log return over ``baseline``.

    Args:
        daily: (S, D) daily log returns of S candidates.
        baseline: (D,) daily log returns of the baseline (equal weight) on the same days.
        z: the critical t (``SequentialGate.look``, or ``selection_z``).

    Returns:
        (S,) bounds, positive exactly for a candidate whose t passes ``z``; 0 for one identical to the baseline.
    """
    excess = daily - baseline  # (S, D)
    days = excess.shape[-1]
    spread = excess.std(dim=-1, correction=1) if days > 1 else torch.zeros_like(excess[..., 0])
    mean = excess.mean(dim=-1)
    bound = torch.where(spread > 0, mean - z * spread / math.sqrt(days), mean)
    return bound * TRADING_DAYS


def choose_champion(
    agent_bounds: torch.Tensor,
    champion_bound: float,
    agent_returns: torch.Tensor,
    champion_return: float,
    *,
    by: ChooseBy = "return",
) -> int | None:
    """The agent slot to crown, or None. Only an agent whose edge has a positive bound (a proven one) may be crowned;
    among those, ``by="bound"`` takes the highest bound if above the champion's, ``by="return"`` the highest
    validation return if above the champion's.

    Args:
        agent_bounds: (P,) on the host, from ``edge_bounds``.
        champion_bound: the current champion's bound on the same days (0 for equal weight).
        agent_returns: (P,) validation log returns on the same days.
        champion_return: the current champion's.
    """
    proven = agent_bounds > 0.0
    if not bool(proven.any()):
        return None
    key, champion = (agent_bounds, champion_bound) if by == "bound" else (agent_returns, champion_return)
    best = int(torch.where(proven, key, -torch.inf).argmax())
    return best if float(key[best]) > champion else None
