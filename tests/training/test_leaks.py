"""Leak tests. A healthy run's memory is flat once the replay ring is full; each leak the replaced system's
incident reports name, injected into the running trainer, is flagged by the same detector.

Nothing here calls ``gc.collect()`` or ``torch.cuda.empty_cache()``: the trainer must be flat on its own.
Rows come from ``metrics.jsonl`` (the test keeps nothing per generation that would itself grow).
"""

import concurrent.futures
import copy

import pytest
import torch

from config import override, preset
from environment.vector_env import VectorPortfolioEnv
from models.population import Population
from models.replay import ReplayBuffer
from tests.run_checks import rows
from training import trainer as trainer_module
from training.runs import start_run
from utils.telemetry import leak_findings

GENERATIONS = 12
WARM_FROM = 4  # the 400-transition ring fills in generation 2; judge from generation 4 on
BOUNDS = {
    # Live tensors and collector-tracked objects of a healthy run are flat exactly (measured), so any rise
    # is a leak. RSS moves by a page now and then (measured under 10 kB per generation at this scale); 64 kB
    # is far below every injected leak that shows only in RSS. Python's allocated blocks rise about 28 per
    # generation here while interpreter and PyTorch caches fill (see utils.telemetry.leak_findings): 100 a
    # generation is the bound.
    "rss_slope_bytes": 64_000,
    "objects_slack": 8,  # flat alone; other tests' background threads in the same process move it by one or two
    "blocks_slope_limit": 100,
}


def run_trainer(tmp_path, *, generations: int = GENERATIONS, log=None) -> tuple[list[dict], object]:
    config = override(
        preset("smoke"),
        {
            "ddpg.buffer_size": 400,
            "checkpoint.uri": str(tmp_path),
            "checkpoint.keep_last": 1,
            "runtime.generations": generations,
        },
    )
    run = start_run(config, log=log or (lambda line: None))
    run.trainer.run(until=generations)
    return [row for row in rows(run.trainer.run_dir) if row["generation"] >= WARM_FROM], run.trainer


def test_a_healthy_run_is_flat(tmp_path):
    lines = []
    measured, _ = run_trainer(tmp_path, log=lines.append)
    assert all(row["replay_transitions"] == 400 for row in measured)
    assert leak_findings(measured, **BOUNDS) == []
    assert len({row["live_tensors"] for row in measured}) == 1
    assert not [line for line in lines if "memory warning" in line]


# --------------------------------------------------------------------------- injected leaks
# Each fixture-free helper below patches one place of the running trainer the way the replaced system leaked,
# keeping what it leaks in ``kept`` (freed when the test ends).


def leaks_under(tmp_path, monkeypatch, inject) -> list[str]:
    kept: list = []
    inject(monkeypatch, kept)
    measured, _ = run_trainer(tmp_path)
    assert kept, "the injection never ran"
    return leak_findings(measured, **BOUNDS)


def wrap(monkeypatch, owner, name, before=None, after=None):
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        if before is not None:
            before(*args, **kwargs)
        result = original(*args, **kwargs)
        if after is not None:
            after(result, *args, **kwargs)
        return result

    monkeypatch.setattr(owner, name, wrapper)


def test_detector_flags_loss_tensors_kept_with_their_graphs(tmp_path, monkeypatch):
    def inject(mp, kept):
        def keep_loss(result, population, batch, **kwargs):
            kept.append(population.critic(batch.windows, batch.weights, batch.actions).pow(2).mean())

        wrap(mp, trainer_module, "ddpg_update", after=keep_loss)

    assert leaks_under(tmp_path, monkeypatch, inject)


def test_detector_flags_per_step_histories_never_cleared(tmp_path, monkeypatch):
    def inject(mp, kept):
        wrap(mp, VectorPortfolioEnv, "step", after=lambda result, env, actions: kept.append(result[0]))

    assert leaks_under(tmp_path, monkeypatch, inject)


def test_detector_flags_a_new_environment_per_episode(tmp_path, monkeypatch):
    def inject(mp, kept):
        original = trainer_module.collect

        def collect(population, env, start_days, **kwargs):
            fresh = VectorPortfolioEnv(
                env.market,
                num_agents=env.num_agents,
                num_episodes=env.num_episodes,
                episode_days=env.episode_days,
                lookback=env.gatherer.lookback,
                cost_rate=env.cost_rate,
            )
            kept.append(fresh)  # the old environments stay referenced
            return original(population, fresh, start_days, **kwargs)

        mp.setattr(trainer_module, "collect", collect)

    assert leaks_under(tmp_path, monkeypatch, inject)


