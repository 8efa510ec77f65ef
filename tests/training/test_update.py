"""The update phase (``training.update``): every agent's learner update from the replay buffer, its losses summed on the
device, the elites' actors kept as evolution left them, the observation noise drawn into one buffer."""

from __future__ import annotations

import pytest
import torch

from config import override, preset
from run.launch import start_run
from run.trainer import Trainer


def trainer_with(root, **settings) -> Trainer:
    config = override(preset("smoke"), {"checkpoint.uri": str(root), "runtime.seed": 3, **settings})
    trainer = start_run(config, log=lambda line: None).trainer
    trainer.rollouts.run(trainer.rollouts.sample_starts())  # fill the buffer without updating
    return trainer


def test_the_sums_are_the_losses_of_each_update_added_on_the_device(tmp_path):
    summed, stepped = (trainer_with(tmp_path / name, **{"learner.gamma": 0.9}) for name in ("summed", "stepped"))
    frozen = torch.zeros(summed.config.evolution.popsize, dtype=torch.bool)
    summed.update_phase.begin(frozen=frozen)
    for index in range(3):
        summed.update_phase(index)
    losses = [stepped.update_phase.update() for _ in range(3)]
    critic = losses[0]["critic"] + losses[1]["critic"] + losses[2]["critic"]
    actor = losses[0]["actor"] + losses[1]["actor"] + losses[2]["actor"]
    assert summed.update_phase.loss_names == ("actor", "critic")
    assert torch.equal(summed.update_phase.loss_sums, torch.stack([actor, critic], dim=1))  # (P, 2)
    assert all(
        torch.equal(a, b) for a, b in zip(summed.population.actor.parameters(), stepped.population.actor.parameters())
    )
    summed.update_phase.begin(frozen=frozen)
    assert not summed.update_phase.loss_sums.any()  # each generation sums from 0
    for trainer in (summed, stepped):
        trainer.checkpoints.close()


def test_frozen_elites_take_no_actor_step_and_the_others_do(tmp_path, monkeypatch):
    """``evolution.frozen_elites``: in each generation the elites' actors leave the update phase exactly as evolution
    left them (kept bit for bit from the fitness measurement); every other agent's actor moves."""
    config = override(
        preset("smoke"),
        {
            "checkpoint.uri": str(tmp_path),
            "evolution.frozen_elites": True,
            "learner.learning_starts": 0,
            "runtime.generations": 2,
        },
    )
    trainer = start_run(config, log=lambda line: None).trainer
    seen = []
    update = Trainer._update

    def watched(self, plan):
        before = [p.detach().clone() for p in self.population.actor.parameters()]
        result = update(self, plan)
        after = list(self.population.actor.parameters())
        moved = torch.stack([(a != b).flatten(1).any(dim=1) for a, b in zip(after, before)]).any(dim=0)  # (P,)
        seen.append((plan.elite.clone(), moved))
        return result

    monkeypatch.setattr(Trainer, "_update", watched)
    trainer.run(until=2)
    assert len(seen) == 2
    for elite, moved in seen:
        assert elite.any() and not moved[elite].any()
        assert moved[~elite].all()


