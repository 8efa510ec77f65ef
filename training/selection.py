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
generation g is the smallest one that keeps the fraction of crossed resamples at or below the budget spent by then.
If generation g's candidates are clones of earlier ones, the resamples where they look good crossed already and the
critical value barely moves; the test pays only for new evidence.

**Keeping the budget for the run's end (``method="final"``).** The agents learn as the run goes on, so the ones
worth proving are the last generation's; and a generation's candidates are not clones of the one twenty generations
before, so every look in between costs budget that the last one then lacks: on recorded runs
(``benchmarks/selection_study.py``) the critical t of generation 40 was about 2.2 when every look spent alike, 1.7
when the last look held most of the budget, against 1.645 for one candidate named in advance. With ``early_fraction``
the looks before the run's last generation may spend only ``early_fraction * alpha * g / (g + h)`` (``h``:
``selection.half_spent_at``), enough to crown a strong edge early, and the look of the last generation
(``runtime.generations``, the run's planned end) may spend the rest of ``alpha``. The run's plan is then part of the
test: a run resumed after a stop keeps its plan and decides as one never stopped, but a run extended after its last
look finds the budget spent, and its later generations can replace the champion only on evidence beyond every
resample left; so an extended run does not decide as one planned longer from the start. That, and a gain in crowns
that the recorded runs measure as small (RESULTS.md), is why ``method="bootstrap"``, which spends
``alpha * g / (g + h)`` at every look alike, stays the default.

**An edge worth having (``selection.min_edge``).** A near-copy of equal weight with a tiny tilt can have a large t
(its excess barely varies) and an edge of a tenth of a percent a year: real, and worth nothing. With a margin m the
null hypothesis is that no candidate's expected edge exceeds m: a candidate's statistic is the t of its excess less
m, so such near-copies fall far below the others, out of the maximum (the SPA recentring), and cost next to no
budget. The margin is the user's judgement of what an edge must earn to be worth trading (net of costs, a year).

**The guarantee.** The candidates are made without looking at the validation days (evolution selects on
training fitness only), so under the null hypothesis that no candidate of the run has an expected daily excess over
equal weight above the margin, the chance that the run ever crowns an agent is at most ``alpha`` up to the
bootstrap's approximation error, whatever the number of generations and the correlation between candidates
(family-wise, for every look together, the run's planned last look included). The false-positive rate is
measured, not assumed: on independent and on cloned null candidates in ``tests/training/test_selection.py``, on
recorded random-walk runs in ``benchmarks/selection_study.py``.

**The champion.** Equal weight has an edge of exactly 0 and is the champion until a candidate's t passes the
critical value. ``edges`` gives each candidate's edge, its annualised mean excess; ``edge_bounds`` turns the critical
value into the edge's lower confidence bound: above the margin exactly when the candidate passes. Among the proven
candidates, ``selection.choose_by`` picks: ``return`` (the default), the highest validation return, crowned if
above the current champion's on the same days; or ``bound``, the highest bound, crowned if above the champion's.

**What it would take.** While no agent is proven, ``days_to_prove`` says how many validation days the agent closest
to proof (the highest t over the margin) would need at its current edge and spread for its t to reach the critical
value of the run's last look: ``(critical * spread / (mean - margin))^2``. An agent whose edge is not above the
margin has no such number: more days would not make it worth crowning.

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
from environment.market import TRADING_DAYS
from runtime.boundary import to_host


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


class ChampionRecord(NamedTuple):
    """The run's champion record, as one value: equal weight (generation 0) until an agent proves an edge over it."""

    score: float
    """Its validation log return (on the days every candidate is compared on); -inf before the first look."""
    bound: float
    """The lower confidence bound of its annualised edge over equal weight (``edge_bounds``); 0 for equal weight."""
    generation: int
    """The generation that crowned it; 0: equal weight."""


EQUAL_WEIGHT = ChampionRecord(score=-math.inf, bound=0.0, generation=0)
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


class Look(NamedTuple):
    """What one look of the gate decided."""

    critical: float
    """This look's critical t: a candidate whose t over the margin is above it has a proven edge; ``inf`` when no
    candidate differs from equal weight."""
    last_critical: float
    """The critical t the run's last look would set on these candidates with the budget left now: what an agent
    must reach to be proven by the run's end (``critical`` itself at the last look, and at every look of a gate
    that spends alike)."""


def resample_counts(resamples: torch.Tensor) -> torch.Tensor:
    """(B, D) day indices of B resamples -> (B, D) float64: how often each day appears in each resample. A resample's
    mean of a series x is then ``counts @ x / D`` and its mean square ``counts @ x**2 / D``: two matrix products per
    look, whatever the number of candidates, instead of gathering B x D values for each."""
    counts = torch.zeros(resamples.shape, dtype=torch.float64, device=resamples.device)
    return counts.scatter_add_(1, resamples, torch.ones_like(counts))


class SequentialGate:
    """The bootstrap gate of the module docstring: one set of resamples for the run, and which have crossed.

    The resamples are held as day counts (``resample_counts``) on the run's device, so a look is two small matrix
    products and a sort there: microseconds on a GPU, a few milliseconds on one CPU core, and nothing of the
    validation returns has to reach the host before it. Its critical values are the only numbers that come back.

    Args:
        days: validation days D.
        alpha: the run's error budget.
        draws: bootstrap resamples B (the resolution of the spent budget is 1 / B).
        mean_block: the stationary bootstrap's mean block length, in days.
        half_spent_at: the generation by which half of the looks' budget may be spent.
        generator: draws the resamples once (on the host); a run's gate must see the same ones at every look and on
            resume.
        early_fraction: the fraction of ``alpha`` the looks before the run's last may spend (``method="final"``); None:
            every look spends alike, ``alpha * g / (g + half_spent_at)`` (``method="bootstrap"``).
        device: where the counts, the crossed resamples and each look's arithmetic live (the run's device).
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
        early_fraction: float | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        self.alpha, self.half_spent_at, self.early_fraction = alpha, half_spent_at, early_fraction
        self.mean_block = mean_block
        resamples = stationary_bootstrap(days, draws=draws, mean_block=mean_block, generator=generator)  # (B, D)
        self.counts = resample_counts(resamples).to(device)  # (B, D) float64
        self.crossed = torch.zeros(draws, dtype=torch.bool, device=device)  # (B,)
        self._recentre_below = -math.sqrt(max(2.0 * math.log(max(math.log(days), 1e-12)), 0.0))

    @property
    def draws(self) -> int:
        return self.counts.shape[0]

    def spent(self, generation: int, *, last: bool) -> float:
        """The budget the looks up to ``generation`` (1-based) may have spent; ``last``: it is the run's last look."""
        if self.early_fraction is None:
            return spent_alpha(generation, self.alpha, self.half_spent_at)
        return self.alpha if last else self.early_fraction * spent_alpha(generation, self.alpha, self.half_spent_at)

    @torch.no_grad()
    def look(self, excess: torch.Tensor, generation: int, *, last: bool = False, margin: float = 0.0) -> Look:
        """The critical t of ``generation``'s candidates, and the crossed resamples updated with it.

        Args:
            excess: (S, D) daily excess log returns over equal weight of the generation's candidates, on any device
                (they are taken to the gate's, in float64).
            generation: 1-based; each generation looks once.
            last: this is the run's last look (its planned end): with ``early_fraction`` it may spend all of ``alpha``.
            margin: the daily edge the null hypothesis allows (``selection.min_edge / 252``): a candidate's t is
                that of its excess less the margin.

        Returns:
            This look's critical value and the one the run's last look would set (``Look``): a candidate whose t
            over the margin (``t_statistics(excess - margin)``) is above the critical value has a proven edge.
        """
        excess = excess.to(self.counts.device, torch.float64)
        days = excess.shape[1]
        mean = excess.mean(dim=-1)  # (S,)
        centred = excess - mean[:, None]  # (S, D): the resampled moments from centred values lose no digits
        spread = excess.std(dim=-1, correction=1)  # (S,)
        valid = spread > 0  # a candidate identical to equal weight has no t: out of the maximum
        t = t_statistics(excess - margin)
        # SPA's recentring: a candidate far below the margin stays at its own mean, out of the maximum's way.
        shift = torch.where(t < self._recentre_below, mean - margin, torch.zeros_like(mean))  # mean - centre
        drawn_mean = self.counts @ centred.T / days  # (B, S) each resample's mean, less the candidate's
        drawn_square = self.counts @ centred.square().T / days
        drawn_var = (drawn_square - drawn_mean.square()) * (days / (days - 1))
        # A resample of days whose values are all alike has no spread (up to rounding): the candidate's own stands in.
        alike = drawn_var <= 1e-12 * spread.square()
        drawn_spread = torch.where(alike, spread, drawn_var.clamp_min(0.0).sqrt())
        statistic = math.sqrt(days) * (drawn_mean + shift) / drawn_spread  # (B, S)
        maxima = torch.where(valid, statistic, -math.inf).amax(dim=1)  # (B,)
        # The open resamples' maxima, highest first (crossed ones sort last as -inf and are never read).
        open_maxima = torch.where(self.crossed, -math.inf, maxima).sort(descending=True).values
        crossed = self.crossed.sum()
        critical = self._critical(open_maxima, crossed, self.spent(generation, last=last))
        spends_alike = last or self.early_fraction is None
        last_critical = critical if spends_alike else self._critical(open_maxima, crossed, self.alpha)
        critical = torch.where(valid.any(), critical, math.inf)
        last_critical = torch.where(valid.any(), last_critical, math.inf)
        self.crossed |= maxima > critical
        both = to_host(torch.stack([critical, last_critical]))  # the look's one read on the host
        return Look(float(both[0]), float(both[1]))

    def _critical(self, open_maxima: torch.Tensor, crossed: torch.Tensor, spent: float) -> torch.Tensor:
        """The smallest critical value that lets at most ``spent * B`` resamples have crossed, given the open ones'
        maxima (descending) and the count already ``crossed``; at least 0, since a positive mean over the margin is
        needed in any case; inf when every resample has crossed. A 0-dim tensor on the gate's device."""
        draws = self.draws
        room = math.floor(spent * draws) - crossed  # resamples this look may still cross
        left = draws - crossed
        index = torch.minimum(room.clamp_min(0), (left - 1).clamp_min(0))
        critical = open_maxima.index_select(0, index.view(1)).squeeze(0).clamp_min(0.0)  # no read of index
        return torch.where(left > 0, critical, math.inf)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The crossed resamples, a host copy (the checkpoint's writer thread reads it)."""
        return {"crossed": to_host(self.crossed, torch.uint8)}

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
        (S,) bounds, above a margin exactly for a candidate whose t over the margin passes ``z``; 0 for one identical
        to the baseline.
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
    margin: float = 0.0,
) -> int | None:
    """The agent slot to crown, or None. Only an agent whose edge has a bound above ``margin`` (a proven one) may be
    crowned; among those, ``by="bound"`` takes the highest bound if above the champion's, ``by="return"`` the
    highest validation return if above the champion's.

    Args:
        agent_bounds: (P,) on the host, from ``edge_bounds``.
        champion_bound: the current champion's bound on the same days (0 for equal weight).
        agent_returns: (P,) validation log returns on the same days.
        champion_return: the current champion's.
        margin: the annual edge an agent must be proven above (``selection.min_edge``).
    """
    proven = agent_bounds > margin
    if not bool(proven.any()):
        return None
    key, champion = (agent_bounds, champion_bound) if by == "bound" else (agent_returns, champion_return)
    best = int(torch.where(proven, key, -torch.inf).argmax())
    return best if float(key[best]) > champion else None


def days_to_prove(mean: float, spread: float, *, critical: float, margin: float = 0.0) -> int | None:
    """Validation days at which a candidate's t over the margin would reach ``critical`` if its daily excess kept
    this ``mean`` and ``spread``: ``ceil((critical * spread / (mean - margin))^2)`` (its t grows as the square root of
    the days). None when its mean is not above the margin (no number of days proves it worth crowning) or the
    critical value is infinite (nothing can be proven)."""
    if not mean > margin or not math.isfinite(critical):
        return None
    return max(1, math.ceil((critical * spread / (mean - margin)) ** 2))
