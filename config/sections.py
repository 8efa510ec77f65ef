"""The config's sections: frozen, typed dataclasses, one per concern, each field with a one-line docstring (the string
literal under it; ``field_docs`` reads them for ``--help``), and ``Config``, which holds them. Values are checked as
they are made (``__post_init__``) and converted to a field's type from a string or a JSON value (``coerce``)."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from config.parsing import coerce, construct, field_docstrings, field_types
from config.upgrades import RETIRED_KEYS, with_current_names, with_earlier_defaults
from utils.errors import ConfigError

FitnessName = Literal["mean_log_return", "sharpe", "worst_k"]
DeviceName = Literal["auto", "cpu", "cuda"]
ActorObjective = Literal["model", "critic"]
Algorithm = Literal["ddpg", "td3"]
ChooseBy = Literal["return", "bound"]
SelectionMethod = Literal["bootstrap", "final", "bonferroni"]
MatmulPrecision = Literal["highest", "high"]
Universe = Literal["point_in_time", "common"]
BookKind = Literal["long_only", "long_short"]
Deploy = Literal["champion", "best_on_validation", "ensemble"]


@dataclass(frozen=True)
class DataConfig:
    path: str = ""
    """Price file (CSV or Parquet, wide or long); empty means the bundled 20-stock data set."""
    tickers: tuple[str, ...] = ()
    """Tickers to keep, in this order; empty keeps every ticker in the file."""
    max_assets: int = 0
    """With no data.tickers: keep only the file's first this many tickers (a preset's size); 0 keeps all."""
    start: str = ""
    """First date to use (YYYY-MM-DD); empty means the file's first date."""
    end: str = ""
    """Last date to use (YYYY-MM-DD); empty means the file's last date."""
    max_fill_days: int = 5
    """Longest run of missing days that carries the last price: for features only (point_in_time); traded (common)."""
    universe: Universe = "point_in_time"
    """point_in_time: each ticker trades from its first price to its last; common: only the dates all tickers share."""
    delisting_return: float = 0.0
    """A holding's return the day after its ticker's last price, where the file gives no delisting_return (-1: all)."""
    features: tuple[str, ...] = ()
    """Features to observe: built-in names, numeric columns of a long data file, builtin (all six); empty: builtin."""
    benchmark: str = ""
    """A benchmark file (a date and a total-return level per row); empty: the bundled index with the bundled data."""
    risk_free: str = ""
    """What cash earns: a file (a date and an annual rate, 0.05 = 5%) or a data file column; empty: env.cash_rate."""
    validation_days: int = 504
    """Trading days of the validation range (right after the training range); it chooses the champion."""
    gap_days: int = 0
    """Trading days nothing earns before the holdout and, with gap_before_validation, before validation (an embargo)."""
    gap_before_validation: bool = True
    """data.gap_days also separates training from validation (false: only validation from holdout, as before)."""
    holdout_days: int = 252
    """Trading days of the holdout range (the last days of the data, untouched by training)."""

    def __post_init__(self) -> None:
        _require(self.max_fill_days >= 0, "data.max_fill_days", "must be >= 0")
        _require(
            -1.0 <= self.delisting_return <= 10.0, "data.delisting_return", "must be a return in [-1, 10]: -0.3 is -30%"
        )
        _require(self.max_assets >= 0, "data.max_assets", "must be >= 0")
        _require(self.validation_days >= 1, "data.validation_days", "must be >= 1")
        _require(self.holdout_days >= 1, "data.holdout_days", "must be >= 1")
        _require(self.gap_days >= 0, "data.gap_days", "must be >= 0")
        for key in ("start", "end"):
            value = getattr(self, key)
            if value:
                _require(_is_iso_date(value), f"data.{key}", f"expects a date YYYY-MM-DD, got {value!r}")
        repeated = sorted({name for name in self.features if self.features.count(name) > 1})
        _require(not repeated, "data.features", f"names {', '.join(repeated)} more than once")


