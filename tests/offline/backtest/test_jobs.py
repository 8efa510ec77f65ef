"""Folds at once (``backtest --jobs N``, ``offline.backtest.workers``) and over the processes of a torchrun job
(``offline.backtest.spread``) give the fold results, summary and table of one fold at a time, bit for bit. A stop
(SIGTERM, Ctrl-C) stops every worker at a safe point; a second Ctrl-C, at once; a worker that refuses its fold or
dies ends the backtest in one line naming the fold; and each continues with the same command, any --jobs, to the
same results."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

import main
from config import override, preset
from offline.backtest.command import check_backtest
from offline.backtest.plan import plan_folds
from persistence import checkpoint
from tests import hold_points, loopback_only
from tests.hold_points import held_pid, release, wait_until_held, wait_until_stop_seen
from tests.offline.backtest.builders import ROOT
from tests.run_checks import wait_for

pytestmark = pytest.mark.slow  # each test runs a backtest's folds in worker processes

GENERATIONS = 6
FOLDS = ("fold-2004-seed-0", "fold-2005-seed-0")
SETTINGS = {"data.tickers": "", "data.start": "", "data.validation_days": "126", "data.max_assets": "20"}


def command(prices: Path, root: Path, *extra: str) -> list[str]:
    """The smoke preset on the 20-asset market, test years 2004 and 2005, seed 0."""
    settings = [word for key, value in SETTINGS.items() for word in ("--set", f"{key}={value}")]
    return [
        "backtest",
        "--preset",
        "smoke",
        "--data",
        str(prices),
        *settings,
        "--folds",
        "2",
        "--seeds",
        "0",
        "--generations",
        str(GENERATIONS),
        "--checkpoint-uri",
        str(root),
        "--no-progress",
        "--json",
        *extra,
    ]


def report(folder: Path) -> dict[str, bytes]:
    """What a backtest reports: each fold's result file, the summary and its table's figures (summary.csv)."""
    files = {f"folds/{p.name}": p.read_bytes() for p in sorted((folder / "folds").glob("*.json"))}
    return {**files, **{name: (folder / name).read_bytes() for name in ("summary.json", "summary.csv")}}


@pytest.fixture(scope="module")
def one_at_a_time(wide_prices, tmp_path_factory) -> Path:
    """The backtest as ``--jobs 1`` runs it: its folder."""
    root = tmp_path_factory.mktemp("one-at-a-time")
    assert main.main(command(wide_prices, root)) == 0
    return root / "backtest"


def start(prices: Path, root: Path, marks: Path, *extra: str, hold_at: str = "start@2") -> subprocess.Popen:
    """``python main.py backtest`` in a process group of its own (as a terminal runs it), every fold held at
    ``hold_at`` until the test releases it (``tests/hold_points.py``, its markers in ``marks``)."""
    return subprocess.Popen(
        [sys.executable, hold_points.SCRIPT, *command(prices, root, *extra)],
        cwd=ROOT,
        env={**os.environ, **hold_points.environment(marks, hold_at)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_until_every_fold_is_held(process: subprocess.Popen, folder: Path, marks: Path) -> None:
    """Until each fold's run is held (both training at once, neither able to finish), then the test strikes."""
    wait_until_held(process, marks, FOLDS)
    assert not any((folder / "folds" / f"{name}.json").exists() for name in FOLDS)


def group_gone(pgid: int) -> bool:
    """Whether no process of the group is left (the backtest and every worker it started)."""
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                return False
        except (ProcessLookupError, psutil.Error):
            continue
    return True


def test_folds_at_once_give_the_results_of_one_at_a_time(wide_prices, one_at_a_time, tmp_path, capfd):
    capfd.readouterr()
    assert main.main(command(wide_prices, tmp_path, "--jobs", "2", "--verbose")) == 0
    out, err = capfd.readouterr()  # every process's output, the workers' included
    assert report(tmp_path / "backtest") == report(one_at_a_time)
    assert out.count("\n") == 1 and json.loads(out) == json.loads((one_at_a_time / "summary.json").read_text())
    lines = err.splitlines()
    for name in FOLDS:  # --verbose: every generation's line, prefixed by its fold
        assert [line.split("|")[0] for line in lines if line.startswith(f"{name}: gen ")] == [
            f"{name}: gen {g:>4}/{GENERATIONS} " for g in range(1, GENERATIONS + 1)
        ]
        assert sum(line.startswith(f"{name}: champion Sharpe") for line in lines) == 1


