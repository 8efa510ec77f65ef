"""The storage contract, for GCS (a real fake-gcs-server) and the tests' in-memory bucket, plus GCS retries and
error messages."""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest

from persistence.gcs import EMULATOR_ENV, GCSStorage, open_storage
from persistence.storage import PreconditionFailed, Storage, parse_uri
from tests.gcs_server import LossyProxy, StubServer, free_port
from utils.errors import ConfigError, InputError, StorageError

MiB = 1024 * 1024


def _leftovers(folder: Path, keep: str) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name != keep)


# ---------------------------------------------------------------------------------------------------------------------
# The contract, for both backends


def test_bytes_round_trip_and_missing_objects(storage: Storage) -> None:
    storage.write_bytes("run-1/gen-000001/manifest.json", b'{"a": 1}')
    assert storage.read_bytes("run-1/gen-000001/manifest.json") == b'{"a": 1}'
    storage.write_bytes("run-1/gen-000001/manifest.json", b"")
    assert storage.read_bytes("run-1/gen-000001/manifest.json") == b""
    with pytest.raises(FileNotFoundError):
        storage.read_bytes("run-1/nope")
    assert storage.stat("run-1/nope") is None


def test_stat_reports_size_time_and_a_version_that_changes_on_every_write(storage: Storage) -> None:
    storage.write_bytes("LATEST", b"gen-000001\n")
    first = storage.stat("LATEST")
    assert first.size == 11
    assert isinstance(first.updated, datetime) and first.updated.tzinfo is not None
    storage.write_bytes("LATEST", b"gen-000002\n")
    second = storage.stat("LATEST")
    assert second.version != first.version
    storage.write_bytes("LATEST", b"gen-000002\n")  # same bytes: still a new version
    assert storage.stat("LATEST").version not in (first.version, second.version)


def test_conditional_writes_are_compare_and_swap(storage: Storage) -> None:
    storage.write_bytes("r/LATEST", b"gen-000001\n", if_version_match=0)
    with pytest.raises(PreconditionFailed):
        storage.write_bytes("r/LATEST", b"gen-000009\n", if_version_match=0)
    assert storage.read_bytes("r/LATEST") == b"gen-000001\n"

    seen = storage.stat("r/LATEST").version
    storage.write_bytes("r/LATEST", b"gen-000002\n", if_version_match=seen)
    with pytest.raises(PreconditionFailed):  # a writer that read the old generation loses
        storage.write_bytes("r/LATEST", b"gen-000003\n", if_version_match=seen)
    assert storage.read_bytes("r/LATEST") == b"gen-000002\n"
    with pytest.raises(PreconditionFailed):
        storage.write_bytes("r/absent", b"x", if_version_match=seen)
    assert storage.stat("r/absent") is None


def test_a_conditional_write_of_the_bytes_already_there_counts_as_done(storage: Storage) -> None:
    storage.write_bytes("r/LATEST", b"gen-000001\n")
    before = storage.stat("r/LATEST")
    storage.write_bytes("r/LATEST", b"gen-000001\n", if_version_match=0)  # how a retry of a landed write looks
    assert storage.stat("r/LATEST") == before


def test_large_files_stream_both_ways_and_downloads_replace_atomically(storage: Storage, tmp_path: Path) -> None:
    data = os.urandom(9 * MiB + 123)  # over the 8 MiB limit of a one-request upload: a resumable one on GCS
    source = tmp_path / "replay.safetensors"
    source.write_bytes(data)
    seen: list[int] = []
    storage.upload_file("run-1/gen-000002/replay.safetensors", source, progress=seen.append)
    assert seen and seen[-1] == len(data)
    assert storage.stat("run-1/gen-000002/replay.safetensors").size == len(data)

    out = tmp_path / "out"
    out.mkdir()
    dest = out / "replay.safetensors"
    dest.write_bytes(b"old")
    storage.download_file("run-1/gen-000002/replay.safetensors", dest)
    assert dest.read_bytes() == data
    assert _leftovers(out, dest.name) == []

    dest.write_bytes(b"old")
    with pytest.raises(FileNotFoundError):
        storage.download_file("run-1/gen-000002/missing.safetensors", dest)
    assert dest.read_bytes() == b"old"  # untouched, and no temporary file left beside it
    assert _leftovers(out, dest.name) == []


