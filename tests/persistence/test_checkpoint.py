"""The run-directory format: round trips, completeness, safe loading, pruning and crash consistency."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from persistence import checkpoint, committing
from persistence.checkpoint import (
    FORMAT_VERSION,
    complete_generations,
    generation_dirname,
    generation_folders,
    latest_generation,
    newest_intact,
    open_generation,
    read_document,
    read_tensors,
    verify_generation,
)
from persistence.committing import prune_generations, write_generation
from utils.errors import CheckpointError, InputError

REPO_ROOT = Path(__file__).resolve().parents[2]


def _tensors(seed: int = 0) -> dict[str, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return {
        "actor": {"encoder.0.weight": torch.randn(4, 3, generator=g), "encoder.0.bias": torch.randn(4, generator=g)},
        "rng": {"evolution": g.get_state()},
    }


def _write(run_dir: Path, generation: int, seed: int = 0) -> Path:
    return write_generation(
        run_dir, generation, tensors=_tensors(seed), documents={"state": {"generation": generation, "seed": seed}}
    )


def _edit_manifest(gen_dir: Path, edit) -> None:
    path = gen_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


def _replace_file(gen_dir: Path, name: str, data: bytes) -> None:
    """Swap a file's content and record its true size and hash, as a crafted (malicious) checkpoint would."""
    (gen_dir / name).write_bytes(data)

    def edit(manifest):
        manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    _edit_manifest(gen_dir, edit)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes, so that NaN payloads and -0.0 compare exactly."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def test_generation_dirname():
    assert generation_dirname(12) == "gen-000012"
    assert generation_dirname(1234567) == "gen-1234567"
    with pytest.raises(ValueError):
        generation_dirname(-1)


def test_round_trip_of_every_dtype_and_documents(tmp_path):
    base = torch.arange(10, dtype=torch.float32)
    group = {
        "f32": torch.randn(3, 5),
        "f64": torch.randn(2, 2, dtype=torch.float64) * 1e300,
        "i64": torch.tensor([-(2**63), 2**63 - 1, 0]),
        "i32": torch.tensor([-(2**31), 7], dtype=torch.int32),
        "bool": torch.tensor([True, False, True]),
        "u8": torch.tensor([0, 255, 17], dtype=torch.uint8),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
        "transposed": torch.randn(3, 4).t(),  # not contiguous
        "special": torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0]),
        "view_a": base[0:6],  # overlapping views of one storage
        "view_b": base[4:10],
        "grad": torch.ones(2, requires_grad=True),
    }
    documents = {
        "evolution": {"elites": [3, 1], "mutation_stdev": 0.1, "tiny": 1e-300, "name": "ünï", "big": 2**70},
        "history": [[1.5, None, True], {"nested": {}}],
        "scalar": 42,
    }
    gen_dir = write_generation(tmp_path, 7, tensors={"group": group}, documents=documents)

    assert gen_dir == tmp_path / "gen-000007"
    assert (tmp_path / "LATEST").read_text() == "gen-000007\n"
    manifest = json.loads((gen_dir / "manifest.json").read_text())
    assert manifest["format_version"] == FORMAT_VERSION and manifest["generation"] == 7
    assert sorted(manifest["files"]) == ["evolution.json", "group.safetensors", "history.json", "scalar.json"]
    assert sorted(p.name for p in gen_dir.iterdir()) == sorted([*manifest["files"], "manifest.json"])

    gen = open_generation(tmp_path)
    assert gen.generation == 7 and gen.path == gen_dir
    loaded = read_tensors(gen, "group")
    assert set(loaded) == set(group)
    for key, expected in group.items():
        got = loaded[key]
        assert got.dtype == expected.dtype and got.shape == expected.shape, key
        assert got.is_contiguous() and not got.requires_grad
        assert torch.equal(_bits(got), _bits(expected.detach())), key
    subset = read_tensors(gen, "group", keys=["u8", "f32"])
    assert list(subset) == ["u8", "f32"]
    for name, document in documents.items():
        assert read_document(gen, name) == document
    assert verify_generation(gen_dir) == []


