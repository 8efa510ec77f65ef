"""Running policies in the vectorised environment: the rollout phase (``Rollouts``) and validation (``Validation``).

Each runs its episodes' days in lockstep, every day one decision of every agent in every episode. What a decision
depends on splits in two (``models.networks``): the observation windows, known for every day of an episode before it
starts, and the portfolio's weights, known only once the day before is traded. So the days go in blocks: the windows
of a block's days are gathered at once and the networks' part that reads them alone (the encoder and the heads'
products of its embeddings) runs once for the whole block, a few large matmuls; then each day of the block decides
from its weights, trades, and writes its transitions. A block's size is set by the memory its windows' part takes
(``block_lengths``); its results do not depend on it.

A phase's days are device work alone, on tensors that live as long as the run, so each phase's whole run of days
is captured once and replayed as one CUDA graph (``runtime.graphs``); the host's part (the replay buffer's count)
comes after it.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Callable

import torch

from config import Config, ModelConfig
from environment.kernel import equal_weights
from environment.market import Market, first_decision
from environment.observation import window_size
from environment.vector_env import Step, VectorPortfolioEnv
from models.networks import Actor, ActorFeatures
from models.population import Population
from models.replay import ReplayBuffer
from runtime.graphs import GraphedCall
from runtime.sharding import Sharding
from training.fitness import episode_returns, fitness, training_starts

BLOCK_BYTES = {"cuda": 256 * 2**20, "cpu": 4 * 2**20}
"""Most bytes the windows' part of a block of days may hold at once (the encoder's activations and the heads'
features of every agent, episode and asset of the block), by device type. On CUDA a day's kernels are small and
their launches the cost, so a block is as long as a modest fraction of memory allows (a default-preset episode is one
block). On the CPU a block that outgrows the caches is slower than one day at a time: of budgets of 1 to 256 MiB,
4 MiB was fastest on this project's CPU (default preset, one thread: validation 0.13 s against 0.20 s at 256 MiB and
0.31 s before blocks; BENCHMARKS.md). Other devices take the CPU's."""
FLOAT_BYTES = 4


def block_bytes_per_day(model: ModelConfig, *, agents: int, episodes: int, assets: int) -> int:
    """Bytes a block's windows' part holds for each of its days: the encoder's hidden layer and embeddings, and the
    asset and cash heads' features, for every agent, episode and asset."""
    rows = agents * episodes * assets
    return FLOAT_BYTES * (
        rows * (model.encoder_hidden + model.embedding + model.head_hidden)
        + agents * episodes * (model.embedding + model.head_hidden)
    )


def days_bytes(actor: Actor, env: VectorPortfolioEnv, blocks: list[int]) -> int:
    """The most bytes a phase of days allocates at once for the decisions of ``actor``'s rows on ``env``'s episodes:
    its longest block's windows' part (``block_bytes_per_day``), held while its days decide (never two blocks' at
    once), and one day's heads' hidden layers."""
    rows, episodes, assets, model = actor.popsize, env.num_episodes, env.market.num_assets, actor.widths
    per_day = block_bytes_per_day(model, agents=rows, episodes=episodes, assets=assets)
    day = FLOAT_BYTES * rows * episodes * (2 * assets * model.head_hidden + 2 * model.head_hidden)
    return per_day * max(blocks) + day