def test_a_folds_figures_depend_on_its_threads_so_every_fold_gets_the_same(wide_prices, tmp_path):
    """Why each fold runs with --threads threads, whatever --jobs: on this market two threads give other figures
    than one, so the equality above holds only because every fold, in a worker or not, ran with one."""
    for threads in (1, 2):
        short = [*command(wide_prices, tmp_path, "--threads", str(threads)), "--years", "2005", "--generations", "2"]
        assert main.main([*short, "--name", f"threads-{threads}"]) == 0
    one, two = (report(tmp_path / f"threads-{threads}") for threads in (1, 2))
    assert one.keys() == two.keys() and all(one[name] != two[name] for name in one)


def test_sigterm_stops_every_fold_at_a_safe_point_and_any_jobs_continues(wide_prices, one_at_a_time, tmp_path):
    folder, marks = tmp_path / "backtest", tmp_path / "marks"
    process = start(wide_prices, tmp_path, marks, "--jobs", "2")
    wait_until_every_fold_is_held(process, folder, marks)  # at the start of generation 2
    os.kill(process.pid, signal.SIGTERM)  # the backtest's process alone: it relays the stop
    wait_until_stop_seen(process, marks, FOLDS)  # the relay reached each fold while it was held
    release(marks, FOLDS)  # each stops at its next safe point, by its own logic
    out, err = process.communicate(timeout=300)
    assert process.returncode == 128 + signal.SIGTERM, err
    assert out == ""
    line = err.strip().splitlines()[-1]
    assert line.startswith("stopped by SIGTERM in ") and line.endswith("Run the same command to continue.")
    assert all(name in line for name in FOLDS)
    assert all(checkpoint.latest_generation(folder / name) == 1 for name in FOLDS)  # each kept its last checkpoint
    assert not (folder / "folds").exists()
    wait_for(lambda: group_gone(process.pid), timeout=30)

    assert main.main(command(wide_prices, tmp_path)) == 0  # continued one fold at a time
    assert report(folder) == report(one_at_a_time)


def test_ctrl_c_stops_every_fold_and_a_second_one_stops_at_once(wide_prices, tmp_path):
    folder = tmp_path / "backtest"
    process = start(wide_prices, tmp_path, tmp_path / "first", "--jobs", "2")
    wait_until_every_fold_is_held(process, folder, tmp_path / "first")
    os.killpg(process.pid, signal.SIGINT)  # as a terminal sends Ctrl-C: to every process of the group
    wait_until_stop_seen(process, tmp_path / "first", FOLDS)
    release(tmp_path / "first", FOLDS)
    _, err = process.communicate(timeout=300)
    assert process.returncode == 128 + signal.SIGINT, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("stopped by SIGINT in ") and all(name in line for name in FOLDS)
    assert all(checkpoint.latest_generation(folder / name) == 1 for name in FOLDS)
    wait_for(lambda: group_gone(process.pid), timeout=30)

    # Continued, each fold is held again at the start of generation 2: the first Ctrl-C reaches both, and the second
    # comes while they are still held, never released.
    marks = tmp_path / "second"
    process = start(wide_prices, tmp_path, marks, "--jobs", "2")
    wait_until_every_fold_is_held(process, folder, marks)
    os.killpg(process.pid, signal.SIGINT)
    wait_until_stop_seen(process, marks, FOLDS)  # the backtest took the first one and relayed it
    os.killpg(process.pid, signal.SIGINT)
    process.communicate(timeout=60)
    assert process.returncode == -signal.SIGINT  # not a stop at a safe point: interrupted, workers killed
    wait_for(lambda: group_gone(process.pid), timeout=30)
    assert all(checkpoint.latest_generation(folder / name) == 1 for name in FOLDS)


