"""What a run's loop is made of (``run.parts``), built once from the config and the market."""

from __future__ import annotations

import torch

from config import override, preset
from environment.loading import load_market
from run.parts import build_parts


def smoke(**settings):
    config = override(preset("smoke"), {"runtime.device": "cpu", "learner.buffer_size": 500, **settings})
    return config, load_market(config, torch.device("cpu"))


def test_the_parts_fit_the_config_and_share_the_population_and_the_buffer():
    config, market = smoke()
    parts = build_parts(config, market)
    popsize, episodes = config.evolution.popsize, config.rollout.episodes
    assert parts.population.actor.encoder.mlp.layers[0].weight.shape[:2] == (popsize, config.env.lookback * 6)
    assert parts.buffer.capacity == 500 and parts.buffer.sample_shape == (popsize, config.learner.batch_size)
    assert parts.rollouts.population is parts.validation.population is parts.population
    assert parts.update_phase.learner is parts.population.learner
    assert parts.rollouts.buffer is parts.update_phase.buffer is parts.buffer
    assert parts.rollouts.env.weights.shape == (popsize, episodes, market.num_assets + 1)
    assert parts.validation.env.weights.shape == (popsize + 2, 1, market.num_assets + 1)  # the champion, equal weight
    assert parts.gate is not None and not parts.rollouts.graphed.enabled  # CUDA graphs are for CUDA


def test_a_run_selected_by_bonferroni_has_no_gate_and_graphs_are_for_one_process_on_cuda(cuda):
    config, market = smoke(**{"selection.method": "bonferroni", "runtime.cuda_graphs": True})
    assert build_parts(config, market).gate is None
    on_cuda = override(config, {"runtime.device": "cuda"})
    parts = build_parts(on_cuda, load_market(on_cuda, torch.device("cuda")))
    assert parts.rollouts.graphed.enabled and parts.validation.graphed.enabled
    assert all(step.enabled for step in parts.update_phase.graphed.values())