@dataclass(frozen=True)
class EnvConfig:
    lookback: int = 1
    """Days of features in one observation window (L)."""
    episode_days: int = 63
    """Steps (trading days) in one episode; its end is a truncation, not a termination."""
    cost_rate: float = 0.0005
    """Transaction cost per unit of turnover (0.0005 = 5 basis points of the traded value)."""
    execution_delay: int = 1
    """Trading days from the close a decision observes to the close its trades fill at (0: that close, optimistic)."""
    cash_rate: float = 0.0
    """What cash earns, an annual rate (0.05 = 5%); Sharpe and Sortino are measured over it (data.risk_free: by day)."""
    book: BookKind = "long_only"
    """long_only: weights >= 0, invested or in cash; long_short: weights of either sign within the limits below."""
    gross_leverage: float = 2.0
    """long_short: the most the sum of |weights| may be after a fill (a long-only book's is 1)."""
    net_exposure: tuple[float, float] = (-1.0, 1.0)
    """long_short: the bounds of the sum of weights after a fill (they must hold 0: cash is always allowed)."""
    max_weight: float = 0.0
    """The most |weight| one asset may have after a fill; 0: the book's default (1 long-only, 0.5 long-short)."""
    borrow_rate: float = 0.005
    """long_short: the annual fee on short positions' value, charged daily (0.005 = 0.5%/y)."""
    financing_spread: float = 0.005
    """long_short: what a loan for longs beyond the book's value pays over cash's rate, annual, charged daily."""
    rebalance_every: int = 1
    """Trading days between decisions: the book drifts with prices in between (equal weight's too)."""
    capital: float = 1_000_000.0
    """The book's value in the prices' currency, which sizes its trades against a data file's volume column."""
    impact_coefficient: float = 0.5
    """With a volume column: a fill pays coefficient x daily volatility x sqrt(traded value / average daily value)."""
    max_participation: float = 0.1
    """With a volume column: the most of a day's traded value one fill may take; what cannot fill carries."""

    @property
    def weight_cap(self) -> float:
        """``max_weight``, or the book's default where it is 0: 1 long-only, 0.5 long-short."""
        return self.max_weight or (1.0 if self.book == "long_only" else 0.5)

    def __post_init__(self) -> None:
        _require(self.lookback >= 1, "env.lookback", "must be >= 1")
        _require(1.0 <= self.gross_leverage <= 10.0, "env.gross_leverage", "must be in [1, 10]")
        low, high = self.net_exposure if len(self.net_exposure) == 2 else (math.nan, math.nan)
        _require(
            -self.gross_leverage <= low <= 0.0 <= high <= self.gross_leverage,
            "env.net_exposure",
            f"must be two bounds low <= 0 <= high within the gross leverage, got {list(self.net_exposure)}",
        )
        _require(0.0 <= self.max_weight <= 10.0, "env.max_weight", "must be in [0, 10] (0: the book's default)")
        _require(0.0 <= self.borrow_rate < 1.0, "env.borrow_rate", "must be an annual rate in [0, 1): 0.005 is 0.5%")
        _require(0.0 <= self.financing_spread < 1.0, "env.financing_spread", "must be an annual rate in [0, 1)")
        _require(1 <= self.rebalance_every <= 252, "env.rebalance_every", "must be in [1, 252] trading days")
        _require(self.capital > 0.0, "env.capital", "must be > 0 (the book's value in the prices' currency)")
        _require(0.0 <= self.impact_coefficient <= 100.0, "env.impact_coefficient", "must be in [0, 100]")
        _require(0.0 < self.max_participation <= 1.0, "env.max_participation", "must be in (0, 1]")
        _require(self.episode_days >= 2, "env.episode_days", "must be >= 2")
        _require(0.0 <= self.cost_rate < 1.0, "env.cost_rate", "must be in [0, 1)")
        _require(0 <= self.execution_delay <= 20, "env.execution_delay", "must be in [0, 20] trading days")
        _require(-0.5 < self.cash_rate < 1.0, "env.cash_rate", "must be an annual rate in (-0.5, 1): 0.05 is 5%")


