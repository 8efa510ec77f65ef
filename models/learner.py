"""The learner: every agent's actor-critic update at once, DDPG or TD3, as one object.

The learner owns the agents' networks (actor, critic, their targets), their optimisers and step counts, declares them
once (``trained``) and answers for all of its parts, so that nothing outside names them: ``update(batch) -> losses`` (by
``losses``' names), its networks (``networks``) and every parameter (``network_tensors``), its optimisers by name
(``optimisers``, whose ``step_counts`` a checkpoint holds by that name), what it saves (``agent_tensors``), what an
offspring inherits (``inheritance``), the methods a compiler may wrap (``compilable``) and what it costs in memory
(``run.sizing`` builds one on the meta device). ``build_learner`` makes one from a run's config, in one place.
Each agent's loss depends only on its own slice of the stacked parameters, so the sum of the per-agent losses has,
for each slice, exactly that agent's gradient: one backward trains all P.

As in Stable-Baselines3, DDPG is TD3 with one critic, no target policy smoothing and an actor step every update:

* ``ddpg``: the critic learns Q on the TD target ``r + gamma * Q'(s', actor'(s'))``.
* ``td3``: twin critics, each on the target ``r + gamma * min(Q1', Q2')(s', softmax(logits'(s') + clipped noise))``
  (the action lives on the simplex, so the smoothing noise goes on the target actor's logits, as exploration's
  does), and the actor and the targets move every ``policy_delay``-th update only.

The actor has two objectives:

* ``critic``: maximise ``Q1(s, actor(s))``. The critic must learn from noisy rewards how each asset's weight pays,
  and its errors are what the actor climbs.
* ``model``: the market is exogenous (a trade moves no price), so the day after a recorded decision is known for
  *any* action: maximise ``r(s, a) + gamma * Q1(s', actor(s'))`` with ``a = actor(s)``, where ``r`` and the next
  weights in ``s'`` come from ``environment.kernel.trade`` on the recorded price relatives, differentiated
  exactly. Only the value of the days after that comes from the critic (a one-step value expansion). Costs are in
  ``r``, so every gradient weighs a trade against what it pays.

Either objective may subtract ``tilt_penalty * ||a - equal weight||^2`` a day: a prior at equal weight, so that a
tilt the data do not pay for consistently (on a market with no signal, none is) decays instead of drifting with the
noise the gradient fits.

Nothing is computed that nothing reads: with the ``model`` objective and ``gamma`` 0 no one reads a critic, so none is
trained (``trains_critic``); at ``gamma`` 0 the target networks are neither run nor averaged, since their value would
be multiplied by zero.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from config import Config, LearnerConfig, ModelConfig
from environment.book import LONG_ONLY, Book
from environment.kernel import trade
from models.networks import Actor, Critic
from models.optim import BatchedAdam
from models.replay import ReplayBatch
from models.share import Share


class Inheritance(NamedTuple):
    """What an offspring takes from its parents (``training.evolution``), tensors whose dim 0 is the agent."""

    blended: dict[str, torch.Tensor]
    """The actor: a blend of the parent and a mate, then mutated."""
    copied: dict[str, torch.Tensor]
    """From the parent alone: what it learned beside the actor (its moments, the critics, their targets)."""
    restarted: list[tuple[torch.Tensor, torch.Tensor]]
    """(target, source): a target network that restarts from the offspring's new network."""


class Trained(NamedTuple):
    """What one optimiser trains (``Learner.trained``), moved by the loss of the same name."""

    networks: dict[str, torch.nn.Module]
    """The networks it trains, by checkpoint prefix."""
    targets: dict[str, torch.nn.Module]
    """Their targets, by checkpoint prefix, in the same order (none for a part without targets)."""
    optimiser: BatchedAdam
    computed: bool = True
    """Whether an update computes its loss with these settings (a critic nothing reads is not trained)."""
    delayed: bool = False
    """Whether its loss is computed only on the updates that move the actor (TD3's ``policy_delay``)."""