def test_generator_state_round_trips_exactly(tmp_path):
    g = torch.Generator().manual_seed(1234)
    torch.rand(17, generator=g)
    write_generation(tmp_path, 0, tensors={"rng": {"replay": g.get_state()}}, documents={})
    expected = torch.rand(100, generator=g)

    restored = torch.Generator()
    restored.set_state(read_tensors(open_generation(tmp_path), "rng")["replay"])
    assert torch.equal(torch.rand(100, generator=restored), expected)


def test_missing_group_document_or_key(tmp_path):
    _write(tmp_path, 1)
    gen = open_generation(tmp_path)
    with pytest.raises(CheckpointError, match="critic"):
        read_tensors(gen, "critic")
    with pytest.raises(CheckpointError, match="config"):
        read_document(gen, "config")
    with pytest.raises(CheckpointError, match="nope"):
        read_tensors(gen, "actor", keys=["nope"])


@pytest.mark.parametrize(
    ("documents", "where"),
    [
        ({"h": {"fitness": [1.0, float("nan")]}}, r"documents\['h'\]\['fitness'\]\[1\]"),
        ({"h": [float("inf")]}, r"documents\['h'\]\[0\]"),
        ({"h": {1: "x"}}, "JSON keys must be str"),
        ({"h": {"t": torch.tensor(1.0)}}, "Tensor"),
    ],
)
def test_document_that_json_cannot_hold_exactly_is_refused_before_writing(tmp_path, documents, where):
    with pytest.raises(ValueError, match=where):
        write_generation(tmp_path / "run", 1, tensors=_tensors(), documents=documents)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", ["", "../x", "a/b", ".hidden", "x y"])
def test_bad_group_or_document_names(tmp_path, name):
    with pytest.raises(ValueError):
        write_generation(tmp_path, 1, tensors={name: {}}, documents={})
    with pytest.raises(ValueError):
        write_generation(tmp_path, 1, tensors={}, documents={name: 1})
    with pytest.raises(ValueError, match="reserved"):
        write_generation(tmp_path, 1, tensors={}, documents={"manifest": 1})