@dataclass(frozen=True)
class ModelConfig:
    encoder_hidden: int = 64
    """Width of the per-asset encoder over one asset's (lookback, features) window."""
    embedding: int = 32
    """Size of the per-asset embedding the encoder produces."""
    head_hidden: int = 64
    """Width of the actor and critic heads on top of the embeddings."""
    bf16_encoder: bool = False
    """Run the per-asset encoders under bfloat16 autocast (faster on tensor cores; not bit-exact with float32)."""

    def __post_init__(self) -> None:
        for key in ("encoder_hidden", "embedding", "head_hidden"):
            _require(getattr(self, key) >= 1, f"model.{key}", "must be >= 1")


@dataclass(frozen=True)
class LearnerConfig:
    algorithm: Algorithm = "ddpg"
    """ddpg: one critic, the actor every update; td3: twin critics, target policy smoothing, delayed actor steps."""
    gamma: float = 0.0
    """Discount of the TD target and of the critic's term in the model objective (0: the next day only)."""
    tau: float = 0.005
    """Polyak coefficient: target <- target + tau * (online - target) after every update."""
    actor_lr: float = 1e-4
    """Adam learning rate of the actors."""
    critic_lr: float = 1e-3
    """Adam learning rate of the critics."""
    batch_size: int = 128
    """Transitions per agent per update."""
    updates_per_generation: int = 32
    """Gradient updates of every agent in each generation."""
    buffer_size: int = 200_000
    """Capacity of the shared replay buffer, in transitions."""
    learning_starts: int = 2_000
    """Transitions in the buffer before the first update."""
    exploration_min: float = 0.1
    """Smallest per-agent exploration stdev (Gaussian noise on the actor's logits)."""
    exploration_max: float = 1.0
    """Largest per-agent exploration stdev; slots get log-spaced values between the two."""
    max_grad_norm: float = 1.0
    """Per-agent gradient-norm clip for actor and critic; 0 disables clipping."""
    actor_objective: ActorObjective = "model"
    """model: the exact next-day reward of the action on the recorded prices + gamma * critic; critic: -Q(s, a)."""
    tilt_penalty: float = 0.0
    """Actor objective minus this times the squared distance of its weights from equal weight, a day; 0: off."""
    observation_noise: float = 0.0
    """Stdev of Gaussian noise on the normalised features of replayed observations (against memorising); 0: off."""
    policy_delay: int = 2
    """td3: the actor and the targets move every this-many updates (a divisor of updates_per_generation)."""
    target_noise: float = 0.2
    """td3: stdev of the Gaussian noise on the target actor's logits in the critics' target (policy smoothing)."""
    target_noise_clip: float = 0.5
    """td3: that noise is clipped to plus or minus this."""

    def __post_init__(self) -> None:
        _require(0.0 <= self.gamma <= 1.0, "learner.gamma", "must be in [0, 1]")
        _require(0.0 < self.tau <= 1.0, "learner.tau", "must be in (0, 1]")
        _require(self.actor_lr > 0 and self.critic_lr > 0, "learner.actor_lr/critic_lr", "must be > 0")
        _require(self.batch_size >= 1, "learner.batch_size", "must be >= 1")
        _require(self.updates_per_generation >= 0, "learner.updates_per_generation", "must be >= 0")
        _require(self.buffer_size >= 1, "learner.buffer_size", "must be >= 1")
        _require(self.learning_starts >= 0, "learner.learning_starts", "must be >= 0")
        _require(
            0.0 <= self.exploration_min <= self.exploration_max,
            "learner.exploration_min",
            "must be in [0, exploration_max]",
        )
        _require(self.max_grad_norm >= 0, "learner.max_grad_norm", "must be >= 0")
        _require(self.observation_noise >= 0, "learner.observation_noise", "must be >= 0")
        _require(self.tilt_penalty >= 0, "learner.tilt_penalty", "must be >= 0")
        _require(self.policy_delay >= 1, "learner.policy_delay", "must be >= 1")
        _require(self.target_noise >= 0, "learner.target_noise", "must be >= 0")
        _require(self.target_noise_clip >= 0, "learner.target_noise_clip", "must be >= 0")
        if self.algorithm == "td3":
            _require(
                self.updates_per_generation % self.policy_delay == 0,
                "learner.policy_delay",
                f"must divide learner.updates_per_generation ({self.updates_per_generation}) with "
                "learner.algorithm=td3, so that every generation ends on an actor step",
            )


