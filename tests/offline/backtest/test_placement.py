"""Where a backtest's folds run (``offline.backtest.placement``): dealt to a torchrun job's processes the same way on
every start, workers spread over the GPUs, and the folds that run at once checked against their device's memory
together, before anything starts."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from config import override
from offline.backtest import placement
from offline.backtest.plan import plan_folds
from run.sizing import CUDA_CONTEXT_BYTES, RunShape, host_bytes, process_bytes
from runtime.sharding import Ranks
from tests.offline.backtest.builders import backtest_command, refusal, small_config
from utils.errors import ConfigError


def test_folds_are_dealt_to_the_processes_in_turn_the_same_way_every_time(prices):
    folds = plan_folds(small_config(prices), seeds=[0, 1, 2], folds=2)  # 6 folds
    shares = [placement.folds_of(folds, Ranks(rank, 4)) for rank in range(4)]
    assert [[f.name for f in share] for share in shares] == [
        ["fold-2004-seed-0", "fold-2005-seed-1"],
        ["fold-2004-seed-1", "fold-2005-seed-2"],
        ["fold-2004-seed-2"],
        ["fold-2005-seed-0"],
    ]
    assert placement.folds_of(folds, Ranks()) == folds


def test_workers_take_the_gpus_in_turn_or_their_process_s_own(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    cuda = torch.device("cuda")
    assert placement.worker_gpus(cuda, 5, Ranks()) == [0, 1, 2, 0, 1]
    assert placement.worker_gpus(cuda, 2, Ranks(rank=3, world_size=4, local_rank=1)) == [1, 1]  # under torchrun
    assert placement.worker_gpus(torch.device("cpu"), 2, Ranks()) == [None, None]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4, 6,7")
    assert [placement.visible_device(g) for g in (0, 1, None)] == ["4", "6", None]  # as this process names them
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert placement.visible_device(2) == "2"


def _one_run(fold, device: str) -> tuple[int, int]:
    shape = RunShape(fold.num_assets, fold.num_features, device=device, tradable_mask=fold.tradable_mask)
    return sum(process_bytes(fold.config, shape).values()), sum(host_bytes(fold.config, shape).values())


def test_the_folds_at_once_must_fit_together(prices, monkeypatch):
    folds = plan_folds(small_config(prices), seeds=[0], folds=2)
    assert folds[0].num_assets == 5 and folds[0].num_features > 0
    on_device, on_host = _one_run(folds[-1], "cpu")
    monkeypatch.setattr(placement, "available_bytes", lambda device: int(1.5 * (on_device + on_host)))
    cpu = torch.device("cpu")
    placement.check_jobs_fit(folds, device=cpu, gpus=[None], host_runs=1, jobs=1)
    with pytest.raises(ConfigError, match=r"^--jobs 2: 2 folds at once on the CPU need at least .* free; lower --jobs"):
        placement.check_jobs_fit(folds, device=cpu, gpus=[None, None], host_runs=2, jobs=2)

    # On CUDA: each GPU holds its workers' runs, each with a CUDA context of its own; the host their copies.
    on_device, on_host = _one_run(folds[-1], "cuda")
    free = {"cpu": 10 * on_host, "cuda": int(1.5 * (on_device + CUDA_CONTEXT_BYTES))}
    monkeypatch.setattr(placement, "available_bytes", lambda device: free[device.type])
    cuda = torch.device("cuda")
    placement.check_jobs_fit(folds, device=cuda, gpus=[0, 1, 2], host_runs=3, jobs=3)
    with pytest.raises(ConfigError, match=r"^--jobs 3: 2 folds at once on cuda:0 need"):
        placement.check_jobs_fit(folds, device=cuda, gpus=[0, 1, 0], host_runs=3, jobs=3)
    with pytest.raises(ConfigError, match=r"^--jobs 12: 12 folds at once on the host need"):
        placement.check_jobs_fit(folds, device=cuda, gpus=list(range(12)), host_runs=12, jobs=12)


def test_jobs_that_do_not_fit_are_refused_before_anything_is_written(prices, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(placement, "available_bytes", lambda device: 1 << 20)
    err = refusal([*backtest_command(prices, tmp_path / "root"), "--jobs", "2"], capsys)
    assert "--jobs 2: 2 folds at once on the CPU need at least" in err and "lower --jobs" in err
    assert not (tmp_path / "root").exists()


def test_more_threads_than_cores_are_said(monkeypatch):
    monkeypatch.setattr(placement.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert placement.crowding_note(workers=2, threads=1, processes=1) is None
    assert placement.crowding_note(workers=2, threads=2, processes=1) == (
        "note: 2 folds at once x 2 torch threads on 2 cores: they share them (the same figures, each fold slower)"
    )
    note = placement.crowding_note(workers=1, threads=1, processes=3)  # torchrun's processes on this machine
    assert note.startswith("note: 3 folds at once x 1 torch thread on")


def test_torch_threads_are_set_for_the_fold_and_restored():
    before = torch.get_num_threads()
    with placement.torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_a_fold_whose_assets_do_not_all_trade_every_day_is_sized_so(prices, monkeypatch):
    """A fold's plan says whether its market's assets all trade every day: with a fill two days after the decision,
    such a run's buffer also keeps each order as it filled, and the check sizes that fold so."""
    config = override(small_config(prices), {"env.execution_delay": 2})
    fold = plan_folds(config, seeds=[0], folds=1)[0]
    masked = dataclasses.replace(fold, tradable_mask=True)
    whole = sum(_one_run(fold, "cpu"))
    assert sum(_one_run(masked, "cpu")) > whole
    monkeypatch.setattr(placement, "available_bytes", lambda device: whole)
    cpu = torch.device("cpu")
    placement.check_jobs_fit([fold], device=cpu, gpus=[None], host_runs=1, jobs=1)
    with pytest.raises(ConfigError, match="need at least"):
        placement.check_jobs_fit([masked], device=cpu, gpus=[None], host_runs=1, jobs=1)
