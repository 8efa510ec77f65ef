"""Run a command in a network namespace of its own, whose only interface is the loopback.

torchrun's rendezvous stores listen on every interface (torch's TCPStore takes no address to bind), so the tests and
the scaling benchmark start torchrun in a private network namespace: whatever it listens on can be reached only over
the loopback, from inside. Needs unshare(1) and the right to make a namespace (root, as here and in CI).

    unshare --net python tests/loopback_only.py COMMAND [ARGS...]
"""

from __future__ import annotations

import fcntl
import functools
import os
import socket
import struct
import subprocess
import sys

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


if __name__ == "__main__":
    bring_loopback_up()
    os.execvp(sys.argv[1], sys.argv[1:])
