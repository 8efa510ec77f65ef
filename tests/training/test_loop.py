"""The trainer end to end: smoke preset, determinism, resume, learning, invariants across generations."""

import json
import math
from pathlib import Path

import pytest
import torch

import main
from config import override, preset
from environment.vector_env import VectorPortfolioEnv
from persistence import checkpoint
from run.launch import start_run
from run.trainer import Trainer
from tests.run_checks import deterministic, rows, state_digest
from tests.synthetic import momentum_prices

REQUIRED_KEYS = {
    "generation",
    "best_fitness",
    "mean_fitness",
    "worst_fitness",
    "champion_score",
    "env_steps_per_s",
    "generation_s",
}


def run_main(*args: str) -> int:
    return main.main([*args, "--no-progress"])


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory) -> Path:
    """Three smoke runs of the same seed: a (3 generations), b (3 generations), c (2, then resumed to 3)."""
    root = tmp_path_factory.mktemp("runs")
    common = ["--preset", "smoke", "--checkpoint-uri", str(root), "--seed", "7"]
    assert run_main(*common, "--run-name", "a") == 0
    assert run_main(*common, "--run-name", "b") == 0
    assert run_main(*common, "--run-name", "c", "--generations", "2") == 0
    assert run_main("--checkpoint-uri", str(root), "--run-name", "c", "--resume", "--generations", "3") == 0
    return root


def test_smoke_preset_runs_three_generations(smoke_runs):
    run_dir = smoke_runs / "a"
    metrics = rows(run_dir)
    assert [row["generation"] for row in metrics] == [1, 2, 3]
    for row in metrics:
        assert set(row) >= REQUIRED_KEYS
        assert all(math.isfinite(row[key]) for key in REQUIRED_KEYS)
        assert row["worst_fitness"] <= row["mean_fitness"] <= row["best_fitness"]
    assert checkpoint.complete_generations(run_dir) == [1, 2, 3]
    assert (run_dir / "LATEST").read_text().strip() == "gen-000003"
    assert json.loads((run_dir / "config.json").read_text())["runtime"]["seed"] == 7


def test_same_seed_gives_identical_metrics_and_parameters(smoke_runs):
    a, b = smoke_runs / "a", smoke_runs / "b"
    assert [deterministic(r) for r in rows(a)] == [deterministic(r) for r in rows(b)]
    assert state_digest(a) == state_digest(b)


def test_resume_continues_bit_exactly(smoke_runs):
    a, c = smoke_runs / "a", smoke_runs / "c"
    assert [deterministic(r) for r in rows(c)] == [deterministic(r) for r in rows(a)]
    assert state_digest(c) == state_digest(a)
    gen_a, gen_c = checkpoint.open_generation(a), checkpoint.open_generation(c)
    assert gen_a.manifest["files"].keys() == gen_c.manifest["files"].keys()
    for name in (n.removesuffix(".safetensors") for n in gen_a.manifest["files"] if n.startswith("replay")):
        replay_a, replay_c = checkpoint.read_tensors(gen_a, name), checkpoint.read_tensors(gen_c, name)
        assert all(torch.equal(replay_a[key], replay_c[key]) for key in replay_a)


@pytest.mark.slow
def test_a_different_seed_gives_a_different_run(tmp_path, smoke_runs):
    assert run_main("--preset", "smoke", "--checkpoint-uri", str(tmp_path), "--run-name", "d", "--seed", "8") == 0
    assert state_digest(tmp_path / "d") != state_digest(smoke_runs / "a")


@pytest.mark.slow
def test_generations_reuse_storage_and_never_write_the_features(tmp_path):
    config = override(preset("smoke"), {"checkpoint.uri": str(tmp_path), "runtime.generations": 3})
    trainer = start_run(config, log=lambda line: None).trainer
    features_version = trainer.market.features._version
    tensors = {**trainer.population.state_tensors(), **trainer.buffer.storage}
    pointers = {key: t.data_ptr() for key, t in tensors.items()}
    modules = [trainer.population.actor, trainer.population.learner.critic]
    parameter_ids = [id(p) for m in modules for p in m.parameters()]
    trainer.run(until=3)
    assert trainer.market.features._version == features_version
    assert {key: t.data_ptr() for key, t in tensors.items()} == pointers
    assert [id(p) for m in modules for p in m.parameters()] == parameter_ids


# ---------------------------------------------------------------------------------------- learning


