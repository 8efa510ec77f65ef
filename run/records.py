"""A generation's record: the figures it brought back to the host, its metrics row and its console line.

The metrics row is what ``metrics.jsonl`` and a checkpoint's history hold for each generation: the run's figures
(fitness, validation returns, the gate's critical t, every candidate's evidence for the overfitting diagnostics)
and the machine's (durations, memory), which differ between identical runs (``MEASURED_KEYS``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from training.loop import Scores
from training.selection import TRADING_DAYS, ChampionRecord, days_to_prove, t_statistics
from utils.telemetry import MEMORY_KEYS, format_bytes, format_count

DURATION_KEYS = (
    "generation_s",
    "rollout_s",
    "validate_s",
    "evolve_s",
    "update_s",
    "checkpoint_s",
    "checkpoint_write_s",
    "telemetry_s",
)
"""A generation's seconds, in all and by phase."""
MEASURED_KEYS = frozenset({"env_steps_per_s", *DURATION_KEYS, "graph_captures", *MEMORY_KEYS})
"""Metrics that measure the machine or how it ran the generation (timings, memory, CUDA graphs captured), not the
run: they differ between runs that compute the same numbers."""

BLOCKS = 16
"""Blocks the validation days are cut into: C(16, 8) = 12,870 CSCV splits; about six weeks a block of the
default two years."""


def block_means(excess: Any, blocks: int = BLOCKS) -> np.ndarray:
    """Mean daily excess log return of each candidate over contiguous blocks of days: CSCV's input.

    The days are cut as ``numpy.array_split`` does (the first ``D % blocks`` blocks one day longer), so every day
    counts once and the blocks keep the market's order: serial correlation stays inside a block.

    Args:
        excess: (N, D) daily excess log returns over equal weight, N candidates by D days: a numpy array or a CPU
            torch tensor (anything ``numpy.asarray`` takes).
        blocks: How many blocks.

    Returns:
        (N, blocks) float64 block means.

    Raises:
        ValueError: ``excess`` is not 2-D, or holds fewer days than blocks.
    """
    days_per_candidate = np.asarray(excess, dtype=np.float64)
    if days_per_candidate.ndim != 2:
        raise ValueError(f"excess must be (candidates, days), got shape {days_per_candidate.shape}")
    days = days_per_candidate.shape[1]
    if blocks < 1 or days < blocks:
        raise ValueError(f"{days} days cannot be cut into {blocks} blocks")
    short, longer = divmod(days, blocks)
    sizes = np.full(blocks, short)
    sizes[:longer] += 1
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return np.add.reduceat(days_per_candidate, starts, axis=1) / sizes  # (N, blocks)


