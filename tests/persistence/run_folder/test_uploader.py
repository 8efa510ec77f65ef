"""The background uploader: complete generations only, a queue of two places, retries, retention; GCS runs on a real
fake-gcs-server that these tests stop, kill and restart."""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
import time
from pathlib import Path

import pytest
import torch

from persistence.checkpoint import generation_dirname
from persistence.committing import write_generation
from persistence.gcs import open_storage
from persistence.run_folder.uploader import CheckpointUploader
from persistence.storage import Storage
from tests.memory_storage import MemoryStorage
from utils.errors import StorageError

RUN = "run-1"
MB = 1_000_000


def make_generation(run_dir: Path, generation: int, *, big_bytes: int = 0) -> Path:
    """A generation folder as the trainer writes it, plus the run's config and a metrics row."""
    g = torch.Generator().manual_seed(generation)
    tensors = {"population": {"actor.weight": torch.randn(8, 16, generator=g)}}
    if big_bytes:
        tensors["replay"] = {"actions": torch.randn(big_bytes // 4, generator=g)}
    path = write_generation(
        run_dir, generation, tensors=tensors, documents={"evolution": {"generation": generation, "elites": [0, 1]}}
    )
    if not (run_dir / "config.json").exists():
        (run_dir / "config.json").write_text('{"seed": 5}\n')
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"generation": generation}) + "\n")
    return path


def bucket_generations(storage: Storage) -> list[int]:
    """Generations whose manifest is in the bucket."""
    return sorted(
        int(key.split("/")[1][4:]) for key in storage.list(RUN) if key.endswith("/manifest.json") and "/gen-" in key
    )


def assert_bucket_holds(storage: Storage, run_dir: Path, generation: int) -> None:
    """LATEST names ``generation``, whose manifest and files are byte-identical to the local ones."""
    dirname = generation_dirname(generation)
    assert storage.read_bytes(f"{RUN}/LATEST") == f"{dirname}\n".encode()
    manifest = storage.read_bytes(f"{RUN}/{dirname}/manifest.json")
    assert manifest == (run_dir / dirname / "manifest.json").read_bytes()
    for name, entry in json.loads(manifest)["files"].items():
        data = storage.read_bytes(f"{RUN}/{dirname}/{name}")
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], name
        assert data == (run_dir / dirname / name).read_bytes(), name
    assert storage.read_bytes(f"{RUN}/config.json") == (run_dir / "config.json").read_bytes()
    assert storage.read_bytes(f"{RUN}/metrics.jsonl") == (run_dir / "metrics.jsonl").read_bytes()


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "local" / RUN


def uploader(storage: Storage, run_dir: Path, logs: list[str], **kwargs) -> CheckpointUploader:
    kwargs = {"keep_last": 3, "retry_delay": 0.05, "max_retry_delay": 0.2, **kwargs}
    return CheckpointUploader(storage, run_dir, RUN, log=logs.append, **kwargs)


# ---------------------------------------------------------------------------------------------------------------------


def test_a_generation_reaches_the_bucket_complete(storage: Storage, run_dir: Path) -> None:
    logs: list[str] = []
    with uploader(storage, run_dir, logs) as up:
        make_generation(run_dir, 1)
        up.submit(1)
        summary = up.flush(timeout=20, progress=False)
        assert summary.complete and summary.last_uploaded == 1 and summary.failures == 0
        assert summary.generations_uploaded == 1 and summary.files_uploaded == 2
        assert_bucket_holds(storage, run_dir, 1)

        make_generation(run_dir, 2)
        up.submit(2)
        summary = up.flush(timeout=20, progress=False)
        assert summary.last_uploaded == 2 and summary.generations_uploaded == 2
        assert_bucket_holds(storage, run_dir, 2)
        assert up.state == {
            "uploading_generation": None,
            "waiting_generation": None,
            "last_uploaded_generation": 2,
            "uploading_bytes_done": 0,
            "uploading_bytes_total": 0,
            "generations_uploaded": 2,
            "generations_abandoned": 0,
            "failures": 0,
        }
    assert logs == []  # routine uploads print nothing; the summary reports them
    assert "uploaded up to gen-000002" in str(summary)


def test_retention_keeps_the_newest_the_protected_and_removes_leftovers(storage: Storage, run_dir: Path) -> None:
    with uploader(storage, run_dir, [], keep_last=2) as up:
        for generation in range(1, 5):
            make_generation(run_dir, generation)
            up.submit(generation, protect={1})
            assert up.flush(timeout=20, progress=False).complete
        assert bucket_generations(storage) == [1, 3, 4]
        # The remains of an upload abandoned half-way (files, no manifest) are cleaned up too.
        storage.write_bytes(f"{RUN}/gen-000002/population.safetensors", b"partial")
        make_generation(run_dir, 5)
        up.submit(5, protect={1})
        summary = up.flush(timeout=20, progress=False)
    assert bucket_generations(storage) == [1, 4, 5]
    assert not any(key.startswith(f"{RUN}/gen-000002/") for key in storage.list(RUN))
    assert summary.generations_deleted == 3
    assert_bucket_holds(storage, run_dir, 5)


