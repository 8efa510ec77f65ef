"""Running policies in the vectorised environment: the rollout phase (``Rollouts``) and validation (``Validation``).

Each is a loop over the days of its windows. A day (``rollout_day``, ``validation_day``) is device work alone, on
tensors that live as long as the run, so it can be captured once and replayed as a CUDA graph (``training.graphs``);
the host's part of a day (the replay buffer's count) stays in the loop (``collect``, ``validate``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from config import Config
from environment.market import Market
from environment.vector_env import Step, VectorPortfolioEnv
from models.population import Population
from models.replay import ReplayBuffer
from training.fitness import episode_returns, fitness, training_windows
from training.graphs import GraphedStep
from training.sharding import Sharding


def exploration_scale(population: Population, exploring: torch.Tensor) -> torch.Tensor:
    """(P, E, 1): each held agent's exploration stdev on the episodes where ``exploring`` (E,) is True, 0 on the
    others."""
    return population.exploration_stdev.view(-1, 1, 1) * exploring.view(1, -1, 1).to(population.exploration_stdev)


@torch.no_grad()
def rollout_day(
    population: Population,
    env: VectorPortfolioEnv,
    buffer: ReplayBuffer,
    *,
    noise_scale: torch.Tensor,
    stored_episodes: int,
    generator: torch.Generator,
    share: Callable[[Step], Step] = lambda step: step,
) -> None:
    """One day of every held agent on every window, on the device alone (it can be replayed as a CUDA graph): the
    actions with noise of ``noise_scale`` (``exploration_scale``) on the logits, the environment's step, and the
    transitions of the first ``stored_episodes`` episodes written to ``buffer`` (the others are fitness windows that
    no gradient may see), through ``share``: with the population sharded over processes it returns every rank's
    transitions of the step (``SharedSteps``). The caller commits ``population.popsize * stored_episodes``
    transitions to the buffer after each day."""
    logits = population.actor.logits(env.windows.unsqueeze(0), env.weights)  # (P, E, N + 1)
    # Drawn for the whole population, each process keeping its slots' rows: a slot's noise is the same however the
    # population is split.
    slots = population.slots
    shape = (population.popsize, *logits.shape[1:])
    noise = torch.randn(shape, generator=generator, device=generator.device)[slots.start : slots.stop]
    actions = torch.softmax(logits + noise.to(logits.device) * noise_scale, dim=-1)
    step = share(env.apply(actions))
    kept = slice(0, stored_episodes)  # (P, E, ...) -> (P, stored, ...): views, no copy
    buffer.write(
        days=step.days[kept],
        weights=step.weights[:, kept],
        actions=step.actions[:, kept],
        rewards=step.rewards[:, kept],
        next_weights=step.next_weights[:, kept],
        terminated=False,
        truncated=step.truncated,
    )


def bind_rollout_day(
    population: Population,
    env: VectorPortfolioEnv,
    buffer: ReplayBuffer,
    *,
    exploring: torch.Tensor,
    stored_episodes: int,
    generator: torch.Generator,
    share: Callable[[Step], Step] = lambda step: step,
) -> Callable[[], None]:
    """``rollout_day`` bound to its arguments, a step of no arguments (``training.graphs``); ``exploring`` (E,) as
    for ``collect``."""
    return functools.partial(
        rollout_day,
        population,
        env,
        buffer,
        noise_scale=exploration_scale(population, exploring),
        stored_episodes=stored_episodes,
        generator=generator,
        share=share,
    )


@torch.no_grad()
def collect(
    population: Population,
    env: VectorPortfolioEnv,
    start_days: torch.Tensor,
    *,
    exploring: torch.Tensor,
    buffer: ReplayBuffer,
    stored_episodes: int,
    generator: torch.Generator,
    share: Callable[[Step], Step] = lambda step: step,
    day: Callable[[], None] | None = None,
) -> torch.Tensor:
    """Every agent held here runs every window from ``start_days``, a ``rollout_day`` at a time; episodes where
    ``exploring`` (E,) is True add Gaussian noise of the agent's stdev to its logits.

    Args:
        day: ``bind_rollout_day`` of these arguments, as the trainer keeps it (graphed on CUDA, ``training.graphs``);
            by default it is bound here.

    Returns:
        (P, E, D) per-step rewards of the agents held here (the environment's history, valid until its next reset).
    """
    env.reset(start_days)
    if day is None:
        arguments = {"exploring": exploring, "stored_episodes": stored_episodes, "generator": generator, "share": share}
        day = bind_rollout_day(population, env, buffer, **arguments)
    written = population.popsize * stored_episodes  # every rank's transitions of a day
    for _ in range(env.episode_days):
        day()
        buffer.commit(written)
    return env.rewards_per_episode


def equal_weights(env: VectorPortfolioEnv) -> torch.Tensor:
    """(1, E, N + 1) the equal-weight policy's target: 1/N in every asset, nothing in cash."""
    num_assets = env.weights.shape[-1] - 1
    equal = torch.full_like(env.weights[-1:], 1.0 / num_assets)
    equal.select(-1, 0).fill_(0.0)
    return equal


@torch.no_grad()
def validation_day(population: Population, env: VectorPortfolioEnv, equal: torch.Tensor) -> None:
    """One day of the deterministic policies of the held agents, the champion and equal weight (``equal_weights``),
    on the device alone (it can be replayed as a CUDA graph)."""
    popsize = len(population.slots)
    windows = env.windows.unsqueeze(0)
    actions = torch.cat(
        [
            population.actor(windows, env.weights[:popsize]),
            population.champion(windows, env.weights[popsize : popsize + 1]),
            equal,
        ]
    )  # (P + 2, E, N + 1)
    env.apply(actions)


def bind_validation_day(population: Population, env: VectorPortfolioEnv) -> Callable[[], None]:
    """``validation_day`` bound to its arguments, a step of no arguments (``training.graphs``)."""
    return functools.partial(validation_day, population, env, equal_weights(env))


@torch.no_grad()
def validate(
    population: Population,
    env: VectorPortfolioEnv,
    start_days: torch.Tensor,
    *,
    day: Callable[[], None] | None = None,
) -> torch.Tensor:
    """Deterministic policies of the P agents, the champion and equal weight on the same days, a ``validation_day``
    at a time (``day``: ``bind_validation_day`` of these arguments, as the trainer keeps it; by default bound here).

    ``env`` has P + 2 agents: the population (the agents held here), then the champion, then equal weight (1/N in
    every asset, rebalanced daily), the baseline of ``training.selection``. Validation runs its range as one episode.

    Returns:
        (P + 2, E * D) daily log returns net of costs, episodes in order, the champion and equal weight last.
    """
    env.reset(start_days)
    day = day or bind_validation_day(population, env)
    for _ in range(env.episode_days):
        day()
    return env.rewards_per_episode.flatten(1)


class SharedSteps:
    """Every rank's transitions of a step, for the replay buffer that every rank holds whole: one gather per step
    into buffers allocated once.

    Args:
        sharding: how the population is split over processes.
        num_episodes: E.
        num_assets: N.
    """

    def __init__(self, sharding: Sharding, *, num_episodes: int, num_assets: int) -> None:
        self.sharding = sharding
        self.width = num_assets + 1
        if sharding.distributed:
            values = 3 * self.width + 1  # weights, actions, next weights, reward
            self._mine = torch.empty(sharding.per_rank, num_episodes, values, device=sharding.device)
            self._all = torch.empty(sharding.popsize, num_episodes, values, device=sharding.device)

    def __call__(self, step: Step) -> Step:
        """The step of the agents held here -> the step of the whole population, in slot order."""
        if not self.sharding.distributed:
            return step
        n1 = self.width
        torch.cat([step.weights, step.actions, step.next_weights, step.rewards.unsqueeze(-1)], dim=-1, out=self._mine)
        gathered = self.sharding.gather(self._mine, out=self._all)  # (P, E, 3 (N + 1) + 1)
        return step._replace(
            weights=gathered[..., :n1],
            actions=gathered[..., n1 : 2 * n1],
            next_weights=gathered[..., 2 * n1 : 3 * n1],
            rewards=gathered[..., 3 * n1],
        )


class Rollouts:
    """The rollout phase of a run: every agent held here on E training windows in lockstep, the first
    ``stored_episodes`` with exploration noise and into the replay buffer, the rest noise-free on fitness windows
    (``training.fitness``); built once, its day graphed with ``runtime.cuda_graphs`` (``training.graphs``).

    Args:
        config: the run's config.
        market: the run's market.
        population, buffer: the run's.
        generators: the run's random streams (``episodes`` draws the windows, ``exploration`` the noise).
        sharding: the slots held here; with several processes each day's transitions are exchanged.
        graphs: replay the day as a CUDA graph (on CUDA, one process).
    """

    def __init__(
        self,
        config: Config,
        market: Market,
        population: Population,
        buffer: ReplayBuffer,
        *,
        generators: dict[str, torch.Generator],
        sharding: Sharding,
        graphs: bool,
    ) -> None:
        rollout, evolution = config.rollout, config.evolution
        self.population, self.buffer = population, buffer
        self.env = VectorPortfolioEnv(
            market,
            num_agents=len(sharding.slots),
            num_episodes=rollout.episodes,
            episode_days=config.env.episode_days,
            lookback=config.env.lookback,
            cost_rate=config.env.cost_rate,
        )
        # Learning windows fill the replay buffer; fitness windows trade days it never holds (training.fitness).
        self.windows = training_windows(config, market)
        self.stored_episodes = rollout.exploring_episodes if rollout.splits_fitness_days else rollout.episodes
        self.exploring = torch.arange(rollout.episodes, device=market.device) < rollout.exploring_episodes  # (E,)
        self.fitness_episodes = slice(rollout.episodes - rollout.fitness_episodes, None)  # the noise-free ones
        self.fitness_kind, self.worst_k = evolution.fitness, evolution.worst_k
        self.share = SharedSteps(sharding, num_episodes=rollout.episodes, num_assets=market.num_assets)
        self.episodes_generator = generators["episodes"]
        self.exploration_generator = exploration = generators["exploration"]
        day = bind_rollout_day(
            population,
            self.env,
            buffer,
            exploring=self.exploring,
            stored_episodes=self.stored_episodes,
            generator=exploration,
            share=self.share,
        )
        self.day = GraphedStep(day, device=market.device, enabled=graphs, generators=[exploration])

    def sample_starts(self) -> torch.Tensor:
        """(E,) start days, drawn on the host: the first ``stored_episodes`` from the learning windows, the rest from
        the fitness windows."""
        episodes, stored = self.exploring.numel(), self.stored_episodes
        learning, fitness_windows = self.windows.learning, self.windows.fitness
        generator = self.episodes_generator
        picks = learning[torch.randint(len(learning), (stored,), generator=generator)]
        others = fitness_windows[torch.randint(len(fitness_windows), (episodes - stored,), generator=generator)]
        return torch.cat([picks, others]).to(self.env.market.device)

    def run(self, start_days: torch.Tensor) -> torch.Tensor:
        """Every window from ``start_days``; (P, E, D) per-day rewards of the agents held here (the environment's
        history, valid until its next reset)."""
        return collect(
            self.population,
            self.env,
            start_days,
            exploring=self.exploring,
            buffer=self.buffer,
            stored_episodes=self.stored_episodes,
            generator=self.exploration_generator,
            share=self.share,
            day=self.day,
        )

    def fitness_of(self, rewards: torch.Tensor) -> torch.Tensor:
        """(P, E, D) rewards -> (P,) fitness of the agents held here, from the noise-free episodes."""
        returns_per_episode = episode_returns(rewards)  # (P, E)
        return fitness(returns_per_episode[:, self.fitness_episodes], kind=self.fitness_kind, worst_k=self.worst_k)


class Validation:
    """Validation of a run: the agents held here, the champion and equal weight on the whole validation range as one
    episode from cash; built once, its day graphed with ``runtime.cuda_graphs`` (``training.graphs``)."""

    def __init__(self, config: Config, market: Market, population: Population, *, sharding: Sharding, graphs: bool):
        self.population = population
        validation = market.splits.validation
        self.starts = torch.tensor([validation.start - 1], device=market.device)  # (1,) decides at the close before
        self.env = VectorPortfolioEnv(
            market,
            num_agents=len(sharding.slots) + 2,
            num_episodes=1,
            episode_days=len(validation),
            lookback=config.env.lookback,
            cost_rate=config.env.cost_rate,
        )
        self.day = GraphedStep(bind_validation_day(population, self.env), device=market.device, enabled=graphs)

    def run(self) -> torch.Tensor:
        """(P + 2, D) daily log returns of the agents held here, the champion and equal weight, on the device."""
        return validate(self.population, self.env, self.starts, day=self.day)
