"""The throughput benchmark measures what it claims: its per-agent reference does the trainer's work, one agent at a
time, and its report has the promised shape. (Speeds are printed by the benchmark, never asserted here.)"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch.utils._pytree import tree_map

from benchmarks import checkpoint_blocking, generation_floor, sharded_scaling, throughput, update_roofline
from benchmarks.per_agent import run_episodes, single_sample_view, split_population, update_agents
from benchmarks.selection_designs import Design, Resampled, replay
from config import override, preset
from environment.loading import load_market
from run.trainer import Trainer
from training.selection import SequentialGate, choose_champion, edge_bounds

pytestmark = pytest.mark.slow  # each test runs a benchmark script's measurement, small


def small_trainer(tmp_path) -> Trainer:
    config = override(preset("smoke"), {"runtime.device": "cpu", "evolution.popsize": 3, "learner.buffer_size": 5000})
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
        execution_delay=env.execution_delay,
    )
    torch.testing.assert_close(totals.sum(dim=1), daily[:-2].sum(dim=1), rtol=1e-4, atol=1e-5)


def test_the_reference_update_is_the_batched_update_agent_by_agent(tmp_path):
    trainer = small_trainer(tmp_path)
    throughput.fill_buffer(trainer)
    settings = trainer.config.learner
    agents = split_population(trainer.population, generator=torch.Generator().manual_seed(0))
    view = single_sample_view(trainer.buffer, settings.batch_size)
    assert view.storage is trainer.buffer.storage and len(view) == len(trainer.buffer)

    # The same transitions for both: the single agent's batch, drawn again from the same generator state.
    generator = torch.Generator().manual_seed(7)
    state = generator.get_state()
    update_agents(agents[:1], view, 1, generator=generator)
    generator.set_state(state)
    batch = view.sample(generator)
    popsize = trainer.population.popsize
    expanded = tree_map(lambda t: t.expand(popsize, *t.shape[1:]) if torch.is_tensor(t) else t, batch)
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
    tiny = ["learner.buffer_size=2000", "env.lookback=8", "env.episode_days=16", "model.encoder_hidden=8"]
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
    argv = ["--preset", "smoke", "--set", "runtime.device=cpu", "--updates", "2", "--json", "--check-profiler"]
    update_roofline.main(argv)
    report = json.loads(capsys.readouterr().out)
    assert report["device"] == "cpu" and report["cuda_graphs"] is False and report["spec_peaks"] is None
    assert report["flop_per_update"] > 0 and report["kernels_per_update"] > 100
    # as launched, every kernel reads and writes its operands: never less than the least an update must move
    assert report["launched_bytes_per_update"] > report["compulsory_bytes_per_update"] > 0
    assert report["flops_per_s"] == pytest.approx(report["flop_per_update"] / report["update_s"])
    check = report["profiler_check"]
    assert check["dispatched"] == report["kernels_per_update"] and "CPU" in check["profiled_kind"]
    assert "TFLOP/s" in update_roofline.report(report) and "profiler:" in update_roofline.report(report)


# ------------------------------------------------------------------ what the roofline counts as a kernel and its bytes

FLOAT, LONG = 4, 8
SOURCE_ROWS, ROW = 1000, 8  # a (1000, 8) float32 source: a row is 32 bytes


def test_a_chain_of_views_launches_no_kernel_and_moves_no_byte():
    x = torch.randn(6, 4)
    chained = lambda: x.view(4, 6).t().unsqueeze(0).expand(3, 6, 4)[:, 1:].select(0, 1).reshape(5, 4).detach()  # noqa: E731
    aliases = lambda: torch.ops.aten._unsafe_view(torch.ops.aten.alias(x), (24,))  # noqa: E731
    views = update_roofline.count_kernels(lambda: (chained(), aliases()))
    assert views.kernels == 0 and views.bytes == 0
    allocations = update_roofline.count_kernels(lambda: (torch.empty(1000), torch.empty_like(x), x.new_empty(9)))
    assert allocations.kernels == 0 and allocations.bytes == 0  # memory handed out, nothing run


@pytest.mark.parametrize(
    ("gather", "index_bytes"),
    [
        (lambda source, index: source[index], 10 * LONG),
        (lambda source, index: source.index_select(0, index), 10 * LONG),
        (lambda source, index: torch.nn.functional.embedding(index, source), 10 * LONG),
        (lambda source, index: torch.index_select(source, 0, index, out=torch.empty(10, ROW)), 10 * LONG),
        (lambda source, index: source.gather(0, index[:, None].expand(10, ROW)), 10 * LONG),  # a broadcast index
    ],
    ids=["x[index]", "index_select", "embedding", "index_select(out=)", "gather"],
)
def test_a_gather_reads_the_rows_it_gathers_not_its_whole_source(gather, index_bytes):
    source, index = torch.randn(SOURCE_ROWS, ROW), torch.randint(SOURCE_ROWS, (10,))
    counted = update_roofline.count_kernels(lambda: gather(source, index))
    rows = 10 * ROW * FLOAT
    assert counted.kernels == 1
    assert counted.bytes == rows + rows + index_bytes  # the rows read, the rows written, the index


def test_an_in_place_operation_counts_once_even_on_a_view():
    x, y = torch.randn(100, 8), torch.randn(100, 4)
    half = 100 * 4 * FLOAT
    added = update_roofline.count_kernels(lambda: x[:, :4].add_(y))  # a view, then one kernel on it
    assert added.operations == {"aten.add_.Tensor": 1}
    assert added.bytes == half + half + half  # the view read and written (the same memory, written once), y read
    copied = update_roofline.count_kernels(lambda: x[:, 4:].copy_(y))
    assert copied.kernels == 1 and copied.bytes == 2 * half  # a copy writes its destination without reading it
    squared = update_roofline.count_kernels(lambda: y.mul(y))
    assert squared.bytes == 2 * half  # the same operand twice is read once


def test_an_in_place_scatter_touches_only_the_rows_it_writes():
    target, rows, index = torch.zeros(SOURCE_ROWS, ROW), torch.randn(10, ROW), torch.randperm(SOURCE_ROWS)[:10]
    written = 10 * ROW * FLOAT
    copied = update_roofline.count_kernels(lambda: target.index_copy_(0, index, rows))
    assert copied.kernels == 1 and copied.bytes == written + written + 10 * LONG  # rows read, written, the index
    added = update_roofline.count_kernels(lambda: target.index_add_(0, index, rows))
    assert added.bytes == written + 2 * written + 10 * LONG  # accumulating: the target's rows read too
    put = update_roofline.count_kernels(lambda: target.index_put_((index,), rows))
    assert put.bytes == written + written + 10 * LONG


def test_the_cpu_profiler_counts_the_kernels_the_dispatch_mode_counts_on_an_update(tmp_path):
    """The proxy on the CPU: the aten operations torch.profiler records that launch work, against the dispatch mode's
    count of the same update, within 2% (on a GPU the check counts the CUDA kernels: gpu_smoke's roofline)."""
    trainer = small_trainer(tmp_path)
    throughput.fill_buffer(trainer)
    check = update_roofline.profiler_check(trainer.update_phase.update, torch.device("cpu"))
    assert check["dispatched"] > 100
    assert check["ratio"] == pytest.approx(1.0, abs=0.02), check


@pytest.mark.parametrize("early_fraction", [None, 0.2])
def test_the_selection_study_replays_the_trainers_gate(early_fraction):
    """``benchmarks/selection_study.py`` judges designs offline from bootstrap counts instead of gathered resamples:
    on the same excess returns and resamples its replay gives the trainer's critical values look by look and crowns
    the agent the trainer's rule (``choose_champion`` by return, above the margin) crowns."""
    generations, popsize, days, margin = 8, 5, 150, 0.01
    g = torch.Generator().manual_seed(0)
    drift = 0.003 * torch.arange(1, generations + 1, dtype=torch.float64)[:, None, None] / generations
    excess = drift + 0.01 * torch.randn(generations, popsize, days, generator=g, dtype=torch.float64)  # (G, P, D)
    gate = SequentialGate(
        days,
        alpha=0.05,
        draws=400,
        mean_block=1.0,
        half_spent_at=10,
        generator=torch.Generator().manual_seed(1),
        early_fraction=early_fraction,
    )
    counts = gate.counts.to(torch.int32)  # (B, D)
    design = Design("trainer", margin=margin) if early_fraction is None else Design("final", spend="split", first=0.2)
    design = replace(design, margin=margin)
    zeros = np.zeros((generations, popsize))
    outcome = replay(design, Resampled(excess.numpy(), counts), fitness=zeros, blocks=zeros, costs=zeros)

    criticals, champion, champion_total, crowned = [], None, 0.0, 0
    for generation in range(generations):
        look = gate.look(excess[generation], generation + 1, last=generation == generations - 1, margin=margin / 252)
        criticals.append(look.critical)
        baseline = torch.zeros(days, dtype=torch.float64)
        bounds = edge_bounds(excess[generation], baseline, z=look.critical)
        choice = choose_champion(bounds, 0.0, excess[generation].sum(1), champion_total, margin=margin)
        if choice is not None:
            champion, champion_total, crowned = (
                (generation, choice),
                float(excess[generation, choice].sum()),
                generation + 1,
            )
    assert outcome.criticals == pytest.approx(criticals, rel=1e-9)
    assert (outcome.crowned, outcome.generation) == (champion, crowned) and crowned > 0


def test_the_power_benchmarks_backtests_test_whole_years_with_the_commands_flags():
    """``benchmarks/backtest_power.py``'s markets end on a year's last business day (so --folds 12 tests 12 whole
    years), and its arguments are the backtest command's, SMALL's settings among them."""
    from argparse import Namespace
    from pathlib import Path

    import pandas as pd

    from benchmarks import backtest_power
    from offline.backtest.command import _parser

    days = pd.bdate_range(backtest_power.START, periods=backtest_power.market_days(17))
    assert days[-1] == pd.Timestamp("2016-12-30") and days[0] == pd.Timestamp("2000-01-03")
    settings = Namespace(set=["learner.actor_lr=1e-4"], generations=15, folds=12, run_seeds="0,1", jobs=2)
    parsed = _parser().parse_args(backtest_power.backtest_args(Path("prices.csv"), Path("out"), settings))
    assert (parsed.generations, parsed.folds, parsed.seeds, parsed.jobs) == (15, 12, "0,1", 2)
    assert "evolution.popsize=8" in parsed.set and "data.tickers=" in parsed.set
    assert [s for s in parsed.set if s.startswith("learner.actor_lr=")] == ["learner.actor_lr=1e-4"]  # --set wins


@pytest.mark.parametrize("planted", [True, False], ids=["planted", "noise"])
def test_the_announced_market_pays_whoever_reads_its_column_at_the_runs_delay(tmp_path, planted):
    """The user-feature benchmark's market: its ``news`` column is a feature of the run, and the rule that holds the
    announced asset earns the planted strength (less its costs) at the run's delay, or nothing when it is noise."""
    from benchmarks.learning import SMALL_MARKET, rule_log_returns, small_config
    from benchmarks.user_feature import STRENGTH, announced_market

    config = small_config(1, **{"data.features": "builtin,news"})
    delay, cost = config.env.execution_delay, config.env.cost_rate
    assert delay == 1  # the default: an announcement at one close is traded at the next
    frame, rule = announced_market(seed=3, execution_delay=delay, planted=planted, **SMALL_MARKET)
    path = tmp_path / "announced.csv"
    frame.to_csv(path, index=False)
    market = load_market(override(config, {"data.path": str(path)}), torch.device("cpu"))
    assert market.feature_names[-1] == "news" and market.num_assets == SMALL_MARKET["num_assets"]
    equal = np.zeros_like(rule)
    equal[:, 1:] = 1.0 / market.num_assets
    days = range(delay + 2, market.num_days)
    excess = rule_log_returns(market, rule, days, cost, execution_delay=delay) - rule_log_returns(
        market, equal, days, cost, execution_delay=delay
    )
    planted_edge = STRENGTH * (1 - 1 / market.num_assets)  # the announced asset over the average of all
    if planted:
        assert excess.mean() > 0.5 * planted_edge
    else:
        assert excess.mean() < 0.1 * planted_edge  # a random asset a day, paying a full turnover's costs


@pytest.mark.parametrize("planted", [True, False], ids=["planted", "noise"])
def test_the_warned_market_pays_a_short_of_its_marks_more_than_staying_out_at_the_runs_delay(tmp_path, planted):
    """The long-short benchmark's market: at the run's delay the long-short rule (shorting the marked assets) earns more
    than the long-only rule (staying out of them), which earns more than equal weight; at the costly arm's borrow the
    short costs more than it earns, and when the marks are noise neither rule has an edge to pay its trades with."""
    from benchmarks.learning import SMALL_MARKET, rule_log_returns, small_config
    from benchmarks.long_short import ARMS, COSTLY_BORROW, MARKED, STRENGTH, warned_market
    from environment.book import TRADING_DAYS, Book

    config = small_config(1, **{"data.features": "builtin,warn"})
    delay, cost = config.env.execution_delay, config.env.cost_rate
    frame, rules = warned_market(seed=3, execution_delay=delay, planted=planted, **SMALL_MARKET)
    path = tmp_path / "warned.csv"
    frame.to_csv(path, index=False)
    market = load_market(override(config, {"data.path": str(path)}), torch.device("cpu"))
    assert market.feature_names[-1] == "warn" and market.num_assets == SMALL_MARKET["num_assets"]
    equal = np.zeros_like(rules["long_only"])
    equal[:, 1:] = 1.0 / market.num_assets
    days = range(delay + 2, market.num_days)
    baseline = rule_log_returns(market, equal, days, cost, execution_delay=delay)

    def excess(kind: str, arm: str) -> float:
        book = Book.from_env(override(config, ARMS[arm]).env)
        earned = rule_log_returns(market, rules[kind], days, cost, execution_delay=delay, book=book)
        return float((earned - baseline).mean())

    long_only, long_short = excess("long_only", "long_only"), excess("long_short", "long_short")
    planted_edge = STRENGTH * MARKED / (market.num_assets - MARKED)  # what the unmarked gain, equal weight nothing
    if planted:
        noise, _ = warned_market(seed=3, execution_delay=delay, planted=False, **SMALL_MARKET)
        noise.to_csv(path, index=False)
        unmoved = load_market(override(config, {"data.path": str(path)}), torch.device("cpu"))
        unplanted = rule_log_returns(unmoved, equal, days, cost, execution_delay=delay)
        assert abs((baseline - unplanted).mean()) < 0.05 * planted_edge  # the marks leave the market's mean as it was
        assert long_short > long_only > 0.5 * planted_edge
        assert COSTLY_BORROW / TRADING_DAYS > STRENGTH  # a day's borrow costs more than the fall it is paid
        assert excess("long_short", "long_short_costly") < long_only
    else:
        assert long_only < 0.1 * planted_edge and long_short < 0.1 * planted_edge  # a turnover a day, nothing to earn


def test_the_power_benchmarks_null_series_take_a_longer_block_when_asked():
    """``--null-block-scale`` tests the same simulated series with the chosen block length times the scale, and the
    figures say which scale they were measured at."""
    from benchmarks import backtest_power

    chosen = backtest_power.null_size("AR(1) 0.3", 3, alpha=0.05, draws=50)
    doubled = backtest_power.null_size("AR(1) 0.3", 3, alpha=0.05, draws=50, block_scale=2.0)
    assert chosen["mean_block"] > 1.0
    assert doubled["mean_block"] == pytest.approx(2.0 * chosen["mean_block"])
    assert (chosen["block_scale"], doubled["block_scale"]) == (1.0, 2.0)
    assert "block x2" in backtest_power.report([], [doubled]) and "block x" not in backtest_power.report([], [chosen])


def test_the_generation_floor_counts_every_phase_and_takes_the_largest_floor(capsys):
    """``benchmarks/generation_floor.py`` on the smoke preset: the days are simulated with kernels, validation's per
    day are over the validation range's days, each floor is the largest of its launch, bandwidth and compute parts,
    and the phases are timed on generations that captured no graph (none on the CPU)."""
    argv = ["--preset", "smoke", "--set", "runtime.device=cpu", "--warmup", "1", "--generations", "2", "--json"]
    generation_floor.main(argv)
    report = json.loads(capsys.readouterr().out)
    phases = {phase["phase"]: phase for phase in report["phases"]}
    assert list(phases) == ["rollout", "validation", "gate", "evolution", "update", "generation"]
    assert phases["rollout"]["kernels"] > 0 and phases["validation"]["kernels"] > 0
    config = preset("smoke")
    validation_days = len(load_market(config, torch.device("cpu")).splits.validation)
    assert (phases["rollout"]["days"], phases["validation"]["days"]) == (config.env.episode_days, validation_days)
    validation = phases["validation"]
    assert validation["kernels_per_day"] == validation["kernels"] / validation_days
    for phase in phases.values():
        parts = (phase["launch_floor_s"], phase["bandwidth_floor_s"], phase["compute_floor_s"])
        assert phase["floor_s"] == max(parts) > 0
        assert phase["measured_over_floor"] == pytest.approx(phase["measured_s"] / phase["floor_s"])
    assert report["timed"] == 2 and report["card"]["card"] == "H100 80GB HBM3"
    assert "| validation |" in generation_floor.report(report)