def test_a_worker_that_dies_ends_the_backtest_naming_its_fold(wide_prices, one_at_a_time, tmp_path):
    folder, marks = tmp_path / "backtest", tmp_path / "marks"
    process = start(wide_prices, tmp_path, marks, "--jobs", "2")
    wait_until_every_fold_is_held(process, folder, marks)
    children = psutil.Process(process.pid).children()
    workers = [p.pid for p in children if "resource_tracker" not in " ".join(p.cmdline())]
    assert len(workers) == 2
    first, second = FOLDS
    assert held_pid(marks, first) in workers
    os.kill(held_pid(marks, first), signal.SIGKILL)  # the worker that trains the first fold
    wait_until_stop_seen(process, marks, [second])  # the other fold is asked to stop while it is held
    release(marks, [second])
    _, err = process.communicate(timeout=300)
    assert process.returncode == 1, err
    assert re.fullmatch(
        r"error: the worker process running fold-2004-seed-0 died \(killed by SIGKILL\); the other running folds "
        r"stopped at a safe point, finished folds and the last checkpoints are kept: run the same command to continue",
        err.strip().splitlines()[-1],
    )
    assert not (folder / "folds").exists()
    assert checkpoint.latest_generation(folder / second) == 1
    wait_for(lambda: group_gone(process.pid), timeout=30)

    assert main.main(command(wide_prices, tmp_path, "--jobs", "2")) == 0
    assert report(folder) == report(one_at_a_time)


def test_a_fold_its_worker_refuses_ends_the_backtest_in_one_line(wide_prices, tmp_path, capsys):
    folder = tmp_path / "backtest"
    config = override(preset("smoke"), {**SETTINGS, "data.path": str(wide_prices), "runtime.generations": GENERATIONS})
    check_backtest(folder, config, plan_folds(config, seeds=[0], folds=2)).begin()  # the backtest's plan.json
    (folder / "fold-2005-seed-0").mkdir()
    (folder / "fold-2005-seed-0" / "config.json").write_text("{")  # a run folder only the fold's run reads
    assert main.main(command(wide_prices, tmp_path, "--jobs", "2")) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: fold-2005-seed-0: {folder / 'fold-2005-seed-0' / 'config.json'}: not a usable run")
    assert not (folder / "folds").exists()


def test_torchrun_spreads_the_folds_over_its_processes_and_the_leader_reports(wide_prices, one_at_a_time, tmp_path):
    if not loopback_only.available():
        pytest.skip("no network namespace can be made here (unshare --net); torchrun's stores listen everywhere")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "main.py"]
    done = subprocess.run(
        loopback_only.command([*torchrun, *command(wide_prices, tmp_path)]),
        cwd=ROOT,
        env={**os.environ, "GLOO_SOCKET_IFNAME": "lo"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert report(tmp_path / "backtest") == report(one_at_a_time)
    assert json.loads(done.stdout) == json.loads((one_at_a_time / "summary.json").read_text())  # the leader's alone
    for name in FOLDS:  # the leader says each fold's line, the other process's too, once
        assert done.stderr.count(f"{name}: champion Sharpe") == 1


def test_the_benchmark_times_the_same_folds_one_at_a_time_and_at_once(capsys):
    from benchmarks import backtest_jobs

    argv = ["--preset", "smoke", "--folds", "1", "--seeds", "0,1", "--generations", "1", "--reference-threads", "0"]
    figures = backtest_jobs.main([*argv, "--json"])
    assert json.loads(capsys.readouterr().out) == figures
    assert [(run["jobs"], run["identical"]) for run in figures["runs"]] == [(1, True), (2, True)]
    one, two = figures["runs"]
    assert two["speedup"] == pytest.approx(one["seconds"] / two["seconds"]) and one["speedup"] == 1
    assert figures["folds"] == 2 and "reference" not in figures
    probe = figures["capacity"]
    assert probe["ratio"] == pytest.approx(2 * probe["alone_s"] / probe["together_s"]) and probe["alone_s"] > 0