@dataclass(frozen=True)
class EvolutionConfig:
    popsize: int = 16
    """Agents in the population (P)."""
    elites: int = 2
    """Best agents copied unchanged into the next generation."""
    frozen_elites: bool = True
    """Elites take no actor step that generation: a trained offspring must beat them on unseen fitness days."""
    tournament_size: int = 3
    """Agents drawn for each tournament; the fittest of them becomes a parent."""
    crossover_prob: float = 0.3
    """Chance that an offspring blends two parents instead of copying one."""
    mutation_prob: float = 0.8
    """Chance that an offspring's actor is mutated."""
    mutation_fraction: float = 0.1
    """Fraction of actor parameters that one mutation perturbs."""
    mutation_stdev: float = 0.02
    """Stdev of the Gaussian noise added to each perturbed parameter."""
    fitness: FitnessName = "mean_log_return"
    """How episode returns become one fitness: mean log return, Sharpe of episode returns, or worst-k mean."""
    worst_k: int = 4
    """Episodes averaged by the worst_k fitness."""

    def __post_init__(self) -> None:
        _require(self.popsize >= 2, "evolution.popsize", "must be >= 2")
        _require(0 <= self.elites < self.popsize, "evolution.elites", "must be in [0, popsize)")
        _require(1 <= self.tournament_size <= self.popsize, "evolution.tournament_size", "must be in [1, popsize]")
        for key in ("crossover_prob", "mutation_prob", "mutation_fraction"):
            _require(0.0 <= getattr(self, key) <= 1.0, f"evolution.{key}", "must be in [0, 1]")
        _require(self.mutation_stdev >= 0, "evolution.mutation_stdev", "must be >= 0")
        _require(self.worst_k >= 1, "evolution.worst_k", "must be >= 1")


@dataclass(frozen=True)
class RolloutConfig:
    episodes: int = 16
    """Episodes every agent runs in lockstep each generation (E)."""
    exploring_episodes: int = 8
    """Of those, episodes run with exploration noise; the rest are noise-free and give the fitness."""
    fitness_block_every: int = 4
    """Every this-many-th block of episode_days training days gives the fitness, never the buffer; 0: no such blocks."""
    fitness_embargo_days: int = 0
    """Days on either side of a fitness block on which no learning episode earns (an embargo; the features span 26)."""

    def __post_init__(self) -> None:
        _require(self.episodes >= 1, "rollout.episodes", "must be >= 1")
        _require(
            0 <= self.exploring_episodes <= self.episodes,
            "rollout.exploring_episodes",
            "must be in [0, episodes]",
        )
        _require(self.fitness_block_every >= 0, "rollout.fitness_block_every", "must be >= 0")
        _require(self.fitness_block_every != 1, "rollout.fitness_block_every", "must be 0 or >= 2 (1 leaves none)")
        _require(self.fitness_embargo_days >= 0, "rollout.fitness_embargo_days", "must be >= 0")

    @property
    def splits_fitness_days(self) -> bool:
        """Whether fitness comes from days kept out of the replay buffer: it needs noise-free and exploring episodes."""
        return self.fitness_block_every > 0 and 0 < self.exploring_episodes < self.episodes

    @property
    def fitness_episodes(self) -> int:
        """Episodes whose returns make the fitness: the noise-free ones, or all if every episode explores."""
        return self.episodes - self.exploring_episodes or self.episodes


