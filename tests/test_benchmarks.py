"""The throughput benchmark measures what it claims: its per-agent reference does the trainer's work, one agent at a
time, and its report has the promised shape. (Speeds are printed by the benchmark, never asserted here.)"""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import checkpoint_blocking, sharded_scaling, throughput, update_roofline
from benchmarks.per_agent import run_episodes, single_sample_view, split_population, update_agents
from config import override, preset
from training.loop import Trainer
from training.setup import load_market


def small_trainer(tmp_path) -> Trainer:
    config = override(preset("smoke"), {"runtime.device": "cpu", "evolution.popsize": 3, "ddpg.buffer_size": 5000})
    return Trainer(config, load_market(config, torch.device("cpu")), tmp_path, log=lambda line: None)


def test_the_reference_loop_earns_what_the_batched_environment_earns(tmp_path):
    trainer = small_trainer(tmp_path)
    starts = trainer.validation.starts
    daily = trainer.validation.run()  # (P + 2, D): agents, champion, EW
    agents = split_population(trainer.population, generator=torch.Generator().manual_seed(0))
    env = trainer.config.env
    totals = run_episodes(
        agents,
        trainer.market,
        trainer.rollouts.env.gatherer,
        [int(day) for day in starts],
        episode_days=trainer.validation.env.episode_days,
        cost_rate=env.cost_rate,
    )
    torch.testing.assert_close(totals.sum(dim=1), daily[:-2].sum(dim=1), rtol=1e-4, atol=1e-5)


def test_the_reference_update_is_the_batched_update_agent_by_agent(tmp_path):
    trainer = small_trainer(tmp_path)
    throughput.fill_buffer(trainer)
    ddpg = trainer.config.ddpg
    agents = split_population(trainer.population, generator=torch.Generator().manual_seed(0))
    view = single_sample_view(trainer.buffer, ddpg.batch_size)
    assert view.storage is trainer.buffer.storage and len(view) == len(trainer.buffer)

    # The same transitions for both: the single agent's batch, drawn again from the same generator state.
    generator = torch.Generator().manual_seed(7)
    state = generator.get_state()
    update_agents(agents[:1], view, 1, generator=generator)
    generator.set_state(state)
    batch = view.sample(generator)
    expanded = type(batch)(*(t.expand(trainer.population.popsize, *t.shape[1:]) for t in batch))
    trainer.population.learner.update(expanded)
    for single, stacked in zip(agents[0].actor.parameters(), trainer.population.actor.parameters()):
        torch.testing.assert_close(single[0], stacked[0], rtol=1e-4, atol=1e-6)


def test_the_report_has_the_promised_shape(capsys):
    throughput.main(
        [
            "--preset",
            "smoke",
            "--populations",
            "2",
            "3",
            "--updates",
            "1",
            "--reference-updates",
            "1",
            "--repeats",
            "1",
            "--efficiency-population",
            "2",
            "--stability-generations",
            "7",
            "--device",
            "cpu",
            "--json",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert [r["population"] for r in report["results"]] == [2, 3]
    for result in report["results"]:
        for key in ("eval_speedup", "update_speedup", "eval_steps_per_s", "reference_eval_steps_per_s"):
            assert result[key] > 0
        eval_ratio = result["eval_steps_per_s"] / result["reference_eval_steps_per_s"]
        assert result["eval_speedup"] == pytest.approx(eval_ratio)
        assert result["update_speedup"] == pytest.approx(result["updates_per_s"] / result["reference_updates_per_s"])
    assert report["matmul_flops"] > 0
    assert set(report["update_efficiency"]) == {"default", "paper"}
    assert all(e["efficiency"] > 0 for e in report["update_efficiency"].values())
    assert len(report["stability"]["steps_per_s"]) == 7 - throughput.WARMUP_GENERATIONS


def test_the_checkpoint_blocking_report_has_the_promised_shape(capsys):
    tiny = ["ddpg.buffer_size=2000", "env.lookback=8", "env.episode_days=16", "model.encoder_hidden=8"]
    checkpoint_blocking.main(["--checkpoints", "2", "--train-s", "0", *(f"--set={s}" for s in tiny), "--json"])
    report = json.loads(capsys.readouterr().out)
    for path in ("synchronous", "staged", "background_write"):
        assert len(report[path]["each_s"]) == 2 and report[path]["max_s"] >= report[path]["median_s"] > 0
    assert report["staging_bytes"] == report["population_bytes"] + report["replay_bytes"]
    assert report["checkpoint_bytes"] > report["staging_bytes"]
    assert len(report["synchronous_written_bytes"]) == len(report["staged_written_bytes"]) == 2
    assert report["median_ratio"] == pytest.approx(report["synchronous"]["median_s"] / report["staged"]["median_s"])


def test_what_evolution_moves_leaves_out_what_nothing_reads_and_a_mates_other_tensors():
    moved = sharded_scaling.moved_per_donor("smoke")
    assert 0 < moved["mate"] < moved["parent"] < moved["every"]
    # With no critic read (the defaults), a parent sends its actor and the actor's two moments: three actors' bytes.
    assert moved["parent"] == 3 * moved["mate"]


def test_the_update_roofline_counts_what_an_update_does(capsys):
    update_roofline.main(["--preset", "smoke", "--set", "runtime.device=cpu", "--updates", "2", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["device"] == "cpu" and report["cuda_graphs"] is False and report["spec_peaks"] is None
    assert report["flop_per_update"] > 0 and report["kernels_per_update"] > 100
    # as launched, every kernel reads and writes its operands: never less than the least an update must move
    assert report["launched_bytes_per_update"] > report["compulsory_bytes_per_update"] > 0
    assert report["flops_per_s"] == pytest.approx(report["flop_per_update"] / report["update_s"])
    assert "TFLOP/s" in update_roofline.report(report)
