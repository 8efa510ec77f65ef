"""One damaged file costs one generation: whichever file of the newest generation is flipped, every other kept
generation still verifies and the run continues from the one before, bit for bit as if never interrupted. The replay
buffer's unchanged segments are hard links only to the generation retention deletes as the new one is committed, so
no two kept generations share a file."""

import os
import shutil
from pathlib import Path

import pytest

import main
from persistence import checkpoint, committing
from tests.run_checks import deterministic, rows, state_digest

pytestmark = pytest.mark.slow  # each test damages a run's file and resumes it in a process of its own

# A ring of 800 transitions in 16 segments of 50 rows: a smoke generation stores 168 transitions, so the first
# segments hold the same bytes from generation 1 to generation 4.
TRAIN = ["--preset", "smoke", "--seed", "3", "--no-progress", "--device", "cpu", "--set", "learner.buffer_size=800"]
SEGMENT = "replay-000.safetensors"
FILES = [
    "population.safetensors",
    "rng.safetensors",
    "selection.safetensors",
    "replay.safetensors",
    SEGMENT,
    "state.json",
    "history.json",
    "manifest.json",
]


def start(root: Path, name: str, generations: int) -> None:
    command = [*TRAIN, "--checkpoint-uri", str(root), "--run-name", name, "--generations", str(generations)]
    assert main.main(command) == 0


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, list[tuple[Path, Path]]]:
    """A 4-generation run (2, 3 and 4 kept), and each (source, target) the writer hard-linked."""
    root = tmp_path_factory.mktemp("trained")
    links = []
    linked = committing._linked

    def recording(source: Path | None, target: Path) -> bool:
        done = linked(source, target)
        if done:
            links.append((source, target))
        return done

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(committing, "_linked", recording)
        start(root, "r", 4)
    return root / "r", links


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The same run trained to generation 5 without a break."""
    root = tmp_path_factory.mktemp("reference")
    start(root, "r", 5)
    return root / "r"


@pytest.fixture
def run(trained, tmp_path) -> Path:
    """A private copy of the trained run, to damage: files that are one under several names stay so."""
    source, target = trained[0], tmp_path / "runs" / "r"
    copied: dict[int, Path] = {}
    target.mkdir(parents=True)
    for path in sorted(source.rglob("*")):
        place = target / path.relative_to(source)
        if path.is_dir():
            place.mkdir(parents=True)
        elif path.stat().st_ino in copied:
            os.link(copied[path.stat().st_ino], place)
        else:
            shutil.copy2(path, place)
            copied[path.stat().st_ino] = place
    return target


def flip_byte(path: Path) -> None:
    """Damage a file as a bad disk or an edit in place does: same size, same inode, one byte different."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    with open(path, "r+b") as f:
        f.write(data)


def gen_dir(run_dir: Path, generation: int) -> Path:
    return run_dir / checkpoint.generation_dirname(generation)


def resume(run_dir: Path, capsys, *extra: str) -> str:
    capsys.readouterr()
    command = [*TRAIN, "--resume", "--checkpoint-uri", str(run_dir.parent), "--run-name", run_dir.name, *extra]
    code = main.main([*command, "--generations", "5"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_unchanged_segments_are_reused_yet_no_kept_generation_shares_a_file(trained):
    run_dir, links = trained
    manifests = {g: checkpoint.read_manifest(gen_dir(run_dir, g)).manifest["files"] for g in (2, 3, 4)}
    # The rule before linked these to generation 3's files (and 3's to 2's): one flipped byte took all three.
    unchanged = [name for name, entry in manifests[4].items() if manifests[3].get(name) == entry]
    assert SEGMENT in unchanged
    # Still not written again: linked to generation 1's file, which retention deleted right after.
    assert (gen_dir(run_dir, 1) / SEGMENT, SEGMENT) in {(source, target.name) for source, target in links}
    assert all(source.parent.name == "gen-000001" and ".gen-000004.tmp-" in str(target) for source, target in links)
    assert checkpoint.complete_generations(run_dir) == [2, 3, 4]
    for name in manifests[4]:
        stats = [(gen_dir(run_dir, g) / name).stat() for g in (2, 3, 4) if name in manifests[g]]
        assert len({st.st_ino for st in stats}) == len(stats) and all(st.st_nlink == 1 for st in stats), name


@pytest.mark.parametrize("name", FILES)
def test_one_damaged_file_of_the_newest_generation_costs_that_generation_alone(run, reference, capsys, name):
    flip_byte(gen_dir(run, 4) / name)
    assert checkpoint.verify_generation(gen_dir(run, 4)) != []
    assert checkpoint.verify_generation(gen_dir(run, 3)) == []
    assert checkpoint.verify_generation(gen_dir(run, 2)) == []
    assert checkpoint.newest_intact(run) == 3

    out = resume(run, capsys, "--fall-back")
    assert "continuing from generation 3" in out and len(list(run.glob("gen-000004.damaged-*"))) == 1
    assert state_digest(run) == state_digest(reference)
    assert [deterministic(row) for row in rows(run)] == [deterministic(row) for row in rows(reference)]


def test_resume_from_the_generation_before_a_damaged_segment_is_bit_for_bit(run, reference, capsys):
    flip_byte(gen_dir(run, 4) / SEGMENT)
    resume(run, capsys, "--resume-from", "3")
    assert checkpoint.verify_generation(gen_dir(run, 4)) == []  # written again
    assert state_digest(run) == state_digest(reference)
    assert [deterministic(row) for row in rows(run)] == [deterministic(row) for row in rows(reference)]