def test_failure_while_writing_leaves_no_trace(tmp_path, monkeypatch):
    _write(tmp_path, 1)
    with pytest.raises(ValueError, match=r"not a torch\.Tensor"):
        write_generation(tmp_path, 2, tensors={"actor": {"w": [1.0]}}, documents={})

    def crash(path):
        raise KeyboardInterrupt  # as Ctrl-C after the manifest is written, before the folder is renamed

    monkeypatch.setattr(committing, "_fsync_dir", crash)
    with pytest.raises(KeyboardInterrupt):
        _write(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["LATEST", "gen-000001"]
    assert latest_generation(tmp_path) == 1


def test_rewriting_a_generation_replaces_it(tmp_path):
    _write(tmp_path, 1, seed=1)
    _write(tmp_path, 2, seed=2)
    (tmp_path / "LATEST").write_text("gen-000001\n")  # as after a crash between rename and LATEST

    _write(tmp_path, 2, seed=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["LATEST", "gen-000001", "gen-000002"]
    assert latest_generation(tmp_path) == 2
    gen = open_generation(tmp_path)
    assert read_document(gen, "state") == {"generation": 2, "seed": 3}
    assert torch.equal(read_tensors(gen, "actor")["encoder.0.bias"], _tensors(3)["actor"]["encoder.0.bias"])


def test_complete_generations_ignores_temporary_and_manifestless_folders(tmp_path):
    assert complete_generations(tmp_path / "missing") == []
    assert latest_generation(tmp_path / "missing") is None
    _write(tmp_path, 1)
    gen2 = _write(tmp_path, 2)
    # A finished temporary folder that was never renamed, and a folder whose manifest never got written.
    tmp = tmp_path / ".gen-000003.tmp-12345"
    tmp.mkdir()
    for f in gen2.iterdir():
        (tmp / f.name).write_bytes(f.read_bytes())
    _edit_manifest(tmp, lambda m: m.update(generation=3))
    no_manifest = tmp_path / "gen-000004"
    no_manifest.mkdir()
    (no_manifest / "actor.safetensors").write_bytes((gen2 / "actor.safetensors").read_bytes())
    (tmp_path / "gen-5").mkdir()  # not a canonical name
    (tmp_path / "gen-000006").write_text("a file, not a folder")
    wrong_number = tmp_path / "gen-000007"
    wrong_number.mkdir()
    for f in gen2.iterdir():
        (wrong_number / f.name).write_bytes(f.read_bytes())

    assert complete_generations(tmp_path) == [1, 2]
    assert latest_generation(tmp_path) == 2
    with pytest.raises(CheckpointError, match="manifest"):
        open_generation(tmp_path, 4)
    with pytest.raises(CheckpointError, match="says generation 2"):
        open_generation(wrong_number)
    with pytest.raises(CheckpointError, match="generation 9"):
        open_generation(tmp_path, 9)


def test_latest_generation_prefers_latest_and_falls_back(tmp_path):
    _write(tmp_path, 1)
    _write(tmp_path, 2)
    gen3 = _write(tmp_path, 3)
    assert latest_generation(tmp_path) == 3

    (tmp_path / "LATEST").write_text("gen-000002\n")  # LATEST is the commit point, even if a newer folder exists
    assert latest_generation(tmp_path) == 2
    assert open_generation(tmp_path).generation == 2

    (tmp_path / "LATEST").write_text("gen-000003\n")
    (gen3 / "manifest.json").unlink()  # LATEST names a broken generation
    assert latest_generation(tmp_path) == 2
    assert open_generation(tmp_path).generation == 2

    (tmp_path / "LATEST").write_text("garbage")
    assert latest_generation(tmp_path) == 2
    (tmp_path / "LATEST").unlink()
    assert latest_generation(tmp_path) == 2


def test_open_generation_by_run_dir_number_or_folder(tmp_path):
    with pytest.raises(CheckpointError, match="no complete"):
        open_generation(tmp_path)
    with pytest.raises(CheckpointError, match="not a directory"):
        open_generation(tmp_path / "missing")
    gen1 = _write(tmp_path, 1, seed=1)
    _write(tmp_path, 2, seed=2)
    assert open_generation(tmp_path).generation == 2
    assert open_generation(tmp_path, 1).path == gen1
    assert open_generation(gen1).generation == 1
    assert read_document(open_generation(gen1, 1), "state")["seed"] == 1
    with pytest.raises(CheckpointError, match="not 2"):
        open_generation(gen1, 2)
    # A generation folder copied under another name still opens, by its manifest.
    copy = tmp_path / "best"
    copy.mkdir()
    for f in gen1.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    assert open_generation(copy).generation == 1
    assert issubclass(CheckpointError, InputError)


def _pickle_payload(marker: Path) -> bytes:
    class Exploit:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    return pickle.dumps(Exploit())


def _torch_save_payload(marker: Path) -> bytes:
    class Exploit:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    path = marker.with_name(marker.name + ".pt")
    torch.save({"actor": Exploit()}, path)
    data = path.read_bytes()
    path.unlink()
    return data


def test_pickle_payload_really_would_run(tmp_path):
    marker = tmp_path / "proof"
    pickle.loads(_pickle_payload(marker))  # the payload used below is a real exploit
    assert marker.exists()


@pytest.mark.parametrize("make_payload", [_pickle_payload, _torch_save_payload, lambda _: os.urandom(300)])
def test_payload_that_is_not_safetensors_is_refused_and_never_unpickled(tmp_path, make_payload):
    run_dir = tmp_path / "run"
    gen_dir = _write(run_dir, 1)
    marker = tmp_path / "unpickled"
    _replace_file(gen_dir, "actor.safetensors", make_payload(marker))

    gen = open_generation(run_dir)  # sizes and manifest are consistent: the folder counts as complete
    with pytest.raises(CheckpointError, match=r"actor\.safetensors") as excinfo:
        read_tensors(gen, "actor")
    assert "not a valid safetensors" in str(excinfo.value)
    assert not marker.exists()


@pytest.mark.parametrize("name", ["../x.json", "/etc/passwd", "sub/x.json", "..", "a\\b.json", ".hidden.json", "x.pt"])
def test_manifest_naming_files_outside_the_folder_is_refused(tmp_path, name):
    gen_dir = _write(tmp_path, 1)
    _edit_manifest(gen_dir, lambda m: m["files"].update({name: {"size": 0, "sha256": "0" * 64}}))

    assert complete_generations(tmp_path) == []
    with pytest.raises(CheckpointError, match=r"manifest\.json") as excinfo:
        open_generation(gen_dir)
    assert repr(name) in str(excinfo.value)
    assert len(verify_generation(gen_dir)) == 1


def test_unknown_format_version_is_refused(tmp_path):
    gen_dir = _write(tmp_path, 1)
    _edit_manifest(gen_dir, lambda m: m.update(format_version=FORMAT_VERSION + 1))
    assert complete_generations(tmp_path) == []
    with pytest.raises(CheckpointError, match=rf"format_version {FORMAT_VERSION + 1}"):
        open_generation(gen_dir)


@pytest.mark.parametrize("content", [b"", b"not json", b"[]", b'{"format_version": 1, "generation": 1}'])
def test_malformed_manifest_is_refused(tmp_path, content):
    gen_dir = _write(tmp_path, 1)
    (gen_dir / "manifest.json").write_bytes(content)
    assert complete_generations(tmp_path) == []
    with pytest.raises(CheckpointError, match="manifest"):
        open_generation(gen_dir)


@pytest.mark.parametrize("file_name", ["actor.safetensors", "state.json"])
def test_one_flipped_byte_is_caught_and_named(tmp_path, file_name):
    gen_dir = _write(tmp_path, 1)
    path = gen_dir / file_name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))

    assert complete_generations(tmp_path) == [1]  # the cheap check does not hash
    problems = verify_generation(gen_dir)
    assert len(problems) == 1 and file_name in problems[0] and "SHA-256" in problems[0]
    gen = open_generation(tmp_path)
    with pytest.raises(CheckpointError, match=re.escape(file_name)):
        if file_name.endswith(".json"):
            read_document(gen, "state")
        else:
            read_tensors(gen, "actor")