def test_observation_noise_perturbs_the_replayed_windows_in_place_with_one_buffer(tmp_path, monkeypatch):
    """learner.observation_noise: the same transitions as without it, their features plus N(0, stdev), drawn into one
    buffer allocated once."""
    seen: dict[str, list] = {"quiet": [], "noisy": []}

    def capture(name, learner):
        original = learner.update

        def update(batch, **kwargs):
            seen[name].append((batch.obs.windows.clone(), batch.next_obs.windows.clone()))  # as the learner receives it
            return original(batch, **kwargs)

        return update

    discounted = {"learner.gamma": 0.5}  # a learner that reads the next observations: they are gathered
    quiet = trainer_with(tmp_path / "quiet", **{"learner.observation_noise": 0.0, **discounted})
    noisy = trainer_with(tmp_path / "noisy", **{"learner.observation_noise": 0.5, **discounted})
    for name, trainer in (("quiet", quiet), ("noisy", noisy)):
        monkeypatch.setattr(trainer.update_phase.learner, "update", capture(name, trainer.update_phase.learner))
        trainer.update_phase.update()
        draws = None if trainer.update_phase.noise is None else trainer.update_phase.noise.draws.data_ptr()
        trainer.update_phase.update()
        assert draws is None or trainer.update_phase.noise.draws.data_ptr() == draws  # one buffer, allocated once
        trainer.checkpoints.close()
    assert quiet.update_phase.noise is None
    # The first batches are the same transitions (the noise is drawn after the sample, from the same stream).
    (q_windows, q_next), (n_windows, n_next) = seen["quiet"][0], seen["noisy"][0]
    for clean, noisy_windows in ((q_windows, n_windows), (q_next, n_next)):
        difference = noisy_windows - clean
        assert difference.std().item() == pytest.approx(0.5, rel=0.1)
        assert abs(difference.mean().item()) < 0.05


@pytest.mark.parametrize("noise", [0.0, 0.3])
def test_at_gamma_0_the_next_observations_are_not_gathered_and_nothing_learned_changes(tmp_path, noise):
    """A learner at gamma 0 reads no next observation (``Learner.reads_next_obs``): its batches come without them,
    and the updates train the same parameters, bit for bit, as with them gathered (the observation noise is drawn for
    them either way, so its stream is the same)."""
    settings = {"learner.observation_noise": noise}
    lean, full = trainer_with(tmp_path / "lean", **settings), trainer_with(tmp_path / "full", **settings)
    assert not lean.buffer.gathers_next_obs and lean.buffer.sample(torch.Generator()).next_obs is None
    full.buffer.gathers_next_obs = True  # as before the learner said what it reads
    for trainer in (lean, full):
        for _ in range(3):
            trainer.update_phase.update()
        trainer.checkpoints.close()
    for key, tensor in full.population.state_tensors().items():
        assert torch.equal(lean.population.state_tensors()[key], tensor), key


def test_with_the_default_settings_a_critic_nothing_reads_changes_no_actor_fitness_or_validation(tmp_path, monkeypatch):
    """Skipping the critic (``models.learner.trains_critic``) removes work, not results: a run that trains a critic
    nothing reads (as earlier versions did) gives the same actors, fitness, validation and champion bit for bit, and
    its metrics rows say the critic was trained; the default run's rows say it was not, with no critic loss."""
    from models import learner

    def run(name: str) -> tuple[Trainer, list[dict]]:
        config = override(
            preset("smoke"), {"checkpoint.uri": str(tmp_path / name), "runtime.seed": 3, "learner.learning_starts": 0}
        )
        trainer = start_run(config, log=lambda line: None).trainer
        found: list[dict] = []
        trainer.run(until=3, on_generation=found.append)
        return trainer, found

    skipped, skipped_rows = run("skipped")
    monkeypatch.setattr(learner, "trains_critic", lambda objective, gamma: True)
    trained, trained_rows = run("trained")
    measured = ("fitness", "validation", "champion", "best_edge", "selection_z", "elites", "actor_loss")
    for mine, theirs in zip(skipped_rows, trained_rows):
        assert {k: v for k, v in mine.items() if k.startswith(measured)} == {
            k: v for k, v in theirs.items() if k.startswith(measured)
        }
        assert mine["not_computed"] == ["critic"] and mine["critic_loss"] is None
        assert theirs["not_computed"] == [] and theirs["critic_loss"] > 0
    for key, tensor in skipped.population.state_tensors().items():
        same = torch.equal(tensor, trained.population.state_tensors()[key])
        assert same != key.startswith(("critic.", "critic_optim.")), key  # only the critic and its moments differ
