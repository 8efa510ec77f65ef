"""benchmarks/gpu_smoke.sh, checked on a machine without CUDA: it parses, refuses in one line writing nothing, and the
commands its dry run prints are well-formed (their flags parse, their ``--set`` keys and values make a config)."""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import config
import main
from benchmarks import memory_soak

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_smoke.sh"


def script(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHON": sys.executable, **env}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=cwd, env=environment, capture_output=True, text=True)


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True).returncode == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
@pytest.mark.parametrize("args", [(), ("figures.md",)])
def test_without_cuda_it_says_so_in_one_line_exits_2_and_writes_nothing(tmp_path, args):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    done = script(*args, cwd=cwd, TMPDIR=str(scratch))
    assert done.returncode == 2
    lines = (done.stdout + done.stderr).splitlines()
    assert len(lines) == 1 and "needs a CUDA device" in lines[0], lines
    assert not any(cwd.iterdir()) and not any(scratch.iterdir())
    assert not (REPO / "gpu_smoke.md").exists()


@pytest.fixture(scope="module")
def commands(tmp_path_factory) -> list[list[str]]:
    """The dry run's commands, split as the shell would, the interpreter left out."""
    cwd = tmp_path_factory.mktemp("dry-run")
    done = script(str(cwd / "out.md"), cwd=cwd, GPU_SMOKE_DRY_RUN="1", GPU_SMOKE_WORK=str(cwd / "work"))
    assert done.returncode == 0, done.stderr
    assert not any(cwd.iterdir())  # a dry run writes nothing
    lines = [shlex.split(line) for line in done.stdout.splitlines()]
    assert all(line[0] == sys.executable for line in lines)
    return [line[1:] for line in lines]


def train_config(argv: list[str]) -> config.Config:
    """The config ``python main.py ARGV`` would train with (its flags parsed, its settings applied to its preset)."""
    args = main._train_parser().parse_args(argv)
    return config.override(config.preset(args.preset), main._explicit_settings(args))


def test_the_gpu_tests_are_selected_by_a_declared_marker(commands):
    assert commands[0][:3] == ["-m", "pytest", "-q"] and commands[0][3:5] == ["-m", "gpu"]
    assert '"gpu: ' in (REPO / "pyproject.toml").read_text()


def soak_configs(commands, monkeypatch) -> list[config.Config]:
    """The configs of the dry run's memory_soak.py commands, as memory_soak parses and builds them."""

    class CapturedError(Exception):
        pass

    def capture(config_, generations, **_):
        raise CapturedError(config_, generations)

    monkeypatch.setattr(memory_soak, "soak", capture)
    configs = []
    for argv in commands:
        if argv[0] != "benchmarks/memory_soak.py":
            continue
        with pytest.raises(CapturedError) as captured:  # memory_soak's own parsing and config, up to the run
            memory_soak.main(argv[1:])
        settings, generations = captured.value.args
        assert generations >= 2  # the first generation is left out
        configs.append(settings)
    return configs


def test_the_timings_cover_graphs_tf32_and_bf16_on_the_gpu_and_the_default_on_the_cpu(commands, monkeypatch):
    configs = soak_configs(commands, monkeypatch)
    paper = config.preset("paper").evolution.popsize
    seen = {
        (c.runtime.matmul_precision, c.model.bf16_encoder, c.runtime.cuda_graphs, c.runtime.torch_compile)
        for c in configs
        if c.evolution.popsize == paper
    }
    assert seen == {
        ("high", False, False, False),
        ("high", False, True, False),
        ("highest", False, True, False),
        ("high", True, True, False),
        ("high", False, True, True),
    }
    assert all(c.runtime.device == "cuda" for c in configs if c.evolution.popsize == paper)
    default = config.preset("default")
    defaults = [
        (c.runtime.device, c.runtime.cuda_graphs if c.runtime.device == "cuda" else "n/a", c.runtime.torch_compile)
        for c in configs
        if c.model == default.model
    ]
    # the same call, four ways: no graphs on a CPU
    assert sorted(defaults) == [
        ("cpu", "n/a", False),
        ("cuda", False, False),
        ("cuda", True, False),
        ("cuda", True, True),
    ]


def test_the_update_roofline_and_the_backtest_fold_run_graphed_on_cuda(commands):
    roofline = [argv for argv in commands if argv[0] == "benchmarks/update_roofline.py"]
    assert [argv[argv.index("--preset") + 1] for argv in roofline] == ["paper"] * 3
    assert all("--check-profiler" in argv for argv in roofline)
    settings = {(argv[-3], argv[-1]) for argv in roofline}
    assert settings == {
        ("runtime.cuda_graphs=false", "runtime.torch_compile=false"),
        ("runtime.cuda_graphs=true", "runtime.torch_compile=false"),
        ("runtime.cuda_graphs=true", "runtime.torch_compile=true"),
    }
    [backtest] = [argv for argv in commands if argv[:2] == ["main.py", "backtest"]]
    assert "--device" in backtest and backtest[backtest.index("--device") + 1] == "cuda"
    assert backtest[backtest.index("--generations") + 1] == "40" and "runtime.cuda_graphs=true" in backtest


