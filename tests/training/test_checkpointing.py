"""Checkpointing the loop (``training.checkpointing``): a generation is written as it was staged while the next one
trains, every error of a write and every end of a run waits for the write in flight, and the trainer's state goes out
and comes back as one value."""

from __future__ import annotations

import hashlib
import json
import threading
import time

import pytest
import torch

from config import override, preset
from persistence import checkpoint
from tests.run_checks import deterministic, rows
from training.loop import RunStopped, Trainer
from training.runs import resume_run, start_run


def smoke_run(tmp_path, name: str, **settings):
    config = override(
        preset("smoke"),
        {"checkpoint.uri": str(tmp_path), "checkpoint.run_name": name, "runtime.progress": False, **settings},
    )
    return start_run(config, log=lambda line: None)


def generation_tensors(trainer: Trainer, generation: int) -> dict[str, torch.Tensor]:
    files = checkpoint.open_generation(trainer.run_dir, generation)
    return {
        f"{name}.{key}": tensor
        for name in ("population", "replay", "rng")
        for key, tensor in checkpoint.read_tensors(files, name).items()
    }


def assert_same_tensors(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor]) -> None:
    assert left.keys() == right.keys()
    assert all(torch.equal(left[key], right[key]) for key in left), [
        key for key in left if not torch.equal(left[key], right[key])
    ]


@pytest.mark.slow
def test_a_generation_is_written_as_it_was_staged_while_the_next_one_trains(tmp_path, monkeypatch, writer_threads):
    reference = smoke_run(tmp_path, "reference").trainer
    reference.run(until=2)

    trainer = smoke_run(tmp_path, "delayed").trainer
    next_generation_trained = threading.Event()
    threads: list[str] = []
    write_generation = checkpoint.write_generation

    def write_after_the_next_generation_trained(run_dir, generation, **kwargs):
        threads.append(threading.current_thread().name)
        if generation == 1:  # nothing of generation 1 is read before generation 2 has changed the live tensors
            assert next_generation_trained.wait(timeout=120)
        return write_generation(run_dir, generation, **kwargs)

    update = trainer._update

    def update_then_say_so(plan):
        result = update(plan)
        if trainer.generation == 1:  # generation 2's updates, before its record phase
            next_generation_trained.set()
        return result

    monkeypatch.setattr(checkpoint, "write_generation", write_after_the_next_generation_trained)
    monkeypatch.setattr(trainer, "_update", update_then_say_so)
    trainer.run(until=2)

    assert threads == ["checkpoint-writer", "checkpoint-writer"] and not writer_threads()
    for generation in (1, 2):
        assert_same_tensors(generation_tensors(trainer, generation), generation_tensors(reference, generation))
    assert [deterministic(r) for r in rows(trainer.run_dir)] == [deterministic(r) for r in rows(reference.run_dir)]
    assert all(row["checkpoint_write_s"] > 0 for row in rows(trainer.run_dir))


@pytest.mark.slow
@pytest.mark.parametrize("failing", [2, 3])
def test_a_failed_write_is_raised_in_the_training_thread(tmp_path, monkeypatch, failing, writer_threads):
    trainer = smoke_run(tmp_path, "r").trainer
    write_generation = checkpoint.write_generation

    def disk_full_at(run_dir, generation, **kwargs):
        if generation == failing:
            raise OSError(f"no space left on device writing generation {generation}")
        return write_generation(run_dir, generation, **kwargs)

    monkeypatch.setattr(checkpoint, "write_generation", disk_full_at)
    # Generation 2's error comes out at generation 3's checkpoint; the last generation's at the end of the run.
    with pytest.raises(OSError, match=f"writing generation {failing}"):
        trainer.run(until=3)
    assert trainer.generation == 3
    assert [row["generation"] for row in rows(trainer.run_dir)] == list(range(1, failing))
    assert checkpoint.latest_generation(trainer.run_dir) == failing - 1
    assert not writer_threads()