def test_truncated_file_makes_the_generation_incomplete(tmp_path):
    _write(tmp_path, 1)
    gen_dir = _write(tmp_path, 2, seed=2)  # other bytes: not a link to generation 1
    gen = open_generation(tmp_path)
    path = gen_dir / "actor.safetensors"
    path.write_bytes(path.read_bytes()[:-5])

    assert complete_generations(tmp_path) == [1]
    assert latest_generation(tmp_path) == 1
    with pytest.raises(CheckpointError, match=r"actor\.safetensors"):
        open_generation(gen_dir)
    with pytest.raises(CheckpointError, match=r"actor\.safetensors"):
        read_tensors(gen, "actor")  # opened before the damage
    assert any("actor.safetensors" in p for p in verify_generation(gen_dir))


def test_verify_generation_reports_every_problem(tmp_path):
    gen_dir = _write(tmp_path, 1)
    assert verify_generation(gen_dir) == []
    (gen_dir / "stray.bin").write_bytes(b"x")
    (gen_dir / "state.json").unlink()
    problems = verify_generation(gen_dir)
    assert len(problems) == 2
    assert any("stray.bin" in p for p in problems) and any("state.json" in p for p in problems)
    (gen_dir / "manifest.json").unlink()
    assert len(verify_generation(gen_dir)) == 1
    assert verify_generation(tmp_path / "missing") != []


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_prune_keeps_last_protected_and_latest(tmp_path):
    for generation in range(1, 7):
        _write(tmp_path, generation)
    assert prune_generations(tmp_path, keep_last=2, protect=[2]) == [1, 3, 4]
    assert complete_generations(tmp_path) == [2, 5, 6]

    (tmp_path / "LATEST").write_text("gen-000005\n")  # as after --resume-from 5: 6 is newer than LATEST
    assert prune_generations(tmp_path, keep_last=0) == [2]
    assert complete_generations(tmp_path) == [5, 6]  # nothing at or after LATEST goes
    (tmp_path / "LATEST").write_text("gen-000006\n")
    assert prune_generations(tmp_path, keep_last=0) == [5]
    assert prune_generations(tmp_path, keep_last=0) == []  # never the only complete generation
    assert complete_generations(tmp_path) == [6]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    with pytest.raises(ValueError):
        prune_generations(tmp_path, keep_last=-1)