def trains_critic(objective: str, gamma: float) -> bool:
    """Whether anything reads a critic: the ``critic`` objective, or a discount above 0 (the next day's value in
    either objective). With the ``model`` objective and ``gamma`` 0 the actor climbs the exact reward alone, and a
    critic trained beside it would be work whose result nothing uses."""
    return objective == "critic" or gamma > 0


class Learner:
    """The actor-critic learner of ``agents`` agents (DDPG or TD3, ``settings.algorithm``), batched over them.

    A third algorithm is a subclass that declares what it trains (``trained``: its networks, their targets, its
    optimisers and losses; the rest is derived) and overrides the losses that differ (``update``, ``actor_loss``...),
    chosen by ``learner.algorithm`` in ``build_learner``.

    Args:
        agents: the agents this learner holds (dim 0 of every tensor).
        window_size: L * K values per asset window.
        model: the networks' widths.
        settings: the learner's hyperparameters (``config.LearnerConfig``).
        cost_rate: the environment's, for the ``model`` objective.
        book: the book the actor's logits become weights of, traded and held as the environment does
            (``environment.book``).
        device: where every tensor lives.
        generator: draws the initial parameters.
        share: the agents of a larger population these are (``models.share``; all ``agents`` by default): every
            draw is made for all of it, so an agent's values do not depend on how the population is split.
        per_agent_lr: give the actor's optimiser a per-agent learning-rate scale (``BatchedAdam.lr_scale``).
        noise_generator: the device stream TD3's target smoothing noise is drawn from (the replay batches' stream).
    """

    def __init__(
        self,
        agents: int,
        window_size: int,
        model: ModelConfig,
        settings: LearnerConfig,
        *,
        cost_rate: float,
        device: torch.device | str,
        generator: torch.Generator,
        book: Book = LONG_ONLY,
        share: Share | None = None,
        per_agent_lr: bool = False,
        noise_generator: torch.Generator | None = None,
    ) -> None:
        self.settings = settings
        self.widths = model
        self.window_size = window_size
        self.cost_rate = cost_rate
        self.book = book
        self.share = share or Share.whole(agents)
        twins = settings.algorithm == "td3"
        self.policy_delay = settings.policy_delay if twins else 1
        self.target_noise = settings.target_noise if twins else 0.0
        self.trains_critic = trains_critic(settings.actor_objective, settings.gamma)
        self.reads_targets = self.trains_critic and settings.gamma > 0
        """The TD target's next-day value is read only at gamma > 0: else targets are neither run nor averaged."""
        self.reads_next_obs = settings.gamma > 0
        """Only a discounted next day reads a batch's next observations (the TD target, the model objective's
        critic term): at gamma 0 the buffer need not gather them."""

        def networks(kind: type[Actor] | type[Critic]) -> tuple[torch.nn.Module, torch.nn.Module]:
            extra = {"book": book} if kind is Actor else {}
            with torch.device(device):  # made where they live: the meta device (sizing) allocates nothing
                online, target = kind(agents, window_size, model, **extra), kind(agents, window_size, model, **extra)
            if torch.device(device).type != "meta":  # shapes only there: no values to draw
                online.reset_parameters(generator, share=self.share)
                with torch.no_grad():
                    for mine, theirs in zip(target.parameters(), online.parameters()):
                        mine.copy_(theirs)
            return online, target.requires_grad_(False)

        self.actor, self.actor_target = networks(Actor)
        self.critic, self.critic_target = networks(Critic)
        self.twin_critic, self.twin_critic_target = networks(Critic) if twins else (None, None)
        self.actor_optim = BatchedAdam(
            list(self.actor.parameters()),
            lr=settings.actor_lr,
            max_grad_norm=settings.max_grad_norm,
            per_agent_lr=per_agent_lr,
        )
        self.critic_optim = BatchedAdam(
            [p for critic in self.critics for p in critic.parameters()],
            lr=settings.critic_lr,
            max_grad_norm=settings.max_grad_norm,
        )
        self.noise_generator = noise_generator
        self._smoothing: torch.Tensor | None = None  # TD3's target smoothing noise, this learner's rows

    compilable: tuple[str, ...] = ("td_target", "critic_loss", "actor_loss", "average_targets_")
    """The methods a compiler may wrap (``runtime.compiled``): device arithmetic on fixed shapes, nothing drawn or
    decided on the host inside; with the optimisers' steps."""

    def trained(self) -> dict[str, Trained]:
        """What the learner trains, by the name of its loss and its optimiser: the one declaration its networks,
        optimisers, losses, checkpoint keys and inheritance are derived from. A new algorithm adds its own."""
        critics = {"critic": self.critic, "twin_critic": self.twin_critic}
        targets = {"critic_target": self.critic_target, "twin_critic_target": self.twin_critic_target}
        return {
            "actor": Trained(
                {"actor": self.actor}, {"actor_target": self.actor_target}, self.actor_optim, delayed=True
            ),
            "critic": Trained(
                {name: c for name, c in critics.items() if c is not None},
                {name: t for name, t in targets.items() if t is not None},
                self.critic_optim,
                computed=self.trains_critic,
            ),
        }

    @property
    def losses(self) -> tuple[str, ...]:
        """Every loss an update may report (``loss_names``: those this learner's settings compute)."""
        return tuple(self.trained())

    @property
    def loss_names(self) -> tuple[str, ...]:
        """The losses ``update`` reports: those of the parts it trains with these settings."""
        return tuple(name for name, part in self.trained().items() if part.computed)

    @property
    def optimisers(self) -> dict[str, BatchedAdam]:
        """The optimisers by name: a checkpoint holds their step counts by it."""
        return {name: part.optimiser for name, part in self.trained().items()}

    @property
    def trained_networks(self) -> list[torch.nn.Module]:
        """The networks the optimisers train: the actor and the critics."""
        return [network for part in self.trained().values() for network in part.networks.values()]

    @property
    def critics(self) -> list[Critic]:
        """The critics trained together: one (DDPG) or twins (TD3)."""
        return [c for c in (self.critic, self.twin_critic) if c is not None]

    def loss_counts(self, updates: int) -> dict[str, int]:
        """How many of a generation's first ``updates`` updates compute each loss (TD3's actor moves on every
        ``policy_delay``-th)."""
        actor = sum(self.takes_actor_step(index) for index in range(updates))
        trained = self.trained()
        return {name: actor if trained[name].delayed else updates for name in self.loss_names}

    @torch.no_grad()
    def hold_actors_(self, held: torch.Tensor) -> None:
        """The agents of ``held`` (bool, one per agent here) take no actor step until this is called again: their
        actor's learning rate is scaled to 0 (the frozen elites of ``evolution.frozen_elites``); no-op without the
        per-agent scale."""
        scale = self.actor_optim.lr_scale
        if scale is not None:
            scale.copy_(~held)

    def takes_actor_step(self, update: int) -> bool:
        """Whether the ``update``-th update of a generation (0-based) moves the actor and the targets (TD3: every
        ``policy_delay``-th)."""
        return (update + 1) % self.policy_delay == 0

    # ------------------------------------------------------------------ the losses

    @torch.no_grad()
    def td_target(self, batch: ReplayBatch, smoothing: torch.Tensor | None = None) -> torch.Tensor:
        """(P, B) the critics' target: the reward, plus at gamma > 0 the discounted value of the next day by the target
        networks (TD3: the smaller of the twins', of the target actor's action with ``smoothing`` on its logits).
        Truncation is not an end: only termination stops the bootstrap."""
        gamma = self.settings.gamma
        if gamma == 0:
            return batch.rewards  # the next day's value would be multiplied by zero: not computed
        logits = self.actor_target.logits(batch.next_obs)
        if smoothing is not None:
            logits = logits + smoothing
        next_actions = self.book.weights(logits)
        next_q = self.critic_target(batch.next_obs, next_actions)
        if self.twin_critic_target is not None:
            twin = self.twin_critic_target(batch.next_obs, next_actions)
            next_q = torch.minimum(next_q, twin)
        return batch.rewards + gamma * (1.0 - batch.terminated) * next_q  # (P, B)

    def critic_loss(self, batch: ReplayBatch, target_q: torch.Tensor) -> torch.Tensor:
        """(P,) the squared TD error of each agent's critics, summed over the critics."""
        loss = None
        for critic in self.critics:
            q = critic(batch.obs, batch.actions)  # (P, B)
            error = (q - target_q).pow(2).mean(dim=1)  # (P,)
            loss = error if loss is None else loss + error
        return loss

    def actor_loss(self, batch: ReplayBatch) -> torch.Tensor:
        """(P,) minus each agent's objective (``settings.actor_objective``), with the tilt penalty."""
        gamma = self.settings.gamma
        actions = self.actor(batch.obs)  # (P, B, N + 1)
        if self.settings.actor_objective == "model":
            held = batch.obs.weights if batch.held is None else batch.held  # the order the trade starts from
            step = trade(held, actions, batch.fill, cost_rate=self.cost_rate, book=self.book)
            value = step.rewards  # (P, B)
            if gamma > 0:
                seen = step.next_weights if batch.held is None else actions  # what the next decision sees
                next_obs = batch.next_obs._replace(weights=seen)  # the day after this action
                next_q = self.critic(next_obs, self.actor(next_obs))
                value = value + gamma * (1.0 - batch.terminated) * next_q
        else:
            value = self.critic(batch.obs, actions)
        if self.settings.tilt_penalty > 0:
            assets = actions.shape[-1] - 1
            equal_weight = torch.full_like(actions[0, 0], 1.0 / assets)
            equal_weight[0] = 0.0  # cash first
            value = value - self.settings.tilt_penalty * (actions - equal_weight).pow(2).sum(dim=-1)  # (P, B)
        return -value.mean(dim=1)

    # ------------------------------------------------------------------ one update

    def update(self, batch: ReplayBatch, *, actor_step: bool = True) -> dict[str, torch.Tensor]:
        """One update of every agent on ``batch`` (P, B): the critics on the TD target (when something reads them),
        then, with ``actor_step`` (``takes_actor_step``), the actor on its objective and the targets' Polyak average.
        Returns the (P,) losses it computed, detached, by ``loss_names``."""
        losses = {}
        if self.trains_critic:
            loss = self.critic_loss(batch, self.td_target(batch, self._smoothing_noise(batch.actions)))
            self.critic_optim.zero_grad()
            loss.sum().backward()
            self.critic_optim.step()
            losses["critic"] = loss.detach()
        if actor_step:
            for critic in self.critics:  # the actor's loss must not spend work on critic gradients
                critic.requires_grad_(False)
            try:
                loss = self.actor_loss(batch)
                self.actor_optim.zero_grad()
                loss.sum().backward()
            finally:
                for critic in self.critics:
                    critic.requires_grad_(True)
            self.actor_optim.step()
            if self.reads_targets:
                self.average_targets_()
            losses["actor"] = loss.detach()
        return losses

    @torch.no_grad()
    def _smoothing_noise(self, like: torch.Tensor) -> torch.Tensor | None:
        """TD3's target policy smoothing for a batch whose actions are ``like`` (P, B, N + 1): Gaussian noise of
        ``target_noise`` clipped to ``target_noise_clip``, for the target actor's logits; drawn for the whole
        population from ``noise_generator``, this learner's rows kept. None for DDPG or at gamma 0."""
        if self.target_noise == 0 or not self.reads_targets:
            return None
        if self._smoothing is None:  # allocated once, at the first update
            self._draws = like.new_empty((self.share.popsize, *like.shape[1:]))
            self._smoothing = torch.empty_like(like)
        torch.randn(self._draws.shape, generator=self.noise_generator, out=self._draws)
        mine = self.share.mine(self._draws)
        clip = self.settings.target_noise_clip
        return torch.clamp(mine * self.target_noise, -clip, clip, out=self._smoothing)

    @torch.no_grad()
    def average_targets_(self) -> None:
        """target <- target + tau * (online - target), for every network and its target."""
        for online, target in self.trained_pairs():
            torch._foreach_lerp_(list(target.parameters()), list(online.parameters()), self.settings.tau)

    def trained_pairs(self) -> list[tuple[torch.nn.Module, torch.nn.Module]]:
        """(network, its target) for every trained network that has one: the actor and every critic."""
        return [pair for part in self.trained().values() for pair in zip(part.networks.values(), part.targets.values())]

    # ------------------------------------------------------------------ its state

    def networks(self) -> dict[str, torch.nn.Module]:
        """Every network by its checkpoint prefix: each part's networks and their targets."""
        return {name: m for part in self.trained().values() for name, m in {**part.networks, **part.targets}.items()}

    def agent_tensors(self) -> dict[str, torch.Tensor]:
        """Every stacked tensor of the learner (dim 0 = agent), by checkpoint key: the networks' parameters and both
        optimisers' moments (``actor_optim.exp_avg.<name>``, ...; the twin critic's names start with ``twin.``)."""
        out = self.network_tensors()
        names = self.optimised_names()
        for name, optim in self.optimisers.items():
            out.update({f"{name}_optim.{key}": tensor for key, tensor in optim.state_tensors(names[name]).items()})
        return out

    def optimised_names(self) -> dict[str, list[str]]:
        """Each optimiser's parameters' names, in its order (the keys of its moments in ``agent_tensors``): its first
        network's as they are, a second's after its prefix's first word (``twin_critic``: ``twin.``)."""
        names = {}
        for name, part in self.trained().items():
            first, *others = part.networks
            names[name] = [
                f"{prefix}{parameter}"
                for key, prefix in [(first, ""), *[(other, f"{other.removesuffix('_' + first)}.") for other in others]]
                for parameter, _ in part.networks[key].named_parameters()
            ]
        return names

    def step_counts(self) -> dict[str, torch.Tensor]:
        """Each optimiser's steps (0-dim float64 on the device), by the optimiser's name."""
        return {name: optim.step_count for name, optim in self.optimisers.items()}

    def network_tensors(self) -> dict[str, torch.Tensor]:
        """Every network's parameters (dim 0 = agent), by checkpoint key (``agent_tensors`` without the moments)."""
        return {
            f"{prefix}.{name}": tensor
            for prefix, module in self.networks().items()
            for name, tensor in module.named_parameters()
        }

    def inheritance(self) -> Inheritance:
        """What an offspring inherits: its actor blended (``blended``); from the parent, the actor's moments and, for
        every other part the settings train, its networks, their moments and, when read, their targets (``copied``);
        the actor target restarts from the new actor when targets are read (``restarted``). Nothing that nothing reads
        moves."""
        tensors = self.agent_tensors()
        keep = []
        for name, part in self.trained().items():
            if name == "actor":
                keep.append(f"{name}_optim.")
            elif part.computed:
                keep += [f"{network}." for network in part.networks] + [f"{name}_optim."]
                if self.reads_targets:
                    keep += [f"{target}." for target in part.targets]
        blended = {k: t for k, t in sorted(tensors.items()) if k.startswith("actor.")}
        copied = {k: t for k, t in sorted(tensors.items()) if k.startswith(tuple(keep))}
        restarted = []
        if self.reads_targets:
            restarted = list(zip(self.actor_target.parameters(), self.actor.parameters()))
        return Inheritance(blended, copied, restarted)


LEARNERS: dict[str, type[Learner]] = {"ddpg": Learner, "td3": Learner}
"""The learner of each ``learner.algorithm``: DDPG and TD3 are one class (TD3's parts switched on by the setting)."""


def build_learner(
    config: Config,
    window_size: int,
    *,
    agents: int,
    device: torch.device | str,
    generator: torch.Generator,
    share: Share | None = None,
    noise_generator: torch.Generator | None = None,
) -> Learner:
    """A run's learner for ``agents`` agents (``share``: of a larger population), from its config: the one place the
    config's sections become a learner's arguments (the population, sizing and inspection all build theirs here)."""
    return LEARNERS[config.learner.algorithm](
        agents,
        window_size,
        config.model,
        config.learner,
        cost_rate=config.env.cost_rate,
        book=Book.from_env(config.env),
        device=device,
        generator=generator,
        share=share,
        per_agent_lr=config.evolution.frozen_elites,
        noise_generator=noise_generator,
    )