@dataclass(frozen=True)
class SelectionConfig:
    alpha: float = 0.05
    """Chance, at most, that a run ever crowns an agent with no edge over equal weight (training/selection.py)."""
    choose_by: ChooseBy = "return"
    """Which of the agents with a proven edge is crowned: the highest validation return, or the highest bound."""
    method: SelectionMethod = "bootstrap"
    """bootstrap: max-t bootstrap, looks spent as a group; final: most alpha for the planned last look; bonferroni."""
    bootstrap_draws: int = 2000
    """Resamples of the validation days the bootstrap gate uses for the whole run (alpha's resolution is 1/draws)."""
    block_days: float = 0.0
    """Mean block length of the stationary bootstrap in days; 0: chosen from the validation data (Politis-White)."""
    half_spent_at: int = 10
    """Generation by which the bootstrap gate's looks may have spent half their budget (budget * g / (g + this))."""
    early_fraction: float = 0.2
    """With method final: the fraction of alpha the looks before the run's last generation spend; the last the rest."""
    min_edge: float = 0.005
    """Edge over equal weight (log return a year, net of costs) an agent must be proven above to be crowned."""
    deploy: Deploy = "champion"
    """What export, evaluate and trade use: the gated champion, the best agent on validation, or the ensemble."""

    def __post_init__(self) -> None:
        _require(0.0 < self.alpha < 1.0, "selection.alpha", "must be in (0, 1)")
        _require(self.bootstrap_draws >= 100, "selection.bootstrap_draws", "must be >= 100")
        _require(self.block_days == 0.0 or self.block_days >= 1.0, "selection.block_days", "must be 0 or >= 1")
        _require(self.half_spent_at >= 1, "selection.half_spent_at", "must be >= 1")
        _require(0.0 <= self.early_fraction <= 1.0, "selection.early_fraction", "must be in [0, 1]")
        _require(0.0 <= self.min_edge < 1.0, "selection.min_edge", "must be in [0, 1)")


@dataclass(frozen=True)
class BacktestConfig:
    ensemble_size: int = 3
    """Agents with the best validation returns whose orders the ensemble averages (at most the population)."""

    def __post_init__(self) -> None:
        _require(self.ensemble_size >= 1, "backtest.ensemble_size", "must be >= 1")


@dataclass(frozen=True)
class CheckpointConfig:
    uri: str = "runs"
    """Where runs live: a local folder or gs://bucket/prefix; each run is URI/RUN_NAME."""
    run_name: str = ""
    """Name of this run's folder; empty means a timestamp."""
    local_dir: str = "runs"
    """Local write-ahead copy of runs whose location is gs://."""
    keep_last: int = 3
    """Complete generations kept; older ones are deleted (the champion's generation is always kept)."""
    every: int = 1
    """Generations between checkpoints (1: each); a run's last, and its last complete one at a stop, always get one."""

    def __post_init__(self) -> None:
        _require(self.keep_last >= 1, "checkpoint.keep_last", "must be >= 1")
        _require(self.every >= 1, "checkpoint.every", "must be >= 1")
        # A run is written only inside its location: no separators, drive letters, "." or "..".
        _require(
            not self.run_name or re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", self.run_name) is not None,
            "checkpoint.run_name",
            f"must be a plain folder name (letters, digits, _ - .; not starting with .), got {self.run_name!r}",
        )