def test_prune_keeps_everything_while_fewer_than_keep_last_exist(tmp_path):
    _write(tmp_path, 1)
    _write(tmp_path, 2)
    assert prune_generations(tmp_path, keep_last=3) == []
    assert complete_generations(tmp_path) == [1, 2]


def test_prune_never_deletes_the_only_complete_generation_even_if_latest_is_broken(tmp_path):
    _write(tmp_path, 1)
    gen2 = _write(tmp_path, 2)
    (gen2 / "manifest.json").unlink()
    assert prune_generations(tmp_path, keep_last=0) == []
    assert complete_generations(tmp_path) == [1]
    assert gen2.exists()  # incomplete folders are left for inspection


def test_generation_folders_and_the_newest_intact_one(tmp_path):
    for generation in (1, 2, 3, 4):
        _write(tmp_path, generation, seed=generation)
    for name in ("gen-5", "gen-0000007", ".gen-000006.tmp-1", "gen-00000x"):
        (tmp_path / name).mkdir()
    (tmp_path / "gen-000008").write_text("a file, not a folder")
    (tmp_path / "gen-000009").mkdir()  # no manifest: a folder, not a complete generation
    assert [g for g, _ in generation_folders(tmp_path)] == [9, 4, 3, 2, 1]
    assert complete_generations(tmp_path) == [1, 2, 3, 4]

    (tmp_path / "gen-000004" / "actor.safetensors").write_bytes(b"truncated")  # no longer complete
    (tmp_path / "gen-000003" / "state.json").write_text('{"generation": 3, "seed": 9}')  # same size, other bytes
    assert newest_intact(tmp_path) == 2
    assert newest_intact(tmp_path, before=2) == 1
    assert newest_intact(tmp_path, before=1) is None
    assert generation_folders(tmp_path / "missing") == []


def test_prune_removes_stale_temporary_folders_only(tmp_path):
    _write(tmp_path, 1)
    dead, own, alive = _dead_pid(), os.getpid(), os.getppid()
    stale = [tmp_path / f".gen-000002.tmp-{dead}", tmp_path / f".gen-000001.old-{own}"]
    live = tmp_path / f".gen-000002.tmp-{alive}"
    for folder in [*stale, live]:
        folder.mkdir()
        (folder / "manifest.json").write_text("{}")
    (tmp_path / f".LATEST.tmp-{dead}").write_text("gen-000002\n")
    (tmp_path / f".config.json.tmp-{dead}").write_text('{"data": {"pa')  # a start killed writing config.json
    (tmp_path / "gen-000003.damaged-20250101T000000Z").mkdir()  # set aside by a resume: kept

    assert prune_generations(tmp_path, keep_last=1) == []
    kept = ["LATEST", "gen-000001", live.name, "gen-000003.damaged-20250101T000000Z"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)


_CRASH_CHILD = """
import sys
from pathlib import Path
import torch
from tests.pause_points import install
from persistence.committing import write_generation
install(sys.argv[2])
write_generation(Path(sys.argv[1]), 2, tensors={"actor": {"w": torch.ones(3)}}, documents={"state": {"seed": 2}})
"""


def test_sigkill_mid_write_leaves_the_earlier_generation_loadable(tmp_path):
    """Kill a writer at two moments at once (children run concurrently to keep the test fast)."""
    points = ["manifest-written", "renamed"]
    children = {}
    for point in points:
        run_dir = tmp_path / point
        _write(run_dir, 1, seed=1)
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        children[point] = subprocess.Popen(
            [sys.executable, "-c", _CRASH_CHILD, str(run_dir), point], env=env, cwd=REPO_ROOT
        )
    try:
        deadline = time.monotonic() + 60
        for point, child in children.items():
            marker = tmp_path / point / f".paused-{point}"
            while not marker.exists():
                assert child.poll() is None, f"writer exited with {child.returncode} before pausing at {point}"
                assert time.monotonic() < deadline, f"writer never paused at {point}"
                time.sleep(0.01)
            child.send_signal(signal.SIGKILL)
            child.wait()
    finally:
        for child in children.values():
            if child.poll() is None:
                child.kill()
                child.wait()

    # Killed after the manifest, before the rename: generation 2 does not exist.
    run_dir = tmp_path / "manifest-written"
    tmp_dir = run_dir / f".gen-000002.tmp-{children['manifest-written'].pid}"
    assert (tmp_dir / "manifest.json").exists() and not (run_dir / "gen-000002").exists()
    assert complete_generations(run_dir) == [1]
    assert latest_generation(run_dir) == 1
    gen = open_generation(run_dir)
    assert gen.generation == 1 and read_document(gen, "state") == {"generation": 1, "seed": 1}
    assert torch.equal(read_tensors(gen, "actor")["encoder.0.weight"], _tensors(1)["actor"]["encoder.0.weight"])
    assert prune_generations(run_dir, keep_last=5) == [] and not tmp_dir.exists()
    _write(run_dir, 2, seed=2)  # the resumed run writes it again
    assert latest_generation(run_dir) == 2

    # Killed after the rename, before LATEST: the folder is complete but LATEST still names generation 1.
    run_dir = tmp_path / "renamed"
    assert complete_generations(run_dir) == [1, 2]
    assert verify_generation(run_dir / "gen-000002") == []
    assert latest_generation(run_dir) == 1
    assert read_document(open_generation(run_dir), "state") == {"generation": 1, "seed": 1}


