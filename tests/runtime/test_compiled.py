"""``runtime.torch_compile`` (``runtime.compiled``): the compiled learner computes the eager one's numbers to a stated
tolerance; a compiled run has no graph break, compiles nothing after its first generations (the buffer filling,
evolution's copies, the frozen elites' scale and a resume change no shape), resumes bit for bit, reports its compile
time once and finds its kernels in the disk cache after a restart.

Compiling on the CPU takes tens of seconds, so these few tests share one kernel cache (``TORCHINDUCTOR_CACHE_DIR``).
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

from config import LearnerConfig, ModelConfig, override, preset
from models.learner import Learner
from models.replay import ReplayBatch
from run.launch import resume_run, start_run
from runtime.compiled import Compilation
from tests.run_checks import state_digest
from tests.synthetic import replay_batch

pytestmark = pytest.mark.slow  # torch.compile on the CPU takes tens of seconds a function

P, B, N, WINDOW = 3, 8, 3, 6


@pytest.fixture(autouse=True)
def kernel_cache(tmp_path_factory, monkeypatch):
    """One compiled-kernel cache for these tests, and a fresh compiler state (as a new process has) for each."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "kernel-cache"))
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _learner(dtype: torch.dtype) -> Learner:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        settings = LearnerConfig(
            algorithm="td3", gamma=0.9, actor_objective="critic", policy_delay=2, max_grad_norm=0.5
        )
        return Learner(
            P,
            WINDOW,
            ModelConfig(encoder_hidden=8, embedding=4, head_hidden=8),
            settings,
            device="cpu",
            cost_rate=0.001,
            generator=torch.Generator().manual_seed(0),
            noise_generator=torch.Generator().manual_seed(1),
        )
    finally:
        torch.set_default_dtype(previous)


def _batch(dtype: torch.dtype, seed: int) -> ReplayBatch:
    return replay_batch(P, B, N, WINDOW, seed=seed, dtype=dtype)


@pytest.mark.parametrize(
    ("dtype", "tolerance"), [(torch.float64, 1e-10), (torch.float32, 1e-5)], ids=["float64", "float32"]
)
def test_the_compiled_learner_computes_the_eager_learners_numbers_within_tolerance(dtype, tolerance, tmp_path):
    """TD3 with every part read (twin critics, smoothing, the targets, a delayed actor step, the clip): four updates
    compiled and eager from the same state and draws, every tensor the same to float64's or float32's rounding."""
    eager, fused = _learner(dtype), _learner(dtype)
    Compilation(enabled=True, cache=tmp_path).learner_(fused)
    for index in range(4):
        batch = _batch(dtype, seed=index)
        actor_step = eager.takes_actor_step(index)
        expected, got = eager.update(batch, actor_step=actor_step), fused.update(batch, actor_step=actor_step)
        assert expected.keys() == got.keys()
        for name in expected:
            torch.testing.assert_close(got[name], expected[name], rtol=tolerance, atol=tolerance)
    for key, tensor in eager.agent_tensors().items():
        assert tensor.dtype == dtype
        torch.testing.assert_close(fused.agent_tensors()[key], tensor, rtol=tolerance, atol=tolerance, msg=key)


def paused_market(path):
    """A long file whose tickers list late, pause for 20 days and delist: days the mask closes."""
    import numpy as np
    import pandas as pd

    days, rng = 900, np.random.default_rng(0)
    dates = pd.bdate_range("2001-01-01", periods=days).strftime("%Y-%m-%d")
    rows = []
    for ticker, dead in zip("ABCD", (range(0), range(0, 200), range(500, 520), range(800, days))):
        price = 30.0 * np.exp(np.cumsum(rng.normal(0.0003, 0.012, days)))
        rows += [(dates[d], ticker, price[d]) for d in range(days) if d not in dead]
    pd.DataFrame(rows, columns=["date", "ticker", "close"]).to_csv(path, index=False)
    return str(path)