def test_latest_never_moves_backwards(storage: Storage, run_dir: Path) -> None:
    storage.write_bytes(f"{RUN}/LATEST", b"gen-000009\n")
    logs: list[str] = []
    with uploader(storage, run_dir, logs) as up:
        make_generation(run_dir, 3)
        up.submit(3)
        summary = up.flush(timeout=20, progress=False)
    assert summary.last_uploaded == 3
    assert storage.read_bytes(f"{RUN}/LATEST") == b"gen-000009\n"
    assert bucket_generations(storage) == [3]
    assert any("newer than gen-000003" in line for line in logs)


def test_a_generation_pruned_locally_meanwhile_is_skipped(storage: Storage, run_dir: Path) -> None:
    logs: list[str] = []
    with uploader(storage, run_dir, logs) as up:
        shutil.rmtree(make_generation(run_dir, 1))
        up.submit(1)
        summary = up.flush(timeout=20, progress=False)
    assert summary.complete and summary.last_uploaded is None and summary.generations_abandoned == 1
    assert storage.stat(f"{RUN}/LATEST") is None and bucket_generations(storage) == []
    assert any("gen-000001 skipped" in line for line in logs)


def test_a_fresh_uploader_skips_files_already_in_the_bucket(gcs_bucket: str, run_dir: Path) -> None:
    storage = open_storage(gcs_bucket)
    make_generation(run_dir, 1)
    with uploader(storage, run_dir, []) as up:
        up.submit(1)
        assert up.flush(timeout=20, progress=False).files_uploaded == 2
    with uploader(storage, run_dir, []) as up:  # the same run, resumed on a fresh machine
        up.submit(1)
        summary = up.flush(timeout=20, progress=False)
    assert summary.files_uploaded == 0 and summary.files_skipped == 2 and summary.last_uploaded == 1


def test_submit_never_waits_and_close_refuses_more(run_dir: Path) -> None:
    up = uploader(MemoryStorage(), run_dir, [])
    up.close()
    with pytest.raises(RuntimeError, match="closed"):
        up.submit(1)


class FlakyStorage(MemoryStorage):
    """A bucket in memory whose file uploads fail while ``down`` is set."""

    down = True

    def upload_file(self, key, path, progress=None):
        if self.down:
            raise ConnectionError("unreachable")
        return super().upload_file(key, path, progress=progress)


