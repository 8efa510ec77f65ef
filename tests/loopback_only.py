"""Run a command in a network namespace of its own, whose only interface is the loopback.

torchrun's rendezvous stores listen on every interface (torch's TCPStore takes no address to bind), so the tests and
the scaling benchmark start torchrun in a private network namespace: whatever it listens on can be reached only over
the loopback, from inside. Needs unshare(1) and the right to make a namespace (root, as here and in CI).

    unshare --net python tests/loopback_only.py COMMAND [ARGS...]

Several commands that must reach each other (two torchrun launchers playing two nodes) join one namespace held open
by ``shared()``, with nsenter(1).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import shutil
import socket
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator

SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def bring_loopback_up() -> None:
    """A new network namespace has its loopback down: bring it up (what ``ip link set lo up`` does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        name, flags = struct.unpack("16sH", fcntl.ioctl(sock, SIOCGIFFLAGS, struct.pack("16sH", b"lo", 0))[:18])
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH", name, flags | IFF_UP))


def command(argv: list[str]) -> list[str]:
    """``argv`` run in a network namespace of its own (the same process id: unshare and this script exec it)."""
    return ["unshare", "--net", sys.executable, os.path.abspath(__file__), *argv]


@functools.cache
def available() -> bool:
    """Whether this machine lets us make a network namespace."""
    try:
        subprocess.run(command(["true"]), check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return True


def joinable() -> bool:
    """Whether ``shared`` can be used here."""
    return available() and shutil.which("nsenter") is not None


@contextlib.contextmanager
def shared() -> Iterator[Callable[[list[str]], list[str]]]:
    """A network namespace of its own, held open for the block by a process that waits inside it; yields what turns
    a command into one run in that namespace (the same process id: nsenter execs it)."""
    holder = subprocess.Popen(
        command([sys.executable, "-c", "import sys; print(flush=True); sys.stdin.read()"]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        if not holder.stdout.readline():  # the line comes once the loopback is up
            raise RuntimeError("no network namespace could be made (unshare --net)")
        yield lambda argv: ["nsenter", f"--net=/proc/{holder.pid}/ns/net", *argv]
    finally:
        holder.kill()
        holder.communicate()  # and closes its pipes


if __name__ == "__main__":
    bring_loopback_up()
    os.execvp(sys.argv[1], sys.argv[1:])
