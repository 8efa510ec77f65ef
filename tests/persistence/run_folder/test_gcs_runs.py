"""Runs whose checkpoints live in a bucket, against a real GCS emulator (fake-gcs-server on 127.0.0.1)."""

import shutil
from pathlib import Path

import pytest

import main
from config import override, preset
from persistence import checkpoint
from persistence.gcs import open_storage
from persistence.run_folder import bucket
from run.launch import start_run
from tests.run_checks import deterministic, rows, state_digest

pytestmark = pytest.mark.slow  # each test trains and uploads runs through the GCS emulator


def train(*args: str) -> int:
    return main.main([*args, "--preset", "smoke", "--seed", "5", "--no-progress"])


def bucket_matches_local(uri: str, run_dir: Path) -> int:
    """The bucket's LATEST generation, after checking its manifest and files equal the local ones."""
    storage = open_storage(uri)
    generation = bucket.latest_in_bucket(storage, run_dir.name)
    gen_dir = run_dir / checkpoint.generation_dirname(generation)
    for path in gen_dir.iterdir():
        assert storage.read_bytes(f"{run_dir.name}/{gen_dir.name}/{path.name}") == path.read_bytes(), path.name
    return generation


def test_train_upload_wipe_and_resume_from_the_bucket_is_bit_exact(gcs_bucket, tmp_path):
    assert train("--checkpoint-uri", str(tmp_path / "reference"), "--run-name", "r", "--generations", "4") == 0
    reference = tmp_path / "reference" / "r"

    local = tmp_path / "pod-1"
    assert (
        train("--checkpoint-uri", gcs_bucket, "--local-dir", str(local), "--run-name", "r", "--generations", "2") == 0
    )
    assert bucket_matches_local(gcs_bucket, local / "r") == 2
    shutil.rmtree(local)  # the pod and its disk are gone

    fresh = tmp_path / "pod-2"
    resumed = ["--resume", "--checkpoint-uri", gcs_bucket, "--local-dir", str(fresh), "--generations", "4"]
    assert main.main([*resumed, "--no-progress"]) == 0
    assert state_digest(fresh / "r") == state_digest(reference)
    assert [deterministic(r) for r in rows(fresh / "r")] == [deterministic(r) for r in rows(reference)]
    assert bucket_matches_local(gcs_bucket, fresh / "r") == 4


def test_training_goes_on_while_the_bucket_is_down_and_catches_up(gcs_private, tmp_path):
    gcs_emulator, gcs_bucket = gcs_private
    config = override(
        preset("smoke"),
        {
            "checkpoint.uri": gcs_bucket,
            "checkpoint.local_dir": str(tmp_path),
            "checkpoint.run_name": "r",
            "runtime.generations": 6,
        },
    )
    run = start_run(config, log=lambda line: None)
    finished_while_down = []

    def on_generation(row):
        if row["generation"] == 1:
            run.uploader.flush(progress=False)
            gcs_emulator.stop()
        elif not gcs_emulator.running:
            finished_while_down.append(row["generation"])
            if row["generation"] == 4:
                gcs_emulator.restart()

    run.trainer.run(until=6, on_generation=on_generation)
    assert finished_while_down == [2, 3, 4]  # the loop never waited for the bucket
    run.finish(progress=False)
    assert bucket_matches_local(gcs_bucket, run.trainer.run_dir) == 6
    storage = open_storage(gcs_bucket)
    kept = sorted({key.split("/")[1] for key in storage.list("r/") if key.split("/")[1].startswith("gen-")})
    assert "gen-000006" in kept and len(kept) <= config.checkpoint.keep_last + 1  # retention, plus the champion's


