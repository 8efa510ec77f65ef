"""Figures as PNG files, drawn on a ``matplotlib.figure.Figure`` with the Agg canvas.

Never ``pyplot``: its global figure registry keeps every figure alive until it is closed, which is how the
replaced system leaked memory through its plots. A ``Figure`` made here is garbage once the function returns.
Inputs are plain lists (``None`` for a missing value, drawn as a gap), so this module knows nothing of the trainer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

HISTORY_SIZE_PX: tuple[int, int] = (1000, 700)
"""(width, height) in pixels of ``plot_history``'s PNG."""
_DPI = 100


def _values(values: Sequence[float | None]) -> list[float]:
    return [math.nan if v is None else float(v) for v in values]


def plot_history(
    path: Path | str,
    *,
    generations: Sequence[int],
    best_fitness: Sequence[float | None],
    mean_fitness: Sequence[float | None],
    worst_fitness: Sequence[float | None],
    validation_best: Sequence[float | None],
    champion_score: Sequence[float | None],
    title: str,
) -> None:
    """Write a PNG of a run's history per generation: the fitness band above, the validation scores below.

    Args:
        path: The PNG file to write (replaced if it exists; its folder must exist).
        generations: x values, one per row.
        best_fitness, mean_fitness, worst_fitness: The population's fitness spread per generation.
        validation_best: The best agent's validation score per generation.
        champion_score: The champion's validation score per generation.
        title: The figure's title.

    Raises:
        ValueError: The sequences differ in length.
    """
    series = [best_fitness, mean_fitness, worst_fitness, validation_best, champion_score]
    if any(len(s) != len(generations) for s in series):
        raise ValueError("every series needs one value per generation")
    x = [int(g) for g in generations]
    best, mean, worst, validation, champion = (_values(s) for s in series)

    width, height = HISTORY_SIZE_PX
    figure = Figure(figsize=(width / _DPI, height / _DPI), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(figure)
    figure.suptitle(title)
    fitness_ax, validation_ax = figure.subplots(2, 1, sharex=True)

    fitness_ax.fill_between(x, worst, best, alpha=0.25, color="tab:blue", label="worst to best")
    fitness_ax.plot(x, best, color="tab:blue", marker=".", label="best")
    fitness_ax.plot(x, mean, color="tab:blue", linestyle="--", label="mean")
    fitness_ax.plot(x, worst, color="tab:blue", linestyle=":", label="worst")
    fitness_ax.set_title("Fitness of the population (training windows)")
    fitness_ax.set_ylabel("fitness")

    validation_ax.plot(x, validation, color="tab:orange", marker=".", label="best agent")
    validation_ax.step(x, champion, where="post", color="tab:green", label="champion")
    validation_ax.set_title("Validation score (total log return over the validation windows)")
    validation_ax.set_ylabel("validation score")
    validation_ax.set_xlabel("generation")
    validation_ax.xaxis.set_major_locator(MaxNLocator(integer=True))

    for ax in (fitness_ax, validation_ax):
        ax.grid(alpha=0.3)
        if x:
            ax.legend(loc="best", fontsize="small")
        else:
            ax.text(0.5, 0.5, "no history", transform=ax.transAxes, ha="center", va="center")
    figure.savefig(path, format="png")
