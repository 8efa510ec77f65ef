"""The pod's start command heals itself: with --fall-back, a damaged newest generation is set aside (never deleted or
written over) and the run continues from the newest intact one, locally and with a bucket, saying so in one line."""

import shutil
from pathlib import Path

import pytest

import main
from persistence import checkpoint
from persistence.gcs import open_storage
from persistence.run_folder import bucket
from tests.run_checks import rows

TRAIN = ["--preset", "smoke", "--seed", "3", "--no-progress", "--device", "cpu"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A 3-generation run, to copy and damage."""
    root = tmp_path_factory.mktemp("trained")
    assert main.main([*TRAIN, "--checkpoint-uri", str(root), "--run-name", "r"]) == 0
    return root / "r"


@pytest.fixture
def run(trained, tmp_path) -> Path:
    shutil.copytree(trained, tmp_path / "runs" / "r")
    return tmp_path / "runs" / "r"


def flip_byte(path: Path) -> None:
    """Damage a file as a bad disk does: same size, one byte different, its manifest unchanged."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def tensors(gen_dir: Path) -> dict[str, bytes]:
    """The bytes of a generation's tensor files (its documents hold timings)."""
    return {name: data for name, data in files(gen_dir).items() if name.endswith(".safetensors")}


def pod_start(run_dir: Path, capsys, *extra: str) -> tuple[int, str, str]:
    """The pod's start command on ``run_dir``'s location; its exit status, stdout and stderr."""
    capsys.readouterr()
    args = [*TRAIN, "--checkpoint-uri", str(run_dir.parent), "--run-name", run_dir.name, "--resume-or-start"]
    code = main.main([*args, *extra])
    out, err = capsys.readouterr()
    return code, out, err.strip()


def lines_naming(text: str, phrase: str) -> list[str]:
    return [line for line in text.splitlines() if phrase in line]


def test_the_start_command_refuses_a_damaged_generation_and_says_how_it_can_go_on(run, capsys):
    flip_byte(run / "gen-000003" / "population.safetensors")
    before = files(run)
    code, _, err = pod_start(run, capsys)
    assert code == 2 and len(err.splitlines()) == 1
    assert "population.safetensors" in err and "SHA-256" in err
    assert "--fall-back" in err  # a flag the start command accepts, unlike --resume-from
    assert files(run) == before


@pytest.mark.slow
def test_the_start_command_with_fall_back_continues_from_the_newest_intact_generation(run, trained, capsys):
    flip_byte(run / "gen-000003" / "replay-000.safetensors")
    damaged = files(run / "gen-000003")
    code, out, err = pod_start(run, capsys, "--fall-back", "--generations", "4")
    assert code == 0, err

    [line] = lines_naming(out, "set aside")  # one line names what it passed over and where it went
    [aside] = run.glob("gen-000003.damaged-*")
    assert "gen-000003" in line and aside.name in line and "continuing from generation 2" in line
    assert files(aside) == damaged  # kept byte for byte, neither deleted nor written over
    assert checkpoint.verify_generation(run / "gen-000003") == []  # written again, the same as before the damage
    assert tensors(run / "gen-000003") == tensors(trained / "gen-000003")
    assert [row["generation"] for row in rows(run)] == [1, 2, 3, 4]
    assert (run / "LATEST").read_text() == "gen-000004\n"

    # The next pre-emption: the same command resumes as usual, with nothing to pass over; retention goes on
    # (keep_last 3 and the champion's) and never touches a folder set aside.
    code, out, err = pod_start(run, capsys, "--fall-back", "--generations", "6")
    assert code == 0, err
    assert not lines_naming(out, "set aside") and "resumed" in out
    assert checkpoint.latest_generation(run) == 6 and len(checkpoint.complete_generations(run)) <= 4
    assert list(run.glob("gen-*.damaged-*")) == [aside] and files(aside) == damaged


def test_fall_back_passes_over_every_damaged_generation_and_names_each(run, capsys):
    flip_byte(run / "gen-000003" / "state.json")
    (run / "gen-000002" / "manifest.json").unlink()
    code, out, err = main_resume(run, capsys, "--fall-back")
    assert code == 0, err
    [line] = lines_naming(out, "set aside")
    assert "gen-000003" in line and "gen-000002" in line and "continuing from generation 1" in line
    assert len(list(run.glob("gen-000003.damaged-*"))) == len(list(run.glob("gen-000002.damaged-*"))) == 1
    assert [row["generation"] for row in rows(run)] == [1, 2, 3]


def test_fall_back_with_no_intact_generation_refuses_and_sets_nothing_aside(run, capsys):
    for gen_dir in run.glob("gen-*"):
        flip_byte(gen_dir / "population.safetensors")
    before = files(run)
    code, _, err = pod_start(run, capsys, "--fall-back")
    assert code == 2 and len(err.splitlines()) == 1
    assert "population.safetensors" in err and "none of the 3 generation folders" in err
    assert files(run) == before


def main_resume(run_dir: Path, capsys, *extra: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main.main([*TRAIN, "--resume", "--checkpoint-uri", str(run_dir.parent), *extra])
    out, err = capsys.readouterr()
    return code, out, err.strip()


@pytest.mark.parametrize(
    ("extra", "phrase"),
    [
        (["--run-name", "r", "--fall-back"], "--fall-back needs --resume"),
        (["--resume", "--resume-from", "2", "--fall-back"], "not both"),
    ],
)
def test_fall_back_goes_with_a_resume(tmp_path, capsys, extra, phrase):
    capsys.readouterr()
    assert main.main([*TRAIN, "--checkpoint-uri", str(tmp_path), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and phrase in err
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------------------------------
# With a bucket (the GCS emulator)


def bucket_files(uri: str, prefix: str) -> dict[str, bytes]:
    storage = open_storage(uri)
    return {key: storage.read_bytes(key) for key in storage.list(prefix)}


@pytest.mark.slow
def test_a_new_pod_falls_back_past_a_generation_damaged_in_the_bucket(gcs_bucket, tmp_path, capsys):
    first = tmp_path / "pod-1" / "r"
    command = [*TRAIN, "--checkpoint-uri", gcs_bucket, "--local-dir", str(first.parent), "--run-name", "r"]
    # Two runs, each flushing its last generation: the uploader may skip a generation a newer one replaced while it
    # waited, so one 3-generation run leaves generation 2 in the bucket or not, as timing has it.
    assert main.main([*command, "--resume-or-start", "--generations", "2"]) == 0
    assert main.main([*command, "--resume-or-start", "--generations", "3"]) == 0
    storage = open_storage(gcs_bucket)
    assert {2, 3} <= set(bucket.generation_folders(storage, "r"))
    key = "r/gen-000003/population.safetensors"
    data = bytearray(storage.read_bytes(key))
    data[len(data) // 2] ^= 0xFF
    storage.write_bytes(key, bytes(data))  # the bucket's newest generation no longer matches its manifest
    in_bucket = bucket_files(gcs_bucket, "r/")
    original = tensors(first / "gen-000003")
    shutil.rmtree(first.parent)  # the pod and its disk are gone

    fresh = tmp_path / "pod-2" / "r"
    command = [*TRAIN, "--checkpoint-uri", gcs_bucket, "--local-dir", str(fresh.parent), "--run-name", "r"]
    capsys.readouterr()
    assert main.main([*command, "--resume-or-start"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not verify" in err and "--fall-back" in err
    assert bucket_files(gcs_bucket, "r/") == in_bucket  # a refusal changes nothing in the bucket
    assert not list(fresh.glob("gen-*")) and not list(fresh.glob(".gen-*"))

    assert main.main([*command, "--resume-or-start", "--fall-back", "--generations", "4"]) == 0
    out = capsys.readouterr().out
    [line] = lines_naming(out, "set aside")
    assert f"{gcs_bucket}/r/gen-000003" in line and "continuing from generation 2" in line
    [aside] = {key.split("/")[1] for key in storage.list("r/") if ".damaged-" in key}
    assert aside in line
    kept = {
        key.replace(f"r/{aside}/", "r/gen-000003/"): data
        for key, data in bucket_files(gcs_bucket, f"r/{aside}").items()
    }
    assert kept == {key: data for key, data in in_bucket.items() if key.startswith("r/gen-000003/")}  # byte for byte
    assert bucket.latest_in_bucket(storage, "r") == 4
    for name, data in tensors(fresh / "gen-000003").items():  # written again, as it was before the damage
        assert data == original[name] == storage.read_bytes(f"r/gen-000003/{name}"), name
    assert checkpoint.verify_generation(fresh / "gen-000003") == []
    assert [row["generation"] for row in rows(fresh)] == [1, 2, 3, 4]


@pytest.mark.slow
def test_a_generation_damaged_only_on_the_pod_is_taken_again_from_the_bucket(gcs_bucket, tmp_path, capsys):
    local = tmp_path / "pod" / "r"
    command = [*TRAIN, "--checkpoint-uri", gcs_bucket, "--local-dir", str(local.parent), "--run-name", "r"]
    assert main.main(command) == 0
    flip_byte(local / "gen-000003" / "population.safetensors")
    damaged = files(local / "gen-000003")
    in_bucket = bucket_files(gcs_bucket, "r/")

    capsys.readouterr()
    assert main.main([*command, "--resume-or-start", "--fall-back", "--generations", "3"]) == 0
    out = capsys.readouterr().out
    [line] = lines_naming(out, "set aside")
    assert "continuing from generation 3 (downloaded from the bucket)" in line
    [aside] = local.glob("gen-000003.damaged-*")
    assert files(aside) == damaged
    assert checkpoint.verify_generation(local / "gen-000003") == []
    assert bucket_files(gcs_bucket, "r/") == in_bucket  # the bucket's copy was intact: nothing there changed
