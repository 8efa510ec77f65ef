"""Two pods in a row, each of two processes (torchrun), checkpoints in a bucket: the first trains two generations and
dies with its disk, the second resumes from the bucket. For tests/training/test_sharded.py, inside a network namespace
of its own with a GCS emulator of its own (torchrun's stores listen on every interface; there, only loopback):

    unshare --net python tests/loopback_only.py python tests/sharded_pod.py WORKDIR GENERATIONS [TRAINING FLAGS]

Leaves the resumed run in WORKDIR/pod-2/r and exits 0; exits 1 with the output of a step that failed.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(workdir: Path, generations: int, training: list[str]) -> int:
    from persistence.gcs import EMULATOR_ENV, open_storage
    from persistence.run_folder import bucket
    from tests.gcs_server import GCSEmulator, emulator_binary

    server = GCSEmulator(emulator_binary(), workdir / "fake-gcs")
    server.start()
    try:
        os.environ[EMULATOR_ENV] = server.url
        bucket_name = f"test-{secrets.token_hex(6)}"
        server.create_bucket(bucket_name)
        uri = f"gs://{bucket_name}/runs"
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
        train = [
            *torchrun,
            str(REPO / "tests" / "sharded_main.py"),
            *training,
            "--checkpoint-uri",
            uri,
            "--run-name",
            "r",
        ]
        pods = [
            [*train, "--local-dir", str(workdir / "pod-1"), "--generations", "2"],
            [*train, "--local-dir", str(workdir / "pod-2"), "--generations", str(generations), "--resume"],
        ]
        for pod, expected in zip(pods, (2, generations)):
            done = subprocess.run(pod, cwd=workdir, capture_output=True, text=True)
            latest = bucket.latest_in_bucket(open_storage(uri), "r")
            if done.returncode != 0 or latest != expected:
                print(f"bucket at {latest}, expected {expected}\n{done.stdout}\n{done.stderr}")
                return 1
            shutil.rmtree(workdir / "pod-1", ignore_errors=True)  # the first pod and its disk are gone
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]))
