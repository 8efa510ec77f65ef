"""Checkpoints off the loop's critical path: staged copies taken once per generation, written on a thread of their
own, one at a time, with every error and every end of a run waiting for the write in flight."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from config import override, preset
from persistence import checkpoint
from persistence.staging import CheckpointWriter, StagingBuffers
from tests.run_checks import deterministic, rows
from training.loop import RunStopped, Trainer
from training.runs import start_run

_EARLIER: set[threading.Thread] = set()


@pytest.fixture(autouse=True)
def _earlier_writer_threads():
    """Writer threads of trainers other tests dropped without closing end when those are collected; count only
    this test's."""
    _EARLIER.clear()
    _EARLIER.update(t for t in threading.enumerate() if t.name == "checkpoint-writer")


def writer_threads() -> list[threading.Thread]:
    """The writer threads this test started that are still alive."""
    return [t for t in threading.enumerate() if t.name == "checkpoint-writer" and t not in _EARLIER]


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


# --------------------------------------------------------------------------------------------- staging buffers


def test_staged_copies_keep_the_sources_as_they_were_in_buffers_allocated_once():
    ring = torch.arange(12, dtype=torch.float32).reshape(6, 2)
    weights = torch.randn(3, 4)
    staging = StagingBuffers(torch.device("cpu"))
    staged = staging.capture({"population": {"w": weights}, "replay": {"ring": ring}}, rows={"replay": 2})
    assert torch.equal(staged["population"]["w"], weights)
    assert torch.equal(staged["replay"]["ring"], ring[:2])  # the filled part only
    pointers = (staged["population"]["w"].data_ptr(), staged["replay"]["ring"].data_ptr())
    expected = weights.clone()
    weights.add_(1.0)  # training goes on with the live tensors
    assert torch.equal(staged["population"]["w"], expected)

    again = staging.capture({"population": {"w": weights}, "replay": {"ring": ring}}, rows={"replay": 6})
    assert (again["population"]["w"].data_ptr(), again["replay"]["ring"].data_ptr()) == pointers
    assert torch.equal(again["population"]["w"], weights) and torch.equal(again["replay"]["ring"], ring)
    assert staging.nbytes == weights.nbytes + ring.nbytes
    with pytest.raises(ValueError, match="must keep their shapes"):
        staging.capture({"population": {"w": torch.zeros(2, 4)}})


def test_staging_from_cuda_is_pinned_and_complete_when_capture_returns(cuda):
    source = torch.randn(1024, 1024, device="cuda", generator=torch.Generator(device="cuda"))
    staging = StagingBuffers(source.device)
    staged = staging.capture({"group": {"t": source}})["group"]["t"]
    assert staged.is_pinned() and staged.device.type == "cpu"
    assert torch.equal(staged, source.cpu())


# --------------------------------------------------------------------------------------------- the writer thread


def test_the_writer_runs_one_write_at_a_time_and_raises_its_error_once_in_the_caller():
    writer = CheckpointWriter()
    order: list[str] = []
    release = threading.Event()

    def slow() -> None:
        release.wait(timeout=30)
        order.append("first")

    writer.start(slow)
    assert len(writer_threads()) == 1
    threading.Timer(0.2, release.set).start()
    writer.start(lambda: order.append("second"))
    assert order[:1] == ["first"]  # start returned only once the first write was done
    writer.wait()
    assert order == ["first", "second"] and len(writer_threads()) == 1  # one thread serves every write

    def fails() -> None:
        raise OSError("no space left on device")

    writer.start(fails)
    with pytest.raises(OSError, match="no space left"):
        writer.start(lambda: order.append("never"))
    assert writer.wait() == 0.0  # raised once; the writer is idle again
    assert "never" not in order
    writer.start(lambda: order.append("after the error"))
    writer.close()
    assert order[-1] == "after the error" and not writer_threads()


def test_a_writer_dropped_without_close_ends_its_thread():
    writer = CheckpointWriter()
    writer.start(lambda: None)
    writer.wait()
    (thread,) = writer_threads()
    del writer  # no cycle holds it: collected at once, and its finaliser ends the thread
    thread.join(timeout=10)
    assert not thread.is_alive()


# --------------------------------------------------------------------------------------------- in the trainer


def test_a_generation_is_written_as_it_was_staged_while_the_next_one_trains(tmp_path, monkeypatch):
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


@pytest.mark.parametrize("failing", [2, 3])
def test_a_failed_write_is_raised_in_the_training_thread(tmp_path, monkeypatch, failing):
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


def test_a_stop_returns_only_once_the_last_staged_generation_is_committed(tmp_path, monkeypatch):
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


def test_finishing_a_run_waits_for_the_write_in_flight(tmp_path, monkeypatch):
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
