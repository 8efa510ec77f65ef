"""Selection designs replayed on recorded runs (``benchmarks/selection_study.py record``): what each would crown.

Every design is a group-sequential bootstrap test on the validation days, as ``training.selection.SequentialGate``
runs it (one set of stationary-bootstrap resamples for the run, a resample "crosses" once a look's largest resampled
t passes that look's critical value, the critical value keeps the crossed share at or below the budget spent by
then, recentred as in Hansen's SPA), and differs from it in four choices:

* ``spend``: the fraction of ``alpha`` the looks may have spent by generation g of G: ``g / (g + h)`` (today's), a
  share ``first`` spent that way and the rest at the last generation only, or everything at the last;
* ``margin``: the edge (annual) a candidate must beat, not 0: the null hypothesis is "no candidate's expected edge
  is above the margin";
* ``candidates``: which agents a look tests: all P (the largest t of them), or one chosen before the look without
  the validation days (the best training fitness, or the best excess over all fitness blocks);
* ``last``: at the last look, the agents of the last ``last`` generations are candidates together.

The bootstrap statistics are computed with resample counts (``mean* = X C / D``), which is the same arithmetic as the
gate's gather, so a design's crowns on a record match what the trainer would have done with that design.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from training import selection
from training.selection import stationary_bootstrap

TRADING_DAYS = 252


@dataclass(frozen=True)
class Design:
    name: str
    spend: str = "today"
    """today: alpha g / (g + half); split: alpha * first * g / (g + half) before the last look, alpha at it;
    final: alpha at the last look only."""
    half: int = 10
    first: float = 0.0
    margin: float = 0.0
    """Annual edge over equal weight the null hypothesis allows; 0: any positive edge is an edge."""
    cost_margin: float = 0.0
    """Plus this many times the candidate's own trading costs on the validation days (a margin that pays for them)."""
    candidates: str = "all"
    """all: every agent of the look; fitness / blocks: one agent chosen by training fitness / fitness-block excess."""
    last: int = 1
    """Generations whose agents are the last look's candidates (their largest t)."""
    alpha: float = 0.05
    every: int = 1
    """Look at every this-many-th generation only (and the last)."""

    def spent(self, generation: int, generations: int) -> float:
        if self.spend == "today":
            return self.alpha * generation / (generation + self.half)
        if generation >= generations:
            return self.alpha
        if self.spend == "split":
            return self.alpha * self.first * generation / (generation + self.half)
        return 0.0


class Resampled:
    """Bootstrap means and spreads of every agent of every generation on one range of validation days."""

    def __init__(self, excess: np.ndarray, counts: torch.Tensor) -> None:
        x = torch.as_tensor(excess, dtype=torch.float64)  # (G, P, D)
        days = x.shape[-1]
        self.days = days
        self.mean = x.mean(-1)  # (G, P)
        self.std = x.std(-1, correction=1)
        c = counts.to(torch.float64).T  # (D, B)
        first = (x @ c) / days  # (G, P, B)
        second = ((x * x) @ c) / days
        self.boot_mean = first
        self.boot_std = ((second - first * first).clamp_min(0.0) * days / (days - 1)).sqrt()
        self.total = x.sum(-1)  # validation return in excess of equal weight's: ranks as the return does


def resample_counts(days: int, *, draws: int, mean_block: float, seed: int) -> torch.Tensor:
    """(B, D) how often each day appears in each stationary-bootstrap resample (the gate's resamples as counts)."""
    generator = torch.Generator().manual_seed(seed)
    indices = stationary_bootstrap(days, draws=draws, mean_block=mean_block, generator=generator)
    return selection.resample_counts(indices).to(torch.int32)


@dataclass
class Outcome:
    crowned: tuple[int, int] | None
    """(generation index, agent) of the final champion, or None (equal weight)."""
    generation: int
    """1-based generation of the crown, 0 if none."""
    criticals: list[float]
    """The critical t of every look the design made, in order."""

    @property
    def last_critical(self) -> float:
        return self.criticals[-1] if self.criticals else math.inf


