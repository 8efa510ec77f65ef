"""Checkpointing the loop (``run.checkpointing``): a generation is written as it was staged while the next one
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
from persistence import checkpoint, committing
from run.launch import resume_run, start_run
from run.trainer import RunStopped, Trainer
from tests.run_checks import deterministic, rows, state_digest


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
    write_generation = committing.write_generation

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

    monkeypatch.setattr(committing, "write_generation", write_after_the_next_generation_trained)
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
    write_generation = committing.write_generation

    def disk_full_at(run_dir, generation, **kwargs):
        if generation == failing:
            raise OSError(f"no space left on device writing generation {generation}")
        return write_generation(run_dir, generation, **kwargs)

    monkeypatch.setattr(committing, "write_generation", disk_full_at)
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
    write_generation = committing.write_generation

    def slow_write(run_dir, generation, **kwargs):
        time.sleep(0.5)  # still writing when the stop is noticed
        return write_generation(run_dir, generation, **kwargs)

    monkeypatch.setattr(committing, "write_generation", slow_write)
    with pytest.raises(RunStopped) as stopped:
        trainer.run(until=5, on_generation=lambda row: stop.set() if row["generation"] == 2 else None)
    assert stopped.value.generation == 2
    assert checkpoint.latest_generation(trainer.run_dir) == 2
    assert [row["generation"] for row in rows(trainer.run_dir)] == [1, 2]
    assert not writer_threads()
    run.finish(progress=False)


def test_finishing_a_run_waits_for_the_write_in_flight(tmp_path, monkeypatch, writer_threads):
    run = smoke_run(tmp_path, "r")
    write_generation = committing.write_generation

    def slow_write(run_dir, generation, **kwargs):
        time.sleep(0.5)
        return write_generation(run_dir, generation, **kwargs)

    monkeypatch.setattr(committing, "write_generation", slow_write)
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


# ------------------------------------------------------------------------------------ a checkpoint every k generations


def recording_writes(monkeypatch) -> list[int]:
    """The generations whose checkpoint is written, in order, from now on."""
    written: list[int] = []
    write_generation = committing.write_generation

    def write(run_dir, generation, **kwargs):
        written.append(generation)
        return write_generation(run_dir, generation, **kwargs)

    monkeypatch.setattr(committing, "write_generation", write)
    return written


def history(trainer: Trainer, generation: int) -> list[int]:
    files = checkpoint.open_generation(trainer.run_dir, generation)
    return [row["generation"] for row in checkpoint.read_document(files, "history")]


def test_every_kth_generation_and_the_last_are_checkpointed_and_every_row_reaches_the_metrics(tmp_path, monkeypatch):
    written = recording_writes(monkeypatch)
    run = smoke_run(tmp_path, "r", **{"checkpoint.every": 3, "checkpoint.keep_last": 2, "runtime.generations": 7})
    lines: list[dict] = []
    run.trainer.run(until=7, on_generation=lines.append)
    trainer = run.trainer
    assert written == [3, 6, 7]
    # keep_last prunes as before: the two newest, and the champion's generation if it has a folder.
    assert checkpoint.complete_generations(trainer.run_dir) == sorted({6, 7} | ({trainer.champion.generation} & {3}))
    assert (history(trainer, 6), history(trainer, 7)) == (list(range(1, 7)), list(range(1, 8)))
    assert (
        [row["generation"] for row in lines] == [row["generation"] for row in rows(trainer.run_dir)] == [*range(1, 8)]
    )
    # A generation that writes nothing blocks for nothing; its row carries no write.
    timings = {row["generation"]: (row["checkpoint_s"], row["checkpoint_write_s"]) for row in rows(trainer.run_dir)}
    assert all(timings[g] == (0.0, 0.0) for g in (1, 2, 4, 5))
    assert all(timings[g][0] > 0 and timings[g][1] > 0 for g in (3, 6, 7))
    run.finish(progress=False)


@pytest.mark.parametrize(
    ("stop_at", "stopped_after", "written"),
    [
        ("start@5", 4, [3, 4]),  # between generations: generation 4, not checkpointed, is checkpointed first
        ("rollout@4", 3, [3]),  # inside generation 4: abandoned, generation 3 is checkpointed already
        ("rollout@5", 5, [3, 5]),  # inside generation 5: generation 4's state is gone, so 5 is finished instead
    ],
)
def test_a_stop_checkpoints_the_last_complete_generation_first(tmp_path, monkeypatch, stop_at, stopped_after, written):
    writes = recording_writes(monkeypatch)
    run = smoke_run(tmp_path, "r", **{"checkpoint.every": 3, "runtime.generations": 7})
    trainer = run.trainer
    moment, generation = stop_at.split("@")
    stop = threading.Event()
    trainer.should_stop = stop.is_set

    def stop_with_the_row_before(row):
        if row["generation"] == int(generation) - 1:
            stop.set()

    roll_out = trainer._roll_out

    def roll_out_then_stop():
        fitness = roll_out()
        if trainer.generation + 1 == int(generation):  # the one being computed
            stop.set()
        return fitness

    if moment == "rollout":
        monkeypatch.setattr(trainer, "_roll_out", roll_out_then_stop)
    with pytest.raises(RunStopped) as stopped:
        trainer.run(until=7, on_generation=stop_with_the_row_before if moment == "start" else None)
    assert stopped.value.generation == stopped_after
    assert writes == written
    assert checkpoint.latest_generation(trainer.run_dir) == stopped_after
    assert [row["generation"] for row in rows(trainer.run_dir)] == list(range(1, stopped_after + 1))
    run.finish(progress=False)


@pytest.mark.slow
@pytest.mark.parametrize("interruption", ["stopped", "crashed"])
def test_a_run_checkpointed_every_k_generations_resumes_bit_for_bit(tmp_path, monkeypatch, interruption):
    settings = {"checkpoint.every": 3, "runtime.generations": 7, "runtime.seed": 3}
    reference = smoke_run(tmp_path, "reference", **settings)
    reference.trainer.run(until=7)
    reference.finish(progress=False)

    interrupted = smoke_run(tmp_path, "interrupted", **settings)
    trainer = interrupted.trainer
    if interruption == "stopped":
        trainer.run(until=4)  # the last generation of a run's invocation is always checkpointed
        resumed_from = 4
    else:  # killed in generation 5: generation 4's row, held for the checkpoint that never came, is lost with it
        update = trainer._update

        def crash_in_generation_5(plan):
            if trainer.generation == 4:
                raise KeyboardInterrupt("killed")
            return update(plan)

        monkeypatch.setattr(trainer, "_update", crash_in_generation_5)
        with pytest.raises(KeyboardInterrupt):
            trainer.run(until=7)
        resumed_from = 3
    interrupted.finish(progress=False)
    assert checkpoint.latest_generation(trainer.run_dir) == resumed_from
    assert [row["generation"] for row in rows(trainer.run_dir)] == list(range(1, resumed_from + 1))

    # Another checkpoint.every changes no result: a resume may take one.
    config = override(trainer.config, {"checkpoint.every": 2})
    resumed = resume_run(config, {"checkpoint.every": 2}, log=lambda line: None)
    assert (resumed.trainer.generation, resumed.trainer.config.checkpoint.every) == (resumed_from, 2)
    resumed.trainer.run(until=7)
    resumed.finish(progress=False)
    assert checkpoint.latest_generation(trainer.run_dir) == 7
    assert [deterministic(r) for r in rows(trainer.run_dir)] == [
        deterministic(r) for r in rows(reference.trainer.run_dir)
    ]
    assert state_digest(trainer.run_dir) == state_digest(reference.trainer.run_dir)