def test_detector_flags_a_new_population_each_generation(tmp_path, monkeypatch):
    def inject(mp, kept):
        def build(trainer):
            cfg = trainer.config
            kept.append(
                Population(
                    cfg.evolution.popsize,
                    trainer.train_env.gatherer.window_size,
                    encoder_hidden=cfg.model.encoder_hidden,
                    embedding=cfg.model.embedding,
                    head_hidden=cfg.model.head_hidden,
                    actor_lr=cfg.ddpg.actor_lr,
                    critic_lr=cfg.ddpg.critic_lr,
                    exploration=(0.1, 1.0),
                    device="cpu",
                    generator=torch.Generator().manual_seed(0),
                )
            )

        wrap(mp, trainer_module.Trainer, "run_generation", before=build)

    assert leaks_under(tmp_path, monkeypatch, inject)


def test_detector_flags_deepcopy_clones(tmp_path, monkeypatch):
    def inject(mp, kept):
        wrap(
            mp,
            trainer_module,
            "evolve_",
            before=lambda population, plan, **kw: kept.append(copy.deepcopy(population.actor)),
        )

    assert leaks_under(tmp_path, monkeypatch, inject)


def test_detector_flags_a_replaced_best_agent_never_released(tmp_path, monkeypatch):
    # Every comparison with the champion keeps the outgoing best alive, as the replaced system did on replacement.
    def inject(mp, kept):
        wrap(
            mp,
            trainer_module,
            "validate",
            before=lambda population, env, starts: kept.append(copy.deepcopy(population.champion)),
        )

    assert leaks_under(tmp_path, monkeypatch, inject)


def test_detector_flags_an_unbounded_loss_history(tmp_path, monkeypatch):
    # Every update's per-agent losses appended to a history that is never trimmed.
    def inject(mp, kept):
        wrap(mp, trainer_module, "ddpg_update", after=lambda result, *a, **kw: kept.append(result.critic.tolist()))

    assert leaks_under(tmp_path, monkeypatch, inject)


def test_detector_flags_pyplot_figures_never_closed(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    def inject(mp, kept):
        def plot(trainer):
            figure = plt.figure()
            plt.plot([1, 2, 3])
            kept.append(figure.number)  # pyplot's registry holds the figure itself

        wrap(mp, trainer_module.Trainer, "run_generation", before=plot)

    try:
        assert leaks_under(tmp_path, monkeypatch, inject)
    finally:
        plt.close("all")


def test_detector_flags_a_growing_list_of_upload_futures(tmp_path, monkeypatch):
    def inject(mp, kept):
        original_init = trainer_module.Trainer.__init__

        def init(self, *args, **kwargs):
            original_init(self, *args, **kwargs)
            self.on_checkpoint = lambda generation, protect: kept.append(concurrent.futures.Future())

        mp.setattr(trainer_module.Trainer, "__init__", init)

    assert leaks_under(tmp_path, monkeypatch, inject)


def test_detector_flags_per_step_numpy_allocations_kept(tmp_path, monkeypatch):
    # Each step's observation and weights copied to numpy and kept, a list per step, as history-keeping code does.
    def inject(mp, kept):
        def keep(result, env):
            kept.append([result.windows.numpy().copy(), result.weights.numpy().copy()])

        wrap(mp, VectorPortfolioEnv, "observe", after=keep)

    assert leaks_under(tmp_path, monkeypatch, inject)


def test_detector_flags_a_replay_buffer_storing_observation_windows(tmp_path, monkeypatch):
    # The replaced system's real cause: full observation windows stored with every transition.
    def inject(mp, kept):
        def store_windows(buffer, **transition):
            kept.append(buffer.gatherer.gather(transition["days"]).clone())

        wrap(mp, ReplayBuffer, "add", before=store_windows)

    assert leaks_under(tmp_path, monkeypatch, inject)


def test_the_growth_warning_speaks_up_on_a_leak(tmp_path, monkeypatch):
    kept = []
    wrap(monkeypatch, VectorPortfolioEnv, "step", after=lambda result, env, actions: kept.append(result[0]))
    lines = []
    run_trainer(tmp_path, generations=20, log=lines.append)  # past the watch's settling period
    assert any("memory warning" in line and "live_tensors" in line for line in lines)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_allocated_bytes_are_identical_every_generation(tmp_path):
    config = override(
        preset("smoke"),
        {
            "ddpg.buffer_size": 400,
            "checkpoint.uri": str(tmp_path),
            "runtime.generations": GENERATIONS,
            "runtime.device": "cuda",
        },
    )
    run = start_run(config, log=lambda line: None)
    run.trainer.run(until=GENERATIONS)
    measured = [row for row in rows(run.trainer.run_dir) if row["generation"] >= WARM_FROM]
    assert len({row["cuda_allocated_bytes"] for row in measured}) == 1
    assert leak_findings(measured, **BOUNDS) == []