def baseline_validation(trainer: Trainer, policy: str) -> float:
    """Total validation log return of equal weight (rebalanced daily) or uniformly random weights."""
    market, cfg = trainer.market, trainer.config
    env = VectorPortfolioEnv(
        market,
        num_agents=1,
        num_episodes=len(trainer.validation.starts),
        episode_days=cfg.env.episode_days,
        lookback=cfg.env.lookback,
        cost_rate=cfg.env.cost_rate,
        execution_delay=cfg.env.execution_delay,
    )
    obs = env.reset(trainer.validation.starts)
    while obs is not None:
        if policy == "equal":
            actions = torch.full_like(obs.weights, 1.0 / (market.num_assets + 1))
            actions[..., 0] = 0.0
            actions /= actions.sum(-1, keepdim=True)
        else:
            actions = torch.distributions.Dirichlet(torch.ones_like(obs.weights)).sample()
        _, obs = env.step(actions)
    return float(env.rewards_per_episode.sum())


@pytest.mark.slow
def test_learns_a_market_whose_next_best_asset_is_visible_today(tmp_path):
    """Default learning settings, shortened: the champion must clearly beat equal weight and random
    weights on validation windows, by a margin the untrained population does not reach."""
    momentum_prices(seed=0).to_csv(tmp_path / "momentum.csv", index=False)
    config = override(
        preset("default"),
        {
            "data.path": str(tmp_path / "momentum.csv"),
            "data.validation_days": 252,
            "data.holdout_days": 63,
            "evolution.popsize": 8,
            "learner.buffer_size": 50_000,
            "runtime.generations": 8,
            "checkpoint.uri": str(tmp_path / "runs"),
        },
    )
    trainer = start_run(config, log=lambda line: None).trainer
    torch.manual_seed(0)  # the Dirichlet baseline draws from the global generator
    equal = baseline_validation(trainer, "equal")
    random = baseline_validation(trainer, "random")
    threshold = max(equal, random) + 0.3
    untrained_best = float(trainer.validation.run()[:-2].sum(dim=1).max())
    assert untrained_best < threshold, "the threshold must be out of reach of the untrained population"

    trainer.run(until=config.runtime.generations)
    assert trainer.champion.score > threshold, (trainer.champion.score, equal, random)
    # The reported score is the champion's own, recomputed on the same validation days.
    scores = trainer.validation.run()
    assert float(scores[-2].sum()) == pytest.approx(trainer.champion.score, abs=1e-5)  # the champion's slot


def test_a_diverged_loss_is_recorded_as_null_and_still_checkpoints(tmp_path, monkeypatch):
    from models.learner import Learner

    def diverged(self, batch, **kwargs):
        return {"actor": torch.full((self.actor.popsize,), float("nan"))}

    monkeypatch.setattr(Learner, "update", diverged)
    config = override(
        preset("smoke"), {"checkpoint.uri": str(tmp_path), "runtime.generations": 2, "learner.learning_starts": 0}
    )
    trainer = start_run(config, log=lambda line: None).trainer
    trainer.run(until=2)
    assert [row["actor_loss"] for row in rows(trainer.run_dir)] == [None, None]
    history = checkpoint.read_document(checkpoint.open_generation(trainer.run_dir), "history")
    assert [row["actor_loss"] for row in history] == [None, None]


def test_retention_keeps_the_last_generations_and_the_champions(tmp_path, monkeypatch):
    calls = []

    def crown_in_generation_two(edges, *_, **__):
        calls.append(1)
        return 0 if len(calls) == 2 else None

    monkeypatch.setattr("training.loop.choose_champion", crown_in_generation_two)
    config = override(
        preset("smoke"),
        {"checkpoint.uri": str(tmp_path), "checkpoint.keep_last": 1, "runtime.generations": 5, "runtime.seed": 7},
    )
    trainer = start_run(config, log=lambda line: None).trainer
    trainer.run(until=5)
    assert trainer.champion.generation == 2
    assert checkpoint.complete_generations(trainer.run_dir) == [2, 5]


def test_retention_with_the_equal_weight_champion_keeps_only_the_last(tmp_path, monkeypatch):
    monkeypatch.setattr("training.loop.choose_champion", lambda edges, *_, **__: None)
    config = override(
        preset("smoke"), {"checkpoint.uri": str(tmp_path), "checkpoint.keep_last": 1, "runtime.generations": 3}
    )
    trainer = start_run(config, log=lambda line: None).trainer
    trainer.run(until=3)
    assert trainer.champion.generation == 0
    assert checkpoint.complete_generations(trainer.run_dir) == [3]