def test_list_is_recursive_sorted_and_per_folder_and_delete_is_idempotent(storage: Storage) -> None:
    for key in ["run-1/gen-000002/b.json", "run-1/LATEST", "run-1/gen-000001/a.json", "run-10/LATEST", "top"]:
        storage.write_bytes(key, b"x")
    assert storage.list("") == [
        "run-1/LATEST",
        "run-1/gen-000001/a.json",
        "run-1/gen-000002/b.json",
        "run-10/LATEST",
        "top",
    ]
    assert (
        storage.list("run-1")
        == storage.list("run-1/")
        == [
            "run-1/LATEST",
            "run-1/gen-000001/a.json",
            "run-1/gen-000002/b.json",
        ]
    )
    assert storage.list("run-1/gen-000002") == ["run-1/gen-000002/b.json"]
    assert storage.list("nothing-here") == []
    storage.delete("run-1/gen-000002/b.json")
    storage.delete("run-1/gen-000002/b.json")
    storage.delete("never/was")
    assert storage.list("run-1") == ["run-1/LATEST", "run-1/gen-000001/a.json"]


@pytest.mark.parametrize("key", ["", "/abs", "a//b", "../up", "a/./b", "a/..", "back\\slash"])
def test_keys_cannot_escape_the_root(storage: Storage, key: str) -> None:
    with pytest.raises(ValueError, match="bad storage key"):
        storage.write_bytes(key, b"x")


def test_check_access_passes_and_leaves_nothing_behind(storage: Storage) -> None:
    storage.check_access()
    assert storage.list("") == []


# ---------------------------------------------------------------------------------------------------------------------
# Locations


@pytest.mark.parametrize(
    ("uri", "parsed"),
    [
        ("runs", ("file", "", "runs")),
        ("/data/runs/", ("file", "", "/data/runs/")),
        ("file:///data/runs", ("file", "", "/data/runs")),
        ("gs://my-bucket", ("gs", "my-bucket", "")),
        ("gs://my-bucket/", ("gs", "my-bucket", "")),
        ("gs://my-bucket/a/b/", ("gs", "my-bucket", "a/b")),
        ("GS://my.bucket_1/runs", ("gs", "my.bucket_1", "runs")),
    ],
)
def test_parse_uri(uri: str, parsed: tuple[str, str, str]) -> None:
    assert parse_uri(uri) == parsed