def test_writing_a_generation_leaves_no_reference_cycles(tmp_path):
    """Cyclic garbage waits for the collector and makes object counts saw-tooth; the writer leaves none."""
    import gc

    tensors = {
        "population": {"w": torch.randn(4, 3), "i": torch.arange(3)},
        "rng": {"g": torch.Generator().get_state()},
    }
    write_generation(tmp_path, 1, tensors=tensors, documents={"state": {"x": 1.5}})
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        write_generation(tmp_path, 2, tensors=tensors, documents={"state": {"x": 1.5}, "history": [{"a": 1}]})
        gc.collect()
        assert gc.garbage == []
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def _commit(run_dir: Path, generation: int, tensors: dict, *, keep_last: int = 3, protect=()) -> Path:
    """A generation written and retention applied, as the trainer does."""
    path = write_generation(run_dir, generation, tensors=tensors, documents={}, keep_last=keep_last, protect=protect)
    prune_generations(run_dir, keep_last=keep_last, protect=protect)
    return path


def _inode(gen_dir: Path, name: str = "kept.safetensors") -> int:
    return (gen_dir / name).stat().st_ino


def test_an_unchanged_file_is_linked_only_to_the_generation_retention_deletes_next(tmp_path):
    still = {"ring": torch.arange(1000.0)}
    folders = [_commit(tmp_path, g, {"kept": still, "moved": {"w": torch.full((3,), float(g))}}) for g in (1, 2, 3)]
    assert len({_inode(folder) for folder in folders}) == 3  # every kept generation holds its own copy
    first = _inode(folders[0])
    fourth = write_generation(
        tmp_path, 4, tensors={"kept": still, "moved": {"w": torch.zeros(3)}}, documents={}, keep_last=3
    )
    assert _inode(fourth) == first  # generation 1 leaves as 4 comes: its file changes hands, not written again
    assert _inode(fourth, "moved.safetensors") != _inode(folders[0], "moved.safetensors")
    assert prune_generations(tmp_path, keep_last=3) == [1]
    kept = [tmp_path / generation_dirname(g) for g in complete_generations(tmp_path)]
    assert len({_inode(folder) for folder in kept}) == 3 and (fourth / "kept.safetensors").stat().st_nlink == 1
    assert torch.equal(read_tensors(open_generation(fourth), "kept")["ring"], still["ring"])


def test_one_flipped_file_costs_one_generation(tmp_path):
    still = {"ring": torch.arange(1000.0)}
    for generation in range(1, 7):
        _commit(tmp_path, generation, {"kept": still})
    newest = tmp_path / "gen-000006" / "kept.safetensors"
    data = bytearray(newest.read_bytes())
    data[-1] ^= 0xFF
    newest.write_bytes(bytes(data))  # in place: every name of the file sees it
    assert complete_generations(tmp_path) == [4, 5, 6]
    assert [bool(verify_generation(tmp_path / generation_dirname(g))) for g in (4, 5, 6)] == [False, False, True]
    assert newest_intact(tmp_path) == 5


