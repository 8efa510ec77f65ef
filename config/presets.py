"""The presets, plain Python values (``smoke``, ``default``, ``paper``), and the dates any default was chosen on."""

from __future__ import annotations

import typing

from config.assignments import override
from config.sections import Config
from utils.errors import ConfigError

DEFAULTS_CHOSEN_ON = (("2019-12-30", "2021-12-28"),)
"""The date ranges of the bundled data that any default was chosen on (RESULTS.md, "Years that tuned nothing"): the
default run's validation range, whose curves chose ``learner.gamma``, ``learner.actor_lr``, the fitness blocks and
the frozen elites. Every other default was chosen on synthetic markets. A figure on these days uses the defaults
in-sample, so the bundled backtest's default test years leave them out."""


def _smoke() -> Config:
    """Seconds on a laptop CPU: proves the whole path runs, learns nothing worth keeping."""
    return override(
        Config(),
        {
            "data.max_assets": 6,  # a size, not a choice of tickers: the preset works with any data file
            "data.validation_days": 126,
            "data.holdout_days": 126,
            "env.lookback": 16,
            "env.episode_days": 21,
            "model.encoder_hidden": 16,
            "model.embedding": 8,
            "model.head_hidden": 16,
            "learner.batch_size": 32,
            "learner.updates_per_generation": 4,
            "learner.buffer_size": 20_000,
            "learner.learning_starts": 128,
            "evolution.popsize": 4,
            "evolution.elites": 1,
            "evolution.tournament_size": 2,
            "rollout.episodes": 4,
            "rollout.exploring_episodes": 2,
            "runtime.generations": 3,
        },
    )


def _default() -> Config:
    """A real learning run on the bundled 20 stocks that fits in minutes on a 2-core CPU."""
    return Config()


def _paper() -> Config:
    """GPU-pod scale: more agents, episodes and updates, wider networks and a million-transition buffer, with the
    default's one-day observation."""
    return override(
        Config(),
        {
            "env.episode_days": 126,
            "model.encoder_hidden": 256,
            "model.embedding": 64,
            "model.head_hidden": 256,
            "learner.batch_size": 256,
            "learner.updates_per_generation": 256,
            "learner.buffer_size": 1_000_000,
            "learner.learning_starts": 20_000,
            "evolution.popsize": 32,
            "evolution.elites": 4,
            "rollout.episodes": 64,
            "rollout.exploring_episodes": 32,
            "runtime.generations": 200,
            # TF32 products on CUDA tensor cores: the update phase several times faster; bit-exact resume still
            # holds on the same GPU kind, not across kinds or against the CPU (README, "Precision on a GPU").
            "runtime.matmul_precision": "high",
            # A checkpoint's background write (~0.33 s on an H100) outlasts a generation (aimed at <= 0.25 s there,
            # BENCHMARKS.md): written every generation, it would hold up the next; every other one keeps the loop going.
            "checkpoint.every": 2,
        },
    )


PRESETS: dict[str, typing.Callable[[], Config]] = {"smoke": _smoke, "default": _default, "paper": _paper}


def preset(name: str) -> Config:
    """The named preset, or a ConfigError listing the known ones."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r} (choose from {', '.join(PRESETS)})")
    return PRESETS[name]()