def test_a_failed_upload_is_retried_and_close_during_the_pause_ends_the_thread(run_dir: Path) -> None:
    storage, logs = FlakyStorage(), []
    make_generation(run_dir, 1)
    with uploader(storage, run_dir, logs) as up:
        up.submit(1)
        deadline = time.monotonic() + 10
        while up.state["failures"] < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        storage.down = False
        summary = up.flush(timeout=10, progress=False)
    assert summary.complete and summary.last_uploaded == 1 and summary.failures >= 3
    assert any("reached" in line for line in logs)

    storage.down = True
    make_generation(run_dir, 2)
    up = uploader(storage, run_dir, [], retry_delay=30, max_retry_delay=30)
    up.submit(2)
    deadline = time.monotonic() + 10
    while up.state["failures"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    started = time.monotonic()
    up.close()  # in the middle of a 30-second pause
    assert time.monotonic() - started < 1 and up.state["failures"] == 1
    assert not any(thread.name == "checkpoint-uploader" for thread in threading.enumerate())


# ---------------------------------------------------------------------------------------------------------------------
# A bucket that goes away


def test_while_the_server_is_down_the_queue_holds_one_waiting_generation(gcs_private, run_dir: Path) -> None:
    storage = open_storage(gcs_private.uri, deadline=0.3)  # short, so failures reach the uploader quickly
    logs: list[str] = []
    gcs_private.emulator.stop()
    for generation in range(1, 6):
        make_generation(run_dir, generation)
    with uploader(storage, run_dir, logs) as up:
        for generation in range(1, 6):  # a trainer much faster than the network
            started = time.monotonic()
            up.submit(generation)
            assert time.monotonic() - started < 0.1  # never waits on the network
            state = up.state
            assert state["waiting_generation"] in (generation, None)
            # an upload that failed while a newer generation waited gave way to it at once: which one is uploading
            # depends on how fast the refused connection fails, never a generation not yet submitted
            assert state["uploading_generation"] in (*range(1, generation + 1), None)
        assert up.state["waiting_generation"] in (5, None)  # one waiting at most: the others were replaced
        pending = up.flush(timeout=0.3, progress=False)
        assert not pending.complete and pending.pending == 5 and pending.last_uploaded is None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # until 5 is the one failing: every earlier one abandoned or replaced
            state = up.state
            if state["uploading_generation"] == 5 and state["failures"] >= 2:
                break
            time.sleep(0.01)
        assert state["uploading_generation"] == 5 and state["waiting_generation"] is None
        assert state["generations_abandoned"] == 4  # each of 1 to 4: failed and abandoned, or replaced waiting

        gcs_private.emulator.start()  # same port, same data
        summary = up.flush(timeout=30, progress=False)
    assert summary.complete and summary.last_uploaded == 5 and summary.generations_uploaded == 1
    assert summary.generations_abandoned == 4  # 2, 3, 4 replaced; 1 abandoned after failing
    assert_bucket_holds(storage, run_dir, 5)
    assert bucket_generations(storage) == [5]
    assert any("failed" in line for line in logs)


def test_a_server_killed_mid_upload_never_leaves_latest_on_an_incomplete_generation(gcs_private, run_dir: Path) -> None:
    storage = open_storage(gcs_private.uri, deadline=15.0)
    with uploader(storage, run_dir, []) as up:
        make_generation(run_dir, 1)
        up.submit(1)
        assert up.flush(timeout=20, progress=False).last_uploaded == 1

        gen_dir = make_generation(run_dir, 2, big_bytes=30 * MB)
        manifest = json.loads((gen_dir / "manifest.json").read_bytes())["files"]
        small = sum(entry["size"] for name, entry in manifest.items() if name != "replay.safetensors")

        violations: list[str] = []
        stop = threading.Event()
        killed = threading.Event()

        def watch() -> None:  # what a reader on another machine would see, as often as it can look
            reader = open_storage(gcs_private.uri, deadline=0.3)
            while not stop.is_set():
                try:
                    pointer = reader.read_bytes(f"{RUN}/LATEST").decode().strip()
                    listed = json.loads(reader.read_bytes(f"{RUN}/{pointer}/manifest.json"))["files"]
                    for name, entry in listed.items():
                        info = reader.stat(f"{RUN}/{pointer}/{name}")
                        if info is None or info.size != entry["size"]:
                            violations.append(f"LATEST -> {pointer} but {name} is {info}")
                except (StorageError, FileNotFoundError):
                    pass  # the server is down
                time.sleep(0.01)

        def kill_mid_upload() -> None:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                state = up.state
                if state["uploading_generation"] == 2 and state["uploading_bytes_done"] > small:
                    gcs_private.emulator.kill()  # the big file is on its way
                    killed.set()
                    time.sleep(0.3)
                    gcs_private.emulator.start()
                    return
                time.sleep(0.001)

        watcher = threading.Thread(target=watch)
        killer = threading.Thread(target=kill_mid_upload)
        watcher.start()
        killer.start()
        up.submit(2)
        killer.join()
        summary = up.flush(timeout=30, progress=False)
        stop.set()
        watcher.join()

    assert killed.is_set(), "the upload finished before the server could be killed"
    assert violations == []
    assert summary.complete and summary.last_uploaded == 2
    assert_bucket_holds(storage, run_dir, 2)
    assert bucket_generations(storage) == [1, 2]


def test_a_file_the_generation_before_already_sent_is_copied_in_the_bucket_not_sent_again(
    storage: Storage, run_dir: Path
) -> None:
    ring = {"days": torch.arange(50_000, dtype=torch.int32)}  # like a replay segment no transition reached
    logs: list[str] = []
    with uploader(storage, run_dir, logs) as up:
        for generation in (1, 2, 3):
            g = torch.Generator().manual_seed(generation)
            write_generation(
                run_dir,
                generation,
                tensors={"population": {"w": torch.randn(8, generator=g)}, "replay-000": ring},
                documents={"state": {"generation": generation}},
            )
            (run_dir / "config.json").write_text('{"seed": 5}\n')
            with open(run_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps({"generation": generation}) + "\n")
            up.submit(generation)
            summary = up.flush(progress=False)
    assert summary.files_copied == 2 and summary.files_uploaded == 3 * 3 - 2
    assert_bucket_holds(storage, run_dir, 3)
    assert "2 copied in the bucket" in str(summary)

    # A copy is an object of its own: damage to the newest generation's takes no earlier generation with it.
    key = f"{RUN}/gen-000003/replay-000.safetensors"
    data = bytearray(storage.read_bytes(key))
    data[len(data) // 2] ^= 0xFF
    storage.write_bytes(key, bytes(data))
    local = (run_dir / "gen-000003" / "replay-000.safetensors").read_bytes()
    assert storage.read_bytes(key) != local
    for generation in (1, 2):
        assert storage.read_bytes(f"{RUN}/gen-{generation:06d}/replay-000.safetensors") == local