def test_the_floor_measures_the_default_graphed_compiled_and_on_the_cpu_and_the_paper_compiled(commands):
    floors = [argv[1:] for argv in commands if argv[0] == "benchmarks/generation_floor.py"]
    configs = []
    for argv in floors:
        presets, sets = argv[argv.index("--preset") + 1], [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
        configs.append(config.override(config.preset(presets), config.parse_assignments(sets)))
    seen = sorted((c.evolution.popsize, c.runtime.device, c.runtime.torch_compile) for c in configs)
    default, paper = config.preset("default").evolution.popsize, config.preset("paper").evolution.popsize
    assert seen == sorted(
        [(default, "cuda", False), (default, "cuda", True), (default, "cpu", False), (paper, "cuda", True)]
    )
    assert all(c.runtime.cuda_graphs for c in configs)  # graphed wherever there is a GPU (the default's setting)


def test_the_resume_moves_a_cuda_run_to_the_cpu(commands):
    runs = [argv[1:] for argv in commands if argv[0] == "main.py" and "cuda-then-cpu" in argv]
    assert len(runs) == 2 and "--resume" not in runs[0] and "--resume" in runs[1]
    first, then = train_config(runs[0]), train_config(runs[1])
    assert (first.runtime.device, first.runtime.generations) == ("cuda", 2)
    assert (then.runtime.device, then.runtime.generations) == ("cpu", 3)
    assert first.checkpoint == then.checkpoint


def test_the_sharded_runs_differ_only_in_the_process_count_and_are_inspected(commands):
    runs = {}
    for index, argv in enumerate(commands):
        if "main.py" not in argv or "cuda-then-cpu" in argv or "inspect" in argv or "backtest" in argv:
            continue
        split = argv.index("main.py")
        launcher, settings = argv[:split], train_config(argv[split + 1 :])
        if launcher:  # torchrun
            assert launcher == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
        run_dir = f"{settings.checkpoint.uri}/{settings.checkpoint.run_name}"
        assert commands[index + 1] == ["main.py", "inspect", run_dir, "--json"]
        runs[2 if launcher else 1] = settings
    assert set(runs) == {1, 2}
    assert runs[1].runtime.device == "cuda" and runs[1].evolution.popsize % 2 == 0
    assert runs[1].checkpoint.run_name != runs[2].checkpoint.run_name
    renamed = dataclasses.replace(runs[2].checkpoint, run_name=runs[1].checkpoint.run_name)
    assert dataclasses.replace(runs[2], checkpoint=renamed) == runs[1]


def test_a_call_can_run_some_sections_and_an_unknown_one_is_refused_before_anything(tmp_path):
    some = script(cwd=tmp_path, GPU_SMOKE_DRY_RUN="1", GPU_SMOKE_SECTIONS="resume,paper", GPU_SMOKE_WORK=str(tmp_path))
    lines = [shlex.split(line)[1:] for line in some.stdout.splitlines()]
    assert some.returncode == 0 and len(lines) == 7  # the resume's two runs, then five paper timings: as asked
    assert all("cuda-then-cpu" in line for line in lines[:2])
    assert all(line[0] == "benchmarks/memory_soak.py" for line in lines[2:])
    bad = script(cwd=tmp_path, GPU_SMOKE_SECTIONS="paper bogus")
    assert bad.returncode == 2 and "unknown section bogus" in bad.stderr and not bad.stdout


def test_graphed_timings_come_from_the_generations_after_capture():
    """A graphed call warms up for two calls and captures in the third: the medians leave those out, and a run
    whose every later generation captured says so instead of passing its captures off as replays."""
    from benchmarks.smoke_figures import steady_rows

    eager = [{"generation": g, "graph_captures": 0} for g in range(1, 6)]
    assert [r["generation"] for r in steady_rows(eager)[0]] == [2, 3, 4, 5]
    graphed = [{"generation": g, "graph_captures": c} for g, c in zip(range(1, 6), [0, 0, 3, 0, 0], strict=True)]
    assert steady_rows(graphed) == (graphed[3:], "")
    filling = [{"generation": g, "graph_captures": c} for g, c in zip(range(1, 6), [0, 0, 3, 1, 1], strict=True)]
    rows, note = steady_rows(filling)
    assert rows == filling[3:] and "captured in every generation" in note