def generation_row(
    generation: int,
    scores: Scores,
    *,
    champion: ChampionRecord,
    champion_edge: float,
    elites: list[int],
    losses: dict[str, torch.Tensor],
    loss_names: tuple[str, ...],
    updates: int,
    buffer_size: int,
    env_steps: int,
    durations: dict[str, float],
    telemetry: dict[str, int | None],
    graph_captures: int = 0,
) -> dict[str, Any]:
    """The metrics row of ``generation``: ``champion`` after this generation's look, with ``champion_edge``, its edge
    on this generation's days; ``losses``: each loss the learner computed (``models.learner.Learner.loss_names``), (P,)
    each agent's mean over the updates, and ``loss_names`` every loss it may report (``Learner.losses``): the row has
    ``<name>_loss`` for each, null where it was not computed (no update yet, or a loss the settings never compute:
    ``not_computed`` names those, as a critic nothing reads is not trained). ``graph_captures``: CUDA graphs captured
    in the generation (a timing of a graphed run is the replays' only in a generation that captured none)."""
    popsize = len(scores.fitness)
    totals = scores.returns.totals
    validation = totals[:popsize]
    best = int(scores.edges[:popsize].argmax())  # the agent with the highest validation return
    excess = scores.returns.excess
    closest = closest_to_proof(excess, scores)
    row: dict[str, Any] = {
        "generation": generation,
        "best_fitness": float(scores.fitness.max()),
        "mean_fitness": float(scores.fitness.mean()),
        "worst_fitness": float(scores.fitness.min()),
        "validation_best": float(validation.max()),
        "validation_mean": float(validation.mean()),
        "validation_equal_weight": float(totals[-1]),
        "best_edge": float(scores.edges[best]),
        "best_edge_needed": float(scores.edges[best] - scores.bounds[best]),  # the edge that would prove it
        "best_bound": float(scores.bounds[:popsize].max()),
        "selection_z": scores.z,
        "selection_last_z": scores.last_z,
        "selection_min_edge": scores.min_edge,
        **closest,
        # Every candidate's evidence, for the overfitting diagnostics of evaluate and backtest
        # (offline.overfitting): daily excess Sharpe, and mean excess in 16 blocks of the validation days.
        "validation_sharpe": [float(x) for x in t_statistics(excess) / math.sqrt(excess.shape[1])],
        "validation_blocks": [[float(x) for x in agent] for agent in block_means(excess.numpy())]
        if excess.shape[1] >= BLOCKS
        else None,
        "champion_score": champion.score,
        "champion_edge": champion_edge,
        "champion_bound": champion.bound,
        "champion_generation": champion.generation,
        "elites": elites,
        **{f"{name}_loss": float(losses[name].mean()) if name in losses and updates else None for name in loss_names},
        "not_computed": [name for name in loss_names if name not in losses],
        "updates": updates,
        "buffer_size": buffer_size,
        "env_steps": env_steps,
        "env_steps_per_s": env_steps / max(durations["rollout_s"], 1e-9),
        **durations,
        **telemetry,
        "graph_captures": graph_captures,
    }
    row["generation_s"] = sum(durations.values())
    return row


def closest_to_proof(excess: torch.Tensor, scores: Scores) -> dict[str, Any]:
    """The agent closest to proof (the highest t of its daily excess less the margin) and what would prove it: its
    edge, that t, and the validation days at which its t would reach the last look's critical value at its current
    edge and spread (None when its edge is not above the margin: more days would not make it worth crowning)."""
    margin = scores.min_edge / TRADING_DAYS
    spread = excess.std(dim=-1, correction=1)  # (P,)
    t = torch.where(spread > 0, t_statistics(excess - margin), torch.full_like(spread, -math.inf))
    agent = int(t.argmax())
    mean = float(excess[agent].mean())
    return {
        "closest_agent": agent,
        "closest_edge": mean * TRADING_DAYS,
        "closest_t": float(t[agent]) if math.isfinite(float(t[agent])) else None,
        "days_to_prove": days_to_prove(mean, float(spread[agent]), critical=scores.last_z, margin=margin),
    }


def format_line(row: dict[str, Any], *, generations: int, buffer_capacity: int) -> str:
    """The console line of a metrics row."""
    return (
        f"gen {row['generation']:>4}/{generations} | fitness best {row['best_fitness']:+.4f} "
        f"mean {row['mean_fitness']:+.4f} worst {row['worst_fitness']:+.4f} | "
        f"champion {row['champion_score']:+.4f} {_champion_label(row)} | "
        f"buffer {format_count(row['buffer_size'])}/{format_count(buffer_capacity)} | "
        f"{format_count(row['env_steps_per_s'])} steps/s | {row['generation_s']:.1f} s | "
        f"rss {format_bytes(row['rss_bytes'])}"
        + ("" if row["live_tensors"] is None else f" | {row['live_tensors']} tensors")
    )


def _champion_label(row: dict[str, Any]) -> str:
    if not row["champion_generation"]:
        return f"(equal weight; {proof_text(row)})"
    return (
        f"(gen {row['champion_generation']}; edge {row['champion_edge'] * 100:+.1f}%/y, "
        f"bound {row['champion_bound'] * 100:+.1f}%/y)"
    )


