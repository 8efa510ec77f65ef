"""--resume on damaged or hostile checkpoints: one line naming the file, exit status 2, nothing executed
or overwritten, and the newest intact generation offered."""

import hashlib
import json
import pickle
import shutil
from pathlib import Path

import pytest

import main
from persistence import checkpoint


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("trained")
    args = ["--preset", "smoke", "--checkpoint-uri", str(root), "--run-name", "r", "--no-progress"]
    assert main.main(args) == 0
    return root


@pytest.fixture
def run(trained, tmp_path) -> Path:
    """A private copy of the trained run, to damage."""
    shutil.copytree(trained, tmp_path / "runs")
    return tmp_path / "runs" / "r"


def resume(run_dir: Path, capsys, *extra: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main.main(["--resume", "--checkpoint-uri", str(run_dir.parent), "--no-progress", *extra])
    return code, capsys.readouterr().err.strip()


def snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def rewrite_manifest(gen_dir: Path, change) -> None:
    path = gen_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


def refresh_hash(gen_dir: Path, name: str) -> None:
    """Make the manifest vouch for the file as it is now (what an attacker with write access would do)."""
    data = (gen_dir / name).read_bytes()

    def change(manifest):
        manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    rewrite_manifest(gen_dir, change)


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def assert_refused(code: int, err: str, *phrases: str) -> None:
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    for phrase in phrases:
        assert phrase in err, err


def test_a_pickle_in_place_of_tensors_is_never_executed(run, capsys, tmp_path):
    gen3 = run / "gen-000003"
    marker = tmp_path / "pwned"
    (gen3 / "population.safetensors").write_bytes(pickle.dumps(_Payload(marker)))
    refresh_hash(gen3, "population.safetensors")
    before = snapshot(run)
    code, err = resume(run, capsys)
    assert_refused(code, err, "population.safetensors", "--resume-from 2")
    assert not marker.exists()
    assert snapshot(run) == before


def test_a_flipped_byte_is_caught_before_parsing(run, capsys):
    path = run / "gen-000003" / "replay-000.safetensors"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    before = snapshot(run)
    code, err = resume(run, capsys)
    assert_refused(code, err, "replay-000.safetensors", "SHA-256", "--resume-from 2")
    assert snapshot(run) == before


def test_a_truncated_file_is_reported_not_skipped(run, capsys):
    path = run / "gen-000003" / "population.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    code, err = resume(run, capsys)
    assert_refused(code, err, "population.safetensors", "--resume-from 2")


def test_a_manifest_pointing_outside_its_folder(run, capsys):
    def change(manifest):
        manifest["files"]["../config.json"] = manifest["files"].pop("state.json")

    rewrite_manifest(run / "gen-000003", change)
    code, err = resume(run, capsys)
    assert_refused(code, err, "manifest.json", "--resume-from 2")


def test_an_unknown_format_version(run, capsys):
    rewrite_manifest(run / "gen-000003", lambda manifest: manifest.update(format_version=99))
    code, err = resume(run, capsys)
    assert_refused(code, err, "manifest.json", "99", "--resume-from 2")


def test_shapes_that_do_not_fit_the_config(run, capsys):
    gen3 = run / "gen-000003"
    state = json.loads((gen3 / "state.json").read_text())
    state["config"]["model"]["embedding"] += 1
    (gen3 / "state.json").write_text(json.dumps(state))
    refresh_hash(gen3, "state.json")
    code, err = resume(run, capsys)
    assert_refused(code, err, "population.safetensors", "does not fit")


@pytest.mark.slow
def test_the_config_comes_from_the_checkpoint_so_an_extension_survives_the_next_resume(run, capsys):
    code, err = resume(run, capsys, "--generations", "5")
    assert code == 0, err
    shutil.rmtree(run / "gen-000005")  # as if the pod died while writing generation 5
    (run / "LATEST").write_text("gen-000004\n")
    code, err = resume(run, capsys)  # no --generations: generation 4 knows the run now ends at 5
    assert code == 0, err
    assert checkpoint.latest_generation(run) == 5


def test_taking_the_offer_continues_from_the_intact_generation(run, capsys):
    path = run / "gen-000003" / "replay-000.safetensors"
    path.write_bytes(b"\0" * path.stat().st_size)
    damaged = snapshot(run / "gen-000003")
    code, err = resume(run, capsys, "--resume-from", "2", "--generations", "4")
    assert code == 0, err
    assert checkpoint.latest_generation(run) == 4
    assert checkpoint.verify_generation(run / "gen-000003") == []  # written again, not left damaged
    [aside] = run.glob("gen-000003.damaged-*")  # and the damaged folder kept, not written over
    assert snapshot(aside) == damaged
    assert [json.loads(line)["generation"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [
        1,
        2,
        3,
        4,
    ]


def test_a_generation_folder_without_its_manifest_is_refused_not_written_over(run, capsys):
    """The writer renames a folder into place only with its manifest inside: one without it lost it since."""
    (run / "gen-000003" / "manifest.json").unlink()
    (run / "LATEST").write_text("gen-000003\n")
    before = snapshot(run)
    code, err = resume(run, capsys, "--generations", "3")
    assert_refused(code, err, "gen-000003", "manifest.json", "--fall-back", "--resume-from 2")
    assert snapshot(run) == before


@pytest.mark.parametrize(
    "how",
    [
        ["--run-name", "r"],  # a fresh start of the same name
        ["--resume-or-start", "--run-name", "r"],
        ["--resume-or-start", "--run-name", "r", "--fall-back"],
        ["--resume"],
        ["--resume", "--run-name", "r", "--fall-back"],
    ],
)
def test_generation_folders_whose_manifests_are_gone_are_never_written_over(run, capsys, how):
    """A partial copy, or a wiped disk that kept some files: no start begins again from generation 0 over them."""
    for gen_dir in run.glob("gen-*"):
        (gen_dir / "manifest.json").unlink()
    before = snapshot(run)
    capsys.readouterr()
    code = main.main(["--preset", "smoke", "--checkpoint-uri", str(run.parent), "--no-progress", *how])
    err = capsys.readouterr().err.strip()
    assert_refused(
        code, err, "manifest.json", "none of the 3 generation folders", "start the run again from generation 0"
    )
    assert snapshot(run) == before


def test_resume_from_a_generation_that_does_not_exist(run, capsys):
    code, err = resume(run, capsys, "--resume-from", "9")
    assert_refused(code, err, "no complete generation 9")


def edit_document(gen_dir: Path, name: str, change) -> None:
    """Change a JSON document and make the manifest vouch for it (a hand edit the hashes cannot catch)."""
    path = gen_dir / f"{name}.json"
    document = json.loads(path.read_text())
    document = change(document) or document
    path.write_text(json.dumps(document))
    refresh_hash(gen_dir, f"{name}.json")


@pytest.mark.parametrize(
    ("name", "change", "phrase"),
    [
        *[
            ("state", lambda s, key=key, value=value: s.update({key: value}), key)
            for key, value in [
                ("generation", "3"),
                ("champion_score", [1.0]),
                ("champion_generation", None),
                ("champion_bound", "0.1"),
                ("optimiser_steps", 1.5),
                ("optimiser_steps", {"actor": True}),
                ("market_fingerprint", 7),
                ("tickers", "AAPL"),
                ("splits", []),
                ("config", "smoke"),
                ("device", "cpu"),  # optional (earlier versions lack it), but a dict when present
            ]
        ],
        ("state", lambda s: s.__delitem__("optimiser_steps"), "optimiser_steps"),
        ("state", lambda s: s.__delitem__("champion_bound"), "champion_bound"),
        ("state", lambda s: s.update(tickers=[1, 2]), "tickers"),
        ("state", lambda s: [s], "not an object"),
        ("history", lambda h: {"rows": h}, "not a list"),
        ("history", lambda h: [*h[:-1], 3], "row 2"),
        ("history", lambda h: [{**h[0], "generation": "1"}, *h[1:]], "row 0"),
    ],
)
def test_documents_with_values_of_the_wrong_type_are_refused(run, capsys, name, change, phrase):
    edit_document(run / "gen-000003", name, change)
    before = snapshot(run)
    code, err = resume(run, capsys)
    assert_refused(code, err, f"{name}.json", phrase, "--resume-from 2")
    assert snapshot(run) == before


def test_a_state_that_names_another_generation_than_its_folder(run, capsys):
    edit_document(run / "gen-000003", "state", lambda s: s.update(generation=2))
    code, err = resume(run, capsys)
    assert_refused(code, err, "state.json", "generation 2", "folder is generation 3", "--resume-from 2")


def test_a_generation_folder_that_is_a_link_is_refused(run, capsys, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    shutil.move(run / "gen-000003", elsewhere)
    (run / "gen-000003").symlink_to(elsewhere, target_is_directory=True)
    before = snapshot(run)
    code, err = resume(run, capsys, "--generations", "5")
    assert_refused(code, err, "gen-000003", "symbolic link", "--resume-from 2")
    assert snapshot(run) == before
    assert elsewhere.is_dir() and (run / "gen-000003").is_symlink()


def test_a_run_folder_that_is_a_link_is_neither_resumed_nor_started_into(run, capsys, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    shutil.move(run, elsewhere)
    run.symlink_to(elsewhere, target_is_directory=True)
    before = snapshot(elsewhere)
    code, err = resume(run, capsys, "--run-name", "r", "--generations", "5")
    assert_refused(code, err, "symbolic link")
    capsys.readouterr()
    code = main.main(["--preset", "smoke", "--checkpoint-uri", str(run.parent), "--run-name", "r", "--no-progress"])
    assert_refused(code, capsys.readouterr().err.strip(), "not a run folder")
    assert snapshot(elsewhere) == before