@dataclass(frozen=True)
class RuntimeConfig:
    seed: int = 0
    """Seed of every random generator in the run."""
    device: DeviceName = "auto"
    """Training device: cuda when available with auto."""
    generations: int = 40
    """Generations to train; with --resume, the total the run should reach."""
    progress: bool = True
    """Show a progress bar over generations."""
    matmul_precision: MatmulPrecision = "highest"
    """torch.set_float32_matmul_precision on CUDA (high: TF32 tensor cores); a CPU run always uses exact float32."""
    census_fraction: float = 0.01
    """Largest fraction of the run's time the per-generation count of objects and tensors may take (1: always)."""
    cuda_graphs: bool = True
    """On CUDA in one process: replay the update and the rollout's and validation's days as graphs (runtime.graphs)."""
    torch_compile: bool = False
    """Fuse the update's and the days' arithmetic with torch.compile (runtime.compiled); off until a GPU has run it."""
    collective_timeout_s: float = 300.0
    """Under torchrun: seconds an exchange waits for the other processes before the job fails (a node lost)."""

    def __post_init__(self) -> None:
        _require(self.generations >= 1, "runtime.generations", "must be >= 1")
        _require(0 <= self.seed < 2**63, "runtime.seed", "must be in [0, 2**63)")
        _require(1 <= self.collective_timeout_s <= 86400, "runtime.collective_timeout_s", "must be in [1, 86400]")
        _require(0 < self.census_fraction <= 1, "runtime.census_fraction", "must be in (0, 1]")


@dataclass(frozen=True)
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    """Market data and splits."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """Trading environment."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Actor and critic networks."""
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    """Gradient training of every agent."""
    evolution: EvolutionConfig = field(default_factory=EvolutionConfig)
    """Genetic algorithm over the population."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """The training rollouts of each generation: they fill the replay buffer and measure fitness."""
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    """How the champion is chosen on the validation range."""
    backtest: BacktestConfig = field(default_factory=BacktestConfig)
    """The procedures a walk-forward backtest judges beside the champion."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Run folders and retention."""
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    """Seed, device, length of the run."""

    def __post_init__(self) -> None:
        _require(
            self.data.validation_days >= 2,
            "data.validation_days",
            "must be >= 2 (the selection test needs a spread of daily returns)",
        )
        _require(
            not (self.data.risk_free and self.env.cash_rate != 0.0),
            "data.risk_free",
            "and env.cash_rate both set what cash earns; give one of them",
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Config:
        """Rebuild a config from ``to_dict`` output (a checkpoint's config.json), checking every key."""
        if not isinstance(values, dict):
            raise ConfigError("config must be a JSON object")
        values = with_earlier_defaults(with_current_names(values))
        sections = {}
        for section in dataclasses.fields(cls):
            raw = values.get(section.name, {})
            if not isinstance(raw, dict):
                raise ConfigError(f"config section {section.name!r} must be an object")
            raw = {k: v for k, v in raw.items() if f"{section.name}.{k}" not in RETIRED_KEYS}
            section_cls = section_types()[section.name]
            known = {f.name for f in dataclasses.fields(section_cls)}
            unknown = sorted(set(raw) - known)
            if unknown:
                raise ConfigError(f"unknown config key {section.name}.{unknown[0]}")
            kwargs = {k: coerce(f"{section.name}.{k}", field_types(section_cls)[k], v) for k, v in raw.items()}
            sections[section.name] = construct(section_cls, kwargs)
        unknown = sorted(set(values) - set(sections))
        if unknown:
            raise ConfigError(f"unknown config section {unknown[0]!r}")
        return cls(**sections)


def field_docs() -> dict[str, str]:
    """Every dotted key with its one-line docstring, for ``--help``."""
    docs = {}
    for section in dataclasses.fields(Config):
        section_cls = section_types()[section.name]
        for name, doc in field_docstrings(section_cls).items():
            docs[f"{section.name}.{name}"] = doc
    return docs


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"config {key} {message}")


def _is_iso_date(value: str) -> bool:
    import datetime

    try:
        datetime.date.fromisoformat(value)
    except ValueError:
        return False
    return True


def section_types() -> dict[str, type]:
    return {name: hint for name, hint in typing.get_type_hints(Config).items()}
