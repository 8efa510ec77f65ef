"""``python main.py inspect``: the report of a real run, its JSON, integrity, damage and exit statuses."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pytest
import safetensors.numpy
import safetensors.torch
import torch

import main
from offline import inspection
from offline.plots import HISTORY_SIZE_PX
from persistence import checkpoint

REPO = Path(__file__).resolve().parents[2]
FILES = {
    "history.json",
    "population.safetensors",
    "replay.safetensors",
    "replay-000.safetensors",
    "rng.safetensors",
    "selection.safetensors",
    "state.json",
}


def inspect(capsys, *args: str) -> tuple[int, str, str]:
    status = main.main(["inspect", *map(str, args)])
    out, err = capsys.readouterr()
    return status, out, err


def inspect_json(capsys, *args: str) -> tuple[int, dict]:
    status, out, err = inspect(capsys, *args, "--json")
    assert err == ""
    return status, json.loads(out)  # exactly one JSON document: json.loads refuses trailing text


def assert_one_line_error(capsys, args: list, *phrases: str) -> str:
    status, out, err = inspect(capsys, *args)
    assert status == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for phrase in phrases:
        assert phrase in lines[0]
    return lines[0]


def copy_run(smoke_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(smoke_run, tmp_path / "r"))


def flip_byte(path: Path, offset: int = -10) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def independent_params_sha256(population_file: Path, *, twins: bool = False) -> str:
    """The documented digest, from the file's bytes through numpy (no torch, no project code); ``twins``: TD3's."""
    arrays = safetensors.numpy.load_file(str(population_file))
    prefixes = ("actor.", "critic.", "actor_target.", "critic_target.", "champion.")
    prefixes += ("twin_critic.", "twin_critic_target.") if twins else ()
    digest = hashlib.sha256()
    for key in sorted(k for k in arrays if k.startswith(prefixes)):
        digest.update(key.encode())
        digest.update(arrays[key].astype(arrays[key].dtype.newbyteorder("<"), copy=False).tobytes())
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------------------------------
# An intact run


def test_json_report_of_a_run_folder(capsys, smoke_run):
    status, report = inspect_json(capsys, smoke_run)
    assert status == 0
    gen_dir = smoke_run / "gen-000003"
    state = json.loads((gen_dir / "state.json").read_text())
    history = json.loads((gen_dir / "history.json").read_text())

    assert report["generation"] == 3 and report["complete"] is True
    assert report["problems"] == [] and report["broken_generations"] == []
    assert report["complete_generations"] == [1, 2, 3]
    assert report["run_dir"] == str(smoke_run) and report["generation_dir"] == str(gen_dir)
    assert report["run_name"] == "r"
    assert report["champion_score"] == state["champion_score"]
    assert report["champion_generation"] == state["champion_generation"] >= 1
    assert report["config"] == state["config"]
    assert report["data"]["path"] == "bundled" and report["data"]["tickers"] == state["tickers"]
    assert report["fitness_history"] == [
        {
            "generation": r["generation"],
            "best": r["best_fitness"],
            "mean": r["mean_fitness"],
            "worst": r["worst_fitness"],
        }
        for r in history
    ]
    assert [v["best"] for v in report["validation_history"]] == [r["validation_best"] for r in history]
    assert [v["champion_score"] for v in report["validation_history"]] == [r["champion_score"] for r in history]

    manifest = json.loads((gen_dir / "manifest.json").read_text())["files"]
    assert set(report["files"]) == FILES
    for name, entry in report["files"].items():
        assert entry["size"] == manifest[name]["size"] == (gen_dir / name).stat().st_size
        assert entry["verified"] is True and entry["problem"] is None

    config = state["config"]
    population = report["population"]
    assert population["popsize"] == config["evolution"]["popsize"]
    tensors = checkpoint.read_tensors(checkpoint.open_generation(gen_dir), "population")
    actor_total = sum(t.numel() for k, t in tensors.items() if k.startswith("actor."))
    assert population["parameters_per_network"]["actor"] * population["popsize"] == actor_total
    assert population["trained_networks"] == ["actor", "critic"]  # DDPG's, as its learner names them
    assert population["best_fitness"] == history[-1]["best_fitness"]


def test_params_sha256_matches_an_independent_computation(capsys, smoke_run):
    _, report = inspect_json(capsys, smoke_run)
    assert report["params_sha256"] == independent_params_sha256(smoke_run / "gen-000003" / "population.safetensors")


def test_params_sha256_covers_parameters_only():
    tensors = {
        "actor.w": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "critic.w": torch.ones(2, 2),
        "actor_target.w": torch.zeros(2, 3),
        "critic_target.w": torch.zeros(2, 2),
        "champion.w": torch.ones(1, 3),
        "actor_optim.exp_avg.w": torch.ones(2, 3),
        "exploration_stdev": torch.ones(2),
    }
    networks = ["actor", "critic", "actor_target", "critic_target"]
    base = inspection.params_sha256(tensors, networks)
    assert base == inspection.params_sha256(dict(reversed(tensors.items())), networks)  # key order does not matter
    moved = {**tensors, "actor_optim.exp_avg.w": torch.zeros(2, 3), "exploration_stdev": torch.zeros(2)}
    assert inspection.params_sha256(moved, networks) == base
    transposed = tensors["actor.w"].t().contiguous().t()  # the same values, not contiguous
    assert inspection.params_sha256({**tensors, "actor.w": transposed}, networks) == base
    for key in ("actor.w", "critic.w", "actor_target.w", "critic_target.w", "champion.w"):
        assert inspection.params_sha256({**tensors, key: tensors[key] + 1}, networks) != base
    expected = hashlib.sha256()
    for key in sorted(k for k in tensors if not k.startswith(("actor_optim", "exploration"))):
        expected.update(key.encode() + tensors[key].numpy().tobytes())
    assert base == expected.hexdigest()


def test_human_report(capsys, smoke_run):
    status, out, err = inspect(capsys, smoke_run)
    assert status == 0 and err == ""
    lines = out.splitlines()
    assert lines[-1] == "complete: yes"
    assert lines[0].split()[:2] == ["run", "r"]
    assert lines[1].split()[:2] == ["generation", "3"]
    assert "bundled, 6 tickers" in out
    assert "validation 2021-12-29..2022-06-29, holdout 2022-06-30..2022-12-28" in out  # the dates it used
    assert "popsize 4" in out and "lookback 16" in out and "fitness mean_log_return" in out
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["gen"])
    assert [line.split()[0] for line in lines[header + 1 : header + 4]] == ["1", "2", "3"]
    assert len({len(line) for line in lines[header : header + 4]}) == 1  # aligned columns
    assert any(line.startswith("champion") and "found in generation" in line for line in lines)
    assert any(line.startswith("population") and "4 agents" in line for line in lines)
    for name in FILES:
        assert any(line.split()[:1] == [name] and line.endswith("verified yes") for line in lines)


def test_a_generation_folder_directly(capsys, smoke_run):
    _, run_report = inspect_json(capsys, smoke_run)
    status, report = inspect_json(capsys, smoke_run / "gen-000002")
    assert status == 0 and report["complete"] is True
    assert report["generation"] == 2 and report["run_dir"] == str(smoke_run)
    assert report["target_kind"] == "generation" and run_report["target_kind"] == "run"
    assert report["complete_generations"] == [2]
    assert len(report["fitness_history"]) == 2
    assert report["params_sha256"] != run_report["params_sha256"]
    assert report["params_sha256"] == independent_params_sha256(smoke_run / "gen-000002" / "population.safetensors")


def test_never_loads_the_replay_ring_and_reads_on_the_cpu(capsys, smoke_run, monkeypatch):
    groups, devices, parsed_sizes = [], [], []
    read_tensors, load = checkpoint.read_tensors, safetensors.torch.load

    def spy_read_tensors(gen, name, **kwargs):
        groups.append(name)
        devices.append(str(kwargs.get("device", "cpu")))
        return read_tensors(gen, name, **kwargs)

    def spy_load(data):
        parsed_sizes.append(len(data))
        return load(data)

    monkeypatch.setattr(checkpoint, "read_tensors", spy_read_tensors)
    monkeypatch.setattr(safetensors.torch, "load", spy_load)
    status, report = inspect_json(capsys, smoke_run)
    assert status == 0 and report["files"]["replay-000.safetensors"]["verified"] is True  # hashed, not loaded
    assert groups == ["population"] and devices == ["cpu"]
    replay_size = (smoke_run / "gen-000003" / "replay-000.safetensors").stat().st_size
    assert replay_size not in parsed_sizes


def test_plot_is_a_png_of_the_history(capsys, smoke_run, tmp_path):
    plot = tmp_path / "history.png"
    status, report = inspect_json(capsys, smoke_run, "--plot", plot)
    assert status == 0 and report["plot"] == str(plot)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width = matplotlib.image.imread(plot).shape[:2]
    assert (width, height) == HISTORY_SIZE_PX


def test_long_histories_are_elided_in_the_middle():
    rows = [{"generation": g, "best": 0.1, "mean": 0.0, "worst": -0.1} for g in range(1, 51)]
    validation = [{"generation": g, "best": 0.2, "champion_score": 0.3} for g in range(1, 51)]
    lines = inspection.format_history({"fitness_history": rows, "validation_history": validation})
    body = lines[1:]
    assert len(body) == inspection.HISTORY_ROWS
    firsts = [line.split()[0] for line in body]
    assert firsts[0] == "1" and firsts[-1] == "50" and "…" in firsts
    assert "31 generations not shown" in lines[firsts.index("…") + 1]
    short = inspection.format_history({"fitness_history": rows[:5], "validation_history": validation[:5]})
    assert len(short) == 6


# ---------------------------------------------------------------------------------------------------------------------
# Damage


def test_a_corrupt_newest_generation_reports_the_one_before(capsys, smoke_run, tmp_path):
    run_dir = copy_run(smoke_run, tmp_path)
    flip_byte(run_dir / "gen-000003" / "population.safetensors")
    status, report = inspect_json(capsys, run_dir)
    assert status == 0
    assert report["generation"] == 2 and report["complete"] is True
    assert report["complete_generations"] == [1, 2]
    [broken] = report["broken_generations"]
    assert broken["generation"] == 3 and broken["folder"] == "gen-000003"
    assert "population.safetensors" in broken["problems"][0] and "SHA-256" in broken["problems"][0]

    status, out, _ = inspect(capsys, run_dir)
    assert status == 0
    assert any(line.startswith("broken") and "gen-000003" in line for line in out.splitlines())
    assert out.splitlines()[-1] == "complete: yes"


def test_an_incomplete_newest_generation_is_listed(capsys, smoke_run, tmp_path):
    run_dir = copy_run(smoke_run, tmp_path)
    (run_dir / "gen-000003" / "manifest.json").unlink()
    status, report = inspect_json(capsys, run_dir)
    assert status == 0 and report["generation"] == 2
    assert report["broken_generations"][0]["generation"] == 3
    assert "manifest.json" in report["broken_generations"][0]["problems"][0]


def test_a_corrupt_generation_folder_given_directly(capsys, smoke_run, tmp_path):
    gen_dir = copy_run(smoke_run, tmp_path) / "gen-000003"
    flip_byte(gen_dir / "population.safetensors")
    status, report = inspect_json(capsys, gen_dir)
    assert status == 2
    assert report["complete"] is False and report["generation"] == 3
    assert report["complete_generations"] == []
    assert report["params_sha256"] is None and report["population"] is None
    assert report["files"]["population.safetensors"]["verified"] is False
    assert report["files"]["state.json"]["verified"] is True
    assert len(report["problems"]) == 1 and str(gen_dir / "population.safetensors") in report["problems"][0]
    assert len(report["fitness_history"]) == 3  # what still verifies is still reported

    status, out, err = inspect(capsys, gen_dir)
    assert status == 2 and err == ""
    assert out.splitlines()[-1] == "complete: no"
    assert any(
        line.startswith("  population.safetensors") and line.endswith("verified no") for line in out.splitlines()
    )
    assert "SHA-256 does not match" in out


def test_a_truncated_file_and_an_unlisted_file(capsys, smoke_run, tmp_path):
    gen_dir = copy_run(smoke_run, tmp_path) / "gen-000003"
    replay = gen_dir / "replay-000.safetensors"
    replay.write_bytes(replay.read_bytes()[:100])
    (gen_dir / "notes.txt").write_text("hello")
    status, report = inspect_json(capsys, gen_dir)
    assert status == 2 and report["complete"] is False
    assert report["files"]["replay-000.safetensors"]["verified"] is False
    assert report["files"]["notes.txt"] == {
        "size": 5,
        "sha256": None,
        "verified": False,
        "problem": f"{gen_dir / 'notes.txt'} is not named in the manifest",
    }
    assert any("truncated" in p for p in report["problems"])
    assert report["params_sha256"] is not None  # the population itself is intact


def test_a_run_whose_every_generation_is_corrupt(capsys, smoke_run, tmp_path):
    run_dir = copy_run(smoke_run, tmp_path)
    for generation in (1, 2, 3):
        flip_byte(run_dir / checkpoint.generation_dirname(generation) / "rng.safetensors")
    status, report = inspect_json(capsys, run_dir)
    assert status == 2 and report["complete"] is False
    assert report["generation"] == 3
    assert [b["generation"] for b in report["broken_generations"]] == [1, 2]
    assert report["complete_generations"] == []
    assert "rng.safetensors" in report["problems"][0]


# ---------------------------------------------------------------------------------------------------------------------
# Bad input: one line, exit status 2, nothing on stdout


def test_bad_targets_are_one_line_errors(capsys, smoke_run, tmp_path):
    assert_one_line_error(capsys, [tmp_path / "missing", "--json"], str(tmp_path / "missing"), "no checkpoint")
    (tmp_path / "empty").mkdir()
    assert_one_line_error(capsys, [tmp_path / "empty"], str(tmp_path / "empty"), "neither a run folder")
    (tmp_path / "file.txt").write_text("x")
    assert_one_line_error(capsys, [tmp_path / "file.txt"], "file.txt", "is a file")
    assert_one_line_error(capsys, ["gs://bucket/prefix/run", "--json"], "gs://")
    assert_one_line_error(capsys, [smoke_run, "--bogus"], "--bogus")
    assert_one_line_error(capsys, [], "target")
    missing_folder = tmp_path / "nowhere" / "plot.png"
    assert_one_line_error(capsys, [smoke_run, "--plot", missing_folder], str(missing_folder))


def test_unknown_format_version_and_missing_manifest(capsys, smoke_run, tmp_path):
    run_dir = copy_run(smoke_run, tmp_path)
    manifest = run_dir / "gen-000003" / "manifest.json"
    document = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**document, "format_version": 99}))
    assert_one_line_error(capsys, [run_dir / "gen-000003", "--json"], str(manifest), "format_version 99")
    (run_dir / "gen-000002" / "manifest.json").unlink()
    assert_one_line_error(capsys, [run_dir / "gen-000002"], str(run_dir / "gen-000002"), "manifest.json")


def test_a_run_folder_without_a_complete_generation(capsys, tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "gen-000001").mkdir(parents=True)
    (run_dir / "config.json").write_text("{}")
    assert_one_line_error(capsys, [run_dir], "no complete checkpoint generation", str(run_dir))


@pytest.mark.slow
def test_command_line_in_a_subprocess(smoke_run, tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "main.py"), "inspect", str(smoke_run), "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["generation"] == 3 and report["complete"] is True
    assert list(tmp_path.iterdir()) == []  # read-only: nothing written


def test_a_state_document_of_the_wrong_types_is_damage_not_a_traceback(smoke_run, tmp_path, capsys):
    run = tmp_path / "r"
    shutil.copytree(smoke_run, run)
    gen3 = run / "gen-000003"
    state = json.loads((gen3 / "state.json").read_text())
    state.update(champion_score=[1.0], tickers=5, splits=3)
    data = json.dumps(state).encode()
    (gen3 / "state.json").write_bytes(data)
    manifest = json.loads((gen3 / "manifest.json").read_text())
    manifest["files"]["state.json"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (gen3 / "manifest.json").write_text(json.dumps(manifest))

    code, report = inspect_json(capsys, str(gen3))
    assert code == 2 and report["complete"] is False
    assert any("state.json" in problem and "champion_score" in problem for problem in report["problems"])
    code, report = inspect_json(capsys, str(run))  # the run: the newest intact generation, the damaged one listed
    assert code == 0 and report["generation"] == 2
    for command in (["export", gen3, tmp_path / "out"], ["evaluate", gen3, "--out", tmp_path / "ev"]):
        assert main.main([str(word) for word in command]) == 2
        error = capsys.readouterr().err.strip()
        assert len(error.splitlines()) == 1 and "damaged" in error and "champion_score" in error, error
    assert not (tmp_path / "out").exists() and not (tmp_path / "ev").exists()


def test_a_checkpoint_of_an_earlier_version_is_inspected_and_exported_as_intact(smoke_run, tmp_path, capsys):
    """Earlier versions called the champion's bound its edge (``champion_edge``): such a generation resumes, and the
    offline commands read it too, not as damage."""
    run = tmp_path / "r"
    shutil.copytree(smoke_run, run)
    gen3 = run / "gen-000003"
    state = json.loads((gen3 / "state.json").read_text())
    state["champion_edge"] = state.pop("champion_bound")
    data = json.dumps(state).encode()
    (gen3 / "state.json").write_bytes(data)
    manifest = json.loads((gen3 / "manifest.json").read_text())
    manifest["files"]["state.json"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (gen3 / "manifest.json").write_text(json.dumps(manifest))

    code, report = inspect_json(capsys, str(gen3))
    assert code == 0 and report["complete"] is True and report["generation"] == 3
    assert main.main(["export", str(gen3), str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "actor.json").read_text())["champion_bound"] == state["champion_edge"]


def test_an_equal_weight_champion_is_named_as_such(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr("training.loop.choose_champion", lambda edges, *_, **__: None)
    argv = ["--preset", "smoke", "--checkpoint-uri", str(tmp_path), "--run-name", "ew", "--generations", "1"]
    assert main.main([*argv, "--no-progress"]) == 0
    capsys.readouterr()
    status, out, _ = inspect(capsys, tmp_path / "ew")
    assert status == 0
    line = next(line for line in out.splitlines() if line.startswith("champion"))
    assert "equal weight (no agent's edge passed the selection test)" in line
    # and how far the run is from proving one: the closest agent and the days that would prove it, or why none would
    line = next(line for line in out.splitlines() if line.startswith("selection"))
    assert "no agent proven: " in line and ("validation days" in line or "worth its costs" in line), line
    status, out, _ = inspect(capsys, tmp_path / "ew", "--json")
    assert json.loads(out)["selection"] == line.removeprefix("selection").strip()


@pytest.mark.slow
def test_a_td3_checkpoint_is_hashed_and_counted_with_its_twin_critic(capsys, tmp_path):
    """Every network of the learner counts: two TD3 checkpoints that differ only in the twin critic hash apart, and
    its parameters are counted as trained."""
    run = ["--preset", "smoke", "--generations", "1", "--checkpoint-uri", str(tmp_path), "--run-name", "td3"]
    run += ["--no-progress", "--device", "cpu", "--set", "learner.algorithm=td3", "--set", "learner.gamma=0.9"]
    assert main.main(run) == 0
    capsys.readouterr()
    gen = tmp_path / "td3" / "gen-000001"
    _, report = inspect_json(capsys, gen)
    population = report["population"]
    assert population["trained_networks"] == ["actor", "critic", "twin_critic"]
    per_network = population["parameters_per_network"]
    assert per_network["twin_critic"] == per_network["critic"] > 0 and "twin_critic_target" in per_network
    assert population["parameters_per_agent"] == per_network["actor"] + 2 * per_network["critic"]
    assert report["params_sha256"] == independent_params_sha256(gen / "population.safetensors", twins=True)
    tensors = checkpoint.read_tensors(checkpoint.open_generation(gen), "population")
    twin = next(key for key in tensors if key.startswith("twin_critic."))
    changed = {**tensors, twin: tensors[twin] + 1}
    networks, _ = inspection.networks_of(report["config"], tensors)
    assert inspection.params_sha256(changed, networks) != report["params_sha256"]


def test_the_device_shown_is_the_one_that_wrote_the_generation(capsys, smoke_run):
    """The state document records the device that wrote a generation: inspect shows it, and the configured one beside
    it where they differ (``auto`` is whatever the machine had)."""
    from offline.inspection import _device

    status, report = inspect_json(capsys, smoke_run)
    assert status == 0 and report["device"]["type"] == "cpu"
    assert "fitness mean_log_return, device cpu\n" in inspect(capsys, smoke_run)[1]  # configured cpu: no note
    h200 = {"type": "cuda", "name": "NVIDIA H200", "torch": "2.11.0"}
    assert _device(h200, "auto") == "NVIDIA H200 (configured auto)"
    assert _device(h200, "cuda") == "NVIDIA H200"
    assert _device({"type": "cpu"}, "auto") == "cpu (configured auto)"
    assert _device(None, "auto") == "auto"  # a generation written before the device was recorded