def test_the_champions_generation_shares_no_file(tmp_path):
    still = {"ring": torch.arange(1000.0)}
    for generation in (1, 2, 3):
        _commit(tmp_path, generation, {"kept": still}, protect={1})
    fourth = _commit(tmp_path, 4, {"kept": still}, protect={1})  # 1 stays: the champion's
    assert complete_generations(tmp_path) == [1, 2, 3, 4]
    assert len({_inode(tmp_path / generation_dirname(g)) for g in (1, 2, 3, 4)}) == 4
    assert checkpoint.verify_generation(fourth) == []


def test_without_retention_every_file_is_written(tmp_path):
    still = {"ring": torch.arange(1000.0)}
    for generation in (1, 2, 3, 4):
        write_generation(tmp_path, generation, tensors={"kept": still}, documents={})
    assert len({_inode(tmp_path / generation_dirname(g)) for g in (1, 2, 3, 4)}) == 4


def test_a_source_file_held_by_another_folder_too_is_written_anew(tmp_path):
    """A run written when each generation linked the one before: its files are shared, and are never shared more."""
    still = {"ring": torch.arange(1000.0)}
    for generation in (1, 2, 3):
        write_generation(tmp_path, generation, tensors={"kept": still}, documents={})
    os.unlink(tmp_path / "gen-000002" / "kept.safetensors")
    os.link(tmp_path / "gen-000001" / "kept.safetensors", tmp_path / "gen-000002" / "kept.safetensors")
    fourth = write_generation(tmp_path, 4, tensors={"kept": still}, documents={}, keep_last=3)
    assert _inode(fourth) not in {_inode(tmp_path / generation_dirname(g)) for g in (1, 2, 3)}


def test_a_damaged_earlier_file_is_written_anew_not_linked(tmp_path):
    still = {"ring": torch.arange(1000.0)}
    write_generation(tmp_path, 1, tensors={"kept": still}, documents={})
    damaged = tmp_path / "gen-000001" / "kept.safetensors"
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 0xFF
    damaged.write_bytes(bytes(data))  # same size: only the hash tells
    write_generation(tmp_path, 2, tensors={"kept": still}, documents={}, keep_last=1)
    assert (tmp_path / "gen-000002" / "kept.safetensors").stat().st_ino != damaged.stat().st_ino
    assert checkpoint.verify_generation(tmp_path / "gen-000002") == []


def test_a_file_written_atomically_is_the_old_one_or_the_new_one(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    committing.write_file_atomically(path, b"old\n")
    with monkeypatch.context() as patch:  # the process dies after writing the temporary, before the rename
        patch.setattr(checkpoint.os, "replace", lambda *args: (_ for _ in ()).throw(KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt):
            committing.write_file_atomically(path, b"new, longer\n")
    assert path.read_bytes() == b"old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]
    committing.write_file_atomically(path, b"new\n")
    assert path.read_bytes() == b"new\n" and [p.name for p in tmp_path.iterdir()] == ["config.json"]
    assert checkpoint.is_leftover(f".config.json.tmp-{os.getpid()}") and not checkpoint.is_leftover("config.json")


def test_a_generation_set_aside_is_kept_and_no_longer_read(tmp_path):
    for generation in (1, 2, 3):
        _write(tmp_path, generation, seed=generation)
    written = {p.name: p.read_bytes() for p in (tmp_path / "gen-000003").iterdir()}
    aside = committing.set_aside(tmp_path, 3, "20250101T000000Z")
    assert aside.name == "gen-000003.damaged-20250101T000000Z"
    assert {p.name: p.read_bytes() for p in aside.iterdir()} == written
    assert [g for g, _ in generation_folders(tmp_path)] == [2, 1] and latest_generation(tmp_path) == 2
    _write(tmp_path, 3, seed=9)  # the generation written again under its number
    assert committing.set_aside(tmp_path, 3, "20250101T000000Z").name == "gen-000003.damaged-20250101T000000Z-2"
    assert prune_generations(tmp_path, keep_last=0) == [1]
    assert sorted(p.name for p in tmp_path.glob("gen-*")) == [
        "gen-000002",
        "gen-000003.damaged-20250101T000000Z",
        "gen-000003.damaged-20250101T000000Z-2",
    ]