def block_lengths(days: int, *, bytes_per_day: int, device: torch.device | str) -> list[int]:
    """``days`` cut into as few nearly equal blocks as keep each block's windows' part within the ``device``'s
    ``BLOCK_BYTES``."""
    budget = BLOCK_BYTES.get(torch.device(device).type, BLOCK_BYTES["cpu"])
    most = max(1, min(days, budget // max(bytes_per_day, 1)))
    count = math.ceil(days / most)
    base, longer = divmod(days, count)
    return [base + 1] * longer + [base] * (count - longer)


def block_features(actor: Actor, env: VectorPortfolioEnv, windows: torch.Tensor, days: int) -> ActorFeatures:
    """The actor's market part (``Actor.features``) for the next ``days`` days of every episode of ``env``, each
    tensor (P, E, days, ...); ``windows``: a buffer from ``env.gatherer.empty(E, at least days)``."""
    features = actor.features(env.observe_block(days, out=windows))  # (P, E * days, ...): every agent sees the days
    shape = (env.num_episodes, days)
    tradable = None if features.tradable is None else features.tradable.unflatten(1, shape)
    return ActorFeatures(features.assets.unflatten(1, shape), features.cash.unflatten(1, shape), tradable)


def on_day(features: ActorFeatures, day: int) -> ActorFeatures:
    """The features of one day of a block: each tensor (P, E, ...)."""
    tradable = None if features.tradable is None else features.tradable[:, :, day]
    return ActorFeatures(features.assets[:, :, day], features.cash[:, :, day], tradable)


def exploration_scale(population: Population, exploring: torch.Tensor) -> torch.Tensor:
    """(P, E, 1): each held agent's exploration stdev on the episodes where ``exploring`` (E,) is True, 0 on the
    others."""
    return population.exploration_stdev.view(-1, 1, 1) * exploring.view(1, -1, 1).to(population.exploration_stdev)


@torch.no_grad()
def roll_out_day(
    actor: Actor,
    env: VectorPortfolioEnv,
    buffer: ReplayBuffer,
    features: ActorFeatures,
    noise: torch.Tensor,
    *,
    noise_scale: torch.Tensor,
    stored_episodes: int,
    exchange: Callable[[Step], Step] = lambda step: step,
) -> None:
    """One day of every episode of ``env``: each agent's actions from the day's ``features`` (``on_day``) and its
    weights with ``noise`` (P, E, N + 1) of ``noise_scale`` on the logits, the environment's step, and the transitions
    of the first ``stored_episodes`` episodes written to ``buffer`` through ``exchange`` (``roll_out_episodes``).
    Device arithmetic alone, nothing drawn: with ``runtime.torch_compile`` it is compiled whole (``runtime.compiled``),
    the day's decision, trade and writes fused into a few kernels."""
    kept = slice(0, stored_episodes)  # (P, E, ...) -> (P, stored, ...): views, no copy
    logits = actor.decide(features, env.weights)  # (P, E, N + 1)
    actions = actor.book.weights(logits + noise * noise_scale)
    step = exchange(env.apply(actions))
    buffer.write(
        days=step.days[kept],
        weights=step.weights[:, kept],
        actions=step.actions[:, kept],
        rewards=step.rewards[:, kept],
        next_weights=step.next_weights[:, kept],
        terminated=False,
        truncated=step.truncated,
        held=None if step.held is None else step.held[:, kept],
    )


@torch.no_grad()
def roll_out_episodes(
    population: Population,
    env: VectorPortfolioEnv,
    buffer: ReplayBuffer,
    windows: torch.Tensor,
    *,
    blocks: list[int],
    noise_scale: torch.Tensor,
    stored_episodes: int,
    generator: torch.Generator,
    exchange: Callable[[Step], Step] = lambda step: step,
    day_step: Callable[..., None] = roll_out_day,
) -> None:
    """Every day of the episodes ``env`` was reset to, in ``blocks`` of days, on the device alone (it can be replayed
    as a CUDA graph): each day the actions with noise of ``noise_scale`` (``exploration_scale``) on the logits, the
    environment's step, and the transitions of the first ``stored_episodes`` episodes written to ``buffer`` (the
    others are fitness episodes that no gradient may see), through ``exchange``: with the population sharded over
    processes it returns every rank's transitions of the step (``SharedSteps``). ``day_step``: ``roll_out_day`` or
    its compiled form. The caller commits ``population.popsize * stored_episodes`` transitions a day to the buffer
    afterwards."""
    actor, share = population.actor, population.share

    def block(days: int) -> None:  # a block's features live in this call alone: never two blocks' at once
        features = block_features(actor, env, windows, days)
        for day in range(days):
            # drawn for the whole population, the rows held here kept (``models.share``)
            noise = share.draw(torch.randn, *env.weights.shape[1:], generator=generator, device=generator.device)
            day_step(
                actor,
                env,
                buffer,
                on_day(features, day),
                noise.to(env.weights.device),
                noise_scale=noise_scale,
                stored_episodes=stored_episodes,
                exchange=exchange,
            )

    for days in blocks:
        block(days)


@torch.no_grad()
def validate_day(acting: Actor, env: VectorPortfolioEnv, features: ActorFeatures, actions: torch.Tensor) -> None:
    """One validation day: the deterministic policies of ``acting``'s rows from the day's ``features`` and their
    weights, and equal weight over the day's tradable assets in ``actions``' last row, traded by ``env``. Device
    arithmetic alone: with ``runtime.torch_compile`` compiled whole, like ``roll_out_day``."""
    rows = acting.popsize
    logits = acting.decide(features, env.weights[:rows])  # (P + 1, E, N + 1)
    if acting.book.long_short:
        actions[:rows].copy_(acting.book.weights(logits))
    else:
        torch.softmax(logits, dim=-1, out=actions[:rows])
    env.equal_weight(out=actions[rows])  # (E, N + 1), equal weight over the day's tradable assets
    env.apply(actions, transition=False)


@torch.no_grad()
def validate_range(
    acting: Actor,
    env: VectorPortfolioEnv,
    windows: torch.Tensor,
    actions: torch.Tensor,
    *,
    blocks: list[int],
    day_step: Callable[..., None] = validate_day,
) -> None:
    """Every day of the validation episode ``env`` was reset to, in ``blocks`` of days, on the device alone: the
    deterministic policies of ``acting``'s rows (the agents held here, then the champion) and equal weight over the
    day's tradable assets in ``actions``' last row; ``actions`` (P + 2, E, N + 1) is where the day's actions are
    written. ``day_step``: ``validate_day`` or its compiled form."""

    def block(days: int) -> None:  # as in ``roll_out_episodes``: one block's features alive at a time
        features = block_features(acting, env, windows, days)
        for day in range(days):
            day_step(acting, env, on_day(features, day), actions)

    for days in blocks:
        block(days)


class SharedSteps:
    """Every rank's transitions of a step, for the replay buffer that every rank holds whole: one gather per step
    into buffers allocated once.

    Args:
        sharding: how the population is split over processes.
        num_episodes: E.
        num_assets: N.
    """

    def __init__(self, sharding: Sharding, *, num_episodes: int, num_assets: int, held: bool = False) -> None:
        self.sharding = sharding
        self.width = num_assets + 1
        self.held = held
        if sharding.distributed:
            values = (4 if held else 3) * self.width + 1  # weights, actions, next weights, (held,) reward
            self._mine = torch.empty(sharding.share.agents, num_episodes, values, device=sharding.device)
            self._all = torch.empty(sharding.popsize, num_episodes, values, device=sharding.device)

    def __call__(self, step: Step) -> Step:
        """The step of the agents held here -> the step of the whole population, in slot order."""
        if not self.sharding.distributed:
            return step
        n1 = self.width
        parts = [step.weights, step.actions, step.next_weights, *([step.held] if self.held else [])]
        torch.cat([*parts, step.rewards.unsqueeze(-1)], dim=-1, out=self._mine)
        gathered = self.sharding.gather(self._mine, out=self._all)  # (P, E, 3 or 4 (N + 1) + 1)
        return step._replace(
            weights=gathered[..., :n1],
            actions=gathered[..., n1 : 2 * n1],
            next_weights=gathered[..., 2 * n1 : 3 * n1],
            held=gathered[..., 3 * n1 : 4 * n1] if self.held else None,
            rewards=gathered[..., -1],
        )


class Rollouts:
    """The rollout phase of a run: every agent held here on E training episodes in lockstep, the first
    ``stored_episodes`` with exploration noise and into the replay buffer, the rest noise-free on fitness episodes
    (``training.fitness``); built once, its days graphed with ``runtime.cuda_graphs`` (``runtime.graphs``).

    Args:
        config: the run's config.
        market: the run's market.
        population, buffer: the run's.
        generators: the run's random streams (``episodes`` draws the windows, ``exploration`` the noise).
        sharding: the slots held here; with several processes each day's transitions are exchanged.
        block_device: the device whose budget sizes the blocks of days (``block_lengths``): the market's, or for a
            build on the meta device (``run.sizing``), the device it stands for.
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
        block_device: torch.device | str | None = None,
    ) -> None:
        rollout, evolution = config.rollout, config.evolution
        self.population, self.buffer = population, buffer
        agents, episodes = sharding.share.agents, rollout.episodes
        self.env = VectorPortfolioEnv.from_config(
            market, config.env, num_agents=agents, num_episodes=episodes, episode_days=config.env.episode_days
        )
        # Learning episodes fill the replay buffer; fitness episodes trade days it never holds (training.fitness).
        self.episode_starts = training_starts(config, market)
        self.stored_episodes = rollout.exploring_episodes if rollout.splits_fitness_days else rollout.episodes
        self.exploring = torch.arange(episodes, device=market.device) < rollout.exploring_episodes  # (E,)
        self.fitness_episodes = slice(episodes - rollout.fitness_episodes, None)  # the noise-free ones
        self.fitness_kind, self.worst_k = evolution.fitness, evolution.worst_k
        self.exchange = SharedSteps(sharding, num_episodes=episodes, num_assets=market.num_assets, held=self.env.sent)
        self.episodes_generator = generators["episodes"]
        exploration = generators["exploration"]
        per_day = block_bytes_per_day(config.model, agents=agents, episodes=episodes, assets=market.num_assets)
        block_device = block_device or market.device
        self.blocks = block_lengths(config.env.episode_days, bytes_per_day=per_day, device=block_device)
        this = weakref.proxy(self)  # the graphed call below is the phase's own: it holds it without a cycle
        work = functools.partial(
            roll_out_episodes,
            population,
            self.env,
            buffer,
            self.env.gatherer.empty(episodes, max(self.blocks), device=market.device),
            blocks=self.blocks,
            noise_scale=exploration_scale(population, self.exploring),
            stored_episodes=self.stored_episodes,
            generator=exploration,
            exchange=self.exchange,
            day_step=lambda *args, **kwargs: this.day(*args, **kwargs),  # ``day`` as it is then (compiled or not)
        )
        self.day: Callable[..., None] = roll_out_day
        """One day's step (``roll_out_day``); ``runtime.compiled`` may replace it by its compiled form."""
        self.graphed = GraphedCall(work, device=market.device, generators=[exploration])

    def sample_starts(self) -> torch.Tensor:
        """(E,) start days, drawn on the host: the first ``stored_episodes`` from the learning episodes' starts, the
        rest from the fitness episodes'."""
        episodes, stored = self.exploring.numel(), self.stored_episodes
        learning, scored = self.episode_starts.learning, self.episode_starts.fitness
        generator = self.episodes_generator
        picks = learning[torch.randint(len(learning), (stored,), generator=generator)]
        others = scored[torch.randint(len(scored), (episodes - stored,), generator=generator)]
        return torch.cat([picks, others]).to(self.env.market.device)

    def run(self, start_days: torch.Tensor) -> torch.Tensor:
        """Every window from ``start_days``; (P, E, D) per-day rewards of the agents held here (the environment's
        history, valid until its next reset)."""
        self.env.reset(start_days)
        self.graphed()
        self.buffer.commit(self.population.popsize * self.stored_episodes * self.env.episode_days)
        return self.env.rewards_per_episode

    def working_bytes(self) -> int:
        """The most bytes a rollout allocates at once on top of what it holds: its decisions' (``days_bytes``), and
        each day's exploration noise drawn for all P, the logits, their softmax and the environment's step vectors."""
        actor, env = self.population.actor, self.env
        steps = (
            FLOAT_BYTES * (env.market.num_assets + 1) * env.num_episodes * (self.population.popsize + 8 * actor.popsize)
        )
        return days_bytes(actor, env, self.blocks) + steps

    def fitness_of(self, rewards: torch.Tensor) -> torch.Tensor:
        """(P, E, D) rewards -> (P,) fitness of the agents held here, from the noise-free episodes."""
        returns_per_episode = episode_returns(rewards)  # (P, E)
        return fitness(returns_per_episode[:, self.fitness_episodes], kind=self.fitness_kind, worst_k=self.worst_k)


class Validation:
    """Validation of a run: the agents held here, the champion and equal weight on the whole validation range as one
    episode from cash; built once, its days graphed with ``runtime.cuda_graphs`` (``runtime.graphs``).

    The agents and the champion decide as one actor of P + 1 rows (``acting``, filled from the population once per
    validation), so each day is one forward of all of them; equal weight's action is fixed.
    """

    def __init__(
        self,
        config: Config,
        market: Market,
        population: Population,
        *,
        sharding: Sharding,
        starts: list[int] | None = None,
        days: int | None = None,
        block_device: torch.device | str | None = None,
    ):
        """``starts``/``days``: episodes of ``days`` days from each close in ``starts`` instead of the validation range
        (the same policies scored on other days, as ``benchmarks/selection_study.py`` does). ``block_device`` as for
        ``Rollouts``."""
        self.population = population
        validation = market.splits.validation
        agents = sharding.share.agents
        # The first decision's target earns the range's first day.
        starts = [first_decision(validation, config.env.execution_delay)] if starts is None else starts
        days = len(validation) if days is None else days
        self.starts = torch.tensor(starts, device=market.device)  # (E,)
        self.env = VectorPortfolioEnv.from_config(
            market, config.env, num_agents=agents + 2, num_episodes=len(starts), episode_days=days
        )
        size = window_size(config.env.lookback, market.num_features)
        with torch.device(market.device):  # made where it lives (filled from the population at each validation)
            self.acting = Actor(agents + 1, size, config.model, book=self.env.book).requires_grad_(False)
        n1 = market.num_assets + 1
        self.actions = torch.zeros(agents + 2, len(starts), n1, device=market.device)  # (P + 2, E, N + 1)
        self.actions[-1] = equal_weights((len(starts),), market.num_assets, device=market.device)  # the baseline
        per_day = block_bytes_per_day(config.model, agents=agents + 1, episodes=len(starts), assets=market.num_assets)
        self.blocks = block_lengths(days, bytes_per_day=per_day, device=block_device or market.device)
        windows = self.env.gatherer.empty(len(starts), max(self.blocks), device=market.device)
        this = weakref.proxy(self)  # the graphed call below is the phase's own: it holds it without a cycle
        day_step = lambda *args, **kwargs: this.day(*args, **kwargs)  # noqa: E731 (``day`` as it is then)
        work = functools.partial(
            validate_range, self.acting, self.env, windows, self.actions, blocks=self.blocks, day_step=day_step
        )
        self.day: Callable[..., None] = validate_day
        """One day's step (``validate_day``); ``runtime.compiled`` may replace it by its compiled form."""
        self.graphed = GraphedCall(functools.partial(Validation._days, this, work), device=market.device)

    def run(self) -> torch.Tensor:
        """(P + 2, E * D) daily log returns of the agents held here, the champion and equal weight, on the device
        (one episode, the validation range, unless built with other ``starts``)."""
        self.env.reset(self.starts)
        self.graphed()
        return self.env.rewards_per_episode.flatten(1)

    def working_bytes(self) -> int:
        """The most bytes a validation allocates at once on top of what it holds: its decisions' (``days_bytes``), and
        each day's logits, softmax and the environment's step vectors."""
        env = self.env
        steps = FLOAT_BYTES * (env.market.num_assets + 1) * 8 * env.num_agents * env.num_episodes
        return days_bytes(self.acting, env, self.blocks) + steps

    @torch.no_grad()
    def _days(self, work: Callable[[], None]) -> None:
        """The population's actors and the champion into ``acting``'s rows, then the days: one graphed call."""
        agents = self.population.actor.popsize
        for acting, actor, champion in zip(
            self.acting.parameters(), self.population.actor.parameters(), self.population.champion.parameters()
        ):
            acting[:agents].copy_(actor)
            acting[agents:].copy_(champion)
        work()