@pytest.mark.parametrize("market", ["bundled", "paused", "long_short"])
def test_a_compiled_day_trades_the_eager_days_numbers_within_tolerance(market, tmp_path):
    """The rollout's and validation's whole day (decision, softmax, trade, reward, the buffer's and the histories'
    writes) compiled as one function: from the same state and draws, every reward, weight and stored transition of
    a generation's days equals the eager day's to float32's rounding, on a market whose assets all trade and on one
    whose mask closes days, and for a long-short book at a cadence of 3 days."""
    from environment.loading import load_market
    from run.trainer import Trainer

    settings = {"runtime.device": "cpu", "learner.buffer_size": 400}
    if market == "paused":
        settings.update({"data.path": paused_market(tmp_path / "paused.csv"), "data.max_fill_days": 5})
    if market == "long_short":
        settings.update({"env.book": "long_short", "env.rebalance_every": 3})
    config = override(preset("smoke"), settings)
    loaded = load_market(config, torch.device("cpu"))
    assert (loaded.tradable is not None and not bool(loaded.tradable.all())) == (market == "paused")
    eager = Trainer(config, loaded, tmp_path / "eager", log=lambda line: None)
    fused = Trainer(config, loaded, tmp_path / "fused", log=lambda line: None)
    compilation = Compilation(enabled=True, cache=tmp_path)
    for phase in (fused.rollouts, fused.validation):
        compilation.day_(phase)
    assert fused.rollouts.day is not eager.rollouts.day and fused.validation.day is not eager.validation.day
    starts = eager.rollouts.sample_starts()
    for trainer in (eager, fused):
        trainer.rollouts.run(starts)
    torch.testing.assert_close(fused.rollouts.env.rewards_per_episode, eager.rollouts.env.rewards_per_episode)
    torch.testing.assert_close(fused.rollouts.env.weights, eager.rollouts.env.weights)
    for key, stored in eager.buffer.storage.items():
        torch.testing.assert_close(fused.buffer.storage[key], stored, msg=key)
    assert eager.buffer.storage["rewards"].abs().sum() > 0  # the days were traded and stored
    torch.testing.assert_close(fused.validation.run(), eager.validation.run())


def smoke(root, generations: int):
    return override(
        preset("smoke"),
        {
            "runtime.torch_compile": True,
            "runtime.generations": generations,
            "runtime.progress": False,
            "checkpoint.uri": str(root),
            "checkpoint.run_name": "r",
            "learner.learning_starts": 200,  # the first update in generation 2 (168 transitions a generation)
            "learner.buffer_size": 400,  # full in generation 3
        },
    )


def test_a_compiled_run_breaks_no_graph_recompiles_nothing_and_resumes_bit_for_bit(tmp_path, monkeypatch):
    from torch._dynamo.utils import counters

    lines: list[str] = []
    whole = start_run(smoke(tmp_path / "whole", 5), log=lines.append).trainer
    whole.run(until=2)  # the days compile in generation 1, the update in generation 2
    monkeypatch.setattr(torch._dynamo.config, "error_on_recompile", True)
    whole.run(until=5)  # the buffer fills, evolution copies, the elites' scale changes: no recompilation
    assert not counters["graph_break"]
    reports = [line for line in lines if line.startswith("torch.compile:")]
    assert len(reports) == 2, lines  # reported after the generations that compiled, once each
    assert all(line.endswith(f"(kernels cached in {whole.compilation.cache})") for line in reports)

    start_run(smoke(tmp_path / "parts", 2), log=lambda line: None).trainer.run(until=2)
    monkeypatch.setattr(torch._dynamo.config, "error_on_recompile", False)
    torch._dynamo.reset()  # a new process: nothing compiled in memory, the kernels on disk
    hits = counters["inductor"]["fxgraph_cache_hit"]
    resumed = resume_run(smoke(tmp_path / "parts", 5), {"runtime.generations": 5}, log=lambda line: None).trainer
    resumed.run(until=3)
    assert counters["inductor"]["fxgraph_cache_hit"] > hits  # loaded from the cache a restart finds
    monkeypatch.setattr(torch._dynamo.config, "error_on_recompile", True)
    resumed.run(until=5)
    assert state_digest(resumed.run_dir) == state_digest(whole.run_dir)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_a_compiled_graphed_run_trains_the_eager_numbers_and_resumes_bit_for_bit(tmp_path):
    """Compiled kernels replayed in CUDA graphs: the eager run's numbers to float tolerance after one generation, and
    N + resume + M generations equal to N + M, bit for bit. GPU only: torch.compile refuses to trace under a
    non-infrastructure dispatch mode, which the emulated device is; what the emulated device can check of it, that
    nothing compiles inside a capture after a recapture, ``tests/runtime/test_graphs.py`` checks."""
    cuda = {"runtime.device": "cuda", "runtime.cuda_graphs": True}
    eager = start_run(override(smoke(tmp_path / "eager", 1), {**cuda, "runtime.torch_compile": False})).trainer
    eager.run(until=1)
    fused = start_run(override(smoke(tmp_path / "fused", 1), cuda)).trainer
    fused.run(until=1)
    for key, tensor in eager.population.state_tensors().items():
        torch.testing.assert_close(fused.population.state_tensors()[key], tensor, rtol=1e-4, atol=1e-6, msg=key)
    whole = start_run(override(smoke(tmp_path / "whole", 4), cuda)).trainer
    whole.run(until=4)
    start_run(override(smoke(tmp_path / "parts", 2), cuda)).trainer.run(until=2)
    torch._dynamo.reset()
    resumed = resume_run(override(smoke(tmp_path / "parts", 4), cuda), {"runtime.generations": 4}).trainer
    resumed.run(until=4)
    assert state_digest(resumed.run_dir) == state_digest(whole.run_dir)