@pytest.mark.slow
def test_a_resumed_run_crowns_exactly_as_one_never_stopped(tmp_path):
    """A market the agents learn within a few generations, so the gate crowns; stopped after 4 generations and
    resumed to 8, the run makes the same critical values, the same crowning and the same parameters as 8 in a row
    (the gate's crossed resamples come back from the checkpoint)."""
    momentum_prices(seed=0).to_csv(tmp_path / "momentum.csv", index=False)
    settings = ["data.validation_days=252", "data.holdout_days=63", "evolution.popsize=8", "learner.buffer_size=50000"]
    common = ["--data", str(tmp_path / "momentum.csv"), "--checkpoint-uri", str(tmp_path / "runs")]
    for setting in settings:
        common += ["--set", setting]
    assert run_main(*common, "--run-name", "straight", "--generations", "8") == 0
    assert run_main(*common, "--run-name", "resumed", "--generations", "4") == 0
    straight, resumed = tmp_path / "runs" / "straight", tmp_path / "runs" / "resumed"
    gate = checkpoint.read_tensors(checkpoint.open_generation(resumed), "selection")["crossed"]
    assert 0 < int(gate.sum()) < len(gate)  # the state the resume must restore is not the empty one
    resume = ["--checkpoint-uri", str(tmp_path / "runs"), "--run-name", "resumed", "--resume", "--generations", "8"]
    assert run_main(*resume) == 0
    assert [deterministic(r) for r in rows(resumed)] == [deterministic(r) for r in rows(straight)]
    assert state_digest(resumed) == state_digest(straight)
    assert rows(straight)[-1]["champion_generation"] > 0  # the gate crowned an agent


@pytest.mark.slow
def test_a_run_stopped_before_its_last_look_resumes_as_one_never_stopped(tmp_path):
    """``selection.method=final``: the run's planned end is its last look, which may spend what the earlier looks
    kept. A run stopped after generation 3 of 6 and resumed decides exactly as one never stopped: the same critical
    values, the last look's included, the same crowning and the same parameters."""
    momentum_prices(seed=0).to_csv(tmp_path / "momentum.csv", index=False)
    settings = {
        "data.path": str(tmp_path / "momentum.csv"),
        "data.validation_days": 252,
        "data.holdout_days": 63,
        "evolution.popsize": 8,
        "learner.buffer_size": 50000,
        "selection.method": "final",
        "runtime.generations": 6,
        "runtime.progress": False,
        "checkpoint.uri": str(tmp_path / "runs"),
    }
    for name, until in (("straight", 6), ("stopped", 3)):
        run = start_run(override(preset("default"), {**settings, "checkpoint.run_name": name}), log=lambda line: None)
        run.trainer.run(until=until)
        run.finish()
    assert run_main("--checkpoint-uri", str(tmp_path / "runs"), "--run-name", "stopped", "--resume") == 0
    straight, stopped = rows(tmp_path / "runs" / "straight"), rows(tmp_path / "runs" / "stopped")
    assert [deterministic(r) for r in stopped] == [deterministic(r) for r in straight]
    assert state_digest(tmp_path / "runs" / "stopped") == state_digest(tmp_path / "runs" / "straight")
    # the last look spent what the others kept: its critical value is the one the earlier looks announced
    assert straight[-1]["selection_z"] == straight[-1]["selection_last_z"] < straight[-2]["selection_z"]


def test_a_stop_costs_one_vote_per_phase_however_many_updates(tmp_path):
    """With several processes each vote is a collective: the loop votes between phases (three a generation), never
    per learner update, so 2 or 24 updates cost the same."""
    votes = {}
    for updates in (2, 24):
        config = override(
            preset("smoke"),
            {
                "checkpoint.uri": str(tmp_path / str(updates)),
                "runtime.generations": 3,
                "learner.updates_per_generation": updates,
                "learner.learning_starts": 0,
            },
        )
        trainer = start_run(config, log=lambda line: None).trainer
        ranks, calls = trainer.sharding.ranks, []
        vote = ranks.any
        ranks.any = lambda flag, calls=calls, vote=vote: calls.append(flag) or vote(flag)
        trainer.run(until=2)
        assert all(row["updates"] == updates for row in rows(trainer.run_dir))
        votes[updates] = len(calls)
    assert votes == {2: 6, 24: 6}


def test_a_stop_asked_during_the_updates_abandons_the_generation(tmp_path):
    """One process polls its own flag between updates (no collective): the generation is abandoned there and
    nothing of it is written."""
    from run.trainer import RunStopped

    config = override(
        preset("smoke"),
        {"checkpoint.uri": str(tmp_path), "learner.updates_per_generation": 8, "learner.learning_starts": 0},
    )
    polls = []

    def should_stop() -> bool:
        polls.append(None)
        return len(polls) == 5  # the three votes before the update phase, then before its first and second update

    trainer = start_run(config, log=lambda line: None, should_stop=should_stop).trainer
    with pytest.raises(RunStopped) as stopped:
        trainer.run(until=1)
    assert stopped.value.generation == 0
    assert int(trainer.population.learner.actor_optim.step_count) == 1  # one update taken, the second never started
    assert checkpoint.latest_generation(trainer.run_dir) is None