@pytest.mark.parametrize(
    "uri",
    [
        "",
        "gs://",
        "gs:///runs",
        "gs://ab/runs",  # too short
        "gs://My-Bucket/runs",  # upper case
        "gs://-bucket/runs",
        "gs://goog-bucket/runs",
        "gs://192.168.1.1/runs",
        "gs://bucket/a//b",
        "gs://bucket/a/../b",
        "gs://bucket/a?b",
        "s3://bucket/runs",
        "https://storage.googleapis.com/bucket",
        "file://relative/path",
    ],
)
def test_malformed_uris_are_config_errors_naming_the_uri(uri: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_uri(uri)
    assert repr(uri) in str(info.value)
    assert "\n" not in str(info.value)


def test_open_storage_opens_bucket_locations_only(tmp_path: Path) -> None:
    remote = open_storage("gs://some-bucket/a/b/")
    assert isinstance(remote, GCSStorage) and remote.uri == "gs://some-bucket/a/b"
    with pytest.raises(ConfigError, match="not a bucket location"):
        open_storage(str(tmp_path / "runs"))


# ---------------------------------------------------------------------------------------------------------------------
# GCS: retries and the preflight's one-line errors


def test_gcs_writes_ride_out_a_server_restart(gcs_private) -> None:
    store = open_storage(gcs_private.uri, deadline=15.0)
    store.write_bytes("a", b"1")
    gcs_private.emulator.stop()
    threading.Timer(0.5, gcs_private.emulator.start).start()
    store.write_bytes("b", b"2", if_version_match=0)  # refused connections, retried until the server is back
    assert store.read_bytes("a") == b"1" and store.read_bytes("b") == b"2"


def test_gcs_an_outage_past_the_deadline_is_one_transient_line(gcs_private) -> None:
    store = open_storage(gcs_private.uri, deadline=1.0)
    store.write_bytes("a", b"1")
    gcs_private.emulator.stop()
    started = time.monotonic()
    for attempt in (lambda: store.write_bytes("a", b"2"), lambda: store.read_bytes("a"), lambda: store.list("")):
        with pytest.raises(StorageError, match=r"cannot reach .* after 1 s of retries") as info:
            attempt()
        assert info.value.transient and "\n" not in str(info.value)
    assert time.monotonic() - started < 10.0


def test_gcs_a_conditional_write_whose_answer_was_lost_is_recognised(gcs_bucket, monkeypatch) -> None:
    with LossyProxy(os.environ[EMULATOR_ENV]) as proxy:
        monkeypatch.setenv(EMULATOR_ENV, proxy.url)
        store = open_storage(gcs_bucket, deadline=10.0)
        # The write lands, its answer is lost, the library retries it and the service answers 412.
        store.write_bytes("r/LATEST", b"gen-000001\n", if_version_match=0)
        assert proxy.dropped == 1
        assert store.read_bytes("r/LATEST") == b"gen-000001\n"
        with pytest.raises(PreconditionFailed):  # a real conflict still is one
            store.write_bytes("r/LATEST", b"gen-000002\n", if_version_match=0)
        store.close()


def test_gcs_missing_bucket_is_named(gcs_emulator) -> None:
    store = open_storage("gs://no-such-bucket-here/runs")
    with pytest.raises(StorageError, match="no-such-bucket-here") as info:
        store.check_access()
    assert isinstance(info.value, InputError) and not info.value.transient
    assert "does not exist" in str(info.value)


def test_gcs_unreachable_host_fails_in_bounded_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(EMULATOR_ENV, f"http://127.0.0.1:{free_port()}")  # nobody listens there
    store = GCSStorage("some-bucket", "runs", preflight_deadline=2.0)
    started = time.monotonic()
    with pytest.raises(StorageError, match="cannot reach") as info:
        store.check_access()
    assert time.monotonic() - started < 10.0
    assert info.value.transient and "\n" not in str(info.value)


def test_gcs_a_refused_connection_is_not_retried_before_the_endpoint_has_answered(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # With the default 60 s deadline; once the endpoint has answered, a refusal is a restart, retried (see above).
    monkeypatch.setenv(EMULATOR_ENV, f"http://127.0.0.1:{free_port()}")  # nobody listens there
    store = open_storage("gs://some-bucket/runs")
    for action, attempt in {
        "listing gs://some-bucket/runs": store.check_read_access,
        "reading metadata of a in": lambda: store.stat("a"),
        "reading a in": lambda: store.read_bytes("a"),
        "writing a in": lambda: store.write_bytes("a", b"1"),
        "downloading a from": lambda: store.download_file("a", tmp_path / "a"),
        "listing / in": store.list,
    }.items():
        started = time.monotonic()
        with pytest.raises(StorageError, match="connection refused") as info:
            attempt()
        assert time.monotonic() - started < 5.0, action
        assert f"while {action}" in str(info.value) and info.value.transient and "\n" not in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_gcs_overloaded_service_is_retried_then_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    with StubServer(503, {"error": {"code": 503, "message": "Backend Error"}}) as stub:
        monkeypatch.setenv(EMULATOR_ENV, stub.url)
        started = time.monotonic()
        with pytest.raises(StorageError, match="ServiceUnavailable") as info:
            GCSStorage("some-bucket", "runs", preflight_deadline=2.0).check_access()
    assert time.monotonic() - started < 10.0 and info.value.transient


def test_gcs_permission_denied_names_the_role(monkeypatch: pytest.MonkeyPatch) -> None:
    message = "trainer@proj.iam.gserviceaccount.com does not have storage.objects.list access to the bucket."
    with StubServer(403, {"error": {"code": 403, "message": message}}) as stub:
        monkeypatch.setenv(EMULATOR_ENV, stub.url)
        with pytest.raises(StorageError, match=r"roles/storage\.objectAdmin") as info:
            GCSStorage("some-bucket", "runs").check_access()
    assert "does not have storage.objects.list" in str(info.value) and "\n" not in str(info.value)


def test_gcs_rejected_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    with StubServer(401, {"error": {"code": 401, "message": "Invalid Credentials"}}) as stub:
        monkeypatch.setenv(EMULATOR_ENV, stub.url)
        with pytest.raises(StorageError, match="rejected"):
            GCSStorage("some-bucket", "runs").check_access()


def test_gcs_no_credentials_explains_application_default_credentials(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(EMULATOR_ENV, raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing-key.json"))
    with pytest.raises(StorageError) as info:
        GCSStorage("some-bucket", "runs").check_access()
    text = str(info.value)
    assert "gcloud auth application-default login" in text and "GOOGLE_APPLICATION_CREDENTIALS" in text
    assert "\n" not in text


def test_gcs_invalid_service_account_key_is_reported_without_the_secret(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rsa = pytest.importorskip("cryptography.hazmat.primitives.asymmetric.rsa")
    serialization = pytest.importorskip("cryptography.hazmat.primitives.serialization")
    pem = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        .private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        .decode()
    )
    # A token endpoint on the loopback that refuses the key, as Google's does for a deleted one.
    with StubServer(400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."}) as token:
        key_file = tmp_path / "key.json"
        key_file.write_text(
            json.dumps(
                {
                    "type": "service_account",
                    "project_id": "proj",
                    "private_key_id": "0123abcd",
                    "private_key": pem,
                    "client_email": "trainer@proj.iam.gserviceaccount.com",
                    "client_id": "1",
                    "token_uri": f"{token.url}/token",
                }
            )
        )
        monkeypatch.delenv(EMULATOR_ENV, raising=False)
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key_file))
        with pytest.raises(StorageError, match="rejected") as info:
            GCSStorage("some-bucket", "runs", preflight_deadline=5.0).check_access()
    text = str(info.value)
    assert "PRIVATE KEY" not in text and "0123abcd" not in text and "\n" not in text