def test_a_missing_bucket_is_one_line_before_anything_is_written(gcs_emulator, tmp_path, capsys):
    uri = "gs://no-such-bucket-here/runs"
    code = main.main(["--checkpoint-uri", uri, "--local-dir", str(tmp_path / "local"), "--preset", "smoke"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and "no-such-bucket-here" in err
    assert not (tmp_path / "local").exists()


def test_inspect_and_export_read_from_the_bucket_without_the_replay_ring(gcs_bucket, tmp_path, capsys):
    local = tmp_path / "local"
    assert train("--checkpoint-uri", gcs_bucket, "--local-dir", str(local), "--run-name", "r") == 0
    capsys.readouterr()
    assert main.main(["inspect", f"{gcs_bucket}/r", "--json"]) == 0
    import json

    report = json.loads(capsys.readouterr().out)
    assert report["generation"] == 3 and report["complete"] is True
    local_report_code = main.main(["inspect", str(local / "r"), "--json"])
    assert local_report_code == 0
    assert json.loads(capsys.readouterr().out)["params_sha256"] == report["params_sha256"]
    assert main.main(["export", f"{gcs_bucket}/r", str(tmp_path / "exported")]) == 0
    assert (tmp_path / "exported" / "actor.safetensors").exists()


def test_evaluate_reads_a_run_and_an_export_from_the_bucket(gcs_bucket, tmp_path, monkeypatch):
    import json

    local = tmp_path / "local"
    assert train("--checkpoint-uri", gcs_bucket, "--local-dir", str(local), "--run-name", "r") == 0
    monkeypatch.chdir(tmp_path)
    assert main.main(["evaluate", f"{gcs_bucket}/r", "--json"]) == 0
    from_bucket = json.loads((tmp_path / "evaluation-r-gen-000003" / "evaluation.json").read_text())
    assert main.main(["evaluate", str(local / "r"), "--out", str(tmp_path / "local-report")]) == 0
    from_disk = json.loads((tmp_path / "local-report" / "evaluation.json").read_text())
    assert from_bucket["ranges"] == from_disk["ranges"]
    assert from_bucket["diagnostics"] == from_disk["diagnostics"]  # the same history, read from the bucket

    assert main.main(["export", str(local / "r"), str(tmp_path / "actor")]) == 0
    storage = open_storage(gcs_bucket)
    for path in (tmp_path / "actor").iterdir():
        storage.upload_file(f"actor/{path.name}", path)
    assert main.main(["evaluate", f"{gcs_bucket}/actor", "--out", str(tmp_path / "export-report")]) == 0
    from_export = json.loads((tmp_path / "export-report" / "evaluation.json").read_text())
    assert from_export["ranges"] == from_disk["ranges"] and from_export["source"]["kind"] == "export"
    assert from_export["diagnostics"]["pbo_reading"] == "PBO n/a (an export has no run history)"


def test_the_pod_template_variable_names_the_bucket(gcs_bucket, tmp_path, monkeypatch):
    monkeypatch.setenv("ERL_CHECKPOINT_URI", gcs_bucket)
    monkeypatch.chdir(tmp_path)
    assert main.main(["--preset", "smoke", "--generations", "1", "--run-name", "r", "--no-progress"]) == 0
    assert bucket_matches_local(gcs_bucket, tmp_path / "runs" / "r") == 1  # local copy under the default runs/


def test_resume_or_start_starts_then_resumes_from_the_bucket_on_a_new_pod(gcs_bucket, tmp_path):
    command = ["--checkpoint-uri", gcs_bucket, "--run-name", "r", "--resume-or-start"]
    assert train(*command, "--local-dir", str(tmp_path / "pod-1"), "--generations", "1") == 0
    assert train(*command, "--local-dir", str(tmp_path / "pod-2"), "--generations", "2") == 0  # its disk is empty
    first, resumed = rows(tmp_path / "pod-1" / "r"), rows(tmp_path / "pod-2" / "r")
    assert [row["generation"] for row in resumed] == [1, 2]
    assert deterministic(resumed[0]) == deterministic(first[0])  # generation 1 came from the bucket
    assert bucket_matches_local(gcs_bucket, tmp_path / "pod-2" / "r") == 2