def test_a_stop_returns_only_once_the_last_staged_generation_is_committed(tmp_path, monkeypatch, writer_threads):
    stop = threading.Event()
    run = smoke_run(tmp_path, "r")
    trainer = run.trainer
    trainer.should_stop = stop.is_set
    write_generation = checkpoint.write_generation

    def slow_write(run_dir, generation, **kwargs):
        time.sleep(0.5)  # still writing when the stop is noticed
        return write_generation(run_dir, generation, **kwargs)

    monkeypatch.setattr(checkpoint, "write_generation", slow_write)
    with pytest.raises(RunStopped) as stopped:
        trainer.run(until=5, on_generation=lambda row: stop.set() if row["generation"] == 2 else None)
    assert stopped.value.generation == 2
    assert checkpoint.latest_generation(trainer.run_dir) == 2
    assert [row["generation"] for row in rows(trainer.run_dir)] == [1, 2]
    assert not writer_threads()
    run.finish(progress=False)


def test_finishing_a_run_waits_for_the_write_in_flight(tmp_path, monkeypatch, writer_threads):
    run = smoke_run(tmp_path, "r")
    write_generation = checkpoint.write_generation

    def slow_write(run_dir, generation, **kwargs):
        time.sleep(0.5)
        return write_generation(run_dir, generation, **kwargs)

    monkeypatch.setattr(checkpoint, "write_generation", slow_write)
    run.trainer.run_generation()  # one generation outside ``run``: its write is still in flight here
    assert checkpoint.latest_generation(run.trainer.run_dir) is None
    run.finish(progress=False)
    assert checkpoint.latest_generation(run.trainer.run_dir) == 1
    assert [row["generation"] for row in rows(run.trainer.run_dir)] == [1]
    assert not writer_threads()


# ------------------------------------------------------------------------------------------ the state, as one value


@pytest.mark.slow
def test_the_trainer_gives_its_state_as_one_value_and_takes_it_back(tmp_path):
    trained = smoke_run(tmp_path, "trained", **{"runtime.generations": 2}).trainer
    trained.run(until=2)
    fresh = smoke_run(tmp_path, "fresh").trainer
    files = checkpoint.open_generation(trained.run_dir)
    fresh.load_state_(fresh.checkpoints.restore(files, gated=fresh.gate is not None))
    fresh.checkpoints.close()
    given, taken = trained.state(), fresh.state()
    assert (taken.generation, taken.champion) == (given.generation, given.champion) == (2, trained.champion)
    for key, tensor in given.population.items():
        assert torch.equal(taken.population[key], tensor), key
    assert (taken.buffer.pos, taken.buffer.size) == (given.buffer.pos, given.buffer.size)
    assert all(torch.equal(taken.buffer.storage[k], t) for k, t in given.buffer.storage.items())
    assert all(torch.equal(taken.streams[name], state) for name, state in given.streams.items())
    assert torch.equal(taken.gate["crossed"], given.gate["crossed"])
    assert given.optimiser_steps.keys() == taken.optimiser_steps.keys() >= {"actor", "critic"}
    assert all(int(taken.optimiser_steps[name]) == int(given.optimiser_steps[name]) for name in given.optimiser_steps)
    assert int(given.optimiser_steps["actor"]) > 0
    assert int(given.optimiser_steps["critic"]) == 0  # the smoke preset's critic is read by nothing: never trained


def test_a_checkpoint_that_calls_the_champions_bound_its_edge_still_resumes(tmp_path):
    """Earlier versions wrote the champion's bound as ``champion_edge`` in state.json."""
    trained = smoke_run(tmp_path, "r", **{"runtime.generations": 2}).trainer
    trained.run(until=2)
    folder = trained.run_dir / "gen-000002"
    state = json.loads((folder / "state.json").read_text())
    state["champion_edge"] = state.pop("champion_bound")
    data = json.dumps(state).encode()
    (folder / "state.json").write_bytes(data)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"]["state.json"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    config = override(trained.config, {"runtime.generations": 3})
    resumed = resume_run(config, {"runtime.generations": 3}, log=lambda line: None).trainer
    assert resumed.champion == trained.champion
    resumed.run(until=3)
