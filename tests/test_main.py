"""The command line as a user meets it: bad input is one line on stderr, exit status 2, nothing written."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_cli(*args: str, cwd: Path, temp: Path | None = None) -> subprocess.CompletedProcess:
    """``main.py ARGS`` in ``cwd``; ``temp``: the temporary directory it is given (``TMPDIR``)."""
    env = os.environ if temp is None else {**os.environ, "TMPDIR": str(temp)}
    return subprocess.run(
        [sys.executable, str(REPO / "main.py"), *args, "--no-progress"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def assert_one_line_error(result: subprocess.CompletedProcess, *phrases: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.stderr
    for phrase in phrases:
        assert phrase in lines[0]


@pytest.mark.parametrize(
    ("args", "phrases"),
    [
        (["--set", "learner.tauu=0.1"], ["learner.tauu"]),
        (["--set", "nosuch.key=1"], ["nosuch.key"]),
        (["--set", "learner.tau=fast"], ["learner.tau", "float", "'fast'"]),
        (["--set", "evolution.popsize=2.5"], ["evolution.popsize", "int"]),
        (["--set", "evolution.fitness=best"], ["evolution.fitness", "mean_log_return"]),
        (["--set", "learner.tau"], ["dotted.key=value"]),
        (["--set", "evolution.elites=99"], ["evolution.elites"]),
        (["--preset", "huge"], ["huge", "smoke"]),
        (["--bogus-flag"], ["--bogus-flag"]),
        (["--generations", "many"], ["--generations"]),
        (["--seed", "-1"], ["runtime.seed"]),
        (["--set", "runtime.seed=-5"], ["runtime.seed"]),
        (["--population", "4", "--set", "evolution.popsize=8"], ["--population 4", "evolution.popsize=8"]),
        (["--seed", "1", "--set", "runtime.seed=2"], ["--seed 1", "runtime.seed=2"]),
        (["--no-progress", "--set", "runtime.progress=true"], ["--no-progress", "runtime.progress"]),
        *[
            (["--run-name", name], ["checkpoint.run_name", "plain folder name"])
            for name in ["../escaped", "..", ".", "a/b", "a\\b", "c:x", "{outside}", ".hidden", "a b"]
        ],
        (["--set", "checkpoint.run_name=../escaped"], ["checkpoint.run_name"]),
        (["--set", "checkpoint.every=0"], ["checkpoint.every", ">= 1"]),
        (["--resume", "--run-name", "../escaped"], ["checkpoint.run_name"]),
        (["--set", "learner.buffer_size=100000000000000"], ["needs at least", "replay buffer", "learner.buffer_size"]),
        (["--population", "100000000000"], ["needs at least", "evolution.popsize"]),
        (["--set", "model.encoder_hidden=1000000000"], ["needs at least", "model.encoder_hidden"]),
        (["--set", "rollout.episodes=100000000000"], ["needs at least", "rollout.episodes"]),
        (["--set", "learner.batch_size=10000000000"], ["needs at least", "learner.batch_size"]),
    ],
)
@pytest.mark.slow
def test_bad_config_is_one_line_and_writes_nothing(tmp_path, args, phrases):
    work, temp = tmp_path / "work", tmp_path / "temp"  # nothing anywhere: the temporary directory included
    work.mkdir(), temp.mkdir()
    args = [arg.format(outside=work / "outside") for arg in args]
    result = run_cli(*args, cwd=work, temp=temp)
    assert_one_line_error(result, *phrases)
    assert list(work.iterdir()) == [] and list(temp.iterdir()) == []


@pytest.mark.parametrize(
    ("content", "phrases"),
    [
        ("Date,AAA,BBB\n2020-01-02,1,2\nnot-a-date,1,2\n", ["not-a-date"]),
        ("Date,AAA,BBB\n2020-01-02,1,2\n2020-01-03,abc,2\n", ["AAA", "abc"]),
        ("Date,AAA,BBB\n2020-01-02,1,2\n2020-01-03,-1,2\n", ["AAA", "2020-01-03"]),
        ("Date,AAA\n2020-01-02,1\n2020-01-02,2\n", ["2020-01-02"]),
        ("", ["prices.csv"]),
    ],
)
@pytest.mark.slow
def test_malformed_data_file_is_one_line_and_writes_nothing(tmp_path, content, phrases):
    (tmp_path / "prices.csv").write_text(content)
    result = run_cli("--data", str(tmp_path / "prices.csv"), "--checkpoint-uri", str(tmp_path / "runs"), cwd=tmp_path)
    assert_one_line_error(result, *phrases)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prices.csv"]


@pytest.mark.slow
@pytest.mark.parametrize("uri", ["a-file", "a-file/runs"])
def test_a_checkpoint_location_that_is_a_file(tmp_path, uri):
    (tmp_path / "a-file").write_text("not a folder")
    for resume in ([], ["--resume"]):
        result = run_cli("--checkpoint-uri", str(tmp_path / uri), *resume, cwd=tmp_path)
        assert_one_line_error(result, "a-file is a file, not a folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
    assert (tmp_path / "a-file").read_text() == "not a folder"


@pytest.mark.parametrize(
    ("name", "make", "phrases"),
    [
        ("prices.csv", lambda p: p.write_text("Date;AAA\n2020-01-02;1\n"), ["semicolons", "comma-separated"]),
        ("prices.csv", lambda p: p.write_text("Date\tAAA\n2020-01-02\t1\n"), ["tabs", "comma-separated"]),
        ("prices.csv", lambda p: p.write_text("Date,AAA,AAA\n2020-01-02,1,2\n"), ["'AAA'", "one price column"]),
        ("prices.csv", lambda p: p.mkdir(), ["is a folder", "file itself"]),
    ],
)
@pytest.mark.slow
def test_data_mistakes_say_what_to_do(tmp_path, name, make, phrases):
    make(tmp_path / name)
    result = run_cli("--data", str(tmp_path / name), "--checkpoint-uri", str(tmp_path / "runs"), cwd=tmp_path)
    assert_one_line_error(result, *phrases)
    assert [p.name for p in tmp_path.iterdir()] == [name]


def test_missing_data_file(tmp_path):
    result = run_cli("--data", str(tmp_path / "nope.csv"), cwd=tmp_path)
    assert_one_line_error(result, "nope.csv")
    assert list(tmp_path.iterdir()) == []


def test_resume_with_nothing_to_resume_is_an_error_not_a_fresh_start(tmp_path):
    result = run_cli("--resume", "--checkpoint-uri", str(tmp_path / "runs"), cwd=tmp_path)
    assert_one_line_error(result, "nothing to resume")
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_resume_refuses_to_change_the_run_settings(tmp_path):
    runs = str(tmp_path / "runs")
    first = run_cli(
        "--preset", "smoke", "--generations", "1", "--checkpoint-uri", runs, "--run-name", "r", cwd=tmp_path
    )
    assert first.returncode == 0, first.stderr
    before = sorted(p.name for p in (tmp_path / "runs" / "r").iterdir())
    result = run_cli("--resume", "--checkpoint-uri", runs, "--set", "env.lookback=5", cwd=tmp_path)
    assert_one_line_error(result, "env.lookback")
    assert sorted(p.name for p in (tmp_path / "runs" / "r").iterdir()) == before


@pytest.mark.slow
def test_starting_over_an_existing_run_is_refused(tmp_path):
    runs = str(tmp_path / "runs")
    args = ("--preset", "smoke", "--generations", "1", "--checkpoint-uri", runs, "--run-name", "r")
    assert run_cli(*args, cwd=tmp_path).returncode == 0
    assert_one_line_error(run_cli(*args, cwd=tmp_path), "already exists")


def test_the_smoke_preset_trains_on_a_users_own_data(tmp_path, capsys):
    import main
    from tests.synthetic import momentum_prices

    prices = momentum_prices(num_days=900, num_assets=3)  # other tickers and years than the bundled data
    prices.rename(columns={"Date": "date"}).to_parquet(tmp_path / "my_prices.parquet", index=False)
    args = ["--preset", "smoke", "--data", str(tmp_path / "my_prices.parquet"), "--generations", "1"]
    assert main.main([*args, "--checkpoint-uri", str(tmp_path / "runs"), "--run-name", "r", "--no-progress"]) == 0
    assert "3 assets" in capsys.readouterr().out


def test_help_lists_every_config_key_with_its_meaning(tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "main.py"), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0
    assert "learner.tau" in result.stdout
    assert "Polyak coefficient" in result.stdout
    for command in ("inspect", "evaluate", "backtest", "export"):  # the commands beside training, each named
        assert f"python main.py {command} " in result.stdout


@pytest.mark.parametrize(
    ("argv", "usage"),
    [(["help"], "usage: python main.py [-h]"), (["help", "evaluate"], "usage: python main.py evaluate")],
)
def test_help_as_a_word_is_the_help_of_training_or_of_the_command_named(argv, usage, capsys):
    import main

    with pytest.raises(SystemExit) as exited:
        main.main(argv)
    assert exited.value.code == 0 and capsys.readouterr().out.startswith(usage)


@pytest.mark.slow
def test_tensorboard_logs_every_generation_and_a_resume_continues_it(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import main
    from persistence import jsonl

    common = ["--preset", "smoke", "--checkpoint-uri", str(tmp_path), "--run-name", "r", "--no-progress"]
    assert main.main([*common, "--device", "cpu", "--generations", "2", "--tensorboard"]) == 0
    assert main.main([*common, "--resume", "--generations", "3", "--tensorboard"]) == 0
    events = EventAccumulator(str(tmp_path / "r" / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"fitness/best", "fitness/spread", "validation/champion", "loss/actor", "memory/rss_bytes"} <= tags
    assert {"speed/env_steps_per_s", "time/update_s"} <= tags
    rows = list(jsonl.read_rows(tmp_path / "r" / "metrics.jsonl"))
    logged = events.Scalars("validation/champion")
    assert [e.step for e in logged] == [1, 2, 3]
    assert [e.value for e in logged] == pytest.approx([row["champion_score"] for row in rows], rel=1e-6)


@pytest.mark.parametrize("launched", [True, False], ids=["torchrun-process", "one-process"])
def test_a_torchrun_process_ends_without_the_interpreters_teardown(launched):
    """``main.exit_process``: under torchrun the exit code is kept and nothing of the teardown runs (an atexit
    handler stands for it); a process of its own ends as any program does."""
    code = "import atexit, main; atexit.register(print, 'teardown'); print('flushed', end=''); main.exit_process(3)"
    variables = dict.fromkeys(("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"), "0")
    env = {k: v for k, v in os.environ.items() if k not in variables} | (variables if launched else {})
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert done.stdout == ("flushed" if launched else "flushedteardown\n")


def test_the_command_line_reads_its_flags_before_importing_torch_or_a_storage_client():
    """A mistyped flag is answered at once: importing ``main`` loads neither torch nor the bucket's client, which
    take seconds, until the flags are known good."""
    probe = "import sys, main; print(sorted(m for m in ('torch', 'google.cloud.storage') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