def proof_text(row: dict[str, Any]) -> str:
    """How far the agent closest to proof is from being proven, from a metrics row (the console's short form): its
    edge, its t against the t the run's last look needs, and the validation days that would prove it at its edge and
    spread; or why no number of days would."""
    edge, t, days = row["closest_edge"], row["closest_t"], row["days_to_prove"]
    needed, margin = row["selection_last_z"], row["selection_min_edge"]
    if t is None or not math.isfinite(needed):
        return "no agent trades differently from it"
    if days is None:
        best = row["best_edge"] * 100
        if margin > 0:
            return f"best edge {best:+.1f}%/y, below the {margin * 100:+.1f}%/y worth its costs"
        return f"no agent beats it: best edge {best:+.1f}%/y"
    closest = f"closest edge {edge * 100:+.1f}%/y at t {t:.2f}, {needed:.2f} needed"
    return f"{closest} at the last look" if t > needed else f"{closest}: proven in ~{days:,} validation days"


def selection_verdict(row: dict[str, Any], *, validation_days: int | None) -> str | None:
    """What the selection gate concluded by a metrics row's generation, in one sentence for ``inspect`` and
    ``evaluate``: the champion crowned and its evidence, or how far the agent closest to proof is from being proven
    and whether more validation days would prove it (``validation_days``: the run's, for comparison). None for a row
    of an earlier version, which lacks the figures, or one whose figures are not numbers (a damaged document)."""
    numbers = ("selection_min_edge", "closest_edge", "best_edge", "champion_edge", "champion_bound")
    nullable = ("selection_z", "selection_last_z", "closest_t", "days_to_prove")  # a stored infinity is null
    generation = row.get("champion_generation")
    if not all(_is_number(row.get(key)) for key in numbers) or not isinstance(generation, int) or generation is True:
        return None
    if not all(row.get(key) is None or _is_number(row.get(key)) for key in nullable):
        return None
    row = {**row, **{key: math.inf for key in ("selection_z", "selection_last_z") if row[key] is None}}
    if not isinstance(validation_days, int) or isinstance(validation_days, bool):
        validation_days = None
    margin = row["selection_min_edge"]
    over = f" over the {margin * 100:+.1f}%/y margin" if margin > 0 else ""
    if row["champion_generation"]:
        edge, bound = row["champion_edge"] * 100, row["champion_bound"] * 100
        return (
            f"the champion was proven in generation {row['champion_generation']}; on this generation's days its edge "
            f"is {edge:+.1f}%/y, its bound {bound:+.1f}%/y at critical t {row['selection_z']:.2f} (margin "
            f"{margin * 100:+.1f}%/y)"
        )
    edge, t, days, needed = row["closest_edge"], row["closest_t"], row["days_to_prove"], row["selection_last_z"]
    if t is None or not math.isfinite(needed):
        return "no agent proven: no agent trades differently from equal weight"
    if days is None:
        best = row["best_edge"] * 100
        if margin > 0:
            return (
                f"no agent proven: the best edge, {best:+.1f}%/y, is below the {margin * 100:+.1f}%/y worth its costs "
                "(selection.min_edge); more validation days would not prove it worth crowning"
            )
        return f"no agent proven: no agent beats equal weight on validation (best edge {best:+.1f}%/y)"
    if t > needed:
        return (
            f"no agent proven yet: the closest has edge {edge * 100:+.1f}%/y, t {t:.2f}{over}, above the {needed:.2f} "
            "the run's last look needs"
        )
    have = "" if validation_days is None else f"; the run validates on {validation_days:,}"
    return (
        f"no agent proven: the closest has edge {edge * 100:+.1f}%/y, t {t:.2f}{over} where {needed:.2f} is needed; "
        f"about {days:,} validation days ({days / TRADING_DAYS:.1f} years) at this edge and spread would prove it"
        f"{have}"
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