def replay(
    design: Design, resampled: Resampled, *, fitness: np.ndarray, blocks: np.ndarray, costs: np.ndarray
) -> Outcome:
    """The champion ``design`` ends with on one range of validation days (the product's crowning rule: a proven
    agent is crowned if its validation return beats the champion's); ``costs`` (G, P) each agent's mean daily
    trading costs."""
    generations, popsize = resampled.mean.shape
    days = resampled.days
    draws = resampled.boot_mean.shape[-1]
    margins = torch.as_tensor(design.margin / TRADING_DAYS + design.cost_margin * costs, dtype=torch.float64)
    below = -math.sqrt(max(2.0 * math.log(max(math.log(days), 1e-12)), 0.0))
    crossed = torch.zeros(draws, dtype=torch.bool)
    champion: tuple[int, int] | None = None
    champion_total = 0.0  # equal weight's excess over itself
    crowned_at = 0
    criticals: list[float] = []
    for g in range(generations):
        last = g == generations - 1
        if design.spend == "final" and not last:
            continue
        if design.spend == "split" and design.first == 0.0 and not last:
            continue
        if (g + 1) % design.every and not last:
            continue
        looks = range(max(0, g - design.last + 1), g + 1) if last else range(g, g + 1)
        chosen: list[tuple[int, int]] = []
        for h in looks:
            if design.candidates == "all":
                chosen += [(h, i) for i in range(popsize)]
            elif design.candidates == "fitness":
                chosen.append((h, int(np.argmax(fitness[h]))))
            elif design.candidates == "blocks":
                chosen.append((h, int(np.argmax(blocks[h]))))
            else:
                raise ValueError(design.candidates)
        hs = torch.tensor([c[0] for c in chosen])
        ids = torch.tensor([c[1] for c in chosen])
        mean, std = resampled.mean[hs, ids], resampled.std[hs, ids]
        margin = margins[hs, ids]
        valid = std > 0
        t = math.sqrt(days) * (mean - margin) / std.clamp_min(1e-300)
        t = torch.where(valid, t, torch.full_like(mean, -math.inf))
        centre = torch.where(t < below, margin, mean)
        boot_std = resampled.boot_std[hs, ids]
        boot_std = torch.where(boot_std > 0, boot_std, std[:, None])
        statistic = math.sqrt(days) * (resampled.boot_mean[hs, ids] - centre[:, None]) / boot_std.clamp_min(1e-300)
        statistic = torch.where(valid[:, None], statistic, torch.full_like(statistic, -math.inf))
        maxima = statistic.max(dim=0).values  # (B,)
        allowed = math.floor(design.spent(g + 1, generations) * draws)
        room = allowed - int(crossed.sum())
        open_maxima = maxima[~crossed].sort(descending=True).values
        critical = float(open_maxima[min(max(room, 0), len(open_maxima) - 1)]) if len(open_maxima) else math.inf
        critical = max(critical, 0.0)
        crossed |= maxima > critical
        criticals.append(critical)
        proven = t > critical
        if not bool(proven.any()):
            continue
        totals = resampled.total[hs, ids]
        best = int(torch.where(proven, totals, -torch.inf).argmax())
        if float(totals[best]) > champion_total:
            champion, champion_total, crowned_at = chosen[best], float(totals[best]), g + 1
    return Outcome(champion, crowned_at, criticals)


DESIGNS = (
    Design("before: every look, no margin"),
    Design("every look, margin 0.5% (default)", margin=0.005),
    Design("every look, margin 1%", margin=0.01),
    Design("every look, margin 2%", margin=0.02),
    Design("every look, margin its own costs", cost_margin=1.0),
    Design("every look, g/(g+40), margin 1%", half=40, margin=0.01),
    Design("every 5th look, margin 1%", every=5, margin=0.01),
    Design("final, margin 0.5% (method=final)", spend="split", first=0.2, margin=0.005),
    Design("final, margin 1%", spend="split", first=0.2, margin=0.01),
    Design("final, no margin", spend="split", first=0.2),
    Design("last look only, all agents", spend="final"),
    Design("last look only, fitness-best", spend="final", candidates="fitness"),
    Design("last look only, blocks-best", spend="final", candidates="blocks"),
    Design("last look only, last 10 gens", spend="final", last=10),
)
"""The designs ``benchmarks/selection_study.py evaluate`` compares: the trainer's gate before and after this study's
margin, other margins and spending, and the looks that keep the budget for the run's last generation."""