def test_the_days_in_blocks_trade_as_the_days_one_at_a_time(tmp_path, monkeypatch):
    """How many days a block holds (``training.rollout.block_lengths``, set by memory) changes how the windows' part is
    batched, not what the agents do: a block of one day at a time gives the same rewards, fitness and validation to
    float rounding, and the same transitions in the buffer."""
    from training import rollout

    def built(name: str) -> Trainer:
        config = override(preset("smoke"), {"checkpoint.uri": str(tmp_path / name), "runtime.seed": 4})
        return start_run(config, log=lambda line: None).trainer

    blocks = built("blocks")
    monkeypatch.setitem(rollout.BLOCK_BYTES, "cpu", 1)
    days = built("days")
    assert len(blocks.rollouts.blocks) < len(days.rollouts.blocks) == blocks.config.env.episode_days
    assert len(days.validation.blocks) == len(blocks.market.splits.validation) > len(blocks.validation.blocks)
    for trainer in (blocks, days):
        trainer.rollout_rewards = trainer.rollouts.run(trainer.rollouts.sample_starts()).clone()
        trainer.validation_returns = trainer.validation.run().clone()
    torch.testing.assert_close(blocks.rollout_rewards, days.rollout_rewards, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(blocks.validation_returns, days.validation_returns, rtol=1e-5, atol=1e-7)
    for key, stored in blocks.buffer.storage.items():
        torch.testing.assert_close(stored, days.buffer.storage[key], rtol=1e-5, atol=1e-7, msg=key)
    for trainer in (blocks, days):
        trainer.checkpoints.close()


@pytest.mark.parametrize(
    "learning",
    [
        ["learner.algorithm=td3", "learner.gamma=0.9", "learner.actor_objective=critic"],
        ["learner.algorithm=td3", "learner.gamma=0.9"],
        ["learner.gamma=0.9", "learner.actor_objective=critic"],
    ],
    ids=["td3-critic", "td3-model", "ddpg-critic"],
)
@pytest.mark.slow
def test_each_learner_resumes_bit_exactly(tmp_path, learning):
    """TD3 (twin critics, smoothing noise, delayed actor steps) and DDPG, with both actor objectives: N generations, a
    resume and M more equal N + M, parameters, moments, step counts and metrics rows."""
    settings = [arg for item in learning for arg in ("--set", item)]
    common = [
        "--preset",
        "smoke",
        "--checkpoint-uri",
        str(tmp_path),
        "--seed",
        "2",
        "--set",
        "learner.learning_starts=0",
    ]
    assert run_main(*common, *settings, "--run-name", "whole", "--generations", "3") == 0
    assert run_main(*common, *settings, "--run-name", "parts", "--generations", "2") == 0
    assert run_main("--checkpoint-uri", str(tmp_path), "--run-name", "parts", "--resume", "--generations", "3") == 0
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert [deterministic(r) for r in rows(parts)] == [deterministic(r) for r in rows(whole)]
    assert state_digest(parts) == state_digest(whole)
    if "learner.algorithm=td3" in learning:
        state = checkpoint.read_tensors(checkpoint.open_generation(whole), "population")
        assert any(key.startswith("twin_critic.") for key in state)
        steps = checkpoint.read_document(checkpoint.open_generation(whole), "state")
        steps = steps["optimiser_steps"]  # by the names the learner gives its optimisers
        assert steps["critic"] == 2 * steps["actor"] > 0  # the actor every second update


@pytest.mark.slow
def test_a_long_short_run_at_a_cadence_resumes_bit_exactly(tmp_path):
    """The long-short book at a cadence of 3 days with a delay of 2 (the order seen as sent, one more buffer
    column): a run stopped after 2 generations and resumed to 3 is the run that never stopped."""
    book = ["--set", "env.book=long_short", "--set", "env.rebalance_every=3", "--set", "env.execution_delay=2"]
    common = ["--preset", "smoke", "--checkpoint-uri", str(tmp_path), "--seed", "3", *book]
    assert run_main(*common, "--run-name", "whole") == 0
    assert run_main(*common, "--run-name", "cut", "--generations", "2") == 0
    assert run_main("--checkpoint-uri", str(tmp_path), "--run-name", "cut", "--resume", "--generations", "3") == 0
    assert [deterministic(r) for r in rows(tmp_path / "cut")] == [deterministic(r) for r in rows(tmp_path / "whole")]
    assert state_digest(tmp_path / "cut") == state_digest(tmp_path / "whole")
